"""Warm latency of one :func:`tsbatch.engine.prune.prune` call on 1,000 configurations.

Prints, per workload, the median of 50 warm uncached ``prune`` calls, the
median of 50 cache hits of a :class:`~tsbatch.engine.prune.Pruner`, and the cost of
one plain :func:`tsbatch.engine.evaluate.evaluate` call on the same configurations
(median of 3, measured in the same run), and checks that the kept sets agree.

    OMP_WAIT_POLICY=passive python bench/prune_latency.py [--hw h100] [--n 1000]
                                                          [--compare-tree DIR [--rounds 3]]

``--compare-tree DIR`` compares with another source tree (e.g. ``git archive
BASE | tar -x -C DIR``) in the same run: this script runs ``--rounds`` times
for each tree, alternating, each a new process started in its tree (so it
imports that tree's ``tsbatch``), and prints per workload the median over the
rounds of each tree's figures and the ratio (the machine may be shared: only
same-run figures compare).
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "passive")

import numpy as np  # noqa: E402
import polars as pl  # noqa: E402


WORKLOADS = [
    {"m": 4096, "n": 4096, "k": 4096, "dtype": "float16"},
    {"m": 8192, "n": 8192, "k": 1024, "dtype": "bfloat16"},
    {"m": 512, "n": 512, "k": 512, "dtype": "float16"},
    {"m": 16, "n": 4096, "k": 4096, "dtype": "float16"},
]


def configs(n: int, seed: int = 0) -> list[dict]:
    """``n`` distinct Triton-style tile configurations (some infeasible)."""
    space = list(itertools.product([16, 32, 64, 128, 256], [16, 32, 64, 128, 256],
                                   [32, 64, 128], [2, 3, 4, 5, 6], [2, 4, 8], [4, 8], [1, 2]))
    pick = np.random.default_rng(seed).choice(len(space), n, replace=False)
    keys = ("block_m", "block_n", "block_k", "num_stages", "num_warps", "group_m", "split_k")
    return [dict(zip(keys, (int(v) for v in space[i]))) for i in pick]


def median_ms(fn, reps: int) -> float:
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def main() -> None:
    # imported here, not at the top: bench/regress_worker.py takes WORKLOADS and
    # configs from this module into reference trees of another module layout
    from tsbatch.engine.evaluate import evaluate
    from tsbatch.engine.prune import Pruner, prune
    from tsbatch.engine.rank import rank

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hw", default="h100")
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--top", type=float, default=0.05)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--compare-tree", default=None, metavar="DIR")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if args.compare_tree:
        compare(args)
        return
    cfgs = configs(args.n)
    print(f"hw={args.hw}  configs={args.n}  top={args.top}  cpus={os.cpu_count()}")
    print(f"{'workload':>24} {'prune ms':>9} {'cached ms':>9} {'evaluate ms':>11} "
          f"{'predicted':>9} {'kept':>5} {'same':>5}")
    for wl in WORKLOADS:
        res = prune(wl, cfgs, hw=args.hw, top=args.top)  # warm-up (JIT, caches)
        t_prune = median_ms(lambda: prune(wl, cfgs, hw=args.hw, top=args.top), args.reps)
        pr = Pruner(args.hw, args.top)
        pr.prune(wl, cfgs)
        t_hit = median_ms(lambda: pr.prune(wl, cfgs), args.reps)
        df = pl.DataFrame(cfgs).with_columns(**{k: pl.lit(v) for k, v in wl.items()})
        evaluate(df, args.hw)
        t_eval = median_ms(lambda: evaluate(df, args.hw), 3)
        ref = rank(evaluate(df, args.hw).with_row_index("_i"), [], top=args.top)
        same = ref["_i"].to_list() == list(res.indices)
        name = f"{wl['m']}x{wl['n']}x{wl['k']} {wl['dtype']}"
        print(f"{name:>24} {t_prune:9.2f} {t_hit:9.3f} {t_eval:11.1f} "
              f"{res.n_predicted:>9} {len(res):>5} {str(same):>5}")


def compare(args) -> None:
    here = Path(__file__).resolve().parent.parent
    trees = {"baseline": Path(args.compare_tree).resolve(), "this tree": here}
    cmd = ["--hw", args.hw, "--n", str(args.n), "--top", str(args.top), "--reps", str(args.reps)]
    rows: dict = {t: {} for t in trees}  # tree -> workload -> [(prune, cached, kept, same)]
    for r in range(args.rounds):
        for tree, root in trees.items():
            env = dict(os.environ, PYTHONPATH=str(root))
            out = subprocess.run([sys.executable, str(root / "bench" / "prune_latency.py"), *cmd],
                                 cwd=root, env=env, check=True, capture_output=True,
                                 text=True).stdout
            for line in out.splitlines()[2:]:
                f = line.split()
                if len(f) == 8:
                    rows[tree].setdefault(f"{f[0]} {f[1]}", []).append(
                        (float(f[2]), float(f[3]), f[5], f[7]))
            print(f"round {r + 1}/{args.rounds} {tree}: done", flush=True)
    print(f"hw={args.hw}  configs={args.n}  top={args.top}  cpus={os.cpu_count()}  "
          f"medians over {args.rounds} rounds of {args.reps} calls")
    print(f"{'workload':>24} {'base ms':>8} {'this ms':>8} {'ratio':>6} {'base hit':>8} "
          f"{'this hit':>8} {'predicted base/this':>20} {'same':>5}")
    for wl in rows["this tree"]:
        b, t = rows["baseline"][wl], rows["this tree"][wl]
        bp, tp = statistics.median(x[0] for x in b), statistics.median(x[0] for x in t)
        bh, th = statistics.median(x[1] for x in b), statistics.median(x[1] for x in t)
        same = all(x[3] == "True" for x in b + t)
        print(f"{wl:>24} {bp:8.2f} {tp:8.2f} {tp / bp:6.2f} {bh:8.3f} {th:8.3f} "
              f"{b[0][2] + '/' + t[0][2]:>20} {str(same):>5}")


if __name__ == "__main__":
    main()
