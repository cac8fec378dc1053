"""Simulator vs analytical evaluator on regular software-pipelined GEMMs (issue 5).

Samples ``--n`` tile configurations from the measured H100/A100 Triton sets
(the configurations Inductor really tries, problems of moderate size so that
every grid is simulated in full), predicts each with the simulator
(``naive2`` = Triton's pipeline) and with :func:`tsbatch.engine.evaluate.evaluate`,
and prints

* latency agreement: MAPE of the evaluator against the simulator, the
  fraction within 10 % / 25 %, and the worst rows with their bottlenecks;
* the cache oracle: the mean absolute error of the evaluator's ``l2_hit``
  (Gaussian-SDCM tile model) against the simulator's exact LRU hit rate.

Usage::

    python bench/sim_agreement.py [--n 300] [--seed 0] [--max-flop 2e11] [--l15]

``--l15`` turns on the simulator's model of the hardware files' L1.5 tier,
which the analytical model always uses (off by default in the simulator,
see ``docs/sim.md``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl

from tsbatch.sim.api import simulate_config
from tsbatch.sim.machine import machine_from_hw

REPO = Path(__file__).resolve().parents[1]
COLS = ["m", "n", "k", "dtype", "tf32", "a_row_major", "b_row_major", "block_m", "block_n", "block_k",
        "num_stages", "num_warps", "group_m"]


def main(argv=None) -> int:
    default = Path(os.environ.get("TSBATCH_SHARED_DATA", REPO.parent / "shared" / "data"))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=default)
    ap.add_argument("--n", type=int, default=300, help="configurations in all (half per GPU)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-flop", type=float, default=2e11, help="skip larger problems (simulation time)")
    ap.add_argument("--l15", action="store_true", help="simulate the L1.5 tier of the hardware file")
    args = ap.parse_args(argv)
    try:
        from tsbatch.engine.evaluate import evaluate
    except ImportError:
        print("tsbatch.engine.evaluate is not available", file=sys.stderr)
        return 2
    frames = []
    for hw, name in (("h100", "h100_triton_mm.parquet"), ("a100", "a100_triton_mm.parquet")):
        p = args.data / "gemm" / name
        if not p.exists():
            print(f"missing {p}", file=sys.stderr)
            return 2
        df = (pl.read_parquet(p).filter((pl.col("backend") == "triton") & pl.col("time_ms").is_finite()
                                         & (pl.col("dtype") != "float32"))
              .filter(2.0 * pl.col("m") * pl.col("n") * pl.col("k") <= args.max_flop)
              .select(COLS).unique().sort(COLS))
        frames.append(df.sample(n=min(args.n // 2, df.height), seed=args.seed).with_columns(hw=pl.lit(hw)))
    rows = []
    t0 = time.perf_counter()
    for df in frames:
        hw = df["hw"][0]
        machine = machine_from_hw(hw, l15=args.l15)
        ev = evaluate(df.drop("hw"), hw)
        for r, e in zip(df.iter_rows(named=True), ev.iter_rows(named=True)):
            _, res = simulate_config(r, hw, machine=machine)
            rows.append({**r, "sim_us": res.latency_us, "sim_l2_hit": res.l2_hit,
                         "sim_tensor_util": res.utilization["tensor"], "sim_l2_util": res.utilization["l2"],
                         "eval_us": e["latency_us"], "eval_l2_hit": e["l2_hit"],
                         "bottleneck": e["bottleneck"], "feasible": e["feasible"]})
    wall = time.perf_counter() - t0
    out = pl.DataFrame(rows).filter(pl.col("feasible"))
    out = out.with_columns(ape=((pl.col("eval_us") - pl.col("sim_us")).abs() / pl.col("sim_us") * 100),
                           hit_err=(pl.col("eval_l2_hit") - pl.col("sim_l2_hit")).abs())
    for hw in ("h100", "a100", None):
        sub = out if hw is None else out.filter(pl.col("hw") == hw)
        label = hw or "all"
        a = sub["ape"].to_numpy()
        print(f"[{label}] {sub.height} configs: evaluator vs simulator MAPE {a.mean():.1f} %, "
              f"within 10 %: {np.mean(a <= 10) * 100:.0f} %, within 25 %: {np.mean(a <= 25) * 100:.0f} %; "
              f"median eval/sim {float((sub['eval_us'] / sub['sim_us']).median()):.3f}; "
              f"L2 hit-rate MAE {sub['hit_err'].mean():.3f}")
    print("agreement by evaluator bottleneck:")
    print(out.group_by("hw", "bottleneck").agg(pl.len().alias("n"), pl.col("ape").mean().alias("mape"),
                                               (pl.col("eval_us") / pl.col("sim_us")).median().alias("eval/sim"),
                                               pl.col("hit_err").mean().alias("hit_mae")).sort("hw", "n"))
    print("worst 8 rows:")
    print(out.sort("ape", descending=True).head(8).select(
        "hw", "m", "n", "k", "block_m", "block_n", "block_k", "num_stages", "num_warps", "sim_us", "eval_us",
        "sim_l2_hit", "eval_l2_hit", "sim_tensor_util", "sim_l2_util", "bottleneck"))
    print(f"simulated {len(rows)} configurations in {wall:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
