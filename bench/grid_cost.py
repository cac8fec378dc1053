"""Cost per row of large tile grids against small ones, measured in one run.

    python bench/grid_cost.py [--hw h100] [--rows 3000] [--reps 3] [--json OUT.json]

Draws candidates from ``bench/throughput.py``'s sweep (real LLM shapes x a
Triton-like schedule space), splits them by the tile grid a row launches
(``ceil(m / block_m) x ceil(n / block_n) x split_k`` tiles): *small* grids
have at most 32 x 32 = 1,024 tiles, *large* ones at least 64 x 64 = 4,096.
It evaluates ``--rows`` rows of each with the full model (cache model,
envelope, waves), alternating the two sets ``--reps`` times after a warm-up
so that both see the same machine load, and prints microseconds per row
for each, their ratio (the target is large / small <= 3), and the cache
problems per row and microseconds per cache problem behind them. Every
evaluation starts without a memo, so no set reuses the other's cache
problems.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from throughput import build_candidates  # noqa: E402

from tsbatch.engine.evaluate import evaluate, resolve_hw  # noqa: E402

SMALL_MAX = 32 * 32
LARGE_MIN = 64 * 64


def tile_grid(df: pl.DataFrame) -> np.ndarray:
    m, n = df["m"].to_numpy(), df["n"].to_numpy()
    bm, bn = df["block_m"].to_numpy(), df["block_n"].to_numpy()
    sk = df["split_k"].to_numpy() if "split_k" in df.columns else 1
    return -(-m // bm) * -(-n // bn) * sk


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hw", default="h100")
    ap.add_argument("--rows", type=int, default=3000, help="rows per set (default 3000)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    hw = resolve_hw(args.hw)

    pool = build_candidates(max(40 * args.rows, 200_000), seed=args.seed)
    tiles = tile_grid(pool)
    sets = {}
    for name, mask in (("small", tiles <= SMALL_MAX), ("large", tiles >= LARGE_MIN)):
        idx = np.flatnonzero(mask)
        if idx.size < args.rows:
            raise SystemExit(f"only {idx.size} {name}-grid rows in the pool; lower --rows")
        pick = np.random.default_rng(args.seed).choice(idx, args.rows, replace=False)
        sets[name] = pool[np.sort(pick)]

    for df in sets.values():  # warm-up: compile or load every kernel
        evaluate(df.head(200), hw)
    secs = {name: [] for name in sets}
    info = {}
    for _ in range(args.reps):
        for name, df in sets.items():
            timings: dict = {}
            t = time.perf_counter()
            res = evaluate(df, hw, timings=timings)
            secs[name].append(time.perf_counter() - t)
            info[name] = {
                "feasible_rows": int(res["feasible"].sum()),
                "cache_problems": int(timings.get("cache_problems", 0)),
                "cache_s": timings.get("cache_s", 0.0),
                "median_tiles": float(np.median(tile_grid(df))),
            }
    out = {"hw": hw.name, "rows_per_set": args.rows, "reps": args.reps}
    for name in sets:
        s = statistics.median(secs[name])
        cp = info[name]["cache_problems"]
        out[f"{name}_us_per_row"] = 1e6 * s / args.rows
        out[f"{name}_median_tiles"] = info[name]["median_tiles"]
        out[f"{name}_cache_problems_per_row"] = cp / args.rows
        out[f"{name}_cache_us_per_problem"] = 1e6 * info[name]["cache_s"] / max(cp, 1)
    out["large_over_small"] = out["large_us_per_row"] / out["small_us_per_row"]
    out["target_large_over_small_max"] = 3.0
    print(json.dumps(out, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
