"""Plain-Python twin of the tile-graph event loop (``tsbatch.sim.engine``).

One kernel at a time, no numpy tricks, no numba: dictionaries, lists and
``heapq``. It implements the semantics written in the engine's module
docstring independently (durations, the set-associative LRU, the servers),
so that ``tests/test_sim.py`` can compare the two exactly on small graphs.
"""

from __future__ import annotations

import heapq

MASK64 = (1 << 64) - 1
NONE, TC, CUDA, SFU, SMEM, TMA, LSU = range(7)
OP_RES = {"tma_load": TMA, "ldg": LSU, "mma": TC, "alu": CUDA, "sfu": SFU, "smem": SMEM,
          "tma_store": TMA, "stg": LSU, "sync": NONE}
OPS = ("tma_load", "ldg", "mma", "alu", "sfu", "smem", "tma_store", "stg", "sync")


class NaiveLru:
    """Sets of ``assoc`` ways, each a list in recency order (index 0 = most recent)."""

    def __init__(self, capacity, assoc):
        cap = max(int(capacity), 1)
        self.assoc = max(1, min(int(assoc), cap)) if assoc > 0 else cap
        self.n_sets = max(cap // self.assoc, 1)
        self.sets = {}

    def set_of(self, line):
        h = ((line * 11400714819323198485) & MASK64) >> 32
        return (h * self.n_sets) >> 32

    def access(self, line):
        ways = self.sets.setdefault(self.set_of(line), [])
        if line in ways:
            ways.remove(line)
            ways.insert(0, line)
            return True
        ways.insert(0, line)
        if len(ways) > self.assoc:
            ways.pop()
        return False


def _tile_segments(graph, tensors, v, cm, cn):
    """Contiguous byte runs ``(start, length)`` of node ``v``'s tile for CTA ``(cm, cn)``."""
    rows, cols, eb, row_major, base = tensors[int(graph.tensor[v])]
    c = [int(x) for x in graph.coord[v]]
    trow = c[0] + c[1] * cm + c[2] * cn
    tcol = c[3] + c[4] * cm + c[5] * cn
    r0 = trow * int(graph.tile_rows[v])
    c0 = tcol * int(graph.tile_cols[v])
    nr = min(int(graph.tile_rows[v]), rows - r0)
    nc = min(int(graph.tile_cols[v]), cols - c0)
    if nr <= 0 or nc <= 0 or r0 < 0 or c0 < 0:
        return 0.0, []
    if row_major:
        segs = [(base + (r0 + o) * cols * eb + c0 * eb, nc * eb) for o in range(nr)]
    else:
        segs = [(base + (c0 + o) * rows * eb + r0 * eb, nr * eb) for o in range(nc)]
    return float(nr * nc * eb), segs


def naive_simulate(graph, machine, resident):
    """Simulate; returns a dict with cycles, busy, stats and per-node times."""
    n = graph.n_nodes
    nsp = machine.n_subpartitions
    ops = [OPS[int(o)] for o in graph.op]
    res = [OP_RES[o] for o in ops]
    if graph.mma_kind == "fma":
        res = [CUDA if o == "mma" else r for o, r in zip(ops, res)]
    sps = []
    for v in range(n):
        s = set()
        for w in range(int(graph.warp0[v]), int(graph.warp0[v] + graph.n_warps[v])):
            s.add(w % nsp)
        sps.append(sorted(s))
    if "mma" in ops:
        if graph.mma_kind == "fma":
            tc = 2.0 * machine.cuda_op_per_clk
        else:
            tc = machine.tc_flop_per_clk[graph.mma_dtype]
            if graph.mma_kind == "warp":
                tc = tc * machine.mma_sync_fraction
    else:
        tc = 1.0
    per_sp = {TC: tc / nsp, CUDA: machine.cuda_op_per_clk / nsp, SFU: machine.sfu_op_per_clk / nsp}
    lat_of = {NONE: 0.0, TC: machine.tc_latency_clk, CUDA: machine.alu_latency_clk,
              SFU: machine.sfu_latency_clk, SMEM: machine.smem_latency_clk, TMA: 0.0, LSU: 0.0}
    dur, lat = [], []
    for v in range(n):
        r = res[v]
        w = float(graph.work[v])
        if r == CUDA and ops[v] == "mma":
            w = w / 2.0
        if r in (TC, CUDA, SFU):
            d = w / (len(sps[v]) * per_sp[r])
        elif r == SMEM:
            d = w / machine.smem_bytes_per_clk
        elif r == NONE:
            d = w
        else:
            d = 0.0
        dur.append(d)
        lat.append(lat_of[r])
    succ = [[] for _ in range(n)]
    for u in range(n):
        for e in range(int(graph.succ_ptr[u]), int(graph.succ_ptr[u + 1])):
            succ[u].append((int(graph.succ_idx[e]), int(graph.succ_kind[e])))
    npred = [int(x) for x in graph.n_pred]
    line = machine.l2_line_bytes
    tensors = []
    off = 0
    for t in graph.tensors:
        tensors.append((t.rows, t.cols, t.elem_bytes, t.row_major, off))
        size = t.rows * t.cols * t.elem_bytes
        off += -(-size // line) * line + line
    lru = NaiveLru(machine.l2_lines, machine.l2_assoc)
    l15_free = {}     # SM group -> time its L1.5 server is free

    n_sm = machine.sm_count
    n_slots = n_sm * resident
    ctas = list(zip([int(x) for x in graph.cta_m], [int(x) for x in graph.cta_n]))
    g15 = machine.l15_group_sms if machine.l15_lines > 0 else 0
    l15 = {}          # SM group -> its own L1.5 cache, created on first use
    port = [0.0] * (n_sm * nsp)
    comp = {r: [0.0] * (n_sm * nsp) for r in (TC, CUDA, SFU)}
    smem_free = [0.0] * n_sm
    eng = {(r, w): [0.0] * n_sm for r in (TMA, LSU) for w in (False, True)}
    rate = {TMA: machine.tma_bytes_per_clk, LSU: machine.lsu_bytes_per_clk}
    l2_free = {False: 0.0, True: 0.0}     # read and write queues
    dram_free = {False: 0.0, True: 0.0}
    busy = {r: 0.0 for r in range(7)}
    busy["l2"] = 0.0
    busy["dram"] = 0.0
    busy["l15"] = 0.0
    stats = {"load_lines": 0, "hit_lines": 0, "dram_rd": 0.0, "dram_wr": 0.0, "events": 0,
             "l15_lines": 0, "l15_hits": 0}
    cta_end = {}
    times = {}
    heap = []
    seq = [0]

    def push(t, kind, slot, node):
        heapq.heappush(heap, (t, seq[0], kind, slot, node))
        seq[0] += 1

    rem = {}
    left = {}
    slot_cta = {}
    next_cta = 0
    for s in range(n_slots):
        if next_cta < len(ctas):
            push(machine.cta_launch_clk, 2, s, next_cta)
            next_cta += 1

    def on_sps(slot, u):
        # warps of the CTA in slot s start at (s // n_sm) * warps_per_cta on their SM
        first = (slot // n_sm) * graph.warps_per_cta
        return sorted({(first + sp) % nsp for sp in sps[u]})

    def ready(slot, u, now):
        sm = slot % n_sm
        t = now
        for sp in on_sps(slot, u):
            t = max(t, port[sm * nsp + sp])
        for sp in on_sps(slot, u):
            port[sm * nsp + sp] = t + machine.issue_clk
        times[(slot_cta[slot], u)] = [now, t, None, None]
        push(t, 0, slot, u)

    t_end = 0.0
    while heap:
        now, _, kind, slot, v = heapq.heappop(heap)
        stats["events"] += 1
        sm = slot % n_sm
        if kind == 2:
            slot_cta[slot] = v
            left[slot] = n
            rem[slot] = list(npred)
            for u in range(n):
                if npred[u] == 0:
                    ready(slot, u, now)
            continue
        cta = slot_cta[slot]
        if kind == 0:
            for u, k in succ[v]:
                if k == 1:
                    rem[slot][u] -= 1
                    if rem[slot][u] == 0:
                        ready(slot, u, now)
            r = res[v]
            start = now
            if r == NONE:
                done = now + dur[v]
            elif r in (TC, CUDA, SFU):
                for sp in on_sps(slot, v):
                    start = max(start, comp[r][sm * nsp + sp])
                end = start + dur[v]
                for sp in on_sps(slot, v):
                    comp[r][sm * nsp + sp] = end
                busy[r] += dur[v] * len(sps[v])
                done = end + lat[v]
            elif r == SMEM:
                start = max(start, smem_free[sm])
                end = start + dur[v]
                smem_free[sm] = end
                busy[r] += dur[v]
                done = end + lat[v]
            else:
                cm, cn = ctas[cta]
                store = ops[v] in ("tma_store", "stg")
                group = sm // g15 if g15 else 0
                use15 = bool(g15) and not store
                b2, nl, nmiss, n15 = 0, 0, 0, 0
                nbytes, segs = _tile_segments(graph, tensors, v, cm, cn)
                for a0, ln_ in segs:
                    for ln in range(a0 // line, (a0 + ln_ - 1) // line + 1):
                        if use15:
                            n15 += 1
                            cache = l15.setdefault(group, NaiveLru(machine.l15_lines, machine.l15_assoc))
                            if cache.access(ln):
                                stats["l15_hits"] += 1
                                continue
                        # bytes of this line inside the segment
                        b2 += min(a0 + ln_, (ln + 1) * line) - max(a0, ln * line)
                        nl += 1
                        if not lru.access(ln):
                            nmiss += 1
                start = max(start, eng[(r, store)][sm])
                e_dur = nbytes / rate[r]
                eng[(r, store)][sm] = start + e_dur
                busy[r] += e_dur
                fin = start + e_dur
                s_next = start
                if n15 > 0:
                    stats["l15_lines"] += n15
                    n_in_group = min(g15, n_sm - group * g15)
                    s15 = max(start, l15_free.get(group, 0.0))
                    d15 = nbytes / (machine.l15_bytes_per_clk * n_in_group)
                    l15_free[group] = s15 + d15
                    busy["l15"] += d15
                    fin = max(fin, l15_free[group])
                    s_next = s15
                if nl > 0:
                    l2_start = max(s_next, l2_free[store])
                    l2_dur = b2 / machine.l2_bytes_per_clk
                    l2_free[store] = l2_start + l2_dur
                    busy["l2"] += l2_dur
                    fin = max(fin, l2_free[store])
                    if store:
                        d_bytes = nbytes
                        stats["dram_wr"] += nbytes
                    else:
                        d_bytes = float(nmiss * line)
                        stats["load_lines"] += nl
                        stats["hit_lines"] += nl - nmiss
                        stats["dram_rd"] += d_bytes
                    if d_bytes > 0:
                        d_start = max(l2_start, dram_free[store])
                        d_dur = d_bytes / machine.dram_bytes_per_clk
                        dram_free[store] = d_start + d_dur
                        busy["dram"] += d_dur
                        fin = max(fin, dram_free[store])
                if nl > 0 or n15 > 0:
                    done = fin + machine.l2_hit_latency_clk
                    if not store and nmiss > 0:
                        done += machine.dram_extra_latency_clk
                else:
                    done = fin
            times[(cta, v)][2] = start
            times[(cta, v)][3] = done
            push(done, 1, slot, v)
            continue
        for u, k in succ[v]:
            if k == 0:
                rem[slot][u] -= 1
                if rem[slot][u] == 0:
                    ready(slot, u, now)
        left[slot] -= 1
        if left[slot] == 0:
            cta_end[cta] = now
            t_end = max(t_end, now)
            if next_cta < len(ctas):
                push(now + machine.cta_launch_clk, 2, slot, next_cta)
                next_cta += 1
    return {"cycles": t_end, "busy": busy, "stats": stats, "times": times, "cta_end": cta_end}
