"""Cold and warm start of ``tsbatch evaluate`` on a 1,000-row candidate file.

    python bench/startup.py [--hw h100] [--repeats 3] [--cold-repeats N]
                            [--compare-tree DIR] [--env NAME=VALUE]

Cold: a fresh, empty numba cache directory (every kernel compiles). Warm: the
same cache directory again (kernels load from the cache). Each run is a new
process, as a user or an autotuner would start it. Prints seconds.

``--compare-tree DIR`` runs the same measurements, interleaved, with the
package imported from another source tree (e.g. ``git archive BASE | tar -x
-C DIR``): the process starts in DIR, so ``python -m tsbatch.cli`` imports
DIR's ``tsbatch`` (with its own numba cache). ``--env NAME=VALUE`` instead
compares against this tree run with an extra environment variable. Either
prints the baseline next to this tree and the ratio of the medians (the
machine may be shared: only same-run figures compare).

``--cold-repeats`` (default ``--repeats``) bounds the cold runs, which take
minutes; each warm run reuses the cache of its tree's latest cold run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hw", default="h100")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cold-repeats", type=int, default=None)
    ap.add_argument("--compare-tree", default=None, metavar="DIR")
    ap.add_argument("--env", default=None, metavar="NAME=VALUE")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from throughput import build_candidates

    tmp = Path(tempfile.mkdtemp(prefix="tsbatch-startup-"))
    src = tmp / "c.parquet"
    build_candidates(1000).write_parquet(src)
    exe = [sys.executable, "-m", "tsbatch.cli", "evaluate", str(src), "--hw", args.hw,
           "-o", str(tmp / "o.parquet"), "-q"]

    variants = {"this tree": (ROOT, {})}
    if args.compare_tree:
        variants["baseline"] = (Path(args.compare_tree).resolve(), {})
    elif args.env:
        name, _, value = args.env.partition("=")
        variants["baseline"] = (ROOT, {name: value})

    def run(cwd: Path, extra: dict, cache: Path) -> float:
        env = dict(os.environ, NUMBA_CACHE_DIR=str(cache), **extra)
        t = time.perf_counter()
        subprocess.run(exe, env=env, check=True, capture_output=True, cwd=cwd)
        return time.perf_counter() - t

    n_cold = args.repeats if args.cold_repeats is None else max(1, args.cold_repeats)
    colds = {v: [] for v in variants}
    warms = {v: [] for v in variants}
    caches = {}
    for i in range(max(args.repeats, n_cold)):
        for v, (cwd, extra) in variants.items():
            if i < n_cold:
                cache = tmp / f"cache-{list(variants).index(v)}-{i}"  # fresh for each cold run
                cache.mkdir()
                caches[v] = cache
                colds[v].append(run(cwd, extra, cache))
        for v, (cwd, extra) in variants.items():
            if i < args.repeats:
                warms[v].append(run(cwd, extra, caches[v]))

    def fmt(xs):
        return f"median {statistics.median(xs):6.2f} s  {[round(x, 2) for x in xs]}"

    for v in variants:
        tag = "" if len(variants) == 1 else f"[{v}] "
        print(f"{tag}cold start (fresh numba cache): {fmt(colds[v])}")
        print(f"{tag}warm start (cached kernels):    {fmt(warms[v])}")
    if len(variants) > 1:
        w = statistics.median(warms["this tree"]) / statistics.median(warms["baseline"])
        c = statistics.median(colds["this tree"]) / statistics.median(colds["baseline"])
        print(f"this tree / baseline: warm {w:.2f}x, cold {c:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
