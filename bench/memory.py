"""Peak memory of ranked ``tsbatch evaluate`` against the input size.

    python bench/memory.py --rows 250000 1000000 --batch-rows 100000 --json OUT.json

For each N, builds the candidate table of ``bench/throughput.py`` (N
distinct rows: 13 LLM shapes x 1,028 token counts x a 3,600-point schedule
space, drawn evenly, so every workload's rows are spread over the whole file
and span every record batch), writes it to Parquet and runs
``tsbatch evaluate CANDIDATES --top 5% --batch-rows B`` in a child process,
reporting the child's own peak resident memory (``VmHWM``), its seconds and
rows per second, the rows it predicted in full, and the rows kept.

These are real predictions end to end, not synthetic latencies. What stays
in memory while ranking: one record batch (and its predictions) plus the
running top K of every workload (:mod:`tsbatch.engine.screen`), which is the size of
the output, about ``top`` times the input. So peak memory does not grow with
N beyond the output it must write; ``result_mb_per_row`` (the kept rows'
in-memory size per row) projects that part to larger N
(``projected_result_mb_at``: the rows kept at the top fraction times that
size), the rest being measured.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import tempfile
import time
from pathlib import Path

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from throughput import build_candidates, child_peak_rss_mb, run_cli  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[250_000, 1_000_000])
    ap.add_argument("--batch-rows", type=int, default=100_000)
    ap.add_argument("--hw", default="h100")
    ap.add_argument("--top", default="5%")
    ap.add_argument("--project", type=int, default=20_000_000,
                    help="input size to project the kept rows' memory to")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    runs = []
    with tempfile.TemporaryDirectory(prefix="tsbatch-mem-") as tmp:
        src = Path(tmp) / "candidates.parquet"
        out = Path(tmp) / "ranked.parquet"
        # warm-up: a small run first, so that no measured run compiles the numba
        # kernels (compilation alone adds about 100 MB of peak memory)
        build_candidates(2000, seed=1).write_parquet(src)
        run_cli(["evaluate", str(src), "--hw", args.hw, "-o", str(out), "--top", args.top,
                 "--quiet"])
        for n in args.rows:
            cand = build_candidates(n)
            cand.write_parquet(src)
            workloads = cand.select("m", "n", "k").n_unique()
            del cand
            t = time.perf_counter()
            proc = run_cli(["evaluate", str(src), "--hw", args.hw, "-o", str(out), "--top",
                            args.top, "--quiet", "--batch-rows", str(args.batch_rows)])
            dt = time.perf_counter() - t
            got = re.search(r"([\d,]+) predicted in full", proc.stdout)
            full = int(got.group(1).replace(",", "")) if got else None
            res = pl.read_parquet(out)
            per_row = res.estimated_size("mb") / max(res.height, 1)
            runs.append({"rows": n, "workloads": workloads, "batch_rows": args.batch_rows,
                         "peak_rss_mb": child_peak_rss_mb(proc), "seconds": dt,
                         "rows_per_s": n / dt, "rows_fully_evaluated": full,
                         "fraction_fully_evaluated": full / n if full is not None else None,
                         "rows_kept": res.height, "result_mb_per_row": per_row})
            print(json.dumps(runs[-1]))
    frac = float(args.top.rstrip("%")) / 100 if args.top.endswith("%") else float(args.top)
    last = runs[-1]
    # rows kept at the projected size: K = ceil(top * n_w) per workload, the same workloads
    per_wl = args.project / last["workloads"]
    kept = last["workloads"] * max(1, math.ceil(frac * per_wl - 1e-9))
    report = {
        "runs": runs,
        "peak_rss_growth_mb": runs[-1]["peak_rss_mb"] - runs[0]["peak_rss_mb"],
        "projected_result_rows_at": {str(args.project): kept},
        "projected_result_mb_at": {str(args.project): kept * last["result_mb_per_row"]},
        "note": "measured end to end with real predictions; the projection covers only the "
                "kept rows (the running top K), the part of memory that grows with N",
    }
    print(json.dumps({k: v for k, v in report.items() if k != "runs"}, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
