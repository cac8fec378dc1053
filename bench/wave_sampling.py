"""Error and cost of the cache model's wave sampling against analysing every wave.

    python bench/wave_sampling.py [--hw h100] [--rows 2000] [--samples 8,6,4] [--json OUT.json]

Launches with more waves than ``wave_samples`` have only some waves
analysed (the first, the last and evenly spaced interior ones; each
interior one stands for its share of the interior waves). This draws
``--rows`` large-grid candidates (>= 64 x 64 tiles) from
``bench/throughput.py``'s sweep, solves their cache problems with every
wave analysed and with each ``--samples`` setting, and prints, per setting,
microseconds per cache problem and the error of the DRAM share of the
per-step bytes (absolute: mean, 95th percentile, max; relative: 95th
percentile) and of the L1.5 miss share, against the exhaustive result.
``--unweighted`` also runs the estimator without interior weights (every
analysed wave counted once), for comparison.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grid_cost import LARGE_MIN, tile_grid  # noqa: E402
from throughput import build_candidates  # noqa: E402

from tsbatch.engine import evaluate as ev  # noqa: E402
from tsbatch.kernels import reuse  # noqa: E402


def cache_problems(df, hw):
    """The distinct cache problems of ``df``'s feasible rows, as evaluate builds them."""
    got = {}
    orig = ev.cache_hit_rates

    def spy(*args, **kw):
        got["args"] = args
        return orig(*args, **kw)

    ev.cache_hit_rates = spy
    try:
        ev.evaluate(df, hw)
    finally:
        ev.cache_hit_rates = orig
    return got["args"]


def shares(res, args):
    tb = np.asarray(args[9], dtype=float) * np.asarray(args[8])
    tot = tb.sum(axis=1)
    return (res[2] * tb).sum(axis=1) / tot, ((1.0 - res[0]) * tb).sum(axis=1) / tot


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hw", default="h100")
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--samples", default="8,6,4")
    ap.add_argument("--unweighted", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    hw = ev.resolve_hw(args.hw)
    pool = build_candidates(max(40 * args.rows, 200_000), seed=args.seed)
    idx = np.flatnonzero(tile_grid(pool) >= LARGE_MIN)
    pick = np.random.default_rng(args.seed).choice(idx, min(args.rows, idx.size), replace=False)
    cargs = cache_problems(pool[np.sort(pick)], hw)
    n = len(cargs[0])
    print(f"{n} cache problems ({hw.name})", file=sys.stderr)

    def solve(mw, weighted=True):
        t = time.perf_counter()
        r = reuse.cache_hit_rates(*cargs, k_samples=4, max_waves=mw, max_lookback=4,
                                  interior_weights=weighted)
        return r, 1e6 * (time.perf_counter() - t) / n

    solve(4)  # compile / load
    ref, ref_us = solve(1 << 30)
    d_ref, m_ref = shares(ref, cargs)
    out = {"hw": hw.name, "cache_problems": n, "exhaustive_us_per_problem": ref_us, "settings": []}
    runs = [(int(s), True) for s in args.samples.split(",")]
    if args.unweighted:
        runs += [(int(s), False) for s in args.samples.split(",")]
    for mw, weighted in runs:
        r, us = solve(mw, weighted)
        d, m = shares(r, cargs)
        e = np.abs(d - d_ref)
        row = {"wave_samples": mw, "interior_weights": weighted, "us_per_problem": us,
               "dram_share_err_mean": float(e.mean()),
               "dram_share_err_p95": float(np.quantile(e, 0.95)),
               "dram_share_err_max": float(e.max()),
               "dram_share_signed_err_mean": float((d - d_ref).mean()),
               "dram_share_rel_err_p95": float(np.quantile(e / np.maximum(d_ref, 1e-3), 0.95)),
               "l15_miss_share_err_p95": float(np.quantile(np.abs(m - m_ref), 0.95))}
        out["settings"].append(row)
    print(json.dumps(out, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
