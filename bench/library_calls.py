"""The library's small and skinny calls, measured three ways, against the model.

    python bench/library_calls.py DIR|library.parquet [--hw NAME] [--json OUT]

Reads ``library.parquet`` (``tsbatch measure --only library``: every problem
timed cold, with L2 flushed before each call as the development data's harness
does, warm, back to back, and under torch.profiler), predicts each problem with
the working tree's model on the file's GPU (or ``--hw``), and prints per
problem: cold / warm / kernel time (us), kernels per call, the prediction and
``cold / predicted``; then, per dtype and row bucket (M <= 16, 17-64, > 64),
the medians of

* ``cold / pred`` and ``warm / pred``: the model against each harness;
* ``cold - kernel`` (us): per-call time that is no kernel's (the harness's
  event window around one launch), the "library-only ~2 us a call" of
  docs/gemm_accuracy.md, "The library's small calls, session 10", measured
  directly instead of inferred from residuals;
* ``kernels``: kernels per call (a split-K reduction or a memset is a second);
* ``cold - clean`` (us): what the L2's dirty lines cost the call, when the
  harness flushes by writing (``time_ms``) rather than by reading
  (``time_ms_clean``), against ``writeback``: the model's DRAM time of
  ``min(dram bytes, L2)`` written back (the lead of docs/gemm_accuracy.md,
  "Issue 35, session 14", section 6: the cold-flush data's DRAM-bound rows
  predicted fast by up to 1.5x where the kernel's DRAM bytes are about the L2's,
  vLLM's back-to-back decode steps not).

It decides the leads that section names: whether the excess is a second kernel
(a mechanism with a count) or time outside any kernel (the harness), and how
far the library's skinny calls stream below the DRAM rate (H100 TF32
8 x 129792 x 4096).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: M buckets of the summary: upper bounds (inclusive) and labels
M_BUCKETS = ((16, "M<=16"), (64, "M 17-64"), (None, "M>64"))
INPUT = ("m", "n", "k", "dtype", "a_row_major", "b_row_major", "tf32")


def load(path: Path) -> pl.DataFrame:
    """``library.parquet`` (or the one in directory ``path``), one row per problem."""
    f = path / "library.parquet" if path.is_dir() else path
    if not f.exists():
        raise SystemExit(f"{f}: not found (write it with: tsbatch measure --only library --out DIR)")
    df = pl.read_parquet(f)
    need = {*INPUT, "gpu", "time_ms", "time_ms_clean", "time_ms_warm", "kernels_per_call",
            "kernel_ms"}
    missing = sorted(need - set(df.columns))
    if missing:
        raise SystemExit(f"{f}: not a library.parquet of tsbatch measure (missing {missing})")
    return df.filter(pl.col("backend") == "cublas") if "backend" in df.columns else df


def predict(df: pl.DataFrame, hw: str | None) -> pl.DataFrame:
    """``df`` with ``pred_us`` (the model's library prediction), ``library_tile`` and
    ``writeback_us`` (``min(dram_bytes, L2)`` at the model's DRAM rate)."""
    from tsbatch.engine.evaluate import evaluate, resolve_hw

    out = []
    for gpu, part in df.group_by("gpu", maintain_order=True):
        spec = resolve_hw(hw or gpu[0])
        r = evaluate(part.select(*INPUT).with_columns(backend=pl.lit("cublas")), spec)
        rate = spec.dram_bw_tbps * spec.cal("dram_efficiency") * 1e6  # bytes per us
        out.append(part.with_columns(
            pred_us=r["latency_us"],
            library_tile=r.get_column("library_tile") if "library_tile" in r.columns
            else pl.lit(None),
            writeback_us=r["dram_bytes"].clip(upper_bound=spec.l2_bytes) / rate))
    return pl.concat(out, how="vertical_relaxed")


def with_ratios(df: pl.DataFrame) -> pl.DataFrame:
    """Times in us and the ratios the report prints."""
    us = 1000.0
    b = pl.lit(M_BUCKETS[-1][1])
    for hi, label in reversed(M_BUCKETS[:-1]):
        b = pl.when(pl.col("m") <= hi).then(pl.lit(label)).otherwise(b)
    return df.with_columns(
        cold_us=pl.col("time_ms") * us, clean_us=pl.col("time_ms_clean") * us,
        warm_us=pl.col("time_ms_warm") * us, kernel_us=pl.col("kernel_ms") * us,
    ).with_columns(
        cold_minus_clean_us=pl.col("cold_us") - pl.col("clean_us"),
        cold_over_pred=pl.col("cold_us") / pl.col("pred_us"),
        warm_over_pred=pl.col("warm_us") / pl.col("pred_us"),
        cold_minus_kernel_us=pl.col("cold_us") - pl.col("kernel_us"),
        m_bucket=b,
    )


def summary(df: pl.DataFrame) -> pl.DataFrame:
    """Medians per GPU, dtype and M bucket."""
    return (df.group_by("gpu", "dtype", "m_bucket")
            .agg(problems=pl.len(),
                 cold_over_pred=pl.col("cold_over_pred").median(),
                 warm_over_pred=pl.col("warm_over_pred").median(),
                 cold_minus_kernel_us=pl.col("cold_minus_kernel_us").median(),
                 cold_minus_clean_us=pl.col("cold_minus_clean_us").median(),
                 writeback_us=pl.col("writeback_us").median(),
                 kernels=pl.col("kernels_per_call").median())
            .sort("gpu", "dtype", "m_bucket"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("path", type=Path, help="library.parquet or the tsbatch measure --out DIR")
    ap.add_argument("--hw", default=None, help="GPU to predict on (default: the file's gpu column)")
    ap.add_argument("--json", default=None, metavar="OUT", help="write the summary as JSON")
    args = ap.parse_args(argv)
    df = with_ratios(predict(load(args.path), args.hw))
    cols = ["gpu", "m", "n", "k", "dtype", "cold_us", "clean_us", "warm_us", "kernel_us",
            "kernels_per_call", "pred_us", "cold_over_pred", "warm_over_pred",
            "cold_minus_clean_us", "writeback_us", "library_tile"]
    with pl.Config(tbl_rows=500, tbl_cols=20, tbl_width_chars=250, float_precision=2,
                   tbl_hide_dataframe_shape=True):
        print("per problem (us)")
        print(df.select(cols).sort("gpu", "dtype", "m", "n", "k"))
        print("medians per dtype and M bucket")
        s = summary(df)
        print(s)
    if args.json:
        Path(args.json).write_text(json.dumps(s.to_dicts(), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
