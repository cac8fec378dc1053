"""bf16 against fp16: the measured pairs and the model's symmetry.

    python bench/dtype_pairs.py [FILE ...] [--no-model]

Issue 35 (docs/gemm_accuracy.md, "bf16 against fp16 in small Hopper GEMMs,
session 9"). For each measured GEMM file (default: every ``gemm/*.parquet``
of ``../shared/data`` and the H200 files of ``bench/measured``):

1. how many (m, n, k) problems the file measured in both float16 and
   bfloat16;
2. where it has such pairs, the measured time of each (problem, layout,
   backend, configuration) in bfloat16 over the same in float16 (medians of
   repeats), by backend and by the float16 time's bucket (the guard's bucket
   edges, per row rather than per problem), and for Triton rows by the MMA
   path on Hopper (warpgroup MMA where ``block_m`` is a multiple of 64 and
   ``num_warps`` of 4, the model's condition in ``kernels_catalog/gemm.py``;
   else ``mma.sync``);
3. unless ``--no-model``: the model's prediction of every float16/bfloat16
   row of the file on its GPU, once as given and once with the two dtypes
   swapped, compared by their bits (the model has no term that tells the two
   apart other than the per-dtype tensor-core rate of ``hw/*.toml``).

Nothing here is fitted or written anywhere; it prints.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np
import polars as pl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tsbatch.measured.accuracy import load_measured  # noqa: E402
from tsbatch.measured.regress_metrics import BUCKETS  # noqa: E402

KEYS = ["m", "n", "k", "a_row_major", "b_row_major", "backend", "block_m", "block_n", "block_k",
        "num_stages", "num_warps", "group_m"]
HALF = ("float16", "bfloat16")


def default_files() -> list[Path]:
    root = Path(os.environ.get("TSBATCH_SHARED_DATA", ROOT.parent / "shared" / "data"))
    files = sorted((root / "gemm").glob("*_triton_mm.parquet"))
    files += sorted(ROOT.glob("bench/measured/h200-*/gemm.parquet"))
    files += sorted(ROOT.glob("bench/measured/h200-*/more/gemm.parquet"))
    return files


def bucket(col: str) -> pl.Expr:
    """The guard's time bucket (``BUCKETS``) of the time in ``col`` (µs)."""
    t = pl.col(col)
    (label, _lo, hi), *rest = BUCKETS
    expr = pl.when(t < hi).then(pl.lit(label))
    for label, _lo, hi in rest:
        expr = expr.when(t < hi).then(pl.lit(label))
    return expr.otherwise(pl.lit(None))


def pairs(frame: pl.DataFrame) -> pl.DataFrame:
    """One row per (problem, layout, backend, configuration) measured in both dtypes."""
    keys = [c for c in KEYS if c in frame.columns]
    if "raster" in frame.columns:
        keys.append("raster")
    d = frame.group_by([*keys, "dtype"]).agg(pl.col("measured_us").median())
    a = d.filter(pl.col("dtype") == "float16").drop("dtype").rename({"measured_us": "fp16_us"})
    b = d.filter(pl.col("dtype") == "bfloat16").drop("dtype").rename({"measured_us": "bf16_us"})
    return a.join(b, on=keys, nulls_equal=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", type=Path)
    ap.add_argument("--no-model", action="store_true", help="skip the model's symmetry check")
    args = ap.parse_args(argv)
    pl.Config.set_tbl_rows(60)
    pl.Config.set_tbl_width_chars(200)
    for path in args.files or default_files():
        loaded = load_measured([path], families=("gemm",))
        frame = pl.concat(loaded.frames["gemm"], how="diagonal_relaxed")
        frame = frame.filter(pl.col("dtype").is_in(HALF))
        print(f"\n== {path}  ({frame.height} float16/bfloat16 rows)")
        probs = frame.select("m", "n", "k", "dtype").unique()
        both = probs.group_by("m", "n", "k").agg(pl.col("dtype").n_unique().alias("nd"))
        print("problems: " + ", ".join(f"{dt} {probs.filter(pl.col('dtype') == dt).height}" for dt in HALF)
              + f"; in both dtypes: {both.filter(pl.col('nd') == 2).height}")
        p = pairs(frame)
        if p.height:
            p = p.with_columns((pl.col("bf16_us") / pl.col("fp16_us")).alias("r"), bucket("fp16_us").alias("bucket"),
                               pl.when(pl.col("backend") != "triton").then(pl.lit("library"))
                               .when((pl.col("block_m") % 64 == 0) & (pl.col("num_warps") % 4 == 0))
                               .then(pl.lit("triton wgmma")).otherwise(pl.lit("triton mma.sync"))
                               .alias("path"))
            print("bf16 / fp16 measured time of the same (problem, layout, backend, configuration):")
            print(p.group_by("path", "bucket").agg(
                pl.len().alias("pairs"), pl.col("r").median().alias("median"),
                pl.col("r").quantile(0.1).alias("p10"), pl.col("r").quantile(0.9).alias("p90"),
                (pl.col("bf16_us") - pl.col("fp16_us")).median().alias("median_diff_us"))
                .sort("path", "bucket"))
        if args.no_model or frame.height == 0:
            continue
        from tsbatch.engine.evaluate import evaluate

        hw = frame["_hw"][0]
        inp = frame.drop([c for c in frame.columns if c.startswith("_") or c == "measured_us"])
        swapped = inp.with_columns(pl.when(pl.col("dtype") == "float16").then(pl.lit("bfloat16"))
                                   .otherwise(pl.lit("float16")).alias("dtype"))
        x = evaluate(inp, hw)["latency_us"].to_numpy()
        y = evaluate(swapped, hw)["latency_us"].to_numpy()
        same = np.array_equal(x.view(np.int64), y.view(np.int64))
        print(f"model on {hw}: predictions with the dtypes swapped bit-equal: {same}"
              + ("" if same else f" (max relative difference {np.nanmax(np.abs(x / y - 1)):.3g})"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
