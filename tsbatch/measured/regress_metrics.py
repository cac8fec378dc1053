"""Regression guard: figures of two model versions side by side, and what got worse.

The pure part of ``bench/regress.py`` (no subprocess, no model call): given
two *scored* frames of the same measured rows (one per version, in the
format of :mod:`tsbatch.measured.metrics`: ``_problem``, ``_unit``, ``measured_us``,
``predicted_us``, ``feasible`` and the group columns), compute the accuracy
figures per group, per time bucket and per operand layout
(:func:`accuracy_figures`), join the two versions' figures
(:func:`compare_figures`), judge every pair against a tolerance
(:class:`Tolerance`, :func:`judge`), and write the summary block
(:func:`summary_lines`).

Definitions
-----------
``mape_pct``, ``spearman``, ``top5_retention_pct``
    exactly :func:`tsbatch.measured.metrics.accuracy_metrics` (the code of
    ``tsbatch accuracy``), on the rows of the slice.
``bias``
    median of ``measured_us / predicted_us`` over the slice's feasible rows
    with a finite positive prediction (above 1: the model predicts too fast).
    Judged by ``|bias - 1|``.
time bucket
    by the *problem's* best measured time (all its configurations and
    backends): ``<20us``, ``20-100us``, ``0.1-1ms``, ``>1ms``
    (:data:`BUCKETS`), so a problem's configurations stay together and the
    ranking metrics stay defined within a bucket.
layout
    GEMM operand layout ``A:row B:col`` etc. from ``a_row_major`` and
    ``b_row_major`` (other families have none).

Judgement: a figure is *worse* when it moved in its bad direction by more
than its tolerance, *better* when it moved in its good direction by more
than the tolerance, *same* otherwise; *n/a* when either side is missing
(the older version cannot predict that family, GPU or dtype) and *small*
when the slice has fewer than ``min_problems`` problems (printed, not judged).
Speed figures are ratios ``reference time / working time`` (above 1: the
working tree is faster), judged worse below ``speed_ratio`` and better above
its inverse.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Iterable, Sequence

import polars as pl

from tsbatch.measured.metrics import accuracy_metrics

__all__ = [
    "BUCKETS",
    "FIGURES",
    "Tolerance",
    "bucket_expr",
    "add_slices",
    "accuracy_figures",
    "compare_figures",
    "judge",
    "judge_speed",
    "summary_lines",
    "small_kernel_lines",
    "format_comparison",
]

#: (label, low µs inclusive, high µs exclusive) of the time buckets, by the
#: problem's best measured time
BUCKETS: tuple[tuple[str, float, float], ...] = (
    ("<20us", 0.0, 20.0),
    ("20-100us", 20.0, 100.0),
    ("0.1-1ms", 100.0, 1000.0),
    (">1ms", 1000.0, math.inf),
)

#: figures compared, in print order: name -> (higher is better?, short label)
FIGURES: dict[str, tuple[bool, str]] = {
    "mape_pct": (False, "MAPE"),
    "bias": (False, "meas/pred"),  # judged by |bias - 1|
    "spearman": (True, "Spearman"),
    "top5_retention_pct": (True, "top-5"),
}

#: slice kinds, in print order
SLICE_KINDS = ("all", "bucket", "layout")


@dataclass(frozen=True)
class Tolerance:
    """How far a figure may move the wrong way before it is marked worse."""

    mape_pct: float = 0.3          # percentage points
    bias: float = 0.02             # on |measured/predicted - 1|
    spearman: float = 0.005
    top5_retention_pct: float = 0.3  # percentage points
    speed_ratio: float = 0.95      # reference time / working time below this is worse
    min_problems: int = 3          # slices with fewer problems are shown, not judged

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))


# ----------------------------------------------------------------------
# slicing and figures
# ----------------------------------------------------------------------
def bucket_expr(col: str) -> pl.Expr:
    """The time bucket (:data:`BUCKETS` label) of the times in ``col`` (µs)."""
    expr = pl.lit(None, dtype=pl.String)
    for label, lo, hi in reversed(BUCKETS):
        expr = pl.when((pl.col(col) >= lo) & (pl.col(col) < hi)).then(pl.lit(label)).otherwise(expr)
    return expr


def add_slices(scored: pl.DataFrame) -> pl.DataFrame:
    """Add ``bucket`` (the problem's best measured time, :data:`BUCKETS`) and
    ``layout`` (``A:row B:col`` ...; null without the layout columns)."""
    out = scored.with_columns(_best=pl.col("measured_us").min().over("_problem"))
    out = out.with_columns(bucket_expr("_best").alias("bucket")).drop("_best")
    if "a_row_major" in out.columns and "b_row_major" in out.columns:
        side = lambda c, n: pl.when(pl.col(c)).then(pl.lit(f"{n}:row")).otherwise(pl.lit(f"{n}:col"))  # noqa: E731
        lay = (pl.when(pl.col("a_row_major").is_null() | pl.col("b_row_major").is_null())
               .then(pl.lit(None, dtype=pl.String))
               .otherwise(pl.concat_str([side("a_row_major", "A"), side("b_row_major", "B")], separator=" ")))
    else:
        lay = pl.lit(None, dtype=pl.String)
    return out.with_columns(lay.alias("layout"))


def _bias(scored: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    ok = (pl.col("feasible").fill_null(False) & pl.col("predicted_us").is_finite()
          & (pl.col("predicted_us") > 0))
    return (scored.filter(ok)
            .group_by(keys)
            .agg(bias=(pl.col("measured_us") / pl.col("predicted_us")).median()))


def accuracy_figures(scored: pl.DataFrame, group: Sequence[str],
                     kinds: Sequence[str] = SLICE_KINDS) -> pl.DataFrame:
    """One row per group x slice: ``*group, slice_kind, slice, rows, problems``
    and the :data:`FIGURES` columns.

    ``scored`` must carry ``bucket`` and ``layout`` (:func:`add_slices`).
    Slices: ``all`` (the whole group), each time bucket, each layout (only
    where the group has layouts); ``kinds`` picks among them.
    """
    group = list(group)
    parts = []
    for kind, col in (("all", None), ("bucket", "bucket"), ("layout", "layout")):
        if kind not in kinds:
            continue
        if col is None:
            frame = scored.with_columns(pl.lit("all").alias("_slice"))
        else:
            frame = scored.filter(pl.col(col).is_not_null()).with_columns(pl.col(col).alias("_slice"))
        if frame.height == 0:
            continue
        keys = [*group, "_slice"]
        m = accuracy_metrics(frame, keys).select(
            *keys, "rows", "problems", "mape_pct", "spearman", "top5_retention_pct")
        m = m.join(_bias(frame, keys), on=keys, how="left")
        parts.append(m.with_columns(pl.lit(kind).alias("slice_kind")))
    if not parts:
        return pl.DataFrame(schema={**{g: pl.String for g in group}, "slice_kind": pl.String,
                                    "slice": pl.String, "rows": pl.Int64, "problems": pl.Int64,
                                    **{f: pl.Float64 for f in FIGURES}})
    out = pl.concat(parts, how="diagonal_relaxed").rename({"_slice": "slice"})
    return out.select(*group, "slice_kind", "slice", "rows", "problems",
                      *[pl.col(f).cast(pl.Float64) for f in FIGURES])


def _slice_order() -> pl.Expr:
    order = {"all": 0, **{b[0]: 1 + i for i, b in enumerate(BUCKETS)}}
    return pl.col("slice").replace_strict(order, default=99, return_dtype=pl.Int32)


def compare_figures(ref: pl.DataFrame | None, new: pl.DataFrame, group: Sequence[str]) -> pl.DataFrame:
    """Join two :func:`accuracy_figures` tables on group and slice.

    Columns: the keys, ``rows``, ``problems`` (the working tree's, else the
    reference's), and ``ref_<figure>``, ``new_<figure>`` for every figure. A
    slice present on one side only (or a missing ``ref``) has nulls on the
    other.
    """
    keys = [*group, "slice_kind", "slice"]
    figs = list(FIGURES)
    n = new.select(*keys, "rows", "problems", *[pl.col(f).alias(f"new_{f}") for f in figs])
    if ref is None or ref.height == 0:
        r = pl.DataFrame(schema={**{k: n.schema[k] for k in keys}, "_rrows": pl.Int64, "_rprob": pl.Int64,
                                 **{f"ref_{f}": pl.Float64 for f in figs}})
    else:
        r = ref.select(*keys, pl.col("rows").alias("_rrows"), pl.col("problems").alias("_rprob"),
                       *[pl.col(f).alias(f"ref_{f}") for f in figs])
    out = n.join(r, on=keys, how="full", coalesce=True, nulls_equal=True)
    out = out.with_columns(pl.coalesce("rows", "_rrows").alias("rows"),
                           pl.coalesce("problems", "_rprob").alias("problems")).drop("_rrows", "_rprob")
    kind_order = pl.col("slice_kind").replace_strict({k: i for i, k in enumerate(SLICE_KINDS)},
                                                     default=9, return_dtype=pl.Int32)
    out = out.with_columns(_ko=kind_order, _so=_slice_order()).sort([*group, "_ko", "_so", "slice"])
    return out.drop("_ko", "_so").select(
        *keys, "rows", "problems", *[c for f in figs for c in (f"ref_{f}", f"new_{f}")])


# ----------------------------------------------------------------------
# judgement
# ----------------------------------------------------------------------
def _missing(v) -> bool:
    return v is None or (isinstance(v, float) and not math.isfinite(v))


def badness_delta(figure: str, ref: float, new: float) -> float:
    """How much worse ``new`` is than ``ref`` in the figure's own units
    (negative: better)."""
    if figure == "bias":
        return abs(new - 1.0) - abs(ref - 1.0)
    higher_better = FIGURES[figure][0]
    return (ref - new) if higher_better else (new - ref)


def judge(figure: str, ref, new, tol: Tolerance, problems: int | None = None) -> str:
    """``worse``, ``better``, ``same``, ``n/a`` (a side missing) or ``small``
    (fewer than ``tol.min_problems`` problems)."""
    if _missing(ref) or _missing(new):
        return "n/a"
    if problems is not None and problems < tol.min_problems:
        return "small"
    d = badness_delta(figure, float(ref), float(new))
    step = getattr(tol, figure) * (1.0 + 1e-9)  # exactly at the tolerance is within it
    if d > step:
        return "worse"
    if d < -step:
        return "better"
    return "same"


def judge_speed(ratio, tol: Tolerance) -> str:
    """Judge ``reference time / working time``."""
    if _missing(ratio) or ratio <= 0:
        return "n/a"
    if ratio < tol.speed_ratio:
        return "worse"
    if ratio > 1.0 / tol.speed_ratio:
        return "better"
    return "same"


def judged_rows(cmp: pl.DataFrame, group: Sequence[str], tol: Tolerance) -> list[dict]:
    """One dict per (row of ``cmp``, figure): keys, figure, ref, new, verdict,
    and ``excess`` (how many tolerances worse; for sorting the worst)."""
    out = []
    for r in cmp.iter_rows(named=True):
        for f in FIGURES:
            ref, new = r[f"ref_{f}"], r[f"new_{f}"]
            v = judge(f, ref, new, tol, r["problems"])
            excess = None
            if v in ("worse", "better", "same"):
                excess = badness_delta(f, float(ref), float(new)) / getattr(tol, f)
            out.append({**{k: r[k] for k in (*group, "slice_kind", "slice", "rows", "problems")},
                        "figure": f, "ref": None if _missing(ref) else float(ref),
                        "new": None if _missing(new) else float(new), "verdict": v, "excess": excess})
    return out


# ----------------------------------------------------------------------
# printing
# ----------------------------------------------------------------------
_MARK = {"worse": "!!", "better": "+", "same": "", "n/a": "", "small": "~"}


def _fmt(f: str, v) -> str:
    if _missing(v):
        return "n/a"
    if f == "bias" or f == "spearman":
        return f"{v:.3f}"
    return f"{v:.2f}"


def format_comparison(cmp: pl.DataFrame, group: Sequence[str], tol: Tolerance,
                      ref_name: str = "ref", new_name: str = "new") -> str:
    """A plain-text table: one line per group x slice, each figure as
    ``ref -> new`` with ``!!`` where worse beyond tolerance, ``+`` where
    better, ``~`` where too few problems to judge."""
    head = [*group, "slice", "rows", "probs"] + [FIGURES[f][1] for f in FIGURES]
    lines = []
    for r in cmp.iter_rows(named=True):
        cells = [str(r[g]) for g in group]
        cells += [r["slice"] if r["slice_kind"] == "all" else f"  {r['slice']}", str(r["rows"]),
                  str(r["problems"])]
        for f in FIGURES:
            ref, new = r[f"ref_{f}"], r[f"new_{f}"]
            v = judge(f, ref, new, tol, r["problems"])
            cells.append(f"{_fmt(f, ref)} -> {_fmt(f, new)}{(' ' + _MARK[v]) if _MARK[v] else ''}")
        lines.append(cells)
    widths = [max(len(h), *(len(c[i]) for c in lines)) if lines else len(h) for i, h in enumerate(head)]
    fmt = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    title = f"(each figure: {ref_name} -> {new_name})"
    return "\n".join([title, fmt(head), fmt(["-" * w for w in widths]), *(fmt(c) for c in lines)])


def _describe(j: dict, group: Sequence[str]) -> str:
    where = " ".join(str(j[g]) for g in group if j.get(g) is not None)
    sl = "" if j.get("slice_kind") in (None, "all") else f" [{j['slice']}]"
    name = FIGURES[j["figure"]][1] if j["figure"] in FIGURES else j["figure"]
    return f"{where}{sl} {name} {_fmt(j['figure'], j['ref'])} -> {_fmt(j['figure'], j['new'])}"


#: the small-kernel time buckets the summary reports on their own (the development
#: set is thin there, and a bias that moves there is hidden by the large problems)
SMALL_BUCKETS = ("<20us", "20-100us")


def small_kernel_lines(judged: Iterable[dict], group: Sequence[str]) -> list[str]:
    """The summary's small-kernel block: how many :data:`SMALL_BUCKETS` slices were
    judged on MAPE and bias and how their verdicts fell, then every such bucket whose
    MAPE or bias moved beyond tolerance (either way), with both figures."""
    cells: dict[tuple, dict] = {}
    for j in judged:
        if j.get("slice_kind") != "bucket" or j.get("slice") not in SMALL_BUCKETS:
            continue
        if j["figure"] not in ("mape_pct", "bias"):
            continue
        key = tuple(j.get(g) for g in group) + (j["slice"],)
        cells.setdefault(key, {})[j["figure"]] = j
    if not cells:
        return []
    judged_cells = {k: c for k, c in cells.items()
                    if any(x["verdict"] in ("worse", "better", "same") for x in c.values())}
    counts: dict[str, int] = {}
    moved = []
    for key, c in judged_cells.items():
        vs = {x["verdict"] for x in c.values()}
        v = "worse" if "worse" in vs else "better" if "better" in vs else "same"
        counts[v] = counts.get(v, 0) + 1
        if v != "same":
            figs = ", ".join(
                f"{FIGURES[f][1]} {_fmt(f, c[f]['ref'])} -> {_fmt(f, c[f]['new'])}"
                f"{(' ' + _MARK[c[f]['verdict']]) if _MARK[c[f]['verdict']] else ''}"
                for f in ("mape_pct", "bias") if f in c)
            moved.append(f"  {' '.join(str(k) for k in key if k is not None)}: {figs}")
    lines = [f"small kernels ({' and '.join(SMALL_BUCKETS)} buckets, MAPE and meas/pred): "
             f"{len(judged_cells)} judged, {counts.get('worse', 0)} worse, "
             f"{counts.get('better', 0)} better, {counts.get('same', 0)} within tolerance"
             f"{'; moved:' if moved else ''}"]
    return lines + sorted(moved)


def summary_lines(judged: Iterable[dict], speed: Iterable[dict], group: Sequence[str],
                  ref_name: str, new_name: str, tol: Tolerance, worst: int = 8) -> list[str]:
    """The block meant for a commit message: counts per verdict, the worst
    accuracy regressions (by tolerances exceeded) and every speed ratio (with a
    speed figure's ``note``, if it has one, after it)."""
    judged = list(judged)
    speed = list(speed)
    counts: dict[str, int] = {}
    for j in judged:
        counts[j["verdict"]] = counts.get(j["verdict"], 0) + 1
    worse = sorted((j for j in judged if j["verdict"] == "worse"), key=lambda j: -j["excess"])
    sp_worse = [s for s in speed if s["verdict"] == "worse"]
    lines = [
        f"regress.py {ref_name} -> {new_name}: accuracy figures {counts.get('worse', 0)} worse, "
        f"{counts.get('better', 0)} better, {counts.get('same', 0)} within tolerance, "
        f"{counts.get('n/a', 0)} n/a, {counts.get('small', 0)} not judged (< {tol.min_problems} problems)",
        f"tolerances: MAPE +{tol.mape_pct:g} pt, |meas/pred-1| +{tol.bias:g}, Spearman -{tol.spearman:g}, "
        f"top-5 -{tol.top5_retention_pct:g} pt, speed ratio < {tol.speed_ratio:g}",
    ]
    if worse:
        lines.append(f"worst accuracy regressions ({min(worst, len(worse))} of {len(worse)}):")
        lines += [f"  {_describe(j, group)}" for j in worse[:worst]]
    lines += small_kernel_lines(judged, group)
    if speed:
        lines.append("speed, " + ref_name + " time / " + new_name + " time (above 1: faster now):")
        for s in speed:
            mark = {"worse": " !!", "better": " +"}.get(s["verdict"], "")
            r = "n/a" if _missing(s["ratio"]) else f"{s['ratio']:.2f}"
            note = f"; {s['note']}" if s.get("note") else ""
            lines.append(f"  {s['name']}: {r}{mark}{note}")
    n_bad = len(worse) + len(sp_worse)
    lines.append(f"verdict: {'REGRESSED' if n_bad else 'no regression beyond tolerance'} "
                 f"({len(worse)} accuracy, {len(sp_worse)} speed figure(s) worse)")
    return lines
