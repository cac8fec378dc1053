"""Where the model loses FlexAttention's ranking: the A100 file's configurations
against the model, by time bucket and by what the residual follows.

    python bench/flex_ranking.py [--file PATH] [--kv-bound]

Issue 35 keeps FlexAttention's Spearman >= 0.8 as its goal (docs/gemm_accuracy.md,
"Issue 35, session 20"). Every configuration of the measured file (medians of its
repeats, as the guard aggregates them: ``tsbatch.measured.accuracy.load_measured``)
is predicted with this tree's :func:`tsbatch.engine.evaluate.evaluate` on its GPU.
Printed:

1. The guard's figures (``tsbatch.measured.metrics.accuracy_metrics``: MAPE,
   median measured / predicted, Spearman over problems of >= 5 configurations,
   top-5 % retention) per dtype and time bucket (the problem's best measured time).
2. Per tile shape and bucket, the median *residual*: a configuration's measured /
   predicted over its problem's median of the same ratio. Ranking is lost where a
   shape's residual is far from 1 (above 1: the model ranks it too fast).
3. For the 16-bit rows at head_dim >= 64, by query-block rows (32, 64, 128) and
   whether the launch is one wave or more: the residual against the query tiles of
   one head as a share of the SMs (log2 bins). Every query tile of a head reads the
   same K/V block (the data's one 128-key block); the share is how many of the CTAs
   running at once read the same lines.
4. Per dtype and bucket, the median measured / predicted by ``score_mod_nodes`` (the
   program charges ``score_mod_nodes - 6`` ALU operations a score) and its ratio to
   the fewest nodes' median: a problem's configurations share the count, so this is
   a bias (and MAPE), not a ranking, lead (docs/gemm_accuracy.md, "Issue 35, session 21").

``--kv-bound`` repeats table 1 with K's and V's bytes scaled by
``min(block_m / 128, 1)`` (a program copy in a temporary directory): the model's
answer if no query tile re-read K and V more than a 128-row tile does. A bound to
read, not a model: it changes the work a row does in the cache model and the
envelope alike.

Nothing is fitted or written; it prints.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHARED = Path(os.environ.get("TSBATCH_SHARED_DATA", ROOT.parent / "shared" / "data"))
DEFAULT_FILE = SHARED / "attention" / "a100_flexattention.parquet"

INPUTS = ("batch", "heads", "seq_len", "head_dim", "dtype", "score_mod_nodes", "seq_len_kv",
          "block_m", "block_n", "num_stages", "num_warps")
#: the K and V tensors' bytes in the shipped attention program, and the bound's
KV_BYTES = 'bytes = "block_n * head_dim * eb"'
KV_BOUND = 'bytes = "block_n * head_dim * eb * min(block_m / 128.0, 1.0)"'


def scored(path: Path, family=None) -> pl.DataFrame:
    """The file's configurations (one row each, ``measured_us`` the median of its
    repeats) with ``predicted_us``, ``feasible``, the guard's ``bucket`` and the result
    columns tables 2 and 3 read (``resident_tiles``, ``waves``, ``bottleneck``)."""
    from tsbatch.engine.evaluate import evaluate
    from tsbatch.measured.accuracy import load_measured
    from tsbatch.measured.regress_metrics import add_slices

    loaded = load_measured([path], families=("attention",))
    frames = loaded.frames.get("attention")
    if not frames:
        raise SystemExit(f"{path}: no FlexAttention rows")
    parts = []
    for df in frames:
        for (hw,), part in df.group_by(["_hw"], maintain_order=True):
            res = evaluate(part.select(INPUTS), hw, family or "attention")
            parts.append(part.with_columns(
                predicted_us=res["latency_us"], feasible=res["feasible"],
                resident_tiles=res["resident_tiles"], waves=res["waves"],
                bottleneck=res["bottleneck"]))
    return add_slices(pl.concat(parts))


def figures(df: pl.DataFrame) -> pl.DataFrame:
    """Table 1: the guard's figures (``regress_metrics.accuracy_figures``) per dtype,
    over all buckets and per bucket."""
    from tsbatch.measured.regress_metrics import accuracy_figures

    out = accuracy_figures(df, ["dtype"], kinds=("all", "bucket"))
    return out.drop("slice_kind").rename({"slice": "bucket", "bias": "meas/pred"})


def with_residual(df: pl.DataFrame) -> pl.DataFrame:
    """The feasible rows with ``ratio`` (measured / predicted) and ``residual`` (the
    ratio over its problem's median ratio)."""
    ok = df.filter(pl.col("feasible") & pl.col("predicted_us").is_finite())
    ok = ok.with_columns(ratio=pl.col("measured_us") / pl.col("predicted_us"))
    return ok.with_columns(residual=pl.col("ratio") / pl.col("ratio").median().over("_problem"))


def by_tile(df: pl.DataFrame) -> pl.DataFrame:
    """Table 2: median residual per tile shape (rows x keys, warps) and bucket."""
    d = with_residual(df).with_columns(
        tile=pl.format("{}x{}/{}", "block_m", "block_n", "num_warps"))
    t = d.group_by("tile", "bucket").agg(pl.col("residual").median())
    wide = t.pivot(on="bucket", index="tile", values="residual")
    order = [b for b in ("<20us", "20-100us", "0.1-1ms", ">1ms") if b in wide.columns]
    rows = d.group_by("tile").agg(rows=pl.len())
    return rows.join(wide.select(["tile", *order]), on="tile").sort("tile")


def by_head_share(df: pl.DataFrame, sms: int) -> pl.DataFrame:
    """Table 3: 16-bit rows at head_dim >= 64, by query-block rows, one wave or more,
    and ``log2(query tiles of a head / sms)`` rounded: rows, median residual and ratio."""
    d = with_residual(df).filter((pl.col("head_dim") >= 64) & (pl.col("dtype") != "float32"))
    q_tiles = (pl.col("seq_len") / pl.col("block_m")).ceil()
    launch = pl.when(pl.col("waves") <= 1).then(pl.lit("one wave")).otherwise(pl.lit("more"))
    d = d.with_columns(share_log2=(q_tiles / sms).log(2).round(0).cast(pl.Int64), launch=launch)
    return (d.group_by("block_m", "launch", "share_log2")
            .agg(rows=pl.len(), residual=pl.col("residual").median(), ratio=pl.col("ratio").median())
            .sort("block_m", "launch", "share_log2"))


def by_score_mod(df: pl.DataFrame) -> pl.DataFrame:
    """Table 4: median measured / predicted per dtype, time bucket and ``score_mod_nodes``
    (the program charges ``score_mod_nodes - 6`` ALU operations a score), with the
    ratio of each count's median to that of the fewest nodes in the same dtype and bucket
    (``vs_fewest``: below 1 where the extra operations cost less than the model charges).
    A problem's configurations share its node count, so this moves MAPE and the
    bias, not the ranking within a problem."""
    d = with_residual(df)
    t = (d.group_by("dtype", "bucket", "score_mod_nodes")
         .agg(rows=pl.len(), meas_pred=pl.col("ratio").median()))
    base = (t.sort("score_mod_nodes").group_by("dtype", "bucket", maintain_order=True)
            .agg(pl.col("meas_pred").first().alias("_first")))
    return (t.join(base, on=["dtype", "bucket"])
            .with_columns(vs_fewest=pl.col("meas_pred") / pl.col("_first")).drop("_first")
            .sort("dtype", "bucket", "score_mod_nodes"))


def kv_bound_family(tmp: Path):
    """The attention program with K's and V's bytes scaled (module docstring), loaded."""
    from kernels_catalog.catalog import PROGRAM_DIR
    from tsbatch.engine.evaluate import get_family

    src = (Path(PROGRAM_DIR) / "attention.toml").read_text()
    if src.count(KV_BYTES) < 2:
        raise SystemExit("attention.toml's K/V bytes are not the expected expression; "
                         "update bench/flex_ranking.py")
    out = tmp / "attention_kv_bound.toml"
    out.write_text(src.replace(KV_BYTES, KV_BOUND))
    return get_family(str(out))


def _print(title: str, table: pl.DataFrame) -> None:
    print(f"\n{title}")
    with pl.Config(tbl_rows=200, tbl_cols=20, tbl_width_chars=200, float_precision=3,
                   tbl_hide_dataframe_shape=True, tbl_hide_column_data_types=True):
        print(table)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--file", type=Path, default=DEFAULT_FILE, help="measured FlexAttention file")
    ap.add_argument("--kv-bound", action="store_true",
                    help="also the figures with K/V re-reads bounded by a 128-row tile's")
    args = ap.parse_args(argv)
    if not args.file.exists():
        print(f"error: {args.file}: no such file (TSBATCH_SHARED_DATA?)", file=sys.stderr)
        return 2
    from tsbatch.hw import get_hw

    df = scored(args.file)
    gpus = df["_hw"].unique().to_list()
    sms = get_hw(gpus[0]).sm_count if len(gpus) == 1 else None
    _print(f"1. {args.file.name}: the guard's figures by dtype and bucket (this tree)", figures(df))
    _print("2. median residual (measured/predicted over the problem's median) by tile and bucket",
           by_tile(df))
    if sms:
        _print(f"3. 16-bit, head_dim >= 64: residual by query tiles of a head over the {sms} SMs "
               "(log2)", by_head_share(df, sms))
    _print("4. median measured/predicted by score_mod_nodes (operations a score: nodes - 6) "
           "and bucket", by_score_mod(df))
    if args.kv_bound:
        with tempfile.TemporaryDirectory() as tmp:
            bound = scored(args.file, kv_bound_family(Path(tmp)))
        _print("1b. the same figures with K/V bytes x min(block_m / 128, 1) (a bound, not a model)",
               figures(bound))
    return 0


if __name__ == "__main__":
    sys.exit(main())
