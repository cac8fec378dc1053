"""Order rows by (group, key, position): the sort behind the screened top-k ranking.

:func:`group_lexorder` returns the permutation ``np.lexsort((pos, key, gid))``
(or ``np.lexsort((key, gid))`` without positions). It does not sort the whole
array three times. Rows are bucketed by group with a counting sort, which
is stable and O(n + groups), and each group's rows are then sorted on their
own: by insertion when it holds at most 24 rows, else by position and then,
stably, by key. Each group's segment is small and stays in the CPU caches,
where three global sorts of a million rows do not. A segment whose
positions already rise with the row index (rows given in input order) skips
the sort by position.

:func:`group_first_k` keeps the first ``k`` rows of each group by ``(key,
position)`` and gives the ``k``-th key, in one pass: a group of at most
``k`` rows is kept whole, and a larger one is split around its ``k``-th
row by quickselect, not sorted.
The plain-Python twin of both is ``np.lexsort`` itself (tests/test_screen.py).
"""

from __future__ import annotations

import numpy as np

from tsbatch.kernels._config import jit_exact

__all__ = ["group_lexorder", "group_first_k"]


#: groups of at most this many rows are sorted by insertion, in place
_SMALL = 24


@jit_exact
def _before(ka, pa, kb, pb, use_pos):
    """Row a goes strictly before row b: by key (NaN after every number), then
    by position when ``use_pos``."""
    if ka != ka:                       # NaN: after every number
        if kb == kb:
            return False
        return use_pos and pa < pb
    if kb != kb:
        return True
    if ka < kb:
        return True
    if ka > kb:
        return False
    return use_pos and pa < pb


@jit_exact
def _bucket(gid, ngroups):
    """Counting sort by group: ``(start, order)``, group ``g``'s rows being
    ``order[start[g]:start[g + 1]]`` in index order (stable)."""
    n = gid.shape[0]
    start = np.zeros(ngroups + 1, dtype=np.int64)
    for i in range(n):
        start[gid[i] + 1] += 1
    for g in range(ngroups):
        start[g + 1] += start[g]
    fill = start[:ngroups].copy()
    order = np.empty(n, dtype=np.int64)
    for i in range(n):
        g = gid[i]
        order[fill[g]] = i
        fill[g] += 1
    return start, order


@jit_exact
def _sort_segment(order, a, b, key, pos, use_pos, sk, sp, si):
    """Sort ``order[a:b]`` (rows in index order) by ``(key, pos)``, stably."""
    m = b - a
    if m < 2:
        return
    if m <= _SMALL:                    # insertion sort on gathered keys: stable
        for i in range(m):
            r = order[a + i]
            sk[i] = key[r]
            sp[i] = pos[r] if use_pos else 0
            si[i] = r
        for i in range(1, m):
            kr = sk[i]
            pr = sp[i]
            r = si[i]
            j = i - 1
            while j >= 0 and _before(kr, pr, sk[j], sp[j], use_pos):
                sk[j + 1] = sk[j]
                sp[j + 1] = sp[j]
                si[j + 1] = si[j]
                j -= 1
            sk[j + 1] = kr
            sp[j + 1] = pr
            si[j + 1] = r
        for i in range(m):
            order[a + i] = si[i]
        return
    seg = order[a:b].copy()
    if use_pos:
        ordered = True                 # positions often rise with the index already
        for i in range(1, m):
            if pos[seg[i]] < pos[seg[i - 1]]:
                ordered = False
                break
        if not ordered:
            seg = seg[np.argsort(pos[seg], kind="mergesort")]
    order[a:b] = seg[np.argsort(key[seg], kind="mergesort")]


@jit_exact
def _group_lexorder(gid, key, pos, use_pos, ngroups):
    start, order = _bucket(gid, ngroups)
    sk = np.empty(_SMALL, dtype=np.float64)
    sp = np.empty(_SMALL, dtype=np.int64)
    si = np.empty(_SMALL, dtype=np.int64)
    for g in range(ngroups):
        _sort_segment(order, start[g], start[g + 1], key, pos, use_pos, sk, sp, si)
    return order


@jit_exact
def _group_first_k(gid, key, pos, k, ngroups):
    start, order = _bucket(gid, ngroups)
    keep = np.zeros(gid.shape[0], dtype=np.bool_)
    kth = np.full(ngroups, np.inf)
    sk = np.empty(_SMALL, dtype=np.float64)
    sp = np.empty(_SMALL, dtype=np.int64)
    si = np.empty(_SMALL, dtype=np.int64)
    for g in range(ngroups):
        a = start[g]
        b = start[g + 1]
        kg = k[g]
        if b - a <= kg:                # the whole group is kept: no sort
            for i in range(a, b):
                keep[order[i]] = True
            if b - a == kg and kg > 0:  # its last row by (key, pos) holds the k-th key
                last = order[a]
                for i in range(a + 1, b):
                    r = order[i]
                    if _before(key[last], pos[last], key[r], pos[r], True):
                        last = r
                kth[g] = key[last]
            continue
        if kg == 0:
            continue
        _select(order, a, b, kg, key, pos)
        for i in range(a, a + kg):
            keep[order[i]] = True
        kth[g] = key[order[a + kg - 1]]
    return keep, kth


@jit_exact
def _less(key, pos, r, s):
    """Row r before row s: by key (NaN last), then position, then index (the
    order np.lexsort gives, total: no two rows are equal in it)."""
    if _before(key[r], pos[r], key[s], pos[s], True):
        return True
    if _before(key[s], pos[s], key[r], pos[r], True):
        return False
    return r < s


@jit_exact
def _select(order, a, b, k, key, pos):
    """Quickselect on ``order[a:b]``: its ``k`` first rows (in :func:`_less`
    order) to ``order[a:a + k]``, unsorted, the ``k``-th of them last (at
    ``a + k - 1``). Expected O(b - a), where a sort is O(n log n)."""
    lo = a
    hi = b - 1
    t = a + k - 1
    while lo < hi:
        mid = (lo + hi) // 2           # median of three as the pivot
        if _less(key, pos, order[mid], order[lo]):
            order[mid], order[lo] = order[lo], order[mid]
        if _less(key, pos, order[hi], order[lo]):
            order[hi], order[lo] = order[lo], order[hi]
        if _less(key, pos, order[hi], order[mid]):
            order[hi], order[mid] = order[mid], order[hi]
        pv = order[mid]
        i = lo
        j = hi
        while i <= j:
            while _less(key, pos, order[i], pv):
                i += 1
            while _less(key, pos, pv, order[j]):
                j -= 1
            if i <= j:
                order[i], order[j] = order[j], order[i]
                i += 1
                j -= 1
        if t <= j:
            hi = j
        elif t >= i:
            lo = i
        else:
            break
    # order[t] is now the k-th row; the rows before it are the k - 1 before it in
    # _less order, and the k-th is the greatest of order[a:t + 1]


def group_lexorder(gid: np.ndarray, key: np.ndarray, pos: np.ndarray | None = None) -> np.ndarray:
    """``np.lexsort((pos, key, gid))`` (``np.lexsort((key, gid))`` when ``pos`` is None).

    ``gid``: non-negative integer group ids; ``key``: float keys (NaN after
    every number, as numpy sorts it); ``pos``: integer tie-breaks.
    """
    n = gid.shape[0]
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    g = np.ascontiguousarray(gid, dtype=np.int64)
    lo = int(g.min())
    if lo < 0:
        raise ValueError("group_lexorder: group ids must be non-negative")
    k = np.ascontiguousarray(key, dtype=np.float64)
    p = np.ascontiguousarray(pos if pos is not None else np.zeros(0), dtype=np.int64)
    return _group_lexorder(g, k, p, pos is not None, int(g.max()) + 1)


def group_first_k(gid: np.ndarray, key: np.ndarray, pos: np.ndarray,
                  k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The first ``k[g]`` rows of each group ``g`` by ``(key, pos)``, and their last key.

    Returns ``(keep, kth)``: a row mask, and per group the ``k[g]``-th
    smallest key (``+inf`` when the group holds fewer than ``k[g]`` rows, or
    ``k[g]`` is 0). ``k`` holds one entry per group id (``len(k) > max(gid)``).
    A group of at most ``k[g]`` rows is kept whole without being sorted.
    """
    n = gid.shape[0]
    kk = np.ascontiguousarray(k, dtype=np.int64)
    if n == 0:
        return np.zeros(0, dtype=bool), np.full(kk.shape[0], np.inf)
    g = np.ascontiguousarray(gid, dtype=np.int64)
    if int(g.min()) < 0 or int(g.max()) >= kk.shape[0]:
        raise ValueError("group_first_k: group ids must lie in [0, len(k))")
    return _group_first_k(g, np.ascontiguousarray(key, dtype=np.float64),
                          np.ascontiguousarray(pos, dtype=np.int64), kk, kk.shape[0])
