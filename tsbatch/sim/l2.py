"""Exact LRU L2 at line granularity (GTSim §5: fully associative, LRU).

Lines are identified by ``byte_address // line_bytes`` over tile-derived
addresses. The cache keeps only resident lines: an open-addressing hash
table (linear probing, backward-shift deletion) maps a line to its entry in
a fixed pool, and the pool entries form a doubly linked recency list. Every
access is O(1) and the memory is bounded by the capacity, not by the
footprint of the tensors.

The state lives in plain arrays so the event loop (numba) can own it:
``meta = [head, tail, count, mask, capacity]`` (head = most recent).
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["lru_new", "lru_access", "LruCache"]

_EMPTY = -1


def lru_new(capacity_lines: int):
    """Allocate an empty LRU of ``capacity_lines`` lines; returns its state arrays."""
    cap = max(int(capacity_lines), 1)
    size = 1
    while size < 2 * cap:
        size *= 2
    meta = np.array([-1, -1, 0, size - 1, cap], dtype=np.int64)
    keys = np.full(size, _EMPTY, dtype=np.int64)
    vals = np.zeros(size, dtype=np.int64)
    pkey = np.zeros(cap, dtype=np.int64)
    prev = np.full(cap, -1, dtype=np.int64)
    nxt = np.full(cap, -1, dtype=np.int64)
    return meta, keys, vals, pkey, prev, nxt


@njit(cache=True, nogil=True, inline="always")
def _home(key, mask):
    # Fibonacci hashing: the high bits of key * 2^64/phi, folded to the table size
    h = np.uint64(key) * np.uint64(11400714819323198485)
    return np.int64((h >> np.uint64(32)) ^ h) & mask


@njit(cache=True, nogil=True)
def _find(keys, mask, key):
    i = _home(key, mask)
    while keys[i] != _EMPTY:
        if keys[i] == key:
            return i
        i = (i + 1) & mask
    return -(i + 1)


@njit(cache=True, nogil=True)
def _delete(keys, vals, mask, i):
    keys[i] = _EMPTY
    j = i
    while True:
        j = (j + 1) & mask
        if keys[j] == _EMPTY:
            return
        k = _home(keys[j], mask)
        # move entry j back to the hole at i unless its home lies cyclically in (i, j]
        if i <= j:
            stays = i < k <= j
        else:
            stays = k > i or k <= j
        if not stays:
            keys[i] = keys[j]
            vals[i] = vals[j]
            keys[j] = _EMPTY
            i = j


@njit(cache=True, nogil=True)
def _unlink(meta, prev, nxt, e):
    p = prev[e]
    q = nxt[e]
    if p >= 0:
        nxt[p] = q
    else:
        meta[0] = q
    if q >= 0:
        prev[q] = p
    else:
        meta[1] = p


@njit(cache=True, nogil=True)
def _push_front(meta, prev, nxt, e):
    prev[e] = -1
    nxt[e] = meta[0]
    if meta[0] >= 0:
        prev[meta[0]] = e
    meta[0] = e
    if meta[1] < 0:
        meta[1] = e


@njit(cache=True, nogil=True)
def lru_access(meta, keys, vals, pkey, prev, nxt, line):
    """Touch one line; returns True on a hit. A miss inserts it, evicting the LRU line."""
    mask = meta[3]
    i = _find(keys, mask, line)
    if i >= 0:
        e = vals[i]
        if meta[0] != e:
            _unlink(meta, prev, nxt, e)
            _push_front(meta, prev, nxt, e)
        return True
    if meta[2] < meta[4]:
        e = meta[2]
        meta[2] += 1
    else:
        e = meta[1]
        _unlink(meta, prev, nxt, e)
        j = _find(keys, mask, pkey[e])
        _delete(keys, vals, mask, j)
        i = _find(keys, mask, line)
    slot = -i - 1
    keys[slot] = line
    vals[slot] = e
    pkey[e] = line
    _push_front(meta, prev, nxt, e)
    return False


class LruCache:
    """Python handle on the numba LRU (for tests and the cache-oracle bench)."""

    def __init__(self, capacity_lines: int):
        self.state = lru_new(capacity_lines)

    def access(self, line: int) -> bool:
        return bool(lru_access(*self.state, np.int64(line)))

    def __len__(self) -> int:
        return int(self.state[0][2])
