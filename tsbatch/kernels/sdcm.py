"""Stochastic distance cache model (SDCM): hit probability from a reuse distance.

TileSight §3.5.2. A block whose last access lies ``D`` distinct blocks back
hits a ``B``-block, ``A``-way LRU cache if fewer than ``A`` of those ``D``
blocks mapped to its set; with uniformly random set placement each does so
with probability ``A / B``.

Notes
-----
Eq. 7 (exact binomial): ``P(h|D) = sum_{a<A} C(D,a) (A/B)^a (1-A/B)^(D-a)``.
Eq. 8-9 (Gaussian): the binomial count ``X ~ N(mu, sigma^2)`` with
``mu = D A / B`` and ``sigma^2 = D (A/B)(1 - A/B)``, so
``P(h|D) ~ Phi((A - 1/2 - mu) / sigma)``. The paper prints
``1 - Q(|A - 1 - mu| / sigma)``; taken literally the absolute value would
keep every hit probability at or above one half, so we use the signed form
(which is what ``1 - Q`` of a signed argument means) with the usual
half-unit continuity correction, which halves the worst-case gap to Eq. 7.
Eq. 10 (Zelen-Severo, Abramowitz & Stegun 26.2.16): ``Phi(x) ~ 1 - phi(x)
(a1 t + a2 t^2 + a3 t^3)``, ``t = 1/(1 + 0.33267 x)``, ``x >= 0``, absolute
error below ``1e-5``.
"""

from __future__ import annotations

import math

import numpy as np
from numba import prange

from tsbatch.kernels._config import jit_parallel, jit_scalar

__all__ = [
    "ZS_P",
    "ZS_A1",
    "ZS_A2",
    "ZS_A3",
    "ZS_MAX_ABS_ERROR",
    "norm_cdf_zs",
    "norm_cdf_exact",
    "hit_prob_exact",
    "hit_prob_gauss",
    "hit_prob_exact_array",
    "hit_prob_gauss_array",
    "norm_cdf_zs_array",
]

ZS_P = 0.33267
ZS_A1 = 0.4361836
ZS_A2 = -0.1201676
ZS_A3 = 0.9372980
#: error bound of the Zelen-Severo formula: A&S 26.2.16 states 1e-5, but with
#: its published 7-digit constants the worst case is 1.153e-5 (x = 0.526),
#: found by a dense scan in tests/test_kernels.py; we state the measured bound
ZS_MAX_ABS_ERROR = 1.2e-5
_INV_SQRT_2PI = 0.3989422804014327
#: A&S 26.2.16's coefficients give the upper tail at 0 as
#: (a1 + a2 + a3) / sqrt(2 pi) = 0.4999999452, not 1/2, so the formula with its
#: symmetry Phi(x) = 1 - Phi(-x) jumps by 1.1e-7 at x = 0 (0.5000000548 just
#: above, 0.4999999452 below): two evaluations of the same hit probability whose
#: z rounds to either side of 0 differed by that (docs/gemm_accuracy.md, "A
#: cache-column mismatch, session 11", seed 6). The tail is scaled by this
#: factor (1 + 1.1e-7) so that it is exactly 1/2 at 0 and the CDF continuous;
#: the measured error bound below holds as before
ZS_Q0_SCALE = 0.5 / (_INV_SQRT_2PI * (ZS_A1 + ZS_A2 + ZS_A3))


@jit_scalar
def norm_cdf_zs(x):
    """Standard normal CDF by Zelen-Severo (Eq. 10), valid for every real ``x``,
    its tail scaled to 1/2 at 0 (:data:`ZS_Q0_SCALE`: continuous at 0)."""
    ax = abs(x)
    t = 1.0 / (1.0 + ZS_P * ax)
    pdf = _INV_SQRT_2PI * math.exp(-0.5 * ax * ax)
    upper = ZS_Q0_SCALE * pdf * t * (ZS_A1 + t * (ZS_A2 + t * ZS_A3))  # Q(|x|)
    if x >= 0.0:
        return 1.0 - upper
    return upper


@jit_scalar
def norm_cdf_exact(x):
    """Standard normal CDF through ``erfc`` (reference for Eq. 10)."""
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


@jit_scalar
def _edge(d, assoc, blocks):
    """Cases both forms share: ``-1`` when none applies, else the probability.

    A first touch (``inf``) misses, a zero distance hits, an empty cache
    misses, and a cache of at most ``assoc`` blocks is one fully associative
    set of ``floor(blocks)`` ways: it hits iff fewer blocks intervened.
    """
    if not (d < math.inf):
        return 0.0
    if d <= 0.0:
        return 1.0
    if blocks < 1.0:
        return 0.0
    if assoc >= blocks:
        return 1.0 if math.floor(d) <= math.floor(blocks) - 1.0 else 0.0
    return -1.0


@jit_scalar
def hit_prob_gauss(d, assoc, blocks):
    """Gaussian SDCM hit probability (Eq. 8-10) for reuse distance ``d``.

    ``d`` may be fractional (distances weighted by block size) or ``inf``
    (first touch, always a miss). ``blocks`` is the capacity in blocks.
    """
    e = _edge(d, assoc, blocks)
    if e >= 0.0:
        return e
    p = assoc / blocks
    mu = d * p
    var = d * p * (1.0 - p)
    if var <= 0.0:
        return 1.0 if mu <= assoc - 1.0 else 0.0
    z = (assoc - 0.5 - mu) / math.sqrt(var)
    return norm_cdf_zs(z)


@jit_scalar
def hit_prob_exact(d, assoc, blocks):
    """Exact binomial SDCM hit probability (Eq. 7); ``d`` is rounded down."""
    e = _edge(d, assoc, blocks)
    if e >= 0.0:
        return e
    n = math.floor(d)
    p = assoc / blocks
    a_max = int(assoc) - 1
    if n <= a_max:  # the whole binomial sums to 1: fewer than A blocks intervene
        return 1.0
    lp = math.log(p)
    lq = math.log1p(-p)
    total = 0.0
    top = a_max if a_max < n else int(n)
    # log C(n, a) term by term (at most A terms): lgamma(n + 1) - lgamma(n - a + 1)
    # cancels two values of order n log n and left the sum non-monotone in d by
    # up to 3e-11
    lc = 0.0
    for a in range(top + 1):
        if a > 0:
            lc += math.log((n - a + 1.0) / a)
        total += math.exp(lc + a * lp + (n - a) * lq)
    if total > 1.0:
        total = 1.0
    return total


@jit_parallel
def _gauss_array(d, assoc, blocks, out):
    for i in prange(d.shape[0]):
        out[i] = hit_prob_gauss(d[i], assoc[i], blocks[i])


@jit_parallel
def _exact_array(d, assoc, blocks, out):
    for i in prange(d.shape[0]):
        out[i] = hit_prob_exact(d[i], assoc[i], blocks[i])


@jit_parallel
def _zs_array(x, out):
    for i in prange(x.shape[0]):
        out[i] = norm_cdf_zs(x[i])


def _f64(a, n=None):
    arr = np.ascontiguousarray(np.asarray(a, dtype=np.float64)).reshape(-1)
    if n is not None and arr.shape[0] == 1 and n > 1:
        arr = np.full(n, arr[0], dtype=np.float64)
    return arr


def _batched(kernel, d, assoc, blocks):
    d = _f64(d)
    n = d.shape[0]
    out = np.empty(n, dtype=np.float64)
    kernel(d, _f64(assoc, n), _f64(blocks, n), out)
    return out


def hit_prob_gauss_array(d, assoc, blocks):
    """Vectorized :func:`hit_prob_gauss`; scalars broadcast."""
    return _batched(_gauss_array, d, assoc, blocks)


def hit_prob_exact_array(d, assoc, blocks):
    """Vectorized :func:`hit_prob_exact`; scalars broadcast."""
    return _batched(_exact_array, d, assoc, blocks)


def norm_cdf_zs_array(x):
    """Vectorized :func:`norm_cdf_zs`."""
    x = _f64(x)
    out = np.empty(x.shape[0], dtype=np.float64)
    _zs_array(x, out)
    return out
