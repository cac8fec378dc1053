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
upper bound otherwise). A launch of more than ``max_waves`` waves is
*sampled along the waves*: the first, the last and evenly spaced interior
waves are analysed, each interior one weighted for its share of the
interior waves (the cold first wave counts once).

On chips with an L1.5 tier (one per group of ``l15_group_sms`` SMs), the
same within-step analysis is repeated on each group's subsequence (tile
``p`` of a wave runs on SM ``p mod sm_count``); L2 receives the L1.5 misses
and DRAM the L2 misses (the cascade of §3.5.3).

The hit rates of an analysed wave are computed by :func:`_hits_fast`
(memoized SDCM calls, cross-wave hits memoized per wave on their exact
inputs, L1.5 groups with equal access patterns solved once and groups whose
footprint surely hits skipped); the waves only book-kept for the lookback
are book-kept per distinct block on the panel orders (:func:`_book_blocks`),
and so are analysed waves whose step footprint surely hits in L2
(:func:`_hits_blocks`), which then need only per-group sums of L1.5 hit
probabilities: a group whose runs of programs lie in the launch order's
panels like an earlier group's (:func:`_group_sig`) reuses that group's.
A lookback window that no later analysed wave reads starts at the earliest
wave holding a previous touch of the analysed wave's blocks, found in closed
form on the panel orders (:func:`_window_start`); the waves before it would
be book-kept for nothing. With block sizes that are not integers (an average
edge tile), where those sums are exact no more, the waves only book-kept are
still book-kept per distinct block, their bytes added one by one in the
per-access order (``seq``), unless a tensor has a block per tile (as many
blocks as accesses): then per distinct block with the integer sizes' sums,
each as close to the exact sum as the per-access pass's running one. A
per-step tensor of zero bytes gets ``(0, 0,
1)`` and, where that is exact, leaves the sequence (:func:`_live_tensors`).
``cache_hit_rates(..., general=True)`` runs the original per-access code,
which tests/test_cache_fast.py holds the fast path equal to (bench/cache_speed.py
times the two).

Hot loops keep their memo probes in the loop body rather than in an inlined
helper: numba counts references to every array an inlined helper with
branches or loops takes (an atomic increment and decrement per array per
call, not pruned), which cost several times the probe itself. For the same
reason every kernel here but the allocating ones (``_cache_one``, the batch)
is compiled without numba's runtime (``jit_borrow``): its arrays are
borrowed from the caller and nothing is counted.

The kernels pass each other named records (:mod:`tsbatch.kernels._records`):
the ``Batch`` of problems (its columns, sampling and outputs), then per
problem the ``Problem`` (``pb``: grid, order, tensors, caches, sampling), its
``Book`` (``bk``: the book-keeping later waves read, and the hit sums), a
wave's ``Scratch`` (``sc``) and the ``Memo`` tables (``mm``); a kernel takes
those it uses and its wave's own scalars. numba passes a record as its
fields, so this costs nothing at run time (nor, measured, at compile time).

Counters that reach another kernel's arguments start as ``np.int64(0)``, not
``0``: numba's type inference first meets them as the literal ``0`` and
compiles the callee for that literal type, then again for ``int64`` (the only
one then called), so a cold start compiled ``_hits_fast`` six times.
"""

from __future__ import annotations

import math

import numpy as np

from tsbatch.kernels._config import (jit_borrow, jit_borrow_internal, jit_scalar,
                                     jit_scalar_call, jit_serial, jit_serial_internal)
from tsbatch.kernels._extern import separately_linked
from tsbatch.kernels._records import Batch, Book, Memo, Problem, Scratch
from tsbatch.kernels._threads import num_threads, run_shares
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


@jit_scalar
def _cross_terms(bk, k, head_j, w):
    """The reuse distance of block ``k``'s first touch in a step of wave ``w``
    (previous touch in wave ``wp = bk.lastwave[k]``) is ``base + (kf - 1 - s)
    u1 + s u2`` at reduction step ``s``: returns ``(base, u1, u2)``."""
    wp = bk.lastwave[k]
    ustep = bk.ustep
    newcum = bk.newcum
    u1 = ustep[wp] + (newcum[w] - newcum[wp + 1])
    u2 = ustep[wp + 1] + (newcum[w + 1] - newcum[wp + 2])
    umid = 0.0
    if wp + 1 <= w - 1:
        umid = ustep[wp + 1] + (newcum[w] - newcum[wp + 2])
    base = bk.tail_b[k] + umid + head_j + (bk.oncecum[w] - bk.oncecum[wp])
    return base, u1, u2


@jit_scalar
def _cross_mean(pb, base, u1, u2):
    """The L2 hit probability at distance ``base + (kf - 1 - s) u1 + s u2``
    averaged over the ``pb.ks`` sampled steps ``s``."""
    h = 0.0
    for i in range(pb.ks):
        s = pb.svals[i]
        h += hit_prob_gauss((base + (pb.kf - 1.0 - s) * u1 + s * u2) / pb.unit, pb.assoc2, pb.B2)
    return h / pb.ks


@jit_scalar
def _cross_wave_hit(pb, bk, k, head_j, w, valid_from):
    """L2 hit probability of block ``k``'s first touch in a step of wave ``w``,
    whose previous touch lies in an earlier wave: the distance is linear in
    the reduction step ``s`` and averaged over the ``ks`` sampled steps."""
    if bk.lastwave[k] < valid_from:
        return 0.0
    base, u1, u2 = _cross_terms(bk, k, head_j, w)
    return _cross_mean(pb, base, u1, u2)


#: slots of the per-problem memo of cross-wave hit probabilities (power of two)
XMEMO_SIZE = 512


@separately_linked
@jit_borrow_internal
def _cross_wave_hits(pb, bk, mm, fts, nft, ids, head, w, valid_from, hx):
    """``hx[j]`` for the first touches ``j = fts[:nft]`` (block ``ids[j]``,
    ``head[j]`` bytes first touched before it) of wave ``w``:
    :func:`_cross_wave_hit`, memoized per wave ``w`` (in ``mm.xtag``, ...) on
    the exact ``(wp, tail_b[k] + head_j)``: the rest of the distance
    (``umid``, the once-per-tile bytes, ``u1``, ``u2``) depends on ``w`` and
    ``wp`` alone, so equal keys mean the very same call. Blocks that share
    their previous wave and their bytes around the wave boundary (in a
    regular order, most of a wave's first touches) are solved once. Slots
    tagged with another wave are free. The distance sums its terms in
    another order than :func:`_cross_terms` (the same value for integer
    block sizes). The wave's arrays come one by one, not as its ``Scratch``:
    numba passes every field of a record, and with the 26 arrays of ``sc``
    this call made bench/cache_speed.py's h100 problems ~17 % slower (42 ->
    50 us each; alternated runs).

    One loop over the list with the probe written in it: an inlined helper
    that takes arrays and branches costs numba a reference count increment
    and decrement per array per call, several times the probe itself.
    """
    lastwave = bk.lastwave
    ustep = bk.ustep
    newcum = bk.newcum
    oncecum = bk.oncecum
    xtag = mm.xtag
    xwp = mm.xwp
    xs = mm.xs
    xval = mm.xval
    mask = xtag.shape[0] - 1
    for i in range(nft):
        j = fts[i]
        k = ids[j]
        wp = lastwave[k]
        if wp < valid_from:
            hx[j] = 0.0
            continue
        s = bk.tail_b[k] + head[j]
        if k >= pb.pair_lo and k < pb.pair_hi:  # a merged pair: the partner's bytes
            s += pb.pair_b
        h = np.int64(0)
        probe = s < 1e18
        found = False
        if probe:
            x = np.int64(s) ^ (wp * np.int64(0x9E3779B97F4A7C15 - (1 << 64)))
            h = ((x * np.int64(-7046029254386353131)) >> np.int64(40)) & mask
            for _ in range(_MEMO_PROBES):
                if xtag[h] != w:
                    break
                if xwp[h] == wp and xs[h] == s:
                    found = True
                    break
                h = (h + 1) & mask
        if found:
            hx[j] = xval[h]
            continue
        u1 = ustep[wp] + (newcum[w] - newcum[wp + 1])
        u2 = ustep[wp + 1] + (newcum[w + 1] - newcum[wp + 2])
        umid = 0.0
        if wp + 1 <= w - 1:
            umid = ustep[wp + 1] + (newcum[w] - newcum[wp + 2])
        v = _cross_mean(pb, s + (umid + (oncecum[w] - oncecum[wp])), u1, u2)
        if probe and xtag[h] != w:
            xtag[h] = w
            xwp[h] = wp
            xs[h] = s
            xval[h] = v
        hx[j] = v


@separately_linked
@jit_borrow
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


#: slots of the per-problem memo tables of SDCM hit probabilities (power of two)
MEMO_SIZE = 256
_MEMO_PROBES = 8


@separately_linked
@jit_borrow_internal
def _memo_hits(d, n, finite_only, assoc, blocks, unit, keys, vals, out):
    """``out[j] = hit_prob_gauss(d[j] / unit, assoc, blocks)`` for ``j < n``
    (only where ``d[j]`` is finite if ``finite_only``), memoized on the exact
    ``d[j]``.

    ``keys``/``vals`` form an open-addressing table (keys ``-1``: empty) valid
    for one ``(unit, assoc, blocks)``; a hit returns the stored result of the
    very same call, so the memo never changes a value. ``d`` holds distances
    in bytes (``>= 0`` or ``inf``). ``out`` may be ``d``. One loop with the
    probe written in it (see :func:`_cross_wave_hits`).
    """
    mask = keys.shape[0] - 1
    for j in range(n):
        dj = d[j]
        if not (dj < 1e18):  # inf (a first touch), or too large to hash as an int64
            if not finite_only or dj < math.inf:
                out[j] = hit_prob_gauss(dj / unit, assoc, blocks)
            continue
        x = np.int64(dj)
        h = ((x * np.int64(-7046029254386353131)) >> np.int64(40)) & mask
        v = -1.0
        for _ in range(_MEMO_PROBES):
            k = keys[h]
            if k == dj:
                v = vals[h]
                break
            if k < 0.0:
                v = hit_prob_gauss(dj / unit, assoc, blocks)
                keys[h] = dj
                vals[h] = v
                break
            h = (h + 1) & mask
        if v < 0.0:
            v = hit_prob_gauss(dj / unit, assoc, blocks)
        out[j] = v


#: slots of the per-problem table of L1.5 group patterns and their pooled labels
PAT_SLOTS = 64
PAT_POOL = 1 << 13
#: slots of the per-problem table of L1.5 group run layouts (power of two)
SIG_SLOTS = 64


@jit_scalar
def _advance(g0, g1, gm, cr, cc, cz, first, size, d):
    """The program ``d >= 0`` places after ``(cr, cc, cz)`` in a panel order:
    column-major inside a panel of ``gm`` rows (1 for row order, ``g0`` for
    column order, ``group`` for grouped and persistent), planes slowest; the
    current panel starts at row ``first`` and has ``size`` rows. Column by
    column, no division (``d = 1``: the next program)."""
    ro = cr - first + d
    while ro >= size:
        ro -= size
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
    return first + ro, cc, cz, first, size


@jit_scalar
def _group_sig(pb, sc, mm, gi, lo, hi, nw):
    """The layout of L1.5 group ``gi``'s runs of programs (slots ``lo + r
    nsm`` up to ``hi + r nsm`` of the wave of ``nw`` programs) in the panels
    of the launch order, into ``sc.sigbuf``: per run (per piece of a
    run, one per panel it crosses), its panel's first row and its own row,
    column and plane relative to the first run, its row offset in the
    panel, the panel's rows and its length. Programs of a piece step down
    the panel's rows and then across its columns, so equal layouts are equal
    tile coordinates up to a translation, so equal first-touch labels.
    Returns ``(ns, hash, slot)``: ``ns`` values (0 when ``pb.gsig`` is off
    or ``sigbuf`` is too short) and the slot of ``mm.sig_tab`` holding an
    equal layout (``sig_tab[slot, 0] == ns``), else a free slot for it, else
    -1. The runs' first programs come from ``sc.rsc`` (:func:`_run_starts`),
    and a run crossing a panel goes on at the next panel's first program: no
    division per run."""
    ns = np.int64(0)
    sh = np.int64(-3750763034362895579)
    if not pb.gsig:
        return 0, sh, -1
    ngroups = pb.ngroups
    nsm = pb.nsm
    g0 = pb.g0
    g1 = pb.g1
    gmb = pb.gm
    sigbuf = sc.sigbuf
    rsc = sc.rsc
    sig_tab = mm.sig_tab
    ar = 0
    ac = 0
    az = 0
    base = 0
    er = gi  # rsc entry of this run
    while base + lo < nw:
        pe = base + hi
        if pe > nw:
            pe = nw
        r0 = rsc[0, er]
        c0 = rsc[1, er]
        z0 = rsc[2, er]
        f0 = rsc[3, er]
        sz = rsc[4, er]
        er += ngroups
        ln = pe - (base + lo)
        while ln > 0:
            # programs fill a panel's sz x g1 tiles column by column (the last
            # panel of a plane ends with the plane); a run crossing a panel
            # goes in as one piece per panel
            seg = sz * g1 - (c0 * sz + (r0 - f0))
            if seg > ln:
                seg = ln
            if ns + 6 > sigbuf.shape[0]:
                return 0, sh, -1
            if ns == 0:
                ar = r0
                ac = c0
                az = z0
            sigbuf[ns] = f0 - ar
            sigbuf[ns + 1] = r0 - f0
            sigbuf[ns + 2] = sz
            sigbuf[ns + 3] = c0 - ac
            sigbuf[ns + 4] = z0 - az
            sigbuf[ns + 5] = seg
            # (the hash only picks the slot: equal layouts are found by comparing
            # every entry, and the first free slot of the full probe holds a new
            # one, so which layouts are stored does not depend on it; one product
            # a piece in the chain instead of six)
            sh = (sh ^ ((f0 - ar) + (r0 - f0) * np.int64(-7046029254386353131)
                        + sz * np.int64(-4658895280553007687)
                        + (c0 - ac) * np.int64(7640891576956012809)
                        + (z0 - az) * np.int64(-4417276706812531889)
                        + seg * np.int64(5573672497405405661))) * np.int64(1099511628211)
            ns += 6
            ln -= seg
            if ln > 0:  # on at the next panel's first program (or the next plane's)
                f0 += gmb
                if f0 >= g0:
                    f0 = 0
                    z0 += 1
                sz = g0 - f0
                if sz > gmb:
                    sz = gmb
                r0 = f0
                c0 = 0
        base += nsm
    if ns == 0:
        return 0, sh, -1
    smask = sig_tab.shape[0] - 1
    ps = (sh ^ (sh >> np.int64(31))) & smask
    for _ in range(sig_tab.shape[0]):
        sn = sig_tab[ps, 0]
        if sn < 0:
            return ns, sh, ps
        if sn == ns and mm.sig_hash[ps] == sh:
            same = True
            for e in range(ns):
                if sig_tab[ps, 2 + e] != sigbuf[e]:
                    same = False
                    break
            if same:
                return ns, sh, ps
        ps = (ps + 1) & smask
    return ns, sh, -1


@separately_linked
@jit_borrow
def _run_starts(start, nw, nsm, g15, ngroups, order, g0, g1, g2, group, gm, rsc):
    """The first program of every L1.5 group run of the wave of ``nw``
    programs from ``start`` on a panel order: run ``r`` of group ``gi``
    starts at wave slot ``r nsm + gi g15``; entry ``r ngroups + gi`` of
    ``rsc`` gets its row, column, plane, panel first row and panel rows
    (slots past the wave are not written). One set of divisions per wave,
    then steps along the order."""
    cr, cc, cz = tile_coords(order, g0, g1, g2, group, start)
    first = (cr // gm) * gm
    size = g0 - first
    if size > gm:
        size = gm
    prev = 0
    r = 0
    while r * nsm < nw:
        for gi in range(ngroups):
            pos = r * nsm + gi * g15
            if pos >= nw:
                break
            cr, cc, cz, first, size = _advance(g0, g1, gm, cr, cc, cz, first, size, pos - prev)
            prev = pos
            e = r * ngroups + gi
            rsc[0, e] = cr
            rsc[1, e] = cc
            rsc[2, e] = cz
            rsc[3, e] = first
            rsc[4, e] = size
        r += 1


@separately_linked
@jit_borrow_internal
def _group_l15(pb, sc, mm, ids, wts, lo, hi, nw, ns, sh, sslot):
    """``sc.h15[j]`` for the accesses ``j`` of an L1.5 group (wave slots
    ``lo + r nsm`` up to ``hi + r nsm`` of the wave of ``nw`` programs;
    ``ids``/``wts`` read there only) whose layout :func:`_group_sig` did not
    find: by the canonical labels of its accesses (rank of first touch),
    looked up in the pattern table or solved, then stored under the layout
    ``sc.sigbuf[:ns]`` (hash ``sh``) in slot ``sslot`` of ``mm.sig_tab`` (if
    ``>= 0``) with the per-position sums of its probabilities."""
    nsm = pb.nsm
    n_step = pb.n_step
    h15 = sc.h15
    last_idx = sc.last_idx
    sub_j = sc.sub_j
    sub_lab = sc.sub_lab
    pat_off = mm.pat_off
    pool_h15 = mm.pool_h15
    m = np.int64(0)
    nl = 0
    foot = 0.0
    hsh = np.int64(1469598103934665603)
    base = 0
    while base + lo < nw:
        pe = base + hi
        if pe > nw:
            pe = nw
        for p in range(base + lo, pe):
            j = p * n_step
            for q in range(n_step):
                k = ids[j]
                lb = last_idx[k]
                if lb < 0:
                    lb = nl
                    last_idx[k] = nl
                    nl += 1
                    foot += wts[j]
                    h15[j] = 0.0
                else:
                    h15[j] = 1.0
                sc.sub_ids[m] = k
                sub_j[m] = j
                sub_lab[m] = lb
                hsh = (hsh ^ lb) * np.int64(1099511628211)
                m += 1
                j += 1
        base += nsm
    if m == 0:
        return
    for q in range(m):
        last_idx[sc.sub_ids[q]] = -1
    # the pool room a pattern takes: its accesses, counting those of the tensors
    # left out of the sequence (pb.pool_step per tile and step), so that the pool
    # stores the very patterns it would with them (a stored group's probabilities
    # are summed before they are added: which groups are stored sets the rounding)
    mp = (m // n_step) * pb.pool_step
    # pool offset of this group's probabilities, if they get stored
    poff = -1
    # the group's footprint surely hits: every re-touch distance is below it,
    # so its probability is exactly 1 too (non-increasing SDCM), and a first
    # touch misses (as set above)
    if hit_prob_gauss(foot / pb.unit, pb.assoc15, pb.B15) == 1.0:
        if sslot >= 0 and pat_off[PAT_SLOTS] + mp <= PAT_POOL:
            poff = pat_off[PAT_SLOTS]
            pat_off[PAT_SLOTS] = poff + mp
            for q in range(m):
                pool_h15[poff + q] = h15[sub_j[q]]
    else:
        # a group with the same pattern (this wave or an earlier one) has the
        # same distances, so the same probabilities: reuse them. The slot of
        # the stored pattern equal to sub_lab[:m] (pat_m[slot] == m), else a
        # free slot for it (pat_m[slot] == -1), else -1 (table full); patterns
        # are compared element by element, the hash only picks the slot
        pat_m = mm.pat_m
        pmask = pat_m.shape[0] - 1
        ps = ((hsh ^ (hsh >> np.int64(29))) + m) & pmask
        slot = -1
        for _ in range(pat_m.shape[0]):
            pm = pat_m[ps]
            if pm < 0:
                slot = ps
                break
            if pm == m and mm.pat_hash[ps] == hsh:
                off = pat_off[ps]
                same = True
                for q in range(m):
                    if mm.pool_lab[off + q] != sub_lab[q]:
                        same = False
                        break
                if same:
                    slot = ps
                    break
            ps = (ps + 1) & pmask
        if slot >= 0 and pat_m[slot] == m:
            poff = pat_off[slot]
            for q in range(m):
                h15[sub_j[q]] = pool_h15[poff + q]
        else:
            sub_d = sc.sub_d
            for q in range(m):
                sc.sub_wts[q] = wts[sub_j[q]]
            step_distances(sc.sub_ids, sc.sub_wts, m, last_idx, sc.tree, sub_d)
            if pb.pair_q >= 0:  # (whole tiles: entry x is at position x mod n_step)
                for x in range(pb.pair_q, m, n_step):
                    sub_d[x] += pb.pair_b
            fill = pat_off[PAT_SLOTS]
            store = slot >= 0 and fill + mp <= PAT_POOL
            if store:
                pat_m[slot] = m
                mm.pat_hash[slot] = hsh
                pat_off[slot] = fill
                pat_off[PAT_SLOTS] = fill + mp
                poff = fill
            # np.bool_, not a literal: one compiled _memo_hits for both call sites
            _memo_hits(sub_d, m, np.bool_(False), pb.assoc15, pb.B15, pb.unit, mm.memo15_k,
                       mm.memo15_v, sub_d)
            for q in range(m):
                v = sub_d[q]
                h15[sub_j[q]] = v
                if store:
                    mm.pool_lab[fill + q] = sub_lab[q]
                    pool_h15[fill + q] = v
    if sslot >= 0 and poff >= 0:
        sig_tab = mm.sig_tab
        sig_s15 = mm.sig_s15
        sig_tab[sslot, 0] = ns
        sig_tab[sslot, 1] = poff
        mm.sig_hash[sslot] = sh
        for e in range(ns):
            sig_tab[sslot, 2 + e] = sc.sigbuf[e]
        for q in range(n_step):
            sig_s15[sslot, q] = 0.0
        for q in range(m):
            sig_s15[sslot, q % n_step] += pool_h15[poff + q]


@separately_linked
@jit_borrow_internal
def _hits_fast(pb, bk, sc, mm, w, valid_from, start, nw, n, nft, run):
    """The hit rates of wave ``w``'s accesses (``nw`` programs from ``start``,
    the ``n`` accesses of a step in ``sc``, of which the ``nft`` listed in
    ``sc.grp`` are first touches, ``run`` bytes), added to ``bk``'s sums:
    the general path's arithmetic, cheaper (tests/test_cache_fast.py proves
    the two equal).

    * SDCM probabilities of within-step distances come from per-problem memo
      tables keyed by the exact distance (the same call, made once);
    * the L1.5 subsequence of an SM group is read off its slot ranges (the
      slots ``p`` with ``(p mod nsm) div g15 == gi`` are whole runs) instead of
      bucketing every access by a division;
    * when the step footprint surely hits (the general path then sets every
      within-step distance to 0, whose probability is exactly 1) re-touches
      take ``h = 1`` without a call; per-tensor sums are gathered per wave and
      added once, scaled by ``ksteps``.
    """
    n_step = pb.n_step
    nsm = pb.nsm
    h15 = sc.h15
    skip = hit_prob_gauss(run / pb.unit, pb.assoc2, pb.B2) >= 1.0 - 1e-12
    if not skip:
        step_distances(sc.ids, sc.wts, n, sc.last_idx, sc.tree, sc.dist)
        if pb.pair_q >= 0:  # a merged pair's own distances: the partner's bytes
            for j in range(pb.pair_q, n, n_step):
                sc.dist[j] += pb.pair_b
    if pb.use15:
        if pb.gsig:
            _run_starts(start, nw, nsm, pb.g15, pb.ngroups, pb.order, pb.g0, pb.g1, pb.g2,
                        pb.group, pb.gm, sc.rsc)
        for gi in range(pb.ngroups):
            lo = gi * pb.g15
            hi = lo + pb.g15
            if hi > nsm:
                hi = nsm
            ns, sh, sslot = _group_sig(pb, sc, mm, gi, lo, hi, nw)
            if sslot >= 0 and mm.sig_tab[sslot, 0] == ns:
                # a group laid out like this one before: its probabilities
                off = mm.sig_tab[sslot, 1]
                base = 0
                while base + lo < nw:
                    pe = base + hi
                    if pe > nw:
                        pe = nw
                    a = (base + lo) * n_step
                    b = pe * n_step
                    for j in range(a, b):
                        h15[j] = mm.pool_h15[off + j - a]
                    off += b - a
                    base += nsm
                continue
            _group_l15(pb, sc, mm, sc.ids, sc.wts, lo, hi, nw, ns, sh, sslot)
    loc = sc.loc
    T = loc.shape[1]
    for t in range(T):
        for r in range(4):
            loc[r, t] = 0.0
    # L2 hit probability of every access (into sub_d, free after L1.5):
    # re-touches in the step, then the first touches (listed by the caller)
    hx = sc.sub_d
    if skip:
        for j in range(n):
            hx[j] = 1.0
    else:
        _memo_hits(sc.dist, n, np.bool_(True), pb.assoc2, pb.B2, pb.unit, mm.memo2_k,
                   mm.memo2_v, hx)
    _cross_wave_hits(pb, bk, mm, sc.grp, nft, sc.ids, sc.head, w, valid_from, hx)
    # per tensor (access q of every tile), in register accumulators
    for q in range(n_step):
        if q >= n:
            break
        t = sc.ten[q]
        a0 = 0.0
        a1 = 0.0
        a2 = 0.0
        a3 = 0.0
        if pb.use15:
            for j in range(q, n, n_step):
                x15 = h15[j]
                a0 += 1.0
                a1 += x15
                a2 += 1.0 - x15
                a3 += (1.0 - x15) * hx[j]
        else:
            for j in range(q, n, n_step):
                a0 += 1.0
                a2 += 1.0
                a3 += hx[j]
        loc[0, t] += a0
        loc[1, t] += a1
        loc[2, t] += a2
        loc[3, t] += a3
    kf = pb.kf
    for t in range(T):
        bk.acc[t] += kf * loc[0, t]
        bk.hit15[t] += kf * loc[1, t]
        bk.req2[t] += kf * loc[2, t]
        bk.hit2[t] += kf * loc[3, t]


#: a problem's per-step bytes summed over its tiles stay below this, so that every
#: sum of its block bytes (distances, footprints, the waves' new bytes) is an
#: exact integer in float64 (2^53 with room for the few terms a distance adds)
EXACT_BYTES = float(1 << 50)


@jit_scalar
def _grid_span(g0, g1, g2):
    """The grid's dimensions of more than one tile, as reuse-mask bits (1: rows,
    2: columns, 4: planes)."""
    span = 0
    if g0 > 1:
        span |= 1
    if g1 > 1:
        span |= 2
    if g2 > 1:
        span |= 4
    return span


@jit_scalar
def _live_tensors(per_step, tbytes, mask, P, g0, g1, g2):
    """The cadence flags of the accesses a problem's sequence keeps: ``per_step``
    itself, or a copy with the per-step tensors of zero bytes set to 0 where
    leaving them out changes no other tensor's result by a bit. Their accesses
    add nothing to any distance or footprint, but they are positions in the
    step sequence, where a float sum (a Fenwick prefix, a running total) may
    round otherwise when its terms move: with integer block sizes whose total
    over the grid stays below :data:`EXACT_BYTES`, every such sum is exact in
    any order. They are also labels of the L1.5 group patterns: one is left
    out only where its labels follow from the others' (its reuse dimensions,
    those of more than one tile, are none, a block per tile, or a kept
    tensor's), so that groups of equal patterns stay the groups of equal
    patterns. At least one tensor with bytes stays. (The unit, the mean
    per-step block bytes, and the L1.5 pattern pool's room are the caller's,
    counting them.)"""
    T = per_step.shape[0]
    span = _grid_span(g0, g1, g2)
    zeros = 0
    live = 0
    tot = 0.0
    for t in range(T):
        if per_step[t] == 0:
            continue
        b = tbytes[t]
        if b == 0.0:
            zeros += 1
        elif b == math.floor(b) and b > 0.0:
            live += 1
            tot += b
        else:
            return per_step
    if zeros == 0 or live == 0 or not (tot * P < EXACT_BYTES):
        return per_step
    out = per_step.copy()
    for t in range(T):
        if per_step[t] == 0 or tbytes[t] != 0.0:
            continue
        m = mask[t] & span
        follows = m == 0
        for t2 in range(T):
            if per_step[t2] != 0 and tbytes[t2] != 0.0 and (mask[t2] & span) == m:
                follows = True
        if follows:
            out[t] = 0
    return out


@jit_scalar_call
def _sdcm_at(d, unit, assoc, blocks):
    """``hit_prob_gauss(d / unit, assoc, blocks)``, left as a call: the closed
    form's four call sites share one compiled copy (a cold start compiles it
    once instead of inlining the SDCM four times)."""
    return hit_prob_gauss(d / unit, assoc, blocks)


@separately_linked
@jit_scalar_call
def _weigh(s, new, wt):
    """``s + wt (new - s)``: a sampled interior wave's sums weighted."""
    return s + wt * (new - s)


@jit_scalar
def _closed_setup(b, i, unit, P, conc, ksteps):
    """The closed forms' (:func:`_cache_column`, :func:`_cache_planes`) set-up of
    problem ``i``, as :func:`_cache_one` makes it: ``(ok, nsm, g15, assoc15,
    assoc2, B2, B15, use15, ngroups, W, max_waves, sampled waves, interior
    weight, k samples, ksteps as a float)``; ``ok`` False where L1.5 groups
    have no SM."""
    nsm, g15 = b.nsm[i], b.g15[i]
    cap15, assoc15 = b.cap15[i], b.assoc15[i]
    assoc2 = b.assoc2[i]
    B2 = b.cap2[i] / unit
    use15 = g15 > 0 and cap15 > 0.0 and assoc15 > 0
    ok = not (use15 and nsm < 1)
    B15 = cap15 / unit
    ngroups = (nsm + g15 - 1) // g15 if use15 else 1
    W = (P + conc - 1) // conc
    mw = b.max_waves
    nsamp = W if W <= mw else mw
    wt_in = 1.0
    if b.weights and W > mw and mw > 2:
        wt_in = (W - 2.0) / (mw - 2.0)
    ks = ksteps if ksteps < b.k_samples else b.k_samples
    kf = float(ksteps)
    return ok, nsm, g15, assoc15, assoc2, B2, B15, use15, ngroups, W, mw, nsamp, wt_in, ks, kf


@jit_scalar
def _closed_init(out_h15, out_h2, out_dram):
    """Every tensor's rates before the closed forms fill them: ``(0, 0, 1)``."""
    for t in range(out_h15.shape[0]):
        out_h15[t] = 0.0
        out_h2[t] = 0.0
        out_dram[t] = 1.0


@jit_scalar
def _cross_sample(base, u1, u2, ks, ksteps, kf, unit, assoc2, B2):
    """The L2 hit of a block's first touch in a wave, its previous touch in the
    wave before: :func:`_cross_terms`'s distance at ``ks`` step samples (the
    step sampled by integer division: no reciprocal under fastmath), averaged."""
    h = 0.0
    for k in range(ks):
        s = float(((2 * k + 1) * ksteps) // (2 * ks))
        h += _sdcm_at(base + (kf - 1.0 - s) * u1 + s * u2, unit, assoc2, B2)
    return h / ks


@jit_scalar
def _closed_out(out_h15, out_h2, out_dram, t, acc, hit15, req2, hit2):
    """Tensor ``t``'s rates from its sums (left ``(0, 0, 1)`` where it has no access)."""
    if acc == 0.0:
        return
    out_h15[t] = hit15 / acc
    out_h2[t] = hit2 / req2 if req2 > 0.0 else 0.0
    out_dram[t] = (req2 - hit2) / acc


@jit_scalar
def _column_groups(nw, nsm, g15, ngroups):
    """The L1.5 groups holding a program of a wave of ``nw`` programs (wave
    slot ``p`` runs on SM ``p mod nsm``, of group ``(p mod nsm) div g15``)."""
    m = nw if nw < nsm else nsm
    g = (m + g15 - 1) // g15
    return g if g < ngroups else ngroups


@separately_linked
@jit_borrow_internal
def _cache_column(b, i):
    """Problem ``i`` of batch ``b``, a grid of one column (``g1 == g2 == 1``,
    a panel order), in closed form: the hit rates the wave-by-wave analysis
    of :func:`_cache_one` gives it, without a wave's accesses. Returns
    ``False``, having written nothing, where the closed form does not apply
    (block sizes that are not integers, sums past :data:`EXACT_BYTES`, no
    reduction step, no wave); the caller then simulates.

    On a one-column grid every panel order issues the rows in order (program
    ``p`` is row ``p``), and a per-step tensor has either a block per
    program (not reused along the rows: *private*) or one block every
    program reads (reused along the rows: *shared*). Per step of a wave of
    ``nw`` programs (positions ``q`` of a program in tensor order, ``B`` the
    bytes of a program's accesses, ``H_q`` / ``A_q`` those before / after
    ``q``):

    * a private block is touched once, by its program, never before: a first
      touch in the step and in its L1.5 group, cross-wave hit 0 (``lastwave
      = -1``): ``(0, 0, 1)``;
    * the shared block's first touch is program 0's; every later touch has
      exactly one access of every other tensor since the previous one, in the
      step and in its L1.5 group's subsequence alike (the programs of a group
      are consecutive in it): distance ``d_q = B - b_q``. Of the ``nw``
      accesses, ``G`` (the groups the wave reaches) are first in their group
      (``h15 = 0``) and ``nw - G`` hit L1.5 with ``e = SDCM15(d_q)``; the ``nw
      - 1`` re-touches hit L2 with ``SDCM2(d_q)``, or ``1`` where the step's
      footprint ``nw S_priv + S_shared`` surely hits (the fast paths' rule);
    * the first touch of wave ``w >= 1`` has its previous touch in wave ``w
      - 1`` (every wave reads the block; wave ``w - 1`` is always book-kept
      and in the window, as the lookback is at least one wave), so
      :func:`_cross_terms` gives ``u1 = ustep[w - 1] = conc S_priv +
      S_shared`` (every wave but the last is full), ``u2 = nw S_priv +
      S_shared``, ``umid = 0`` and ``base = A_q + H_q + conc once_bytes``
      (the tail bytes in wave ``w - 1``'s last program, the head in program
      0, the once-per-tile bytes of wave ``w - 1``); wave 0's is cold (0).

    A wave's sums depend on ``nw`` and on being wave 0 only; they are added
    wave by wave in :func:`_cache_one`'s order and weights (the sampled
    waves, the interior weight applied to the running sums). The one
    change of arithmetic: a tensor's L1.5 hit sum of a wave is ``(nw - G)
    e`` where the simulation adds ``e`` access by access (or a group's
    pre-summed pattern): relative differences of a few ulps times the wave's
    programs (tests/test_cache_column.py holds the two to ``1e-12``). All
    distances are sums of integer block sizes below :data:`EXACT_BYTES`:
    exact, as in the simulation.
    """
    g0 = b.g0[i]
    conc = b.conc[i]
    ksteps = b.ksteps[i]
    mask, per_step, tbytes = b.mask[i], b.per_step[i], b.tbytes[i]
    T = mask.shape[0]
    if g0 < 1 or conc < 1 or ksteps < 1 or b.k_samples < 1:
        return False
    P = g0
    # the unit (the mean per-step block bytes, counting every per-step tensor),
    # the bytes of a program's private and shared per-step blocks, once-per-tile bytes
    n_step = 0
    unit = 0.0
    once = 0.0
    s_priv = 0.0
    s_sh = 0.0
    for t in range(T):
        x = tbytes[t]
        if not (x >= 0.0 and x <= 1e12 and x == math.floor(x)):
            return False
        if per_step[t] != 0:
            n_step += 1
            unit += x
            if g0 > 1 and (mask[t] & 1) != 0:
                s_sh += x
            else:
                s_priv += x
        else:
            once += x
    if n_step == 0 or not (unit > 0.0):
        return False
    if not ((s_priv + s_sh) * P < EXACT_BYTES and once * P < EXACT_BYTES):
        return False
    unit /= n_step
    (ok, nsm, g15, assoc15, assoc2, B2, B15, use15, ngroups, W, mw, nsamp, wt_in, ks,
     kf) = _closed_setup(b, i, unit, P, conc, ksteps)
    if not ok:
        return False
    out_h15, out_h2, out_dram = b.h15[i], b.h2[i], b.dram[i]
    _closed_init(out_h15, out_h2, out_dram)
    tot = s_priv + s_sh
    hq = 0.0  # bytes of a program's per-step accesses before tensor t's
    for t in range(T):
        if per_step[t] == 0:
            continue
        bt = tbytes[t]
        h_q = hq
        hq += bt
        if bt == 0.0 and b.drop_zero:
            continue  # moves nothing: (0, 0, 1)
        if not (g0 > 1 and (mask[t] & 1) != 0):
            continue  # a block per program, never touched before: (0, 0, 1)
        a_q = tot - h_q - bt
        d = tot - bt
        e = _sdcm_at(d, unit, assoc15, B15) if use15 else 0.0
        h_re = _sdcm_at(d, unit, assoc2, B2)
        acc = 0.0
        hit15 = 0.0
        req2 = 0.0
        hit2 = 0.0
        ckey = np.int64(-1)  # the wave (size, not wave 0) of the cached x and skip
        x = 0.0
        skip = False
        for si in range(nsamp):
            w = si if W <= mw else (si * (W - 1)) // (mw - 1)
            nw = P - w * conc
            if nw > conc:
                nw = conc
            key = 2 * nw + (1 if w >= 1 else 0)
            if key != ckey:
                ckey = key
                run = nw * s_priv + s_sh
                skip = _sdcm_at(run, unit, assoc2, B2) >= 1.0 - 1e-12
                x = 0.0
                if w >= 1:
                    x = _cross_sample((a_q + h_q) + (0.0 + conc * once), conc * s_priv + s_sh, run,
                                      ks, ksteps, kf, unit, assoc2, B2)
            G = _column_groups(nw, nsm, g15, ngroups) if use15 else 1
            s15 = (nw - G) * e
            scale = wt_in != 1.0 and 0 < w < W - 1
            sa = acc
            sb = hit15
            sc_ = req2
            sd = hit2
            acc += kf * nw
            hit15 += kf * s15
            req2 += kf * (nw - s15)
            if skip:
                hit2 += kf * ((nw - 1 - s15) + x)
            else:
                hit2 += kf * (x + (G - 1) * h_re + (nw - G) * (1.0 - e) * h_re)
            if scale:
                acc = _weigh(sa, acc, wt_in)
                hit15 = _weigh(sb, hit15, wt_in)
                req2 = _weigh(sc_, req2, wt_in)
                hit2 = _weigh(sd, hit2, wt_in)
        _closed_out(out_h15, out_h2, out_dram, t, acc, hit15, req2, hit2)
    return True


@jit_scalar
def _range_groups(lo, hi, nsm, g15, ngroups):
    """The L1.5 groups holding a program of wave slots ``lo .. hi`` (slot ``p``
    runs on SM ``p mod nsm``, of group ``(p mod nsm) div g15``)."""
    if hi - lo + 1 >= nsm:
        return ngroups
    ga = (lo % nsm) // g15
    gb = (hi % nsm) // g15
    if lo % nsm <= hi % nsm:
        return gb - ga + 1
    if gb >= ga:
        return ngroups
    return (ngroups - ga) + (gb + 1)


@separately_linked
@jit_borrow_internal
def _cache_planes(b, i):
    """Problem ``i`` of batch ``b`` in closed form where every per-step
    tensor's block is keyed by the grid's plane alone (reused along rows and
    columns: attention's K and V, one block per batch x KV head and step) or
    by nothing: the hit rates the wave-by-wave analysis of :func:`_cache_one`
    gives it, without a wave's accesses. Returns ``False``, having written
    nothing, where it does not apply (a z-order launch is the caller's test;
    here block sizes that are not integers, sums past :data:`EXACT_BYTES`, a
    per-step tensor keyed by a row or column of more than one tile, tensors
    keyed differently, no reduction step); the caller then simulates.

    Every panel order issues the planes one after the other, so the programs
    reading a block are ``R`` consecutive ones (``R = g0 g1``, or the whole
    grid for blocks keyed by nothing): a *segment*. Per step of a wave
    (slots ``0 .. nw - 1``), with ``B`` the bytes of a program's per-step
    accesses and ``H_q`` / ``A_q`` those before / after tensor ``q``'s:

    * a segment's first slot in the wave is the block's first touch in the
      step and in its L1.5 group; its previous touch is in wave ``w - 1``'s
      last program where the segment began before the wave (slot 0 of a wave
      ``w >= 1`` not starting a segment), else never (cold, ``0``). The
      cross-wave terms (:func:`_cross_terms` with ``wp = w - 1``) are then
      ``u1 = ustep[w - 1] = n_{w-1} B``, ``u2 = ustep[w] = n_w B`` (``n``:
      the segments a wave reaches), ``umid = 0``, ``base = A_q + H_q + conc
      once_bytes`` (wave ``w - 1`` is full, always book-kept and in the
      window: the lookback is at least one wave);
    * every other access of the segment has the previous slot's accesses
      of the other tensors (the same segment's blocks) since its previous
      touch, in the step and in its L1.5 group's subsequence alike (a
      segment is a contiguous range of slots, a group's subsequence is in
      slot order): distance ``B - b_q``. Of them, ``G_s - 1`` are first in
      their group (``G_s``: the groups the segment's slots reach) and hit
      L2 only with ``SDCM2(B - b_q)``; the rest hit L1.5 with ``e =
      SDCM15(B - b_q)``; where the step's footprint ``n_w B`` surely hits
      (the fast paths' rule) every re-touch hits L2.

    So a wave's sums depend on ``nw``, its phase in the segments and on
    being wave 0 only; they are added in :func:`_cache_one`'s order and
    weights, as :func:`_cache_column` does (the same change of arithmetic:
    a wave's L1.5 hit sum is ``(nw - sum G_s) e``)."""
    g0, g1, g2 = b.g0[i], b.g1[i], b.g2[i]
    conc = b.conc[i]
    ksteps = b.ksteps[i]
    mask, per_step, tbytes = b.mask[i], b.per_step[i], b.tbytes[i]
    T = mask.shape[0]
    if g0 < 1 or g1 < 1 or g2 < 1 or conc < 1 or ksteps < 1 or b.k_samples < 1:
        return False
    P = g0 * g1 * g2
    span = _grid_span(g0, g1, g2)
    n_step = 0
    unit = 0.0
    once = 0.0
    tot = 0.0
    keyed = -1  # the key dimensions of the per-step tensors: 4 (plane) or 0 (none)
    for t in range(T):
        x = tbytes[t]
        if not (x >= 0.0 and x <= 1e12 and x == math.floor(x)):
            return False
        if per_step[t] != 0:
            n_step += 1
            unit += x
            tot += x
            if x == 0.0 and b.drop_zero:
                continue  # moves nothing, at no distance: (0, 0, 1)
            kd = span & ~mask[t]
            if kd != 0 and kd != 4:
                return False
            if keyed >= 0 and kd != keyed:
                return False
            keyed = kd
        else:
            once += x
    if n_step == 0 or not (unit > 0.0) or keyed < 0:
        return False
    if not (tot * P < EXACT_BYTES and once * P < EXACT_BYTES):
        return False
    R = g0 * g1 if keyed == 4 else P
    unit /= n_step
    (ok, nsm, g15, assoc15, assoc2, B2, B15, use15, ngroups, W, mw, nsamp, wt_in, ks,
     kf) = _closed_setup(b, i, unit, P, conc, ksteps)
    if not ok:
        return False
    out_h15, out_h2, out_dram = b.h15[i], b.h2[i], b.dram[i]
    _closed_init(out_h15, out_h2, out_dram)
    hq = 0.0  # bytes of a program's per-step accesses before tensor t's
    for t in range(T):
        if per_step[t] == 0:
            continue
        bt = tbytes[t]
        h_q = hq
        hq += bt
        if bt == 0.0 and b.drop_zero:
            continue
        a_q = tot - h_q - bt
        d = tot - bt
        e = _sdcm_at(d, unit, assoc15, B15) if use15 else 0.0
        h_re = _sdcm_at(d, unit, assoc2, B2)
        acc = 0.0
        hit15 = 0.0
        req2 = 0.0
        hit2 = 0.0
        ckey = np.int64(-1)  # the wave (size, phase, not wave 0) of the cached terms
        x = 0.0
        skip = False
        nseg = 0
        sg = 0
        for si in range(nsamp):
            w = si if W <= mw else (si * (W - 1)) // (mw - 1)
            start = w * conc
            nw = P - start
            if nw > conc:
                nw = conc
            ph = start % R
            key = (2 * nw + (1 if w >= 1 else 0)) * R + ph
            if key != ckey:
                ckey = key
                nseg = (start + nw - 1) // R - start // R + 1
                sg = 0
                if use15:
                    a = 0
                    while a < nw:
                        e_ = R - (start + a) % R  # slots left in this segment
                        bb = a + e_ - 1
                        if bb > nw - 1:
                            bb = nw - 1
                        sg += _range_groups(a, bb, nsm, g15, ngroups)
                        a = bb + 1
                else:
                    sg = nseg
                run = nseg * tot
                skip = _sdcm_at(run, unit, assoc2, B2) >= 1.0 - 1e-12
                x = 0.0
                if w >= 1 and ph != 0:
                    nprev = (start - 1) // R - (start - conc) // R + 1
                    x = _cross_sample((a_q + h_q) + (0.0 + conc * once), nprev * tot, run,
                                      ks, ksteps, kf, unit, assoc2, B2)
            s15 = (nw - sg) * e
            scale = wt_in != 1.0 and 0 < w < W - 1
            sa = acc
            sb = hit15
            sc_ = req2
            sd = hit2
            acc += kf * nw
            hit15 += kf * s15
            req2 += kf * (nw - s15)
            if skip:
                hit2 += kf * ((nw - nseg - s15) + x)
            else:
                hit2 += kf * (x + (sg - nseg) * h_re + (nw - sg) * (1.0 - e) * h_re)
            if scale:
                acc = _weigh(sa, acc, wt_in)
                hit15 = _weigh(sb, hit15, wt_in)
                req2 = _weigh(sc_, req2, wt_in)
                hit2 = _weigh(sd, hit2, wt_in)
        _closed_out(out_h15, out_h2, out_dram, t, acc, hit15, req2, hit2)
    return True


@jit_scalar
def _pos_key_tensor(per_step, mask, koff, P, conc):
    """The per-step tensor whose blocks :func:`_cache_one` keys by their tile's
    position in the wave, else -1: one with a block per tile (``P`` ids: each
    block touched by one tile, so in one wave alone), reused along neither the
    grid's rows nor its columns (so the sum-by-sum book-keeping, which walks
    its blocks, is off: :func:`_cache_one`'s ``seqbook``), holding the last
    id range (the arrays keyed by id then end ``P - conc`` entries earlier),
    in a launch of more than one wave. The fast paths key such a tensor's
    blocks nowhere but in :func:`_wave` and the L1.5 groups of
    :func:`_hits_blocks`, both within the wave; in :func:`_wave` an id's
    ``lastwave`` is reset before the wave reads it, so it reads as the tile's
    block does (never touched), and the other id-keyed entries are compared
    with this wave's stamps only, which an earlier wave's never equal. Each
    id is unique in its wave, so every first touch, label and distance is the
    one with the tile's id."""
    T = per_step.shape[0]
    if conc >= P:
        return -1
    for t in range(T):
        if (per_step[t] != 0 and koff[t + 1] - koff[t] == P and mask[t] & 3 == 0
                and koff[t + 1] == koff[T]):
            return t
    return -1


@jit_scalar
def _pair_tensors(per_step, tbytes, mask, P, g0, g1, g2):
    """``(ta, tb)``: two per-step tensors consecutive in a tile's step (``tb``
    the next per-step tensor after ``ta``) with equal reuse masks and equal
    block bytes above 0, whose blocks are not one per tile (a reuse dimension
    of more than one tile), where every per-step block size is an integer and
    their total over the grid stays below :data:`EXACT_BYTES`; else ``(-1,
    -1)`` (the first such pair only). swiglu's B and B_up.

    Such a pair is touched together: in every step of every tile ``ta``'s
    block ``k`` and right after it ``tb``'s block ``k`` (the same key). In an
    exact LRU stack every other access sees the pair as one block of twice
    the bytes, and the distance of each of the two is that of the merged
    block plus the partner's bytes (``ta``'s window holds ``tb``'s block
    touched after it, ``tb``'s window ``ta``'s block touched before it):
    within the step, across waves (the tail after a last touch and the head
    before a first touch) and in the L1.5 groups' subsequences. With integer
    sizes below :data:`EXACT_BYTES` these sums are exact in any order, so
    :func:`_cache_one` runs the merged problem with the addend
    (``Problem.pair_q`` / ``pair_b`` / ``pair_lo`` / ``pair_hi``) and gets
    ``ta``'s results bit for bit, and gives them to ``tb`` (equal to the bit
    in the per-access simulation: the same terms in the same order)."""
    T = per_step.shape[0]
    span = _grid_span(g0, g1, g2)
    tot = 0.0
    for t in range(T):
        if per_step[t] == 0:
            continue
        x = tbytes[t]
        if not (x >= 0.0 and x == math.floor(x)):
            return -1, -1
        tot += x
    if not (tot * P < EXACT_BYTES):
        return -1, -1
    prev = -1
    for t in range(T):
        if per_step[t] == 0:
            continue
        if (prev >= 0 and mask[t] == mask[prev] and tbytes[t] == tbytes[prev]
                and tbytes[t] > 0.0 and (mask[t] & span) != 0):
            return prev, t
        prev = t
    return -1, -1


@separately_linked
@jit_serial_internal
def _cache_one(b, i):
    """Problem ``i`` of batch ``b``: its hit rates into row ``i`` of
    ``b.h15``, ``b.h2``, ``b.dram``. Allocates its records
    (:mod:`tsbatch.kernels._records`) and walks its waves."""
    g0, g1, g2, order, group = b.g0[i], b.g1[i], b.g2[i], b.order[i], b.group[i]
    conc, ksteps, nsm, g15 = b.conc[i], b.ksteps[i], b.nsm[i], b.g15[i]
    cap2, assoc2, cap15, assoc15 = b.cap2[i], b.assoc2[i], b.cap15[i], b.assoc15[i]
    mask, per_step, tbytes = b.mask[i], b.per_step[i], b.tbytes[i]
    out_h15, out_h2, out_dram = b.h15[i], b.h2[i], b.dram[i]
    k_samples, max_waves, max_lookback = b.k_samples, b.max_waves, b.max_lookback
    fast = b.fast
    if fast and b.column and g1 == 1 and g2 == 1 and order != ORDER_ZORDER and _cache_column(b, i):
        return
    if fast and b.column and order != ORDER_ZORDER and _cache_planes(b, i):
        return
    T = mask.shape[0]
    P = g0 * g1 * g2
    # the unit: the mean block bytes of the per-step tensors, counting every one
    n_step = np.int64(0)
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
    pool_step = n_step
    if b.drop_zero:
        per_step = _live_tensors(per_step, tbytes, mask, P, g0, g1, g2)
        n_step = np.int64(0)
        for t in range(T):
            if per_step[t] != 0:
                n_step += 1
    # swiglu's pair (B, B_up): one tensor of twice the bytes, its own distances
    # taking the partner's bytes (_pair_tensors); the partner's results are its
    pa = -1
    pt = -1
    if fast and b.pairs:
        pa, pt = _pair_tensors(per_step, tbytes, mask, P, g0, g1, g2)
        if pa >= 0:
            per_step = per_step.copy()
            per_step[pt] = 0
            tbytes = tbytes.copy()
            tbytes[pa] = tbytes[pt] + tbytes[pt]
            tbytes[pt] = 0.0
            n_step -= 1
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
    # key strides: a block's key linearizes its non-reuse coordinates
    kstr = np.zeros((T, 3), dtype=np.int64)
    for t in range(T):
        stride = 1
        for d in range(3):
            if (mask[t] >> d) & 1 == 0:
                kstr[t, d] = stride
                stride *= gdim[d]

    # a per-step tensor with a block per tile, the last id range (MoE's W_other):
    # keyed by its tile's position in the wave (_wave), so the id-keyed arrays
    # hold conc entries for it, not P
    pkey = _pos_key_tensor(per_step, mask, koff, P, conc) if fast and b.pos_keys else -1
    nid = koff[T] if pkey < 0 else koff[pkey] + conc

    use15 = g15 > 0 and cap15 > 0.0 and assoc15 > 0
    ngroups = (nsm + g15 - 1) // g15 if use15 else 1
    pair_q = -1
    pair_b = 0.0
    pair_lo = np.int64(0)
    pair_hi = np.int64(0)
    if pa >= 0:
        pair_q = 0
        for t in range(pa):
            if per_step[t] != 0:
                pair_q += 1
        pair_b = b.tbytes[i][pt]
        pair_lo = koff[pa]
        pair_hi = koff[pa + 1]

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
    kf = float(ksteps)
    # per-block book-keeping of the waves without hit rates (panel orders,
    # integer block sizes: sums exact in any order; non-integer sizes where
    # the sum-by-sum path below does not apply, see after it)
    panels = fast and not zorder
    big = False
    nonint = False
    for t in range(T):
        if per_step[t] != 0:
            if tbytes[t] > 1e12:
                big = True
            if tbytes[t] != math.floor(tbytes[t]):
                nonint = True
    blockbook = panels and not big and not nonint
    gmb = group if group > 0 else 1
    if order == ORDER_ROW:
        gmb = 1
    elif order == ORDER_COL:
        gmb = g0
    # L1.5 groups keyed by the panel layout of their runs (panel orders)
    gsig = fast and use15 and not zorder
    pb = Problem(g0=g0, g1=g1, g2=g2, order=order, group=group, gm=gmb, zorder=zorder, x=x,
                 P=P, conc=conc, T=T, per_step=per_step, kstr=kstr, koff=koff, tbytes=tbytes,
                 n_step=n_step, pool_step=pool_step, once_bytes=once_bytes, unit=unit,
                 B2=cap2 / unit,
                 assoc2=assoc2, use15=use15, B15=cap15 / unit, assoc15=assoc15, nsm=nsm,
                 g15=g15, ngroups=ngroups, kf=kf, ks=ks, svals=svals, fast=fast, gsig=gsig,
                 pkey=pkey, pair_q=pair_q, pair_b=pair_b, pair_lo=pair_lo, pair_hi=pair_hi)

    bk = Book(lastwave=np.full(nid, -1, dtype=np.int64),
              fstamp=np.full(nid, -1, dtype=np.int64),
              bstamp=np.full(nid, -1, dtype=np.int64),
              tail_b=np.zeros(nid, dtype=np.float64),
              ustep=np.zeros(W, dtype=np.float64),
              newcum=np.zeros(W + 1, dtype=np.float64),
              oncecum=np.zeros(W + 1, dtype=np.float64),
              acc=np.zeros(T, dtype=np.float64),
              hit15=np.zeros(T, dtype=np.float64),
              req2=np.zeros(T, dtype=np.float64),
              hit2=np.zeros(T, dtype=np.float64))

    L = conc * n_step
    runs = (conc + nsm - 1) // nsm  # runs of an L1.5 group in a wave
    # (a run crossing panels takes one layout entry per panel: room for two each)
    sigw = 12 * runs if gsig else 0
    # the same per distinct block, sum by sum in the per-access order, for the
    # panel orders with block sizes of any value (the waves only book-kept);
    # where every per-step tensor is reused along the grid's rows or columns (a
    # tensor with a block per tile has as many blocks as accesses: the
    # per-access pass is cheaper than the merge)
    seqbook = fast and not zorder and not blockbook and b.seq_book
    for t in range(T):
        if per_step[t] != 0 and mask[t] & 3 == 0:
            seqbook = False
    # non-integer block sizes with a block-per-tile tensor (a MoE tile's other
    # experts' weights), where that path is off: per distinct block after all,
    # the waves only book-kept and the analysed ones whose footprint surely
    # hits, and the window trimmed. Their sums (footprints, heads, tails, new
    # bytes) are the per-access pass's terms added per tensor as counts times
    # bytes: another order, each sum within gamma_m = m u / (1 - m u) relative
    # of the exact one as the per-access pass's running sum is (u = 2^-53, m
    # <= conc * n_step terms); tests/test_cache_block_per_tile.py. b.seq_book
    # off keeps the per-access pass (the reference).
    if panels and nonint and not big and not seqbook and b.seq_book:
        blockbook = True
    bg = L if blockbook and gsig else 0
    cand = conc if blockbook or seqbook else 0
    nrsc = runs * ngroups if gsig else 0
    # (no conditional expression among a record's keywords: numba cannot
    # rebuild a call of many keywords that holds control flow)
    sc = Scratch(ids=np.empty(L, dtype=np.int64),
                 wts=np.empty(L, dtype=np.float64),
                 ten=np.empty(L, dtype=np.int64),
                 grp=np.empty(L, dtype=np.int64),
                 dist=np.empty(L, dtype=np.float64),
                 head=np.zeros(L, dtype=np.float64),
                 h15=np.zeros(L, dtype=np.float64),
                 tree=np.zeros(L + 1, dtype=np.float64),
                 last_idx=np.full(nid, -1, dtype=np.int64),
                 sub_ids=np.empty(L, dtype=np.int64),
                 sub_wts=np.empty(L, dtype=np.float64),
                 sub_j=np.empty(L, dtype=np.int64),
                 sub_d=np.empty(L, dtype=np.float64),
                 sub_lab=np.empty(L, dtype=np.int64),
                 goff=np.zeros(ngroups + 1, dtype=np.int64),
                 gfill=np.zeros(ngroups, dtype=np.int64),
                 gids=np.empty(bg, dtype=np.int64),
                 gwts=np.empty(bg, dtype=np.float64),
                 loc=np.zeros((4, T), dtype=np.float64),
                 s15w=np.zeros(n_step, dtype=np.float64),
                 cp=np.empty((T, cand), dtype=np.int64),
                 ck=np.empty((T, cand), dtype=np.int64),
                 clen=np.zeros(4 * T, dtype=np.int64),
                 # first programs of the L1.5 group runs of a wave (5 fields, run-major)
                 rsc=np.empty((5, nrsc), dtype=np.int64),
                 sigbuf=np.empty(sigw, dtype=np.int64))

    nx_ = XMEMO_SIZE if fast else 0
    sig_tab = np.empty((SIG_SLOTS if gsig else 1, 2 + sigw), dtype=np.int64)
    sig_tab[:, 0] = -1
    mm = Memo(memo15_k=np.full(MEMO_SIZE, -1.0, dtype=np.float64),
              memo15_v=np.empty(MEMO_SIZE, dtype=np.float64),
              memo2_k=np.full(MEMO_SIZE, -1.0, dtype=np.float64),
              memo2_v=np.empty(MEMO_SIZE, dtype=np.float64),
              xtag=np.full(nx_, -1, dtype=np.int64),
              xwp=np.empty(nx_, dtype=np.int64),
              xs=np.empty(nx_, dtype=np.float64),
              xval=np.empty(nx_, dtype=np.float64),
              pat_m=np.full(PAT_SLOTS, -1, dtype=np.int64),
              pat_hash=np.zeros(PAT_SLOTS, dtype=np.int64),
              pat_off=np.zeros(PAT_SLOTS + 1, dtype=np.int64),  # last entry: pool fill
              pool_lab=np.empty(PAT_POOL, dtype=np.int64),
              pool_h15=np.empty(PAT_POOL, dtype=np.float64),
              sig_tab=sig_tab,
              sig_hash=np.zeros(sig_tab.shape[0], dtype=np.int64),
              sig_s15=np.zeros((sig_tab.shape[0], n_step), dtype=np.float64))

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
    # the first (cold) and the last (partial) wave stand for themselves; an
    # interior sampled wave stands for its share of the W - 2 interior waves
    wt_in = 1.0
    if b.weights and W > max_waves and max_waves > 2:
        wt_in = (W - 2.0) / (max_waves - 2.0)
    acc = bk.acc
    hit15 = bk.hit15
    req2 = bk.req2
    hit2 = bk.hit2
    saved = np.zeros(4 * T, dtype=np.float64)
    valid_from = 0
    done = -1
    for w in range(W):
        if not sampled[w]:
            continue
        scale = wt_in != 1.0 and 0 < w < W - 1
        if scale:
            for t in range(T):
                saved[t] = acc[t]
                saved[T + t] = hit15[t]
                saved[2 * T + t] = req2[t]
                saved[3 * T + t] = hit2[t]
        ws = w - lookback
        if ws <= done:
            ws = done + 1
        else:
            valid_from = ws
        # the next analysed wave's window starts after wave w (and resets valid_from
        # there) when it lies more than lookback waves on: then nothing reads wave
        # w's book-keeping (W + lookback stands for "no next wave")
        nx = w + 1
        while nx < W and not sampled[nx]:
            nx += 1
        if nx == W:
            nx = W + lookback
        if blockbook and ws == valid_from and ws < w and nx - lookback > w:
            # a window of its own, read by no later wave: start it at the earliest
            # wave holding a previous touch of wave w's blocks; the waves skipped
            # keep only the once-per-tile chain (newcum is read in differences of
            # integer sums from the new start on)
            v = _window_start(w, ws, P, conc, T, per_step, kstr, g0, g1, gmb) // conc
            for wv in range(ws, v):
                nwv = P - wv * conc
                if nwv > conc:
                    nwv = conc
                bk.oncecum[wv + 1] = bk.oncecum[wv] + nwv * once_bytes
                bk.newcum[wv + 1] = bk.newcum[wv]
            ws = v
            valid_from = v
        for wv in range(ws, w + 1):
            if blockbook and wv == w and (not use15 or gsig) and _hits_blocks(
                    pb, bk, sc, mm, w, valid_from, nx - lookback <= w, np.bool_(False)):
                continue
            if blockbook and wv != w:
                _book_blocks(pb, bk, sc, wv, valid_from, np.bool_(False))
                continue
            if seqbook and wv != w:
                # first touches forwards, then last touches backwards, sum by sum
                # (np.bool_, not literals: one compiled kernel for every call site)
                _hits_blocks(pb, bk, sc, mm, wv, valid_from, np.bool_(False), np.bool_(True))
                _book_blocks(pb, bk, sc, wv, valid_from, np.bool_(True))
                continue
            _wave(pb, bk, sc, mm, wv, wv == w, valid_from)
        if scale:
            for t in range(T):
                acc[t] = saved[t] + wt_in * (acc[t] - saved[t])
                hit15[t] = saved[T + t] + wt_in * (hit15[t] - saved[T + t])
                req2[t] = saved[2 * T + t] + wt_in * (req2[t] - saved[2 * T + t])
                hit2[t] = saved[3 * T + t] + wt_in * (hit2[t] - saved[3 * T + t])
        done = w
    for t in range(T):
        if per_step[t] == 0 or acc[t] == 0.0 or (tbytes[t] == 0.0 and b.drop_zero):
            continue
        out_h15[t] = hit15[t] / acc[t]
        out_h2[t] = hit2[t] / req2[t] if req2[t] > 0.0 else 0.0
        out_dram[t] = (req2[t] - hit2[t]) / acc[t]
    if pa >= 0:
        out_h15[pt] = out_h15[pa]
        out_h2[pt] = out_h2[pa]
        out_dram[pt] = out_dram[pa]


@separately_linked
@jit_borrow_internal
def _wave(pb, bk, sc, mm, w, do_hits, valid_from):
    """Book-keep wave ``w`` into ``bk`` (and, if ``do_hits``, add its
    accesses' hit rates to ``bk``'s sums), access by access: the step
    sequence, its first touches, the hits (:func:`_hits_fast`, or the general
    path below) and the tail bytes. ``valid_from``: the first wave of the
    lookback window."""
    T = pb.T
    n_step = pb.n_step
    per_step = pb.per_step
    kstr = pb.kstr
    fast = pb.fast
    ids = sc.ids
    wts = sc.wts
    grp = sc.grp
    dist = sc.dist
    head = sc.head
    lastwave = bk.lastwave
    start = w * pb.conc
    nw = pb.P - start
    if nw > pb.conc:
        nw = pb.conc
    # ---- the step sequence of this wave (coordinates stepped incrementally:
    # one division per wave instead of several per tile)
    gm = pb.gm  # panel rows of the launch order
    cr, cc, cz = tile_coords(pb.order, pb.g0, pb.g1, pb.g2, pb.group, start)
    first = (cr // gm) * gm
    size = pb.g0 - first
    if size > gm:
        size = gm
    j = np.int64(0)
    for p in range(nw):
        pid = start + p
        if pb.zorder:
            cr = pb.x[0, pid]
            cc = pb.x[1, pid]
            cz = pb.x[2, pid]
        for t in range(T):
            if per_step[t] == 0:
                continue
            if t == pb.pkey:
                ids[j] = pb.koff[t] + p
            else:
                ids[j] = pb.koff[t] + cr * kstr[t, 0] + cc * kstr[t, 1] + cz * kstr[t, 2]
            wts[j] = pb.tbytes[t]
            sc.ten[j] = t
            if not fast:
                grp[j] = ((p % pb.nsm) // pb.g15) if pb.use15 else 0
            j += 1
        if not pb.zorder:
            cr, cc, cz, first, size = _advance(pb.g0, pb.g1, gm, cr, cc, cz, first, size, 1)
    n = j
    if pb.pkey >= 0:
        # the position-keyed tensor's blocks are touched in this wave alone: their
        # ids (an earlier wave's tiles at these positions) read as never touched
        k0 = pb.koff[pb.pkey]
        for p in range(nw):
            lastwave[k0 + p] = -1
    # ---- first touches in the step: bytes before them, new bytes vs previous wave
    run = 0.0
    newb = 0.0
    nft = np.int64(0)
    fstamp = bk.fstamp
    for j in range(n):
        k = ids[j]
        if fstamp[k] != w:
            fstamp[k] = w
            if fast:
                grp[nft] = j  # the fast path's list of first touches
                nft += 1
            head[j] = run
            run += wts[j]
            if lastwave[k] != w - 1 or w - 1 < valid_from:
                newb += wts[j]
            dist[j] = math.inf
        else:
            dist[j] = -1.0
    bk.ustep[w] = run
    bk.newcum[w + 1] = bk.newcum[w] + newb
    bk.oncecum[w + 1] = bk.oncecum[w] + nw * pb.once_bytes
    if do_hits and fast:
        _hits_fast(pb, bk, sc, mm, w, valid_from, start, nw, n, nft, run)
    elif do_hits:
        unit = pb.unit
        h15 = sc.h15
        # every within-step distance is below the step's footprint; when
        # even that footprint surely hits (monotone SDCM), skip the tree
        if hit_prob_gauss(run / unit, pb.assoc2, pb.B2) >= 1.0 - 1e-12:
            for j in range(n):
                if dist[j] < 0.0:
                    dist[j] = 0.0
        else:
            step_distances(ids, wts, n, sc.last_idx, sc.tree, dist)
        # ---- L1.5: within-step reuse inside each SM group (bucketed by group)
        for j in range(n):
            h15[j] = 0.0
        if pb.use15:
            ngroups = pb.ngroups
            goff = sc.goff
            gfill = sc.gfill
            for gi in range(ngroups + 1):
                goff[gi] = 0
            for j in range(n):
                goff[grp[j] + 1] += 1
            for gi in range(ngroups):
                goff[gi + 1] += goff[gi]
                gfill[gi] = goff[gi]
            for j in range(n):
                q = gfill[grp[j]]
                sc.sub_ids[q] = ids[j]
                sc.sub_wts[q] = wts[j]
                sc.sub_j[q] = j
                gfill[grp[j]] = q + 1
            for gi in range(ngroups):
                a0 = goff[gi]
                m = goff[gi + 1] - a0
                if m == 0:
                    continue
                step_distances(sc.sub_ids[a0:], sc.sub_wts[a0:], m, sc.last_idx, sc.tree,
                               sc.sub_d)
                for q in range(m):
                    h15[sc.sub_j[a0 + q]] = hit_prob_gauss(sc.sub_d[q] / unit, pb.assoc15,
                                                           pb.B15)
        # ---- L2 hit of every access of the wave, all steps
        kf = pb.kf
        for j in range(n):
            t = sc.ten[j]
            if dist[j] < math.inf:
                h = hit_prob_gauss(dist[j] / unit, pb.assoc2, pb.B2)
            else:
                h = _cross_wave_hit(pb, bk, ids[j], head[j], w, valid_from)
            bk.acc[t] += kf
            bk.hit15[t] += kf * h15[j]
            bk.req2[t] += kf * (1.0 - h15[j])
            bk.hit2[t] += kf * (1.0 - h15[j]) * h
    # ---- tail bytes (distinct bytes after a block's last touch in the step)
    run = 0.0
    bstamp = bk.bstamp
    for j in range(n - 1, -1, -1):
        k = ids[j]
        if bstamp[k] != w:
            bstamp[k] = w
            bk.tail_b[k] = run
            run += wts[j]
            lastwave[k] = w


@jit_scalar
def _panel_segment(pi, gm, g0, g1, ra, rb, zb, start):
    """Panel ``pi``'s segment of a wave within plane offset ``zb``: the panel's
    first row ``first``, its rows ``size``, the wave's inner offsets
    ``[ia, ib)`` in it (of the plane-relative range ``[ra, rb)``) and the wave
    position ``p0`` of inner offset 0. Scalars only, so inlining costs no
    reference counting."""
    first = pi * gm
    size = g0 - first
    if size > gm:
        size = gm
    pb = first * g1
    ia = ra - pb if ra > pb else 0
    ib = rb - pb
    if ib > size * g1:
        ib = size * g1
    return first, size, ia, ib, zb + pb - start


@separately_linked
@jit_borrow
def _window_start(w, ws, P, conc, T, per_step, kstr, g0, g1, gm):
    """The earliest program at or after wave ``ws``'s first that is the last
    touch, before wave ``w``, of a block wave ``w`` touches (wave ``w``'s
    first program if there is none), on a panel order (panels of ``gm`` rows
    walked column-major, planes slowest). Its wave starts the window.

    Wave ``w`` reads the book-keeping of its lookback window only for its own
    blocks' previous touches (``lastwave``, ``tail_b``) and for the waves
    after the earliest of them (``ustep``, ``newcum``); the waves before that
    are dead work, and a window starting there gives the same hits.

    The previous touch of program ``p``'s block is closed-form per key: the
    same row one column back (``p - size``; in column 0 the previous plane's
    last column), the same column one row back (``p - 1``; at a run start the
    previous panel's run, or the previous plane's last panel), the same tile
    one plane back, or the previous program. Within a panel segment each is
    increasing in ``p`` on a few pieces, so the least previous touch at or
    after the window start is found per piece in O(1); touches whose previous
    touch lies in wave ``w`` itself are never below its start.
    """
    start = w * conc
    end = start + conc
    if end > P:
        end = P
    thr = ws * conc
    plane = g0 * g1
    pw = gm * g1
    lf = ((g0 - 1) // gm) * gm  # the last panel's first row and rows
    ls = g0 - lf
    best = start
    z = start // plane
    while z * plane < end and best > thr:
        zb = z * plane
        ra = start - zb if start > zb else 0
        rb = end - zb if end - zb < plane else plane
        pi = ra // pw
        pz = (rb - 1) // pw
        while pi <= pz and best > thr:
            first, size, ia, ib, p0 = _panel_segment(pi, gm, g0, g1, ra, rb, zb, start)
            pb = zb + first * g1  # the program of inner offset 0
            for t in range(T):
                if per_step[t] == 0:
                    continue
                r0 = kstr[t, 0] != 0
                r1 = kstr[t, 1] != 0
                back = kstr[t, 2] == 0 and z >= 1  # the block recurs in the previous plane
                c = start
                if r0 and r1:
                    if back:  # prev = p - plane
                        a = thr + plane
                        if a < pb + ia:
                            a = pb + ia
                        if a < pb + ib:
                            c = a - plane
                elif r0:
                    # columns >= 1: prev = p - size
                    i0 = thr + size - pb
                    if i0 < ia:
                        i0 = ia
                    if i0 < size:
                        i0 = size
                    if i0 < ib:
                        c = pb + i0 - size
                    if back:  # column 0: the previous plane's last column
                        base = zb - plane + first * g1 + (g1 - 1) * size
                        i0 = thr - base
                        if i0 < ia:
                            i0 = ia
                        i1 = ib if ib < size else size
                        if i0 < i1 and base + i0 < c:
                            c = base + i0
                elif r1:
                    # a segment starting inside a column run: prev = p - 1
                    if ia % size != 0 and pb + ia - 1 >= thr:
                        c = pb + ia - 1
                    # run starts (columns whose first row lies in the segment)
                    slope = 0
                    base = 0
                    if pi >= 1:
                        base = zb + (first - gm) * g1 + gm - 1
                        slope = gm
                    elif back:
                        base = zb - plane + lf * g1 + ls - 1
                        slope = ls
                    ca = (ia + size - 1) // size
                    cb = (ib - 1) // size
                    if slope > 0 and ca <= cb:
                        col = -((base - thr) // slope)  # ceil((thr - base) / slope)
                        if col < ca:
                            col = ca
                        if col <= cb and base + col * slope < c:
                            c = base + col * slope
                else:
                    # every program touches the block (of its plane): prev = p - 1
                    if (pb + ia - zb >= 1 or (kstr[t, 2] == 0 and pb + ia >= 1)) \
                            and pb + ia - 1 >= thr:
                        c = pb + ia - 1
                if c < best:
                    best = c
            pi += 1
        z += 1
    return best


@jit_scalar
def _pos_shift(n_step):
    """The bits of an access's position in its tile (``q < n_step``): the block
    paths write a candidate at tile ``p``, position ``q`` as ``(p << sh) + q``,
    in the order of the per-access position ``p * n_step + q`` (they only
    compare positions, and count a block-per-tile tensor's tiles before one
    with a shift instead of a division)."""
    sh = 0
    while (1 << sh) < n_step:
        sh += 1
    return sh


@jit_scalar
def _two_streams(T, clen):
    """The two tensors with candidates (``clen[t] > 0``) when exactly two have
    any, else ``(-1, -1)``: their merge needs one read pointer. The sums are
    of integers, so equal to the general loop's (which adds ``0 * bytes``
    for the tensors without candidates)."""
    ta = -1
    tb = -1
    for t in range(T):
        if clen[t] > 0:
            if ta < 0:
                ta = t
            elif tb < 0:
                tb = t
            else:
                return -1, -1
    if tb < 0:
        return -1, -1
    return ta, tb


@jit_scalar
def _streams_and_tile(T, clen, koff, P):
    """``(sa, sb, sp)`` where exactly three tensors have candidates (``clen[t] >
    0``): one with a block per tile (``sp``: an id span ``koff[t + 1] - koff[t]``
    of ``P``) and two others (``sa < sb``); else ``(-1, -1, -1)``. MoE's
    persistent raster (A, W and W_other): the tails / heads of A's and W's
    candidates then need one read pointer on the other stream and W_other's
    closed-form count, not the general loop over every tensor."""
    sa = -1
    sb = -1
    sp = -1
    for t in range(T):
        if clen[t] > 0:
            if koff[t + 1] - koff[t] == P:
                if sp >= 0:
                    return -1, -1, -1
                sp = t
            elif sa < 0:
                sa = t
            elif sb < 0:
                sb = t
            else:
                return -1, -1, -1
    if sp < 0 or sb < 0:
        return -1, -1, -1
    return sa, sb, sp


@separately_linked
@jit_borrow_internal
def _book_blocks(pb, bk, sc, w, valid_from, seq):
    """The book-keeping of wave ``w`` into ``bk`` (no hit rates; candidates
    in ``sc.cp``, ``sc.ck``, ``sc.clen``) per distinct block instead of per
    access, for the panel orders (row, column, grouped,
    persistent: all are panels of ``gm`` rows walked column-major, ``gm`` 1
    for row order and ``g0`` for column order).

    Book-keeping only needs, per distinct block of the wave, its last touch
    (for ``tail_b`` and ``lastwave``) and its bytes (for ``ustep`` and
    ``newcum``). In a panel the blocks keyed by the row recur every ``size``
    tiles and those keyed by the column come in runs of ``size`` tiles, so
    each tensor's candidate last touches are, per panel segment walked
    backwards, its last ``size`` tiles (row keys), the ends of its column runs
    (column keys), its last tile (neither) or every tile (both); a stamp keeps
    each block's latest candidate, its true last touch. A block's ``tail_b``
    is the bytes of the candidates at later access positions (each tensor's
    stream decreases in position ``p * n_step + q``, so per tensor a count
    read off a pointer): the per-access tail pass's running sum, summed in
    another order, like ``ustep`` and ``newb``. The caller runs this when
    every block size is an integer (sums exact in any order), or, with block
    sizes of any value, when a tensor has a block per tile (where ``seq`` is
    off): then each sum is as close to the exact one as the per-access pass's.
    A tensor with a block per tile (``P`` ids: every tile of the wave a
    candidate, its blocks touched in this wave alone) is only counted: the
    other tensors' tails count its candidates after theirs in closed form,
    its own blocks are new and keep no ``tail_b`` / ``lastwave`` (no later
    wave reads them), as in :func:`_hits_blocks` (its cross-wave hits are 0).

    ``seq``: any block sizes. The tail pass then adds the candidates' bytes one
    by one in order of position from the end (the tensors' streams merged):
    the per-access pass's running sum, term by term, so equal to it to the
    bit; the wave's footprint and new bytes come from ``_hits_blocks(...,
    seq=True)``, called first (it reads ``lastwave`` before this sets it).
    """
    P, conc, g0, g1, gm = pb.P, pb.conc, pb.g0, pb.g1, pb.gm
    T, n_step, per_step, kstr = pb.T, pb.n_step, pb.per_step, pb.kstr
    koff, tbytes = pb.koff, pb.tbytes
    lastwave, bstamp, tail_b = bk.lastwave, bk.bstamp, bk.tail_b
    cp, ck, clen = sc.cp, sc.ck, sc.clen
    psh = _pos_shift(n_step)
    start = w * conc
    end = start + conc
    if end > P:
        end = P
    plane = g0 * g1
    # a grid of one column is walked as one panel a plane (any panel rows give
    # the same order, so the same candidates)
    gw = g0 if g1 == 1 else gm
    pw = gw * g1
    for t in range(T):
        clen[t] = 0
        clen[2 * T + t] = 1  # covered columns [lo, hi]: none
        clen[3 * T + t] = 0
    z = (end - 1) // plane
    while z >= 0 and z * plane + plane > start:
        zb = z * plane
        for t in range(T):
            if kstr[t, 2] != 0:
                clen[2 * T + t] = 1
                clen[3 * T + t] = 0
        ra = start - zb if start > zb else 0
        rb = end - zb if end - zb < plane else plane
        pa = ra // pw
        pi = (rb - 1) // pw
        while pi >= pa:
            first, size, ia, ib, p0 = _panel_segment(pi, gw, g0, g1, ra, rb, zb, start)
            q = 0
            for t in range(T):
                if per_step[t] == 0:
                    continue
                kz = koff[t] + z * kstr[t, 2]
                k0 = kstr[t, 0]
                k1 = kstr[t, 1]
                c = clen[t]
                if koff[t + 1] - koff[t] == P and not seq:
                    # a block per tile: every tile a candidate, counted only
                    # (the tail pass's counts of it are closed-form)
                    c += ib - ia
                elif k0 != 0 and k1 != 0:
                    for inner in range(ib - 1, ia - 1, -1):
                        col = inner // size
                        k = kz + (first + inner - col * size) * k0 + col * k1
                        if bstamp[k] != w:
                            bstamp[k] = w
                            cp[t, c] = ((p0 + inner) << psh) + q
                            ck[t, c] = k
                            c += 1
                elif k0 != 0:
                    lo = ib - size
                    if lo < ia:
                        lo = ia
                    for inner in range(ib - 1, lo - 1, -1):
                        k = kz + (first + inner % size) * k0
                        if bstamp[k] != w:
                            bstamp[k] = w
                            cp[t, c] = ((p0 + inner) << psh) + q
                            ck[t, c] = k
                            c += 1
                elif k1 != 0:
                    # columns already emitted by later segments (an interval,
                    # of this plane if the key has the plane) hold no last touch
                    ca = ia // size
                    cb = (ib - 1) // size
                    lo = clen[2 * T + t]
                    hi = clen[3 * T + t]
                    # the columns cb down to ca less [lo, hi]: up to two runs, walked
                    # downwards; each column-keyed block not yet stamped has its
                    # last touch at the column's last tile, clipped to the segment end
                    r1l = ca
                    r2h = -1
                    if lo <= hi:
                        r1l = hi + 1 if hi + 1 > ca else ca
                        r2h = lo - 1 if lo - 1 < cb else cb
                    for run_i in range(2):
                        c_hi = cb if run_i == 0 else r2h
                        c_lo = r1l if run_i == 0 else ca
                        for col in range(c_hi, c_lo - 1, -1):
                            inner = col * size + size - 1
                            if inner > ib - 1:
                                inner = ib - 1
                            k = kz + col * k1
                            if bstamp[k] != w:
                                bstamp[k] = w
                                cp[t, c] = ((p0 + inner) << psh) + q
                                ck[t, c] = k
                                c += 1
                    if lo <= hi:
                        # keep the union when it is an interval, else the later one
                        if ca <= hi + 1 and cb >= lo - 1:
                            if ca < lo:
                                clen[2 * T + t] = ca
                            if cb > hi:
                                clen[3 * T + t] = cb
                    else:
                        clen[2 * T + t] = ca
                        clen[3 * T + t] = cb
                else:
                    if bstamp[kz] != w:
                        bstamp[kz] = w
                        cp[t, c] = ((p0 + ib - 1) << psh) + q
                        ck[t, c] = kz
                        c += 1
                clen[t] = c
                q += 1
            pi -= 1
        z -= 1
    if seq:
        # ---- any block sizes: the per-access tail pass's running sum, term by term
        # in order of position from the end (the tensors' candidates merged); the
        # footprint and new bytes came from _hits_blocks(..., seq=True)
        for t in range(T):
            clen[T + t] = 0
        run = 0.0
        while True:
            tm = -1
            best = np.int64(0)
            for t in range(T):
                a = clen[T + t]
                if a < clen[t] and (tm < 0 or cp[t, a] > best):
                    best = cp[t, a]
                    tm = t
            if tm < 0:
                break
            k = ck[tm, clen[T + tm]]
            clen[T + tm] += 1
            tail_b[k] = run
            run += tbytes[tm]
            lastwave[k] = w
        return
    # ---- the tail pass: a block's tail bytes are the bytes of the candidates at
    # later access positions, per tensor t2 its block bytes times the number of
    # its candidates there (each stream decreases in position); integer block
    # sizes make these the per-access pass's running sums exactly
    run = 0.0
    newb = 0.0
    fresh_all = w - 1 < valid_from
    ta, tb = _two_streams(T, clen)
    nbpt = 0
    for t in range(T):
        if per_step[t] != 0 and koff[t + 1] - koff[t] == P:
            nbpt += 1
    if nbpt > 0:
        tb = -1  # (the general loop below reads the block-per-tile counts)
    sa, sb, sp = _streams_and_tile(T, clen, koff, P)
    qp = 0
    for t2 in range(sp if sp > 0 else 0):
        if per_step[t2] != 0:
            qp += 1
    for t in range(T):
        nt = clen[t]
        if nt == 0:
            continue
        wt = tbytes[t]
        run += nt * wt
        if koff[t + 1] - koff[t] == P:
            # a block per tile: its blocks are touched in this wave alone, so no
            # later wave reads their tail_b or lastwave (left unset); each is new
            for _ in range(nt):
                newb += wt
            continue
        if sp >= 0:
            # two streams and a block-per-tile tensor (MoE's A, W, W_other): one
            # read pointer on the other stream and the closed-form count, the
            # general loop's terms in its tensor order (it adds 0 * bytes for
            # the tensors without candidates); under fastmath the compiler may
            # contract these two products otherwise (a rounding, ~1e-16)
            t2 = sb if t == sa else sa
            n2 = clen[t2]
            w2 = tbytes[t2]
            npt = clen[sp]
            wp = tbytes[sp]
            pmask = (1 << psh) - 1
            a = 0
            for i in range(nt):
                pos = cp[t, i]
                while a < n2 and cp[t2, a] > pos:
                    a += 1
                lo = (pos >> psh) + ((pos & pmask) > qp)
                if lo < 0:
                    lo = 0
                if lo > npt:
                    lo = npt
                r = i * wt
                if t2 < sp:
                    r += a * w2
                    r += (npt - lo) * wp
                else:
                    r += (npt - lo) * wp
                    r += a * w2
                k = ck[t, i]
                tail_b[k] = r
                if fresh_all or lastwave[k] != w - 1:
                    newb += wt
                lastwave[k] = w
            continue
        if tb >= 0:
            # two streams (a GEMM's A and B): one read pointer, no loop over tensors
            t2 = tb if t == ta else ta
            n2 = clen[t2]
            w2 = tbytes[t2]
            a = 0
            for i in range(nt):
                pos = cp[t, i]
                while a < n2 and cp[t2, a] > pos:
                    a += 1
                k = ck[t, i]
                tail_b[k] = i * wt + a * w2
                if fresh_all or lastwave[k] != w - 1:
                    newb += wt
                lastwave[k] = w
            continue
        q2 = 0
        for t2 in range(T):
            clen[T + t2] = 0  # read pointers: candidates of t2 after the current one
            clen[2 * T + t2] = q2  # (free after the candidates) t2's position in a tile
            if per_step[t2] != 0:
                q2 += 1
        for i in range(nt):
            pos = cp[t, i]
            r = i * wt
            for t2 in range(T):
                if t2 == t:
                    continue
                n2 = clen[t2]
                if n2 > 0 and koff[t2 + 1] - koff[t2] == P:
                    # a block per tile: its candidates are the wave's tiles p at
                    # positions (p, q2); those after pos = (p_t, q_t), counted
                    lo = (pos >> psh) + ((pos & ((1 << psh) - 1)) > clen[2 * T + t2])
                    if lo < 0:
                        lo = 0
                    if lo > n2:
                        lo = n2
                    r += (n2 - lo) * tbytes[t2]
                    continue
                a = clen[T + t2]
                while a < n2 and cp[t2, a] > pos:
                    a += 1
                clen[T + t2] = a
                r += a * tbytes[t2]
            k = ck[t, i]
            tail_b[k] = r
            if fresh_all or lastwave[k] != w - 1:
                newb += wt
            lastwave[k] = w
    nw = end - start
    bk.ustep[w] = run
    bk.newcum[w + 1] = bk.newcum[w] + newb
    bk.oncecum[w + 1] = bk.oncecum[w] + nw * pb.once_bytes


@separately_linked
@jit_borrow_internal
def _hits_blocks(pb, bk, sc, mm, w, valid_from, book, seq):
    """Analyse wave ``w`` per distinct block on the panel orders with integer
    block sizes (as :func:`_book_blocks`), adding its hit rates to ``bk``'s
    sums; returns ``False``, having changed nothing but ``bk.fstamp`` and
    this wave's ``ustep``/``newcum``/``oncecum`` (which the per-access path
    recomputes equal), when the step footprint does not surely hit in L2.

    When it surely hits, every within-step re-touch hits (the per-access path
    takes ``h = 1``), so a tensor's sums need only its access count ``nw``,
    its first touches in the step and their cross-wave hits. The first
    touches are the mirror of :func:`_book_blocks`'s last touches: per panel
    segment walked forwards, a tensor's first ``size`` tiles (row keys), the
    starts of its column runs (column keys), its first tile (neither) or
    every tile (both), a stamp keeping each block's earliest. A block's
    ``head`` (bytes first touched before it in the step) is, per tensor, its
    bytes times the count of earlier candidates. The per-tensor sums add the
    same terms in another order (the only change: rounding, ~1e-16 relative);
    then, if ``book``, :func:`_book_blocks` book-keeps the wave (the caller
    passes ``False`` when the next analysed wave looks back to a window that
    starts after this one, so that no later wave reads its book-keeping).

    With an L1.5 tier a tensor also needs the sum of its accesses' L1.5 hit
    probabilities, per SM group: a group laid out like an earlier one
    (:func:`_group_sig`) takes that one's sums; another has its accesses'
    keys written out and solved (:func:`_group_l15`). A block's first touch
    in the step is its first touch in its group too, so misses L1.5 (``h15
    = 0``): every L2 request of a re-touch hits (``1 - h15`` each) and a
    first touch's L2 hit is its cross-wave hit. The first touches' blocks and
    heads go into ``sc.ids`` and ``sc.head``, their list into ``sc.grp`` and
    their cross-wave hits into ``sc.dist``, as the per-access pass lays them.

    ``seq``: book-keeping only, for any block sizes (a wave only book-kept):
    the first touches' bytes are added one by one in order of position (the
    tensors' streams merged), the per-access pass's sums term by term, into
    the wave's ``ustep``, ``newcum`` and ``oncecum``; returns ``False``.
    :func:`_book_blocks` with ``seq`` follows with the tail bytes.
    """
    P, conc, g0, g1, gm = pb.P, pb.conc, pb.g0, pb.g1, pb.gm
    T, n_step, per_step, kstr = pb.T, pb.n_step, pb.per_step, pb.kstr
    koff, tbytes = pb.koff, pb.tbytes
    lastwave, fstamp = bk.lastwave, bk.fstamp
    cp, ck, clen = sc.cp, sc.ck, sc.clen
    psh = _pos_shift(n_step)
    ids, head, fts, hx = sc.ids, sc.head, sc.grp, sc.dist
    start = w * conc
    end = start + conc
    if end > P:
        end = P
    nw = end - start
    plane = g0 * g1
    # (one panel a plane for a grid of one column, as _book_blocks)
    gw = g0 if g1 == 1 else gm
    pw = gw * g1
    stamp = -2 - w  # not a wave index: the per-access pass's own stamps stay valid
    for t in range(T):
        clen[t] = 0
        clen[2 * T + t] = 1  # covered columns [lo, hi]: none
        clen[3 * T + t] = 0
    z = start // plane
    while z * plane < end:
        zb = z * plane
        for t in range(T):
            if kstr[t, 2] != 0:
                clen[2 * T + t] = 1
                clen[3 * T + t] = 0
        ra = start - zb if start > zb else 0
        rb = end - zb if end - zb < plane else plane
        pl = (rb - 1) // pw
        for pi in range(ra // pw, pl + 1):
            first, size, ia, ib, p0 = _panel_segment(pi, gw, g0, g1, ra, rb, zb, start)
            q = 0
            for t in range(T):
                if per_step[t] == 0:
                    continue
                kz = koff[t] + z * kstr[t, 2]
                k0 = kstr[t, 0]
                k1 = kstr[t, 1]
                c = clen[t]
                if koff[t + 1] - koff[t] == P and not seq:
                    # a block per tile: every tile a candidate, counted only
                    # (the heads' counts of it are closed-form)
                    c += ib - ia
                elif k0 != 0 and k1 != 0:
                    for inner in range(ia, ib):
                        col = inner // size
                        k = kz + (first + inner - col * size) * k0 + col * k1
                        if fstamp[k] != stamp:
                            fstamp[k] = stamp
                            cp[t, c] = ((p0 + inner) << psh) + q
                            ck[t, c] = k
                            c += 1
                elif k0 != 0:
                    hi_in = ia + size
                    if hi_in > ib:
                        hi_in = ib
                    for inner in range(ia, hi_in):
                        k = kz + (first + inner % size) * k0
                        if fstamp[k] != stamp:
                            fstamp[k] = stamp
                            cp[t, c] = ((p0 + inner) << psh) + q
                            ck[t, c] = k
                            c += 1
                elif k1 != 0:
                    # the columns ca up to cb less those earlier segments emitted
                    # (an interval [lo, hi], of this plane if the key has the
                    # plane): up to two runs, walked upwards; a column's first
                    # touch is its first tile, clipped to the segment start
                    ca = ia // size
                    cb = (ib - 1) // size
                    lo = clen[2 * T + t]
                    hi = clen[3 * T + t]
                    r1h = cb
                    r2l = cb + 1
                    if lo <= hi:
                        r1h = lo - 1 if lo - 1 < cb else cb
                        r2l = hi + 1 if hi + 1 > ca else ca
                    for run_i in range(2):
                        c_lo = ca if run_i == 0 else r2l
                        c_hi = r1h if run_i == 0 else cb
                        for col in range(c_lo, c_hi + 1):
                            inner = col * size
                            if inner < ia:
                                inner = ia
                            k = kz + col * k1
                            if fstamp[k] != stamp:
                                fstamp[k] = stamp
                                cp[t, c] = ((p0 + inner) << psh) + q
                                ck[t, c] = k
                                c += 1
                    if lo <= hi:
                        # keep the union when it is an interval, else the later one
                        if ca <= hi + 1 and cb >= lo - 1:
                            if ca < lo:
                                clen[2 * T + t] = ca
                            if cb > hi:
                                clen[3 * T + t] = cb
                        else:
                            clen[2 * T + t] = ca
                            clen[3 * T + t] = cb
                    else:
                        clen[2 * T + t] = ca
                        clen[3 * T + t] = cb
                else:
                    if fstamp[kz] != stamp:
                        fstamp[kz] = stamp
                        cp[t, c] = ((p0 + ia) << psh) + q
                        ck[t, c] = kz
                        c += 1
                clen[t] = c
                q += 1
        z += 1
    if seq:
        # ---- book-keeping only, any block sizes: the per-access pass's first-touch
        # sums, term by term in order of position (the tensors' candidates merged)
        for t in range(T):
            clen[T + t] = 0  # read pointers
        run = 0.0
        newb = 0.0
        fresh_all = w - 1 < valid_from
        while True:
            tm = -1
            best = np.int64(0)
            for t in range(T):
                a = clen[T + t]
                if a < clen[t] and (tm < 0 or cp[t, a] < best):
                    best = cp[t, a]
                    tm = t
            if tm < 0:
                break
            k = ck[tm, clen[T + tm]]
            clen[T + tm] += 1
            run += tbytes[tm]
            if fresh_all or lastwave[k] != w - 1:
                newb += tbytes[tm]
        bk.ustep[w] = run
        bk.newcum[w + 1] = bk.newcum[w] + newb
        bk.oncecum[w + 1] = bk.oncecum[w] + nw * pb.once_bytes
        return False
    # ---- heads (bytes of the candidates at earlier positions), footprint, new bytes
    run = 0.0
    newb = 0.0
    fresh_all = w - 1 < valid_from
    nft = np.int64(0)
    ta, tb = _two_streams(T, clen)
    nbpt = 0
    for t in range(T):
        if per_step[t] != 0 and koff[t + 1] - koff[t] == P:
            nbpt += 1
    if nbpt > 0:
        tb = -1  # (the general loop below reads the block-per-tile counts)
    sa, sb, sp = _streams_and_tile(T, clen, koff, P)
    qp = 0
    for t2 in range(sp if sp > 0 else 0):
        if per_step[t2] != 0:
            qp += 1
    for t in range(T):
        nt = clen[t]
        if nt == 0:
            continue
        wt = tbytes[t]
        run += nt * wt
        if koff[t + 1] - koff[t] == P:
            # a block per tile: never touched before this wave, so new, and its
            # cross-wave hits are 0 (_cross_wave_hits' first test): no list entry
            for _ in range(nt):
                newb += wt
            continue
        if sp >= 0:
            # two streams and a block-per-tile tensor (MoE's A, W, W_other): one
            # read pointer on the other stream and the closed-form count, the
            # general loop's terms in its tensor order (it adds 0 * bytes for
            # the tensors without candidates); under fastmath the compiler may
            # contract these two products otherwise (a rounding, ~1e-16)
            t2 = sb if t == sa else sa
            n2 = clen[t2]
            w2 = tbytes[t2]
            npt = clen[sp]
            wp = tbytes[sp]
            pmask = (1 << psh) - 1
            a = 0
            for i in range(nt):
                pos = cp[t, i]
                while a < n2 and cp[t2, a] < pos:
                    a += 1
                hi = (pos >> psh) + ((pos & pmask) > qp)
                if hi < 0:
                    hi = 0
                if hi > npt:
                    hi = npt
                r = i * wt
                if t2 < sp:
                    r += a * w2
                    r += hi * wp
                else:
                    r += hi * wp
                    r += a * w2
                k = ck[t, i]
                ids[nft] = k
                head[nft] = r
                fts[nft] = nft
                nft += 1
                if fresh_all or lastwave[k] != w - 1:
                    newb += wt
            continue
        if tb >= 0:
            # two streams: one read pointer, no loop over tensors
            t2 = tb if t == ta else ta
            n2 = clen[t2]
            w2 = tbytes[t2]
            a = 0
            for i in range(nt):
                pos = cp[t, i]
                while a < n2 and cp[t2, a] < pos:
                    a += 1
                k = ck[t, i]
                ids[nft] = k
                head[nft] = i * wt + a * w2
                fts[nft] = nft
                nft += 1
                if fresh_all or lastwave[k] != w - 1:
                    newb += wt
            continue
        q2 = 0
        for t2 in range(T):
            clen[T + t2] = 0  # read pointers: candidates of t2 before the current one
            clen[2 * T + t2] = q2  # (free after the candidates) t2's position in a tile
            if per_step[t2] != 0:
                q2 += 1
        for i in range(nt):
            pos = cp[t, i]
            r = i * wt
            for t2 in range(T):
                if t2 == t:
                    continue
                n2 = clen[t2]
                if n2 > 0 and koff[t2 + 1] - koff[t2] == P:
                    # a block per tile: the wave's tiles p at positions
                    # (p, q2); those before pos = (p_t, q_t), counted
                    hi = (pos >> psh) + ((pos & ((1 << psh) - 1)) > clen[2 * T + t2])
                    if hi < 0:
                        hi = 0
                    if hi > n2:
                        hi = n2
                    r += hi * tbytes[t2]
                    continue
                a = clen[T + t2]
                while a < n2 and cp[t2, a] < pos:
                    a += 1
                clen[T + t2] = a
                r += a * tbytes[t2]
            k = ck[t, i]
            ids[nft] = k
            head[nft] = r
            fts[nft] = nft
            nft += 1
            if fresh_all or lastwave[k] != w - 1:
                newb += wt
    bk.ustep[w] = run
    bk.newcum[w + 1] = bk.newcum[w] + newb
    bk.oncecum[w + 1] = bk.oncecum[w] + nw * pb.once_bytes
    if not (hit_prob_gauss(run / pb.unit, pb.assoc2, pb.B2) >= 1.0 - 1e-12):
        return False
    _cross_wave_hits(pb, bk, mm, fts, nft, ids, head, w, valid_from, hx)
    # ---- L1.5 hit sums per access position q of a tile, group by group
    s15w = sc.s15w
    sig_tab = mm.sig_tab
    for q in range(n_step):
        s15w[q] = 0.0
    if pb.use15:  # then pb.gsig (the caller's condition)
        nsm = pb.nsm
        gids = sc.gids
        gwts = sc.gwts
        h15 = sc.h15
        _run_starts(start, nw, nsm, pb.g15, pb.ngroups, pb.order, g0, g1, pb.g2, pb.group, gm,
                    sc.rsc)
        for gi in range(pb.ngroups):
            lo = gi * pb.g15
            hi = lo + pb.g15
            if hi > nsm:
                hi = nsm
            if lo >= nw:
                continue
            ns, sh, sslot = _group_sig(pb, sc, mm, gi, lo, hi, nw)
            if not (sslot >= 0 and sig_tab[sslot, 0] == ns):
                # the group's access keys, as the per-access pass writes them
                base = 0
                e = gi  # rsc entry of the run: its first program (_run_starts)
                while base + lo < nw:
                    pe = base + hi
                    if pe > nw:
                        pe = nw
                    cr = sc.rsc[0, e]
                    cc = sc.rsc[1, e]
                    cz = sc.rsc[2, e]
                    first = sc.rsc[3, e]
                    size = sc.rsc[4, e]
                    for p in range(base + lo, pe):
                        j = p * n_step
                        for t in range(T):
                            if per_step[t] == 0:
                                continue
                            if t == pb.pkey:
                                gids[j] = koff[t] + p
                            else:
                                gids[j] = (koff[t] + cr * kstr[t, 0] + cc * kstr[t, 1]
                                           + cz * kstr[t, 2])
                            gwts[j] = tbytes[t]
                            j += 1
                        cr, cc, cz, first, size = _advance(g0, g1, gm, cr, cc, cz,
                                                           first, size, 1)
                    base += nsm
                    e += pb.ngroups
                _group_l15(pb, sc, mm, gids, gwts, lo, hi, nw, ns, sh, sslot)
                if not (sslot >= 0 and sig_tab[sslot, 0] == ns):
                    # not stored: sum this group's own probabilities
                    base = 0
                    while base + lo < nw:
                        pe = base + hi
                        if pe > nw:
                            pe = nw
                        for j in range((base + lo) * n_step, pe * n_step):
                            s15w[j % n_step] += h15[j]
                        base += nsm
                    continue
            for q in range(n_step):
                s15w[q] += mm.sig_s15[sslot, q]
    kf = pb.kf
    i = 0
    q = 0
    for t in range(T):
        if per_step[t] == 0:
            continue
        nt = clen[t]
        cw = 0.0
        if koff[t + 1] - koff[t] != P:
            for _ in range(nt):
                cw += hx[i]
                i += 1
        s15 = s15w[q]
        q += 1
        bk.acc[t] += kf * nw
        bk.hit15[t] += kf * s15
        bk.req2[t] += kf * (nw - s15)
        bk.hit2[t] += kf * ((nw - nt - s15) + cw)
    if book:
        _book_blocks(pb, bk, sc, w, valid_from, np.bool_(False))
    return True


@jit_serial
def _cache_rows(b, perm, lo, hi):
    """Solve the problems ``perm[lo:hi]`` of batch ``b`` (one thread's share)."""
    for ii in range(lo, hi):
        _cache_one(b, perm[ii])


def cache_hit_rates(g0, g1, g2, order, group, conc, ksteps, mask, per_step, tbytes,
                    cap2, assoc2, nsm, g15, cap15, assoc15, k_samples=4, max_waves=1 << 30,
                    max_lookback=1 << 30, general=False, interior_weights=True,
                    drop_zero=True, seq_book=True, column=True, pos_keys=True, pairs=True):
    """Per-tensor hit rates for a batch of cache problems.

    Parameters are 1-D arrays of length ``n`` (one cache problem each) except
    ``mask``, ``per_step`` and ``tbytes``, which are ``(n, T)``: per tensor,
    the bit mask of reuse dimensions, the cadence flag and the block bytes.
    ``conc`` is the number of tiles resident at once (a wave), ``cap2`` and
    ``cap15`` capacities in bytes, ``nsm`` the SM count and ``g15`` the SMs
    per L1.5 group (0: no L1.5 tier). ``general`` runs the straightforward
    per-access path instead of the fast one (same results; kept as the
    reference the fast path is tested against).

    A launch of ``W > max_waves`` waves has ``max_waves`` of them analysed:
    the first (cold), the last (partial) and evenly spaced interior ones.
    With ``interior_weights`` (the default) the first and last count once
    and each interior one for ``(W - 2) / (max_waves - 2)`` interior waves;
    without, every analysed wave counts once, which over-counts the cold
    first wave (kept to compare: bench/wave_sampling.py).

    A per-step tensor of zero bytes (a program's tensor that a configuration
    turns off: an epilogue's second B tile, a norm's re-read of a row kept in
    registers) moves nothing: with ``drop_zero`` (the default) it gets
    ``(0, 0, 1)`` as the once-per-tile tensors do (the traffic split scales
    its rates by its zero bytes), and its accesses are left out of the
    sequence where the other tensors' results are then the same to the bit
    (:func:`_live_tensors`: integer block sizes, labels that follow the kept
    tensors'); the unit, the mean per-step block bytes, still counts it.
    ``drop_zero=False`` accesses it as any other tensor (kept to compare:
    tests/test_cache_zero.py). ``seq_book=False`` book-keeps the waves of
    non-integer block sizes access by access instead of per distinct block
    (the same sums in the same order: tests/test_cache_zero.py holds the two
    equal to the bit), and so those of non-integer block sizes with a tensor
    of a block per tile, which otherwise go per distinct block in another
    order (counts times bytes: within ~1e-14 relative,
    tests/test_cache_block_per_tile.py). ``column=False`` simulates wave by
    wave the problems the closed forms solve (one-column grids,
    :func:`_cache_column`; plane-keyed grids, :func:`_cache_planes`; within
    1e-12: tests/test_cache_column.py, tests/test_cache_planes.py).
    ``pos_keys=False`` keys a tensor with a block per tile by its tile, not by
    its tile's position in the wave (:func:`_pos_key_tensor`; the same
    results to the bit, with id-keyed arrays of ``P`` entries for it instead
    of ``conc``: tests/test_cache_pos_keys.py). ``pairs=False`` accesses
    both tensors of a pair touched together (two per-step tensors next to each
    other in the step with equal masks and bytes, integer sizes: swiglu's B and
    B_up, :func:`_pair_tensors`) instead of simulating one of twice the bytes
    whose own distances take the partner's bytes (the same results to the bit,
    with a third fewer accesses for the epilogue's swiglu problems:
    tests/test_cache_pairs.py).

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
    conc_a = i64(conc)
    perm, bounds = _balanced_order(g0 * i64(g1) * i64(g2), conc_a, i64(ksteps))
    batch = Batch(g0, i64(g1), i64(g2), i64(order), i64(group), conc_a, i64(ksteps),
                  mask, i64(per_step).reshape(n, T), f64(tbytes).reshape(n, T),
                  f64(cap2), f64(assoc2), i64(nsm), i64(g15), f64(cap15), f64(assoc15),
                  k_samples=int(k_samples), max_waves=int(max(max_waves, 2)),
                  max_lookback=int(max(max_lookback, 1)), fast=not general,
                  weights=bool(interior_weights), drop_zero=bool(drop_zero),
                  seq_book=bool(seq_book), column=bool(column), pos_keys=bool(pos_keys),
                  pairs=bool(pairs),
                  h15=h15, h2=h2, dram=dram)
    run_shares(_cache_rows, (batch, perm), bounds)
    return h15, h2, dram


def _balanced_order(tiles, conc, ksteps):
    """A processing order of the problems, and its split among threads.

    Returns ``(perm, bounds)``: thread ``c`` solves ``perm[bounds[c]:bounds[c + 1]]``
    (one share, ``bounds == [0, n]``, for one thread or a small batch). The
    problems arrive sorted by key (so by grid size): contiguous shares would
    give the costly ones all to the last thread. Problems sorted by a cost
    estimate (tiles analysed, bounded by the sampling) are dealt round-robin
    to the shares, one per thread (:mod:`tsbatch.kernels._threads`).
    """
    n = tiles.shape[0]
    nt = num_threads()
    if nt == 1 or n < 2 * nt:
        return np.arange(n, dtype=np.int64), [0, n]
    cost = np.minimum(tiles, 40 * np.maximum(conc, 1)).astype(np.float64)
    srt = np.argsort(cost, kind="stable")
    shares = [srt[c::nt] for c in range(nt)]
    bounds = np.cumsum([0] + [s.shape[0] for s in shares]).tolist()
    return np.ascontiguousarray(np.concatenate(shares), dtype=np.int64), bounds
