"""Exact LRU L2 at line granularity over tile-derived addresses.

Lines are identified by ``byte_address // line_bytes`` (tags are 32-bit:
address spaces up to 256 GiB with 128 B lines). The cache has
``n_sets`` sets of ``assoc`` ways; a line's set is a multiplicative hash of
its line number (GPUs hash physical addresses over L2 slices), and each set
keeps its tags in recency order (way 0 = most recent) with exact LRU
replacement. ``assoc >= capacity`` gives one set: a fully associative LRU,
the cache of GTSim §5.

Why sets: a fully associative linked-list LRU touches five scattered
entries per access; a 16-way set is two adjacent cache lines of the host,
about four times faster, which keeps a 4096^3 GEMM (17-25 million line
accesses) inside the speed budget. It is also the cache the analytical
model's SDCM assumes (``A``-way LRU sets with uniformly hashed placement,
TileSight §3.5.2), so the simulator is the exact oracle for that model.
"""

from __future__ import annotations

import numpy as np
from tsbatch.kernels._config import jit_exact_inline

__all__ = ["lru_new", "l15_new", "lru_access", "set_of", "LruCache"]


def lru_new(capacity_lines: int, assoc: int):
    """An empty cache; returns ``(tags, meta)`` with ``meta = [n_sets, assoc]``."""
    cap = max(int(capacity_lines), 1)
    a = max(1, min(int(assoc), cap)) if assoc > 0 else cap
    n_sets = max(cap // a, 1)
    tags = np.full(n_sets * a, -1, dtype=np.int32)
    meta = np.array([n_sets, a], dtype=np.int64)
    return tags, meta


def l15_new(n_groups: int, capacity_lines: int, assoc: int):
    """``n_groups`` empty caches of the same geometry, back to back in one array.

    Returns ``(tags, meta)``; cache ``g`` is ``tags[g * n_sets * a:(g + 1) * n_sets * a]``
    and is used with :func:`lru_access` and the shared ``meta``.
    """
    tags, meta = lru_new(capacity_lines, assoc)
    return np.tile(tags, max(int(n_groups), 1)), meta


@jit_exact_inline
def set_of(line, n_sets):
    """Set index of a line: Fibonacci hash of the line number, mapped onto the sets by
    multiply-shift (``(h32 * n_sets) >> 32`` of the hash's high 32 bits: uniform, no division)."""
    h = (np.uint64(line) * np.uint64(11400714819323198485)) >> np.uint64(32)
    return np.int64((h * np.uint64(n_sets)) >> np.uint64(32))


@jit_exact_inline
def lru_access(tags, meta, line):
    """Touch one line; returns True on a hit. A miss inserts it and drops the set's LRU way."""
    a = meta[1]
    base = set_of(line, meta[0]) * a
    p = a - 1
    hit = False
    for w in range(a):
        t = tags[base + w]
        if t == line:
            p = w
            hit = True
            break
        if t < 0:
            p = w
            break
    for w in range(p, 0, -1):
        tags[base + w] = tags[base + w - 1]
    tags[base] = line
    return hit


class LruCache:
    """Python handle on the numba cache (for tests and the cache-oracle bench)."""

    def __init__(self, capacity_lines: int, assoc: int):
        self.tags, self.meta = lru_new(capacity_lines, assoc)

    def access(self, line: int) -> bool:
        return bool(lru_access(self.tags, self.meta, np.int64(line)))

    def __len__(self) -> int:
        return int((self.tags >= 0).sum())
