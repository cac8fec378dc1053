"""Measured against predicted time of register-spilling GEMM tiles, by accumulator size.

    python bench/spills.py [--data bench/measured/h200-2026-11-30/spills] [--hw h200] [--json OUT]

A thread's fp32 accumulator (``block_m x block_n / threads`` registers)
decides whether Triton spills. This reads a measurement directory's
``gemm.parquet`` that holds each compiled kernel's ``num_spills`` (``tsbatch
measure``, runs 4 and 5 of ``bench/measured/h200-2026-11-30``), predicts
every Triton row with the model and prints, per accumulator size, the rows,
the spilled registers Triton reported and the model's count, and measured /
predicted time (min, median, max). A spill-free model would show the
spilling classes far above 1; nothing here is fitted to these rows.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parent.parent
CANDIDATE = ["m", "n", "k", "dtype", "a_row_major", "b_row_major", "tf32", "block_m", "block_n",
             "block_k", "num_stages", "num_warps", "group_m", "raster"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(ROOT / "bench/measured/h200-2026-11-30/spills"))
    ap.add_argument("--hw", default="h200")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    from tsbatch.engine.evaluate import evaluate

    src = Path(args.data) / "gemm.parquet"
    if not src.exists():
        sys.exit(f"bench/spills.py: no {src}")
    d = pl.read_parquet(src).filter(pl.col("backend") == "triton")
    if "num_spills" not in d.columns:
        sys.exit(f"bench/spills.py: {src} has no num_spills column (measured before run 4?)")
    d = d.filter(pl.col("time_ms").is_finite() & pl.col("num_spills").is_not_null())
    if "raster" in d.columns:
        d = d.with_columns(pl.col("raster").fill_null("grouped"))
    res = evaluate(d.select([c for c in CANDIDATE if c in d.columns]), args.hw)
    d = d.with_columns(
        acc_regs=(pl.col("block_m") * pl.col("block_n") // (32 * pl.col("num_warps"))),
        model_spill=res.get_column("register_spill"),
        ratio=pl.col("time_ms") * 1000.0 / res.get_column("latency_us"),
    ).filter(pl.col("ratio").is_finite())
    table = (d.group_by("acc_regs")
             .agg(pl.len().alias("kernels"),
                  pl.col("num_spills").min().alias("triton_spill_min"),
                  pl.col("num_spills").max().alias("triton_spill_max"),
                  pl.col("model_spill").median().alias("model_spill_median"),
                  pl.col("ratio").min().alias("ratio_min"),
                  pl.col("ratio").median().alias("ratio_median"),
                  pl.col("ratio").max().alias("ratio_max"))
             .sort("acc_regs"))
    print(f"{src} ({d.height} Triton kernels) on {args.hw}: measured / predicted time")
    with pl.Config(tbl_rows=-1, tbl_hide_dataframe_shape=True, float_precision=2,
                   tbl_width_chars=200):
        print(table)
    if args.json:
        Path(args.json).write_text(json.dumps(table.to_dicts(), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
