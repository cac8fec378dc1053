#!/usr/bin/env bash
# One prepared measurement run on a CUDA GPU (a device lent for ~15 minutes):
#   bash bench/device/measure.sh OUTDIR [LIBRARY_BUDGET_S] [GEMM_BUDGET_S] [FP32_BUDGET_S]
# Needs torch and triton next to tsbatch's own dependencies (polars, pyarrow). The lent
# machines' image has all but polars: fetch its wheels here with
# bench/device/wheels.sh, carry .whl, and start the command with: python3 -m pip
# install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export
# PYTHONPATH=/tmp/site:$PWD (the repository's root).
# Runs the parts in order of what the model needs most now, each within its
# budget (a part stopped by its budget keeps the problems it finished); with the
# default budgets (150 + 150 + 120 + 30 s) the whole run stays under the lent
# machines' 10-minute command limit, about 8 minutes:
#   1. library.parquet: the library's (torch.matmul, cuBLAS) small and skinny
#      calls, M <= 64 decode GEMMs and the development data's worst library
#      calls, fp16 / bf16 / TF32, each timed cold (L2 flushed), warm and under
#      the profiler (kernels per call): issue 35's per-call excess and skinny
#      streams (docs/gemm_accuracy.md, "The library's small calls, session 10").
#   2. layer.parquet: one Llama-3-8B layer's prefill and decode ops, each timed on
#      its own, the layer back to back and from a CUDA graph (bench/device/layer.toml,
#      its own 150 s budget): the end-to-end model op by op (bench/layer_ops.py).
#   3. bandwidth.parquet, matmul.parquet, gemm.parquet (bench/device/llm_gemm.toml:
#      Triton fp16/bf16) and fp32/{matmul,gemm}.parquet (bench/device/fp32_gemm.toml).
# env.txt records nvidia-smi, the driver and every library's version; clocks.csv the
# SM clock, power and temperature every 200 ms while the parts run. Then, anywhere:
#   python bench/library_calls.py OUTDIR
#   python bench/layer_ops.py OUTDIR/layer.parquet
#   tsbatch calibrate OUTDIR --hw h200 --keep tc_fp16_tflops --dry-run
#   tsbatch accuracy OUTDIR/gemm.parquet OUTDIR/library.parquet OUTDIR/fp32/gemm.parquet --json r.json --report rep/
set -u
out=${1:?usage: measure.sh OUTDIR [LIBRARY_BUDGET_S] [GEMM_BUDGET_S] [FP32_BUDGET_S]}
lib_budget=${2:-150}
gemm_budget=${3:-120}
fp32_budget=${4:-30}
here=$(cd "$(dirname "$0")" && pwd)
export PYTHONUNBUFFERED=1
mkdir -p "$out/fp32"
{
  date -u +%FT%TZ
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem,power.limit --format=csv
  python3 -c "import torch, triton, polars, numpy; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cublas', torch.backends.cuda.preferred_blas_library() if hasattr(torch.backends.cuda, 'preferred_blas_library') else '?', 'triton', triton.__version__, 'polars', polars.__version__, 'numpy', numpy.__version__); p = torch.cuda.get_device_properties(0); print(p)"
  nproc
} > "$out/env.txt" 2>&1
cat "$out/env.txt"
# the SM clock, power and temperature every 200 ms for the whole run (the model's
# power-limited clock: docs/gemm_accuracy.md, "The power-limited clock by waves, session 13")
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu \
  --format=csv -lms 200 > "$out/clocks.csv" 2>/dev/null &
smi=$!
trap 'kill $smi 2>/dev/null' EXIT
t0=$(date +%s)
python3 -m tsbatch.front.cli measure --out "$out" --only library \
  --dtypes float16,bfloat16,float32 --library-budget-s "$lib_budget"
echo "library measure: exit $? after $(( $(date +%s) - t0 )) s"
tl=$(date +%s)
python3 -m tsbatch.front.cli measure --out "$out" --only layer --layer-spec "$here/layer.toml"
echo "layer measure: exit $? after $(( $(date +%s) - tl )) s"
t1=$(date +%s)
python3 -m tsbatch.front.cli measure --out "$out" --only bandwidth,matmul,gemm \
  --gemm-grid "$here/llm_gemm.toml" --time-budget-s "$gemm_budget"
echo "main measure: exit $? after $(( $(date +%s) - t1 )) s"
t2=$(date +%s)
python3 -m tsbatch.front.cli measure --out "$out/fp32" --only matmul,gemm \
  --gemm-grid "$here/fp32_gemm.toml" --time-budget-s "$fp32_budget"
echo "fp32 measure: exit $? after $(( $(date +%s) - t2 )) s"
nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv >> "$out/env.txt" 2>&1
