"""Simulation speed of the tile-graph simulator: a 4096^3 GEMM on A100 (issue 5).

Prints graph-construction time, physical and logical node counts, events,
L2 line accesses and the simulated-kernels-per-second figure (target: under
two seconds per kernel). The first call compiles (numba, cached on disk);
the figure is the best of ``--repeat`` warm runs.

Usage::

    python bench/sim_speed.py [--hw a100] [--size 4096] [--block 128 128 32] [--stages 4] [--warps 4]
"""

from __future__ import annotations

import argparse
import time

from tsbatch.hw import get_hw
from tsbatch.sim.api import config_graph
from tsbatch.sim.engine import simulate
from tsbatch.sim.machine import machine_from_hw


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hw", default="a100")
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--block", type=int, nargs=3, default=[128, 128, 32])
    ap.add_argument("--stages", type=int, default=4)
    ap.add_argument("--warps", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    s = args.size
    cfg = {"m": s, "n": s, "k": s, "dtype": "float16", "block_m": args.block[0], "block_n": args.block[1],
           "block_k": args.block[2], "num_stages": args.stages, "num_warps": args.warps, "group_m": 8}
    spec = get_hw(args.hw)
    t0 = time.perf_counter()
    g = config_graph(cfg, spec)
    t_build = time.perf_counter() - t0
    m = machine_from_hw(spec)
    t0 = time.perf_counter()
    res = simulate(g, m)
    t_first = time.perf_counter() - t0
    times = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        res = simulate(g, m)
        times.append(time.perf_counter() - t0)
    best = min(times)
    print(f"{spec.name}: {s}^3 fp16 GEMM, tile {args.block}, stages {args.stages}, warps {args.warps}")
    print(f"graph: {g.n_nodes} physical nodes ({g.n_edges} edges) x {g.n_ctas} CTAs = "
          f"{g.n_logical_nodes:,} logical nodes, built in {t_build * 1e3:.1f} ms")
    print(f"events {res.n_events:,}, L2 line accesses {res.l2_load_lines:,}, predicted {res.latency_us:.1f} us "
          f"({2 * s ** 3 / res.latency_us / 1e6:.0f} TFLOP/s), L2 hit {res.l2_hit:.3f}")
    print(f"first call (incl. compile/cache load) {t_first:.2f} s; warm runs {', '.join(f'{t:.2f}' for t in times)} s")
    print(f"simulation speed: {best:.2f} s per kernel = {1.0 / best:.2f} simulated kernels per second "
          f"(target < 2 s per kernel: {'met' if best < 2.0 else 'NOT met'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
