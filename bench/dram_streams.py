"""The DRAM stream rate of the measured DRAM-bound GEMMs against the model's, by stream size.

    python bench/dram_streams.py [--data FILE ...] [--hw h100_sxm] [--sample-problems N] [--json OUT]

Issue 35, "H100 long DRAM streams, session 5" (docs/gemm_accuracy.md): is a
GPU's DRAM rate (``[measured] dram_bw_tbps`` x ``[calibration] dram_efficiency``)
too high for long streams? This predicts every row of the measured files with
the working tree's model and prints, for the rows whose model bottleneck is
``dram``,

* by backend, dtype and decade of the model's DRAM bytes: rows, problems,
  median measured / predicted, median ``util_dram`` and the median stream rate
  ``dram_bytes / (time - t_launch_us)`` over the measured and the predicted time
  (TB/s);
* per problem and backend whose fastest measured row the model calls
  DRAM-bound, that row: its compulsory
  bytes (A + B + C once), measured and predicted time, and both rates;
* a line ``t = c + bytes / rate`` through those fastest rows (least squares,
  problems of at least ``--min-mb`` compulsory MB), measured and predicted: the
  marginal rate, which a per-kernel constant does not bias.

``--data`` defaults to the GPU's measured files (the AutoHeuristic set of
``../shared/data/gemm`` for ``h100_sxm`` and ``a100``, this tree's
``bench/measured/h200-*`` for ``h200``). Nothing is fitted into the model;
the figures are read off the data and the model.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import polars as pl

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "data" / "gemm"
DEFAULT_DATA = {
    "h100_sxm": [SHARED / "h100_triton_mm.parquet"],
    "a100": [SHARED / "a100_triton_mm.parquet"],
}
ELT = {"float16": 2, "bfloat16": 2, "float32": 4, "tf32": 4, "float8": 1}


def _default_data(hw: str) -> list[Path]:
    if hw in DEFAULT_DATA:
        return DEFAULT_DATA[hw]
    if hw == "h200":
        return sorted(ROOT.glob("bench/measured/h200-*/**/gemm.parquet"))
    sys.exit(f"bench/dram_streams.py: no default data for {hw}; give --data")


def rows(paths, hw: str, sample: int | None) -> pl.DataFrame:
    """Every feasible measured row with the model's prediction, rates and bytes."""
    from tsbatch.engine.evaluate import evaluate
    from tsbatch.errors import InputError
    from tsbatch.hw import get_hw
    from tsbatch.measured.accuracy import load_measured

    kw = {"sample_problems": sample} if sample else {}
    try:
        loaded = load_measured([str(p) for p in paths], hw=hw, **kw)
    except InputError as exc:
        sys.exit(f"bench/dram_streams.py: {exc}")
    frames = loaded.frames.get("gemm", [])
    if not frames:
        sys.exit("bench/dram_streams.py: no GEMM rows")
    d = pl.concat(frames, how="vertical_relaxed")
    out = []
    for key, part in d.partition_by("_hw", as_dict=True).items():
        res = evaluate(part.drop([c for c in part.columns if c.startswith("_") or c == "measured_us"]),
                       key[0] if isinstance(key, tuple) else key)
        hwname = key[0] if isinstance(key, tuple) else key
        tiles = [c for c in ("block_m", "block_n", "block_k", "num_stages") if c in part.columns]
        out.append(res.select("latency_us", "feasible", "bottleneck", "util_dram", "dram_bytes",
                              "t_launch_us", "resident_tiles").with_columns(
            *part.select("m", "n", "k", "dtype", "tf32", "backend", "measured_us", *tiles).get_columns(),
            pl.lit(get_hw(hwname).sm_count).alias("sms")))
    r = pl.concat(out, how="vertical_relaxed").filter(pl.col("feasible") & pl.col("measured_us").is_finite())
    r = r.with_columns(pl.when((pl.col("dtype") == "float32") & pl.col("tf32")).then(pl.lit("tf32"))
                       .otherwise(pl.col("dtype").cast(pl.String)).alias("label"))
    elt = pl.col("label").replace_strict(ELT, default=2).cast(pl.Float64)
    return r.with_columns(
        (pl.col("measured_us") / pl.col("latency_us")).alias("ratio"),
        (pl.col("dram_bytes") / (pl.col("measured_us") - pl.col("t_launch_us")) / 1e6).alias("meas_tbps"),
        (pl.col("dram_bytes") / (pl.col("latency_us") - pl.col("t_launch_us")) / 1e6).alias("pred_tbps"),
        ((pl.col("m") * pl.col("k") + pl.col("k") * pl.col("n") + pl.col("m") * pl.col("n")) * elt / 1e6)
        .alias("mb"),
        pl.col("dram_bytes").cast(pl.Float64).log10().floor().cast(pl.Int64).alias("log10_bytes"))


def tables(r: pl.DataFrame, min_mb: float) -> dict:
    d = r.filter(pl.col("bottleneck") == "dram")
    by_size = (d.group_by("backend", "label", "log10_bytes")
               .agg(pl.len().alias("rows"), pl.struct("m", "n", "k").n_unique().alias("problems"),
                    pl.col("ratio").median().alias("meas/pred"), pl.col("util_dram").median(),
                    pl.col("meas_tbps").median(), pl.col("pred_tbps").median())
               .sort("backend", "label", "log10_bytes"))
    best = (r.sort("measured_us").group_by("backend", "label", "m", "n", "k").agg(pl.all().first())
            .filter(pl.col("bottleneck") == "dram")
            .with_columns((pl.col("mb") / (pl.col("measured_us") - pl.col("t_launch_us"))).alias("meas_tbps_ab"),
                          (pl.col("mb") / (pl.col("latency_us") - pl.col("t_launch_us"))).alias("pred_tbps_ab"))
            .select("backend", "label", "m", "n", "k", "mb", "measured_us", "latency_us", "ratio",
                    "meas_tbps_ab", "pred_tbps_ab", "util_dram").sort("mb", "backend"))
    lines = {}
    for be in sorted(best["backend"].unique().to_list()):
        x = best.filter((pl.col("backend") == be) & (pl.col("mb") >= min_mb))
        if x.height < 3:
            continue
        a = np.vstack([np.ones(x.height), x["mb"].to_numpy()]).T
        (cm, sm), *_ = np.linalg.lstsq(a, x["measured_us"].to_numpy(), rcond=None)
        (cp, sp), *_ = np.linalg.lstsq(a, x["latency_us"].to_numpy(), rcond=None)
        lines[be] = {"problems": x.height, "mb_range": [float(x["mb"].min()), float(x["mb"].max())],
                     "measured": {"c_us": float(cm), "rate_tbps": float(1 / sm)},
                     "predicted": {"c_us": float(cp), "rate_tbps": float(1 / sp)}}
    return {"by backend, dtype, decade of DRAM bytes (model bottleneck dram)": by_size,
            "fastest row per problem where DRAM-bound (rates over A + B + C once, time net of launch)": best,
            "t = c + MB / rate through those rows": lines}


def _bins(x: pl.Expr, edges) -> pl.Expr:
    """``[a, b)`` labels of ``x`` between ``edges`` (``< first``, ``>= last`` outside)."""
    e = pl.when(x < edges[0]).then(pl.lit(f"< {edges[0]}"))
    for a, b in zip(edges, edges[1:]):
        e = e.when(x < b).then(pl.lit(f"[{a}, {b})"))
    return e.otherwise(pl.lit(f">= {edges[-1]}"))


def in_flight(r: pl.DataFrame, skinny: int, split_mb: float = 200.0) -> pl.DataFrame:
    """Skinny Triton rows (min(m, n) <= ``skinny``) that the model calls DRAM-bound, by stream size
    (A + B + C below / from ``split_mb``) and by the chip's bytes in flight: the tiles running at
    once (``min(tiles, sms x resident_tiles)``) x the stages ahead (``num_stages - 1``) x one
    stage's in-bounds A and B (``(min(BM, m) + min(BN, n)) x BK x element``), MB. Little's law
    says a stream is latency-bound below ``rate x latency`` in flight; the model prices that
    (``(L + memory) / (p (stages - 1))``), so its error should not follow this column if it is
    right. Section "Skinny GEMMs, session 7" of docs/gemm_accuracy.md."""
    need = {"block_m", "block_n", "block_k", "num_stages", "resident_tiles", "sms"}
    if not need <= set(r.columns):
        return pl.DataFrame()
    elt = pl.col("label").replace_strict(ELT, default=2).cast(pl.Float64)
    d = r.filter((pl.col("backend") == "triton") & (pl.min_horizontal("m", "n") <= skinny)
                 & (pl.col("bottleneck") == "dram") & pl.col("block_m").is_not_null())
    tiles = (((pl.col("m") + pl.col("block_m") - 1) // pl.col("block_m"))
             * ((pl.col("n") + pl.col("block_n") - 1) // pl.col("block_n")))
    running = pl.min_horizontal(tiles, pl.col("sms") * pl.col("resident_tiles"))
    stage = (pl.min_horizontal("block_m", "m") + pl.min_horizontal("block_n", "n")) * pl.col("block_k") * elt
    d = d.with_columns((running * (pl.col("num_stages") - 1) * stage / 1e6).alias("in_flight_mb"))
    d = d.with_columns(
        pl.when(pl.col("mb") < split_mb).then(pl.lit(f"< {split_mb:g} MB"))
        .otherwise(pl.lit(f">= {split_mb:g} MB")).alias("stream"),
        _bins(pl.col("in_flight_mb"), (1, 2, 4, 8, 16)).alias("in_flight"))
    return (d.group_by("stream", "in_flight")
            .agg(pl.len().alias("rows"), pl.struct("m", "n", "k").n_unique().alias("problems"),
                 pl.col("ratio").median().alias("meas/pred"), pl.col("meas_tbps").median(),
                 pl.col("in_flight_mb").min().alias("_lo"))
            .sort("stream", "_lo").drop("_lo"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", nargs="*", default=None)
    ap.add_argument("--hw", default="h100_sxm")
    ap.add_argument("--sample-problems", type=int, default=None)
    ap.add_argument("--min-mb", type=float, default=20.0)
    ap.add_argument("--json", default=None)
    ap.add_argument("--skinny", type=int, default=None,
                    help="also the skinny (min(m, n) <= N) Triton DRAM-bound rows by stream size and bytes in flight")
    args = ap.parse_args(argv)
    paths = [Path(p) for p in args.data] if args.data else _default_data(args.hw)
    r = rows(paths, args.hw, args.sample_problems)
    t = tables(r, args.min_mb)
    if args.skinny is not None:
        t[f"skinny (min(m, n) <= {args.skinny}) Triton DRAM-bound rows by stream size and MB in flight"] = \
            in_flight(r, args.skinny)
    pl.Config.set_tbl_rows(200)
    pl.Config.set_tbl_cols(20)
    pl.Config.set_tbl_width_chars(220)
    pl.Config.set_float_precision(3)
    for name, v in t.items():
        print(f"\n{name}")
        print(json.dumps(v, indent=1) if isinstance(v, dict) else v)
    if args.json:
        Path(args.json).write_text(json.dumps(
            {k: (v if isinstance(v, dict) else v.to_dicts()) for k, v in t.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
