"""A cached kernel for tests/test_fastload.py whose code holds one of numba's own
implementations (``np.full``, from ``numba.np.arrayobj``), so that its cache entry
carries that implementation's environment."""

from __future__ import annotations

import numpy as np
from numba import njit

from tsbatch.kernels._fastload import fast_loading


@fast_loading(njit(cache=True, nogil=True))
def filled(n, v):
    a = np.full(n, v)
    a[0] = -v
    return a.sum(), a
