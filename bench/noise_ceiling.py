"""How well the measured data agree with themselves: the ceiling of every accuracy figure.

    python bench/noise_ceiling.py [FILE ...] [--scored SCORED.parquet] [--min-problems 3]
                                  [--json OUT.json]

The AutoHeuristic files of ``../shared/data`` (``gemm/*_triton_mm.parquet``,
``attention/a100_flexattention.parquet``) hold every (problem, configuration)
measured 3-4 times, and the accuracy figures score the model against their
median. This splits the repeats of each configuration into two independent
halves (the 1st, 3rd, ... and the 2nd, 4th, ... in file order:
``load_measured(repeats="even" | "odd")``) and scores one half against the other
with the guard's metrics, per GPU x dtype x backend and per time bucket (the
problem's best time in the odd half, ``regress_metrics.BUCKETS``):

* ``MAPE`` and ``meas/pred`` of half against half: the run-to-run noise of one
  half's median (no model can be scored below it on a half; against the full
  median, which averages twice the repeats, the floor is lower by about 1/sqrt 2);
* ``Spearman`` and ``top-5``: how far the measurements' own ranking of a problem's
  configurations is reproducible. A perfect model, scored against the full
  median, would read about sqrt(2 r / (1 + r)) where half against half reads r
  (the Spearman-Brown step from a half to the whole, taken as a rough guide: the
  ranks of a few configurations per problem are not a normal variable).

Configurations measured once are left out (no second half). ``--scored`` takes
``bench/regress.py --keep-predictions``'s ``scored_new.parquet`` (or
``scored_ref.parquet``) and prints the model's figures on the same groups beside
(against the full median, as the guard scores them). Files with no repeats
(LLMCompass, PipeWeave, the ``bench/measured`` sets) have nothing to split and
are reported as such.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import polars as pl

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tsbatch.errors import InputError  # noqa: E402
from tsbatch.measured.accuracy import FAMILIES as DATA_FAMILIES  # noqa: E402
from tsbatch.measured.accuracy import _dtype_label, load_measured  # noqa: E402
from tsbatch.measured.metrics import accuracy_metrics  # noqa: E402
from tsbatch.measured.regress_metrics import add_slices  # noqa: E402

#: the files with repeated measurements (relative to ../shared/data)
DEFAULT_FILES = ("gemm/a100_triton_mm.parquet", "gemm/h100_triton_mm.parquet",
                 "attention/a100_flexattention.parquet")
FIGURES = ("mape_pct", "bias", "spearman", "top5_retention_pct")
GROUP = ("gpu", "dtype", "backend")


def data_root() -> Path:
    return REPO.parent / "shared" / "data"


def halves(path: Path) -> pl.DataFrame | None:
    """The configurations of ``path`` measured at least twice: ``predicted_us`` the
    even half's median, ``measured_us`` the odd half's, with the groups' and the
    slices' columns; None when no configuration of the file has two repeats."""
    fams = tuple(s.name for s in DATA_FAMILIES)
    even = load_measured([path], families=fams, repeats="even")
    odd = load_measured([path], families=fams, repeats="odd")
    parts = []
    for fam, frames in odd.frames.items():
        b = pl.concat(frames, how="diagonal_relaxed")
        a = pl.concat(even.frames[fam], how="diagonal_relaxed")
        spec = next(s for s in DATA_FAMILIES if s.name == fam)
        ident = ["_hw", *spec.problem_cols, *spec.config_cols]
        j = b.join(a.select(*ident, pl.col("measured_us").alias("predicted_us")), on=ident,
                   how="inner", nulls_equal=True)
        if j.height == 0:
            continue
        parts.append(j.with_columns(
            _dtype_label(spec), gpu=pl.col("_hw"), family=pl.lit(fam),
            backend=pl.col("backend") if "backend" in j.columns else pl.lit(fam),
            feasible=pl.lit(True)))
    if not parts:
        return None
    return add_slices(pl.concat(parts, how="diagonal_relaxed"))


def figures(scored: pl.DataFrame, min_problems: int) -> pl.DataFrame:
    """The guard's figures per group, whole and per time bucket (groups of fewer than
    ``min_problems`` problems left out)."""
    rows = []
    for by, slice_col in ((list(GROUP), None), ([*GROUP, "bucket"], "bucket")):
        m = accuracy_metrics(scored, by=by)
        bias = scored.filter(pl.col("feasible")).group_by(by).agg(
            bias=(pl.col("measured_us") / pl.col("predicted_us")).median())
        m = m.join(bias, on=by, how="left")
        m = m.with_columns(slice=pl.col(slice_col) if slice_col else pl.lit("all"))
        rows.append(m.select(*GROUP, "slice", "rows", "problems", *FIGURES))
    out = pl.concat(rows, how="vertical_relaxed").filter(pl.col("problems") >= min_problems)
    order = {"all": 0, "<20us": 1, "20-100us": 2, "0.1-1ms": 3, ">1ms": 4}
    return out.with_columns(_o=pl.col("slice").replace_strict(order, default=9)).sort(
        *GROUP, "_o").drop("_o")


def ceiling(r):
    """A perfect model's Spearman against the full median, from the halves' ``r``."""
    if r is None or not math.isfinite(r) or r <= 0:
        return None
    return math.sqrt(2 * r / (1 + r))


def model_figures(path: Path, min_problems: int) -> pl.DataFrame:
    s = pl.read_parquet(path)
    need = {"measured_us", "predicted_us", "feasible", "_problem", "_unit", *GROUP, "bucket"}
    missing = need - set(s.columns)
    if missing:
        raise InputError(f"{path}: not a scored file of bench/regress.py --keep-predictions "
                         f"(missing {', '.join(sorted(missing))})")
    return figures(s, min_problems)


def _f(v, nd=2) -> str:
    return "n/a" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.{nd}f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="*", type=Path, metavar="FILE",
                    help="measured files (default: the three AutoHeuristic files of ../shared/data)")
    ap.add_argument("--scored", type=Path, metavar="SCORED.parquet",
                    help="bench/regress.py --keep-predictions' scored_new.parquet: the model's figures beside")
    ap.add_argument("--min-problems", type=int, default=3,
                    help="groups of fewer problems are left out (default %(default)s)")
    ap.add_argument("--json", type=Path, metavar="OUT.json", help="write every figure as JSON")
    args = ap.parse_args(argv)
    files = args.files or [data_root() / f for f in DEFAULT_FILES]
    try:
        for f in files:
            if not f.exists():
                raise InputError(f"{f}: no such file")
        parts, none = [], []
        for f in files:
            h = halves(f)
            if h is None:
                none.append(str(f))
            else:
                parts.append(h)
        model = model_figures(args.scored, args.min_problems) if args.scored else None
    except InputError as exc:
        print(f"noise_ceiling.py: {exc}", file=sys.stderr)
        return 2
    for f in none:
        print(f"{f}: no configuration measured twice, nothing to split")
    if not parts:
        return 0
    fig = figures(pl.concat(parts, how="diagonal_relaxed"), args.min_problems)
    if model is not None:
        fig = fig.join(model.select(*GROUP, "slice", *[pl.col(c).alias("model_" + c) for c in FIGURES]),
                       on=[*GROUP, "slice"], how="left")
    print("half against half (even repeats as 'predicted', odd as 'measured'); "
          "Spearman ceiling = sqrt(2r / (1 + r))" + ("; model: --scored, against the full median" if model is not None else ""))
    head = f"{'gpu':9} {'dtype':9} {'backend':9} {'slice':9} {'rows':>6} {'probs':>5}  {'MAPE':>6} {'m/p':>6} {'Spearman':>8} {'ceiling':>7} {'top-5':>6}"
    if model is not None:
        head += f"  | model: {'MAPE':>6} {'m/p':>6} {'Spearman':>8} {'top-5':>6}"
    print(head)
    out = []
    for r in fig.to_dicts():
        c = ceiling(r["spearman"])
        line = (f"{r['gpu']:9} {r['dtype']:9} {r['backend']:9} {r['slice']:9} {r['rows']:>6} {r['problems']:>5}  "
                f"{_f(r['mape_pct']):>6} {_f(r['bias'], 3):>6} {_f(r['spearman'], 3):>8} {_f(c, 3):>7} "
                f"{_f(r['top5_retention_pct']):>6}")
        if model is not None:
            line += (f"  |        {_f(r.get('model_mape_pct')):>6} {_f(r.get('model_bias'), 3):>6} "
                     f"{_f(r.get('model_spearman'), 3):>8} {_f(r.get('model_top5_retention_pct')):>6}")
        print(line)
        out.append({**r, "spearman_ceiling": c})
    if args.json:
        args.json.write_text(json.dumps({"files": [str(f) for f in files], "no_repeats": none,
                                         "figures": out}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
