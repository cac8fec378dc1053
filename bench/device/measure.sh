#!/usr/bin/env bash
# One prepared measurement run on a CUDA GPU (the H200 lent to some sessions):
#   bash bench/device/measure.sh OUTDIR [GEMM_BUDGET_S] [FP32_BUDGET_S]
# Needs torch and triton next to tsbatch's own dependencies (polars, pyarrow).
# Writes into OUTDIR: env.txt (nvidia-smi, versions), bandwidth.parquet,
# matmul.parquet and gemm.parquet (bench/device/llm_gemm.toml: fp16/bf16), and
# fp32/{matmul,gemm}.parquet (bench/device/fp32_gemm.toml: TF32). Each GEMM
# part stops starting new problems after its budget (compilation included) and
# keeps what it finished. Then, anywhere:
#   tsbatch calibrate OUTDIR --hw h200 --keep tc_fp16_tflops --dry-run
#   tsbatch accuracy OUTDIR/gemm.parquet OUTDIR/fp32/gemm.parquet --json r.json --report rep/
set -u
out=${1:?usage: measure.sh OUTDIR [GEMM_BUDGET_S] [FP32_BUDGET_S]}
gemm_budget=${2:-240}
fp32_budget=${3:-60}
here=$(cd "$(dirname "$0")" && pwd)
export PYTHONUNBUFFERED=1
mkdir -p "$out/fp32"
{
  date -u +%FT%TZ
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem,power.limit --format=csv
  python3 -c "import torch, triton, polars, numpy; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'polars', polars.__version__, 'numpy', numpy.__version__); p = torch.cuda.get_device_properties(0); print(p)"
  nproc
} > "$out/env.txt" 2>&1
cat "$out/env.txt"
t0=$(date +%s)
python3 -m tsbatch.front.cli measure --out "$out" --gemm-grid "$here/llm_gemm.toml" \
  --time-budget-s "$gemm_budget"
echo "main measure: exit $? after $(( $(date +%s) - t0 )) s"
t1=$(date +%s)
python3 -m tsbatch.front.cli measure --out "$out/fp32" --only matmul,gemm \
  --gemm-grid "$here/fp32_gemm.toml" --time-budget-s "$fp32_budget"
echo "fp32 measure: exit $? after $(( $(date +%s) - t1 )) s"
# Suggested (not wired yet): one Llama-3-8B layer's ops, each timed on its own, into
# $out/layer.parquet (bench/device/layer.toml, about 2 minutes); then, anywhere:
#   python bench/layer_ops.py OUTDIR/layer.parquet
# python3 -c "import sys; from pathlib import Path; from tsbatch.measured.layer import load_layer_spec, run_layer_part; run_layer_part(Path(sys.argv[1]), load_layer_spec(sys.argv[2]))" "$out" "$here/layer.toml"; echo "layer: exit $?"
nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv >> "$out/env.txt" 2>&1
