"""Grid search of named per-GPU calibration constants on a problem subsample.

    python bench/calibrate_constants.py h100 l2_efficiency=0.8,0.9,1.0 iter_overhead_cycles=0,30,60

Every name must be one of ``tsbatch.hw.CALIBRATION_DEFAULTS``. Evaluates a
random subsample of problems (``--problems``, default 80, ``--seed`` 1) of the
fp16/bf16 Triton rows of ``../shared/data/gemm/<gpu>_triton_mm.parquet``
(override the folder with ``TSBATCH_SHARED_DATA``) for every combination of
values and prints MAPE, the median predicted/measured ratio, the mean
within-problem Spearman and the top-5 % retention. float32 rows are left out
(the shipped values were set on fp16/bf16 Triton rows, while the ``tf32``
label of the float32 rows was still wrong; it was corrected on 2026-12-01);
``--rows ieee-fp32`` scores the IEEE FP32 Triton rows instead (the check of
``l2_latency_cycles``: ``bench/calibrate_constants.py a100 --rows ieee-fp32
--problems 1000 l2_latency_cycles=100,150,200,250,300,400``).
``bench/cross_validate.py`` reuses :func:`grid_points` to fit every declared
constant on half the problems of every group and score the other half. The chosen values are written by hand into
``hw/<gpu>.toml`` ``[calibration]`` with this provenance; the full data set,
most of which the subsample never saw, is the check. Nothing else is fitted.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
import os
import sys

import numpy as np
import polars as pl

from tsbatch.engine.evaluate import evaluate
from tsbatch.hw import CALIBRATION_DEFAULTS, get_hw

KEYS = ["m", "n", "k", "dtype", "a_row_major", "b_row_major", "tf32", "backend", "block_m", "block_n",
        "block_k", "num_stages", "num_warps", "group_m"]
PROBLEM = ["m", "n", "k", "dtype", "a_row_major", "b_row_major"]


#: row sets the grid can score: the fp16/bf16 Triton rows (what the shipped
#: values were set on) or the IEEE FP32 ones (``l2_latency_cycles``' check)
ROWS = {
    "half": pl.col("dtype") != "float32",
    "ieee-fp32": (pl.col("dtype") == "float32") & ~pl.col("tf32"),
    "tf32": (pl.col("dtype") == "float32") & pl.col("tf32"),
}


def load(gpu: str, problems: int, seed: int, rows: str = "half") -> pl.DataFrame:
    root = os.environ.get("TSBATCH_SHARED_DATA", os.path.join("..", "shared", "data"))
    d = pl.read_parquet(os.path.join(root, "gemm", f"{gpu}_triton_mm.parquet")).filter(
        pl.col("time_ms").is_finite(), ROWS[rows], pl.col("backend") == "triton")
    d = d.group_by(KEYS).agg(pl.col("time_ms").median())
    probs = d.select(PROBLEM).unique().sort(PROBLEM)
    probs = probs.sample(n=min(problems, probs.height), seed=seed)
    return d.join(probs, on=PROBLEM)


def score(d: pl.DataFrame, hw) -> dict:
    r = evaluate(d, hw).filter(pl.col("feasible")).with_columns(pred=pl.col("latency_us") / 1000.0)
    r = r.with_columns(ape=(pl.col("pred") - pl.col("time_ms")).abs() / pl.col("time_ms"),
                       lr=(pl.col("pred") / pl.col("time_ms")).log())
    per = r.group_by(PROBLEM).agg(
        pl.corr("pred", "time_ms", method="spearman").alias("s"), pl.len().alias("rows"),
        pl.col("time_ms").min().alias("best"),
        pl.col("time_ms").sort_by("pred").head(pl.len().mul(0.05).ceil().cast(pl.Int64).clip(1))
        .min().alias("kept"))
    return {
        "mape_pct": 100.0 * r["ape"].mean(),
        "median_ratio": float(np.exp(r["lr"].median())),
        "spearman": per.filter(pl.col("rows") >= 5)["s"].mean(),
        "top5_retention_pct": 100.0 * (per["best"] / per["kept"]).mean(),
    }


def grid_points(axes: dict[str, list[float]], hw0):
    """Every combination of ``axes`` (name -> values, in order) applied to ``hw0``'s calibration.

    Yields ``(values, hw)``: the combination as a dict and a copy of ``hw0`` whose
    ``[calibration]`` has those values (the other constants unchanged). Shared with
    ``bench/cross_validate.py``.
    """
    for name in axes:
        if name not in CALIBRATION_DEFAULTS:
            raise KeyError(f"'{name}' is not a calibration constant; known: {', '.join(CALIBRATION_DEFAULTS)}")
    for combo in itertools.product(*axes.values()):
        values = dict(zip(axes, combo))
        cal = dict(hw0.calibration)
        cal.update(values)
        yield values, dataclasses.replace(hw0, calibration=cal)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("gpu")
    ap.add_argument("grid", nargs="+", help="NAME=v1,v2,... (a named calibration constant)")
    ap.add_argument("--problems", type=int, default=80)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rows", choices=sorted(ROWS), default="half",
                    help="the Triton rows scored: fp16/bf16 (default), IEEE FP32 or TF32")
    args = ap.parse_args(argv)
    axes = {}
    for item in args.grid:
        name, _, vals = item.partition("=")
        if name not in CALIBRATION_DEFAULTS:
            ap.error(f"'{name}' is not a calibration constant; known: {', '.join(CALIBRATION_DEFAULTS)}")
        axes[name] = [float(v) for v in vals.split(",") if v]
    d = load(args.gpu, args.problems, args.seed, args.rows)
    hw0 = get_hw(args.gpu)
    print(f"{args.gpu}: {d.select(PROBLEM).unique().height} problems, {d.height} rows", flush=True)
    for values, hw in grid_points(axes, hw0):
        s = score(d, hw)
        label = " ".join(f"{k}={v:g}" for k, v in values.items())
        print(f"{label:50s} " + " ".join(f"{k} {v:7.3f}" for k, v in s.items()
                                         if not (isinstance(v, float) and math.isnan(v))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
