"""Latency-bound Triton GEMM rows of one wave or less, across the measured files.

    python bench/latency_bound_rows.py [FILE ...] [--min-ksteps 8] [--dtypes float16,bfloat16]

Issue 35 (docs/gemm_accuracy.md, "Latency-bound tiny grids, long K, session
13"). Every Triton row of each measured GEMM file (default: the A100 and H100
files of ``../shared/data/gemm`` and this tree's H200 ``gemm.parquet`` files,
``more/``, ``tiles/`` and ``spills/`` included), medians of repeats, is
predicted with :func:`tsbatch.engine.evaluate.evaluate` on the file's GPU. The
rows the model calls latency-bound (``bottleneck == "latency"``) with one
wave or less (``waves <= 1``) and at least ``--min-ksteps`` K steps are
tabulated: median measured / predicted, MAPE (|pred / meas - 1|, %), rows
and problems, by GPU and MMA path, then by warps, stages, BK and K steps
within those. A last table takes every latency-bound row (any grid) by GPU,
whether the grid fits one tile per SM (``tiles <= SMs``), and the cache
model's L2 hit fraction.

Nothing is fitted or written; it prints.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHARED = Path(os.environ.get("TSBATCH_SHARED_DATA", ROOT.parent / "shared" / "data"))

CONFIG = ("m", "n", "k", "dtype", "a_row_major", "b_row_major", "tf32", "backend",
          "block_m", "block_n", "block_k", "num_stages", "num_warps", "group_m")
#: K-step buckets (upper bounds, inclusive) and L2-hit buckets of the tables
KSTEP_EDGES = (15, 31, 63, 127)
HIT_EDGES = (0.1, 0.3, 0.5, 0.7, 0.9)


def default_files() -> list[Path]:
    out = [SHARED / "gemm" / "a100_triton_mm.parquet", SHARED / "gemm" / "h100_triton_mm.parquet"]
    out += sorted((ROOT / "bench" / "measured").glob("h200-*/gemm.parquet"))
    out += sorted((ROOT / "bench" / "measured").glob("h200-*/*/gemm.parquet"))
    return [p for p in out if p.exists()]


def measured_triton(path: Path, dtypes: tuple[str, ...]) -> tuple[str, pl.DataFrame]:
    """The file's GPU and its Triton configurations of ``dtypes``, one row each
    (``meas``: the median of its repeats, us)."""
    d = pl.read_parquet(path)
    gpu = d["gpu"][0]
    d = d.filter((pl.col("backend") == "triton") & pl.col("dtype").is_in(list(dtypes)))
    return gpu, d.group_by(list(CONFIG)).agg(meas=pl.col("time_ms").median() * 1000.0)


def predicted(path: Path, dtypes: tuple[str, ...]) -> pl.DataFrame:
    """The file's Triton configurations of ``dtypes`` (median of repeats, ``meas``
    in us) with every result column of ``evaluate`` on the file's GPU, and
    ``gpu``, ``file``, ``sms``, ``tiles``, ``ksteps``."""
    from tsbatch.engine.evaluate import evaluate, resolve_hw

    gpu, d = measured_triton(path, dtypes)
    if d.is_empty():
        return pl.DataFrame()
    spec = resolve_hw(gpu)
    r = evaluate(d.select(list(CONFIG)), spec)
    r = r.with_columns(meas=d["meas"], gpu=pl.lit(gpu), file=pl.lit(str(path)),
                       sms=pl.lit(spec.sm_count))
    return with_shape(r.filter(pl.col("feasible")))


def with_shape(d: pl.DataFrame) -> pl.DataFrame:
    """``tiles`` (output tiles of the grid) and ``ksteps`` (K steps of a tile)."""
    return d.with_columns(
        tiles=((pl.col("m") + pl.col("block_m") - 1) // pl.col("block_m"))
        * ((pl.col("n") + pl.col("block_n") - 1) // pl.col("block_n")),
        ksteps=(pl.col("k") + pl.col("block_k") - 1) // pl.col("block_k"))


def select(d: pl.DataFrame, min_ksteps: int) -> pl.DataFrame:
    """The latency-bound rows of one wave or less with at least ``min_ksteps`` K steps."""
    return d.filter((pl.col("bottleneck") == "latency") & (pl.col("waves") <= 1)
                    & (pl.col("ksteps") >= min_ksteps))


def _bucket(col: str, edges: tuple, name: str) -> pl.Expr:
    e = pl.lit(f"> {edges[-1]}")
    for hi in reversed(edges):
        e = pl.when(pl.col(col) <= hi).then(pl.lit(f"<= {hi}")).otherwise(e)
    return e.alias(name)


def table(d: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """Per group of ``keys``: rows, problems, median measured / predicted, MAPE (%)."""
    return d.group_by(keys).agg(
        rows=pl.len(),
        problems=pl.struct("m", "n", "k").n_unique(),
        meas_over_pred=(pl.col("meas") / pl.col("latency_us")).median(),
        mape=((pl.col("latency_us") / pl.col("meas") - 1.0).abs().mean() * 100.0),
    ).sort(keys)


def hit_table(d: pl.DataFrame) -> pl.DataFrame:
    """Every latency-bound row by GPU, one tile per SM or not, and L2 hit bucket."""
    lat = d.filter(pl.col("bottleneck") == "latency").with_columns(
        one_tile_per_sm=pl.col("tiles") <= pl.col("sms"), l2_hit_bucket=_bucket("l2_hit", HIT_EDGES, "b"))
    return table(lat, ["gpu", "one_tile_per_sm", "l2_hit_bucket"])


def load_rows(loader, files, dtypes: tuple[str, ...]) -> pl.DataFrame | None:
    """``loader(path, dtypes)`` over ``files`` (the measured files by default),
    the non-empty results stacked; None when every file is empty."""
    parts = [loader(p, dtypes) for p in (files or default_files())]
    parts = [p for p in parts if not p.is_empty()]
    return pl.concat(parts, how="diagonal_relaxed") if parts else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="*", type=Path)
    ap.add_argument("--min-ksteps", type=int, default=8)
    ap.add_argument("--dtypes", default="float16,bfloat16")
    args = ap.parse_args(argv)
    dtypes = tuple(args.dtypes.split(","))
    allrows = load_rows(predicted, args.files, dtypes)
    if allrows is None:
        print("no rows")
        return 0
    rows = select(allrows, args.min_ksteps).with_columns(
        _bucket("ksteps", KSTEP_EDGES, "ksteps_bucket"))
    with pl.Config(tbl_rows=300, tbl_cols=30, tbl_width_chars=250, float_precision=3):
        print(f"latency-bound, one wave or less, >= {args.min_ksteps} K steps ({', '.join(dtypes)})")
        print(table(rows, ["gpu", "mma_path"]))
        for key in ("num_warps", "num_stages", "block_k", "ksteps_bucket"):
            print(table(rows, ["gpu", "mma_path", key]))
        print("every latency-bound row, by the cache model's L2 hit fraction")
        print(hit_table(allrows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
