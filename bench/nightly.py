"""The nightly accuracy check: every measured target of the open accuracy issues, one run.

    python bench/nightly.py [--json OUT.json] [--markdown] [--only gemm,attention,collectives]

Holds the model to the measured ground truth in ``../shared/data`` (or
``$TSBATCH_SHARED_DATA``) and to the held-out H200 set in ``bench/measured``:

- **GEMM** (issue 21): every gpu x dtype x backend x file group of
  ``<data>/gemm/``, whole set and the problems with m*n*k <= 2e10 alone,
  against the issue's table (Triton fp16/bf16 MAPE <= 12, Spearman >= 0.90,
  top-5 >= 99; Triton IEEE FP32 and TF32 <= 15, >= 0.85, >= 98; cuBLAS
  <= 8; LLMCompass <= 10) -- the groups and targets of
  ``bench/cross_validate.py --report-only``;
- **attention** (issue 18): ``<data>/attention/a100_flexattention.parquet``
  per dtype, MAPE <= 20, Spearman >= 0.8, top-5 retention >= 97;
- **collectives** (issue 20): WMAPE <= 12 on each file of
  ``<data>/collectives/`` and over all of them, MAPE <= 20 over all;
- **e2e** (issue 34): ``<data>/e2e/pipeweave_vllm_dev.parquet`` per GPU, prefill and
  decode-step MAPE <= 10 (total time reported);
- **held out** (reported, no target): the H200 GEMMs (fp16/bf16, and float32 as TF32 and IEEE) measured with
  ``tsbatch measure`` (``bench/measured/h200-*``), whose times nothing was
  fitted to.

Prints one row per checked metric (value, bound, met) and a summary; exits 1
when any target is not met (a nightly job goes red until every target holds),
0 otherwise. Figures are medians over the measured repeats, exactly as
``tsbatch accuracy`` computes them; nothing here is fitted.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import polars as pl

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import cross_validate as cv  # noqa: E402  (bench/cross_validate.py)

from tsbatch.measured.accuracy import format_table, run_accuracy  # noqa: E402

#: issue 18's targets per dtype of the FlexAttention file
ATTENTION_TARGETS = {"mape_pct": 20.0, "spearman": 0.8, "top5_retention_pct": 97.0}
#: issue 20's targets: per file and over all (WMAPE), over all (MAPE)
COLLECTIVE_WMAPE = 12.0
COLLECTIVE_MAPE = 20.0


def _ok(metric: str, value, bound: float) -> bool | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return value <= bound if metric in ("mape_pct", "wmape_pct") else value >= bound


def _row(area: str, group: str, metric: str, value, bound: float | None) -> dict:
    met = None if bound is None else _ok(metric, value, bound)
    op = "" if bound is None else ("<=" if metric in ("mape_pct", "wmape_pct") else ">=")
    return {"area": area, "group": group, "metric": metric,
            "value": None if value is None else round(float(value), 3),
            "target": "" if bound is None else f"{op} {bound:g}",
            "met": "-" if met is None else ("yes" if met else "no")}


def check_gemm(root: Path) -> list[dict]:
    rows = []
    ms = cv.report_only(cv.gemm_files(root))
    for subset in ("all", "small"):
        for r in ms[subset].iter_rows(named=True):
            bounds = cv.target_of(r["backend"], r["dtype"], r["set"])
            group = f"{r['gpu']} {r['dtype']} {r['backend']} {r['set']} ({subset}, {r['problems']} problems)"
            for metric, bound in bounds.items():
                rows.append(_row("gemm", group, metric, r.get(metric), bound))
    return rows


def check_attention(root: Path) -> list[dict]:
    f = root / "attention" / "a100_flexattention.parquet"
    if not f.exists():
        return [_row("attention", f"{f} missing", "mape_pct", None, ATTENTION_TARGETS["mape_pct"])]
    res = run_accuracy([f])
    rows = []
    for r in res.groups.iter_rows(named=True):
        group = f"{r['gpu']} {r['dtype']} ({r['problems']} problems)"
        for metric, bound in ATTENTION_TARGETS.items():
            rows.append(_row("attention", group, metric, r.get(metric), bound))
    return rows


def check_collectives(root: Path) -> list[dict]:
    files = sorted((root / "collectives").glob("*.parquet"))
    rows = []
    for f in files:
        r = run_accuracy([f]).overall
        rows.append(_row("collectives", f.stem, "wmape_pct", r.get("wmape_pct"), COLLECTIVE_WMAPE))
    if files:
        r = run_accuracy(files).overall
        rows.append(_row("collectives", "all files", "wmape_pct", r.get("wmape_pct"), COLLECTIVE_WMAPE))
        rows.append(_row("collectives", "all files", "mape_pct", r.get("mape_pct"), COLLECTIVE_MAPE))
    return rows


def _env_triton(d: Path) -> str | None:
    """The Triton release a measurement directory's ``env.txt`` records
    (``torch ... triton X.Y.Z``), for its files that carry none themselves."""
    env = d / "env.txt"
    if not env.exists():
        return None
    import re

    m = re.search(r"\btriton\s+(\d+\.\d+\S*)", env.read_text())
    return m.group(1) if m else None


def check_held_out() -> list[dict]:
    rows = []
    for d in sorted((HERE / "measured").glob("h200-*")):
        # fp16/bf16 (gemm, more) and float32, as TF32 and IEEE (fp32, fp32_layouts_*)
        subdirs = (".", "more", "fp32", "fp32_layouts_tf32", "fp32_layouts_ieee")
        files = sorted(p for p in (d / s / "gemm.parquet" for s in subdirs) if p.exists())
        if not files:
            continue
        res = run_accuracy(files, triton_version=_env_triton(d))
        for r in res.groups.iter_rows(named=True):
            group = f"{d.name} {r['gpu']} {r['dtype']} {r['backend']} ({r['problems']} problems)"
            for metric in ("mape_pct", "spearman", "top5_retention_pct"):
                v = r.get(metric)
                if v is not None:
                    rows.append(_row("held out", group, metric, v, None))
    return rows


#: issue 34's targets: per GPU, MAPE of prefill and decode step time
E2E_MAPE = {"prefill_mape": 10.0, "decode_step_mape": 10.0, "total_mape": None}


def check_e2e(root: Path) -> list[dict]:
    from tsbatch.serving.accuracy import load_e2e, predict_rows, score

    rows = []
    for f in sorted((root / "e2e").glob("*.parquet")):
        e2e = load_e2e(f)
        tab = score(e2e, predict_rows(e2e))
        for r in tab.filter(pl.col("gpu") != "all").iter_rows(named=True):
            for metric, bound in E2E_MAPE.items():
                rows.append(_row("e2e", f"{f.stem} {r['gpu']} {metric.replace('_mape', '')}",
                                 "mape_pct", r[metric], bound))
    return rows


CHECKS = {"gemm": check_gemm, "attention": check_attention, "collectives": check_collectives,
          "e2e": check_e2e}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, help="write every checked row as JSON")
    ap.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    ap.add_argument("--only", default=",".join(CHECKS),
                    help="comma-separated areas to check (default: %(default)s)")
    ap.add_argument("--no-held-out", action="store_true", help="skip the held-out H200 report")
    args = ap.parse_args(argv)
    areas = [a.strip() for a in args.only.split(",") if a.strip()]
    unknown = sorted(set(areas) - set(CHECKS))
    if unknown:
        ap.error(f"--only: unknown area(s) {', '.join(unknown)}; choose from {', '.join(CHECKS)}")
    root = cv.data_root()
    if not root.is_dir():
        print(f"error: measured data folder {root} not found (set TSBATCH_SHARED_DATA)", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    rows: list[dict] = []
    for area in areas:
        t = time.perf_counter()
        rows += CHECKS[area](root)
        print(f"[{area}: {time.perf_counter() - t:.0f} s]", file=sys.stderr)
    if not args.no_held_out:
        rows += check_held_out()
    table = pl.DataFrame(rows)
    print(format_table(table, markdown=args.markdown))
    checked = table.filter(pl.col("met") != "-")
    missed = checked.filter(pl.col("met") == "no")
    by_area = checked.group_by("area").agg(pl.len().alias("targets"),
                                           (pl.col("met") == "yes").sum().alias("met"))
    print()
    for r in by_area.sort("area").iter_rows(named=True):
        print(f"{r['area']}: {r['met']} of {r['targets']} targets met")
    print(f"{missed.height} target(s) not met; {time.perf_counter() - t0:.0f} s")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "missed": missed.height}, indent=1))
    return 1 if missed.height else 0


if __name__ == "__main__":
    sys.exit(main())
