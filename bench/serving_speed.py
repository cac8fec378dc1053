"""Serving-layer speed: >= 100,000 deployment points ranked end to end, and one explain.

    python bench/serving_speed.py [--small]

The sweep: 12 models x 6 systems x TP {1, 2, 4, 8} x PP {1, 2} x weights {bf16, fp8}
x batch {1 .. 256} (9) x prompt {128 .. 32k} (5) x output {64, 256, 1024} = 155,520
deployments (--small: a 1/9 slice for a quick check), predicted by the families and
ranked by tokens/s per GPU (tsbatch.serving.api.sweep_deployments), then the same
points through a roofline pass (every op at max(FLOPs / peak, bytes / DRAM rate),
collectives at bytes / link rate, composed the same way) in the same run. Prints rows/s
of each, their ratio, the stages' seconds, and the warm time of a single explain. The
issue's targets: the whole process within 60 s warm on this 2-core machine, an explain
within 1 s warm. Run it twice: the first run compiles numba kernels (not counted warm).
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

T_PROCESS = time.perf_counter()
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import polars as pl  # noqa: E402

MODELS = ["meta-llama/Llama-2-7b-hf", "meta-llama/Llama-2-70b-hf", "meta-llama/Llama-3.1-8B",
          "meta-llama/Llama-3.1-70B", "mistralai/Mistral-7B-v0.1", "mistralai/Mixtral-8x7B-v0.1",
          "Qwen/Qwen2.5-7B", "Qwen/Qwen2.5-14B", "Qwen/Qwen2.5-32B", "Qwen/Qwen3-8B",
          "Qwen/Qwen3-32B", "Qwen/Qwen3-30B-A3B"]
SYSTEMS = ["dgx_a100", "dgx_h100", "hgx_h100_4gpu", "h200_nvl", "hgx_b200", "hgx_h800"]


def grid(small: bool) -> pl.DataFrame:
    axes = {"model": MODELS, "system": SYSTEMS, "tp": [1, 2, 4, 8], "pp": [1, 2],
            "weights": ["bf16", "fp8"],
            "batch": [1, 2, 4, 8, 16, 32, 64, 128, 256] if not small else [16],
            "prompt_len": [128, 512, 2048, 8192, 32768], "output_len": [64, 256, 1024]}
    rows = list(itertools.product(*axes.values()))
    return pl.DataFrame({k: [r[i] for r in rows] for i, k in enumerate(axes)})


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", action="store_true")
    args = ap.parse_args()
    from tsbatch.serving.api import explain_deployment, rank_deployments, sweep_deployments
    from tsbatch.serving.predict import predict

    df = grid(args.small)
    n = df.height
    print(f"{n} deployments ({len(MODELS)} models x {len(SYSTEMS)} systems x TP 1-8 x PP 1-2 "
          f"x bf16/fp8 x batch x prompt 128-32k x output 64-1024)")
    tm: dict = {}
    t0 = time.perf_counter()
    ranked = sweep_deployments(df, timings=tm)
    t1 = time.perf_counter()
    feas = int(ranked["feasible"].sum())
    print(f"model:    {t1 - t0:6.2f} s  {n / (t1 - t0):9.0f} deployments/s  ({feas} feasible; "
          + ", ".join(f"{k} {v:.2f}" for k, v in tm.items()) + ")")
    t2 = time.perf_counter()
    roof = rank_deployments(predict(df, method="roofline"))
    t3 = time.perf_counter()
    print(f"roofline: {t3 - t2:6.2f} s  {n / (t3 - t2):9.0f} deployments/s")
    print(f"model / roofline time: {(t1 - t0) / (t3 - t2):.2f}x")
    best = ranked.filter(pl.col("rank") == 1).row(0, named=True)
    print(f"best: {best['model']} on {best['system']} tp{best['tp']} pp{best['pp']} "
          f"{best['weights']} batch {best['batch']} prompt {best['prompt_len']}: "
          f"{best['tokens_per_s_per_gpu']:.0f} tok/s/GPU")
    explain_deployment("meta-llama/Llama-3.1-70B", "hgx_h100_4gpu", tp=4, batch=16,
                       prompt_len=2048, output_len=128)  # warm
    t4 = time.perf_counter()
    explain_deployment("meta-llama/Llama-3.1-70B", "hgx_h100_4gpu", tp=4, batch=32,
                       prompt_len=4096, output_len=256)
    t5 = time.perf_counter()
    print(f"one explain (warm): {t5 - t4:.3f} s")
    total = time.perf_counter() - T_PROCESS
    print(f"whole process: {total:.1f} s (target <= 60 s warm)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
