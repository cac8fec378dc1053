"""Event-driven execution of a tile graph (GTSim §5), as a numba kernel.

Public entry: :func:`simulate` (checks, prepares arrays, runs
:func:`_run`, wraps the result). The semantics, shared exactly by the
plain-Python twin ``tests/naive_sim.py``:

* **Threadblock scheduler.** ``R = residency(...)`` slots per SM; slot ``s``
  lives on SM ``s % sm_count``. CTAs are launched in grid order: CTA ``i < S``
  into slot ``i`` at ``cta_launch_clk``; when a slot's CTA retires at ``t``
  the next CTA enters it at ``t + cta_launch_clk``.
* **Readiness.** Every node holds a counter of unresolved incoming edges.
  Order edges are released when their source *issues*, data edges when it
  *completes*. A node whose counter reaches zero at ``t`` is ready at ``t``.
* **Issue.** A ready node waits in the FIFO ready queue of the
  sub-partitions of its warps and holds their issue slots for ``issue_clk``.
  Warp ``w`` of the CTA in slot ``s`` runs on sub-partition
  ``(r * warps_per_cta + w) % n_subpartitions`` with ``r = s // sm_count``
  (the slot's rank on its SM): an SM numbers the warps of its resident CTAs
  consecutively and deals them to the schedulers round robin, so two
  2-warp CTAs on one SM use all four sub-partitions (a warp group spans all
  four whatever its rank);
  ``issue = max(ready, port_free)``. FIFO order = event order (time, then
  insertion sequence): greedy-then-oldest.
* **Compute** (tensor / CUDA / SFU): per-sub-partition FIFO servers; a node
  split over its sub-partitions starts when all are free and occupies them
  for ``work / (n_sp * rate_per_sp)``; done ``+ latency``. Shared memory is
  one per-SM server.
* **Memory.** A load/store node expands its tile descriptor into lines
  (clipped to the tensor). On a GPU with an L1.5 tier (Hopper: one cache
  per group of ``l15_group_sms`` consecutive SMs) every line of a *load*
  is first looked up in its SM group's L1.5 (exact LRU, hashed sets);
  L1.5 misses, and every line of a store, are looked up in the exact LRU
  L2 (``tsbatch.sim.l2``: hashed sets, LRU within a set). The transfer
  passes the per-SM engine (TMA at the calibrated issue rate, or the LSU
  for cp.async/st.global; all bytes), the group's L1.5 server (loads, all
  bytes), the chip-wide L2 server (the bytes of the lines that reached
  L2) and, for L2 misses (whole lines) and all stores (written back), the
  DRAM server. Each server is a FIFO bandwidth server
  (``start = max(arrival, free)``) with separate read and write queues
  (engine lanes, L2 and DRAM): a store never waits behind loads issued
  before it, nor a load behind stores (with reservations in issue order, a
  shared queue would make a store wait for every load issued ahead of need,
  which a memory controller does not do; the price is that reads and
  writes together may exceed the DRAM bandwidth). The stages stream (a
  stage starts no earlier than the one before it) and the node completes
  after the slowest stage plus the L2 latency (an L1.5 hit is charged the
  same, the hardware files give no separate figure) and, for a load with
  an L2 miss, the DRAM latency.
* **Sync** nodes take no resource: they complete ``work`` cycles after issue.

All times are float64 cycles; no fastmath, so the numba kernel and its
twin agree bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tsbatch.kernels._config import jit_exact, jit_exact_inline

from tsbatch.errors import InputError
from tsbatch.sim.graph import OP_RESOURCE, OPS, RESOURCES, TileGraph
from tsbatch.sim.l2 import l15_new, lru_access, lru_new
from tsbatch.sim.machine import Machine, residency

__all__ = ["SimResult", "simulate", "prepare"]

R_NONE, R_TC, R_CUDA, R_SFU, R_SMEM, R_TMA, R_LSU = range(7)
EV_ISSUE, EV_COMPLETE, EV_LAUNCH = 0, 1, 2
BIND_DATA, BIND_ORDER, BIND_LAUNCH = 0, 1, 2
_STORE = np.array([0, 0, 0, 0, 0, 0, 1, 1, 0], dtype=np.int8)


@dataclass(frozen=True)
class SimResult:
    """Outcome of one simulated kernel.

    Attributes
    ----------
    cycles : float
        Kernel duration in SM cycles (launch of the first CTA to retirement of
        the last).
    latency_us : float
        ``cycles / clock`` plus the kernel launch overhead.
    busy_clk : dict
        Busy time per resource; compute resources in sub-partition-cycles,
        engines in SM-cycles, ``l2``/``dram`` in chip-cycles.
    utilization : dict
        Busy time over the capacity of the resource during ``cycles``.
    l2_hit : float
        Fraction of the loaded lines that reached the L2 (L1.5 misses) and
        hit there.
    l2_load_lines, l2_hit_lines : int
    l15_hit : float
        Fraction of loaded lines that hit in the L1.5 tier (0 without one).
    l15_load_lines, l15_hit_lines : int
    dram_read_bytes, dram_write_bytes : float
    resident_ctas : int
        CTAs per SM (slots).
    fits : bool
        False when one CTA exceeds an SM's limits (simulated with 1 slot).
    n_events : int
    cta_end : ndarray
        Retirement time (cycles) of every simulated CTA, in launch order.
    record : dict or None
        Per-logical-node times when ``record=True`` (see :func:`simulate`).
    """

    cycles: float
    latency_us: float
    busy_clk: dict
    utilization: dict
    l2_hit: float
    l2_load_lines: int
    l2_hit_lines: int
    dram_read_bytes: float
    dram_write_bytes: float
    resident_ctas: int
    fits: bool
    n_events: int
    l15_hit: float = 0.0
    l15_load_lines: int = 0
    l15_hit_lines: int = 0
    cta_end: np.ndarray | None = None
    record: dict | None = None


def prepare(graph: TileGraph, m: Machine):
    """Per-node resource, sub-partition mask, service time and latency.

    Returns ``(res, mask, dur, lat)``: ``dur`` is the occupancy of the
    node's server in cycles for compute/smem nodes and the fixed delay of
    sync nodes; memory nodes get their time from the tile at run time.
    """
    n = graph.n_nodes
    nsp = m.n_subpartitions
    res = OP_RESOURCE[graph.op].astype(np.int32)
    mma = graph.op == OPS.index("mma")
    if graph.mma_kind == "fma":
        res[mma] = R_CUDA
    mask = np.zeros(n, dtype=np.int32)
    nsp_used = np.zeros(n, dtype=np.int32)
    for v in range(n):
        bits = 0
        for w in range(graph.warp0[v], graph.warp0[v] + graph.n_warps[v]):
            bits |= 1 << (w % nsp)
        mask[v] = bits
        nsp_used[v] = bin(bits).count("1")
    tc_rate = m.tc_rate(graph.mma_dtype, graph.mma_kind) if mma.any() else 1.0
    per_sp = np.zeros(7, dtype=np.float64)
    per_sp[R_TC] = tc_rate / nsp
    per_sp[R_CUDA] = m.cuda_op_per_clk / nsp
    per_sp[R_SFU] = m.sfu_op_per_clk / nsp
    lat_of = np.array([0.0, m.tc_latency_clk, m.alu_latency_clk, m.sfu_latency_clk,
                       m.smem_latency_clk, 0.0, 0.0])
    dur = np.zeros(n, dtype=np.float64)
    lat = np.zeros(n, dtype=np.float64)
    for v in range(n):
        r = res[v]
        w = graph.work[v]
        if r == R_CUDA and mma[v]:
            w = w / 2.0  # FMA = 2 FLOP on one CUDA-core lane
        if r in (R_TC, R_CUDA, R_SFU):
            dur[v] = w / (nsp_used[v] * per_sp[r])
        elif r == R_SMEM:
            dur[v] = w / m.smem_bytes_per_clk
        elif r == R_NONE:
            dur[v] = w
        lat[v] = lat_of[r]
    return res, mask, dur, lat


def simulate(graph: TileGraph, machine: Machine, *, record: bool = False,
             max_ctas: int | None = None) -> SimResult:
    """Run a tile graph on a machine.

    Parameters
    ----------
    graph : TileGraph
    machine : Machine
    record : bool
        Keep per-logical-node times (``t_ready``, ``t_issue``, ``t_start``,
        ``t_end``), the binding predecessor of each node, the previous
        occupant of its server, and the SM/slot of every CTA (for the
        summary, the Gantt chart, the Chrome trace and the critical path).
    max_ctas : int, optional
        Simulate only the first CTAs of the grid (a prefix in launch order).

    Returns
    -------
    SimResult

    Notes
    -----
    GTSim §5. Isomorphic CTAs: the template is stored once; per-CTA state is
    the slot's counter row, so memory is ``O(slots x nodes)``.
    """
    if not isinstance(graph, TileGraph):
        raise InputError(f"simulate needs a TileGraph, got {type(graph).__name__}")
    n = graph.n_nodes
    r = residency(machine, graph.warps_per_cta, graph.smem_bytes_per_cta, graph.regs_per_thread)
    fits = r > 0
    r = max(r, 1)
    cta_m, cta_n = graph.cta_m, graph.cta_n
    if max_ctas is not None:
        cta_m, cta_n = cta_m[:max_ctas], cta_n[:max_ctas]
    n_ctas = int(cta_m.shape[0])
    res, mask, dur, lat = prepare(graph, machine)
    t_rows = np.array([t.rows for t in graph.tensors], dtype=np.int64)
    t_cols = np.array([t.cols for t in graph.tensors], dtype=np.int64)
    t_eb = np.array([t.elem_bytes for t in graph.tensors], dtype=np.int64)
    t_rm = np.array([1 if t.row_major else 0 for t in graph.tensors], dtype=np.int64)
    line = machine.l2_line_bytes
    t_base = np.zeros(len(graph.tensors), dtype=np.int64)
    off = 0
    for i in range(len(graph.tensors)):
        t_base[i] = off
        size = int(t_rows[i] * t_cols[i] * t_eb[i])
        off += -(-size // line) * line + line
    if off // line >= 2 ** 31 - 1:
        raise InputError(f"graph {graph.name!r}: tensors span {off / 2 ** 30:.0f} GiB, more than the "
                         f"cache model's 32-bit line numbers address ({(2 ** 31 - 1) * line / 2 ** 30:.0f} GiB)")
    if t_rows.size == 0:
        t_rows = t_cols = t_eb = t_rm = t_base = np.zeros(1, dtype=np.int64)
    n_rec = n_ctas * n if record else 0
    rec_f = np.zeros((4, n_rec), dtype=np.float64)
    rec_i = np.full((3, n_rec), -1, dtype=np.int64)
    cta_slot = np.full(n_ctas if record else 0, -1, dtype=np.int64)
    lru = lru_new(machine.l2_lines, machine.l2_assoc)
    g15 = machine.l15_group_sms if machine.l15_lines > 0 else 0
    n_groups = -(-machine.sm_count // g15) if g15 else 1
    t15, m15 = l15_new(n_groups, machine.l15_lines if g15 else 1, machine.l15_assoc if g15 else 1)
    r15 = np.zeros(n_groups, dtype=np.float64)
    for gi in range(n_groups if g15 else 0):
        r15[gi] = machine.l15_bytes_per_clk * min(g15, machine.sm_count - gi * g15)
    fparams = np.array([
        machine.issue_clk, machine.cta_launch_clk, machine.tma_bytes_per_clk,
        machine.lsu_bytes_per_clk, machine.l2_bytes_per_clk, machine.dram_bytes_per_clk,
        machine.l2_hit_latency_clk, machine.dram_extra_latency_clk,
    ], dtype=np.float64)
    iparams = np.array([machine.sm_count, r, machine.n_subpartitions, line, 1 if record else 0, g15],
                       dtype=np.int64)
    # sub-partition masks per rotation (the slot's first warp modulo n_subpartitions)
    nsp = machine.n_subpartitions
    full = (1 << nsp) - 1
    mask_rot = np.empty((nsp, n), dtype=np.int32)
    for k in range(nsp):
        mask_rot[k] = ((mask << k) | (mask >> (nsp - k))) & full if k else mask
    slot_rot = ((np.arange(machine.sm_count * r, dtype=np.int64) // machine.sm_count)
                * graph.warps_per_cta) % nsp
    busy = np.zeros(10, dtype=np.float64)
    stats = np.zeros(8, dtype=np.float64)
    cta_end = np.zeros(n_ctas, dtype=np.float64)
    _run(
        res, mask_rot, slot_rot, dur, lat, _STORE[graph.op], graph.tensor, graph.tile_rows, graph.tile_cols,
        graph.coord, graph.succ_ptr, graph.succ_idx, graph.succ_kind, graph.n_pred,
        t_rows, t_cols, t_eb, t_rm, t_base, cta_m.astype(np.int64), cta_n.astype(np.int64),
        fparams, iparams, *lru, t15, m15, r15, busy, stats, rec_f, rec_i, cta_slot, cta_end,
    )
    cycles = float(stats[0])
    sm, nsp = machine.sm_count, machine.n_subpartitions
    names = ("tensor", "cuda", "sfu", "smem", "tma", "lsu", "l2", "dram", "l15")
    busy_d = {k: float(busy[i + 1]) for i, k in enumerate(names)}
    cap = {"tensor": sm * nsp, "cuda": sm * nsp, "sfu": sm * nsp, "smem": sm, "tma": sm, "lsu": sm,
           "l2": 1, "dram": 1, "l15": n_groups}
    util = {k: (busy_d[k] / (cycles * cap[k]) if cycles > 0 else 0.0) for k in names}
    loads = int(stats[1])
    hits = int(stats[2])
    loads15 = int(stats[6])
    hits15 = int(stats[7])
    rec = None
    if record:
        rec = {
            "t_ready": rec_f[0].reshape(n_ctas, n), "t_issue": rec_f[1].reshape(n_ctas, n),
            "t_start": rec_f[2].reshape(n_ctas, n), "t_end": rec_f[3].reshape(n_ctas, n),
            "bind_pred": rec_i[0].reshape(n_ctas, n), "bind_kind": rec_i[1].reshape(n_ctas, n),
            "res_prev": rec_i[2].reshape(n_ctas, n), "cta_slot": cta_slot,
            "res": res, "sm_count": sm, "resident": r,
        }
    return SimResult(
        cycles=cycles,
        latency_us=cycles / machine.clock_mhz + machine.launch_overhead_us,
        busy_clk=busy_d,
        utilization=util,
        l2_hit=hits / loads if loads else 0.0,
        l2_load_lines=loads,
        l2_hit_lines=hits,
        dram_read_bytes=float(stats[3]),
        dram_write_bytes=float(stats[4]),
        resident_ctas=r,
        fits=fits,
        n_events=int(stats[5]),
        l15_hit=hits15 / loads15 if loads15 else 0.0,
        l15_load_lines=loads15,
        l15_hit_lines=hits15,
        cta_end=cta_end,
        record=rec,
    )


# ---------------------------------------------------------------------------
# event heap keyed by (time, sequence)


@jit_exact
def _hpush(ht, hs, hk, hl, hn, hmeta, t, kind, slot, node):
    i = hmeta[0]
    seq = hmeta[1]
    hmeta[0] = i + 1
    hmeta[1] = seq + 1
    while i > 0:
        p = (i - 1) >> 1
        if ht[p] < t or (ht[p] == t and hs[p] < seq):
            break
        ht[i] = ht[p]
        hs[i] = hs[p]
        hk[i] = hk[p]
        hl[i] = hl[p]
        hn[i] = hn[p]
        i = p
    ht[i] = t
    hs[i] = seq
    hk[i] = kind
    hl[i] = slot
    hn[i] = node


@jit_exact
def _hpop(ht, hs, hk, hl, hn, hmeta):
    """Remove the minimum; returns (time, kind, slot, node)."""
    t0 = ht[0]
    k0 = hk[0]
    l0 = hl[0]
    n0 = hn[0]
    size = hmeta[0] - 1
    hmeta[0] = size
    if size > 0:
        t = ht[size]
        s = hs[size]
        k = hk[size]
        l = hl[size]
        nn = hn[size]
        i = 0
        while True:
            c = 2 * i + 1
            if c >= size:
                break
            if c + 1 < size and (ht[c + 1] < ht[c] or (ht[c + 1] == ht[c] and hs[c + 1] < hs[c])):
                c += 1
            if t < ht[c] or (t == ht[c] and s < hs[c]):
                break
            ht[i] = ht[c]
            hs[i] = hs[c]
            hk[i] = hk[c]
            hl[i] = hl[c]
            hn[i] = hn[c]
            i = c
        ht[i] = t
        hs[i] = s
        hk[i] = k
        hl[i] = l
        hn[i] = nn
    return t0, k0, l0, n0


@jit_exact_inline
def _reserve_issue(mask_u, now, sm, nsp, issue_clk, port_free):
    """Issue time of a node ready at ``now``: the latest free issue port among
    its sub-partitions (bits of ``mask_u``), which it then holds ``issue_clk``."""
    t_iss = now
    for sp in range(nsp):
        if (mask_u >> sp) & 1:
            if port_free[sm * nsp + sp] > t_iss:
                t_iss = port_free[sm * nsp + sp]
    for sp in range(nsp):
        if (mask_u >> sp) & 1:
            port_free[sm * nsp + sp] = t_iss + issue_clk
    return t_iss


@jit_exact
def _release(v, edge_kind, bind, now, slot, cta, base, n, sm, nsp, issue_clk, mask, succ_ptr,
             succ_idx, succ_kind, rem, port_free, recording, rec_f, rec_i,
             ht, hs, hk, hl, hn, hmeta, rk):
    """Release ``v``'s out-edges of one kind; a successor whose last
    predecessor this was is issued on the first free issue port of its
    sub-partitions (``bind`` records which edge bound it)."""
    for e in range(succ_ptr[v], succ_ptr[v + 1]):
        if succ_kind[e] != edge_kind:
            continue
        u = succ_idx[e]
        rem[base + u] -= 1
        if rem[base + u] == 0:
            t_iss = _reserve_issue(mask[rk, u], now, sm, nsp, issue_clk, port_free)
            if recording:
                g = cta * n + u
                rec_f[0, g] = now
                rec_f[1, g] = t_iss
                rec_i[0, g] = v
                rec_i[1, g] = bind
            _hpush(ht, hs, hk, hl, hn, hmeta, t_iss, EV_ISSUE, slot, u)


# ---------------------------------------------------------------------------


@jit_exact
def _run(res, mask, slot_rot, dur, lat, is_store, tensor, tile_rows, tile_cols, coord,
         succ_ptr, succ_idx, succ_kind, n_pred,
         t_rows, t_cols, t_eb, t_rm, t_base, cta_m, cta_n,
         fparams, iparams, ltags, lmeta, t15, m15, r15,
         busy, stats, rec_f, rec_i, cta_slot, cta_end):
    """The event loop. Fills ``busy`` (per resource), ``stats``, the
    retirement time of every CTA and the records.

    ``stats = [cycles, l2_load_lines, l2_hit_lines, dram_read_bytes,
    dram_write_bytes, n_events, l15_load_lines, l15_hit_lines]``; ``busy``
    is indexed by resource code with ``busy[7] = l2``, ``busy[8] = dram``
    and ``busy[9] = l15``. ``t15``/``m15`` hold one L1.5 cache per SM group
    (``iparams[5]`` SMs each, 0: no L1.5 tier), ``r15`` their rates.
    """
    issue_clk = fparams[0]
    launch_clk = fparams[1]
    tma_rate = fparams[2]
    lsu_rate = fparams[3]
    l2_rate = fparams[4]
    dram_rate = fparams[5]
    l2_lat = fparams[6]
    dram_lat = fparams[7]
    n_sm = iparams[0]
    per_sm = iparams[1]
    nsp = iparams[2]
    line = iparams[3]
    recording = iparams[4] == 1
    g15 = iparams[5]
    sz15 = m15[0] * m15[1]
    n = res.shape[0]
    n_ctas = cta_m.shape[0]
    n_slots = n_sm * per_sm

    rem = np.zeros(n_slots * n, dtype=np.int32)
    left = np.zeros(n_slots, dtype=np.int64)
    slot_cta = np.full(n_slots, -1, dtype=np.int64)
    port_free = np.zeros(n_sm * nsp, dtype=np.float64)
    comp_free = np.zeros((4, n_sm * nsp), dtype=np.float64)   # index by resource 1..3
    comp_last = np.full((4, n_sm * nsp), -1, dtype=np.int64)
    smem_free = np.zeros(n_sm, dtype=np.float64)
    smem_last = np.full(n_sm, -1, dtype=np.int64)
    # engine lanes: 0 = TMA load, 1 = LSU load, 2 = TMA store, 3 = LSU store
    eng_free = np.zeros((4, n_sm), dtype=np.float64)
    eng_last = np.full((4, n_sm), -1, dtype=np.int64)
    l2_free = np.zeros(2, dtype=np.float64)     # read path, write path
    dram_free = np.zeros(2, dtype=np.float64)   # read path, write path
    l15_free = np.zeros(r15.shape[0], dtype=np.float64)
    roots = np.empty(n, dtype=np.int64)
    n_roots = 0
    for v in range(n):
        if n_pred[v] == 0:
            roots[n_roots] = v
            n_roots += 1

    cap = n_slots * n + n_slots + 16
    ht = np.empty(cap, dtype=np.float64)
    hs = np.empty(cap, dtype=np.int64)
    hk = np.empty(cap, dtype=np.int32)
    hl = np.empty(cap, dtype=np.int64)
    hn = np.empty(cap, dtype=np.int64)
    hmeta = np.zeros(2, dtype=np.int64)

    next_cta = 0
    for s in range(n_slots):
        if next_cta < n_ctas:
            _hpush(ht, hs, hk, hl, hn, hmeta, launch_clk, EV_LAUNCH, s, next_cta)
            next_cta += 1
    t_end = 0.0
    n_events = 0
    load_lines = 0
    hit_lines = 0
    l15_lines = 0
    l15_hits = 0
    dram_rd = 0.0
    dram_wr = 0.0

    while hmeta[0] > 0:
        now, kind, slot, v = _hpop(ht, hs, hk, hl, hn, hmeta)
        n_events += 1
        sm = slot % n_sm
        if kind == EV_LAUNCH:
            cta = v
            slot_cta[slot] = cta
            left[slot] = n
            base = slot * n
            for u in range(n):
                rem[base + u] = n_pred[u]
            if recording:
                cta_slot[cta] = slot
            for ri in range(n_roots):
                u = roots[ri]
                # ready at now: reserve issue slots of its sub-partitions
                t_iss = _reserve_issue(mask[slot_rot[slot], u], now, sm, nsp, issue_clk, port_free)
                if recording:
                    g = cta * n + u
                    rec_f[0, g] = now
                    rec_f[1, g] = t_iss
                    rec_i[0, g] = -1
                    rec_i[1, g] = BIND_LAUNCH
                _hpush(ht, hs, hk, hl, hn, hmeta, t_iss, EV_ISSUE, slot, u)
            continue

        cta = slot_cta[slot]
        base = slot * n
        if kind == EV_ISSUE:
            # release order edges at issue
            _release(v, 1, BIND_ORDER, now, slot, cta, base, n, sm, nsp, issue_clk, mask,
                     succ_ptr, succ_idx, succ_kind, rem, port_free, recording, rec_f, rec_i,
                     ht, hs, hk, hl, hn, hmeta, slot_rot[slot])
            # dispatch
            r = res[v]
            start = now
            done = now
            prev_occ = -1
            if r == R_NONE:
                done = now + dur[v]
            elif r <= R_SFU:
                mv = mask[slot_rot[slot], v]
                for sp in range(nsp):
                    if (mv >> sp) & 1:
                        f = comp_free[r, sm * nsp + sp]
                        if f > start:
                            start = f
                            prev_occ = comp_last[r, sm * nsp + sp]
                end = start + dur[v]
                g = cta * n + v
                cnt = 0
                for sp in range(nsp):
                    if (mv >> sp) & 1:
                        comp_free[r, sm * nsp + sp] = end
                        comp_last[r, sm * nsp + sp] = g
                        cnt += 1
                busy[r] += dur[v] * cnt
                done = end + lat[v]
            elif r == R_SMEM:
                if smem_free[sm] > start:
                    start = smem_free[sm]
                    prev_occ = smem_last[sm]
                end = start + dur[v]
                smem_free[sm] = end
                smem_last[sm] = cta * n + v
                busy[r] += dur[v]
                done = end + lat[v]
            else:
                # memory node: tile descriptor -> lines -> LRU -> engine, L2, DRAM servers
                ti = tensor[v]
                eb = t_eb[ti]
                trow = coord[v, 0] + coord[v, 1] * cta_m[cta] + coord[v, 2] * cta_n[cta]
                tcol = coord[v, 3] + coord[v, 4] * cta_m[cta] + coord[v, 5] * cta_n[cta]
                r0 = trow * tile_rows[v]
                c0 = tcol * tile_cols[v]
                nr = min(tile_rows[v], t_rows[ti] - r0)
                nc = min(tile_cols[v], t_cols[ti] - c0)
                store = is_store[v] == 1
                use15 = g15 > 0 and not store
                gi = sm // g15 if g15 > 0 else 0
                tv15 = t15[gi * sz15:(gi + 1) * sz15]
                nbytes = 0.0
                b2 = 0.0      # bytes of the lines that reach the L2
                nl = 0        # lines looked up in the L2
                nmiss = 0     # L2 misses
                n15 = 0       # lines looked up in the L1.5
                if nr > 0 and nc > 0 and r0 >= 0 and c0 >= 0:
                    if t_rm[ti] == 1:
                        outer0 = r0
                        n_outer = nr
                        inner0 = c0 * eb
                        inner_len = nc * eb
                        ld = t_cols[ti] * eb
                    else:
                        outer0 = c0
                        n_outer = nc
                        inner0 = r0 * eb
                        inner_len = nr * eb
                        ld = t_rows[ti] * eb
                    nbytes = float(nr * nc * eb)
                    for o in range(n_outer):
                        a0 = t_base[ti] + (outer0 + o) * ld + inner0
                        a1 = a0 + inner_len
                        first = a0 // line
                        last = (a1 - 1) // line
                        for ln in range(first, last + 1):
                            if use15:
                                n15 += 1
                                if lru_access(tv15, m15, ln):
                                    l15_hits += 1
                                    continue
                            lo = ln * line
                            if lo < a0:
                                lo = a0
                            hi = lo - lo % line + line
                            if hi > a1:
                                hi = a1
                            b2 += hi - lo
                            nl += 1
                            if not lru_access(ltags, lmeta, ln):
                                nmiss += 1
                ei = (0 if r == R_TMA else 1) + (2 if store else 0)
                wi = 1 if store else 0
                rate = tma_rate if r == R_TMA else lsu_rate
                if eng_free[ei, sm] > start:
                    start = eng_free[ei, sm]
                    prev_occ = eng_last[ei, sm]
                e_dur = nbytes / rate
                e_end = start + e_dur
                eng_free[ei, sm] = e_end
                eng_last[ei, sm] = cta * n + v
                busy[r] += e_dur
                fin = e_end
                s_next = start
                if n15 > 0:
                    l15_lines += n15
                    s15 = start if start > l15_free[gi] else l15_free[gi]
                    d15 = nbytes / r15[gi]
                    l15_free[gi] = s15 + d15
                    busy[9] += d15
                    if l15_free[gi] > fin:
                        fin = l15_free[gi]
                    s_next = s15
                if nl > 0:
                    l2_start = s_next if s_next > l2_free[wi] else l2_free[wi]
                    l2_dur = b2 / l2_rate
                    l2_free[wi] = l2_start + l2_dur
                    busy[7] += l2_dur
                    if l2_free[wi] > fin:
                        fin = l2_free[wi]
                    if store:
                        d_bytes = nbytes
                        dram_wr += nbytes
                    else:
                        d_bytes = float(nmiss * line)
                        load_lines += nl
                        hit_lines += nl - nmiss
                        dram_rd += d_bytes
                    if d_bytes > 0:
                        d_start = l2_start if l2_start > dram_free[wi] else dram_free[wi]
                        d_dur = d_bytes / dram_rate
                        dram_free[wi] = d_start + d_dur
                        busy[8] += d_dur
                        if dram_free[wi] > fin:
                            fin = dram_free[wi]
                if nl > 0 or n15 > 0:
                    done = fin + l2_lat
                    if (not store) and nmiss > 0:
                        done += dram_lat
                else:
                    done = fin
            if recording:
                g = cta * n + v
                rec_f[2, g] = start
                rec_f[3, g] = done
                rec_i[2, g] = prev_occ
            _hpush(ht, hs, hk, hl, hn, hmeta, done, EV_COMPLETE, slot, v)
            continue

        # EV_COMPLETE: release data edges
        _release(v, 0, BIND_DATA, now, slot, cta, base, n, sm, nsp, issue_clk, mask,
                 succ_ptr, succ_idx, succ_kind, rem, port_free, recording, rec_f, rec_i,
                 ht, hs, hk, hl, hn, hmeta, slot_rot[slot])
        left[slot] -= 1
        if left[slot] == 0:
            cta_end[cta] = now
            if now > t_end:
                t_end = now
            if next_cta < n_ctas:
                _hpush(ht, hs, hk, hl, hn, hmeta, now + launch_clk, EV_LAUNCH, slot, next_cta)
                next_cta += 1

    stats[0] = t_end
    stats[1] = load_lines
    stats[2] = hit_lines
    stats[3] = dram_rd
    stats[4] = dram_wr
    stats[5] = n_events
    stats[6] = l15_lines
    stats[7] = l15_hits
