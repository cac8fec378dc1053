"""Cold and warm start of ``tsbatch evaluate`` on a 1,000-row candidate file.

    python bench/startup.py [--hw h100] [--repeats 3] [--cold-repeats N]
                            [--compare-tree DIR] [--env NAME=VALUE]

Cold: a fresh, empty numba cache directory (every kernel compiles). Warm: the
same cache directory again (kernels load from the cache). Each run is a new
process, as a user or an autotuner would start it. Prints seconds.

``--compare-tree DIR`` runs the same measurements, interleaved, with the
package imported from another source tree (e.g. ``git archive BASE | tar -x
-C DIR``): the process starts in DIR, so ``python -m tsbatch.front.cli`` imports
DIR's ``tsbatch`` (with its own numba cache). ``--env NAME=VALUE`` instead
compares against this tree run with an extra environment variable. Either
prints the baseline next to this tree and the ratio of the medians (the
machine may be shared: only same-run figures compare).

``--cold-repeats`` (default ``--repeats``) bounds the cold runs, which take
minutes; each warm run reuses the cache of its tree's latest cold run.

    python bench/startup.py --fresh-install [--repeats 3] [--wheel WHEEL]

Fresh install, as a new user meets tsbatch: builds a wheel of this tree (or
takes ``--wheel``), installs it with ``pip`` into a new virtual environment
(its dependencies from the package index or pip's cache), and times, each in
a new process with no ``NUMBA_CACHE_DIR``, the three first calls of issue 22:
``tsbatch explain`` (the README's GEMM example), ``tsbatch sweep llama3 --top
5%`` and one ``prune()`` of 1,000 configurations; every first call starts with
the install's ``__pycache__`` emptied of numba's files, so each is a first
call on its own. The baseline in the same run is the same install with
``TSBATCH_PRECOMPILED=0`` (the wheel's compiled kernels ignored: every first
call compiles, as before they shipped). Then ``--repeats`` warm calls of each.
Prints seconds, the ratio, and how many kernels each first call had to compile
(numba's index files written to ``__pycache__``: 0 when the shipped code
loaded).
"""

from __future__ import annotations

import argparse
import collections
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
    ap.add_argument("--fresh-install", action="store_true",
                    help="build and install a wheel into a new venv and time the first calls")
    ap.add_argument("--wheel", default=None, help="with --fresh-install: use this wheel")
    ap.add_argument("-v", "--verbose", action="store_true",
                    help="with --fresh-install: print where each call loaded its kernels from")
    args = ap.parse_args(argv)
    if args.fresh_install:
        return fresh_install(args)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from throughput import build_candidates

    tmp = Path(tempfile.mkdtemp(prefix="tsbatch-startup-"))
    src = tmp / "c.parquet"
    build_candidates(1000).write_parquet(src)
    exe = [sys.executable, "-m", "tsbatch.front.cli", "evaluate", str(src), "--hw", args.hw,
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


PRUNE_CODE = """
import itertools
from tsbatch.engine.prune import prune
space = list(itertools.product([16, 32, 64, 128, 256], [16, 32, 64, 128, 256], [32, 64, 128],
                               [2, 3, 4, 5, 6], [2, 4, 8], [4, 8], [1, 2]))
keys = ("block_m", "block_n", "block_k", "num_stages", "num_warps", "group_m", "split_k")
cfgs = [dict(zip(keys, v)) for v in space[::len(space) // 1000][:1000]]
kept = prune({"m": 4096, "n": 4096, "k": 4096, "dtype": "float16"}, cfgs, hw="h100", top=0.05)
assert len(cfgs) == 1000 and len(kept) == 50, len(kept)
"""


def fresh_install(args) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="tsbatch-fresh-"))
    if args.wheel:
        wheel = Path(args.wheel).resolve()
    else:
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", str(ROOT),
                        "-w", str(tmp / "wheel")], check=True, capture_output=True)
        print(f"wheel built in {time.perf_counter() - t:.0f} s (kernels compiled for it)")
        wheel = next((tmp / "wheel").glob("tsbatch-*.whl"))
    venv = tmp / "venv"
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", str(wheel)], check=True,
                   capture_output=True)
    print(f"installed into a new venv in {time.perf_counter() - t:.0f} s")
    site = Path(subprocess.run([str(py), "-c", "import tsbatch, os; print(os.path.dirname("
                                "tsbatch.__file__))"], check=True, capture_output=True,
                               text=True, cwd=tmp).stdout.strip())  # not this tree's tsbatch
    assert site.is_relative_to(venv), site
    cli = [str(venv / "bin" / "tsbatch")]
    commands = {
        "explain": cli + ["explain", "--hw", "h100", "--m", "4096", "--n", "4096", "--k", "4096",
                          "--block-m", "128", "--block-n", "128", "--block-k", "64",
                          "--num-stages", "4", "--num-warps", "8"],
        "sweep llama3": cli + ["sweep", "llama3", "--hw", "h100", "--top", "5%",
                               "-o", str(tmp / "r.parquet"), "-q"],
        "prune() 1,000": [str(py), "-c", PRUNE_CODE],
    }
    targets = {"explain": 10.0, "sweep llama3": 20.0, "prune() 1,000": 10.0}

    def clear() -> None:
        for f in list(site.parent.glob("*/**/__pycache__/*.nb[ic]")):
            f.unlink()

    def run(cmd, shipped: bool) -> tuple[float, int]:
        env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "PYTHONPATH")}
        env["TSBATCH_PRECOMPILED"] = "1" if shipped else "0"
        env["NUMBA_DEBUG_CACHE"] = "1"  # numba logs each load and save (a few lines)
        t = time.perf_counter()
        res = subprocess.run(cmd, env=env, check=True, capture_output=True, cwd=tmp, text=True)
        dt = time.perf_counter() - t
        log = res.stdout.splitlines() + res.stderr.splitlines()
        saved = [ln.split("/")[-1].rstrip("'") for ln in log if "[cache] data saved" in ln]
        if args.verbose:
            loaded = collections.Counter("/".join(ln.split("/")[-4:-1]) for ln in log
                                         if "[cache] data loaded" in ln)
            print(f"  {cmd[1] if len(cmd) > 1 else cmd[0]} shipped={shipped}: {dt:.2f} s, "
                  f"saved {len(saved)}, loaded {dict(loaded)}", flush=True)
        return dt, saved

    rows = []
    for name, cmd in commands.items():
        firsts = {}
        for shipped in (True, False):
            clear()
            firsts[shipped] = run(cmd, shipped)
        # warm as before: the kernels the last call compiled, from __pycache__
        warm = [run(cmd, False)[0] for _ in range(args.repeats)]
        clear()  # warm from the shipped code alone
        warm_shipped = [run(cmd, True)[0] for _ in range(args.repeats)]
        rows.append((name, firsts[True], firsts[False], statistics.median(warm),
                     statistics.median(warm_shipped)))
    clear()
    print("seconds per call, each a new process; first = nothing compiled in __pycache__")
    print(f"{'command':<16} {'first, shipped':>15} {'first, compiled':>16} {'ratio':>6} "
          f"{'target':>7} {'warm':>6} {'warm, shipped':>14}  kernels compiled (shipped / not)")
    for name, (s_t, s_n), (c_t, c_n), w, ws in rows:
        print(f"{name:<16} {s_t:15.2f} {c_t:16.2f} {s_t / c_t:6.2f} {targets[name]:7.0f} "
              f"{w:6.2f} {ws:14.2f}  {len(s_n)} / {len(c_n)}")
    for name, (_, s_n), *_ in rows:
        if s_n:
            print(f"{name}: compiled despite the shipped code: {', '.join(s_n)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
