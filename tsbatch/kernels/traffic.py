"""The cache model's hit rates applied to a plan's traffic, and each row's bottleneck.

:func:`split_traffic` is the step of :func:`tsbatch.engine.evaluate.evaluate_plan`
between the cache model and the envelope: each row's requested bytes per
reduction step are split into the L1.5, L2 and DRAM work of its iteration,
and the row's hit fractions and byte totals are formed. It is one pass over
the rows (in shares on the thread pool) reading the solved cache problems
through ``inv`` (row -> problem), where numpy made eleven ``(n, T)``
temporaries, three gathers and a copy of the work matrix. The arithmetic is
numpy's, operation by operation and in the same order (a sum over the ``T < 8``
tensors of a row is numpy's left-to-right sum; wider rows take numpy's own
path), so results are equal to the bit. Calls of fewer than
:data:`KERNEL_MIN_ROWS` rows run the numpy they replaced.

:func:`bottleneck_codes` is :func:`tsbatch.engine.evaluate._bottleneck`'s
argmax over the utilizations in one pass. Plain-Python twins: ``tests/naive.py``
(``split_traffic_one``, ``bottleneck_one``).
"""

from __future__ import annotations

import math

import numpy as np

from tsbatch.kernels._config import jit_exact, jit_exact_inline
from tsbatch.kernels._threads import even_bounds, run_shares
from tsbatch.kernels.envelope import N_RES, R_DRAM, R_L15, R_L2

__all__ = ["split_traffic", "split_edge_rows", "bottleneck_codes", "compulsory_work",
           "NUMPY_PAIRWISE_MIN", "KERNEL_MIN_ROWS"]

#: numpy sums a row of at least this many elements pairwise (8 partial sums),
#: not left to right; such rows go through numpy
NUMPY_PAIRWISE_MIN = 8
#: fewer rows than this go through numpy (the same results): a small call (an
#: autotuner's thousand rows, a screening round) does not pay for loading the
#: kernels (~5 ms each from the cache) or compiling them (~1 s each, cold)
KERNEL_MIN_ROWS = 1 << 16

_FMAX = float(np.finfo(np.float64).max)


@jit_exact_inline
def _row_sums(src, i, per_step, h15u, h2u, dramu, u, dram_scale, has_scale):
    """One row's sums over its tensors, of the byte matrix ``src`` split by the
    hit rates of cache problem ``u``: ``(requested, to the L2, from DRAM, L2
    hits, L1.5 hits)`` bytes a step. Shared by :func:`_split_rows` and
    :func:`_edge_work_rows` (the same operations in the same order: the same bits)."""
    req_tot = 0.0
    l2_b = 0.0
    dram_b = 0.0
    l2_hit_b = 0.0
    l15_hit_b = 0.0
    for t in range(src.shape[1]):
        req = src[i, t] if per_step[i, t] != 0 else 0.0
        h15 = h15u[u, t]
        a = req * (1.0 - h15)
        dreq = req * dram_scale[i, t] if has_scale else req
        if t == 0:
            req_tot = req
            l2_b = a
            dram_b = dreq * dramu[u, t]
            l2_hit_b = a * h2u[u, t]
            l15_hit_b = req * h15
        else:
            req_tot += req
            l2_b += a
            dram_b += dreq * dramu[u, t]
            l2_hit_b += a * h2u[u, t]
            l15_hit_b += req * h15
    return req_tot, l2_b, dram_b, l2_hit_b, l15_hit_b


@jit_exact
def _split_rows(t_bytes, per_step, h15u, h2u, dramu, inv, has_l15, work_iter, work_epi,
                tiles, ksteps, dram_scale, has_scale, out_wi, out_l15_hit, out_l2_hit, out_dram_b,
                out_l2_b, lo, hi):
    R = work_iter.shape[1]
    for i in range(lo, hi):
        u = inv[i]
        for r in range(R):
            out_wi[i, r] = work_iter[i, r]
        req_tot, l2_b, dram_b, l2_hit_b, l15_hit_b = _row_sums(
            t_bytes, i, per_step, h15u, h2u, dramu, u, dram_scale, has_scale)
        out_wi[i, R_L15] = req_tot if has_l15 else 0.0
        out_wi[i, R_L2] = l2_b
        out_wi[i, R_DRAM] = dram_b
        out_l2_hit[i] = l2_hit_b / l2_b if l2_b > 0 else 0.0
        out_l15_hit[i] = l15_hit_b / req_tot if req_tot > 0 else 0.0
        tf = float(tiles[i])
        kf = float(ksteps[i])
        out_dram_b[i] = tf * (kf * dram_b + work_epi[i, R_DRAM])
        out_l2_b[i] = tf * (kf * l2_b + work_epi[i, R_L2])


def _split_numpy(t_bytes, per_step, h15u, h2u, dramu, inv, has_l15, work_iter, work_epi,
                 tiles, ksteps, dram_scale=None, work_only=False):
    """The numpy form (rows of :data:`NUMPY_PAIRWISE_MIN` tensors or more);
    ``work_only``: the work matrix alone, the other four ``None``."""
    h15, dram_frac = h15u[inv], dramu[inv]
    req = np.where(per_step.astype(bool), t_bytes, 0.0)
    wi = work_iter.copy()
    wi[:, R_L15] = req.sum(axis=1) if has_l15 else 0.0
    wi[:, R_L2] = (req * (1.0 - h15)).sum(axis=1)
    dreq = req if dram_scale is None else req * dram_scale
    wi[:, R_DRAM] = (dreq * dram_frac).sum(axis=1)
    if work_only:
        return wi, None, None, None, None
    h2 = h2u[inv]
    rows = t_bytes.shape[0]
    l2_req_b = (req * (1.0 - h15)).sum(axis=1)
    l2_hit = np.divide((req * (1.0 - h15) * h2).sum(axis=1), l2_req_b,
                       out=np.zeros(rows), where=l2_req_b > 0)
    req_tot = req.sum(axis=1)
    l15_hit = np.divide((req * h15).sum(axis=1), req_tot, out=np.zeros(rows), where=req_tot > 0)
    dram_b = tiles * (ksteps * wi[:, R_DRAM] + work_epi[:, R_DRAM])
    l2_b = tiles * (ksteps * wi[:, R_L2] + work_epi[:, R_L2])
    return wi, l15_hit, l2_hit, dram_b, l2_b


def split_traffic(t_bytes, per_step, h15u, h2u, dramu, inv, has_l15, work_iter, work_epi,
                  tiles, ksteps, dram_scale=None, work_only=False):
    """Per row: the work matrix with its L1.5, L2 and DRAM columns set from the
    hit rates, and the L1.5 and L2 hit fractions and DRAM and L2 bytes.

    ``t_bytes`` and ``per_step`` are ``(n, T)``; ``h15u``, ``h2u``, ``dramu``
    ``(u, T)``, the results of the distinct cache problems, row ``i`` taking
    problem ``inv[i]``. ``dram_scale`` (``(n, T)`` or None): each tensor's DRAM
    time per requested byte (:attr:`TilePlan.t_dram_scale`, short contiguous
    runs), applied to the DRAM column and bytes only. ``work_iter`` is not changed (a new matrix is made).
    Returns ``(work_iter, l15_hit, l2_hit, dram_bytes, l2_bytes)``; ``work_only``
    (a latency-only call): on a small call (numpy) the last four are ``None``
    and not computed (the same work matrix; a prune round's 50 rows: 60 -> 25 us).
    """
    f64 = lambda a: np.ascontiguousarray(a, dtype=np.float64)  # noqa: E731
    i64 = lambda a: np.ascontiguousarray(a, dtype=np.int64)  # noqa: E731
    rows, T = np.shape(t_bytes)
    if T >= NUMPY_PAIRWISE_MIN or rows < KERNEL_MIN_ROWS:
        return _split_numpy(np.asarray(t_bytes), np.asarray(per_step), np.asarray(h15u),
                            np.asarray(h2u), np.asarray(dramu), np.asarray(inv), has_l15,
                            np.asarray(work_iter), np.asarray(work_epi), np.asarray(tiles),
                            np.asarray(ksteps), dram_scale, work_only)
    work_iter = f64(work_iter)
    out_wi = np.empty_like(work_iter)
    outs = tuple(np.empty(rows) for _ in range(4))
    run_shares(_split_rows, (f64(t_bytes), i64(per_step), f64(h15u), f64(h2u), f64(dramu),
                             i64(inv), bool(has_l15), work_iter, f64(work_epi), i64(tiles),
                             i64(ksteps),
                             f64(dram_scale) if dram_scale is not None else np.ones((1, 1)),
                             dram_scale is not None, out_wi) + outs, even_bounds(rows))
    return (out_wi,) + outs


@jit_exact
def _edge_work_rows(t_crit, t_bytes, per_step, h15u, h2u, dramu, inv, has_l15, dram_scale,
                    has_scale, out_wi, lo, hi):
    # _split_rows' work columns of t_crit (:func:`_row_sums`), for the rows whose
    # t_crit differs from t_bytes, bit for bit (NaN and the sign of a zero
    # included; the others keep out_wi's values)
    T = t_crit.shape[1]
    for i in range(lo, hi):
        same = True
        for t in range(T):
            a = t_crit[i, t]
            b = t_bytes[i, t]
            if a != b or math.copysign(1.0, a) != math.copysign(1.0, b):
                same = False
                break
        if same:
            continue
        req_tot, l2_b, dram_b, _l2h, _l15h = _row_sums(
            t_crit, i, per_step, h15u, h2u, dramu, inv[i], dram_scale, has_scale)
        out_wi[i, R_L15] = req_tot if has_l15 else 0.0
        out_wi[i, R_L2] = l2_b
        out_wi[i, R_DRAM] = dram_b


def split_edge_rows(t_crit, t_bytes, per_step, h15u, h2u, dramu, inv, has_l15, dram_scale,
                    work_iter):
    """The L1.5, L2 and DRAM columns of :func:`split_traffic`'s work matrix for a
    second byte matrix ``t_crit`` (``(n, T)``, split by the same hit rates), on
    the rows where it differs from ``t_bytes`` (the matrix ``work_iter`` was made
    from; by value, NaN and the sign of a zero included), written into ``work_iter`` (``(n, N_RES)``), which is returned: changed
    in place at those rows and columns only when it is C-contiguous float64,
    else a converted copy is. Each row then holds what a :func:`split_traffic`
    call on ``t_crit`` would give it, to the bit (numpy below
    :data:`KERNEL_MIN_ROWS` rows, as there); a row whose bytes are the same
    would come out the same, so it is not split again. This is
    :func:`tsbatch.engine.evaluate.evaluate_plan`'s split of the envelope's whole
    tiles (:attr:`TilePlan.t_crit`), which differ from the grid's average tile
    on the rows with an edge tile only. Rows of :data:`NUMPY_PAIRWISE_MIN`
    tensors or more are not taken (numpy's pairwise sums): :class:`ValueError`.
    Plain-Python twin: ``tests/naive.py``, ``split_traffic_one`` (its work row)."""
    rows, T = np.shape(t_crit)
    if T >= NUMPY_PAIRWISE_MIN:
        raise ValueError(f"split_edge_rows: {T} tensors a row (at most {NUMPY_PAIRWISE_MIN - 1})")
    if np.shape(t_bytes) != (rows, T) or np.shape(work_iter)[0] != rows:
        raise ValueError(f"split_edge_rows: t_bytes {np.shape(t_bytes)} and work_iter "
                         f"{np.shape(work_iter)} for t_crit {(rows, T)}")
    work_iter = np.ascontiguousarray(work_iter, dtype=np.float64)
    if rows < KERNEL_MIN_ROWS:  # _split_numpy's work matrix, on the rows that differ
        tc, tb = np.asarray(t_crit), np.asarray(t_bytes)
        idx = np.flatnonzero(((tc != tb) | (np.signbit(tc) != np.signbit(tb))).any(axis=1))
        if idx.size == 0:
            return work_iter
        work_iter[idx] = _split_numpy(
            tc[idx], np.asarray(per_step)[idx], np.asarray(h15u), np.asarray(h2u), np.asarray(dramu),
            np.asarray(inv)[idx], has_l15, work_iter[idx], None, None, None,
            None if dram_scale is None else np.asarray(dram_scale)[idx], work_only=True)[0]
        return work_iter
    f64 = lambda a: np.ascontiguousarray(a, dtype=np.float64)  # noqa: E731
    i64 = lambda a: np.ascontiguousarray(a, dtype=np.int64)  # noqa: E731
    run_shares(_edge_work_rows, (f64(t_crit), f64(t_bytes), i64(per_step), f64(h15u), f64(h2u),
                                 f64(dramu),
                                 i64(inv), bool(has_l15),
                                 f64(dram_scale) if dram_scale is not None else np.ones((1, 1)),
                                 dram_scale is not None, work_iter), even_bounds(rows))
    return work_iter


@jit_exact
def _compulsory_rows(t_bytes, per_step, t_mask, g0, g1, g2, p, sms, wave_samples, margin,
                     has_l15, dram_scale, has_scale, work_iter, lo, hi):
    T = t_bytes.shape[1]
    for i in range(lo, hi):
        tiles = g0[i] * g1[i] * g2[i]
        conc = sms * (p[i] if p[i] > 1 else 1)
        whole = tiles > 0 and (tiles + conc - 1) // conc <= wave_samples
        req_tot = 0.0
        l2 = 0.0
        dram = 0.0
        for t in range(T):
            step = per_step[i, t] != 0
            req = t_bytes[i, t] if step else 0.0
            frac = 0.0
            if whole and step:
                m = t_mask[i, t]
                share = 1.0
                share *= float(g0[i]) if m & 1 else 1.0
                share *= float(g1[i]) if (m >> 1) & 1 else 1.0
                share *= float(g2[i]) if (m >> 2) & 1 else 1.0
                if share > 0.0:
                    frac = (1.0 - margin) / share - 1e-11
                    if frac < 0.0:
                        frac = 0.0
            dreq = req * dram_scale[i, t] if has_scale else req
            if t == 0:
                req_tot = req
                l2 = req * frac
                dram = dreq * frac
            else:
                req_tot += req
                l2 += req * frac
                dram += dreq * frac
        if has_l15:
            work_iter[i, R_L15] = req_tot
            work_iter[i, R_L2] = l2
        else:
            work_iter[i, R_L15] = 0.0
            work_iter[i, R_L2] = req_tot  # h15 is 0 without an L1.5 tier
        work_iter[i, R_DRAM] = dram


def compulsory_work(t_bytes, per_step, t_mask, g0, g1, g2, p, sms, wave_samples, margin,
                    has_l15, dram_scale, work_iter):
    """The screen's bound's L1.5, L2 and DRAM columns, written into ``work_iter``
    (``(n, N_RES)`` float64, C-contiguous; changed in place): the requested
    bytes per step on L1.5 (L2 without an L1.5 tier), and on L2 (L1.5 parts)
    and DRAM (with ``dram_scale``) each per-step tensor's compulsory share
    ``(1 - margin) / share_t - 1e-11`` (at least 0) of them, where the launch's
    ``ceil(tiles / (sms max(p, 1)))`` waves are at most ``wave_samples``, else
    none (:func:`tsbatch.engine.screen.compulsory_fractions`, whose numpy form
    it equals to the bit, sums left to right as numpy does for ``T < 8``
    tensors). One pass, no ``(n, T)`` temporaries. Plain-Python twin:
    ``tests/naive.py``, ``compulsory_work_one``."""
    i64 = lambda a: np.ascontiguousarray(a, dtype=np.int64)  # noqa: E731
    rows = np.shape(t_bytes)[0]
    if not (work_iter.flags.c_contiguous and work_iter.dtype == np.float64):
        raise ValueError("compulsory_work: work_iter must be C-contiguous float64")
    _compulsory_rows(np.ascontiguousarray(t_bytes, dtype=np.float64), i64(per_step), i64(t_mask),
                     i64(g0), i64(g1), i64(g2), i64(p), int(sms), int(wave_samples),
                     float(margin), bool(has_l15),
                     np.ascontiguousarray(dram_scale, dtype=np.float64)
                     if dram_scale is not None else np.ones((1, 1)),
                     dram_scale is not None, work_iter, 0, rows)
    return work_iter


@jit_exact
def _bottleneck_rows(util, lat, launch, min_util, out, lo, hi):
    R = util.shape[1]
    for i in range(lo, hi):
        # np.argmax over nan_to_num(util, nan=-1): the first largest
        idx = 0
        best_v = -1.0
        for r in range(R):
            v = util[i, r]
            if math.isnan(v):
                v = -1.0
            elif math.isinf(v):  # as nan_to_num: the largest finite value of its sign
                v = _FMAX if v > 0 else -_FMAX
            if r == 0 or v > best_v:
                idx = r
                best_v = v
        best = util[i, idx]
        if math.isnan(best):
            best = 0.0
        code = idx
        if best < min_util:
            code = N_RES
            if launch[i] > 0.5 * lat[i]:
                code = N_RES + 1
        if not math.isfinite(lat[i]):
            code = N_RES + 2
        out[i] = code


def _bottleneck_numpy(util, lat, launch, min_util):
    """The numpy form (small calls)."""
    idx = np.argmax(np.nan_to_num(util, nan=-1.0), axis=1)
    best = np.take_along_axis(np.nan_to_num(util, nan=0.0), idx[:, None], axis=1)[:, 0]
    idx = np.where(best < min_util, N_RES, idx)
    idx = np.where((best < min_util) & (launch > 0.5 * lat), N_RES + 1, idx)
    return np.where(np.isfinite(lat), idx, N_RES + 2)


def bottleneck_codes(util, lat, launch, min_util: float) -> np.ndarray:
    """Per row, the code of its bottleneck: the resource of the highest
    utilization (the first of equals; NaN counts as none); ``N_RES`` (latency)
    when that is below ``min_util``, ``N_RES + 1`` (launch) when besides the
    launch is over half the latency; ``N_RES + 2`` when the latency is not
    finite."""
    f64 = lambda a: np.ascontiguousarray(a, dtype=np.float64)  # noqa: E731
    util = f64(util)
    rows = util.shape[0]
    if rows < KERNEL_MIN_ROWS:
        return _bottleneck_numpy(util, np.asarray(lat), np.asarray(launch), min_util)
    out = np.empty(rows, dtype=np.int64)
    run_shares(_bottleneck_rows, (util, f64(lat), f64(launch), float(min_util), out),
               even_bounds(rows))
    return out
