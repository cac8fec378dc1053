"""Tile reuse distances and multi-level hit rates over a launch order.

TileSight §3.5. Each tensor access of a tile plan has a per-tile block size
in bytes, a set of *reuse dimensions* (grid dimensions along which the same
block is read again) and a cadence: read every step of the reduction loop
(``per_step = 1``, e.g. GEMM's A and B tiles) or once per tile after the
loop (``per_step = 0``, e.g. the output store). The reuse key of a block is
the tile coordinate projected onto the non-reuse dimensions (Eq. 6); a
per-step block is additionally keyed by its reduction step.

The analysed sequence is the idealised issue order: tiles run in waves of
``conc`` consecutive programs of the launch order; inside a wave all tiles
advance through the reduction loop together, each step touching every
tile's per-step blocks in wave order; after the last step every tile
touches its once-per-tile blocks. Distances are LRU stack distances in
bytes (distinct bytes touched since the previous access to the same block),
converted to tile units for the SDCM (:mod:`tsbatch.kernels.sdcm`).

Within a wave the step structure repeats, so within-step distances are
computed once per wave (exactly, with a Fenwick tree), and the distance of
a block's first touch in a step, whose previous touch lies in an earlier
wave, is a linear function of the step index ``s``; it is *sampled along
the reduction axis* at ``k_samples`` steps. Unions of blocks over runs of
waves are accumulated as "new since the previous wave" prefix sums (exact
for launch orders in which a block never skips a wave and comes back, an
upper bound otherwise).

On chips with an L1.5 tier (one per group of ``l15_group_sms`` SMs), the
same within-step analysis is repeated on each group's subsequence (tile
``p`` of a wave runs on SM ``p mod sm_count``); L2 receives the L1.5 misses
and DRAM the L2 misses (the cascade of §3.5.3).
"""

from __future__ import annotations

import math

import numpy as np
from numba import prange

from tsbatch.kernels._config import jit_parallel, jit_scalar, jit_serial
from tsbatch.kernels.order import ORDER_COL, ORDER_ROW, ORDER_ZORDER, launch_order, tile_coords
from tsbatch.kernels.sdcm import hit_prob_gauss

__all__ = ["cache_hit_rates", "step_distances"]


@jit_scalar
def _fw_add(tree, i, v):
    i += 1
    n = tree.shape[0]
    while i < n:
        tree[i] += v
        i += i & (-i)


@jit_scalar
def _fw_prefix(tree, i):
    s = 0.0
    while i > 0:
        s += tree[i]
        i -= i & (-i)
    return s


@jit_serial
def step_distances(ids, wts, n, last_idx, tree, out):
    """Exact LRU stack distances (in weight units) within ``ids[:n]``.

    ``out[j]`` is the total weight of distinct ids touched strictly between
    the previous touch of ``ids[j]`` and ``j``, or ``inf`` on a first touch.
    ``last_idx`` (indexed by id, all ``-1``) and ``tree`` (length > n, all
    zero) are scratch and are restored before returning.
    """
    tree = tree[:n + 1]  # the Fenwick tree spans exactly this sequence
    for j in range(n):
        k = ids[j]
        lj = last_idx[k]
        if lj < 0:
            out[j] = math.inf
        else:
            out[j] = _fw_prefix(tree, j) - _fw_prefix(tree, lj + 1)
            _fw_add(tree, lj, -wts[lj])
        _fw_add(tree, j, wts[j])
        last_idx[k] = j
    for j in range(n):
        last_idx[ids[j]] = -1
    for j in range(n + 1):
        tree[j] = 0.0


@jit_serial
def _cache_one(g0, g1, g2, order, group, conc, ksteps, mask, per_step, tbytes,
               cap2, assoc2, nsm, g15, cap15, assoc15, k_samples, max_waves,
               max_lookback, out_h15, out_h2, out_dram):
    T = mask.shape[0]
    P = g0 * g1 * g2
    zorder = order == ORDER_ZORDER
    x = np.empty((3, P if zorder else 0), dtype=np.int64)
    if zorder:
        launch_order(order, g0, g1, g2, group, x[0], x[1], x[2])
    gdim = np.array([g0, g1, g2], dtype=np.int64)
    # id space: per-step tensors only, each over its non-reuse dimensions
    koff = np.zeros(T + 1, dtype=np.int64)
    for t in range(T):
        span = 0
        if per_step[t] != 0:
            span = 1
            for d in range(3):
                if (mask[t] >> d) & 1 == 0:
                    span *= gdim[d]
        koff[t + 1] = koff[t] + span
    c3 = np.empty(3, dtype=np.int64)
    # key strides: a block's key linearizes its non-reuse coordinates
    kstr = np.zeros((T, 3), dtype=np.int64)
    for t in range(T):
        stride = 1
        for d in range(3):
            if (mask[t] >> d) & 1 == 0:
                kstr[t, d] = stride
                stride *= gdim[d]

    n_step = 0
    unit = 0.0
    once_bytes = 0.0
    for t in range(T):
        if per_step[t] != 0:
            n_step += 1
            unit += tbytes[t]
        else:
            once_bytes += tbytes[t]
    for t in range(T):
        out_h15[t] = 0.0
        out_h2[t] = 0.0
        out_dram[t] = 1.0
    if n_step == 0 or P == 0:
        return
    unit /= n_step
    B2 = cap2 / unit
    B15 = cap15 / unit
    use15 = g15 > 0 and cap15 > 0.0 and assoc15 > 0
    ngroups = (nsm + g15 - 1) // g15 if use15 else 1

    W = (P + conc - 1) // conc
    # waves whose hit rates are evaluated (all, or evenly spaced samples)
    sampled = np.zeros(W, dtype=np.bool_)
    if W <= max_waves:
        sampled[:] = True
    else:
        for i in range(max_waves):
            sampled[(i * (W - 1)) // (max_waves - 1)] = True
    ks = ksteps if ksteps < k_samples else k_samples
    svals = np.empty(ks, dtype=np.float64)
    for i in range(ks):
        svals[i] = math.floor((i + 0.5) * ksteps / ks)

    nid = koff[T]
    lastwave = np.full(nid, -1, dtype=np.int64)
    fstamp = np.full(nid, -1, dtype=np.int64)
    bstamp = np.full(nid, -1, dtype=np.int64)
    tail_b = np.zeros(nid, dtype=np.float64)
    last_idx = np.full(nid, -1, dtype=np.int64)
    ustep = np.zeros(W, dtype=np.float64)
    newcum = np.zeros(W + 1, dtype=np.float64)
    oncecum = np.zeros(W + 1, dtype=np.float64)

    L = conc * n_step
    ids = np.empty(L, dtype=np.int64)
    wts = np.empty(L, dtype=np.float64)
    ten = np.empty(L, dtype=np.int64)
    grp = np.empty(L, dtype=np.int64)
    dist = np.empty(L, dtype=np.float64)
    head = np.zeros(L, dtype=np.float64)
    h15 = np.zeros(L, dtype=np.float64)
    tree = np.zeros(L + 1, dtype=np.float64)
    sub_ids = np.empty(L, dtype=np.int64)
    sub_wts = np.empty(L, dtype=np.float64)
    sub_j = np.empty(L, dtype=np.int64)
    sub_d = np.empty(L, dtype=np.float64)
    goff = np.zeros(ngroups + 1, dtype=np.int64)
    gfill = np.zeros(ngroups, dtype=np.int64)

    acc = np.zeros(T, dtype=np.float64)
    hit15 = np.zeros(T, dtype=np.float64)
    req2 = np.zeros(T, dtype=np.float64)
    hit2 = np.zeros(T, dtype=np.float64)
    kf = float(ksteps)

    # lookback window: waves further back than this cannot hold a block in L2
    # (their distance exceeds 4x the capacity even at the minimum footprint of
    # a wave: a block of tensor t serves at most prod(reuse dims) tiles, so a
    # full wave touches at least ceil(conc / that) of its blocks per step)
    cw = conc if conc < P else P
    foot = 0.0
    for t in range(T):
        if per_step[t] == 0:
            continue
        share = 1
        for d in range(3):
            if (mask[t] >> d) & 1 == 1:
                share *= gdim[d]
        foot += tbytes[t] * ((cw + share - 1) // share)
    foot *= kf
    lookback = W
    if foot > 0.0:
        lb = int(math.ceil(4.0 * cap2 / foot)) + 1
        if lb < lookback:
            lookback = lb
    if lookback > max_lookback:
        lookback = max_lookback
    valid_from = 0
    done = -1
    for w in range(W):
        if not sampled[w]:
            continue
        ws = w - lookback
        if ws <= done:
            ws = done + 1
        else:
            valid_from = ws
        for wv in range(ws, w + 1):
            _wave(wv, wv == w, valid_from, P, conc, T, per_step, kstr, tbytes, gdim, koff, c3, x,
                  zorder, order, g0, g1, g2, group, use15, nsm, g15, ngroups, once_bytes,
                  unit, B2, B15, assoc2, assoc15, ks, svals, kf,
                  lastwave, fstamp, bstamp, tail_b, last_idx, ustep, newcum, oncecum,
                  ids, wts, ten, grp, dist, head, h15, tree, sub_ids, sub_wts, sub_j, sub_d,
                  goff, gfill, acc, hit15, req2, hit2)
        done = w
    for t in range(T):
        if per_step[t] == 0 or acc[t] == 0.0:
            continue
        out_h15[t] = hit15[t] / acc[t]
        out_h2[t] = hit2[t] / req2[t] if req2[t] > 0.0 else 0.0
        out_dram[t] = (req2[t] - hit2[t]) / acc[t]


@jit_serial
def _wave(w, do_hits, valid_from, P, conc, T, per_step, kstr, tbytes, gdim, koff, c3, x,
          zorder, order, g0, g1, g2, group, use15, nsm, g15, ngroups, once_bytes,
          unit, B2, B15, assoc2, assoc15, ks, svals, kf,
          lastwave, fstamp, bstamp, tail_b, last_idx, ustep, newcum, oncecum,
          ids, wts, ten, grp, dist, head, h15, tree, sub_ids, sub_wts, sub_j, sub_d,
          goff, gfill, acc, hit15, req2, hit2):
    """Book-keep wave ``w`` (and, if ``do_hits``, add its accesses' hit rates)."""
    if True:
        start = w * conc
        nw = P - start
        if nw > conc:
            nw = conc
        # ---- the step sequence of this wave (coordinates stepped incrementally:
        # one division per wave instead of several per tile)
        gm = group if group > 0 else 1
        cr, cc, cz = tile_coords(order, g0, g1, g2, group, start)
        first = (cr // gm) * gm
        size = g0 - first
        if size > gm:
            size = gm
        j = 0
        for p in range(nw):
            pid = start + p
            if zorder:
                cr = x[0, pid]
                cc = x[1, pid]
                cz = x[2, pid]
            for t in range(T):
                if per_step[t] == 0:
                    continue
                ids[j] = koff[t] + cr * kstr[t, 0] + cc * kstr[t, 1] + cz * kstr[t, 2]
                wts[j] = tbytes[t]
                ten[j] = t
                grp[j] = ((p % nsm) // g15) if use15 else 0
                j += 1
            if zorder:
                continue
            if order == ORDER_ROW:
                cc += 1
                if cc == g1:
                    cc = 0
                    cr += 1
                    if cr == g0:
                        cr = 0
                        cz += 1
            elif order == ORDER_COL:
                cr += 1
                if cr == g0:
                    cr = 0
                    cc += 1
                    if cc == g1:
                        cc = 0
                        cz += 1
            else:  # grouped / persistent: column-major inside a panel of `size` rows
                cr += 1
                if cr == first + size:
                    cr = first
                    cc += 1
                    if cc == g1:
                        cc = 0
                        first += gm
                        if first >= g0:
                            first = 0
                            cz += 1
                        size = g0 - first
                        if size > gm:
                            size = gm
                        cr = first
        n = j
        # ---- first touches in the step: bytes before them, new bytes vs previous wave
        run = 0.0
        newb = 0.0
        for j in range(n):
            k = ids[j]
            if fstamp[k] != w:
                fstamp[k] = w
                head[j] = run
                run += wts[j]
                if lastwave[k] != w - 1 or w - 1 < valid_from:
                    newb += wts[j]
                dist[j] = math.inf
            else:
                dist[j] = -1.0
        ustep[w] = run
        newcum[w + 1] = newcum[w] + newb
        oncecum[w + 1] = oncecum[w] + nw * once_bytes
        if do_hits:
            # every within-step distance is below the step's footprint; when
            # even that footprint surely hits (monotone SDCM), skip the tree
            if hit_prob_gauss(run / unit, assoc2, B2) >= 1.0 - 1e-12:
                for j in range(n):
                    if dist[j] < 0.0:
                        dist[j] = 0.0
            else:
                step_distances(ids, wts, n, last_idx, tree, dist)
            # ---- L1.5: within-step reuse inside each SM group (bucketed by group)
            for j in range(n):
                h15[j] = 0.0
            if use15:
                for gi in range(ngroups + 1):
                    goff[gi] = 0
                for j in range(n):
                    goff[grp[j] + 1] += 1
                for gi in range(ngroups):
                    goff[gi + 1] += goff[gi]
                    gfill[gi] = goff[gi]
                for j in range(n):
                    q = gfill[grp[j]]
                    sub_ids[q] = ids[j]
                    sub_wts[q] = wts[j]
                    sub_j[q] = j
                    gfill[grp[j]] = q + 1
                for gi in range(ngroups):
                    a0 = goff[gi]
                    m = goff[gi + 1] - a0
                    if m == 0:
                        continue
                    step_distances(sub_ids[a0:], sub_wts[a0:], m, last_idx, tree, sub_d)
                    for q in range(m):
                        h15[sub_j[a0 + q]] = hit_prob_gauss(sub_d[q] / unit, assoc15, B15)
            # ---- L2 hit of every access of the wave, all steps
            for j in range(n):
                t = ten[j]
                if dist[j] < math.inf:
                    h = hit_prob_gauss(dist[j] / unit, assoc2, B2)
                else:
                    wp = lastwave[ids[j]]
                    if wp < valid_from:
                        h = 0.0
                    else:
                        u1 = ustep[wp] + (newcum[w] - newcum[wp + 1])
                        u2 = ustep[wp + 1] + (newcum[w + 1] - newcum[wp + 2])
                        umid = 0.0
                        if wp + 1 <= w - 1:
                            umid = ustep[wp + 1] + (newcum[w] - newcum[wp + 2])
                        base = tail_b[ids[j]] + umid + head[j] + (oncecum[w] - oncecum[wp])
                        h = 0.0
                        for i in range(ks):
                            s = svals[i]
                            d_b = base + (kf - 1.0 - s) * u1 + s * u2
                            h += hit_prob_gauss(d_b / unit, assoc2, B2)
                        h /= ks
                acc[t] += kf
                hit15[t] += kf * h15[j]
                req2[t] += kf * (1.0 - h15[j])
                hit2[t] += kf * (1.0 - h15[j]) * h
        # ---- tail bytes (distinct bytes after a block's last touch in the step)
        run = 0.0
        for j in range(n - 1, -1, -1):
            k = ids[j]
            if bstamp[k] != w:
                bstamp[k] = w
                tail_b[k] = run
                run += wts[j]
                lastwave[k] = w


@jit_parallel
def _cache_batch(g0, g1, g2, order, group, conc, ksteps, mask, per_step, tbytes,
                 cap2, assoc2, nsm, g15, cap15, assoc15, k_samples, max_waves,
                 max_lookback, out_h15, out_h2, out_dram):
    n = g0.shape[0]
    for i in prange(n):
        _cache_one(g0[i], g1[i], g2[i], order[i], group[i], conc[i], ksteps[i],
                   mask[i], per_step[i], tbytes[i], cap2[i], assoc2[i], nsm[i],
                   g15[i], cap15[i], assoc15[i], k_samples, max_waves,
                   max_lookback, out_h15[i], out_h2[i], out_dram[i])


def cache_hit_rates(g0, g1, g2, order, group, conc, ksteps, mask, per_step, tbytes,
                    cap2, assoc2, nsm, g15, cap15, assoc15, k_samples=4, max_waves=1 << 30,
                    max_lookback=1 << 30):
    """Per-tensor hit rates for a batch of cache problems.

    Parameters are 1-D arrays of length ``n`` (one cache problem each) except
    ``mask``, ``per_step`` and ``tbytes``, which are ``(n, T)``: per tensor,
    the bit mask of reuse dimensions, the cadence flag and the block bytes.
    ``conc`` is the number of tiles resident at once (a wave), ``cap2`` and
    ``cap15`` capacities in bytes, ``nsm`` the SM count and ``g15`` the SMs
    per L1.5 group (0: no L1.5 tier).

    Returns
    -------
    h15, h2, dram : ndarray (n, T)
        Fraction of accesses hitting L1.5; fraction of L2 requests hitting
        L2; fraction of all accesses served by DRAM. Once-per-tile tensors
        get ``(0, 0, 1)`` (stores reach DRAM).
    """
    i64 = lambda a: np.ascontiguousarray(a, dtype=np.int64)  # noqa: E731
    f64 = lambda a: np.ascontiguousarray(a, dtype=np.float64)  # noqa: E731
    g0 = i64(g0)
    n = g0.shape[0]
    mask = i64(mask)
    T = mask.shape[-1] if mask.ndim > 1 else mask.shape[0] // max(n, 1)
    mask = mask.reshape(n, T)
    h15 = np.zeros((n, T), dtype=np.float64)
    h2 = np.zeros((n, T), dtype=np.float64)
    dram = np.ones((n, T), dtype=np.float64)
    if n == 0:
        return h15, h2, dram
    _cache_batch(g0, i64(g1), i64(g2), i64(order), i64(group), i64(conc), i64(ksteps),
                 mask, i64(per_step).reshape(n, T), f64(tbytes).reshape(n, T),
                 f64(cap2), f64(assoc2), i64(nsm), i64(g15), f64(cap15), f64(assoc15),
                 int(k_samples), int(max(max_waves, 2)), int(max(max_lookback, 1)), h15, h2, dram)
    return h15, h2, dram
