"""Co-resident tiles against sequential waves: matched Triton configuration pairs.

    python bench/coresident_pairs.py [FILE ...] [--min-ksteps 32] [--steps 128x128x64]

Issue 35 (docs/gemm_accuracy.md, "Small-kernel Triton top-5 and bias against
ca279d0, session 12", section 5). For each measured GEMM file (default: the
A100 and H100 files of ``../shared/data/gemm`` and the H200 files of
``bench/measured``), every fp16/bf16 Triton row with at least
``--min-ksteps`` K steps (medians of repeats) is predicted with
:func:`tsbatch.engine.evaluate.evaluate` on the file's GPU. Rows are then paired
when they share the problem, layout, tile, warps and group_m and differ in
stages so that:

* the co-resident one holds ``p >= 2`` resident tiles and its busiest SM's
  ``T = ceil(tiles / sms)`` tiles all at once (``2 <= T <= p``: one wave);
* the sequential one holds ``p = 1`` and runs the same ``T`` tiles one after
  another (``T`` waves).

Both give the busiest SM the same tensor work at the same fill. The script prints,
per GPU and ``T``: the pairs, the problems, the median of co-resident ÷
sequential time measured and predicted, and how often the two agree on which
is faster; then every Hopper pair's problem with both times, and per GPU and
configuration (tile, warps, stages) the pairs' medians with both sides' median
measured ÷ predicted.

``--steps BMxBNxBK`` (issue 35, session 13, wip46a; ``--steps all``: every
tile shape with data, wip46s, with the step over the shape's step at the
measured tensor peak, the model's steady iteration ``model_iter`` and its
most common bottleneck) adds, for that tile, the
time of one tile's K step on the busiest SMs: (time − the model's launch) ÷
(``ceil(tiles / sms)`` × K steps), measured and predicted, medians over the
problems (fastest group_m by measured time), per GPU, warps, stages, resident
tiles ``p`` and tiles per SM (≤ 1: a sub-wave grid; 1-2; 2-4; > 4), with the
step at the measured tensor peak and at ``tc_efficiency`` for reference. A
co-resident pair's gain that comes from the clock of a partly filled wave
shows in the 1-2 row only; one that comes from the second tile hiding the
first one's latency shows in the > 4 row (full waves) too.

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

#: problem, layout and configuration columns a pair shares (all but the stages)
PAIR_KEYS = ("m", "n", "k", "dtype", "a_row_major", "b_row_major",
             "block_m", "block_n", "block_k", "num_warps", "group_m")
CONFIG = ("m", "n", "k", "dtype", "a_row_major", "b_row_major", "tf32", "backend",
          "block_m", "block_n", "block_k", "num_stages", "num_warps", "group_m")


def default_files() -> list[Path]:
    out = [SHARED / "gemm" / "a100_triton_mm.parquet", SHARED / "gemm" / "h100_triton_mm.parquet"]
    out += sorted((ROOT / "bench" / "measured").glob("h200-*/gemm.parquet"))
    out += sorted((ROOT / "bench" / "measured").glob("h200-*/more/gemm.parquet"))
    return [p for p in out if p.exists()]


def rows_of(path: Path, min_ksteps: int) -> tuple[str, pl.DataFrame]:
    """The file's GPU and its fp16/bf16 Triton configurations (median of repeats,
    ``meas`` in µs) with at least ``min_ksteps`` K steps."""
    d = pl.read_parquet(path)
    gpu = d["gpu"][0]
    d = d.filter((pl.col("backend") == "triton") & pl.col("dtype").is_in(["float16", "bfloat16"]))
    d = d.group_by(list(CONFIG)).agg(meas=pl.col("time_ms").median() * 1000.0)
    d = d.filter((pl.col("k") + pl.col("block_k") - 1) // pl.col("block_k") >= min_ksteps)
    return gpu, d


def predict(gpu: str, d: pl.DataFrame) -> pl.DataFrame:
    from tsbatch.engine.evaluate import evaluate, resolve_hw

    spec = resolve_hw(gpu)
    r = evaluate(d.select(list(CONFIG)), spec)
    return d.with_columns(pred=r["latency_us"], p=r["resident_tiles"], sms=pl.lit(spec.sm_count),
                          t_iter=r["t_steady_iter_us"], bottleneck=r["bottleneck"])


def pairs(d: pl.DataFrame) -> pl.DataFrame:
    """Matched pairs of a predicted frame (columns ``meas``, ``pred``, ``p``,
    ``sms`` and :data:`PAIR_KEYS`, ``num_stages``): one row per co-resident /
    sequential pair, with ``T``, ``tiles``, both sides' times and the ratios
    ``meas_ratio`` and ``pred_ratio`` (co-resident ÷ sequential)."""
    d = d.with_columns(
        tiles=((pl.col("m") + pl.col("block_m") - 1) // pl.col("block_m"))
        * ((pl.col("n") + pl.col("block_n") - 1) // pl.col("block_n")))
    d = d.with_columns(T=(pl.col("tiles") + pl.col("sms") - 1) // pl.col("sms"))
    keys = list(PAIR_KEYS)
    co = d.filter((pl.col("p") >= 2) & (pl.col("T") >= 2) & (pl.col("T") <= pl.col("p"))).select(
        *keys, "T", "tiles", stages_co="num_stages", meas_co="meas", pred_co="pred", p_co="p")
    seq = d.filter((pl.col("p") == 1) & (pl.col("T") >= 2)).select(
        *keys, stages_seq="num_stages", meas_seq="meas", pred_seq="pred")
    return co.join(seq, on=keys).with_columns(
        meas_ratio=pl.col("meas_co") / pl.col("meas_seq"),
        pred_ratio=pl.col("pred_co") / pl.col("pred_seq"))


#: tiles per SM bins of :func:`steps`
STEP_BINS = ((1.0, "<= 1"), (2.0, "1-2"), (4.0, "2-4"))


def steps(d: pl.DataFrame, launch_us: float) -> pl.DataFrame:
    """Per-step times of a predicted frame (one tile shape; columns ``meas``,
    ``pred``, ``p``, ``sms`` and :data:`CONFIG`): the fastest group_m of each
    problem and configuration by measured time, then per warps, stages, ``p``
    and tiles-per-SM bin the problems and the median of ``(time - launch_us) /
    (ceil(tiles / sms) * K steps)``, measured (``step``) and predicted
    (``pred_step``), and of measured ÷ predicted (``bias``)."""
    d = d.with_columns(
        tiles=((pl.col("m") + pl.col("block_m") - 1) // pl.col("block_m"))
        * ((pl.col("n") + pl.col("block_n") - 1) // pl.col("block_n")),
        ks=(pl.col("k") + pl.col("block_k") - 1) // pl.col("block_k"))
    d = d.with_columns(per_sm=pl.col("tiles") / pl.col("sms"),
                       rounds=(pl.col("tiles") + pl.col("sms") - 1) // pl.col("sms"))
    b = pl.lit("> 4")
    for hi, name in reversed(STEP_BINS):
        b = pl.when(pl.col("per_sm") <= hi).then(pl.lit(name)).otherwise(b)
    d = d.with_columns(tiles_per_sm=b)
    d = d.sort("meas").group_by(
        [c for c in CONFIG if c != "group_m"], maintain_order=True).first()
    den = pl.col("rounds") * pl.col("ks")
    order = {name: i for i, (_, name) in enumerate(STEP_BINS)}
    # the model's steady iteration of the busiest SM and its bottleneck, where
    # the frame carries them (predict() does)
    more = []
    if "t_iter" in d.columns:
        more.append(pl.col("t_iter").median().alias("model_iter"))
    if "bottleneck" in d.columns:
        more.append(pl.col("bottleneck").mode().sort().first().alias("bottleneck"))
    return d.group_by("num_warps", "num_stages", "p", "tiles_per_sm").agg(
        problems=pl.struct("m", "n", "k").n_unique(),
        step=((pl.col("meas") - launch_us) / den).median(),
        pred_step=((pl.col("pred") - launch_us) / den).median(),
        bias=(pl.col("meas") / pl.col("pred")).median(),
        *more,
    ).with_columns(_o=pl.col("tiles_per_sm").replace_strict(order, default=len(order))
                   ).sort("num_warps", "num_stages", "p", "_o").drop("_o")


def summary(p: pl.DataFrame) -> pl.DataFrame:
    return p.group_by("gpu", "T").agg(
        pairs=pl.len(),
        problems=pl.struct("m", "n", "k").n_unique(),
        measured=pl.col("meas_ratio").median(),
        model=pl.col("pred_ratio").median(),
        same_order=((pl.col("meas_ratio") < 1.0) == (pl.col("pred_ratio") < 1.0)).mean(),
    ).sort("gpu", "T")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="*", type=Path)
    ap.add_argument("--min-ksteps", type=int, default=32)
    ap.add_argument("--steps", metavar="BMxBNxBK", default=None,
                    help="also print the per-step table of this tile (e.g. 128x128x64), "
                         "or of every tile shape with data ('all')")
    args = ap.parse_args(argv)
    parts = []
    step_tables = []
    for path in args.files or default_files():
        gpu, d = rows_of(path, args.min_ksteps)
        if d.is_empty():
            continue
        pd = predict(gpu, d)
        parts.append(pairs(pd).with_columns(gpu=pl.lit(gpu), file=pl.lit(path.name)))
        if args.steps:
            step_tables.append((gpu, path.name, step_table(gpu, pd, args.steps)))
    if not parts:
        print("no pairs")
        return 0
    p = pl.concat(parts, how="diagonal_relaxed")
    with pl.Config(tbl_rows=2000, tbl_cols=30, tbl_width_chars=250, float_precision=3):
        print(summary(p))
        hop = p.filter(pl.col("gpu") != "a100").group_by(
            "gpu", "file", "m", "n", "k", "tiles", "block_m", "block_n", "block_k", "num_warps",
            "stages_co", "stages_seq", "T").agg(
            pl.len(), pl.col("meas_co").median(), pl.col("pred_co").median(),
            pl.col("meas_seq").median(), pl.col("pred_seq").median()).sort("gpu", "tiles")
        print(hop)
        print(p.group_by("gpu", "block_m", "block_n", "block_k", "num_warps", "stages_co",
                         "stages_seq", "p_co").agg(
            pl.len(), problems=pl.struct("m", "n", "k").n_unique(),
            measured=pl.col("meas_ratio").median(), model=pl.col("pred_ratio").median(),
            bias_co=(pl.col("meas_co") / pl.col("pred_co")).median(),
            bias_seq=(pl.col("meas_seq") / pl.col("pred_seq")).median(),
        ).sort("gpu", "len", descending=[False, True]))
        for gpu, name, t in step_tables:
            if t[1] == t[1]:
                print(f"{gpu} {name} {args.steps}: step at the measured tensor peak "
                      f"{t[1]:.3f} us, at tc_efficiency {t[2]:.3f} us")
            else:
                print(f"{gpu} {name} every tile: step_pk / pred_pk = step / the step at the "
                      "measured tensor peak")
            print(t[0])
    return 0


def step_table(gpu: str, pd: pl.DataFrame, tile: str):
    """:func:`steps` of one tile (``BMxBNxBK``) of a predicted frame, with the
    K step's time at the GPU's measured 16-bit tensor peak and at
    ``tc_efficiency`` of it."""
    from tsbatch.engine.evaluate import resolve_hw

    spec = resolve_hw(gpu)
    if tile.lower() == "all":
        # every tile shape with data, each step also over its step at the
        # measured tensor peak (step_pk, pred_pk) so that shapes compare
        parts = []
        for (bm, bn, bk), t in pd.group_by("block_m", "block_n", "block_k"):
            peak = 2.0 * bm * bn * bk / (spec.tc_tflops("float16") * 1e12 / spec.sm_count) * 1e6
            parts.append(steps(t, spec.launch_us).with_columns(
                tile=pl.lit(f"{bm}x{bn}x{bk}"), step_pk=pl.col("step") / peak,
                pred_pk=pl.col("pred_step") / peak))
        out = pl.concat(parts, how="diagonal_relaxed").sort(
            "tile", "num_warps", "num_stages", "p", maintain_order=True)
        return out.select("tile", *[c for c in out.columns if c != "tile"]), float("nan"), float("nan")
    bm, bn, bk = (int(x) for x in tile.lower().split("x"))
    t = pd.filter((pl.col("block_m") == bm) & (pl.col("block_n") == bn) & (pl.col("block_k") == bk))
    peak = 2.0 * bm * bn * bk / (spec.tc_tflops("float16") * 1e12 / spec.sm_count) * 1e6
    return steps(t, spec.launch_us), peak, peak / spec.cal("tc_efficiency")


if __name__ == "__main__":
    raise SystemExit(main())
