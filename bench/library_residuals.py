"""The library's own error against the best Triton kernel's, on the same problems.

    python bench/library_residuals.py [--dtypes float16,bfloat16] [--json OUT]

Every measured GEMM file with library (``backend = cublas``) and Triton rows
(``shared/data/gemm/*_triton_mm.parquet``, ``bench/measured/h200-*/**/gemm.parquet``),
read and bucketed as ``bench/regress.py`` does (a problem's bucket is its best
measured time over all its configurations and backends). Per problem and
operand layout it takes the library row (median of its repeats) and the
fastest measured Triton configuration, predicts both with the working tree's
model and prints, per file x GPU x time bucket (and per dtype under 20 us):

* ``lib_res``: library measured - library predicted (us), median;
* ``tri_res``: best Triton configuration measured - its predicted (us), median;
* ``lib_only``: ``lib_res - tri_res`` per problem and layout, median and
  quartiles: what the library costs beyond what the model prices, net of
  the error the model makes on the same problem's best Triton kernel;
* ``raw``: library measured - best Triton measured (us), median.

docs/gemm_accuracy.md, "The library's small calls, session 10": under 20 us
``lib_only`` is about +2 us a call on the A100 and H100 files (PyTorch
Inductor's autotuning harness) and +0.3 to +0.7 us on the H200 files
(``tsbatch measure``, CUDA 13.0).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from tsbatch.measured.regress_metrics import BUCKETS, bucket_expr  # noqa: E402

#: the buckets in time order, for sorting
ORDER = {label: i for i, (label, _, _) in enumerate(BUCKETS)}

KEY = ["file", "_hw", "m", "n", "k", "dtype", "a_row_major", "b_row_major"]


def pairs(dtypes: list[str]) -> pl.DataFrame:
    """One row per (file, GPU, problem, layout) with a library row and a Triton row."""
    import regress as R
    from tsbatch.engine.evaluate import evaluate

    files = [f for f in R.measured_files(R.data_root())
             if "triton_mm" in f[0] or "/h200-" in f[0]]
    inp = R.load_inputs(files, None).filter(pl.col("_family") == "gemm")
    inp = inp.filter(pl.col("dtype").is_in(dtypes) & pl.col("measured_us").is_finite())
    inp = inp.with_columns(_best=pl.col("measured_us").min().over("_problem"))
    cols = list(R.FAMILIES[0].input_cols)
    lib = (inp.filter(pl.col("backend") == "cublas")
           .group_by(KEY).agg(pl.col("measured_us").median(), pl.all().exclude("measured_us").first()))
    tri = inp.filter(pl.col("backend") == "triton").sort("measured_us").group_by(KEY).first()
    parts = []
    for name, frame in (("lib", lib), ("tri", tri)):
        out = []
        for (hw,), part in frame.group_by(["_hw"], maintain_order=True):
            pred = evaluate(part.select(cols), hw)["latency_us"]
            out.append(part.select(*KEY, "_best", "measured_us").with_columns(pred.alias("pred")))
        parts.append(pl.concat(out).rename({"measured_us": f"{name}_meas", "pred": f"{name}_pred"}))
    j = parts[0].join(parts[1].drop("_best"), on=KEY)
    return j.with_columns(
        bucket=bucket_expr("_best"),
        lib_res=pl.col("lib_meas") - pl.col("lib_pred"),
        tri_res=pl.col("tri_meas") - pl.col("tri_pred"),
        raw=pl.col("lib_meas") - pl.col("tri_meas"),
    ).with_columns(lib_only=pl.col("lib_res") - pl.col("tri_res"))


def summary(j: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    r = lambda e: e.round(2)  # noqa: E731
    return j.group_by(keys).agg(
        rows=pl.len(),
        problems=pl.struct("m", "n", "k", "dtype").n_unique(),
        lib_res=r(pl.col("lib_res").median()),
        tri_res=r(pl.col("tri_res").median()),
        lib_only=r(pl.col("lib_only").median()),
        lib_only_q1=r(pl.col("lib_only").quantile(0.25)),
        lib_only_q3=r(pl.col("lib_only").quantile(0.75)),
        raw=r(pl.col("raw").median()),
    ).sort([pl.col(c).replace_strict(ORDER, default=len(ORDER)) if c == "bucket" else pl.col(c)
            for c in keys])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtypes", default="float16,bfloat16")
    ap.add_argument("--json", help="write both tables as JSON records")
    args = ap.parse_args(argv)
    j = pairs(args.dtypes.split(","))
    by_bucket = summary(j, ["file", "_hw", "bucket"])
    small = summary(j.filter(pl.col("bucket") == BUCKETS[0][0]), ["file", "_hw", "dtype"])
    with pl.Config(tbl_rows=100, tbl_cols=20, tbl_width_chars=220, fmt_str_lengths=48):
        print(by_bucket)
        print("under 20 us, by dtype:")
        print(small)
    if args.json:
        Path(args.json).write_text(json.dumps({"by_bucket": by_bucket.to_dicts(),
                                               "under_20us_by_dtype": small.to_dicts()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
