"""Accuracy benchmark on the shared GEMM measurements (issue 3).

Runs :func:`tsbatch.measured.accuracy.run_accuracy` with the real model on every
``gemm/*.parquet`` of the shared data (Triton tile configurations and cuBLAS,
A100 and H100) and on every ``gemm.parquet`` the project measured itself
under ``bench/measured`` (H200, ``tsbatch measure``; ``--no-ours`` leaves
them out), and prints the per-GPU table of every metric, then the per-group
table. Optional JSON and Markdown/PNG reports.

Usage::

    python bench/accuracy.py [--data ../shared/data] [--json r.json] [--report DIR]
                             [--limit-problems N | --sample-problems N --seed S]

The data directory defaults to ``$TSBATCH_SHARED_DATA`` or ``../shared/data``
next to the repository. Exit status 2 when the data or the model is missing.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from tsbatch.measured.accuracy import print_summary, run_accuracy, write_markdown_report

REPO = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    default_data = Path(os.environ.get("TSBATCH_SHARED_DATA", REPO.parent / "shared" / "data"))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=default_data, help=f"shared data directory (default {default_data})")
    ap.add_argument("--json", type=Path, help="also write REPORT.json here")
    ap.add_argument("--report", type=Path, help="also write the Markdown report with parity plots here")
    sel = ap.add_mutually_exclusive_group()
    sel.add_argument("--limit-problems", type=int, help="first N problems of each file")
    sel.add_argument("--sample-problems", type=int, help="N random problems of each file")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-ours", action="store_true",
                    help="leave out the project's own measurements (bench/measured/**/gemm.parquet)")
    args = ap.parse_args(argv)

    files = sorted((args.data / "gemm").glob("*.parquet"))
    if not args.no_ours:
        files += sorted((REPO / "bench" / "measured").rglob("gemm.parquet"))
    if not files:
        print(f"bench/accuracy.py: no GEMM Parquet files under {args.data / 'gemm'}", file=sys.stderr)
        return 2
    try:
        import tsbatch.engine.evaluate  # noqa: F401
    except ImportError as exc:
        print(f"bench/accuracy.py: the GEMM evaluator is not available ({exc})", file=sys.stderr)
        return 2

    t0 = time.perf_counter()
    result = run_accuracy(
        files, limit_problems=args.limit_problems, sample_problems=args.sample_problems, seed=args.seed
    )
    elapsed = time.perf_counter() - t0
    rows = result.overall["rows"]
    print(f"accuracy on {len(files)} files: {rows} configurations in {elapsed:.1f} s "
          f"({rows / max(elapsed, 1e-9):,.0f} rows/s, loading and metrics included)")
    print()
    print_summary(result)
    if args.json:
        result.write_json(args.json)
    if args.report:
        write_markdown_report(result, args.report)
        print(f"report: {args.report / 'README.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
