"""Row shares of a batch kernel, run on a pool of threads.

A serial ``nogil`` kernel over rows ``lo:hi`` runs on several threads at once
(the GIL is released while it runs), which gives the speed of a ``prange``
kernel without compiling one: numba's parallel lowering of the cache model's
and the envelope's row loops took ~18 and ~8 s of every cold start.
The threads are numba's count (``numba.get_num_threads()``:
``NUMBA_NUM_THREADS``, by default the cores); the pool is made once per
process, on first need (and again in a forked child). A kernel run here must
not itself wait on the pool.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numba
from numba.np.ufunc import parallel as _numba_parallel

__all__ = ["num_threads", "run_shares", "even_bounds"]

#: rows of the least share given to a thread of its own (:func:`even_bounds`): a
#: bound slice (64k rows, tsbatch.engine.screen) runs its kernels on its own thread
MIN_SHARE = 1 << 16

_POOL: ThreadPoolExecutor | None = None
_POOL_SIZE = 0
_LOCK = threading.Lock()


def _forget_pool() -> None:
    """In a forked child: the parent's pool threads do not exist there, and a
    pool that believes it has idle threads would queue work forever."""
    global _POOL, _POOL_SIZE, _LOCK
    _POOL = None
    _POOL_SIZE = 0
    _LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def num_threads() -> int:
    """``numba.get_num_threads()``. Until numba's threading layer has started,
    nothing can have set a count (``numba.set_num_threads`` starts it), and numba
    documents the count as ``NUMBA_NUM_THREADS`` then: that is returned without
    starting the layer (loading its library and its threads, ~13 ms of a process
    whose kernels are all serial)."""
    if not getattr(_numba_parallel, "_is_initialized", True):
        return max(1, int(numba.config.NUMBA_NUM_THREADS))
    return max(1, int(numba.get_num_threads()))


def _pool(threads: int) -> ThreadPoolExecutor:
    global _POOL, _POOL_SIZE
    with _LOCK:
        if _POOL is None or _POOL_SIZE < threads:
            _POOL = ThreadPoolExecutor(threads, thread_name_prefix="tsbatch-rows")
            _POOL_SIZE = threads
        return _POOL


def even_bounds(n: int, min_share: int | None = None) -> list[int]:
    """Contiguous shares of ``n`` rows, one per thread, none below ``min_share``
    (default :data:`MIN_SHARE`) rows (``[0, n]``: one share)."""
    if min_share is None:
        min_share = MIN_SHARE
    k = max(1, min(num_threads(), n // max(min_share, 1)))
    return [n * c // k for c in range(k + 1)]


def run_shares(kernel, args: tuple, bounds: list[int]) -> None:
    """``kernel(*args, lo, hi)`` for each share ``bounds[c]:bounds[c + 1]``: on
    this thread for one share, else one share per pool thread (the first
    error is raised once all have ended)."""
    if len(bounds) <= 2:
        kernel(*args, bounds[0], bounds[-1])
        return
    ex = _pool(len(bounds) - 1)
    jobs = [ex.submit(kernel, *args, lo, hi) for lo, hi in zip(bounds[:-1], bounds[1:])]
    for j in jobs:
        j.exception()  # wait for every share before raising any error
    for j in jobs:
        j.result()
