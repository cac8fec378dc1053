"""Where large Triton tensor-core GEMMs are predicted too fast: three cuts of every measured GEMM row.

    python bench/triton_large_bias.py [--files F ...] [--save DIR]

docs/gemm_accuracy.md, "Large Triton tensor-core GEMMs, session 13". Predicts
every row of the measured GEMM files (default: ``../shared/data/gemm/{a100,h100}
_triton_mm.parquet`` and this tree's ``bench/measured/h200-2026-11-30/gemm.parquet``
and ``.../more/gemm.parquet``) with the working tree's model and prints, for
fp16 and bf16 (median measured / predicted, rows in brackets):

1. by the operands' bytes over the GPU's L2, ``(m k + n k) elt / l2_bytes``,
   per file x backend x dtype (Triton rises with it on every GPU, the library
   does not);
2. on the files that measured every row in both dtypes (our H200 files): the
   bf16 time over the fp16 time of the same row, by the model's tensor-core
   utilization (``util_tensor_core`` of the fp16 row) and MMA path, and the
   least-squares line ``bf16 / fp16 = a + b u`` per time bucket;
3. per problem: Triton's fastest measured configuration against the library
   on the same problem, measured / predicted of each and the measured and
   predicted Triton / library ratios.

Buckets are ``bench/regress.py``'s (the problem's best measured time over all
its rows). ``--save DIR`` writes the predicted rows (one Parquet per file).
Nothing is fitted.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import polars as pl

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_FILES = [
    ROOT.parent / "shared/data/gemm/a100_triton_mm.parquet",
    ROOT.parent / "shared/data/gemm/h100_triton_mm.parquet",
    ROOT / "bench/measured/h200-2026-11-30/gemm.parquet",
    ROOT / "bench/measured/h200-2026-11-30/more/gemm.parquet",
]
AB_EDGES = [0.5, 1, 2, 4, 8, 16]
U_EDGES = [0.3, 0.5, 0.7, 0.85]
PAIR_KEY = ["m", "n", "k", "a_row_major", "b_row_major", "backend", "block_m", "block_n",
            "block_k", "num_stages", "num_warps", "group_m"]


def _bucket(col: str) -> pl.Expr:
    return (pl.when(pl.col(col) < 20).then(pl.lit("<20us")).when(pl.col(col) < 100).then(pl.lit("20-100us"))
            .when(pl.col(col) < 1000).then(pl.lit("0.1-1ms")).otherwise(pl.lit(">1ms")))


def _bin(col: str, edges: list[float]) -> pl.Expr:
    """Labels ``<= e0``, ``e0-e1``, ..., ``> e_last`` (intervals closed on the right)."""
    e = pl.lit(f"> {edges[-1]:g}")
    for lo, hi in reversed(list(zip([None, *edges[:-1]], edges))):
        label = f"<= {hi:g}" if lo is None else f"{lo:g}-{hi:g}"
        e = pl.when(pl.col(col) <= hi).then(pl.lit(label)).otherwise(e)
    return e


def _table(df: pl.DataFrame, rows: list[str], col: str, order: list[str], val: str = "ratio") -> pl.DataFrame:
    t = (df.group_by([*rows, col]).agg(pl.col(val).median().round(3).alias("v"), pl.len().alias("n"))
         .with_columns(pl.format("{} ({})", "v", "n").alias("cell")))
    out = t.pivot(on=col, index=rows, values="cell").sort(rows)
    return out.select([*rows, *[c for c in order if c in out.columns]])


def predict(path: Path) -> pl.DataFrame:
    from tsbatch.engine.evaluate import evaluate
    from tsbatch.hw import get_hw
    from tsbatch.measured.accuracy import load_measured

    loaded = load_measured([str(path)])
    frames = loaded.frames.get("gemm", [])
    if not frames:
        return pl.DataFrame()
    d = pl.concat(frames, how="vertical_relaxed")
    best = d.group_by("_problem").agg(pl.col("measured_us").min().alias("_best"))
    d = d.join(best, on="_problem")
    parts = []
    for hw, part in d.partition_by("_hw", as_dict=True).items():
        hw = hw[0] if isinstance(hw, tuple) else hw
        res = evaluate(part.drop([c for c in part.columns if c.startswith("_") or c == "measured_us"]), hw)
        keep = part.select([c for c in part.columns if c not in res.columns])
        parts.append(pl.concat([res, keep], how="horizontal").with_columns(
            pl.lit(float(get_hw(hw).l2_bytes)).alias("_l2")))
    r = pl.concat(parts, how="diagonal_relaxed").filter(pl.col("feasible"))
    return r.with_columns(
        pl.lit(path.parent.name if path.name == "gemm.parquet" else path.stem).alias("file"),
        pl.when(pl.col("tf32")).then(pl.lit("tf32")).otherwise(pl.col("dtype").cast(pl.String)).alias("label"),
        (pl.col("measured_us") / pl.col("latency_us")).alias("ratio"),
        _bucket("_best").alias("bucket"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", nargs="*", type=Path, default=DEFAULT_FILES)
    ap.add_argument("--save", type=Path, default=None)
    args = ap.parse_args(argv)
    pl.Config.set_tbl_rows(400)
    pl.Config.set_tbl_cols(30)
    pl.Config.set_tbl_width_chars(250)
    pl.Config.set_fmt_str_lengths(40)
    frames = []
    for f in args.files:
        if not f.exists():
            print(f"skipped (not found): {f}", file=sys.stderr)
            continue
        r = predict(f)
        if r.height:
            if args.save:
                args.save.mkdir(parents=True, exist_ok=True)
                r.write_parquet(args.save / f"{r['file'][0]}_{f.stem}.parquet")
            frames.append(r)
    if not frames:
        sys.exit("bench/triton_large_bias.py: no GEMM rows")
    d = pl.concat(frames, how="diagonal_relaxed").filter(pl.col("label").is_in(["float16", "bfloat16"]))
    elt = 2.0
    d = d.with_columns(((pl.col("m") + pl.col("n")) * pl.col("k") * elt / pl.col("_l2")).alias("ab_l2"))
    d = d.with_columns(_bin("ab_l2", AB_EDGES).alias("ab"), _bin("util_tensor_core", U_EDGES).alias("u"))
    ab_order = [f"<= {AB_EDGES[0]:g}"] + [f"{a:g}-{b:g}" for a, b in zip(AB_EDGES, AB_EDGES[1:])] + [f"> {AB_EDGES[-1]:g}"]
    u_order = [f"<= {U_EDGES[0]:g}"] + [f"{a:g}-{b:g}" for a, b in zip(U_EDGES, U_EDGES[1:])] + [f"> {U_EDGES[-1]:g}"]
    buckets = ["<20us", "20-100us", "0.1-1ms", ">1ms"]

    print("1. measured / predicted by (m k + n k) elt / L2, fp16 and bf16, every row")
    print(_table(d, ["file", "backend", "label"], "ab", ab_order))
    print("   Triton rows of problems above 1 ms")
    print(_table(d.filter((pl.col("backend") == "triton") & (pl.col("bucket") == ">1ms")),
                 ["file", "label"], "ab", ab_order))

    print("\n2. the same row in both dtypes: bf16 time / fp16 time, by the fp16 row's model "
          "tensor-core utilization")
    f16 = d.filter(pl.col("label") == "float16").select([
        "file", *PAIR_KEY, "measured_us", "util_tensor_core", "u", "mma_path", "bucket"])
    b16 = d.filter(pl.col("label") == "bfloat16").select(["file", *PAIR_KEY, "measured_us"]).rename(
        {"measured_us": "bf_us"})
    j = f16.join(b16, on=["file", *PAIR_KEY]).with_columns((pl.col("bf_us") / pl.col("measured_us")).alias("bf_fp"))
    if j.height == 0:
        print("   (no file measured the same rows in both dtypes)")
    else:
        print(_table(j, ["file", "backend", "mma_path"], "u", u_order, val="bf_fp"))
        print(_table(j, ["backend", "mma_path"], "bucket", buckets, val="bf_fp"))
        for (bk, mp), x in sorted(j.filter(pl.col("backend") == "triton")
                                  .partition_by(["bucket", "mma_path"], as_dict=True).items()):
            if x.height < 10:
                continue
            u = x["util_tensor_core"].to_numpy()
            y = x["bf_fp"].to_numpy()
            a, b = np.linalg.lstsq(np.vstack([np.ones_like(u), u]).T, y, rcond=None)[0]
            print(f"   triton {mp:8s} {bk:8s} {x.height:5d} pairs: bf16/fp16 = {a:.4f} {b:+.4f} u "
                  f"(median u {np.median(u):.2f})")

    print("\n3. per problem: Triton's fastest measured row against the library's")
    key = ["file", "label", "m", "n", "k", "a_row_major", "b_row_major"]
    tb = (d.filter(pl.col("backend") == "triton").sort("measured_us").group_by(key)
          .agg(pl.col("measured_us").first().alias("t_meas"), pl.col("latency_us").first().alias("t_pred"),
               pl.col("bucket").first()))
    cb = (d.filter(pl.col("backend") != "triton").group_by(key)
          .agg(pl.col("measured_us").min().alias("c_meas"), pl.col("latency_us").first().alias("c_pred")))
    p = tb.join(cb, on=key).with_columns(
        (pl.col("t_meas") / pl.col("t_pred")).alias("triton_best"), (pl.col("c_meas") / pl.col("c_pred")).alias("library"),
        (pl.col("t_meas") / pl.col("c_meas")).alias("meas_t_over_l"), (pl.col("t_pred") / pl.col("c_pred")).alias("pred_t_over_l"))
    print(p.group_by("file", "label", "bucket").agg(
        *[pl.col(c).median().round(3) for c in ("triton_best", "library", "meas_t_over_l", "pred_t_over_l")],
        pl.len().alias("problems")).sort("file", "label", "bucket"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
