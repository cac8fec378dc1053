"""Cross-validated GEMM accuracy: fit the calibration constants on half the problems, score the other half.

    python bench/cross_validate.py [--seed 0] [--fit-problems 100] [--objective groups]
                                   [--gpu a100 ...] [--json out.json] [--markdown]
    python bench/cross_validate.py --report-only [--json out.json] [--markdown]
    python bench/cross_validate.py --error-sources

Issue 21 asks for every GEMM accuracy target twice: as ``tsbatch accuracy``
reports it on the development set (``../shared/data/gemm/``, override the
folder with ``TSBATCH_SHARED_DATA``) and cross-validated, so that tuning the
few named calibration constants to that set cannot flatter the figures.

Data. Every GEMM file of ``gemm/`` (``*_triton_mm``: Inductor's Triton
configurations plus the cuBLAS row of each problem; ``a100_llmcompass_matmul``:
LLMCompass's A100 cuBLAS times; ``pipeweave_fp8_gemm_train``: H800 and H20 FP8
library GEMMs), read and median-aggregated by :func:`tsbatch.measured.accuracy.load_measured`
exactly as ``tsbatch accuracy`` does. A group is gpu x dtype x backend x set
(``set`` = the file's stem, so LLMCompass is reported apart from the cuBLAS
rows of the Triton file); float32 is split by the ``tf32`` column into
``float32`` (IEEE FP32) and ``tf32``, as in the accuracy report. Metrics are
:func:`tsbatch.measured.metrics.accuracy_metrics` (MAPE, Spearman within a problem's
configurations, top-5 % retention, ...), on each group as a whole and on its
problems with m*n*k <= 2*10^10 alone (``SMALL_MNK``).

Split. A problem is one (gpu, file, m, n, k, dtype, layout, tf32); all its
rows (every Triton configuration and the cuBLAS row) go to the same half.
Within each stratum (gpu, set, dtype label) the problems are permuted with
``numpy.random.default_rng(seed)`` (strata in sorted order) and the first
half (rounded down) is the *fit* half, the rest the *held-out* half. The grid
search sees at most ``--fit-problems`` problems per stratum (the first of the
permuted fit half; 0 = all of it), which keeps the run affordable.

Fit. For each GPU, the constants its hardware file declares in
``[calibration]`` (``HwSpec.calibration``) are searched jointly over a small
grid centred on the shipped value (:func:`grid_axes`): shipped value - step,
shipped, + step, clipped to the constant's range (efficiencies and fractions
at most 1, times and cycle counts at least 0). Steps (``STEPS``):
efficiencies and ``l2_capacity_fraction`` 0.05; ``launch_overhead_us``
0.5 us; ``mem_latency_us`` 0.1 us; cycle counts one third of the shipped
value (60 -> 40, 60, 80; at least 10 cycles). ``wgmma_min_warps`` (a warp
count, not a rate) is never searched. Every combination is scored with
:func:`bench.calibrate_constants.grid_points` on the fit problems; the
objective (``--objective``) is ``groups``: the mean MAPE over that GPU's
groups, each group weighing the same (default), ``half-triton``: the mean MAPE
over its fp16/bf16 Triton groups (the objective the shipped values were set
with; GPUs without such groups fall back to ``groups``), or ``rows``: the MAPE
of all its fit rows pooled. Ties keep the combination nearest the shipped
values (it is tried first). Nothing else is fitted; no model code changes.

Printed per group: in-sample (the fit problems the search saw, fitted
constants), held-out half with the fitted constants, held-out half with the
shipped constants, for the whole group and for its small problems; and per
GPU which constants moved from the shipped values.

``--report-only`` runs no fit: :func:`tsbatch.measured.accuracy.run_accuracy` on each
file (the ``tsbatch accuracy`` code path, shipped constants) and prints the
issue's table (every group, whole set and m*n*k <= 2*10^10 subset, against
the targets), which the accuracy command cannot split by problem size.

``--error-sources`` prints, for every group of at least 20 rows, the median
measured / predicted ratio and the MAPE by layout, problem size, measured time
and, for Triton, num_warps, block shape, block_k, num_stages and block shape x
warps (bins of at least 10 rows), as leads for the model work.

Cost (this 2-core machine, shared with other jobs at a load average of 7 to 9):
``--fit-problems 200`` (seed 0, 3 values per constant: 729 combinations on
A100, H100 and H800, 243 on H20; the run docs/gemm_accuracy.md reports) took
28 minutes of wall time, 13 of CPU: A100 20 minutes (700 fit problems,
18,852 rows, 1.6 s a combination), H100 7 (161 problems, all of its fit
half), H800 and H20 under a minute each. The default, 100, took 11.7 minutes
(10 of CPU) at a load average of about 6: A100 8 minutes (400 problems,
10,506 rows), H100 3, and found the same fitted values on every GPU as 200
did. ``--report-only`` and ``--error-sources`` take 10 to 20 s once
the numba kernels are compiled (a fresh checkout compiles them first, about
a minute).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from calibrate_constants import grid_points  # noqa: E402  (bench/ is not a package)

from tsbatch.measured.accuracy import GEMM, _dtype_label, _predict, format_table, load_measured, run_accuracy  # noqa: E402
from tsbatch.engine.evaluate import evaluate  # noqa: E402
from tsbatch.hw import get_hw  # noqa: E402
from tsbatch.measured.metrics import accuracy_metrics  # noqa: E402

#: problems with m*n*k at most this are the issue's "small and medium" subset
SMALL_MNK = 2e10

#: group columns of every table: the accuracy report's plus the measured file
KEYS = ["gpu", "dtype", "backend", "set"]

#: search step of each constant and its allowed range (see the module docstring);
#: ``"rel"`` steps are a fraction of the shipped value with a floor
STEPS: dict[str, tuple[str, float, float, float]] = {
    # name: (kind, step, low, high)
    "tc_efficiency": ("abs", 0.05, 0.05, 1.0),
    "l2_efficiency": ("abs", 0.05, 0.05, 1.0),
    "dram_efficiency": ("abs", 0.05, 0.05, 1.0),
    "wgmma_share_efficiency": ("abs", 0.05, 0.05, 1.0),
    "l2_capacity_fraction": ("abs", 0.05, 0.05, 1.0),
    "launch_overhead_us": ("abs", 0.5, 0.0, math.inf),
    "mem_latency_us": ("abs", 0.1, 0.0, math.inf),
    "iter_overhead_cycles": ("rel", 1 / 3, 0.0, math.inf),
    "iter_sync_cycles": ("rel", 1 / 3, 0.0, math.inf),
    "tile_overhead_cycles": ("rel", 1 / 3, 0.0, math.inf),
}
#: floor of a relative step (cycles)
MIN_CYCLE_STEP = 10.0
#: declared constants that are never searched
FIXED = ("wgmma_min_warps",)

#: the issue's targets: (backend, dtype labels, set substring) -> metric bounds
TARGETS = [
    ("triton", ("float16", "bfloat16"), "triton_mm", {"mape_pct": 12, "spearman": 0.90, "top5_retention_pct": 99}),
    ("triton", ("float32", "tf32"), "triton_mm", {"mape_pct": 15, "spearman": 0.85, "top5_retention_pct": 98}),
    ("cublas", None, "llmcompass", {"mape_pct": 10}),
    ("cublas", None, "", {"mape_pct": 8}),
]
SHOWN = ("mape_pct", "spearman", "top5_retention_pct")
SHORT = {"mape_pct": "mape", "spearman": "rho", "top5_retention_pct": "top5"}


def data_root() -> Path:
    return Path(os.environ.get("TSBATCH_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))


def gemm_files(root: Path) -> list[Path]:
    files = sorted((root / "gemm").glob("*.parquet"))
    if not files:
        raise SystemExit(f"no GEMM files under {root / 'gemm'}")
    return files


def target_of(backend: str, dtype: str, set_: str) -> dict:
    for b, dtypes, sub, bounds in TARGETS:
        if b == backend and (dtypes is None or dtype in dtypes) and sub in set_:
            return bounds
    return {}


def meets(row: dict, bounds: dict, prefix: str = "") -> str:
    """'yes' / 'no' against the group's targets ('-' where it has none)."""
    if not bounds:
        return "-"
    ok = True
    for metric, bound in bounds.items():
        v = row.get(prefix + metric)
        if v is None or (isinstance(v, float) and math.isnan(v)):
            continue
        ok &= (v <= bound) if metric == "mape_pct" else (v >= bound)
    return "yes" if ok else "no"


# ----------------------------------------------------------------------
# loading and scoring
# ----------------------------------------------------------------------
def load_all(files: list[Path]) -> pl.DataFrame:
    """Every file through load_measured, problem/unit ids made unique, ``set`` = file stem."""
    parts, p0, u0 = [], 0, 0
    for f in files:
        loaded = load_measured([f])
        for fr in loaded.frames.get("gemm", []):
            fr = fr.with_columns(pl.col("_problem") + p0, pl.col("_unit") + u0, pl.lit(f.stem).alias("set"))
            p0, u0 = int(fr["_problem"].max()) + 1, int(fr["_unit"].max()) + 1
            parts.append(fr)
    d = pl.concat(parts, how="vertical_relaxed")
    return d.with_columns(_dtype_label(GEMM).alias("label"))


def score(frame: pl.DataFrame, specs: dict) -> pl.DataFrame:
    """The accuracy report's scored frame (group labels, measured_us, predicted_us, feasible)."""
    scored = _predict(frame, GEMM, lambda part, key: evaluate(part, specs[key]))
    return scored.with_columns(pl.col("_hw").alias("gpu"), pl.lit("gemm").alias("family"),
                               pl.col("label").alias("dtype"))


def metrics(scored: pl.DataFrame) -> dict[str, pl.DataFrame]:
    small = scored.filter(pl.col("m").cast(pl.Float64) * pl.col("n") * pl.col("k") <= SMALL_MNK)
    return {"all": accuracy_metrics(scored, KEYS), "small": accuracy_metrics(small, KEYS)}


def split(d: pl.DataFrame, seed: int, fit_problems: int) -> pl.DataFrame:
    """Problem table with ``half`` ('fit' or 'held') and ``searched`` (in the fit subsample)."""
    probs = d.select("_hw", "set", "label", "_problem").unique().sort("_hw", "set", "label", "_problem")
    rng = np.random.default_rng(seed)
    out = []
    for _, g in probs.group_by(["_hw", "set", "label"], maintain_order=True):
        ids = g["_problem"].to_numpy()[rng.permutation(g.height)]
        nfit = len(ids) // 2
        cap = nfit if fit_problems <= 0 else min(fit_problems, nfit)
        out.append(pl.DataFrame({"_problem": ids, "half": ["fit"] * nfit + ["held"] * (len(ids) - nfit),
                                 "searched": [i < cap for i in range(len(ids))]}))
    return pl.concat(out)


def grid_axes(hw) -> dict[str, list[float]]:
    axes = {}
    for name, value in hw.calibration.items():
        if name in FIXED or name not in STEPS:
            continue
        kind, step, lo, hi = STEPS[name]
        if kind == "rel":
            step = max(value * step, MIN_CYCLE_STEP)
        vals = [value] + [min(max(value + s, lo), hi) for s in (-step, step)]
        uniq = []
        for v in vals:  # the shipped value first: ties keep it
            v = round(v, 6)
            if v not in uniq:
                uniq.append(v)
        axes[name] = uniq
    return axes


def objective(m: pl.DataFrame, kind: str, rows_scored: pl.DataFrame | None = None) -> float:
    if kind == "rows":
        return float(accuracy_metrics(rows_scored, ())["mape_pct"][0])
    if kind == "half-triton":
        sub = m.filter((pl.col("backend") == "triton") & pl.col("dtype").is_in(["float16", "bfloat16"]))
        if sub.height:
            m = sub
    return float(m["mape_pct"].mean())


# ----------------------------------------------------------------------
# modes
# ----------------------------------------------------------------------
def report_only(files: list[Path]) -> dict:
    parts, p0, u0 = [], 0, 0
    for f in files:
        r = run_accuracy([f])
        s = r.scored.with_columns(pl.col("_problem") + p0, pl.col("_unit") + u0, pl.lit(f.stem).alias("set"))
        p0, u0 = int(s["_problem"].max()) + 1, int(s["_unit"].max()) + 1
        parts.append(s)
    scored = pl.concat(parts, how="diagonal_relaxed")
    return metrics(scored)


def table_report(ms: dict[str, pl.DataFrame]) -> pl.DataFrame:
    """One row per group: whole set and small subset side by side, with the target and whether it holds."""
    rows = []
    small = {tuple(r[k] for k in KEYS): r for r in ms["small"].iter_rows(named=True)}
    for r in ms["all"].iter_rows(named=True):
        key = tuple(r[k] for k in KEYS)
        s = small.get(key, {})
        bounds = target_of(r["backend"], r["dtype"], r["set"])
        row = {k: r[k] for k in KEYS}
        row["problems"] = r["problems"]
        row.update({SHORT[m]: r[m] for m in SHOWN})
        row["meets"] = meets(r, bounds)
        row["small_problems"] = s.get("problems", 0)
        row.update({"small_" + SHORT[m]: s.get(m) for m in SHOWN})
        row["small_meets"] = meets(s, bounds) if s else "-"
        row["target"] = ", ".join(f"{SHORT[m]} {'<=' if m == 'mape_pct' else '>='} {v:g}" for m, v in bounds.items())
        rows.append(row)
    return pl.DataFrame(rows)


def cross_validate(files: list[Path], seed: int, fit_problems: int, kind: str, gpus: list[str] | None) -> dict:
    d = load_all(files)
    halves = split(d, seed, fit_problems)
    d = d.join(halves, on="_problem")
    keys = sorted(d["_hw"].unique().to_list())
    if gpus:
        want = {get_hw(g).key for g in gpus}
        keys = [k for k in keys if k in want]
    fitted, moved, tables, timing = {}, {}, {}, {}
    shipped = {k: get_hw(k) for k in keys}
    best_specs = {}
    for key in keys:
        t0 = time.perf_counter()
        hw0 = shipped[key]
        fit = d.filter((pl.col("_hw") == key) & (pl.col("half") == "fit") & pl.col("searched"))
        axes = grid_axes(hw0)
        n_comb = int(np.prod([len(v) for v in axes.values()])) if axes else 1
        print(f"{key}: {fit['_problem'].n_unique()} fit problems ({fit.height} rows), "
              f"{n_comb} combinations of {', '.join(f'{a}={v}' for a, v in axes.items())}", flush=True)
        best = (math.inf, {}, hw0)
        for i, (values, hw) in enumerate(grid_points(axes, hw0)):
            sc = score(fit, {key: hw})
            obj = objective(accuracy_metrics(sc, KEYS), kind, sc)
            if obj < best[0] - 1e-9:
                best = (obj, values, hw)
            if (i + 1) % 100 == 0:
                print(f"  {i + 1}/{n_comb} ({time.perf_counter() - t0:.0f} s), best so far {best[0]:.3f}: "
                      + " ".join(f"{a}={v:g}" for a, v in best[1].items()), flush=True)
        obj0 = objective(accuracy_metrics(s0 := score(fit, {key: hw0}), KEYS), kind, s0)
        best_specs[key] = best[2]
        fitted[key] = {"objective": kind, "shipped_objective": obj0, "fitted_objective": best[0],
                       "values": best[1], "grid": axes, "combinations": n_comb}
        moved[key] = {a: {"shipped": hw0.calibration[a], "fitted": v} for a, v in best[1].items()
                      if abs(v - hw0.calibration[a]) > 1e-9}
        timing[key] = time.perf_counter() - t0
        print(f"{key}: objective {obj0:.3f} (shipped) -> {best[0]:.3f} (fitted) in {timing[key]:.0f} s; moved: "
              + (", ".join(f"{a} {m['shipped']:g} -> {m['fitted']:g}" for a, m in moved[key].items()) or "none"),
              flush=True)
    sub = d.filter(pl.col("_hw").is_in(keys))
    scored_in = score(sub.filter((pl.col("half") == "fit") & pl.col("searched")), best_specs)
    held = sub.filter(pl.col("half") == "held")
    scored_ho = score(held, best_specs)
    scored_ship = score(held, shipped)
    for name, sc in (("in_sample", scored_in), ("held_out_fitted", scored_ho), ("held_out_shipped", scored_ship)):
        tables[name] = metrics(sc)
    return {"fitted": fitted, "moved": moved, "tables": tables, "seconds": timing}


def table_cv(tables: dict, subset: str) -> pl.DataFrame:
    cols = {"in_sample": "in", "held_out_fitted": "ho", "held_out_shipped": "ship"}
    merged = None
    for name, short in cols.items():
        t = tables[name][subset].select(*KEYS, pl.col("problems").alias(f"{short}_n"),
                                        *[pl.col(m).alias(f"{short}_{SHORT[m]}") for m in SHOWN])
        merged = t if merged is None else merged.join(t, on=KEYS, how="full", coalesce=True)
    merged = merged.sort(KEYS)
    flags = []
    for r in merged.iter_rows(named=True):
        b = target_of(r["backend"], r["dtype"], r["set"])
        flags.append(meets({m: r.get(f"ho_{SHORT[m]}") for m in SHOWN}, b))
    return merged.with_columns(pl.Series("ho_meets", flags))


def error_sources(files: list[Path]) -> None:
    d = load_all(files)
    sc = score(d, {k: get_hw(k) for k in d["_hw"].unique().to_list()})
    sc = sc.filter(pl.col("feasible") & pl.col("predicted_us").is_finite()).with_columns(
        ratio=pl.col("measured_us") / pl.col("predicted_us"),
        ape=100.0 * (pl.col("predicted_us") - pl.col("measured_us")).abs() / pl.col("measured_us"),
        layout=pl.concat_str([pl.when(pl.col("a_row_major")).then(pl.lit("A:row")).otherwise(pl.lit("A:col")),
                              pl.when(pl.col("b_row_major")).then(pl.lit("B:row")).otherwise(pl.lit("B:col"))],
                             separator=" "),
        block=pl.concat_str([pl.col("block_m"), pl.col("block_n")], separator="x"),
        block_warps=pl.concat_str([pl.col("block_m"), pl.lit("x"), pl.col("block_n"), pl.lit(" w"),
                                   pl.col("num_warps")]),
        size=pl.when(pl.col("m").cast(pl.Float64) * pl.col("n") * pl.col("k") <= SMALL_MNK)
        .then(pl.lit("mnk<=2e10")).otherwise(pl.lit("mnk>2e10")),
        meas_time=pl.when(pl.col("measured_us") < 20).then(pl.lit("<20us"))
        .when(pl.col("measured_us") < 200).then(pl.lit("20-200us")).otherwise(pl.lit(">=200us")),
    )
    pl.Config.set_tbl_rows(60)
    for (gpu, dtype, backend, set_), g in sc.group_by(KEYS, maintain_order=True):
        if g.height < 20:
            continue
        print(f"\n=== {gpu} {dtype} {backend} {set_}: {g.height} rows, median measured/predicted "
              f"{g['ratio'].median():.3f} (5th {g['ratio'].quantile(0.05):.2f}, 95th {g['ratio'].quantile(0.95):.2f}),"
              f" MAPE {g['ape'].mean():.1f}")
        bys = ["layout", "size", "meas_time"]
        if backend == "triton":
            bys += ["num_warps", "block", "block_k", "num_stages", "block_warps"]
        for by in bys:
            t = (g.group_by(by).agg(pl.len().alias("rows"), pl.col("ratio").median().alias("meas/pred"),
                                    pl.col("ratio").quantile(0.9).alias("p90 meas/pred"),
                                    pl.col("ape").mean().alias("mape"))
                 .filter(pl.col("rows") >= 10).sort(by))
            print(f"-- by {by}")
            print(format_table(t))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0, help="seed of the problem split (default 0)")
    ap.add_argument("--fit-problems", type=int, default=100,
                    help="problems per stratum the grid search sees, of the fit half (0: all; default 100)")
    ap.add_argument("--objective", choices=("groups", "half-triton", "rows"), default="groups")
    ap.add_argument("--gpu", action="append", help="only this GPU (repeatable)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--report-only", action="store_true", help="no fit: the issue's table, shipped constants")
    mode.add_argument("--error-sources", action="store_true", help="measured/predicted ratios by configuration")
    ap.add_argument("--json", type=Path, help="write the tables and fitted values as JSON")
    ap.add_argument("--markdown", action="store_true", help="print the tables as Markdown")
    args = ap.parse_args(argv)
    files = gemm_files(data_root())
    t0 = time.perf_counter()
    if args.error_sources:
        error_sources(files)
        print(f"\n{time.perf_counter() - t0:.0f} s")
        return 0
    if args.report_only:
        ms = report_only(files)
        t = table_report(ms)
        print(f"issue 21 table, shipped constants ({len(files)} files; small = m*n*k <= {SMALL_MNK:g})")
        print(format_table(t, markdown=args.markdown))
        print(f"\n{time.perf_counter() - t0:.0f} s")
        if args.json:
            args.json.write_text(json.dumps({k: v.to_dicts() for k, v in ms.items()}, indent=1, default=str))
        return 0
    res = cross_validate(files, args.seed, args.fit_problems, args.objective, args.gpu)
    for subset, title in (("all", "whole groups"), ("small", f"problems with m*n*k <= {SMALL_MNK:g}")):
        print(f"\ncross-validated, {title} (seed {args.seed}, objective {args.objective}, fit problems "
              f"per stratum {args.fit_problems or 'all'}): in = fit problems the search saw, fitted constants; "
              "ho = held-out half, fitted; ship = held-out half, shipped; ho_meets: held-out fitted vs the targets")
        print(format_table(table_cv(res["tables"], subset), markdown=args.markdown))
    print("\nconstants that moved from the shipped values:")
    for key, mv in res["moved"].items():
        f = res["fitted"][key]
        print(f"  {key}: " + (", ".join(f"{a} {m['shipped']:g} -> {m['fitted']:g}" for a, m in mv.items()) or "none")
              + f"  (objective {f['shipped_objective']:.3f} -> {f['fitted_objective']:.3f} on the fit problems)")
    print(f"\n{time.perf_counter() - t0:.0f} s")
    if args.json:
        out = {"seed": args.seed, "fit_problems": args.fit_problems, "objective": args.objective,
               "fitted": res["fitted"], "moved": res["moved"], "seconds": res["seconds"],
               "tables": {n: {s: t.to_dicts() for s, t in v.items()} for n, v in res["tables"].items()}}
        args.json.write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
