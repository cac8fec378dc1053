"""Cost of the cache model per cache problem: the fast path against the general one.

    python bench/cache_speed.py [--rows 3000] [--hw h100 a100] [--reps 5] [--threads 1]

Builds the cache problems of a fixed sample of bench/throughput.py's
candidates (``build_candidates(rows, seed=3)``, feasible rows, the
evaluator's sampling: ``k_samples=4``, 8 waves, 4 waves of lookback) and
times ``reuse.cache_hit_rates`` on them with the default (fast) path and with
``general=True``, the straightforward per-access path the fast one is tested
equal to, as the baseline. Each figure is the best of ``--reps`` runs of CPU
time (one numba thread by default, so per-problem costs are stable); the two
paths alternate, so the ratio ``general / fast`` is measured in one run and
holds up on a busy machine better than either figure alone. The largest
difference between the two paths' results is printed as well.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numba
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from throughput import build_candidates  # noqa: E402

from kernels_catalog import gemm  # noqa: E402
from tsbatch.engine.evaluate import resolve_hw  # noqa: E402
from tsbatch.kernels.occupancy import resident_tiles  # noqa: E402
from tsbatch.kernels.reuse import cache_hit_rates  # noqa: E402
from tsbatch.boundary.schema import validate  # noqa: E402

SAMPLING = dict(k_samples=4, max_waves=8, max_lookback=4)


def cache_problems(rows: int, hw_name: str) -> tuple:
    """``cache_hit_rates``'s arguments for the feasible rows of the sample."""
    hw = resolve_hw(hw_name)
    cols, _ = validate(build_candidates(rows, seed=3), gemm.FAMILY)
    plan = gemm.lower(cols, hw)
    p, _ = resident_tiles(plan.smem_block, plan.regs_thread, plan.threads, hw)
    idx = np.flatnonzero(p > 0)
    n = idx.size
    conc = hw.sm_count * np.maximum(p, 1)
    cap2 = hw.l2_bytes * hw.cal("l2_capacity_fraction")
    g15 = hw.l15_group_sms if hw.has_l15 else 0
    return (plan.g0[idx], plan.g1[idx], plan.g2[idx], plan.order[idx], plan.group[idx],
            conc[idx], plan.ksteps[idx], plan.t_mask[idx], plan.t_per_step[idx],
            plan.t_bytes[idx], np.full(n, cap2), np.full(n, float(hw.l2_assoc)),
            np.full(n, hw.sm_count), np.full(n, g15), np.full(n, float(hw.l15_bytes)),
            np.full(n, float(hw.l15_assoc)))


def measure(args: tuple, reps: int) -> dict:
    n = args[0].shape[0]
    warm = tuple(a[:20] for a in args)
    for general in (False, True):
        cache_hit_rates(*warm, general=general, **SAMPLING)
    best = {False: np.inf, True: np.inf}
    out = {}
    for _ in range(reps):
        for general in (False, True):
            t = time.process_time()
            out[general] = cache_hit_rates(*args, general=general, **SAMPLING)
            best[general] = min(best[general], time.process_time() - t)
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(out[False], out[True]))
    return dict(problems=n, fast_us=1e6 * best[False] / n, general_us=1e6 * best[True] / n,
                ratio=best[True] / best[False], max_abs_diff=diff)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=3000)
    ap.add_argument("--hw", nargs="+", default=["h100", "a100"])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    numba.set_num_threads(min(a.threads, numba.config.NUMBA_NUM_THREADS))
    for hw in a.hw:
        r = measure(cache_problems(a.rows, hw), a.reps)
        print(f"{hw}: {r['problems']} cache problems  fast {r['fast_us']:.1f} us/problem  "
              f"general {r['general_us']:.1f} us/problem  general/fast {r['ratio']:.2f}x  "
              f"max |fast - general| {r['max_abs_diff']:.2g}")


if __name__ == "__main__":
    main()
