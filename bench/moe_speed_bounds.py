"""Bounds of moe_grouped_gemm's rows/s against GEMM's (issue 35, docs/gemm_accuracy.md
"moe_grouped_gemm at GEMM's speed per row, session 12").

    NUMBA_NUM_THREADS=1 python bench/moe_speed_bounds.py [--hw h100,a100] [--rows 100000]
                                                         [--rounds 3] [--json OUT.json]

Issue 35 asks for no family slower than GEMM per row. This measures, on the
``bench/family_speed.py`` tables of ``gemm`` and ``moe_grouped_gemm`` (CPU seconds of
the process, min over ``--rounds`` rounds, the variants alternated within each round),
how far each part of MoE's work could take it:

* ``evaluate``: MoE / GEMM per row as it is, and with the cache model replaced by a
  stub that returns at once (``h15 = h2 = 0``, ``dram = 1``: every other stage unchanged),
  the ratio no change to the cache model can pass (its lowering, validation, envelope and
  assembly stay);
* the cache problems ``evaluate`` passes (captured once), timed by ``cache_hit_rates`` by
  subset (column raster, persistent raster) as they are, with the L1.5 tier off, and with
  the persistent raster's block-per-tile tensor ``W_other`` emulated away (its bytes
  merged into ``W``, rounded: the problem GEMM would have; these change the results,
  they are measurements of a bound only);
* per launch-wave bin, MoE's and GEMM's cost per problem, and MoE's cache time priced at
  GEMM's cost per problem of the same bin (what MoE would cost if each of its problems
  cost what a GEMM problem of as many waves does).

The allocator thresholds are raised in this process (``MALLOC_*``: a fresh process
otherwise spends most of a cache call in page faults, docs "MoE's cache problems,
session 8"); run with ``NUMBA_NUM_THREADS=1`` so that CPU seconds are one thread's
(the cache model's shares are balanced: the 2-thread CPU is the same within noise).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

_MALLOC = {"MALLOC_MMAP_THRESHOLD_": "1073741824", "MALLOC_TRIM_THRESHOLD_": "4294967296",
           "MALLOC_TOP_PAD_": "268435456"}
if any(os.environ.get(k) != v for k, v in _MALLOC.items()):  # glibc reads them at start
    os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **_MALLOC})

import numpy as np  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

FAMILIES = ("gemm", "moe_grouped_gemm")
ORDER_COL, ORDER_PERSISTENT = 1, 4
#: launch-wave bins of the per-problem table: (lo, hi]
BINS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 1 << 62)


def cpu_min(fn, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        c0 = time.process_time()
        fn()
        best = min(best, time.process_time() - c0)
    return best


def _sub(args: tuple, idx: np.ndarray) -> tuple:
    return tuple(a[idx] if isinstance(a, np.ndarray) else a for a in args)


def capture(evaluate_mod, table, hw, family: str):
    """The ``cache_hit_rates`` call(s) of ``evaluate(table, hw, family)``: (args, kwargs)."""
    got = []
    real = evaluate_mod.cache_hit_rates

    def spy(*a, **k):
        got.append((a, k))
        return real(*a, **k)

    evaluate_mod.cache_hit_rates = spy
    try:
        evaluate_mod.evaluate(table, hw, family=family)
    finally:
        evaluate_mod.cache_hit_rates = real
    if len(got) != 1:
        raise SystemExit(f"{family} on {hw}: {len(got)} cache calls, expected one")
    return got[0]


def measure(hw: str, rows: int, rounds: int, log) -> dict:
    import tsbatch.engine.evaluate as ev
    from family_speed import family_table
    from tsbatch.kernels.reuse import cache_hit_rates

    tables = {f: family_table(f, rows) for f in FAMILIES}
    for f, t in tables.items():  # load / compile
        ev.evaluate(t.head(2000), hw, family=f)
    out: dict = {"hw": hw, "rows": rows}

    # ---- whole evaluate, as it is and with the cache model a stub
    real = ev.cache_hit_rates

    def stub(g0, *a, **k):
        n, t = len(g0), a[6].shape[1]
        return np.zeros((n, t)), np.zeros((n, t)), np.ones((n, t))

    cpu = {}
    for _ in range(rounds):
        for mode, fn in (("real", real), ("stub", stub)):
            ev.cache_hit_rates = fn
            try:
                for f, t in tables.items():
                    c = cpu_min(lambda: ev.evaluate(t, hw, family=f), 1)
                    cpu[(mode, f)] = min(cpu.get((mode, f), float("inf")), c)
            finally:
                ev.cache_hit_rates = real
    for mode in ("real", "stub"):
        g, m = cpu[(mode, "gemm")], cpu[(mode, "moe_grouped_gemm")]
        out[f"evaluate_{mode}"] = {"gemm_s": g, "moe_s": m, "moe_over_gemm": g / m}
        log(f"{hw}: evaluate, cache model {mode:4s}: GEMM {g:.3f} s, MoE {m:.3f} s CPU per "
            f"{rows:,} rows; MoE/GEMM per row {g / m:.2f}")

    # ---- the cache problems by subset
    caps = {f: capture(ev, tables[f], hw, f) for f in FAMILIES}
    (ma, mk), (ga, gk) = caps["moe_grouped_gemm"], caps["gemm"]
    order = ma[3]
    sets = {"moe all": np.arange(order.shape[0]), "moe col": np.flatnonzero(order == ORDER_COL),
            "moe persistent": np.flatnonzero(order == ORDER_PERSISTENT)}
    variants = {}
    for name, idx in sets.items():
        a = _sub(ma, idx)
        variants[(name, "as is")] = (a, mk)
        a15 = list(a)
        a15[14] = np.zeros_like(a15[14])  # cap15 = 0: no L1.5 tier
        variants[(name, "L1.5 off")] = (tuple(a15), mk)
    pers = _sub(ma, sets["moe persistent"])
    tb = pers[9].copy()
    tb[:, 2] = np.round(tb[:, 2] + tb[:, 3])  # W_other's bytes into W (GEMM's problem)
    tb[:, 3] = 0.0
    merged = list(pers)
    merged[9] = tb
    variants[("moe persistent", "W_other merged into W")] = (tuple(merged), mk)
    variants[("gemm all", "as is")] = (ga, gk)
    g15 = list(ga)
    g15[14] = np.zeros_like(g15[14])
    variants[("gemm all", "L1.5 off")] = (tuple(g15), gk)
    times: dict = {}
    for _ in range(rounds):
        for key, (a, k) in variants.items():
            c = cpu_min(lambda: cache_hit_rates(*a, **k), 1)
            times[key] = min(times.get(key, float("inf")), c)
    out["cache"] = []
    for (name, var), c in times.items():
        n = variants[(name, var)][0][0].shape[0]
        out["cache"].append({"subset": name, "variant": var, "problems": n, "cpu_s": c})
        log(f"{hw}: cache problems {name:15s} {var:22s} {n:6,d} problems {c:.3f} s "
            f"({1e6 * c / max(n, 1):.1f} us each)")

    # ---- per launch-wave bin: cost per problem, and MoE priced at GEMM's
    def waves(a):
        return -(-(a[0] * a[1] * a[2]) // np.maximum(a[5], 1))

    wm, wg = waves(ma), waves(ga)
    out["bins"] = []
    priced = 0.0
    for lo, hi in zip(BINS[:-1], BINS[1:]):
        im = np.flatnonzero((wm > lo) & (wm <= hi))
        ig = np.flatnonzero((wg > lo) & (wg <= hi))
        cm = cpu_min(lambda: cache_hit_rates(*_sub(ma, im), **mk), rounds) if im.size else 0.0
        cg = cpu_min(lambda: cache_hit_rates(*_sub(ga, ig), **gk), rounds) if ig.size else 0.0
        per_m = cm / im.size if im.size else float("nan")
        per_g = cg / ig.size if ig.size else float("nan")
        if im.size and ig.size:
            priced += im.size * per_g
        out["bins"].append({"waves": [lo, hi], "moe_problems": int(im.size), "moe_us": 1e6 * per_m,
                            "gemm_problems": int(ig.size), "gemm_us": 1e6 * per_g})
        log(f"{hw}: waves ({lo}, {hi if hi < BINS[-1] else 'inf'}]: MoE {im.size:5,d} problems "
            f"{1e6 * per_m:5.1f} us each, GEMM {ig.size:5,d} problems {1e6 * per_g:5.1f} us each")
    out["moe_cache_at_gemm_cost_per_bin_s"] = priced
    log(f"{hw}: MoE's problems at GEMM's cost per problem of their wave bin: {priced:.3f} s "
        f"(as they are: {times[('moe all', 'as is')]:.3f} s; GEMM's own: "
        f"{times[('gemm all', 'as is')]:.3f} s)")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hw", default="h100,a100")
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    res = [measure(hw.strip(), args.rows, args.rounds, lambda s: print(s, flush=True))
           for hw in args.hw.split(",") if hw.strip()]
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
