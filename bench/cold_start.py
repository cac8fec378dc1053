"""Cold start of ``tsbatch evaluate`` (1,000 rows, empty numba cache), tree against tree.

    python bench/cold_start.py [--ref REF | --tree DIR] [--rounds 3] [--kernels]
                               [--json OUT.json]

The same command as ``bench/regress.py``'s "cold start, empty numba cache, 1,000
rows" figure (``tsbatch evaluate`` of ``throughput.build_candidates(1000)``,
``--hw h100``, a new process with ``NUMBA_CACHE_DIR`` a new empty directory),
timed alone: ``--rounds`` rounds, each tree once per round, the order flipping
every round (the guard times it once per tree, which on a shared machine is
noise). ``--ref REF`` installs REF's tree as the guard does (cached in
``/tmp/tsbatch-regress/trees``); ``--tree DIR`` names a source tree; neither:
this tree alone.

``--kernels`` also records, in each run, the process CPU seconds of every
numba compile (a ``numba:compile`` event listener): per kernel and signature,
``cum`` (its compile, callees included: numba links a callee's code into the
caller and optimizes the whole again there) and ``self`` (without the compiles
of callees it triggered). Printed for this tree's last run (and the
reference's, with ``-v``); the listener costs nothing measurable.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
PY = sys.executable

#: the guard's entry point (either layout), with an optional compile listener
RUNNER = r"""
import json, os, sys, time, importlib
out = os.environ.get("TSBATCH_COLD_KERNELS")
recs = []
if out:
    from numba.core import event as ev

    class _L(ev.Listener):
        def __init__(self):
            self.stack = []

        def on_start(self, e):
            self.stack.append([time.process_time(), 0.0])

        def on_end(self, e):
            t0, child = self.stack.pop()
            cum = time.process_time() - t0
            if self.stack:
                self.stack[-1][1] += cum
            d = e.data.get("dispatcher")
            f = getattr(d, "py_func", None)
            name = f"{f.__module__}.{f.__qualname__}" if f is not None else repr(d)
            recs.append({"kernel": name, "args": str(e.data.get("args")), "cum": cum,
                         "self": cum - child, "depth": len(self.stack)})

    ev.register("numba:compile", _L())
try:
    m = importlib.import_module('tsbatch.front.cli')
except ModuleNotFoundError:
    m = importlib.import_module('tsbatch.cli')
try:
    rc = m.main(sys.argv[1:])
finally:
    if out:
        with open(out, "w") as fh:
            json.dump({"cpu": time.process_time(), "compiles": recs}, fh)
sys.exit(rc)
"""


def install(ref: str) -> Path:
    sys.path.insert(0, str(BENCH))
    from regress import install_ref, resolve_ref

    return install_ref(resolve_ref(ref), Path(os.environ.get("TSBATCH_REGRESS_DIR", "/tmp/tsbatch-regress")))


def one_run(tree: Path, src: Path, tmp: Path, tag: str, i: int, kernels: bool) -> dict:
    cache = tmp / f"cache_{tag}_{i}"
    cache.mkdir()
    env = dict(os.environ, PYTHONPATH=str(tree), OMP_WAIT_POLICY="passive", NUMBA_CACHE_DIR=str(cache))
    rec = tmp / f"kernels_{tag}_{i}.json"
    if kernels:
        env["TSBATCH_COLD_KERNELS"] = str(rec)
    cmd = [PY, "-c", RUNNER, "evaluate", str(src), "--hw", "h100", "-o", str(tmp / f"out_{tag}.parquet"), "-q"]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"{tag}: status {r.returncode}: {r.stderr.strip()[-800:]}")
    res = {"wall": wall}
    if kernels:
        res.update(json.loads(rec.read_text()))
    if r.stderr.strip():
        res["stderr"] = r.stderr.strip()[-800:]
    return res


def table(res: dict, top: int) -> str:
    recs = res.get("compiles", [])
    lines = [f"  process CPU {res.get('cpu', float('nan')):.1f} s, {len(recs)} compiles, "
             f"sum of top-level compiles {sum(r['cum'] for r in recs if r['depth'] == 0):.1f} s"]
    for r in sorted(recs, key=lambda r: -r["cum"])[:top]:
        lines.append(f"  {r['cum']:6.2f} cum {r['self']:6.2f} self  d{r['depth']}  {r['kernel']}{r['args'][:60]}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--ref", default=None, help="a commit of this repository (installed as the guard does)")
    g.add_argument("--tree", default=None, help="a source tree to compare with")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--kernels", action="store_true", help="per-kernel compile CPU seconds")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--json", default=None)
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(BENCH))
    from throughput import build_candidates

    trees = {"new": ROOT}
    if args.ref:
        trees = {"ref": install(args.ref), "new": ROOT}
    elif args.tree:
        trees = {"ref": Path(args.tree).resolve(), "new": ROOT}
    tmp = Path(tempfile.mkdtemp(prefix="tsbatch-cold-"))
    src = tmp / "start_1000.parquet"
    build_candidates(1000).write_parquet(src)
    runs: dict[str, list[dict]] = {t: [] for t in trees}
    tags = list(trees)
    for i in range(args.rounds):
        for tag in (tags if i % 2 == 0 else tags[::-1]):
            runs[tag].append(one_run(trees[tag], src, tmp, tag, i, args.kernels))
        print(f"round {i + 1}/{args.rounds}: " + ", ".join(f"{t} {runs[t][-1]['wall']:.1f} s"
                                                          + (f" (cpu {runs[t][-1]['cpu']:.1f})" if args.kernels else "")
                                                          for t in tags), flush=True)
    med = {t: statistics.median(r["wall"] for r in runs[t]) for t in tags}
    cpu = {t: statistics.median(r["cpu"] for r in runs[t]) for t in tags} if args.kernels else {}
    for t in tags:
        print(f"[{t}] {trees[t]}: median {med[t]:.2f} s, runs {[round(r['wall'], 2) for r in runs[t]]}"
              + (f"; process CPU median {cpu[t]:.2f} s, runs {[round(r['cpu'], 2) for r in runs[t]]}"
                 if cpu else ""))
    if "ref" in med:
        print(f"cold start, ref time / new time: {med['ref'] / med['new']:.2f} "
              f"(best {min(r['wall'] for r in runs['ref']) / min(r['wall'] for r in runs['new']):.2f})"
              + (f"; process CPU {cpu['ref'] / cpu['new']:.2f}" if cpu else ""))
    if args.kernels:
        for t in tags:
            if t == "new" or args.verbose:
                print(f"[{t}] compiles of the last run:")
                print(table(runs[t][-1], args.top))
    for t in tags:
        if runs[t][-1].get("stderr"):
            print(f"[{t}] stderr: {runs[t][-1]['stderr']}")
    print(f"outputs of the last runs: {tmp}/out_<tree>.parquet")
    if args.json:
        Path(args.json).write_text(json.dumps({"trees": {t: str(p) for t, p in trees.items()}, "runs": runs}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
