"""Order rows by (group, key, position): the sort behind the screened top-k ranking.

:func:`group_lexorder` returns the permutation ``np.lexsort((pos, key, gid))``
(or ``np.lexsort((key, gid))`` without positions). It does not sort the whole
array three times. Rows are bucketed by group with a counting sort, which
is stable and O(n + groups), and each group's rows are then sorted on their
own: by insertion when it holds at most 24 rows, else by position and then,
stably, by key. Each group's segment is small and stays in the CPU caches,
where three global sorts of a million rows do not.
The plain-Python twin is ``np.lexsort`` itself (tests/test_screen.py).
"""

from __future__ import annotations

import numpy as np

from tsbatch.kernels._config import jit_exact

__all__ = ["group_lexorder"]


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
def _group_lexorder(gid, key, pos, use_pos, ngroups):
    n = gid.shape[0]
    start = np.zeros(ngroups + 1, dtype=np.int64)
    for i in range(n):
        start[gid[i] + 1] += 1
    for g in range(ngroups):
        start[g + 1] += start[g]
    fill = start[:ngroups].copy()
    order = np.empty(n, dtype=np.int64)
    sk = np.empty(_SMALL, dtype=np.float64)
    sp = np.empty(_SMALL, dtype=np.int64)
    si = np.empty(_SMALL, dtype=np.int64)
    for i in range(n):
        g = gid[i]
        order[fill[g]] = i
        fill[g] += 1
    for g in range(ngroups):
        a = start[g]
        b = start[g + 1]
        if b - a < 2:
            continue
        if b - a <= _SMALL:            # insertion sort on gathered keys: stable
            m = b - a
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
            continue
        seg = order[a:b].copy()
        if use_pos:
            seg = seg[np.argsort(pos[seg], kind="mergesort")]
        order[a:b] = seg[np.argsort(key[seg], kind="mergesort")]
    return order


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
