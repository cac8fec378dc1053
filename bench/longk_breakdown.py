"""Where the long-K Triton GEMM error sits: measured / predicted by K steps, warps, waves, layout and row stride.

    python bench/longk_breakdown.py [--data ../shared/data/gemm/a100_triton_mm.parquet] [--hw a100]
                                    [--dtypes float16,bfloat16] [--bucket ">1ms"] [--json OUT]

Issue 35's A100 lead (docs/gemm_accuracy.md, "Triton long K, session 3"):
the model predicts the Triton rows of long reduction loops too fast. This
predicts every Triton row of a measured GEMM file with the working tree's
model and prints, for the problems of one time bucket (the problem's best
measured time over all its configurations and backends, as
``bench/regress.py`` buckets them), the median measured / predicted time and
the row count

* by warps and K steps (``ceil(k / block_k)``),
* by warps and waves at more than 256 K steps,
* by operand layout (``A:row B:col`` = ``a_row_major`` 1, ``b_row_major`` 0),
* by the smaller of the two operands' row strides in bytes (log2; the
  stride of ``A`` is ``k`` elements when it is row-major, else ``m``; of
  ``B`` ``n`` when row-major, else ``k``),

by configuration (block sizes, stages, warps: the model's resident tiles
and bottleneck beside the ratio; docs/gemm_accuracy.md, "Triton's large
Hopper GEMMs, session 5"),
and the bytes the tiles load, ``tiles x ksteps x (BM + BN) x BK x elt``,
over the measured and over the predicted time (TB/s), by tile and K steps;
and by warps (2 or fewer / more), the stripe set one wave works through over
the whole loop in L2 sizes and the waves: ``F = (rows of A + columns of B the
wave's tiles cover) x k x elt`` with the grouped launch order's ``min(g0,
max(group_m, conc / g1))`` row stripes and ``min(g1, conc / min(group_m, g0))``
column stripes, ``conc`` = SMs x resident tiles (docs/gemm_accuracy.md, "A100
Triton and the operands' row stride, session 4"); and, for the launches whose
``m`` and ``n`` are both at least 512 (no skinny streams), by the pages one SM's
resident tiles read their K-contiguous operands from over the whole loop,
``resident x (ceil(BM k elt / 2 MiB) + ceil(BN k elt / 2 MiB))``, an M/N-contiguous
operand counting none (a step of it lies in one or two pages, which move on
with K), in launches of at most 4 waves by layout and in all of them by waves
(docs/gemm_accuracy.md, "Long-K loss by operand layout, session 5"); and
by the distinct 2 MiB pages one SM's resident tiles read in a K step, both
operands, a page two resident tiles share counted once
(:func:`distinct_sm_pages`: SM 0's tiles in the grouped order; the count an
L1 TLB of 2 MiB entries would hold), by resident tiles (one or more) and
waves (docs/gemm_accuracy.md, "Address translation on A100, session 5").
``--dtypes`` takes the measured file's labels (``float32`` is IEEE FP32,
``tf32`` the TF32 rows). Nothing is fitted; the figures are read off the
data and the model.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parent.parent
KSTEP_EDGES = [32, 256, 1024, 4096]
WAVE_EDGES = [1, 4, 16, 64]
F_EDGES = [1, 4, 16]
PAGE_EDGES = [8, 16, 24, 32, 48]
STEP_PAGE_EDGES = [8, 12, 16, 20, 24, 32, 48]
#: the page size the SM page set is counted in (2 MiB: the GPU's large page,
#: which the CUDA allocator uses for allocations of that size and more)
PAGE_BYTES = 2 * 1024 * 1024
ELT = {"float16": 2, "bfloat16": 2, "float32": 4, "tf32": 4, "float8": 1}


def _bin(col: str, edges: list[int]) -> pl.Expr:
    """A label ``<= e0``, ``e0-e1``, ..., ``> eN`` of an integer column (sorts as text
    in that order through a zero-padded prefix)."""
    expr = pl.lit(f"{len(edges)}:>{edges[-1]}")
    for i in range(len(edges) - 1, -1, -1):
        lo = 0 if i == 0 else edges[i - 1]
        label = f"{i}:<={edges[0]}" if i == 0 else f"{i}:{lo + 1}-{edges[i]}"
        expr = pl.when(pl.col(col) <= edges[i]).then(pl.lit(label)).otherwise(expr)
    return expr


def _bin_real(col: str, edges: list[int]) -> pl.Expr:
    """As :func:`_bin` for a real-valued column: ``<= e0``, ``e0-e1`` (above e0, at
    most e1), ..., ``> eN``."""
    expr = pl.lit(f"{len(edges)}:>{edges[-1]}")
    for i in range(len(edges) - 1, -1, -1):
        label = f"{i}:<={edges[0]}" if i == 0 else f"{i}:{edges[i - 1]}-{edges[i]}"
        expr = pl.when(pl.col(col) <= edges[i]).then(pl.lit(label)).otherwise(expr)
    return expr


def _table(df: pl.DataFrame, rows: list[str], col: str, val: str = "ratio") -> pl.DataFrame:
    t = (df.group_by([*rows, col])
         .agg(pl.col(val).median().round(2).alias("v"), pl.len().alias("n"))
         .with_columns(pl.format("{} ({})", "v", "n").alias("cell")))
    return t.pivot(on=col, index=rows, values="cell", sort_columns=True).sort(rows)


def _grouped_coords(g0: int, g1: int, group: int, pid: int) -> tuple[int, int]:
    """(row, column) tile of program ``pid`` in Triton's grouped launch order."""
    gm = max(group, 1)
    width = gm * g1
    gid = pid // width
    first = gid * gm
    size = min(g0 - first, gm)
    inner = pid - gid * width
    return first + inner % size, inner // size


def distinct_sm_pages(m, n, k, bm, bn, bk, a_rm, b_rm, elt, group, p, sms) -> int:
    """The 2 MiB pages that SM 0's ``p`` resident tiles (programs ``0, S, ..., (p-1) S``
    of the grouped order, ``S`` SMs) read in one K step (the first), both operands,
    a page two tiles share counted once.

    Per operand as stored (row stride ``s`` bytes): a K-contiguous one is read as
    the tile's ``BM`` (``BN``) rows, a ``BK``-element run each, an M/N-contiguous
    one as ``BK`` rows, a ``BM`` (``BN``)-element run each at the block's column.
    A block of rows lies in the pages ``floor(start / P) .. floor(end / P)``: all
    of them when ``s < P`` (the tiles' intervals are merged), one a row when
    ``s >= P`` (distinct blocks read distinct pages)."""
    g0 = -(-m // bm)
    g1 = -(-n // bn)
    tiles = g0 * g1
    ops = ((bm if a_rm else bk, (k if a_rm else m) * elt, (bk if a_rm else bm) * elt, a_rm, 0),
           (bk if b_rm else bn, (n if b_rm else k) * elt, (bn if b_rm else bk) * elt, not b_rm, 1))
    total = 0
    for rows, stride, run, kc, axis in ops:
        spans = set()
        for t in range(max(int(p), 1)):
            pid = t * sms
            if pid >= tiles:
                break
            blk = _grouped_coords(g0, g1, group, pid)[axis]
            start = blk * rows * stride if kc else blk * run
            end = start + (rows - 1) * stride + run - 1
            spans.add((start // PAGE_BYTES, end // PAGE_BYTES))
        if stride >= PAGE_BYTES:
            total += sum(min(rows, hi - lo + 1) for lo, hi in spans)
            continue
        hi_seen = None
        for lo, hi in sorted(spans):
            if hi_seen is None or lo > hi_seen + 1:
                total += hi - lo + 1
                hi_seen = hi
            elif hi > hi_seen:
                total += hi - hi_seen
                hi_seen = hi
    return total


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(ROOT.parent / "shared/data/gemm/a100_triton_mm.parquet"))
    ap.add_argument("--hw", default=None, help="GPU (default: the file's own)")
    ap.add_argument("--dtypes", default="float16,bfloat16")
    ap.add_argument("--bucket", default=">1ms", choices=["<20us", "20-100us", "0.1-1ms", ">1ms"])
    ap.add_argument("--json", default=None, help="write the tables as JSON")
    args = ap.parse_args(argv)
    from tsbatch.engine.evaluate import evaluate
    from tsbatch.errors import InputError
    from tsbatch.hw import get_hw
    from tsbatch.measured.accuracy import load_measured

    try:
        loaded = load_measured([args.data], hw=args.hw)
    except InputError as exc:
        sys.exit(f"bench/longk_breakdown.py: {exc}")
    frames = loaded.frames.get("gemm", [])
    if not frames:
        sys.exit(f"bench/longk_breakdown.py: no GEMM rows in {args.data}")
    d = pl.concat(frames, how="vertical_relaxed")
    best = d.group_by("_problem").agg(pl.col("measured_us").min().alias("_best"))
    d = d.join(best, on="_problem").with_columns(
        pl.when(pl.col("_best") < 20).then(pl.lit("<20us"))
        .when(pl.col("_best") < 100).then(pl.lit("20-100us"))
        .when(pl.col("_best") < 1000).then(pl.lit("0.1-1ms")).otherwise(pl.lit(">1ms")).alias("bucket"),
        pl.when((pl.col("dtype") == "float32") & pl.col("tf32")).then(pl.lit("tf32"))
        .otherwise(pl.col("dtype").cast(pl.String)).alias("label"))
    dtypes = [x.strip() for x in args.dtypes.split(",") if x.strip()]
    d = d.filter((pl.col("backend") == "triton") & pl.col("label").is_in(dtypes)
                 & (pl.col("bucket") == args.bucket))
    if d.height == 0:
        sys.exit("bench/longk_breakdown.py: no Triton rows of those dtypes in that bucket")
    out = []
    for hw, part in d.partition_by("_hw", as_dict=True).items():
        hw = hw[0] if isinstance(hw, tuple) else hw
        res = evaluate(part.drop([c for c in part.columns if c.startswith("_") or c in
                                  ("measured_us", "bucket", "label")]), hw)
        spec = get_hw(hw)
        out.append(res.select("latency_us", "feasible", "waves", "resident_tiles", "bottleneck",
                              "mma_path").with_columns(
            part.select("m", "n", "k", "a_row_major", "b_row_major", "block_m", "block_n", "block_k",
                        "num_stages", "num_warps", "group_m", "measured_us", "label")).with_columns(
            pl.lit(float(spec.sm_count)).alias("sms"), pl.lit(float(spec.l2_bytes)).alias("l2")))
    r = pl.concat(out).filter(pl.col("feasible"))
    elt = pl.col("label").replace_strict(ELT, default=2).cast(pl.Float64)
    r = r.with_columns(
        (pl.col("measured_us") / pl.col("latency_us")).alias("ratio"),
        (pl.col("k") + pl.col("block_k") - 1).floordiv(pl.col("block_k")).alias("ksteps"),
        pl.format("A:{} B:{}", pl.when(pl.col("a_row_major")).then(pl.lit("row")).otherwise(pl.lit("col")),
                  pl.when(pl.col("b_row_major")).then(pl.lit("row")).otherwise(pl.lit("col"))).alias("layout"),
        (pl.min_horizontal(pl.when(pl.col("a_row_major")).then(pl.col("k")).otherwise(pl.col("m")),
                           pl.when(pl.col("b_row_major")).then(pl.col("n")).otherwise(pl.col("k")))
         * elt).log(2).floor().cast(pl.Int64).clip(10, 18).alias("log2_stride"),
        ((pl.col("m") + pl.col("block_m") - 1).floordiv(pl.col("block_m"))
         * (pl.col("n") + pl.col("block_n") - 1).floordiv(pl.col("block_n"))).alias("tiles"))
    loads = (pl.col("tiles") * pl.col("ksteps") * (pl.col("block_m") + pl.col("block_n"))
             * pl.col("block_k") * elt)
    g0 = (pl.col("m") + pl.col("block_m") - 1).floordiv(pl.col("block_m")).cast(pl.Float64)
    g1 = (pl.col("n") + pl.col("block_n") - 1).floordiv(pl.col("block_n")).cast(pl.Float64)
    grp = pl.col("group_m").cast(pl.Float64)
    conc = pl.col("sms") * pl.col("resident_tiles").cast(pl.Float64)
    stripes = (pl.min_horizontal(g0, pl.max_horizontal(grp, conc / g1)) * pl.col("block_m")
               + pl.min_horizontal(g1, conc / pl.min_horizontal(grp, g0)) * pl.col("block_n"))
    r = r.with_columns((stripes * pl.col("k") * elt / pl.col("l2")).alias("f_l2"),
                       pl.when(pl.col("num_warps") <= 2).then(pl.lit("<=2"))
                       .otherwise(pl.lit(">2")).alias("warps"))
    pages = lambda blk: (pl.col(blk) * pl.col("k") * elt / PAGE_BYTES).ceil()  # noqa: E731
    r = r.with_columns((pl.col("resident_tiles").cast(pl.Float64)
                        * (pl.when(pl.col("a_row_major")).then(pages("block_m")).otherwise(0.0)
                           + pl.when(pl.col("b_row_major")).then(0.0).otherwise(pages("block_n"))))
                       .cast(pl.Int64).alias("sm_pages"))
    r = r.with_columns(_bin("sm_pages", PAGE_EDGES).alias("sm_pages_bin"),
                       _bin("ksteps", KSTEP_EDGES).alias("ksteps_bin"),
                       _bin_real("f_l2", F_EDGES).alias("f_l2_bin"),
                       _bin("waves", WAVE_EDGES).alias("waves_bin"),
                       (loads / pl.col("measured_us") / 1e6).alias("load_tbps_measured"),
                       (loads / pl.col("latency_us") / 1e6).alias("load_tbps_model"),
                       pl.format("{}x{}", "block_m", "block_n").alias("tile"),
                       pl.format("{}x{}x{}/s{}/w{}", "block_m", "block_n", "block_k", "num_stages",
                                 "num_warps").alias("config"))
    sq = r.filter((pl.col("m") >= 512) & (pl.col("n") >= 512))
    cols = ("m", "n", "k", "block_m", "block_n", "block_k", "a_row_major", "b_row_major",
            "label", "group_m", "resident_tiles", "sms")
    dist = [distinct_sm_pages(m, n, k, bm, bn, bk, bool(ar), bool(br), ELT.get(lab, 2), g, p, int(s))
            for m, n, k, bm, bn, bk, ar, br, lab, g, p, s in zip(*(sq[c].to_list() for c in cols))]
    sq = sq.with_columns(pl.Series("step_pages", dist, dtype=pl.Int64)).with_columns(
        _bin("step_pages", STEP_PAGE_EDGES).alias("step_pages_bin"),
        pl.when(pl.col("resident_tiles") <= 1).then(pl.lit("1")).otherwise(pl.lit(">=2"))
        .alias("resident"))
    tables = {
        "measured / predicted by warps x K steps": _table(r, ["label", "num_warps"], "ksteps_bin"),
        "measured / predicted by warps x waves, > 256 K steps":
            _table(r.filter(pl.col("ksteps") > 256), ["num_warps", "ksteps_bin"], "waves_bin"),
        "measured / predicted by layout, warps x K steps": _table(r, ["num_warps", "ksteps_bin"], "layout"),
        "measured / predicted by warps x the wave's whole-K stripe set (F / L2), waves":
            _table(r, ["warps", "f_l2_bin"], "waves_bin"),
        "measured / predicted by the SM's page set (2 MiB pages of K-contiguous rows), layout; "
        "m, n >= 512, at most 4 waves":
            _table(sq.filter(pl.col("waves") <= 4), ["warps", "layout"], "sm_pages_bin"),
        "measured / predicted by the SM's page set, waves; m, n >= 512":
            _table(sq, ["warps", "sm_pages_bin"], "waves_bin"),
        "measured / predicted by the distinct 2 MiB pages SM 0's resident tiles read per step "
        "(both operands, shared pages once), resident tiles x waves; m, n >= 512":
            _table(sq.filter(pl.col("num_warps") > 2), ["resident", "waves_bin"], "step_pages_bin"),
        "measured / predicted by log2 of the smaller operand row stride (bytes), warps":
            _table(r, ["num_warps"], "log2_stride"),
        "tile loads over the measured time, TB/s":
            _table(r, ["num_warps", "tile"], "ksteps_bin", "load_tbps_measured"),
        "tile loads over the predicted time, TB/s":
            _table(r, ["num_warps", "tile"], "ksteps_bin", "load_tbps_model"),
    }
    by_config = (r.group_by("config", "mma_path")
                 .agg(pl.len().alias("rows"), pl.col("ratio").median().round(3).alias("meas/pred"),
                      pl.col("resident_tiles").median().alias("resident"),
                      pl.col("bottleneck").mode().first().alias("model bottleneck"),
                      pl.col("load_tbps_measured").median().round(2).alias("loads TB/s meas"),
                      pl.col("load_tbps_model").median().round(2).alias("loads TB/s model"))
                 .sort("config"))
    tables["by configuration (tile/stages/warps): measured / predicted, the model's median resident "
           "tiles and most frequent bottleneck, tile loads over the measured and predicted time"] = by_config
    pl.Config.set_tbl_rows(200)
    pl.Config.set_tbl_cols(20)
    pl.Config.set_fmt_str_lengths(40)
    pl.Config.set_tbl_width_chars(200)
    print(f"{args.data}: {r.height} feasible Triton rows, dtypes {dtypes}, bucket {args.bucket}; "
          f"cells are 'median (rows)'")
    for name, t in tables.items():
        print(f"\n{name}")
        print(t)
    if args.json:
        Path(args.json).write_text(json.dumps({k: v.to_dicts() for k, v in tables.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
