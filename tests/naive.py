"""Slow, obviously correct plain-Python twins of every numba kernel.

One configuration at a time, no numpy, no numba, no clever data
structures: loops, lists, dicts and ``math``. The tests in
``test_kernels.py`` compare each kernel with its twin here; the oracle in
``test_cache_oracle.py`` reuses :func:`access_sequence`.

Each twin is written from the *documentation* of its kernel (the module
docstrings of ``tsbatch/kernels/*.py`` and TileSight §3.4-3.5), not by
transcribing the kernel's code, so that a slip in either shows up as a
mismatch.
"""

from __future__ import annotations

import math
import re

INF = math.inf

# ----------------------------------------------------------------------
# normal CDF (TileSight Eq. 10, Abramowitz & Stegun 26.2.16)
# ----------------------------------------------------------------------
_ZS_P = 0.33267
_ZS_A = (0.4361836, -0.1201676, 0.9372980)


def norm_cdf(x: float) -> float:
    """Standard normal CDF, ``Phi(x) = erfc(-x / sqrt(2)) / 2`` (the reference)."""
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def norm_pdf(x: float) -> float:
    return math.exp(-x * x / 2.0) / math.sqrt(2.0 * math.pi)


def norm_cdf_zs(x: float) -> float:
    """Zelen-Severo: ``Phi(x) = 1 - c phi(x) (a1 t + a2 t^2 + a3 t^3)``, ``t = 1/(1 + p x)``
    for ``x >= 0``, and by symmetry ``Phi(x) = 1 - Phi(-x)`` below zero; ``c``
    makes the tail exactly 1/2 at 0 (``c (a1 + a2 + a3) / sqrt(2 pi) = 1/2``), so
    the two sides meet there."""
    if x < 0.0:
        return 1.0 - norm_cdf_zs(-x)
    t = 1.0 / (1.0 + _ZS_P * x)
    a1, a2, a3 = _ZS_A
    c = 0.5 / (norm_pdf(0.0) * (a1 + a2 + a3))
    return 1.0 - c * norm_pdf(x) * (a1 * t + a2 * t ** 2 + a3 * t ** 3)


# ----------------------------------------------------------------------
# SDCM hit probability (TileSight §3.5.2, Eq. 7-9)
# ----------------------------------------------------------------------
def _edge(d: float, assoc: float, blocks: float):
    """The shared conventions of both SDCM forms, or ``None`` for the general case.

    A first touch (``d = inf``) always misses, a zero distance always hits,
    a cache of less than one block holds none and always misses. A cache of
    ``B <= A`` blocks is a single fully associative LRU set of ``floor(B)``
    ways (tsbatch/kernels/sdcm.py, ``_edge``): the access hits iff fewer whole
    blocks than ways were touched since, ``floor(d) < floor(B)``.

    (Until session 11 this twin read the set as ``B`` fractional blocks, the
    block and the ``d`` since fitting, ``d + 1 <= B``: a different rule where
    ``d`` or ``B`` is fractional, and a rounding-dependent one where ``d + 1 =
    B`` exactly, e.g. ``2560 / 1536 + 1.0 > 4096 / 1536`` in floats. The
    one-column twin test met it: docs/gemm_accuracy.md, "A cache-column
    mismatch, session 11".)
    """
    if d == INF:
        return 0.0
    if d <= 0.0:
        return 1.0
    if blocks < 1.0:
        return 0.0
    if assoc >= blocks:
        return 1.0 if math.floor(d) < math.floor(blocks) else 0.0
    return None


def hit_prob_exact(d: float, assoc: float, blocks: float) -> float:
    """Eq. 7: ``P(hit) = sum_{a=0}^{A-1} C(D, a) p^a (1 - p)^(D - a)``, ``p = A / B``,
    with ``D`` rounded down to whole blocks."""
    e = _edge(d, assoc, blocks)
    if e is not None:
        return e
    n = int(math.floor(d))
    if n < int(assoc):  # every term of the binomial: the sum is exactly 1
        return 1.0
    p = assoc / blocks
    terms = []
    for a in range(int(assoc)):
        if a > n:
            break
        terms.append(float(math.comb(n, a)) * p ** a * (1.0 - p) ** (n - a))
    return min(1.0, math.fsum(terms))


def hit_prob_gauss(d: float, assoc: float, blocks: float, cdf=norm_cdf_zs) -> float:
    """Eq. 8-9 with a continuity correction: the number of the ``D`` intervening
    blocks that fall into the set is about ``N(D p, D p (1 - p))``; the access hits
    when that count is at most ``A - 1``, i.e. below ``A - 1/2``."""
    e = _edge(d, assoc, blocks)
    if e is not None:
        return e
    p = assoc / blocks
    mu = d * p
    sigma = math.sqrt(d * p * (1.0 - p))
    return cdf((assoc - 0.5 - mu) / sigma)


# ----------------------------------------------------------------------
# launch orders (tsbatch/kernels/order.py docstring)
# ----------------------------------------------------------------------
ROW, COL, GROUPED, ZORDER, PERSISTENT = 0, 1, 2, 3, 4


def _plane_order(order: int, g0: int, g1: int, group: int) -> list[tuple[int, int]]:
    """The issue sequence of one ``g0 x g1`` plane, built by enumeration."""
    if order == ROW:  # x1 fastest
        return [(a, b) for a in range(g0) for b in range(g1)]
    if order == COL:  # x0 fastest
        return [(a, b) for b in range(g1) for a in range(g0)]
    if order in (GROUPED, PERSISTENT):
        # panels of `group` rows; inside a panel, column by column, each column
        # top to bottom (Triton's matmul tutorial "grouped ordering")
        gm = max(group, 1)
        seq = []
        for first in range(0, g0, gm):
            rows = range(first, min(first + gm, g0))
            for b in range(g1):
                for a in rows:
                    seq.append((a, b))
        return seq
    if order == ZORDER:
        nb0 = 0
        while 2 ** nb0 < g0:
            nb0 += 1
        nb1 = 0
        while 2 ** nb1 < g1:
            nb1 += 1

        def code(a, b):
            # interleave, x1's bit first, while both have bits; the longer
            # dimension's remaining bits then take the top positions
            c = 0
            pos = 0
            for bit in range(max(nb0, nb1)):
                if bit < nb1:
                    c += ((b >> bit) & 1) << pos
                    pos += 1
                if bit < nb0:
                    c += ((a >> bit) & 1) << pos
                    pos += 1
            return c

        cells = [(a, b) for a in range(g0) for b in range(g1)]
        return sorted(cells, key=lambda ab: code(*ab))
    raise ValueError(f"unknown order {order}")


def launch_sequence(order: int, g0: int, g1: int, g2: int, group: int) -> list[tuple[int, int, int]]:
    """All ``(x0, x1, x2)`` in issue order; dimension 2 is always slowest."""
    plane = _plane_order(order, g0, g1, group)
    return [(a, b, z) for z in range(g2) for (a, b) in plane]


def tile_coords(order: int, g0: int, g1: int, g2: int, group: int, pid: int) -> tuple[int, int, int]:
    """Coordinates of program ``pid`` (builds the whole sequence: slow on purpose)."""
    return launch_sequence(order, g0, g1, g2, group)[pid]


# ----------------------------------------------------------------------
# LRU stack distances (tsbatch/kernels/reuse.py: step_distances)
# ----------------------------------------------------------------------
def stack_distances(ids, wts) -> list[float]:
    """Total weight of distinct ids touched strictly between an access and the
    previous access to the same id (``inf`` on a first touch).

    Keeps an explicit LRU stack (most recent first): the distance is the
    weight of the entries above the id, and the id then moves to the top.
    Every id carries the weight of its most recent access.
    """
    stack: list = []  # [id, weight], most recent first
    out = []
    for k, w in zip(ids, wts):
        pos = None
        for i, (kk, _) in enumerate(stack):
            if kk == k:
                pos = i
                break
        if pos is None:
            out.append(INF)
        else:
            out.append(float(sum(ww for _, ww in stack[:pos])))
            del stack[pos]
        stack.insert(0, [k, w])
    return out


# ----------------------------------------------------------------------
# idealised access sequence and hit rates (tsbatch/kernels/reuse.py docstring)
# ----------------------------------------------------------------------
def reuse_key(coords, mask: int) -> tuple:
    """Eq. 6: the tile coordinate projected onto the non-reuse dimensions."""
    return tuple(coords[d] for d in range(3) if not (mask >> d) & 1)


def access_sequence(g0, g1, g2, order, group, conc, ksteps, mask, per_step, tbytes,
                    nsm=1, g15=0):
    """Every access of the idealised wave-lockstep sequence, in order.

    Tiles run in waves of ``conc`` consecutive programs. Inside a wave, for
    each reduction step ``s``, every tile in wave order touches each of its
    per-step blocks (tensor order), keyed ``('s', t, reuse key, s)``; after
    the last step every tile touches its once-per-tile blocks, keyed
    ``('o', t, reuse key)``.

    (``reuse.py`` counts every tile's once-per-tile bytes as distinct instead
    of keying them; the two agree when those tensors have no reuse
    dimensions, as GEMM's C, the only kind the tests use.)

    Returns a list of dicts: ``block, bytes, tensor, wave, step`` (``-1`` for
    once-per-tile accesses), ``slot`` (position of the tile in its wave) and
    ``group`` (the L1.5 group of the tile's SM, ``slot mod nsm`` div ``g15``).
    """
    tiles = launch_sequence(order, g0, g1, g2, group)
    T = len(mask)
    seq = []
    for w, start in enumerate(range(0, len(tiles), conc)):
        wave = tiles[start:start + conc]
        for s in range(ksteps):
            for slot, c in enumerate(wave):
                for t in range(T):
                    if per_step[t]:
                        seq.append(dict(block=("s", t, reuse_key(c, mask[t]), s), bytes=tbytes[t],
                                        tensor=t, wave=w, step=s, slot=slot,
                                        group=(slot % nsm) // g15 if g15 > 0 else 0))
        for slot, c in enumerate(wave):
            for t in range(T):
                if not per_step[t]:
                    seq.append(dict(block=("o", t, reuse_key(c, mask[t])), bytes=tbytes[t],
                                    tensor=t, wave=w, step=-1, slot=slot,
                                    group=(slot % nsm) // g15 if g15 > 0 else 0))
    return seq


def cache_hit_rates_one(g0, g1, g2, order, group, conc, ksteps, mask, per_step, tbytes,
                        cap2, assoc2, nsm, g15, cap15, assoc15):
    """Per-tensor ``(h15, h2, dram)`` lists for one cache problem, without sampling.

    Every access of :func:`access_sequence` (all waves, all reduction steps)
    gets its exact LRU stack distance in bytes over the whole sequence; the
    L2 hit probability is the Gaussian SDCM at that distance in tile units
    (the mean block size of the per-step tensors) against the L2 capacity in
    the same units. With an L1.5 tier, each access also gets the SDCM hit
    probability of its exact stack distance inside its own (wave, step, SM
    group) subsequence, against the L1.5 capacity. The cascade: L2 sees
    the L1.5 misses, DRAM the L2 misses. Once-per-tile tensors get
    ``(0, 0, 1)``, and so do per-step tensors of zero bytes (they move
    nothing; their accesses stay in the sequence, where they add no bytes to
    any distance, and the unit counts them).
    """
    T = len(mask)
    h15 = [0.0] * T
    h2 = [0.0] * T
    dram = [1.0] * T
    step_t = [t for t in range(T) if per_step[t]]
    P = g0 * g1 * g2
    if not step_t or P == 0:
        return h15, h2, dram
    unit = sum(tbytes[t] for t in step_t) / len(step_t)
    use15 = g15 > 0 and cap15 > 0 and assoc15 > 0
    seq = access_sequence(g0, g1, g2, order, group, conc, ksteps, mask, per_step, tbytes,
                          nsm, g15 if use15 else 0)
    d2 = stack_distances([a["block"] for a in seq], [a["bytes"] for a in seq])

    p15 = [0.0] * len(seq)
    if use15:
        runs: dict = {}
        for j, a in enumerate(seq):
            if a["step"] >= 0:
                runs.setdefault((a["wave"], a["step"], a["group"]), []).append(j)
        for js in runs.values():
            d15 = stack_distances([seq[j]["block"] for j in js], [seq[j]["bytes"] for j in js])
            for j, d in zip(js, d15):
                p15[j] = hit_prob_gauss(d / unit, assoc15, cap15 / unit)

    acc = [0.0] * T
    hit15 = [0.0] * T
    req2 = [0.0] * T
    hit2 = [0.0] * T
    for j, a in enumerate(seq):
        t = a["tensor"]
        if not per_step[t]:
            continue
        ph2 = hit_prob_gauss(d2[j] / unit, assoc2, cap2 / unit)
        acc[t] += 1.0
        hit15[t] += p15[j]
        req2[t] += 1.0 - p15[j]
        hit2[t] += (1.0 - p15[j]) * ph2
    for t in step_t:
        if tbytes[t] == 0:
            continue
        h15[t] = hit15[t] / acc[t]
        h2[t] = hit2[t] / req2[t] if req2[t] > 0.0 else 0.0
        dram[t] = (req2[t] - hit2[t]) / acc[t]
    return h15, h2, dram


def _closed_wave(sums, kf, nw, G, nseg, e, x, h_re, wt):
    """The closed forms' twins: a wave's accesses and hits of a re-read tensor
    (``nw`` accesses a step, ``G`` first in an L1.5 group, ``nseg`` first in the
    step, ``e`` its L1.5 hit, ``x`` the first touch's L2 hit, ``h_re`` a
    re-touch's) added to the running sums with weight ``wt``."""
    acc, hit15, req2, hit2 = sums
    s15 = (nw - G) * e
    c_hit = kf * (x + (G - nseg) * h_re + (nw - G) * (1.0 - e) * h_re)
    return (acc + wt * (kf * nw), hit15 + wt * (kf * s15), req2 + wt * (kf * (nw - s15)),
            hit2 + wt * c_hit)



def _closed_samples(P, conc, ksteps, max_waves, k_samples, weights):
    """The closed forms' samples (as ``reuse._closed_setup``): the wave count
    ``W``, the analysed waves, the interior waves' weight, the step samples
    ``ks`` and their steps ``svals``, and ``ksteps`` as a float."""
    W = -(-P // conc)
    waves = list(range(W)) if W <= max_waves else sorted(
        {(i * (W - 1)) // (max_waves - 1) for i in range(max_waves)})
    wt_in = (W - 2.0) / (max_waves - 2.0) if weights and W > max_waves and max_waves > 2 else 1.0
    ks = min(ksteps, k_samples)
    svals = [math.floor((i + 0.5) * ksteps / ks) for i in range(ks)]
    return W, waves, wt_in, ks, svals, float(ksteps)

def cache_column_one(g0, conc, ksteps, mask, per_step, tbytes, cap2, assoc2, nsm, g15,
                     cap15, assoc15, k_samples=4, max_waves=8, weights=True, drop_zero=True):
    """Twin of ``reuse._cache_column``: per-tensor ``(h15, h2, dram)`` lists of a
    one-column grid (``g1 == g2 == 1``, a panel order, integer block sizes) in
    closed form, wave type by wave type.

    A per-step tensor not reused along the rows has a block per program, never
    touched twice: ``(0, 0, 1)``. One reused along the rows is one block: per
    step of a wave of ``nw`` programs its first touch is program 0's (cold in
    wave 0; else previous touch in the last program of the wave before, at the
    cross-wave distance ``tail + head + once bytes of that wave + (kf - 1 - s)
    footprint(wave before) + s footprint(wave)``, averaged over the sampled
    steps ``s``); its ``nw - 1`` re-touches have one access of every other
    tensor in between (distance ``B - b``, in the step and in an L1.5
    group's subsequence alike), ``G`` of its accesses (the groups the wave
    reaches) are first in their L1.5 group. The sampled waves and their
    weights are ``reuse._cache_one``'s.
    """
    T = len(mask)
    h15 = [0.0] * T
    h2 = [0.0] * T
    dram = [1.0] * T
    step_t = [t for t in range(T) if per_step[t]]
    P = g0
    if not step_t or P == 0:
        return h15, h2, dram
    unit = sum(tbytes[t] for t in step_t) / len(step_t)
    shared = [bool(per_step[t]) and g0 > 1 and bool(mask[t] & 1) for t in range(T)]
    s_sh = sum(tbytes[t] for t in step_t if shared[t])
    s_priv = sum(tbytes[t] for t in step_t if not shared[t])
    tot = s_priv + s_sh
    once = sum(tbytes[t] for t in range(T) if not per_step[t])
    use15 = g15 > 0 and cap15 > 0 and assoc15 > 0
    ngroups = -(-nsm // g15) if use15 else 1
    W, waves, wt_in, ks, svals, kf = _closed_samples(P, conc, ksteps, max_waves, k_samples,
                                                     weights)

    def sdcm2(d):
        return hit_prob_gauss(d / unit, assoc2, cap2 / unit)

    head = 0.0
    for t in step_t:
        b = tbytes[t]
        h_q, head = head, head + b
        if not shared[t] or (b == 0 and drop_zero):
            continue
        d = tot - b
        e = hit_prob_gauss(d / unit, assoc15, cap15 / unit) if use15 else 0.0
        sums = (0.0, 0.0, 0.0, 0.0)  # accesses, L1.5 hits, L2 requests, L2 hits
        for w in waves:
            nw = min(conc, P - w * conc)
            foot = nw * s_priv + s_sh
            x = 0.0
            if w >= 1:
                base = (tot - h_q - b) + h_q + conc * once
                u1 = conc * s_priv + s_sh
                x = sum(sdcm2(base + (kf - 1 - s) * u1 + s * foot) for s in svals) / ks
            G = min(ngroups, -(-min(nw, nsm) // g15)) if use15 else 1
            h_re = 1.0 if sdcm2(foot) >= 1.0 - 1e-12 else sdcm2(d)
            sums = _closed_wave(sums, kf, nw, G, 1, e, x, h_re, wt_in if 0 < w < W - 1 else 1.0)
        acc, hit15, req2, hit2 = sums
        if acc == 0.0:
            continue
        h15[t] = hit15 / acc
        h2[t] = hit2 / req2 if req2 > 0.0 else 0.0
        dram[t] = (req2 - hit2) / acc
    return h15, h2, dram


# ----------------------------------------------------------------------
# resident tiles (tsbatch/kernels/occupancy.py docstring)
# ----------------------------------------------------------------------
REASON_OK, REASON_SMEM, REASON_THREADS, REASON_REGISTERS = 0, 1, 2, 3


def resident_one(smem_block, regs_thread, threads, warp_size, sm_smem, smem_block_max,
                 smem_reserved, sm_regs, reg_unit, sm_max_warps, sm_max_threads,
                 sm_max_blocks, max_threads_block):
    """Blocks per SM: the smallest of the limits, each computed on its own."""
    if smem_block > smem_block_max:
        return 0, REASON_SMEM
    if threads <= 0 or threads > max_threads_block:
        return 0, REASON_THREADS
    warps = math.ceil(threads / warp_size)
    # registers are allocated per warp, rounded up to the allocation unit
    regs_per_warp = math.ceil(regs_thread * warp_size / reg_unit) * reg_unit
    regs_block = regs_per_warp * warps
    if regs_block > sm_regs:
        return 0, REASON_REGISTERS
    limits = [sm_max_blocks, sm_max_warps // warps, sm_max_threads // threads]
    if regs_block > 0:
        limits.append(sm_regs // regs_block)
    if smem_block + smem_reserved > 0:
        limits.append(sm_smem // (smem_block + smem_reserved))
    r = min(limits)
    if r <= 0:
        return 0, REASON_SMEM
    return r, REASON_OK


# ----------------------------------------------------------------------
# envelope and waves (tsbatch/kernels/envelope.py docstring, Eq. 2-5, Alg. 2)
# ----------------------------------------------------------------------
def ring_queue(z: float, dem: float, n: int) -> float:
    """Exact mean-value analysis of ``n`` customers through a delay ``z`` and one
    queue of demand ``dem``: the time per completion, ``1 / X(n)``."""
    queue = 0.0
    through = 0.0
    for c in range(1, n + 1):
        resp = dem * (1.0 + queue)
        through = c / (z + resp)
        queue = through * resp
        if through * dem > 1.0 - 1e-9:
            # saturated: dem / (1 - 1e-9) from here on, never above one customer's cycle
            return min(dem / (1.0 - 1e-9), z + dem)
    return 1.0 / through if through > 0.0 else 0.0


def ring_queue_floor(z: float, dem: float, n: int, steps: int) -> float:
    """A lower bound of :func:`ring_queue`: the mean-value recursion from customer
    ``m = max(n - steps, 1)`` on, started at ``R(m) = dem (1 + (m - 1) dem / (z +
    dem))``, less a relative 1e-9."""
    m = max(n - steps, 1)
    resp = dem * (1.0 + (m - 1) * dem / (z + dem))
    for c in range(m + 1, n + 1):
        resp = dem * (1.0 + (c - 1) * resp / (z + resp))
    return (z + resp) / n * (1.0 - 1e-9)


def envelope_one(work_iter, work_epi, rate, shared, compute, p, active, ksteps, stages,
                 warps_tile, warps_full, lat, ovh_iter, ovh_tile, persist_tiles, share_eff=1.0,
                 sync=0.0, chain=0.0, streams=1.0, ring=1, expose=0.0, l15_share=1.0):
    """``(T, T_pro, T_steady_total, T_epi, T_steady_iter, T_store, T_own)`` of one SM's share.
    ``l15_share``: the L1.5 (resource 4) time divided by it in the bandwidth
    bound, the ring's queue and the floor, not in the latency bound or the first load."""
    frac = min(1.0, p * warps_tile / warps_full)  # compute issue-slot fraction
    groups_share = p * warps_tile > warps_full  # several issue groups on the tensor cores
    comp_times = [0.0]
    mem_times = [0.0]
    mem_l_times = [0.0]
    epi_times = [0.0]
    rates = [0.0] * len(work_iter)  # each resource's rate on this SM (0: absent)
    for r in range(len(work_iter)):
        if rate[r] <= 0.0:
            continue  # resource absent on this chip
        eff = rate[r]
        if shared[r]:
            eff = eff / active
        if compute[r]:
            eff = eff * frac
        if r == 0 and groups_share:  # resource 0: tensor core
            eff = eff * share_eff
        rates[r] = eff
        per_iter = work_iter[r] / eff
        per_epi = work_epi[r] / eff
        if persist_tiles > 0 and not compute[r]:
            per_iter = per_iter + per_epi / ksteps  # stores drain inside the loop
            per_epi = 0.0
        if compute[r]:
            comp_times.append(per_iter)
        else:
            mem_l_times.append(per_iter)
            mem_times.append(per_iter / (l15_share if r == 4 else 1.0))
        epi_times.append(per_epi)
    # the loop's bookkeeping: on the busiest resource, or a segment of the chain
    comp = max(comp_times) + (ovh_iter if chain <= 0.0 else 0.0)
    if sync > 0.0:  # barrier stall, run under the other resident tiles' work
        comp = max(comp, (comp + sync) / p)
    if chain > 0.0:  # the p tiles' issue streams interleave their iteration chains
        comp = max(comp, (chain + ovh_iter) / (p * streams))
    mem = max(mem_times)
    mem_l = max(mem_l_times)
    epi = max(epi_times)
    tiles = persist_tiles if persist_tiles > 0 else p
    N = tiles * ksteps
    d = max(p * (stages - 1), 0)
    lat_bound = (lat + mem_l) / d if d > 0 else (lat + mem_l + comp) / p
    steady = max(comp, mem, lat_bound)
    if expose > 0.0:
        # a loop that does not prefetch (Triton's 2-stage FMA dot): a tile's own
        # iteration is its issue on the schedulers its warps hold (or its chain
        # with the bookkeeping), its barrier stall and the exposed copy; the p
        # resident tiles run out of step in that wait
        own = max(comp_times) * frac * warps_full / min(warps_tile, warps_full)
        own = max(own, chain + ovh_iter) if chain > 0.0 else own + ovh_iter
        steady = max(steady, (own + sync + expose) / p)
    if ring and d > 0 and mem > 0.0:  # the ring's p * stages slots queue at the memory
        # (ring 2: a floor of that queue, the screen's bound)
        steady = max(steady, ring_queue(lat + comp, mem, d + p) if ring == 1 else
                     ring_queue_floor(lat + comp, mem, d + p, 1))
    # first load: latency + transfer; last compute ends the loop; between them
    # N - 1 steady iterations (no latency bound when every load is in flight)
    step = max(comp, mem) if 0 < N <= d else steady
    t_pro = lat + mem_l
    t_steady = max(N - 1, 0) * step
    # out of step, the other resident tiles' once-per-tile work runs under the loop
    hide = min((p - 1) * epi, t_steady) if persist_tiles <= 0 and p > 1 else 0.0
    t_epi = comp + p * epi - hide + tiles * ovh_tile
    # never below the busiest resource's time for the SM's tiles (plus one latency)
    floor = tiles * max([0.0] + [(w * ksteps + e) / r / (l15_share if i == 4 else 1.0)
                                 for i, (w, e, r) in enumerate(zip(work_iter, work_epi, rates))
                                 if r > 0.0])
    total = t_pro + t_steady + t_epi
    # still in flight when the last compute step ends: the exposed stores, and the
    # busiest resource's work beyond the pipeline's estimate where it binds
    drain = p * epi - hide + max(lat + floor - total, 0.0)
    if total < lat + floor:
        t_epi += lat + floor - total
        total = lat + floor
    return total, t_pro, t_steady, t_epi, steady, drain, p * epi


def busiest(work_iter, work_epi, rate, shared, compute, p, active, ksteps, warps_tile,
            warps_full, share_eff=1.0):
    """``(time, burst)``: the busiest resource's time of ``p`` tiles' whole work
    on one SM (the first of equal ones), and the share of its work that comes
    once per tile if it is a memory resource (else 0)."""
    frac = min(1.0, p * warps_tile / warps_full)
    best, burst = 0.0, 0.0
    for r in range(len(work_iter)):
        if rate[r] <= 0.0:
            continue
        eff = rate[r] / active if shared[r] else rate[r]
        if compute[r]:
            eff *= frac
        if r == 0 and p * warps_tile > warps_full:
            eff *= share_eff
        t = p * (ksteps * work_iter[r] + work_epi[r]) / eff
        if t > best:
            best = t
            burst = 0.0 if compute[r] else work_epi[r] / (ksteps * work_iter[r] + work_epi[r])
    return best, burst


def resource_floor(*args, **kw):
    """The busiest resource's time of ``p`` tiles' whole work on one SM."""
    return busiest(*args, **kw)[0]


def seam(res, store, own_tiles, floor):
    """``(h, hf)``: what a wave (``res``, :func:`envelope_one`'s tuple) hides of
    the stores ``store`` draining from the wave before it: under its prologue,
    then under its loop and last compute step less its own stores and the
    tiles' overheads ``own_tiles``, never taking it below ``floor``."""
    h = min(res[1], store)
    hf = max(min(res[2] + res[3] - res[6] - own_tiles, store - h), 0.0)
    cap = max(res[0] - floor, 0.0)
    if h + hf > cap:
        h = min(h, cap)
        hf = cap - h
    return h, hf


def queued_wave(work_iter, work_epi, rate, shared, compute, p, sms, ksteps, stages, warps_tile,
                warps_full, lat, ovh_iter, ovh_tile, share_eff, sync, chain, streams, floor,
                expose=0.0):
    """One full wave of ``p`` slots by mean-value analysis: ``p`` customers, a
    queue of demand ``floor / p`` per tile and a delay of one slot's own wave
    increment (seam included) less that demand."""
    demand = floor / p
    if demand <= 0.0:
        return 0.0
    one = envelope_one(work_iter, work_epi, rate, shared, compute, 1, sms, ksteps, stages,
                       warps_tile, warps_full, lat, ovh_iter, ovh_tile, 0, share_eff, sync,
                       chain, streams, expose=expose)
    h, hf = seam(one, one[5], ovh_tile, resource_floor(
        work_iter, work_epi, rate, shared, compute, 1, sms, ksteps, warps_tile, warps_full,
        share_eff))
    delay = max(one[0] - h - hf - demand, 0.0)
    return p * ring_queue(delay, demand, p)


def wave_time(work_iter, work_epi, rate, shared, compute, tiles, sms, p, ksteps, stages,
              warps_tile, warps_full, lat, ovh_iter, ovh_tile, persistent, share_eff=1.0, sync=0.0,
              chain=0.0, streams=1.0, terms=11, conv=0.0, expose=0.0, tail_tc=0.0, tail_smem=1.0,
              tail_cuda=1.0):
    """``(T, T_pro, T_steady, T_epi, steady_iter, waves, tail_tiles)``: full waves
    of ``sms * p`` tiles, then a tail of fewer tiles on fewer SMs (recomputed);
    a persistent grid is one run of ``ceil(tiles / sms)`` tiles per SM.
    ``terms``: bit 1 the queued wave, bit 2 the ring's queue in the loop, bit 4
    (without bit 2) a floor of that queue, bit 8 the busiest resource's floor
    between waves (the model: 11; the screen's bound: 4). ``conv``: a tile's
    layout conversion, serial at each turnover between full waves (``p`` of
    them, pipelined with the C stores' issue out of the SM at its L2 share): a
    later wave takes at least its time less its stores' drain plus them.
    ``tail_tc > 0``: the tail runs at the tensor (0), shared-memory (3) and
    CUDA-core (1) rates times ``tail_tc``, ``tail_smem``, ``tail_cuda`` and its
    busiest SMs' L1.5 rate (4) times their tiles over the mean tiles of its busy
    SMs, and takes at least ``tail / (sms p)`` of a full wave at ``rate``."""
    conc = sms * p
    ring = 1 if terms & 2 else (2 if terms & 4 else 0)
    args = (work_iter, work_epi, rate, shared, compute)
    if persistent:
        per_sm = math.ceil(tiles / sms)
        res = envelope_one(*args, p, min(sms, tiles), ksteps, stages, warps_tile, warps_full,
                           lat, ovh_iter, ovh_tile, per_sm, share_eff, sync, chain, streams,
                           ring=ring, expose=expose)
        return (*res[:5], math.ceil(tiles / conc), tiles % conc)
    full, tail = divmod(tiles, conc)
    total = [0.0, 0.0, 0.0, 0.0]
    steady_iter = 0.0
    store = 0.0
    if full:
        res = envelope_one(*args, p, sms, ksteps, stages, warps_tile, warps_full, lat,
                           ovh_iter, ovh_tile, 0, share_eff, sync, chain, streams, ring=ring,
                           expose=expose)
        steady_iter = res[4]
        store = res[5]
        floor, beta = busiest(work_iter, work_epi, rate, shared, compute, p, sms, ksteps,
                              warps_tile, warps_full, share_eff) if terms & 8 else (0.0, 0.0)
        # a wave's prologue under the stores before it, then its loop and last
        # compute step (the loop time already hiding this wave's own epilogue
        # cannot hide more), never below the busiest resource
        h, hf = seam(res, store, p * ovh_tile, floor)
        inc = res[0] - h - hf
        if p > 1 and full > 1:  # out-of-step slots work under (1 - 1/p) of the rest
            inc = min(inc, max(floor, inc - (1.0 - 1.0 / p) * (store - h - hf)))
            # ... and queue for a memory resource fed in bursts (once-per-tile work)
            if terms & 1 and beta > 0.0:
                qd = queued_wave(work_iter, work_epi, rate, shared, compute, p, sms, ksteps,
                                 stages, warps_tile, warps_full, lat, ovh_iter, ovh_tile,
                                 share_eff, sync, chain, streams, floor, expose)
                qd = min(qd, res[0])  # never more than the wave alone
                if qd > inc:
                    inc += beta * (qd - inc)
        hf_c = min(hf, res[3])  # hidden: off the drain first, then off the loop
        # the p slots turn over together: each block exits after its conversion
        # (shared memory) and its C stores' issue at the SM's share of the L2
        # rate (resource 5), pipelined over the p slots; only the stores' drain
        # past the L2 may run under the next wave
        issue = work_epi[5] * sms / rate[5] if rate[5] > 0.0 else 0.0
        turn = (max(res[0] - store + p * max(conv, issue) + min(conv, issue) - inc, 0.0)
                if conv > 0.0 else 0.0)
        inc += turn
        # one wave plus (full - 1) waves less the hidden part (no cancellation)
        total[0] += res[0] + (full - 1) * inc
        total[1] += res[1] + (full - 1) * (res[1] - h)
        total[2] += res[2] + (full - 1) * (res[2] - (hf - hf_c))
        total[3] += res[3] + (full - 1) * (res[3] - hf_c + turn)
    if tail:
        pt = math.ceil(tail / sms)
        trate = list(rate)
        if tail_tc > 0.0:
            trate[0] = rate[0] * tail_tc
            trate[3] = rate[3] * tail_smem
            trate[1] = rate[1] * tail_cuda
        sh15 = pt * min(tail, sms) / tail if tail_tc > 0.0 and pt > 1 else 1.0
        targs = (work_iter, work_epi, trate, shared, compute)
        res = list(envelope_one(*targs, pt, min(tail, sms), ksteps, stages,
                                warps_tile, warps_full, lat, ovh_iter, ovh_tile, 0, share_eff, sync,
                                chain, streams, ring=ring, expose=expose, l15_share=sh15))
        frate = list(trate)
        frate[4] = trate[4] * sh15
        if tail_tc > 0.0:
            one = envelope_one(*args, p, sms, ksteps, stages, warps_tile, warps_full, lat,
                               ovh_iter, ovh_tile, 0, share_eff, sync, chain, streams, ring=ring,
                               expose=expose)[0]
            power = one * tail / conc
            if power > res[0]:
                res[2] += power - res[0]
                res[0] = power
        for i in range(4):
            total[i] += res[i]
        if not full:
            steady_iter = res[4]
        hidden, hf = seam(res, store, pt * ovh_tile, resource_floor(
            work_iter, work_epi, frate, shared, compute, pt, min(tail, sms), ksteps, warps_tile,
            warps_full, share_eff) if terms & 8 else 0.0)
        hf_c = min(hf, res[3])
        total[0] -= hidden + hf
        total[1] -= hidden
        total[2] -= hf - hf_c
        total[3] -= hf_c
    return (*total, steady_iter, full + (1 if tail else 0), tail)


def l15_chip_floor(avg_iter, avg_epi, rate_l15, tiles, sms, ksteps, lat):
    """The grid's L1.5 requests plus its DRAM fills (its average tile's, times the
    tiles) at the tier's chip rate (the per-SM rate times ``sms``), after one
    latency; 0 without the tier."""
    chip = rate_l15 * sms
    if chip <= 0.0:
        return 0.0
    L15, DRAM = 4, 6  # tsbatch.kernels.envelope.R_NAMES
    total = (tiles * (ksteps * avg_iter[L15] + avg_epi[L15])
             + tiles * (ksteps * avg_iter[DRAM] + avg_epi[DRAM]))
    return lat + total / chip


def utilization(work_iter, work_epi, rate, shared, tiles, sms, ksteps, total):
    """Fraction of ``total`` each resource is busy: the grid's work over the
    chip-wide rate (a private resource's per-SM rate times the SM count)."""
    out = []
    for r in range(len(work_iter)):
        chip = rate[r] if shared[r] else rate[r] * sms
        if chip <= 0.0 or total <= 0.0:
            out.append(0.0)
            continue
        busy = tiles * (ksteps * work_iter[r] + work_epi[r]) / chip
        out.append(min(1.0, busy / total))
    return out


# ----------------------------------------------------------------------
# GEMM lowering (kernels_catalog/gemm.py docstrings of lower and its helpers)
# ----------------------------------------------------------------------
GEMM_DTYPES = {"float16": (2, 2, "float16"), "bfloat16": (2, 2, "bfloat16"),
               "float32": (4, 4, "tf32"), "float8": (1, 2, "float8")}
#: fixed per-thread registers of the GEMM register estimate (addresses, loop state)
REGS_BASE_GEMM = 40
#: the same for Triton's FMA dot (IEEE FP32)
REGS_BASE_FMA = 20


def _ceil_div(a: int, b: int) -> int:
    return (a + b - 1) // b


def _fma_grid(bm: int, bn: int, warps: int) -> tuple[int, int, int, int, int]:
    """Triton's FMA-dot layout as Triton builds it: the dot's sizePerThread from
    the accumulator elements a thread gets, then BlockedEncodingAttr's default
    builder along N (order [1, 0]) and M: (s, lanes_m, lanes_n, warps_m, warps_n)."""
    per_thread = (bm * bn) // (32 * warps)
    s = 4 if per_thread >= 16 else 2 if per_thread >= 4 else 1
    threads_n = min(32 * warps, max(1, bn // s))
    lanes_n = min(threads_n, 32)
    warps_n = min(max(threads_n // lanes_n, 1), warps)
    return s, 32 // lanes_n, lanes_n, warps // warps_n, warps_n


def fma_demand(bm: int, bn: int, bk: int, warps: int, a_rm: bool, b_rm: bool) -> float:
    """Twin of kernels_catalog.gemm._fma_demand: ptxas's registers for the FMA dot
    from its layouts (accumulators, 0.37 per row of A and k-slice of BK / 8, 3.1 per
    row of a K-contiguous A, 4.2 per column of a K-contiguous B, 2.7 per 16-byte
    vector a thread copies an iteration, 25.4)."""
    _s, _lm, _ln, rows, cols = fma_layout(bm, bn, warps)
    threads = 32 * warps
    d = (bm * bn) // threads + 0.37 * rows * max(bk // 8, 1) + 25.4
    d += 2.7 * (bm * bk + bk * bn) / 4.0 / threads
    return d + (3.1 * rows if a_rm else 0.0) + (0.0 if b_rm else 4.2 * cols)


def fma_layout(bm: int, bn: int, warps: int) -> tuple[int, int, int, int, int]:
    """Twin of kernels_catalog.gemm._fma_layout: (s, lanes_m, lanes_n, rows, cols)."""
    s, lanes_m, lanes_n, warps_m, warps_n = _fma_grid(bm, bn, warps)
    rows = s * max(bm // (s * lanes_m * warps_m), 1)
    cols = s * max(bn // (s * lanes_n * warps_n), 1)
    return s, lanes_m, lanes_n, rows, cols


def _shared_load_wavefronts(addrs: list, v: int) -> int:
    """Wavefronts of one warp-wide shared load of ``v`` 4-byte words a lane at the
    word addresses ``addrs`` (32 lanes): ``v`` phases of ``32 / v`` lanes, half as
    many when lanes n and n^1 (or n^2) always share an address; each phase one
    wavefront per bank conflict among its distinct addresses."""
    lanes = 32 // v
    if v > 1 and (all(addrs[i] == addrs[i ^ 1] for i in range(32))
                  or all(addrs[i] == addrs[i ^ 2] for i in range(32))):
        lanes *= 2
    total = 0
    for start in range(0, 32, lanes):
        banks: dict = {}
        for a in set(addrs[start:start + lanes]):
            for w in range(v):
                banks.setdefault((a + w) % 32, set()).add(a + w)
        total += max(len(words) for words in banks.values())
    return total


def fma_smem_bytes(bm: int, bn: int, bk: int, warps: int, a_row_major: bool,
                   b_row_major: bool) -> float:
    """Twin of kernels_catalog.gemm._fma_smem_bytes: build every lane's shared
    addresses for one warp's loads of one k (four k for a K-contiguous operand),
    count each load's wavefronts lane by lane, then scale by BK and the warps."""
    s, lanes_m, lanes_n, warps_m, warps_n = _fma_grid(bm, bn, warps)
    _s, _lm, _ln, rows, cols = fma_layout(bm, bn, warps)
    row_step, col_step = s * lanes_m * warps_m, s * lanes_n * warps_n

    def lane_rows(lane):
        lm = lane // lanes_n
        return [(r0 + lm * s + i) % bm for r0 in range(0, rows // s * row_step, row_step)
                for i in range(s)]

    def lane_cols(lane):
        ln = lane % lanes_n
        return [(c0 + ln * s + j) % bn for c0 in range(0, cols // s * col_step, col_step)
                for j in range(s)]

    per_k = 0.0
    if a_row_major:  # A[BM][BK]: a 16-byte vector of four k per row
        for i in range(rows):
            per_k += _shared_load_wavefronts([lane_rows(l)[i] * bk for l in range(32)], 4) / 4
    else:  # A[BK][BM]: per k, a vector of s rows
        for i in range(0, rows, s):
            per_k += _shared_load_wavefronts([lane_rows(l)[i] for l in range(32)], s)
    if b_row_major:  # B[BK][BN]: per k, a vector of s columns
        for j in range(0, cols, s):
            per_k += _shared_load_wavefronts([lane_cols(l)[j] for l in range(32)], s)
    else:  # B[BN][BK]: a 16-byte vector of four k per column
        for j in range(cols):
            per_k += _shared_load_wavefronts([lane_cols(l)[j] * bk for l in range(32)], 4) / 4
    return 128.0 * bk * warps * per_k


def mn32_store_wavefronts(width: int) -> int:
    """Wavefronts of one warp's 4-byte store of an M/N-contiguous TF32 operand
    (``width`` its contiguous extent) into Triton's K-major tile for warpgroup
    MMA, lane by lane: a thread holds four consecutive elements along M (N),
    ``min(32, width / 4)`` lanes run along M and the rest along K; the tile is
    K-major, a row of 32 words (128 bytes) per m, whose 4-word chunks are
    XORed with ``m mod 8``; one instruction stores element ``j`` of every lane.
    The wavefronts are the most distinct words any bank receives."""
    tpm = max(min(32, width // 4), 1)
    worst = 0
    for j in range(4):
        banks: dict[int, set] = {}
        for lane in range(32):
            mm = 4 * (lane % tpm) + j
            kk = lane // tpm
            chunk = (kk // 4) ^ (mm % 8)
            word = mm * 32 + chunk * 4 + kk % 4
            banks.setdefault(word % 32, set()).add(word)
        worst = max(worst, max(len(v) for v in banks.values()))
    return worst


def operand_vector_bytes(ld: int, eb: int) -> int:
    """Bytes a thread moves per global access of an operand whose rows start
    ``ld`` elements apart, as Triton vectorizes it when ``ld`` is a compile-time
    constant: the widest power-of-two run of elements at which every row start
    is aligned, times ``eb``, at most 16 bytes."""
    run = 1
    while ld % (run * 2) == 0 and run * eb < 16:
        run *= 2
    return min(run * eb, 16)


def operand_sram_passes(v: int) -> float:
    """SRAM traffic (L1 and shared memory share it) of a ``v``-byte-a-thread
    operand copy, in multiples of its bytes: 16-byte copies bypass L1 and only
    write shared memory; narrower ones also fill L1 and are read back out of it,
    and the read and the shared store each take a 128-byte wavefront per warp
    instruction even when the warp moves fewer bytes (32 lanes x ``v``)."""
    if v == 16:
        return 1.0
    warp_bytes = 32 * v
    wavefront_per_byte = max(128 / warp_bytes, 1.0)
    return 1.0 + 2.0 * wavefront_per_byte


def wgmma_smem_reads(bm: int, bn: int, bk: int, eb: int, wg_m: int, wg_n: int,
                     per_instruction: bool) -> int:
    """Shared-memory bytes one tile step's warpgroup MMAs read. Triton on sm_90
    (``per_instruction``): one m64nN (N <= 256) instruction per 64 rows and per
    256 columns of a warpgroup's share, each reading its A rows and B columns.
    Otherwise one read of A per warpgroup along N, of B per warpgroup along M."""
    if not per_instruction:
        return bk * eb * (wg_n * bm + wg_m * bn)
    a_reads = 0
    b_reads = 0
    n_wg = bn // wg_n
    for _wn in range(wg_n):
        for _wm in range(wg_m):
            rows = bm // wg_m
            for _rm in range(max(rows // 64, 1)):  # 64-row instructions of this warpgroup
                for c0 in range(0, n_wg, 256):  # at most 256 columns each
                    cols = min(256, n_wg - c0)
                    a_reads += min(rows, 64) * bk * eb
                    b_reads += cols * bk * eb
    return a_reads + b_reads


def warp_grid_one(bm: int, bn: int, warps: int) -> tuple[int, int]:
    """Warps along M and N of a warp-level MMA tile (kernels_catalog.gemm._warp_grid):
    grow M while the per-warp rows (16 per MMA) are at least the per-warp columns
    (8 per MMA) and M has room, else N if it has room, else M anyway."""
    wm = wn = 1
    while wm * wn < warps and wm * wn < 64:
        if bm // (16 * wm) >= bn // (8 * wn) and bm >= 32 * wm:
            wm *= 2
        elif bn >= 16 * wn:
            wn *= 2
        else:
            wm *= 2
    return wm, wn


def gemm_lower_one(row: dict, hw) -> dict:
    """One candidate's lowered quantities, as ``lower`` documents them.

    ``row``: m, n, k, block_m, block_n, block_k, num_stages, num_warps,
    split_k, dtype, tf32, a_row_major, b_row_major (positive sizes)."""
    # B row-major with n = 1 (A column-major with m = 1) has both strides 1:
    # the same memory as the K-contiguous layout, lowered as that one
    row = dict(row)
    if not row["a_row_major"] and row["m"] == 1:
        row["a_row_major"] = True
    if row["b_row_major"] and row["n"] == 1:
        row["b_row_major"] = False
    bm, bn, bk = row["block_m"], row["block_n"], row["block_k"]
    warps, split = row["num_warps"], row["split_k"]
    eb, ob, tc_key = GEMM_DTYPES[row["dtype"]]
    on_tc = row["dtype"] != "float32" or bool(row["tf32"])
    ksteps = max(_ceil_div(_ceil_div(row["k"], split), bk), 1)
    g0, g1 = _ceil_div(row["m"], bm), _ceil_div(row["n"], bn)
    wgmma = (hw.mma in ("wgmma", "tcgen05") and on_tc and warps >= hw.cal("wgmma_min_warps")
             and warps % 4 == 0 and bm % 64 == 0)
    # warpgroups: along M while a warpgroup gets more than 64 rows, then along N
    wg_m = wg_n = 1
    while 4 * wg_m * wg_n < warps and wg_m * wg_n < 16:
        if bm > 64 * wg_m:
            wg_m *= 2
        else:
            wg_n *= 2
    wm, wn = warp_grid_one(bm, bn, warps)
    threads = warps * 32
    # float8: FP32 promotion of the partial sums (two accumulators in registers)
    # unless fast accumulation; block scaling always promotes; no FP8 tensor
    # cores: operands converted to fp16 (fp16 rate)
    f8 = row["dtype"] == "float8"
    mode = row.get("scale_mode", "tensor")
    emul8 = f8 and hw.tc_tflops("float8") <= 0.0
    promo = f8 and (not bool(row.get("fast_accum", False)) or mode == "block")
    acc = (bm * bn) // max(threads, 1)
    want = (2 * acc if promo else acc) + REGS_BASE_GEMM
    if on_tc or row.get("backend") == "cublas":
        if not wgmma:
            # double-buffered fragments of 16 elements of K, at most one 32-byte
            # MMA K-step (TF32's m16n8k8) on the tensor cores
            kb = min(16 * eb, 32) if on_tc else 16 * eb
            # Triton's TF32 keeps BK / 16 of those steps in flight from BK = 64 on
            steps = 2
            if on_tc and eb == 4 and row.get("backend") != "cublas":
                steps = max(2, bk // 16)
            want += steps * (bm // wm + bn // wn) * kb // 128
    else:  # Triton's FMA dot: a thread's rows of A and columns of B for BK / 8 k
        _s, _lm, _ln, rows, cols = fma_layout(bm, bn, row["num_warps"])
        want += (rows + cols) * max(bk // 8, 1) - REGS_BASE_GEMM + REGS_BASE_FMA
    cap = min(hw.max_registers_per_thread, (hw.sm_registers // max(threads, 1)) // 8 * 8)
    if not (on_tc or row.get("backend") == "cublas") and want > cap \
            and fma_demand(bm, bn, bk, row["num_warps"], row["a_row_major"],
                           row["b_row_major"]) <= cap:
        want = cap  # ptxas spills the FMA dot only where its layouts' demand exceeds the cap
    spill = max(want - cap, 0)
    a_run = (bk if row["a_row_major"] else bm) * eb
    b_run = (bn if row["b_row_major"] else bk) * eb
    # edge tiles move only their in-bounds rows / columns: m / ceil(m / BM) on average
    rows_a, cols_b = row["m"] / g0, row["n"] / g1
    # and along K (Triton's masked loads): ksteps steps over ceil(k / split)
    # elements move that many; library rows fetch whole BK steps
    kdim = _ceil_div(row["k"], split)
    kk = kdim / ksteps if kdim < ksteps * bk and row.get("backend", "triton") != "cublas" else bk
    a_fetch = rows_a * kk * eb * (math.ceil(a_run / 32) * 32 / a_run)
    b_fetch = kk * cols_b * eb * (math.ceil(b_run / 32) * 32 / b_run)
    # the busiest SM's tile is a whole one: min(BM, m) rows, min(BN, n) columns
    rows_w, cols_w = min(row["m"], bm), min(row["n"], bn)
    a_crit = rows_w * kk * eb * (math.ceil(a_run / 32) * 32 / a_run)
    b_crit = kk * cols_w * eb * (math.ceil(b_run / 32) * 32 / b_run)
    blocks = bk / 128
    nb = _ceil_div(bn, 128)
    # the cache model sees every block at its full tile size
    a_foot = bm * bk * eb * (math.ceil(a_run / 32) * 32 / a_run)
    b_foot = bk * bn * eb * (math.ceil(b_run / 32) * 32 / b_run)
    # DRAM time of each operand's DRAM share: a contiguous run shorter than the
    # DRAM's access (dram_access_bytes) costs a whole access, at most twice its
    # sectors; a tile spanning the
    # operand's whole contiguous extent reads its rows back to back as one run
    g_dram = max(hw.cal("dram_access_bytes"), 32.0)
    m_, n_, k_ = row["m"], row["n"], row["k"]
    ra = ((k_ * bm if k_ <= bk else bk) if row["a_row_major"] else (m_ * bk if m_ <= bm else bm)) * eb
    rb = ((n_ * bk if n_ <= bn else bn) if row["b_row_major"] else (k_ * bn if k_ <= bk else bk)) * eb
    dram_scale = tuple(min(math.ceil(r / g_dram) * g_dram / (math.ceil(r / 32) * 32), 2.0)
                       for r in (ra, rb)) + (1.0,)
    if f8 and mode == "block":  # fp32 1x128 (A) and 128x128 (B) scales
        a_fetch += rows_a * 4.0 * blocks
        b_fetch += max(nb * 4.0, 32.0) * blocks
        a_crit += rows_w * 4.0 * blocks
        b_crit += max(nb * 4.0, 32.0) * blocks
        a_foot += bm * 4.0 * blocks
        b_foot += max(nb * 4.0, 32.0) * blocks
    if wgmma:
        smem_reads = wgmma_smem_reads(bm, bn, bk, eb, wg_m, wg_n,
                                      hw.mma == "wgmma" and row.get("backend", "triton") != "cublas")
    elif on_tc or row.get("backend") == "cublas":  # library SGEMM: conflict-free staging
        smem_reads = bk * eb * (wn * bm + wm * bn)
    else:
        smem_reads = fma_smem_bytes(bm, bn, bk, row["num_warps"], row["a_row_major"],
                                    row["b_row_major"])
    # Triton's TF32 on Hopper's warpgroup MMA: each element of an M/N-contiguous
    # operand is stored into the K-major swizzled tile by one 4-byte store, whose
    # warp's bank conflicts are counted lane by lane (mn32_store_wavefronts);
    # before Triton 3.3 those operands pass through registers inside the
    # iteration (one ring slot, no pipelining)
    mn32 = 0.0
    a_mn = b_mn = False
    if (wgmma and hw.mma == "wgmma" and row["dtype"] == "float32"
            and row.get("backend", "triton") != "cublas"):
        a_mn, b_mn = not row["a_row_major"], bool(row["b_row_major"])
        for on, width, elems in ((a_mn, bm, bm * bk), (b_mn, bn, bk * bn)):
            if on:
                mn32 += elems * (mn32_store_wavefronts(width) / 32.0 * hw.smem_bytes_per_clk - eb)
    version = str(row.get("triton_version", "3.6"))
    major, minor = version.split(".")[:2]
    release = (int(major), int(re.match(r"\d+", minor).group()))
    staged = (a_mn or b_mn) and release < (3, 3)
    pipe_stages = 1 if staged else row["num_stages"]
    # Triton's operand loads: vectorized to the alignment of their rows' starts;
    # under 4 bytes a thread (a 16-bit operand with an odd leading dimension)
    # a load is not pipelined but issued inside the iteration into one buffer
    # (the library's kernels come in the same operand alignments: same rule)
    va = operand_vector_bytes(row["k"] if row["a_row_major"] else row["m"], eb)
    vb = operand_vector_bytes(row["n"] if row["b_row_major"] else row["k"], eb)
    if row.get("backend") == "cublas":
        # one alignment per library kernel (CUTLASS: A and B at `alignment`, C at
        # min(8, alignment)): the narrowest of A's and B's rows, and of C's
        # (n > 1) where they allow fewer than 8 elements
        al = min(va // eb, vb // eb)
        ac = operand_vector_bytes(row["n"], ob) // ob if row["n"] > 1 else 8
        if ac < 8:
            al = min(al, ac)
        va = vb = al * eb
    a_sync, b_sync = va < 4, vb < 4
    if (a_sync or b_sync) and not staged:
        pipe_stages = 1
    elif (row["num_stages"] == 1 and eb == 2 and on_tc and not wgmma and not staged
          and row.get("backend", "triton") != "cublas"):
        # Triton's one-stage mma.sync loop of 16-bit operands: the next K step's
        # global loads issue ahead of this step's HMMAs (SASS), one load in flight,
        # as a 2-stage ring; TF32 and FP8 loops issue them after the HMMAs
        pipe_stages = 2
    # a tensor-core Triton tile's loop-carried pointer tensors: 2 registers per
    # vector a thread loads, beyond what 16-byte vectors need (in REGS_BASE),
    # where the loop iterates; their spills are reloaded once per iteration
    ptr_spill = 0
    if on_tc and row.get("backend", "triton") != "cublas" and ksteps > 1:
        extra = 0
        for v, elems in ((va, bm * bk // threads), (vb, bk * bn // threads)):
            if v < 16:
                extra += 2 * (elems * eb // v - elems * eb // 16)
        ptr_spill = max(want + extra - cap, 0) - spill
        want += extra
        spill += ptr_spill
    flops = 2.0 * bm * bn * bk
    cuda = 0.0 if on_tc else flops
    if emul8:  # a packed fp8x2 -> f16x2 conversion per two elements read
        cuda += smem_reads / eb
    if promo:  # an FADD (FFMA under block scaling) per accumulator element per 128 of K
        cuda += 2.0 * bm * bn * (bk / 128)
        if mode == "block":
            cuda += 2.0 * bm * nb * blocks
    c_bytes = rows_a * cols_b * ob
    l2_epi = bm * bn * 8.0 if split > 1 else c_bytes
    cuda_epi = 2.0 * bm * bn
    if f8 and mode == "tensor":
        cuda_epi += 2.0 * bm * bn
        l2_epi += 8.0
    elif f8 and mode == "row":
        cuda_epi += 4.0 * bm * bn
        l2_epi += (bm + bn) * 4.0
    path = 1.0 if wgmma else hw.mma_sync_fraction
    eff = hw.cal("tc_efficiency")
    # power-limited clock: fewer busy SMs than the chip run up to the full rate
    boost = min(1.0 / eff, hw.sm_count / max(min(g0 * g1 * split, hw.sm_count), 1)) if eff < 1.0 else 1.0
    # the CUDA cores' (per-clock) rate rises with the clock, up to its maximum
    # (the shared memory's ceiling over the measured clock, the CUDA cores' over the
    # clock their rate is stated at)
    cuda_boost = smem_boost = boost
    if hw.max_clock_mhz > 0:
        cuda_boost = min(boost, max(hw.max_clock_mhz / (hw.fp32_clock_mhz or hw.rate("clock_mhz")), 1.0))
        smem_boost = min(boost, max(hw.max_clock_mhz / hw.rate("clock_mhz"), 1.0))
    # more tiles than SMs (Triton rows; library rows on sm80-style GPUs): the last round of tiles at its busy SMs'
    # clock, the earlier rounds at the full grid's (the tensor cores only)
    # warpgroup-MMA GPUs: a Triton tensor-core row's clock is the envelope's, by
    # waves of resident slots (the full waves at these unboosted rates, the last
    # at the rates times the caps below: wave_time's tail)
    slot = hw.mma == "wgmma" and row.get("backend", "triton") != "cublas" and eff < 1.0 and on_tc
    s_cap = min(1.0 / eff, max(hw.max_clock_mhz / hw.rate("clock_mhz"), 1.0)) \
        if hw.max_clock_mhz > 0 else 1.0 / eff
    c_cap = min(1.0 / eff, max(hw.max_clock_mhz / (hw.fp32_clock_mhz or hw.rate("clock_mhz")), 1.0)) \
        if hw.max_clock_mhz > 0 else 1.0 / eff
    if slot:
        boost = cuda_boost = smem_boost = 1.0
    rounds_boost = 1.0
    rounds_clk = rounds_smem = 1.0
    grid = g0 * g1 * split
    lib_rounds = hw.mma not in ("wgmma", "tcgen05")  # sm80-style library grids
    if eff < 1.0 and grid > hw.sm_count and (lib_rounds or row.get("backend") != "cublas") \
            and not slot:
        rounds = -(-grid // hw.sm_count)
        last = grid - (rounds - 1) * hw.sm_count
        tail = min(1.0 / eff, hw.sm_count / last)
        rounds_boost = rounds / ((rounds - 1) + 1.0 / tail)
        if on_tc:  # the per-clock rates too, up to the maximum clock
            tail_c = tail_s = tail
            if hw.max_clock_mhz > 0:
                tail_c = min(tail, max(hw.max_clock_mhz / (hw.fp32_clock_mhz or hw.rate("clock_mhz")), 1.0))
                tail_s = min(tail, max(hw.max_clock_mhz / hw.rate("clock_mhz"), 1.0))
            rounds_clk = rounds / ((rounds - 1) + 1.0 / tail_c)
            rounds_smem = rounds / ((rounds - 1) + 1.0 / tail_s)
    # Triton's FMA dot: a warp's chain of one iteration, its FFMAs at one
    # scheduler's FP32 rate and its own shared-load wavefronts in series, plus one
    # L2 wait per spilled word where the spills do not fit the L1 that the
    # driver's shared-memory carve-out leaves
    mma_kind = on_tc or row.get("backend") == "cublas"
    chain = 0.0
    ring = max(row["num_stages"] - 1, 1)
    smem_block = ((1 if a_sync else ring) * bm * bk + (1 if b_sync else ring) * bk * bn) * eb
    if wgmma and hw.mma == "wgmma" and row.get("backend", "triton") != "cublas":
        # sm_90: num_stages ring slots, one for an operand staged through registers
        # or loaded inside the iteration
        st = row["num_stages"]
        smem_block = ((1 if (staged and a_mn) or a_sync else st) * bm * bk
                      + (1 if (staged and b_mn) or b_sync else st) * bk * bn) * eb
    if not mma_kind:
        sched_rate = hw.rate("fp32_tflops") * 1e6 / hw.sm_count * cuda_boost / hw.warp_schedulers
        chain = (flops / row["num_warps"]) / sched_rate \
            + smem_reads / 128.0 / row["num_warps"] / hw.rate("clock_mhz")
    if not mma_kind and spill > 0:
        p, _ = resident_one(smem_block, min(want, cap), threads, 32, hw.sm_smem_bytes,
                            hw.smem_per_block_bytes, hw.smem_reserved_per_block_bytes,
                            hw.sm_registers, hw.register_alloc_unit, hw.sm_max_warps,
                            hw.sm_max_threads, hw.sm_max_blocks, hw.max_threads_per_block)
        p = max(p, 1)
        # the driver's carve-out: as much shared memory as the blocks that every
        # other limit allows would use, at most the SM's
        p_other, _ = resident_one(0, min(want, cap), threads, 32, hw.sm_smem_bytes,
                                  hw.smem_per_block_bytes, hw.smem_reserved_per_block_bytes,
                                  hw.sm_registers, hw.register_alloc_unit, hw.sm_max_warps,
                                  hw.sm_max_threads, hw.sm_max_blocks, hw.max_threads_per_block)
        carve = min(max(p_other, p) * (smem_block + hw.smem_reserved_per_block_bytes),
                    hw.sm_smem_bytes)
        # each spilled word reloaded once an iteration, from L2 past the L1 the
        # carve-out leaves, else from L1; the resident tiles' warps wait together
        # (one wait a round of the p tiles' iterations, on the scheduler's issue)
        miss = spill * 4 * threads * p > hw.l1_smem_bytes - carve
        wait = spill * hw.cal("l2_latency_cycles" if miss else "l1_latency_cycles") \
            / hw.rate("clock_mhz")
        chain += wait
        cuda += wait / p * hw.rate("fp32_tflops") * 1e6 / hw.sm_count * cuda_boost
    return {
        "g0": g0, "g1": g1, "ksteps": ksteps, "tiles": g0 * g1 * split,
        "smem_block": smem_block, "stages": pipe_stages,
        "threads": threads, "regs_thread": min(want, cap), "register_spill": spill,
        "mma_path": "wgmma" if wgmma else ("mma_sync" if on_tc else "fma"),
        "tensor_core": flops if on_tc else 0.0, "cuda_core": cuda,
        "l2_iter": a_fetch + b_fetch,
        "smem": smem_reads + (bm * bk * operand_sram_passes(va)
                              + bk * bn * operand_sram_passes(vb)) * eb + mn32
        + (spill - ptr_spill) * 8.0 * threads * (math.ceil(bk / (32 // eb if on_tc else 1)) if mma_kind else 1)
        + ptr_spill * 8.0 * threads,
        "chain_us": chain,
        "t_bytes": (a_fetch, b_fetch, c_bytes),
        "t_foot": (a_foot, b_foot, float(bm * bn * ob)),
        "t_crit": (a_crit, b_crit, float(rows_w * cols_w * ob)),
        "c_more": 0.0 if split > 1 else rows_w * cols_w * ob - c_bytes,
        "t_dram_scale": dram_scale,
        "l2_epi": l2_epi,
        "dram_epi": bm * bn * 4.0 if split > 1 else c_bytes,
        "cuda_epi": cuda_epi,
        "tc_rate": (hw.tc_tflops("float16" if emul8 else tc_key) * 1e6 / hw.sm_count * path
                    * eff * boost * rounds_boost),
        "tc_clock_cap": 1.0 / eff if slot else 0.0,
        "smem_clock_cap": s_cap if slot else 0.0,
        "cuda_clock_cap": c_cap if slot else 0.0,
        "cuda_rate": hw.rate("fp32_tflops") * 1e6 / hw.sm_count * cuda_boost * rounds_clk,
        "smem_rate": hw.smem_bytes_per_clk * hw.rate("clock_mhz") * smem_boost * rounds_smem,
        "share_eff": hw.cal("wgmma_share_efficiency") if wgmma else 1.0,
        "useful_flops": 2.0 * row["m"] * row["n"] * row["k"],
        # Triton's wgmma epilogue: the C tile through shared memory (written, read)
        # Triton's 2-stage FMA dot does not prefetch: each iteration exposes the
        # copy of the next tile, an L2 hit's latency and the copy's SRAM writes
        "expose_us": (hw.cal("l2_latency_cycles") / hw.rate("clock_mhz")
                      + (bm * bk * operand_sram_passes(va) + bk * bn * operand_sram_passes(vb)) * eb
                      / (hw.smem_bytes_per_clk * hw.rate("clock_mhz") * smem_boost * rounds_smem)
                      if not mma_kind and pipe_stages == 2 else 0.0),
        "conv_us": (2.0 * bm * bn * ob / (hw.smem_bytes_per_clk * hw.rate("clock_mhz") * smem_boost
                                             * rounds_smem)
                    if wgmma and row.get("backend", "triton") != "cublas"
                    and row.get("order", "grouped") != "persistent" else 0.0),
    }


def library_epilogue_chain_one(bm: int, bn: int, warps: int, ksteps: int, p: int,
                               pass_us: float, hide_us: float) -> float:
    """Per-tile time a library sm80-style tensor-core tile's epilogue adds to its
    SM (kernels_catalog.gemm._epilogue_chain): one pass of ``pass_us`` per 8 rows
    of the warp tile, less ``hide_us`` for each main-loop step past the first,
    the ``p`` resident tiles' chains side by side."""
    wm, _ = warp_grid_one(bm, bn, warps)
    passes = max(bm // wm // 8, 1)
    c = passes * pass_us - (ksteps - 1) * hide_us
    return c / max(p, 1) if c > 0.0 else 0.0


def library_split_serial_one(bm: int, bn: int, warps: int, split: int, sm80: bool,
                             link_us: float, pass_us: float) -> float:
    """Serial chain of a library split-K call that reduces in place
    (kernels_catalog.gemm._split_serial_chain): ``split - 1`` links of
    ``link_us``, each plus the waiter's epilogue passes (one of ``pass_us`` per
    8 rows of its warp tile) on sm80-style tensor-core tiles."""
    c = link_us
    if sm80:
        wm, _ = warp_grid_one(bm, bn, warps)
        c += max(bm // wm // 8, 1) * pass_us
    return (split - 1) * c if split > 1 else 0.0


def gemm_admit(row: dict) -> int:
    """The first rule of ``kernels_catalog.gemm.ADMIT_RULES`` a GEMM row breaks
    (1-based; 0: none), one row at a time in plain Python floats, as
    ``kernels_catalog.gemm.admit`` documents it."""
    f = float
    m, n, k = f(row["m"]), f(row["n"]), f(row["k"])
    bm, bn, bk = f(row["block_m"]), f(row["block_n"]), f(row["block_k"])
    eb = float(GEMM_DTYPES[row["dtype"]][0])
    split = max(f(row.get("split_k", 1)), 1.0)
    tri = row.get("backend", "triton") != "cublas"
    big = 2.0 ** 63
    flops = 2.0 * m * n * k
    elems = max(m * k, k * n, m * n) * 4.0
    ga, gb = math.ceil(m / max(bm, 1.0)), math.ceil(n / max(bn, 1.0))
    tiles = ga * gb * split
    blocks = (ga + gb) * split
    steps = math.ceil(math.ceil(k / split) / max(bk, 1.0))
    smem = max(f(row["num_stages"]) - 1.0, 1.0) * (bm * bk + bk * bn) * eb
    numel = 1 << 20

    def pow2(v: int) -> bool:
        return v > 0 and v & (v - 1) == 0

    ib = [int(row[c]) for c in ("block_m", "block_n", "block_k", "num_warps")]
    rules = [
        not flops < big or not elems < big,
        not tiles <= 2 ** 31 - 1,
        not blocks <= 1 << 24,
        not tiles * max(steps, 1.0) < 2.0 ** 62,
        not smem < 2.0 ** 62,
        not f(row["num_warps"]) < 2.0 ** 20,
        *(tri and not pow2(v) for v in ib),
        tri and ib[0] < 16, tri and ib[1] < 16, tri and ib[2] < 16,
        tri and eb == 1.0 and ib[2] < 32,
        tri and (bm * bn > numel or bm * bk > numel or bk * bn > numel),
    ]
    for j, hit in enumerate(rules):
        if hit:
            return j + 1
    return 0


def split_traffic_one(t_bytes, per_step, h15, h2, dram, has_l15: bool, work_iter, work_epi,
                      tiles: int, ksteps: int, r_l15: int, r_l2: int, r_dram: int,
                      dram_scale=None):
    """One row of ``tsbatch.kernels.traffic.split_traffic``: its tensors' requested
    bytes per step split by its cache problem's hit rates (``h15``, ``h2``,
    ``dram`` per tensor); ``dram_scale`` (per tensor, or None) multiplies each
    tensor's bytes on their way to DRAM only. Returns ``(work_iter, l15_hit, l2_hit, dram_bytes,
    l2_bytes)``; sums run left to right from the first tensor."""
    req = [float(b) if s else 0.0 for b, s in zip(t_bytes, per_step)]

    def total(xs):
        s = 0.0
        for j, x in enumerate(xs):
            s = x if j == 0 else s + x
        return s

    miss15 = [r * (1.0 - h) for r, h in zip(req, h15)]
    req_tot = total(req)
    l2_b = total(miss15)
    dreq = req if dram_scale is None else [r * float(s) for r, s in zip(req, dram_scale)]
    dram_b = total([r * d for r, d in zip(dreq, dram)])
    wi = [float(v) for v in work_iter]
    wi[r_l15] = req_tot if has_l15 else 0.0
    wi[r_l2] = l2_b
    wi[r_dram] = dram_b
    l2_hit = total([a * h for a, h in zip(miss15, h2)]) / l2_b if l2_b > 0 else 0.0
    l15_hit = total([r * h for r, h in zip(req, h15)]) / req_tot if req_tot > 0 else 0.0
    return (wi, l15_hit, l2_hit, float(tiles) * (float(ksteps) * dram_b + work_epi[r_dram]),
            float(tiles) * (float(ksteps) * l2_b + work_epi[r_l2]))


def compulsory_work_one(t_bytes, per_step, t_mask, grid, p: int, sms: int, wave_samples: int,
                        margin: float, has_l15: bool, dram_scale, work_iter, r_l15: int,
                        r_l2: int, r_dram: int):
    """One row of ``tsbatch.kernels.traffic.compulsory_work`` (the screen's bound):
    the requested bytes per step on L1.5 (on L2 without an L1.5 tier), and each
    per-step tensor's compulsory share ``(1 - margin) / share - 1e-11`` of them
    on L2 (L1.5 parts) and DRAM (times ``dram_scale``), ``share`` the product of
    the grid dimensions in its reuse mask, where the launch has at most
    ``wave_samples`` waves of ``sms * max(p, 1)`` tiles; else none."""
    tiles = grid[0] * grid[1] * grid[2]
    waves = -(-tiles // (sms * max(p, 1)))
    whole = tiles > 0 and waves <= wave_samples
    req, l2, dram = [], [], []
    for t, (b, s, m) in enumerate(zip(t_bytes, per_step, t_mask)):
        r = float(b) if s else 0.0
        frac = 0.0
        if whole and s:
            share = 1.0
            for d in range(3):
                share *= float(grid[d]) if (m >> d) & 1 else 1.0
            if share > 0.0:
                frac = max((1.0 - margin) / share - 1e-11, 0.0)
        req.append(r)
        l2.append(r * frac)
        dram.append((r if dram_scale is None else r * float(dram_scale[t])) * frac)

    def total(xs):
        s = 0.0
        for j, x in enumerate(xs):
            s = x if j == 0 else s + x
        return s

    wi = [float(v) for v in work_iter]
    wi[r_l15] = total(req) if has_l15 else 0.0
    wi[r_l2] = total(l2) if has_l15 else total(req)
    wi[r_dram] = total(dram)
    return wi


def bottleneck_one(util, lat: float, launch: float, min_util: float, n_res: int) -> int:
    """One row of ``tsbatch.kernels.traffic.bottleneck_codes``: the index of the
    largest utilization (the first of equals; NaN counts as -1), ``n_res`` when
    that is below ``min_util`` (``n_res + 1`` when the launch is also over half
    the latency), ``n_res + 2`` when the latency is not finite."""
    if not math.isfinite(lat):
        return n_res + 2
    vals = [-1.0 if math.isnan(u) else u for u in util]
    idx = vals.index(max(vals))
    best = 0.0 if math.isnan(util[idx]) else util[idx]
    if best < min_util:
        return n_res + 1 if launch > 0.5 * lat else n_res
    return idx


# ----------------------------------------------------------------------
# cache problems whose per-step blocks are keyed by the plane (attention's
# K and V) in closed form (tsbatch/kernels/reuse.py, _cache_planes)
# ----------------------------------------------------------------------
def cache_planes_one(g0, g1, g2, conc, ksteps, mask, per_step, tbytes, cap2, assoc2, nsm,
                     g15, cap15, assoc15, k_samples=4, max_waves=8, weights=True,
                     drop_zero=True):
    """Twin of ``reuse._cache_planes``: per-tensor ``(h15, h2, dram)`` lists of
    a panel-order grid whose per-step tensors (those moving bytes) all have a
    block per plane (reused along rows and columns) or all one block, integer
    block sizes. The programs reading a block are a segment of ``R``
    consecutive programs (``g0 g1`` or the whole grid). Per step of a wave,
    segment by segment: its first slot is a first touch (cold, or, when the
    segment began in the wave before, the cross-wave distance ``tail + head +
    once bytes of that wave + (kf - 1 - s) footprint(wave before) + s
    footprint(wave)``, footprints ``segments x B``, averaged over the sampled
    steps ``s``); its other slots re-touch at distance ``B - b``, the first
    slot of the segment in each L1.5 group (counted here slot by slot) hitting
    L2 only. The sampled waves and their weights are ``reuse._cache_one``'s.
    """
    T = len(mask)
    h15 = [0.0] * T
    h2 = [0.0] * T
    dram = [1.0] * T
    step_t = [t for t in range(T) if per_step[t]]
    P = g0 * g1 * g2
    if not step_t or P == 0:
        return h15, h2, dram
    span = (1 if g0 > 1 else 0) | (2 if g1 > 1 else 0) | (4 if g2 > 1 else 0)
    live = [t for t in step_t if not (tbytes[t] == 0 and drop_zero)]
    keyed = {span & ~mask[t] for t in live}
    assert len(keyed) == 1 and keyed <= {0, 4}, "not a plane-keyed problem"
    R = g0 * g1 if keyed == {4} else P
    unit = sum(tbytes[t] for t in step_t) / len(step_t)
    tot = sum(tbytes[t] for t in step_t)
    once = sum(tbytes[t] for t in range(T) if not per_step[t])
    use15 = g15 > 0 and cap15 > 0 and assoc15 > 0
    W, waves, wt_in, ks, svals, kf = _closed_samples(P, conc, ksteps, max_waves, k_samples,
                                                     weights)

    def sdcm2(d):
        return hit_prob_gauss(d / unit, assoc2, cap2 / unit)

    def segments(start, nw):
        """Slot lists of the segments of the wave's programs ``start ..``."""
        segs = {}
        for p in range(nw):
            segs.setdefault((start + p) // R, []).append(p)
        return list(segs.values())

    head = 0.0
    for t in step_t:
        b = tbytes[t]
        h_q, head = head, head + b
        if b == 0 and drop_zero:
            continue
        d = tot - b
        e = hit_prob_gauss(d / unit, assoc15, cap15 / unit) if use15 else 0.0
        sums = (0.0, 0.0, 0.0, 0.0)  # accesses, L1.5 hits, L2 requests, L2 hits
        for w in waves:
            start = w * conc
            nw = min(conc, P - start)
            segs = segments(start, nw)
            foot = len(segs) * tot
            x = 0.0
            if w >= 1 and start % R != 0:
                prev = len(segments(start - conc, conc))
                base = (tot - h_q - b) + h_q + conc * once
                x = sum(sdcm2(base + (kf - 1 - s) * prev * tot + s * foot) for s in svals) / ks
            G = sum(len({(p % nsm) // g15 for p in sl}) if use15 else 1 for sl in segs)
            h_re = 1.0 if sdcm2(foot) >= 1.0 - 1e-12 else sdcm2(d)
            sums = _closed_wave(sums, kf, nw, G, len(segs), e, x, h_re,
                                wt_in if 0 < w < W - 1 else 1.0)
        acc, hit15, req2, hit2 = sums
        if acc == 0.0:
            continue
        h15[t] = hit15 / acc
        h2[t] = hit2 / req2 if req2 > 0.0 else 0.0
        dram[t] = (req2 - hit2) / acc
    return h15, h2, dram


def pos_key_tensor_one(per_step, mask, koff, P: int, conc: int) -> int:
    """Twin of ``reuse._pos_key_tensor``: the per-step tensor with a block per
    tile (an id span of ``P``), reused along neither rows nor columns, whose id
    range is the last one, in a launch of more than one wave; else -1."""
    T = len(per_step)
    if conc >= P:
        return -1
    for t in range(T):
        if (per_step[t] and koff[t + 1] - koff[t] == P and mask[t] & 3 == 0
                and koff[t + 1] == koff[T]):
            return t
    return -1


def streams_and_tile_one(clen, koff, P: int) -> tuple[int, int, int]:
    """Twin of ``reuse._streams_and_tile``: where exactly three tensors have
    candidates (``clen[t] > 0``), one of them with a block per tile (an id span
    ``koff[t + 1] - koff[t]`` of ``P``), the other two in order and that one;
    else (-1, -1, -1)."""
    have = [t for t in range(len(koff) - 1) if clen[t] > 0]
    tile = [t for t in have if koff[t + 1] - koff[t] == P]
    rest = [t for t in have if t not in tile]
    if len(have) != 3 or len(tile) != 1:
        return -1, -1, -1
    return rest[0], rest[1], tile[0]

def pair_tensors_one(per_step, tbytes, mask, g0: int, g1: int, g2: int) -> tuple[int, int]:
    """Twin of ``reuse._pair_tensors``: the first two per-step tensors next to
    each other in a tile's step with equal masks and equal bytes above 0,
    reused along a dimension of more than one tile, where every per-step size is
    an integer and their total over the grid stays below 2^50; else (-1, -1)."""
    P = g0 * g1 * g2
    span = (g0 > 1) | ((g1 > 1) << 1) | ((g2 > 1) << 2)
    steps = [t for t in range(len(per_step)) if per_step[t]]
    sizes = [float(tbytes[t]) for t in steps]
    if any(not (x >= 0.0 and x == math.floor(x)) for x in sizes):
        return -1, -1
    if not sum(sizes) * P < float(1 << 50):
        return -1, -1
    for ta, tb in zip(steps, steps[1:]):
        if mask[ta] == mask[tb] and tbytes[ta] == tbytes[tb] and tbytes[tb] > 0 and mask[tb] & span:
            return ta, tb
    return -1, -1
