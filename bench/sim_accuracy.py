"""Accuracy of the tile-graph simulator on measured H100 Triton matmuls (issue 5).

For every problem of ``gemm/h100_triton_mm.parquet`` (Triton backend; median
over repeated measurements), take the measured-best tile configuration,
simulate it (``naive2`` pipeline = Triton's software pipeline, wave sampling
for very large grids) and print ``mape_pct`` against the measured time, with
the analytical evaluator's MAPE on the same rows when it is available.

Usage::

    python bench/sim_accuracy.py [--data ../shared/data] [--limit N] [--max-waves W] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl

from tsbatch.sim.api import simulate_config
from tsbatch.sim.machine import machine_from_hw

REPO = Path(__file__).resolve().parents[1]
KEY = ["m", "n", "k", "dtype", "tf32", "a_row_major", "b_row_major"]
CFG = ["block_m", "block_n", "block_k", "num_stages", "num_warps", "group_m"]


def measured_best(path: Path) -> pl.DataFrame:
    """Measured-best Triton configuration of each problem (median over repeats)."""
    df = pl.read_parquet(path).filter((pl.col("backend") == "triton") & pl.col("time_ms").is_finite())
    med = df.group_by(KEY + CFG).agg(pl.col("time_ms").median())
    return med.sort(KEY + ["time_ms"] + CFG).group_by(KEY, maintain_order=True).first().sort(KEY)


def main(argv=None) -> int:
    default = Path(os.environ.get("TSBATCH_SHARED_DATA", REPO.parent / "shared" / "data"))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=default)
    ap.add_argument("--limit", type=int, default=None, help="first N problems only")
    ap.add_argument("--max-waves", type=int, default=6, help="wave sampling threshold (see simulate_config)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    path = args.data / "gemm" / "h100_triton_mm.parquet"
    if not path.exists():
        print(f"measured data not found: {path}", file=sys.stderr)
        return 2
    best = measured_best(path)
    if args.limit:
        best = best.head(args.limit)
    machine = machine_from_hw("h100")
    t0 = time.perf_counter()
    preds = []
    for row in best.iter_rows(named=True):
        _, res = simulate_config(row, "h100", machine=machine, max_waves=args.max_waves)
        preds.append(res.latency_us)
    wall = time.perf_counter() - t0
    best = best.with_columns(sim_us=pl.Series(preds), meas_us=pl.col("time_ms") * 1000.0)
    ape = ((best["sim_us"] - best["meas_us"]).abs() / best["meas_us"] * 100.0).to_numpy()
    best = best.with_columns(ape_pct=pl.Series(ape))
    out = {"problems": best.height, "mape_pct": float(np.mean(ape)), "median_ape_pct": float(np.median(ape)),
           "p90_ape_pct": float(np.percentile(ape, 90)), "sim_seconds": wall}
    try:
        from tsbatch.evaluate import evaluate

        ev = evaluate(best.select(["m", "n", "k", "dtype", "tf32", "a_row_major", "b_row_major"] + CFG), "h100")
        e_ape = ((ev["latency_us"] - best["meas_us"]).abs() / best["meas_us"] * 100.0).to_numpy()
        out["evaluator_mape_pct"] = float(np.nanmean(e_ape))
    except Exception as exc:  # the evaluator is optional here
        out["evaluator_error"] = repr(exc)
    by = best.group_by("dtype").agg(pl.len().alias("n"), pl.col("ape_pct").mean().alias("mape_pct"),
                                    ((pl.col("sim_us") / pl.col("meas_us")).median()).alias("median_ratio"))
    print(by.sort("dtype"))
    size = best.with_columns(
        bucket=pl.when(pl.col("meas_us") < 20).then(pl.lit("<20us"))
        .when(pl.col("meas_us") < 200).then(pl.lit("20-200us")).otherwise(pl.lit(">200us")))
    print(size.group_by("bucket").agg(pl.len().alias("n"), pl.col("ape_pct").mean().alias("mape_pct"),
                                      (pl.col("sim_us") / pl.col("meas_us")).median().alias("median_ratio")))
    print(f"H100 Triton measured-best configurations: {out['problems']} problems")
    print(f"simulator mape_pct = {out['mape_pct']:.2f}  (median APE {out['median_ape_pct']:.2f}, "
          f"p90 {out['p90_ape_pct']:.2f}); simulated in {wall:.1f} s")
    if "evaluator_mape_pct" in out:
        print(f"analytical evaluator mape_pct on the same rows = {out['evaluator_mape_pct']:.2f}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
