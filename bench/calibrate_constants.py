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

``--tc-net`` derives ``tc_efficiency`` instead, net of the model's own step
costs (docs/gemm_accuracy.md, "tc_efficiency net of step costs, session 5"):

    python bench/calibrate_constants.py h200 --tc-net

The reference row is chosen by the rule the shipped values were read by: the
GPU's fastest measured GEMM (TFLOPS at the median of its repeats) on the tensor
cores' dtypes (float16/bfloat16; float8 where the GPU's file holds only FP8
GEMMs), any backend, in its measured file (:data:`TC_FILES`). The gross value
is that row's TFLOPS over the measured tensor-core peak; the net value is the
``tc_efficiency`` at which the model's own prediction of that row (its whole
waves, per-step bookkeeping, pick over tiles and everything else) equals the
measured time, found by bisection (the prediction falls as the value rises).
Where even 1.0 predicts the row slower than measured, no value in (0, 1] is
net of the model's step costs and the script says so.
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


#: each GPU's measured GEMM file (relative to the shared data folder, or to the
#: repository for ``bench/measured``) and the tensor-core dtypes its reference row
#: is read from: the file the shipped ``tc_efficiency`` (or, where carried, the
#: figure beside it) comes from
TC_FILES = {
    "a100": ("gemm/a100_triton_mm.parquet", ("float16", "bfloat16")),
    "h100": ("gemm/h100_triton_mm.parquet", ("float16", "bfloat16")),
    "h200": ("bench/measured/h200-2026-11-30/gemm.parquet", ("float16", "bfloat16")),
    "h800": ("gemm/pipeweave_fp8_gemm_train.parquet", ("float8",)),
    "h20": ("gemm/pipeweave_fp8_gemm_train.parquet", ("float8",)),
}


def reference_row(frame: pl.DataFrame, dtypes) -> pl.DataFrame:
    """The fastest row of ``frame`` (``m, n, k, dtype, measured_us``) in TFLOPS among ``dtypes``.

    One row, with ``tflops`` added; an error if no row has one of ``dtypes``.
    """
    d = frame.filter(pl.col("dtype").is_in(list(dtypes)), pl.col("measured_us").is_finite(),
                     pl.col("measured_us") > 0)
    if d.height == 0:
        raise ValueError(f"no measured row of dtype {', '.join(dtypes)}")
    d = d.with_columns(tflops=2.0 * pl.col("m") * pl.col("n") * pl.col("k") / pl.col("measured_us") / 1e6)
    return d.sort("tflops", descending=True, maintain_order=True).head(1)


def with_calibration(hw0, **values):
    """A copy of ``hw0`` whose ``[calibration]`` has ``values`` (the others unchanged)."""
    cal = dict(hw0.calibration)
    cal.update(values)
    return dataclasses.replace(hw0, calibration=cal)


def net_tc_efficiency(row: pl.DataFrame, hw0, measured_us: float, tol: float = 1e-5) -> float | None:
    """The ``tc_efficiency`` in (0, 1] with which the model predicts ``row`` in ``measured_us``.

    ``row`` is one row of :func:`evaluate`'s input columns. Bisection on the
    model's own prediction, which does not rise as the tensor cores' rate does;
    None where even 1.0 predicts the row slower than ``measured_us``.
    """
    def pred(eff: float) -> float:
        return float(evaluate(row, with_calibration(hw0, tc_efficiency=eff))["latency_us"][0])

    lo, hi = 0.05, 1.0
    if pred(hi) > measured_us:
        return None
    if pred(lo) <= measured_us:
        return lo
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        if pred(mid) > measured_us:
            lo = mid
        else:
            hi = mid
    return hi


def tc_net(gpu: str) -> dict:
    """Gross and net ``tc_efficiency`` of ``gpu`` on its reference row (:data:`TC_FILES`)."""
    from tsbatch.measured.accuracy import GEMM, load_measured

    rel, dtypes = TC_FILES[gpu]
    root = os.environ.get("TSBATCH_SHARED_DATA", os.path.join("..", "shared", "data"))
    path = rel if rel.startswith("bench/") else os.path.join(root, rel)
    hw0 = get_hw(gpu)
    frames = load_measured([path]).frames["gemm"]
    d = pl.concat(frames, how="diagonal_relaxed")
    mine = [h for h in d["_hw"].unique().to_list() if get_hw(h).key == hw0.key]
    d = d.filter(pl.col("_hw").is_in(mine))
    ref = reference_row(d, dtypes)
    row = ref.select([c for c in GEMM.input_cols if c in ref.columns])
    meas = float(ref["measured_us"][0])
    peak = hw0.tc_tflops(dtypes[0])
    now = hw0.cal("tc_efficiency")
    return {
        "gpu": gpu, "file": rel, "row": ref.row(0, named=True), "measured_us": meas,
        "tflops": float(ref["tflops"][0]), "peak_tflops": peak,
        "gross": float(ref["tflops"][0]) / peak, "shipped": now,
        "predicted_us_shipped": float(evaluate(row, hw0)["latency_us"][0]),
        "net": net_tc_efficiency(row, hw0, meas),
    }


def net_spread(gpu: str, min_us: float, tol: float = 1e-3) -> dict[str, np.ndarray]:
    """Per backend, the net ``tc_efficiency`` of every problem of ``gpu``'s file (:data:`TC_FILES`).

    Each problem (its tensor-core dtypes only) counts once, at its fastest
    measured configuration, when that takes ``min_us`` or more; NaN where no
    value in (0, 1] reaches it.
    """
    from tsbatch.measured.accuracy import GEMM, load_measured

    rel, dtypes = TC_FILES[gpu]
    root = os.environ.get("TSBATCH_SHARED_DATA", os.path.join("..", "shared", "data"))
    path = rel if rel.startswith("bench/") else os.path.join(root, rel)
    hw0 = get_hw(gpu)
    d = pl.concat(load_measured([path]).frames["gemm"], how="diagonal_relaxed")
    mine = [h for h in d["_hw"].unique().to_list() if get_hw(h).key == hw0.key]
    d = d.filter(pl.col("_hw").is_in(mine), pl.col("dtype").is_in(list(dtypes)))
    cols = [c for c in GEMM.input_cols if c in d.columns]
    out = {}
    for backend in sorted(d["backend"].unique().to_list()):
        x = (d.filter(pl.col("backend") == backend).sort("measured_us", maintain_order=True)
             .group_by(PROBLEM, maintain_order=True).first().filter(pl.col("measured_us") >= min_us))
        out[backend] = np.array([np.nan if (v := net_tc_efficiency(x[i].select(cols), hw0,
                                                                  float(x["measured_us"][i]), tol)) is None
                                 else v for i in range(x.height)])
    return out


#: the measured-data folders whose rows share a GPU's envelope constants (the
#: loop's ``mem_latency_us``, ``iter_overhead_cycles``, ``iter_sync_cycles``, ...):
#: every GEMM file (Triton of every dtype, its library rows, LLMCompass) and the
#: attention files (FlexAttention), read as ``tsbatch accuracy`` reads them
SHARED_DIRS = ("gemm", "attention")
#: group columns of ``--shared``: one group per measured file x dtype label x backend
SHARED_KEYS = ["set", "dtype", "backend"]


def load_shared(gpu: str, root: str | None = None) -> pl.DataFrame:
    """Every measured row of ``gpu`` in :data:`SHARED_DIRS`, median-aggregated by ``load_measured``.

    Columns: the families' input columns, ``measured_us``, ``_hw``, ``_problem``
    and ``_unit`` (unique over all files), ``family``, ``set`` (the file's stem)
    and ``label`` (the accuracy report's dtype label: ``tf32`` apart from IEEE
    ``float32``); ``backend`` is the family name for families without one.
    """
    from pathlib import Path

    from tsbatch.measured.accuracy import FAMILIES, _dtype_label, load_measured

    root = Path(root or os.environ.get("TSBATCH_SHARED_DATA", os.path.join("..", "shared", "data")))
    key = get_hw(gpu).key
    specs = {s.name: s for s in FAMILIES}
    parts, p0, u0 = [], 0, 0
    for sub in SHARED_DIRS:
        for f in sorted((root / sub).glob("*.parquet")):
            loaded = load_measured([f], families=("gemm", "attention"))
            for fam, frames in loaded.frames.items():
                spec = specs[fam]
                for fr in frames:
                    n_p, n_u = int(fr["_problem"].max()) + 1, int(fr["_unit"].max()) + 1
                    fr = fr.filter(pl.col("_hw") == key)
                    if fr.height:
                        fr = fr.with_columns(pl.col("_problem") + p0, pl.col("_unit") + u0,
                                             pl.lit(f.stem).alias("set"), pl.lit(fam).alias("family"),
                                             _dtype_label(spec).alias("label"))
                        if "backend" not in fr.columns:
                            fr = fr.with_columns(pl.lit(fam).alias("backend"))
                        parts.append(fr)
                    p0, u0 = p0 + n_p, u0 + n_u
    if not parts:
        raise ValueError(f"no measured row of {gpu} under {root}/{{{','.join(SHARED_DIRS)}}}")
    return pl.concat(parts, how="diagonal_relaxed")


def split_shared(d: pl.DataFrame, seed: int, problems: int) -> pl.DataFrame:
    """``d`` with ``half`` ('fit' / 'held') and ``searched``: the split of ``bench/cross_validate.py``.

    Within each stratum (GPU, set, dtype label) the problems are permuted with
    ``numpy.random.default_rng(seed)`` (strata in sorted order); the first half
    (rounded down) is the fit half, of which the first ``problems`` (0: all)
    are searched. All rows of a problem (every configuration and backend) go
    to one half.
    """
    from cross_validate import split  # bench/ is not a package; it imports this module

    return d.join(split(d, seed, problems), on="_problem")


def score_shared(d: pl.DataFrame, hw, by_bucket: bool = False) -> pl.DataFrame:
    """Per group (:data:`SHARED_KEYS`): the accuracy metrics and ``bias`` (median measured / predicted).

    Each family is predicted by its own ``tsbatch accuracy`` predictor path
    (:func:`evaluate` with the family) under ``hw``. ``by_bucket``: per group
    and time bucket of the regression guard (the problem's best measured time,
    ``tsbatch.measured.regress_metrics.BUCKETS``) instead.
    """
    from tsbatch.measured.regress_metrics import add_slices

    from tsbatch.measured.accuracy import FAMILIES
    from tsbatch.measured.metrics import accuracy_metrics

    specs = {s.name: s for s in FAMILIES}
    parts = []
    for (fam,), part in d.group_by(["family"], maintain_order=True):
        pred = evaluate(part.select(specs[fam].input_cols), hw, family=fam)
        lat = pred["latency_us"].cast(pl.Float64)
        feas = (pred["feasible"].cast(pl.Boolean).fill_null(False) if "feasible" in pred.columns
                else lat.is_finite())
        parts.append(part.with_columns(lat.alias("predicted_us"), feas.alias("feasible")))
    sc = pl.concat(parts, how="diagonal_relaxed").drop("dtype", strict=False).rename({"label": "dtype"})
    keys = SHARED_KEYS
    if by_bucket:
        sc, keys = add_slices(sc), [*SHARED_KEYS, "bucket"]
    m = accuracy_metrics(sc, keys)
    bias = (sc.filter(pl.col("feasible") & pl.col("predicted_us").is_finite())
            .group_by(keys).agg((pl.col("measured_us") / pl.col("predicted_us")).median().alias("bias")))
    return m.join(bias, on=keys, how="left").sort(keys)


#: a bucket slice enters the ``buckets`` objective with at least this many problems
#: (the regression guard's ``--min-problems``)
MIN_SLICE_PROBLEMS = 3


def shared_objective(m: pl.DataFrame) -> float:
    """The ``--shared`` objective: the mean MAPE over the rows of ``m`` (groups, or group x bucket
    slices of at least :data:`MIN_SLICE_PROBLEMS` problems), each weighing the same."""
    if "bucket" in m.columns:
        m = m.filter(pl.col("problems") >= MIN_SLICE_PROBLEMS)
    return float(m["mape_pct"].mean())


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


def _fmt_groups(m: pl.DataFrame, col: str, fmt: str) -> str:
    short = {"float16": "f16", "bfloat16": "bf16", "float32": "f32", "tf32": "tf32"}
    return " ".join(f"{r['set'].split('_')[1][:4]}/{short.get(r['dtype'], r['dtype'])}/{r['backend'][:3]} "
                    f"{format(r[col], fmt)}" for r in m.iter_rows(named=True))


def shared_main(gpu: str, axes: dict[str, list[float]], problems: int, seed: int, buckets: bool = False) -> int:
    """``--shared``: the grid on every family's fit problems, then the held-out half (see ``--help``)."""
    hw0 = get_hw(gpu)
    d = split_shared(load_shared(gpu), seed, problems)
    fit = d.filter((pl.col("half") == "fit") & pl.col("searched"))
    held = d.filter(pl.col("half") == "held")
    print(f"{gpu}: {fit['_problem'].n_unique()} fit problems ({fit.height} rows) searched, "
          f"{held['_problem'].n_unique()} held-out ({held.height} rows); seed {seed}; objective: mean MAPE "
          "over file x dtype x backend groups" + (" x time buckets (>= 3 problems)" if buckets else ""), flush=True)
    best = None
    for values, hw in grid_points(axes, hw0):
        m = score_shared(fit, hw)
        obj = shared_objective(score_shared(fit, hw, by_bucket=True) if buckets else m)
        # ties keep the point nearest the shipped values (relative distance)
        dist = sum(abs(v - hw0.calibration.get(k, CALIBRATION_DEFAULTS[k][0]))
                   / max(abs(hw0.calibration.get(k, CALIBRATION_DEFAULTS[k][0])), 1e-9) for k, v in values.items())
        if best is None or obj < best[0] - 1e-9 or (abs(obj - best[0]) <= 1e-9 and dist < best[1]):
            best = (obj, dist, values, hw)
        label = " ".join(f"{k}={v:g}" for k, v in values.items())
        print(f"{label:50s} objective {obj:7.3f} | {_fmt_groups(m, 'mape_pct', '.2f')}", flush=True)
    obj, _, values, hw = best
    print("best: " + " ".join(f"{k}={v:g}" for k, v in values.items()) + f" (objective {obj:.3f} on the fit problems)")
    ms, mb = score_shared(held, hw0), score_shared(held, hw)
    print(f"held-out half: objective shipped {shared_objective(ms):.3f}, best {shared_objective(mb):.3f} (groups); "
          f"{shared_objective(score_shared(held, hw0, True)):.3f}, {shared_objective(score_shared(held, hw, True)):.3f}"
          " (group x bucket slices)")
    t = ms.select(*SHARED_KEYS, "problems", *[pl.col(c).alias(f"ship_{c}") for c in
                                              ("mape_pct", "bias", "spearman", "top5_retention_pct")]).join(
        mb.select(*SHARED_KEYS, *[pl.col(c).alias(f"best_{c}") for c in
                                  ("mape_pct", "bias", "spearman", "top5_retention_pct")]), on=SHARED_KEYS)
    with pl.Config(tbl_rows=100, tbl_cols=20, tbl_width_chars=250, float_precision=3):
        print(t)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("gpu")
    ap.add_argument("grid", nargs="*", help="NAME=v1,v2,... (a named calibration constant)")
    ap.add_argument("--problems", type=int, default=80)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rows", choices=sorted(ROWS), default="half",
                    help="the Triton rows scored: fp16/bf16 (default), IEEE FP32 or TF32")
    ap.add_argument("--shared", action="store_true",
                    help="score every family that shares the constants (all GEMM files, FlexAttention): fit "
                         "on --problems problems per stratum of the fit half of bench/cross_validate.py's "
                         "split (--seed), objective the mean MAPE over file x dtype x backend groups, then "
                         "the held-out half with the best and the shipped values")
    ap.add_argument("--objective", choices=("groups", "buckets"), default="groups",
                    help="with --shared: mean MAPE over the groups (default), or over group x time bucket "
                         "slices of at least 3 problems (the regression guard's buckets)")
    ap.add_argument("--tc-net", action="store_true",
                    help="derive tc_efficiency net of the model's step costs on the GPU's reference row")
    ap.add_argument("--spread", type=float, metavar="MIN_US",
                    help="with --tc-net: the net value of every problem measured at MIN_US or more")
    args = ap.parse_args(argv)
    if args.tc_net:
        if args.gpu not in TC_FILES:
            ap.error(f"--tc-net knows {', '.join(TC_FILES)}, not '{args.gpu}'")
        r = tc_net(args.gpu)
        row = r["row"]
        print(f"{args.gpu}: reference row {row['m']}x{row['n']}x{row['k']} {row['dtype']} {row['backend']} "
              f"(A {'row' if row['a_row_major'] else 'col'}, B {'row' if row['b_row_major'] else 'col'}) of "
              f"{r['file']}: {r['measured_us']:.1f} us measured = {r['tflops']:.1f} TFLOPS")
        print(f"  gross {r['gross']:.4f} (/ {r['peak_tflops']:.1f} TFLOPS measured peak); shipped "
              f"{r['shipped']:g} predicts it in {r['predicted_us_shipped']:.1f} us")
        print("  net   " + ("none in (0, 1]: the model predicts the row slower than measured at 1.0"
                            if r["net"] is None else f"{r['net']:.4f}"))
        if args.spread is not None:
            for backend, v in net_spread(args.gpu, args.spread).items():
                ok = v[np.isfinite(v)]
                q = " ".join(f"{x:.3f}" for x in np.percentile(ok, [10, 25, 50, 75, 90])) if ok.size else "-"
                print(f"  {backend:7s} {v.size:4d} problems >= {args.spread:g} us: net p10/p25/median/p75/p90 "
                      f"{q}, max {ok.max() if ok.size else float('nan'):.3f}; none in (0, 1]: "
                      f"{int((~np.isfinite(v)).sum())}")
        return 0
    if not args.grid:
        ap.error("give NAME=v1,v2,... or --tc-net")
    axes = {}
    for item in args.grid:
        name, _, vals = item.partition("=")
        if name not in CALIBRATION_DEFAULTS:
            ap.error(f"'{name}' is not a calibration constant; known: {', '.join(CALIBRATION_DEFAULTS)}")
        axes[name] = [float(v) for v in vals.split(",") if v]
    if args.shared:
        return shared_main(args.gpu, axes, args.problems, args.seed, args.objective == "buckets")
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
