"""Plain-Python twin of the α–β stage kernel (:mod:`tsbatch.kernels.alphabeta`).

One row at a time, straight from the plan's variants and their *unmerged*
stages: NCCL's selection time (with its tree correction factor), then Eq. 11
stage by stage (a pipelined variant's stages run concurrently: their link
loads add and their latencies add, one serialization of the summed loads).
"""

from __future__ import annotations

import math

from tsbatch.collectives.nccl import TREE_CORRECTION


def nccl_selection_us(var, nbytes: float) -> float:
    if nbytes > var.sel_max_bytes:
        return math.inf
    inv = var.sel_inv_bw
    if var.sel_tree >= 0:
        lg = 0
        x = nbytes / 64.0
        while x >= 2.0:
            x /= 2.0
            lg += 1
        row = TREE_CORRECTION[var.sel_tree]
        if lg < len(row):
            inv = inv / row[lg]
    return var.sel_lat_us + nbytes * inv


def nccl_channels(var, nbytes: float) -> int:
    """enqueue.cc's loop, literally: start from all channels, drop one while too few bytes."""
    nc = var.n_chan
    while nc >= 2 and nbytes < nc * var.chan_unit:
        nc -= 1
    return nc


def cost_line(var, nbytes: float):
    """The variant's line for this size: (stages, protocol efficiency, cap)."""
    if not var.lines:
        return var.stages, var.proto_eff, var.cap_gbps
    k = nccl_channels(var, nbytes) if math.isfinite(var.chan_unit) else 1
    burst = var.window_bytes > 0 and nbytes < var.window_bytes
    line = var.lines[(var.n_chan if burst else 0) + k - 1]
    return line.stages, line.proto_eff, line.cap_gbps


def link_bw(plan, var, link: int, bw_override: dict | None = None, eff=None, cap=None) -> float:
    bw = (bw_override or {}).get(link, plan.topology.bw[link])
    return min(bw * (var.proto_eff if eff is None else eff), var.cap_gbps if cap is None else cap)


def eq11_us(plan, var, nbytes: float, bw_override: dict | None = None) -> float:
    """Eq. 11 summed over the stages of the variant's line for this size (us)."""
    stages, eff, cap = cost_line(var, nbytes)
    t = var.base_us
    if var.pipelined:
        loads: dict = {}
        for s in stages:
            t += s.reps * s.alpha_us
            for lk, f in s.loads.items():
                loads[lk] = loads.get(lk, 0.0) + s.reps * f
        worst = 0.0
        for lk, f in loads.items():
            worst = max(worst, f * nbytes / (link_bw(plan, var, lk, bw_override, eff, cap) * 1e3))
        return t + worst
    for s in stages:
        worst = 0.0
        for lk, f in s.loads.items():
            worst = max(worst, f * nbytes / (link_bw(plan, var, lk, bw_override, eff, cap) * 1e3))
        t += s.reps * (s.alpha_us + worst)
    return t


def predict(plan, nbytes: float, bw_override: dict | None = None):
    """(latency us, variant) of one message size on one plan; (nan, None) if infeasible."""
    if not plan.variants:
        return math.nan, None
    best, best_v = math.inf, None
    for v in plan.variants:
        s = nccl_selection_us(v, nbytes)
        if s < best:
            best, best_v = s, v
    if best_v is None:  # none eligible by NCCL's rules: the first variant
        best_v = plan.variants[0]
    return eq11_us(plan, best_v, nbytes, bw_override), best_v
