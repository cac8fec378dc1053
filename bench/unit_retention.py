"""Top-5 retention unit by unit: which units moved between two predictions, and why.

    python bench/unit_retention.py DIR --gpu GPU --dtype DTYPE [--backend triton]
                                   [--file FILE] [--slice SLICE] [--configs N]

Issue 35 (docs/gemm_accuracy.md, "Small-kernel Triton top-5 and bias against
ca279d0, session 12"). ``DIR`` is a ``bench/regress.py REF --keep-predictions
DIR`` directory: ``scored_ref.parquet`` (the reference's predictions) and
``scored_new.parquet`` (the working tree's), the same rows in the same order.
The slice is one GPU x dtype x backend (x measured file), optionally one
bucket (``<20us``, ``20-100us``, ``0.1-1ms``, ``>1ms``) or layout
(``A:col B:row`` ...) as the guard prints them.

For the slice it prints:

1. the top-5 retention of both versions recomputed here, once with the
   metric's own tie rule (equal predictions: the larger measured time ranks
   first, ``tsbatch.measured.metrics``) and once with the opposite rule, and
   checks the first against :func:`tsbatch.measured.metrics.accuracy_metrics`
   on the same rows (it stops if they differ by more than 1e-9);
2. every unit (problem x layout) whose retention moved by more than 0.05
   points: its kept count, both retentions, and the ``--configs`` fastest
   measured configurations with their measured and predicted times and their
   predicted rank (0 = predicted fastest; ``*`` marks the kept ones) in both
   versions.

Nothing is fitted or written; it prints.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tsbatch.measured.metrics import accuracy_metrics, keep_count  # noqa: E402

CONFIG = ("block_m", "block_n", "block_k", "num_stages", "num_warps", "group_m")


def load(dirpath: Path) -> pl.DataFrame:
    ref = pl.read_parquet(dirpath / "scored_ref.parquet")
    new = pl.read_parquet(dirpath / "scored_new.parquet")
    if ref.height != new.height or not ref["measured_us"].equals(new["measured_us"]):
        raise SystemExit("scored_ref and scored_new do not hold the same rows")
    return ref.with_columns(
        pred_new=new["predicted_us"], feasible_new=new["feasible"]
    ).rename({"predicted_us": "pred_ref", "feasible": "feasible_ref"})


def ranked(unit: pl.DataFrame, pred: str, feas: str, pessimistic: bool) -> pl.DataFrame:
    """The unit's rows in the metric's order: predicted time ascending (infeasible
    rows last, as +inf), ties by measured time descending (``pessimistic``, the
    metric's rule) or ascending."""
    p = pl.when(pl.col(feas).fill_null(False) & pl.col(pred).is_finite()).then(
        pl.col(pred)).otherwise(float("inf"))
    return unit.with_columns(_p=p).sort(["_p", "measured_us"], descending=[False, pessimistic])


def retention(unit: pl.DataFrame, pred: str, feas: str, pessimistic: bool = True) -> float:
    k = keep_count(unit.height)
    kept = ranked(unit, pred, feas, pessimistic)["measured_us"][:k].min()
    return 100.0 * unit["measured_us"].min() / kept


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--gpu", required=True)
    ap.add_argument("--dtype", required=True)
    ap.add_argument("--backend", default="triton")
    ap.add_argument("--file", default=None, help="the guard's file label (path as printed)")
    ap.add_argument("--slice", default=None, help="a bucket or a layout, as the guard prints it")
    ap.add_argument("--configs", type=int, default=6)
    args = ap.parse_args(argv)

    d = load(args.dir).filter(
        (pl.col("gpu") == args.gpu) & (pl.col("dtype") == args.dtype)
        & (pl.col("backend") == args.backend))
    if args.file:
        d = d.filter(pl.col("file") == args.file)
    if args.slice:
        d = d.filter((pl.col("bucket") == args.slice) | (pl.col("layout") == args.slice))
    if d.is_empty():
        raise SystemExit("no rows in that slice")

    units = [g for _, g in d.group_by("_unit", maintain_order=True) if g.height >= 2]
    figs = {}
    for side in ("ref", "new"):
        for pess in (True, False):
            v = [retention(u, f"pred_{side}", f"feasible_{side}", pess) for u in units]
            figs[(side, pess)] = sum(v) / len(v)
        check = accuracy_metrics(d.rename({f"pred_{side}": "predicted_us",
                                           f"feasible_{side}": "feasible"}))
        metric = check["top5_retention_pct"][0]
        if abs(metric - figs[(side, True)]) > 1e-9:
            raise SystemExit(f"{side}: recomputed {figs[(side, True)]!r} != metrics.py {metric!r}")
    print(f"{args.gpu} {args.dtype} {args.backend} {args.file or ''} {args.slice or 'all'}: "
          f"{len(units)} units, {d['_problem'].n_unique()} problems")
    print(f"  top-5 retention, metric's ties (larger measured first): "
          f"ref {figs[('ref', True)]:.2f} -> new {figs[('new', True)]:.2f}")
    print(f"  the same, opposite tie rule (smaller measured first):   "
          f"ref {figs[('ref', False)]:.2f} -> new {figs[('new', False)]:.2f}")

    cfg = [c for c in CONFIG if c in d.columns]
    for u in units:
        r0 = retention(u, "pred_ref", "feasible_ref")
        r1 = retention(u, "pred_new", "feasible_new")
        if abs(r1 - r0) <= 0.05:
            continue
        k = keep_count(u.height)
        row = u.row(0, named=True)
        print(f"\nunit {row['_unit']}: {row['m']} x {row['n']} x {row['k']} {row['layout']} "
              f"[{row['bucket']}], {u.height} configurations, keeps {k}: "
              f"{r0:.2f} -> {r1:.2f}")
        ranks = {}
        for side in ("ref", "new"):
            o = ranked(u, f"pred_{side}", f"feasible_{side}", True).with_row_index("_rank")
            ranks[side] = o.select(*cfg, pl.col("_rank").alias(f"rank_{side}"))
        t = u.join(ranks["ref"], on=cfg).join(ranks["new"], on=cfg).sort("measured_us")
        print(f"  {'configuration':<24} {'measured':>9} {'ref pred (rank)':>17} {'new pred (rank)':>17}")
        for r in t.head(args.configs).iter_rows(named=True):
            name = "x".join(str(r[c]) for c in cfg[:3]) + "/" + "/".join(
                str(r[c]) for c in cfg[3:])
            marks = ["*" if r[f"rank_{s}"] < k else " " for s in ("ref", "new")]
            print(f"  {name:<24} {r['measured_us']:9.2f} "
                  f"{r['pred_ref']:9.2f} ({r['rank_ref']:2d}){marks[0]} "
                  f"{r['pred_new']:9.2f} ({r['rank_new']:2d}){marks[1]}")
        kept_only = [t.filter(pl.col(f"rank_{s}") < k) for s in ("ref", "new")]
        for s, kk in zip(("ref", "new"), kept_only):
            names = ", ".join(
                "x".join(str(r[c]) for c in cfg[:3]) + "/" + "/".join(str(r[c]) for c in cfg[3:])
                + f" {r['measured_us']:.2f}" for r in kk.iter_rows(named=True))
            print(f"  kept by {s}: {names}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
