"""Kernels for tests/test_extern.py: a separately linked callee and its callers
(importable by name, as a cached caller's reload entry needs)."""

from __future__ import annotations

import numpy as np
from numba import njit

from tsbatch.kernels._extern import separately_linked
from tsbatch.kernels._fastload import fast_loading

jit = fast_loading(njit(cache=True, nogil=True))
jit_borrow = fast_loading(njit(cache=True, nogil=True, _nrt=False))


@separately_linked
@jit_borrow
def scaled_sum(x, a, out):
    """sum(a * x) into out[0], and the count of negative entries returned;
    a negative ``a`` raises (an error status through the call)."""
    if a < 0.0:
        raise ValueError("negative scale")
    s = 0.0
    neg = 0
    for i in range(x.shape[0]):
        s += a * x[i]
        if x[i] < 0.0:
            neg += 1
    out[0] = s
    return neg


@jit
def caller(x, a):
    out = np.zeros(1)
    n = scaled_sum(x, a, out)
    m = scaled_sum(x[::-1].copy(), 2.0 * a, out[:1])
    return out[0], n + m


@jit
def outer(x, a):
    """Two levels: calls ``caller`` (linked as usual), which calls the callee."""
    v, n = caller(x, a)
    return v + 1.0, n


@separately_linked
@fast_loading(njit(cache=True, nogil=True, no_cpython_wrapper=True, no_cfunc_wrapper=True))
def internal_twice(x):
    """Jitted callers only: compiled without a Python wrapper."""
    return 2.0 * x


@jit
def calls_internal(x):
    return internal_twice(x) + internal_twice(1.0)
