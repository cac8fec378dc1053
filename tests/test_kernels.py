"""Every numba kernel against its plain-Python twin in ``naive.py``.

Plus the properties the kernels must keep: hit probabilities in [0, 1] and
non-increasing in distance, the Gaussian SDCM close to the exact binomial,
Zelen-Severo close to erfc, residency monotone in resources, latency
monotone in rates and work. Bugs these tests found (stale Fenwick scratch,
caches smaller than their ways, a zero variance, the ZS bound) are fixed.
"""

from __future__ import annotations

import copy

import math
import os
import random
import subprocess
import sys
import warnings
from unittest import mock

import naive
import numpy as np
import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st
from numba.core.errors import NumbaPerformanceWarning
from numpy.testing import assert_allclose, assert_array_equal
from strategies import (
    cache_args, cache_problems, l15_groups_per_wave, naive_args, union_exact, waves,
)

from tsbatch.hw import get_hw, list_hw
from tsbatch.kernels import _threads, envelope, occupancy, order, reuse, sdcm
from tsbatch.kernels.envelope import COMPUTE, N_RES, R_DRAM, SHARED, evaluate_envelopes
from tsbatch.kernels.sdcm import ZS_MAX_ABS_ERROR

#: Zelen-Severo vs erfc: the measured worst case of A&S 26.2.16 with its
#: published constants is 1.1526e-5 at x = 0.52609 (a 1e-5 grid over 0..8),
#: above the 1e-5 it claims (sdcm.ZS_MAX_ABS_ERROR now states 1.2e-5)
ZS_MEASURED_MAX_ABS_ERROR = 1.16e-5
#: kernel vs twin on the same formula: the kernels run with fastmath
#: (reassociation, contraction, approximate ``exp``/``log``), a few ulps apart
FASTMATH_RTOL = 1e-12
FASTMATH_ATOL = 1e-13
#: Eq. 7: the kernel sums ``exp`` of lgamma differences (magnitude up to
#: ``n log n`` ~ 5e6 for ``n`` = 4e5), the twin multiplies ``comb`` by powers;
#: the rounding of those large logarithms (~1e-16 x 5e6) shows in each term
BINOMIAL_ATOL = 1e-8
#: Gaussian vs exact SDCM for ``B_T >= 2 A`` (A in {4, 8, 16, 32}, B_T up to
#: 1e5, every integer D in 0..4 B_T): measured worst 0.0367 at A=4, B_T=1e5,
#: D=85509, where the binomial is skewed (few ways) and the Gaussian is not
GAUSS_VS_EXACT_ATOL = 0.04
# the exact binomial SDCM form (a reference: the model runs the Gaussian one) sums
# exp(lgamma differences): its rounding is not monotone in d near 1; bound on a
# rise of its value between two distances (measured worst 1.1e-14 over 9 x 10^5
# random pairs, a = 1..32, blocks 0.5..1e5, d up to 4e5; 3.3e-11 before its
# log-binomial was summed term by term)
EXACT_ROUNDING = 1e-13
#: the same for ``A < B_T < 2 A`` (p = A/B_T near one, sigma near zero, where a
#: half-unit continuity correction is coarse): measured worst 0.1058 at A=32,
#: B_T=32.44, D=32 (a scan of 20,000 B_T in (A, A+2) for A=16 and 32)
GAUSS_VS_EXACT_ATOL_NEAR_ONE_SET = 0.11
#: the cross-wave union approximation of reuse.py (an upper bound on distances)
#: away from the layouts where it is exact has no small worst case: on caches
#: of a few blocks one over-counted block turns a hit into a miss. A search of
#: ~20,000 random small problems found per-tensor L2 hit-rate gaps of 0.206
#: and 0.302 (the two examples of test_cache_union_is_an_upper_bound_on_distance;
#: an earlier search had found 0.121), so the property checks the direction
#: only, and the size is held on a fixed seeded set:
#: the gap on the fixed seeded set of test_union_approximation_error:
#: measured mean 0.00103 and max 0.0421 over 300 problems x 2 tensors
UNION_APPROX_MEAN_ERROR = 0.0013
UNION_APPROX_SEEDED_MAX_ERROR = 0.05
#: "exact" cache comparisons: reuse._wave skips the within-step tree when the
#: whole step footprint hits with probability >= 1 - 1e-12 (all hits set to 1)
CACHE_EXACT_ATOL = 1e-11
#: smallest positive reuse distance (tile units) the properties draw: a
#: distance is bytes over the mean block size, never near the subnormal
#: range (hit_prob_gauss once divided by zero there: test_gauss_tiny_distance)
MIN_DISTANCE = 1e-9


def _quiet(fn, *args):
    """Call an sdcm ``*_array`` kernel, silencing only the compile-time
    NumbaPerformanceWarning that test_sdcm_array_kernels_compile_cleanly tracks."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NumbaPerformanceWarning)
        return fn(*args)


# ======================================================================
# normal CDF (Eq. 10)
# ======================================================================
@settings(max_examples=300, deadline=None)
@given(st.floats(-40.0, 40.0, allow_nan=False))
def test_norm_cdf_matches_twin(x):
    assert_allclose(sdcm.norm_cdf_zs(x), naive.norm_cdf_zs(x), rtol=FASTMATH_RTOL, atol=FASTMATH_ATOL)
    assert_allclose(sdcm.norm_cdf_exact(x), naive.norm_cdf(x), rtol=FASTMATH_RTOL, atol=FASTMATH_ATOL)


@settings(max_examples=300, deadline=None)
@given(st.floats(-1e6, 1e6, allow_nan=False))
def test_zelen_severo_within_its_measured_error(x):
    assert abs(sdcm.norm_cdf_zs(x) - naive.norm_cdf(x)) <= ZS_MEASURED_MAX_ABS_ERROR


def test_zelen_severo_error_on_a_dense_grid():
    x = np.linspace(-12.0, 12.0, 240_001)
    zs = _quiet(sdcm.norm_cdf_zs_array, x)
    ref = np.array([naive.norm_cdf(v) for v in x])
    err = np.abs(zs - ref)
    assert err.max() <= ZS_MEASURED_MAX_ABS_ERROR, (err.max(), x[err.argmax()])
    assert err.max() > 1.1e-5  # a real approximation, and the bound is tight


def test_zelen_severo_is_continuous_at_zero():
    """A&S 26.2.16's tail at 0 is 0.4999999452, so the plain formula jumped by
    1.1e-7 there; with the tail scaled to 1/2 the two sides meet, and a z that
    rounds to a tiny negative gives the probability a zero one does."""
    assert sdcm.ZS_Q0_SCALE - 1.0 == pytest.approx(1.1e-7, rel=0.01)
    assert sdcm.norm_cdf_zs(0.0) == 0.5
    for tiny in (1e-300, 1e-17, 1e-12):
        assert abs(sdcm.norm_cdf_zs(tiny) - sdcm.norm_cdf_zs(-tiny)) <= 1e-12
    # the case hypothesis found: d = 2.4, 2 ways, 3.2 blocks -> z = 0
    assert sdcm.hit_prob_gauss(2.4, 2.0, 3.2) == pytest.approx(0.5, abs=1e-15)


def test_zelen_severo_within_published_error():
    x = 0.52609
    assert abs(sdcm.norm_cdf_zs(x) - naive.norm_cdf(x)) <= ZS_MAX_ABS_ERROR


# ======================================================================
# SDCM hit probability (Eq. 7-9)
# ======================================================================
assoc_ways = st.sampled_from([1, 2, 4, 8, 16, 32])


@st.composite
def sdcm_case(draw, integer_d=False):
    """``(d, A, B)`` with ``A / B < 1`` (Eq. 7's domain) and ``d`` in ``0..4 B``."""
    a = draw(assoc_ways)
    b = draw(st.floats(a * 1.001, 1e5))
    if integer_d:
        d = float(draw(st.integers(0, int(4 * b))))
    else:
        d = draw(st.one_of(st.just(0.0), st.floats(MIN_DISTANCE, 4 * b)))
    return d, float(a), b


@settings(max_examples=300, deadline=None)
@given(sdcm_case())
def test_hit_prob_gauss_matches_twin(case):
    d, a, b = case
    assert_allclose(sdcm.hit_prob_gauss(d, a, b), naive.hit_prob_gauss(d, a, b),
                    rtol=FASTMATH_RTOL, atol=FASTMATH_ATOL)


@settings(max_examples=300, deadline=None)
@given(sdcm_case())
def test_hit_prob_exact_matches_twin(case):
    d, a, b = case
    assert_allclose(sdcm.hit_prob_exact(d, a, b), naive.hit_prob_exact(d, a, b),
                    rtol=0, atol=BINOMIAL_ATOL)


def test_sdcm_array_wrappers_match_scalars():
    rng = np.random.default_rng(7)
    a = rng.choice([2.0, 8.0, 16.0], 500)
    b = a * rng.uniform(1.01, 500.0, 500)
    d = rng.uniform(0.0, 4.0, 500) * b
    d[::50] = np.inf
    for arr, one in ((sdcm.hit_prob_gauss_array, naive.hit_prob_gauss),
                     (sdcm.hit_prob_exact_array, naive.hit_prob_exact)):
        got = _quiet(arr, d, a, b)
        want = [one(*x) for x in zip(d, a, b)]
        assert_allclose(got, want, rtol=0, atol=BINOMIAL_ATOL)
    # scalars broadcast
    assert_allclose(_quiet(sdcm.hit_prob_gauss_array, d[:5], 16.0, 1000.0),
                    [naive.hit_prob_gauss(x, 16.0, 1000.0) for x in d[:5]],
                    rtol=FASTMATH_RTOL, atol=FASTMATH_ATOL)


@pytest.mark.parametrize("fn", [sdcm.hit_prob_gauss, sdcm.hit_prob_exact])
def test_sdcm_edge_conventions(fn):
    assert fn(math.inf, 16.0, 1000.0) == 0.0  # first touch
    assert fn(0.0, 16.0, 1000.0) == 1.0  # touched again at once
    assert fn(5.0, 16.0, 0.0) == 0.0  # no cache
    assert fn(2.0, 16.0, 16.0) == 1.0  # one set, room for everything
    assert fn(40.0, 16.0, 16.0) == 0.0


@pytest.mark.parametrize("fn", [sdcm.hit_prob_gauss, sdcm.hit_prob_exact])
def test_single_set_cache_holds_only_its_blocks(fn):
    assert fn(4.0, 16.0, 2.0) == naive.hit_prob_gauss(4.0, 16.0, 2.0) == 0.0


def test_single_set_forms_agree_for_fractional_distance():
    assert sdcm.hit_prob_gauss(7.5, 8.0, 7.9) == sdcm.hit_prob_exact(7.5, 8.0, 7.9)


@settings(max_examples=300, deadline=None)
@given(assoc_ways, st.integers(1, 4), st.sampled_from([64, 96, 128, 512, 1536, 2048, 16384]),
       st.integers(0, 40), st.integers(1, 40))
def test_single_set_matches_twin(a, n, unit_b, dk, ck):
    """A cache of at most ``A`` blocks (one set of ``floor(B)`` ways) as the
    cache models reach it: distance and capacity in bytes over a mean block of
    ``unit_b / n`` bytes (fractional units, exact integer ratios and ties of
    ``d + 1 = B``), kernel and twin to the bit."""
    unit = unit_b / n
    d, blocks = dk * 64.0 / unit, ck * 64.0 / unit
    if blocks > a:
        return
    for fn, twin in ((sdcm.hit_prob_gauss, naive.hit_prob_gauss),
                     (sdcm.hit_prob_exact, naive.hit_prob_exact)):
        assert fn(d, float(a), blocks) == twin(d, float(a), blocks), (fn.__name__, d, blocks)


def test_single_set_tie_by_hand():
    """``d + 1 = B`` in exact arithmetic, ``2560 / 1536 + 1 > 4096 / 1536`` in
    floats (the column case of session 11): one whole block since, two ways, a hit."""
    d, blocks = 2560.0 / 1536.0, 4096.0 / 1536.0
    for fn in (sdcm.hit_prob_gauss, sdcm.hit_prob_exact, naive.hit_prob_gauss,
               naive.hit_prob_exact):
        assert fn(d, 8.0, blocks) == 1.0
    assert naive.hit_prob_gauss(1.9, 8.0, 2.5) == sdcm.hit_prob_gauss(1.9, 8.0, 2.5) == 1.0
    assert naive.hit_prob_gauss(2.0, 8.0, 2.5) == sdcm.hit_prob_gauss(2.0, 8.0, 2.5) == 0.0


distances = st.one_of(st.just(0.0), st.floats(MIN_DISTANCE, 4e5))


@settings(max_examples=400, deadline=None)
@given(assoc_ways, st.floats(0.5, 1e5), distances, distances)
def test_hit_prob_in_unit_interval_and_non_increasing(a, b, d1, d2):
    d1, d2 = min(d1, d2), max(d1, d2)
    # the exact binomial is a sum of exp terms: its rounding is not monotone in d
    # (a = 16, blocks 10322, d 1140 -> 1141 rose by 3e-16), within EXACT_ROUNDING;
    # the model's Gaussian form is held to strict monotonicity
    for fn, slack in ((sdcm.hit_prob_gauss, 0.0), (sdcm.hit_prob_exact, EXACT_ROUNDING)):
        h1, h2 = fn(d1, float(a), b), fn(d2, float(a), b)
        assert 0.0 <= h2 <= h1 + slack and h1 <= 1.0, (fn.__name__, h1, h2)
        assert fn(math.inf, float(a), b) == 0.0 <= h2


def test_exact_hit_prob_rounding_case():
    """The case hypothesis found: the exact sum may rise by rounding alone, within
    EXACT_ROUNDING; the Gaussian form does not rise."""
    lo, hi = (sdcm.hit_prob_exact(d, 16.0, 10322.0) for d in (1140.0, 1141.0))
    assert hi - lo <= EXACT_ROUNDING
    assert sdcm.hit_prob_gauss(1141.0, 16.0, 10322.0) <= sdcm.hit_prob_gauss(1140.0, 16.0, 10322.0)


def test_gauss_tiny_distance():
    assert sdcm.hit_prob_gauss(5e-324, 1.0, 2.0) == 1.0


@settings(max_examples=400, deadline=None)
@given(st.sampled_from([4, 8, 16, 32]), st.floats(16.0, 1e5), st.data())
def test_gauss_tracks_exact_binomial(a, b, data):
    d = float(data.draw(st.integers(0, int(4 * b))))
    err = abs(sdcm.hit_prob_gauss(d, float(a), b) - sdcm.hit_prob_exact(d, float(a), b))
    tol = GAUSS_VS_EXACT_ATOL if b >= 2 * a else GAUSS_VS_EXACT_ATOL_NEAR_ONE_SET
    assert err <= tol


def test_gauss_tracks_exact_binomial_on_a_grid():
    """The measured worst cases behind the two tolerances (a coarse grid)."""
    worst_far = worst_near = 0.0
    for a in (4, 8, 16, 32):
        for b in np.concatenate([np.geomspace(16, 1e5, 25), a + np.linspace(0.05, 1.0, 20)]):
            if b < 16:
                continue
            top = int(4 * b)
            d = np.unique(np.concatenate([np.arange(0, min(top, 4000) + 1),
                                          np.linspace(0, top, 4000).round()])).astype(np.float64)
            err = np.abs(_quiet(sdcm.hit_prob_gauss_array, d, a, b)
                         - _quiet(sdcm.hit_prob_exact_array, d, a, b)).max()
            if b >= 2 * a:
                worst_far = max(worst_far, err)
            elif b > a:
                worst_near = max(worst_near, err)
    assert 0.03 < worst_far <= GAUSS_VS_EXACT_ATOL
    assert 0.09 < worst_near <= GAUSS_VS_EXACT_ATOL_NEAR_ONE_SET


def test_sdcm_array_kernels_compile_cleanly(tmp_path):
    code = ("import warnings; from numba.core.errors import NumbaPerformanceWarning;"
            "warnings.simplefilter('error', NumbaPerformanceWarning);"
            "from tsbatch.kernels import sdcm;"
            "sdcm.hit_prob_gauss_array([1.0], 16.0, 100.0);"
            "sdcm.hit_prob_exact_array([1.0], 16.0, 100.0);"
            "sdcm.norm_cdf_zs_array([0.5])")
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path), OMP_WAIT_POLICY="passive")
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]


# ======================================================================
# launch orders
# ======================================================================
orders = st.sampled_from([naive.ROW, naive.COL, naive.GROUPED, naive.ZORDER, naive.PERSISTENT])


@settings(max_examples=300, deadline=None)
@given(orders, st.integers(1, 9), st.integers(1, 9), st.integers(1, 3), st.integers(0, 10))
def test_launch_order_matches_twin(o, g0, g1, g2, group):
    x0, x1, x2 = order.launch_order_array(o, g0, g1, g2, group)
    want = naive.launch_sequence(o, g0, g1, g2, group)
    assert list(zip(x0.tolist(), x1.tolist(), x2.tolist())) == want
    assert sorted(want) == [(a, b, c) for a in range(g0) for b in range(g1) for c in range(g2)]
    if o != naive.ZORDER:
        for pid in range(len(want)):
            assert tuple(order.tile_coords(o, g0, g1, g2, group, pid)) == want[pid]


def test_launch_orders_by_hand():
    seq = lambda o, g0, g1, gr=1: naive.launch_sequence(o, g0, g1, 1, gr)  # noqa: E731
    assert seq(naive.ROW, 2, 3)[:4] == [(0, 0, 0), (0, 1, 0), (0, 2, 0), (1, 0, 0)]
    assert seq(naive.COL, 2, 3)[:3] == [(0, 0, 0), (1, 0, 0), (0, 1, 0)]
    assert seq(naive.GROUPED, 3, 2, 2) == [(0, 0, 0), (1, 0, 0), (0, 1, 0), (1, 1, 0),
                                           (2, 0, 0), (2, 1, 0)]
    assert seq(naive.ZORDER, 4, 4)[:8] == [(0, 0, 0), (0, 1, 0), (1, 0, 0), (1, 1, 0),
                                           (0, 2, 0), (0, 3, 0), (1, 2, 0), (1, 3, 0)]
    assert seq(naive.PERSISTENT, 5, 3, 2) == seq(naive.GROUPED, 5, 3, 2)


# ======================================================================
# LRU stack distances
# ======================================================================
@st.composite
def id_sequences(draw):
    n = draw(st.integers(0, 60))
    n_ids = draw(st.integers(1, 12))
    ids = draw(st.lists(st.integers(0, n_ids - 1), min_size=n, max_size=n))
    w_of = draw(st.lists(st.sampled_from([1.0, 2.0, 0.5, 4096.0]), min_size=n_ids, max_size=n_ids))
    return ids, [w_of[k] for k in ids], n_ids


def _step_distances(ids, wts, n_ids, tree_len=None):
    n = len(ids)
    last = np.full(n_ids, -1, dtype=np.int64)
    tree = np.zeros(tree_len or n + 1, dtype=np.float64)
    out = np.empty(n, dtype=np.float64)
    reuse.step_distances(np.array(ids, dtype=np.int64), np.array(wts, dtype=np.float64), n,
                         last, tree, out)
    return out, last, tree


@settings(max_examples=150, deadline=None)
@given(id_sequences())
def test_step_distances_match_twin(seq):
    ids, wts, n_ids = seq
    out, last, tree = _step_distances(ids, wts, n_ids)
    assert_array_equal(out, naive.stack_distances(ids, wts))  # sums of few exact floats
    assert (last == -1).all() and (tree == 0.0).all()  # scratch restored


def test_step_distances_by_hand():
    out, _, _ = _step_distances([0, 1, 2, 1, 0, 0], [1.0, 2.0, 4.0, 2.0, 1.0, 1.0], 3)
    assert_array_equal(out, [math.inf, math.inf, math.inf, 4.0, 6.0, 0.0])


def test_step_distances_restore_a_longer_scratch_tree():
    _, _, tree = _step_distances([0, 1], [1.0, 1.0], 2, tree_len=8)
    assert (tree == 0.0).all(), tree


# ======================================================================
# cache hit rates (the idealised sequence, without sampling)
# ======================================================================
def _kernel_unsampled(problems):
    h15, h2, dram = reuse.cache_hit_rates(*cache_args(problems),
                                          k_samples=max(p["ksteps"] for p in problems),
                                          max_waves=1 << 30)
    return h15, h2, dram


def _twin(p):
    return np.array(naive.cache_hit_rates_one(*naive_args(p)))


def _no_stale_tree(p):
    """The step_distances scratch bug (fixed; test above) needs two waves and two
    L1.5 groups in a wave; elsewhere the kernel is unaffected."""
    return waves(p) == 1 or l15_groups_per_wave(p) == 1


@settings(max_examples=150, deadline=None)
@given(st.lists(cache_problems(exact_layout=True), min_size=1, max_size=3))
def test_cache_hit_rates_exact_where_the_union_is(problems):
    problems = [p for p in problems if _no_stale_tree(p)]
    assume(problems)
    assert all(union_exact(p) for p in problems)
    h15, h2, dram = _kernel_unsampled(problems)  # batched: rows independent
    for i, p in enumerate(problems):
        want = _twin(p)
        assert_allclose(np.array([h15[i], h2[i], dram[i]]), want, rtol=0, atol=CACHE_EXACT_ATOL)
        assert_array_equal([h15[i, 2], h2[i, 2], dram[i, 2]], [0.0, 0.0, 1.0])  # the store


@settings(max_examples=150, deadline=None)
@given(cache_problems())
@example(dict(g0=2, g1=5, g2=1, order=naive.ROW, group=1, conc=2, ksteps=2,
              tbytes=(1024.0, 128.0, 1024.0), cap2=9792.0, assoc2=16.0, nsm=1, g15=0, cap15=0.0,
              assoc15=0.0))
@example(dict(g0=6, g1=6, g2=1, order=naive.GROUPED, group=2, conc=1, ksteps=1,
              tbytes=(512.0, 512.0, 256.0), cap2=2150.4, assoc2=4.0, nsm=8, g15=1,
              cap15=2150.4, assoc15=4.0))
def test_cache_union_is_an_upper_bound_on_distance(p):
    """Away from the exact layouts the kernel's distances are upper bounds:
    its hit rates never exceed the twin's; the L1.5 (within-step) part stays exact."""
    assume(_no_stale_tree(p))
    h15, h2, dram = (a[0] for a in _kernel_unsampled([p]))
    w15, w2, wdram = _twin(p)
    assert_allclose(h15, w15, rtol=0, atol=CACHE_EXACT_ATOL)
    assert (h2 <= w2 + CACHE_EXACT_ATOL).all() and (dram >= wdram - CACHE_EXACT_ATOL).all()


@settings(max_examples=80, deadline=None)
@given(cache_problems(l15=True))
def test_cache_l15_within_step_is_exact(p):
    """L1.5 hits come from within-step reuse in each SM group: exact for every
    layout (where the stale-tree bug cannot reach)."""
    assume(_no_stale_tree(p))
    h15 = _kernel_unsampled([p])[0][0]
    assert_allclose(h15, _twin(p)[0], rtol=0, atol=CACHE_EXACT_ATOL)


def _seeded_problem(rng: random.Random) -> dict:
    g0, g1, g2 = rng.randint(1, 7), rng.randint(1, 7), rng.choice([1, 1, 2])
    a, b = rng.choice([128, 256, 512, 1024]), rng.choice([128, 256, 512, 1024])
    assoc2 = float(rng.choice([1, 2, 4, 8]))
    return dict(g0=g0, g1=g1, g2=g2, order=rng.randint(0, 4), group=rng.choice([1, 2, 3, 4, 8]),
                conc=rng.randint(1, g0 * g1 * g2), ksteps=rng.randint(1, 4),
                tbytes=(float(a), float(b), float(rng.choice([256, 4096]))),
                cap2=rng.uniform(assoc2 * 1.05, 120.0) * (a + b) / 2, assoc2=assoc2,
                nsm=1, g15=0, cap15=0.0, assoc15=0.0)


def test_union_approximation_error():
    """Typical and worst L2 hit-rate gap of the union approximation, on 300
    fixed random problems (seed 2024) that miss the exact layouts."""
    rng = random.Random(2024)
    problems = []
    while len(problems) < 300:
        p = _seeded_problem(rng)
        if not union_exact(p):
            problems.append(p)
    h2 = _kernel_unsampled(problems)[1][:, :2]
    want = np.array([_twin(p)[1][:2] for p in problems])
    err = np.abs(h2 - want)
    print(f"\nunion approximation: mean |dL2| {err.mean():.5f}, max {err.max():.4f} "
          f"over {len(problems)} problems x 2 tensors")
    assert err.mean() <= UNION_APPROX_MEAN_ERROR
    assert err.max() <= UNION_APPROX_SEEDED_MAX_ERROR
    assert (h2 <= want + CACHE_EXACT_ATOL).all()


_STALE_TREE = (
    "reuse.py: with an L1.5 tier of several SM groups, step_distances leaves stale "
    "Fenwick sums in `tree` after the per-group calls of a wave (see "
    "test_step_distances_restore_a_longer_scratch_tree); the next wave's tree calls "
    "read them (its within-step L2 distances, or, when _wave skips the L2 tree because "
    "the step footprint surely hits, its L1.5 distances): ")


def test_cache_l2_with_several_l15_groups():
    p = dict(g0=2, g1=3, g2=1, order=naive.ROW, group=1, conc=3, ksteps=1,
             tbytes=(256.0, 1024.0, 0.0), cap2=6403.9, assoc2=2.0, nsm=8, g15=2,
             cap15=19200.0, assoc15=2.0)
    h15, h2, dram = _kernel_unsampled([p])
    assert_allclose(np.array([h15[0], h2[0], dram[0]]), _twin(p), rtol=0, atol=CACHE_EXACT_ATOL)


def test_cache_l15_with_several_l15_groups():
    p = dict(g0=2, g1=2, g2=2, order=naive.ROW, group=1, conc=4, ksteps=1,
             tbytes=(128.0, 128.0, 256.0), cap2=2176.0, assoc2=16.0, nsm=4, g15=3,
             cap15=384.0, assoc15=2.0)
    assert_allclose(_kernel_unsampled([p])[0][0], _twin(p)[0], rtol=0, atol=CACHE_EXACT_ATOL)


def test_cache_hit_rates_without_per_step_tensors():
    h15, h2, dram = reuse.cache_hit_rates([2], [2], [1], [0], [1], [2], [3], [[0, 0]], [[0, 0]],
                                          [[512.0, 512.0]], [1e6], [16.0], [1], [0], [0.0], [0.0])
    assert_array_equal(h15, 0.0)
    assert_array_equal(h2, 0.0)
    assert_array_equal(dram, 1.0)


# ======================================================================
# resident tiles
# ======================================================================
hw_names = st.sampled_from(list_hw())


@settings(max_examples=300, deadline=None)
@given(hw_names, st.lists(st.tuples(st.integers(0, 300_000), st.integers(0, 300),
                                    st.integers(-32, 1100)), min_size=1, max_size=8))
def test_resident_tiles_match_twin(name, blocks):
    hw = get_hw(name)
    smem, regs, threads = (list(c) for c in zip(*blocks))
    r, why = occupancy.resident_tiles(smem, regs, threads, hw)
    for i in range(len(blocks)):
        want = naive.resident_one(smem[i], regs[i], threads[i], 32, hw.sm_smem_bytes,
                                  hw.smem_per_block_bytes, hw.smem_reserved_per_block_bytes,
                                  hw.sm_registers, hw.register_alloc_unit, hw.sm_max_warps,
                                  hw.sm_max_threads, hw.sm_max_blocks, hw.max_threads_per_block)
        assert (r[i], why[i]) == want
        assert (r[i] > 0) == (why[i] == occupancy.REASON_OK)
    # in shares of one or two rows on three threads: the same
    with mock.patch.object(_threads, "MIN_SHARE", 1), \
            mock.patch.object(_threads, "num_threads", lambda: 3):
        r3, why3 = occupancy.resident_tiles(smem, regs, threads, hw)
    assert np.array_equal(r3, r) and np.array_equal(why3, why)


@settings(max_examples=300, deadline=None)
@given(hw_names, st.integers(0, 250_000), st.integers(0, 250_000), st.integers(0, 255),
       st.integers(0, 255), st.integers(1, 1024), st.integers(1, 1024))
def test_residency_never_rises_with_resources(name, s1, s2, r1, r2, t1, t2):
    """More shared memory, registers or threads per block never raise residency."""
    hw = get_hw(name)
    lo = (min(s1, s2), min(r1, r2), min(t1, t2))
    hi = (max(s1, s2), max(r1, r2), max(t1, t2))
    res, _ = occupancy.resident_tiles([lo[0], hi[0], lo[0], lo[0]], [lo[1], lo[1], hi[1], lo[1]],
                                      [lo[2], lo[2], lo[2], hi[2]], hw)
    assert (res[1:] <= res[0]).all(), res


# ======================================================================
# envelope and waves
# ======================================================================
@st.composite
def envelope_cases(draw):
    """One grid's inputs for wave_time; some resources absent (rate 0).

    The 24 work and rate values come from a drawn seed (drawing them one by
    one as hypothesis floats costs ~10x more time for no better coverage).
    """
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    vec = lambda lo, hi, p0: np.where(rng.random(N_RES) < p0, 0.0,  # noqa: E731
                                      10.0 ** rng.uniform(lo, hi, N_RES)).tolist()
    return dict(work_iter=vec(-3, 6, 0.3), work_epi=vec(-3, 6, 0.4), rate=vec(0, 7, 0.2),
                tiles=draw(st.integers(1, 5000)), sms=draw(st.integers(1, 160)),
                p=draw(st.integers(1, 8)), ksteps=draw(st.integers(1, 300)),
                stages=draw(st.integers(1, 6)), warps_tile=float(draw(st.sampled_from([1, 2, 4, 8]))),
                warps_full=4.0, lat=float(rng.uniform(0.0, 5.0)) * draw(st.integers(0, 1)),
                ovh_iter=float(rng.uniform(0.0, 0.1)), ovh_tile=float(rng.uniform(0.0, 1.0)),
                persistent=draw(st.integers(0, 1)), launch=float(rng.uniform(0.0, 5.0)),
                share_eff=float(rng.uniform(0.5, 1.0)) if draw(st.booleans()) else 1.0,
                sync=float(rng.uniform(0.0, 0.2)) * draw(st.integers(0, 1)),
                conv=float(rng.uniform(0.0, 2.0)) * draw(st.integers(0, 1)),
                expose=float(rng.uniform(0.0, 2.0)) * draw(st.integers(0, 1)))


def _envelopes(cases, terms=None):
    col = lambda k: np.array([c[k] for c in cases])  # noqa: E731
    return evaluate_envelopes(col("work_iter"), col("work_epi"), col("rate"), col("tiles"),
                              cases[0]["sms"], col("p"), col("ksteps"), col("stages"),
                              col("warps_tile"), 4.0, col("lat"), col("ovh_iter"),
                              col("ovh_tile"), col("persistent"), col("launch"),
                              share_eff=col("share_eff"), sync=col("sync"), terms=terms,
                              conv=np.array([c.get("conv", 0.0) for c in cases]),
                              expose=np.array([c.get("expose", 0.0) for c in cases]))


def _twin_wave(c, terms=envelope.MODEL_TERMS):
    return naive.wave_time(c["work_iter"], c["work_epi"], c["rate"], SHARED.tolist(),
                           COMPUTE.tolist(), c["tiles"], c["sms"], c["p"], c["ksteps"],
                           c["stages"], c["warps_tile"], c["warps_full"], c["lat"],
                           c["ovh_iter"], c["ovh_tile"], c["persistent"], c["share_eff"],
                           c["sync"], terms=terms, conv=c.get("conv", 0.0),
                           expose=c.get("expose", 0.0))


#: a case hypothesis found (CI, session 6): 4,960 waves whose prologue is mostly
#: hidden under the previous wave's stores; written as ``full * a - (full - 1) *
#: hidden`` the prologue lost 12 digits and kernel and twin differed by 1e-12
MOSTLY_HIDDEN_PROLOGUE = (
    [{'ksteps': 1,
      'lat': 0.0,
      'launch': 1.1968472149647607,
      'ovh_iter': 0.08326441476533979,
      'ovh_tile': 0.7870983074886834,
      'p': 1,
      'persistent': 0,
      'rate': [0.0, 179.09593866897305, 14457.733376204094, 231.9415625219471, 551.2302008251758,
               1705769.9685312978, 38.91375629652016, 23030.852440883926],
      'share_eff': 1.0,
      'sms': 1,
      'stages': 1,
      'sync': 0.0,
      'tiles': 1,
      'warps_full': 4.0,
      'warps_tile': 1.0,
      'work_epi': [345.5142815843289, 2.838559410505246, 0.0, 672230.2459671665, 0.0, 0.0,
                   1570.4372036152845, 3.1644104920775655],
      'work_iter': [78.0953046065382, 0.0, 0.0, 0.0, 52076.104436413814, 0.0020057194119245418,
                    3688.918138916971, 0.03809786034000278]},
     {'ksteps': 1,
      'lat': 0.0,
      'launch': 3.8701398505490885,
      'ovh_iter': 0.011211343723535161,
      'ovh_tile': 0.5008832323551811,
      'p': 1,
      'persistent': 0,
      'rate': [87.49340788952473, 1149.7864473794812, 379.6411461738593, 0.0, 3562485.8681711247,
               8.824152809736406, 1581566.3823894865, 87076.71622442354],
      'share_eff': 1.0,
      'sms': 1,
      'stages': 2,
      'sync': 0.0,
      'tiles': 4960,
      'warps_full': 4.0,
      'warps_tile': 1.0,
      'work_epi': [42314.97472506604, 0.0, 0.0, 0.0031654157724330945, 6.961625366991482,
                   0.01259236161782243, 0.0016928625978200817, 0.12681002215918855],
      'work_iter': [0.0, 27658.87231810126, 3.2793517074405107, 0.0, 1475.7576076064477,
                    1002.2752838502537, 61019.33193904964, 0.013895561625941423]}]
)


def test_evaluate_envelopes_mostly_hidden_prologue():
    cases = copy.deepcopy(MOSTLY_HIDDEN_PROLOGUE)
    for c in cases:  # recorded with 8 resources: the ones added since do no work
        for k in ("work_iter", "work_epi", "rate"):
            c[k] = c[k] + [0.0] * (N_RES - len(c[k]))
    test_evaluate_envelopes_match_twin.hypothesis.inner_test(cases)


@settings(max_examples=150, deadline=None)
@given(st.lists(envelope_cases(), min_size=1, max_size=4))
def test_evaluate_envelopes_match_twin(cases):
    sms = cases[0]["sms"]
    for c in cases:
        c["sms"] = sms
    out = _envelopes(cases)
    for i, c in enumerate(cases):
        t, pro, st_, epi, it, wv, tail = _twin_wave(c)
        got = [out[k][i] for k in ("latency_us", "t_prologue_us", "t_steady_us", "t_epilogue_us",
                                   "t_steady_iter_us")]
        # the parts are terms of the total: their rounding scale is the total's
        assert_allclose(got, [t + c["launch"], pro, st_, epi, it], rtol=FASTMATH_RTOL,
                        atol=FASTMATH_RTOL * abs(t))
        assert (out["waves"][i], out["tail_tiles"][i]) == (wv, tail)
        assert_allclose(out["util"][i],
                        naive.utilization(c["work_iter"], c["work_epi"], c["rate"], SHARED.tolist(),
                                          c["tiles"], sms, c["ksteps"], t + c["launch"]),
                        rtol=FASTMATH_RTOL, atol=1e-15)
    # latency only (the screen's bound): the same times, to the bit, and no util
    col = lambda k: np.array([c[k] for c in cases])  # noqa: E731
    lean = evaluate_envelopes(col("work_iter"), col("work_epi"), col("rate"), col("tiles"), sms,
                              col("p"), col("ksteps"), col("stages"), col("warps_tile"), 4.0,
                              col("lat"), col("ovh_iter"), col("ovh_tile"), col("persistent"),
                              col("launch"), share_eff=col("share_eff"), sync=col("sync"),
                              conv=np.array([c.get("conv", 0.0) for c in cases]),
                              expose=np.array([c.get("expose", 0.0) for c in cases]),
                              latency_only=True)
    assert "util" not in lean
    for k in ("latency_us", "t_prologue_us", "t_steady_us", "t_epilogue_us", "t_steady_iter_us",
              "waves", "tail_tiles"):
        assert np.array_equal(lean[k], out[k], equal_nan=True), k
    # in shares of at most two rows on three threads: the same arrays, to the bit
    with mock.patch.object(_threads, "MIN_SHARE", 1), \
            mock.patch.object(_threads, "num_threads", lambda: 3):
        split = _envelopes(cases)
    for k in out:
        assert np.array_equal(split[k], out[k], equal_nan=True), k


@settings(max_examples=100, deadline=None)
@given(st.lists(envelope_cases(), min_size=1, max_size=4), st.floats(0.25, 1.0))
def test_l15_chip_floor_matches_twin(cases, shrink):
    """With the grid's average tile (here the busiest tile's work a step times
    ``shrink``, its once-per-tile work as it is), each row's latency is the
    larger of the envelope's and the L1.5 chip floor plus the launch, the raise
    in the loop's phase; the other phases and the waves are the envelope's."""
    sms = cases[0]["sms"]
    for c in cases:
        c["sms"] = sms
    col = lambda k: np.array([c[k] for c in cases])  # noqa: E731
    avg_iter = col("work_iter") * shrink
    base = _envelopes(cases)
    out = evaluate_envelopes(col("work_iter"), col("work_epi"), col("rate"), col("tiles"), sms,
                             col("p"), col("ksteps"), col("stages"), col("warps_tile"), 4.0,
                             col("lat"), col("ovh_iter"), col("ovh_tile"), col("persistent"),
                             col("launch"), share_eff=col("share_eff"), sync=col("sync"),
                             conv=np.array([c.get("conv", 0.0) for c in cases]),
                             expose=np.array([c.get("expose", 0.0) for c in cases]),
                             l15_avg=(avg_iter, col("work_epi")))
    for i, c in enumerate(cases):
        t, pro, st_, epi, it, wv, tail = _twin_wave(c)
        fl = c["launch"] + naive.l15_chip_floor(avg_iter[i].tolist(), c["work_epi"],
                                                c["rate"][envelope.R_L15], c["tiles"], sms,
                                                c["ksteps"], c["lat"])
        want = max(t + c["launch"], fl)
        assert_allclose(out["latency_us"][i], want, rtol=FASTMATH_RTOL, atol=FASTMATH_RTOL * want)
        assert_allclose(out["t_steady_us"][i], st_ + (want - t - c["launch"]),
                        rtol=FASTMATH_RTOL, atol=FASTMATH_RTOL * want)
        assert out["latency_us"][i] >= base["latency_us"][i]
        for k in ("t_prologue_us", "t_epilogue_us", "t_steady_iter_us", "waves", "tail_tiles"):
            assert out[k][i] == base[k][i], k


def test_l15_chip_floor_by_hand():
    """1000 requested and 400 DRAM bytes an iteration (per tile: 2 tiles x 5
    steps, plus 20 and 10 once per tile) at 100 B/us a SM on 2 SMs take
    (2 x (5 x 1000 + 20) + 2 x (5 x 400 + 10)) / 200 = 70.3 us after a 0.5 us
    latency; no tier: 0; the floor grows with either total."""
    w = [0.0] * N_RES
    e = [0.0] * N_RES
    w[envelope.R_L15], w[R_DRAM] = 1000.0, 400.0
    e[envelope.R_L15], e[R_DRAM] = 20.0, 10.0
    w, e = np.array(w), np.array(e)
    assert envelope.l15_chip_floor(w, e, 100.0, 2.0, 2.0, 5.0, 0.5) == pytest.approx(70.8)
    assert naive.l15_chip_floor(w.tolist(), e.tolist(), 100.0, 2, 2, 5, 0.5) == pytest.approx(70.8)
    assert envelope.l15_chip_floor(w, e, 0.0, 2.0, 2.0, 5.0, 0.5) == 0.0
    more = w.copy()
    more[R_DRAM] += 1.0
    assert envelope.l15_chip_floor(more, e, 100.0, 2.0, 2.0, 5.0, 0.5) > 70.8


@settings(max_examples=150, deadline=None)
@given(envelope_cases(), st.integers(1, 160))
def test_envelope_one_matches_twin(c, active):
    args = (np.array(c["work_iter"]), np.array(c["work_epi"]), np.array(c["rate"]), SHARED, COMPUTE,
            c["p"], active, c["ksteps"], c["stages"], c["warps_tile"], c["warps_full"], c["lat"],
            c["ovh_iter"], c["ovh_tile"], c["tiles"] if c["persistent"] else 0, c["share_eff"],
            c["sync"])
    got = envelope.envelope_one(*args, 0.0, 1.0, 1, c.get("expose", 0.0))
    want = naive.envelope_one(c["work_iter"], c["work_epi"], c["rate"], SHARED.tolist(),
                              COMPUTE.tolist(), *args[5:], expose=c.get("expose", 0.0))
    # the parts are terms of the total (the epilogue is the total less the others
    # where the resource floor binds): their rounding scale is the total's
    assert_allclose(got, want, rtol=FASTMATH_RTOL, atol=FASTMATH_RTOL * abs(want[0]))


@settings(max_examples=200, deadline=None)
@given(st.floats(0.0, 10.0), st.floats(1e-3, 10.0), st.integers(1, 64))
@example(z=5.960464477539063e-08, dem=4.0, n=1)
def test_ring_queue_lies_above_its_bounds_and_tends_to_them(z, dem, n):
    """The ring's slots queueing at the memory (exact mean-value analysis): one
    slot takes the whole cycle ``z + dem``; ``n`` slots never beat either bound,
    ``dem`` (the queue busy) or ``(z + dem) / n`` (every slot in flight), and
    never take longer than one slot alone; more slots never slow it; far past
    the knee it is the queue's demand. The numba kernel agrees with the twin."""
    t = naive.ring_queue(z, dem, n)
    assert_allclose(envelope._ring_queue(z, dem, n), t, rtol=FASTMATH_RTOL, atol=0)
    assert t >= max(dem, (z + dem) / n) * (1 - 1e-12)
    assert t <= (z + dem) * (1 + 1e-12)
    assert naive.ring_queue(z, dem, n + 1) <= t * (1 + 1e-12)
    if n == 1:
        assert_allclose(t, z + dem, rtol=1e-12)
    # two slots by hand: q1 = dem / (z + dem), X2 = 2 / (z + dem (1 + q1))
    two = (z + dem * (1 + dem / (z + dem))) / 2
    # (to 2e-9: the recursion stops once the queue is saturated, X x dem > 1 - 1e-9,
    # and answers dem, up to 1e-9 below the exact value before rounding; z = 6e-8,
    # dem = 4 gives 4 against 4 (1 + 1.0000001e-9) by hand)
    assert_allclose(naive.ring_queue(z, dem, 2), two, rtol=2e-9)
    far = int(20 * (z + dem) / dem) + 1  # twenty times the knee's slots
    assert_allclose(envelope._ring_queue(z, dem, far), dem, rtol=0.06)


@settings(max_examples=300, deadline=None)
@given(st.floats(0.0, 10.0), st.floats(1e-3, 10.0), st.integers(1, 64),
       st.floats(1.0 + 1e-12, 3.0), st.booleans())
def test_ring_queue_never_falls_when_delay_or_demand_rises(z, dem, n, factor, which):
    """The ring queue is non-decreasing in its delay and its demand, to rounding
    (1e-12): also across its stop at saturation, which answers dem / (1 - 1e-9)
    (1 / X(c) at the stop fell by up to ~1e-9 when z grew and moved the stop)."""
    z2, dem2 = (z * factor + 1e-9, dem) if which else (z, dem * factor)
    for f in (envelope._ring_queue, naive.ring_queue):
        assert f(z2, dem2, n) >= f(z, dem, n) * (1 - 1e-12)


@settings(max_examples=150, deadline=None)
@given(envelope_cases(), st.integers(2, 8))
def test_loop_barrier_stall_is_hidden_by_other_resident_tiles(c, p):
    """One resident tile pays the barrier stall on top of its compute; ``p``
    tiles pay it only where it exceeds the others' compute: per tile
    iteration ``max(comp, (comp + sync) / p)``, never more than alone."""
    c = dict(c, persistent=0, lat=0.0, sync=0.05, ovh_iter=0.0, ovh_tile=0.0, share_eff=1.0,
             stages=1)
    args = lambda q, s: (c["work_iter"], c["work_epi"], c["rate"], SHARED.tolist(),  # noqa: E731
                         COMPUTE.tolist(), q, c["sms"], c["ksteps"], 1, c["warps_tile"],
                         c["warps_full"], 0.0, 0.0, 0.0, 0, 1.0, s)
    for q in (1, p):
        with_sync = naive.envelope_one(*args(q, c["sync"]))[4]
        without = naive.envelope_one(*args(q, 0.0))[4]
        assert with_sync >= without
        if q == 1:
            assert with_sync <= (without + c["sync"]) * (1 + 1e-12)
        else:
            assert with_sync <= (without + c["sync"] / q) * (1 + 1e-12)
        # the numba kernel agrees
        got = envelope.envelope_one(np.array(c["work_iter"]), np.array(c["work_epi"]),
                                    np.array(c["rate"]), SHARED, COMPUTE, *args(q, c["sync"])[5:])[4]
        assert_allclose(got, with_sync, rtol=FASTMATH_RTOL, atol=0)


@settings(max_examples=150, deadline=None)
@given(envelope_cases())
def test_share_eff_slows_only_shared_tensor_cores(c):
    """The warpgroup-sharing factor never speeds a grid up, and changes it only
    when more than one issue group shares an SM and the tensor core is used."""
    base = dict(c, share_eff=1.0)
    t1 = _twin_wave(base)[0]
    t2 = _twin_wave(c)[0]
    assert t2 >= t1 * (1 - 1e-12)
    groups = c["p"] * c["warps_tile"] > c["warps_full"]
    if c["persistent"] == 0:
        tail = c["tiles"] % (c["sms"] * c["p"])
        groups = groups or (tail and math.ceil(tail / c["sms"]) * c["warps_tile"] > c["warps_full"])
    tc_used = c["rate"][0] > 0.0 and (c["work_iter"][0] > 0.0 or c["work_epi"][0] > 0.0)
    if not (groups and tc_used):
        assert t2 == t1
    got = _envelopes([c])["latency_us"][0]
    assert_allclose(got, t2 + c["launch"], rtol=FASTMATH_RTOL, atol=0)


#: a case hypothesis found (CI, session 18): the queue of out-of-step slots once
#: took a later wave longer than the same wave alone (the SFU-bound tile's
#: once-per-tile work); the queued wave is capped at the isolated one
QUEUE_ABOVE_ISOLATED = {
    'work_iter': [0.001770239467781795, 6048.086280478664, 0.0, 0.9280800741686158,
                  12469.76677539174, 0.535492587612397, 12.063713241572561,
                  0.016083304160952987, 4.246360662939635],
    'work_epi': [0.0, 0.0, 536202.3573129737, 0.0, 0.01103546181209458, 408.7029757816832,
                 9775.703686006085, 328.874127925047, 180168.69925130683],
    'rate': [0.0, 3768.965753422924, 186728.86348841578, 0.0, 546244.4454598336,
             60674.798402372515, 323354.26297177054, 21.943899881387644, 413570.0952744494],
    'tiles': 1, 'sms': 1, 'p': 3, 'ksteps': 5, 'stages': 1, 'warps_tile': 1.0,
    'warps_full': 4.0, 'lat': 0.0, 'ovh_iter': 0.008155261736351272,
    'ovh_tile': 0.8552269742870702, 'persistent': 0, 'launch': 4.306417480888342,
    'share_eff': 1.0, 'sync': 0.1753074192833161}


@settings(max_examples=150, deadline=None)
@given(envelope_cases(), st.integers(2, 12))
@example(QUEUE_ABOVE_ISOLATED, 2)
def test_wave_seams_hide_at_most_the_prologue_and_never_the_stores(c, full):
    """Inter-wave overlap: W full waves cost no more than W isolated waves (and
    the p layout conversions and C stores' issue of each turnover, ``conv``,
    which an isolated wave does not pay), no less than W waves without their prologues and their
    drains' compute (what the previous wave's stores may run under), and never
    less than the stores."""
    c = dict(c, persistent=0, tiles=full * c["sms"] * c["p"])
    t, pro, *_ = _twin_wave(c)
    one = naive.envelope_one(c["work_iter"], c["work_epi"], c["rate"], SHARED.tolist(),
                             COMPUTE.tolist(), c["p"], c["sms"], c["ksteps"], c["stages"],
                             c["warps_tile"], c["warps_full"], c["lat"], c["ovh_iter"],
                             c["ovh_tile"], 0, c["share_eff"], c["sync"],
                             expose=c.get("expose", 0.0))
    isolated, one_pro, one_store = full * one[0], one[1], one[5]
    conv = c.get("conv", 0.0)
    # ... and, with them, the p C stores' issue out of the SM (at its L2 share)
    issue = c["work_epi"][5] * c["sms"] / c["rate"][5] if conv > 0.0 and c["rate"][5] > 0 else 0.0
    turns = (full - 1) * c["p"] * (conv + issue)
    assert t <= (isolated + turns) * (1 + 1e-12)
    drain_compute = max(one[3] - one_store - c["p"] * c["ovh_tile"], 0.0)
    # at most the prologue, the drain's compute and the stores of each later wave hide
    assert t >= isolated - (full - 1) * (one_pro + drain_compute + one_store) - 1e-9 * isolated
    assert t >= full * one_store * (1 - 1e-12)
    assert pro >= one_pro * (1 - 1e-12)  # the first wave's prologue is always exposed
    got = _envelopes([dict(c, launch=0.0)])["latency_us"][0]
    assert_allclose(got, t, rtol=FASTMATH_RTOL, atol=0)


def test_infeasible_rows_get_nan():
    c = dict(work_iter=[1.0] * N_RES, work_epi=[1.0] * N_RES, rate=[1.0] * N_RES, tiles=10, sms=4,
             p=0, ksteps=3, stages=2, warps_tile=4.0, warps_full=4.0, lat=0.5, ovh_iter=0.0,
             ovh_tile=0.0, persistent=0, launch=1.0, share_eff=1.0, sync=0.0)
    out = _envelopes([c])
    assert np.isnan(out["latency_us"][0]) and out["waves"][0] == 0
    assert np.isnan(out["util"][0]).all()


@settings(max_examples=200, deadline=None)
@given(envelope_cases(), st.integers(0, N_RES - 1), st.floats(0.01, 0.999))
def test_latency_never_falls_when_a_rate_is_lowered(c, r, factor):
    assume(c["rate"][r] > 0.0)
    slow = dict(c, rate=list(c["rate"]))
    slow["rate"][r] *= factor
    before, after = _envelopes([c, slow])["latency_us"]
    assert after >= before * (1 - 2e-9)  # the ring queue's precision (see below)


@settings(max_examples=200, deadline=None)
@given(envelope_cases(), st.integers(0, N_RES - 1), st.floats(1.001, 100.0), st.integers(0, 2))
def test_latency_never_falls_when_work_rises(c, r, factor, what):
    """More work per iteration, per tile epilogue, or more reduction steps.

    (Not more *tiles*: a tail that grows from ``sms`` to ``sms + 1`` tiles is
    modelled as two interleaved tiles per SM, which deepens the pipeline; with
    one stage, latency-bound tiles get faster, e.g. 2.0 -> 1.5 us.)
    """
    more = dict(c, work_iter=list(c["work_iter"]), work_epi=list(c["work_epi"]))
    if what == 0:
        more["work_iter"][r] = max(more["work_iter"][r], 1e-3) * factor
    elif what == 1:
        more["work_epi"][r] = max(more["work_epi"][r], 1e-3) * factor
    else:
        more["ksteps"] = c["ksteps"] + 1 + int(factor)
    # without the queued-wave term, which is not monotone in the busiest resource's
    # loop work (test_bound_envelope_never_falls_when_work_rises); to rounding (the
    # ring queue's stop at saturation answers dem / (1 - 1e-9) since session 3 of
    # issue 35, so two nearly saturated rows no longer swap order by ~1e-9)
    mono = envelope.TERM_RING | envelope.TERM_WAVE_FLOOR
    before, after = _envelopes([c, more], terms=mono)["latency_us"]
    assert after >= before * (1 - 1e-12)


@st.composite
def queueing_cases(draw):
    """Cases where the between-wave terms are all in play: several full waves of
    several resident slots, a memory resource (DRAM) busiest and fed partly once
    per tile (its epilogue stores), a tail or not, and the other resources near
    it (so that the busiest one changes when a column is scaled)."""
    c = draw(envelope_cases())
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    p = draw(st.integers(2, 8))
    sms = draw(st.integers(1, 160))
    wi, we, rate = list(c["work_iter"]), list(c["work_epi"]), list(c["rate"])
    rate[R_DRAM] = float(10.0 ** rng.uniform(3, 6))
    ks = draw(st.integers(1, 64))
    dram_t = float(10.0 ** rng.uniform(-2, 1))  # the DRAM's time per iteration
    wi[R_DRAM] = dram_t * rate[R_DRAM] / sms
    we[R_DRAM] = float(rng.uniform(0.0, 4.0)) * ks * wi[R_DRAM]
    for r in range(N_RES):  # every other resource within a factor ~3 of it, or absent
        if r != R_DRAM and rate[r] > 0.0 and rng.random() < 0.7:
            rr = rate[r] / sms if SHARED[r] else rate[r]
            wi[r] = dram_t * rr * float(10.0 ** rng.uniform(-1.0, 0.1))
            we[r] = float(rng.uniform(0.0, 2.0)) * ks * wi[r]
    # a load latency of the order of an iteration's time or more: latency-bound
    # loops, whose wave lies above the busiest resource's time
    lat = dram_t * float(10.0 ** rng.uniform(1, 2.3)) if rng.random() < 0.7 else c["lat"]
    return dict(c, work_iter=wi, work_epi=we, rate=rate, p=p, sms=sms, ksteps=ks, persistent=0,
                stages=draw(st.integers(1, 4)), lat=lat,
                tiles=sms * p * draw(st.integers(2, 40)) + draw(st.integers(0, sms * p - 1)))


def _scaled(c, r, factor, epi):
    more = dict(c, work_iter=list(c["work_iter"]), work_epi=list(c["work_epi"]))
    key = "work_epi" if epi else "work_iter"
    more[key][r] = more[key][r] * factor if more[key][r] > 0.0 else 1e-3 * (factor - 1.0)
    return more


@settings(max_examples=400, deadline=None)
@given(st.one_of(envelope_cases(), queueing_cases(), queueing_cases()),
       st.one_of(st.floats(1.0 + 1e-9, 1.001), st.floats(1.001, 100.0)))
def test_bound_envelope_never_falls_when_work_rises(c, factor):
    """The screen's lower bound rests on these. Without the queued-wave term
    (the ring's queue in the loop and the busiest resource's floor between
    waves kept), the latency is non-decreasing in every work entry, to
    rounding (1e-12 relative): the prologue, the loop, the epilogue, the seams
    between waves (the stores hidden under the next wave's prologue and loop,
    the out-of-step ``cut`` down to the busiest resource) and the tail are
    maxima and minima of non-decreasing terms, and the ring queue's mean-value
    analysis is non-decreasing in its delay and demand; so is it without any
    of these terms. Each work entry, per iteration and per tile, is scaled up
    in turn. At each point the bound's envelope (``BOUND_TERMS``: a floor of
    the ring's queue, no floor between waves) lies at or below it, and it at
    or below the model (with the queued wave, which is not monotone: its
    burst share falls when the busiest resource's loop work grows). The twin
    agrees with the kernel."""
    E = envelope
    mono = E.TERM_RING | E.TERM_WAVE_FLOOR
    more = [_scaled(c, r, factor, epi) for epi in (False, True) for r in range(N_RES)]
    lat = {q: _envelopes([c] + more, terms=q)["latency_us"]
           for q in (0, mono, E.BOUND_TERMS, E.MODEL_TERMS)}
    for q in (0, mono):
        assert (lat[q][1:] >= lat[q][0] * (1 - 1e-12)).all(), (q, lat[q][0], lat[q][1:].min())
    # to rounding: the seams subtract (hypothesis found a 1-ulp excess; the screen's
    # bound is taken 1e-12 under, tsbatch.engine.screen.BOUND_RTOL)
    assert (lat[E.BOUND_TERMS] <= lat[mono] * (1 + 1e-12)).all()
    assert (lat[mono] <= lat[E.MODEL_TERMS] * (1 + 1e-12)).all()
    for q in lat:
        for case, got in ((c, lat[q][0]), (more[R_DRAM], lat[q][1 + R_DRAM])):
            want = _twin_wave(case, terms=q)[0] + case["launch"]
            assert got == pytest.approx(want, rel=FASTMATH_RTOL)


@settings(max_examples=300, deadline=None)
@given(st.floats(0.0, 100.0), st.floats(1e-3, 100.0), st.integers(1, 64), st.integers(0, 4))
# saturated at once (z << dem): the exact answer is dem / (1 - 1e-9), the floor
# the full recursion times (1 - 1e-9), 2e-9 apart plus rounding (hypothesis, 2026-12-06)
@example(1e-05, 2.0, 3, 2)
def test_ring_queue_floor_lies_below_the_ring_queue(z, dem, n, steps):
    """The bound's floor of the ring queue: at most the exact mean-value
    analysis (its rounding and its answer at saturation included), at least the
    asymptotic bounds less 1e-9, within 1e-9 either side of the mean-value
    time where it runs every step (the floor 1e-9 under it, the exact answer at
    saturation 1e-9 over it: 2e-9 apart, and the rounding); the twin agrees with
    the kernel."""
    lo = envelope._ring_queue_floor(z, dem, n, steps)
    assert lo == pytest.approx(naive.ring_queue_floor(z, dem, n, steps), rel=FASTMATH_RTOL)
    exact = envelope._ring_queue(z, dem, n)
    assert lo <= exact
    assert lo >= max(dem, (z + dem) / n) * (1 - 1e-9) * (1 - 1e-12) or n - steps > 1
    if steps >= n - 1:
        assert lo == pytest.approx(naive.ring_queue(z, dem, n), rel=2.5e-9)


def test_loop_envelope_by_hand():
    """The loop is first load + (N - 1) steady iterations + last compute; a loop
    no longer than the loads in flight overlaps its memory with its compute;
    the bookkeeping joins the chain where there is one. Hand computation: one
    SM, 2 tiles, compute 1.0 us and memory (L2) 0.5 us per iteration, latency
    0.5 us, each tile's epilogue 0.2 us of DRAM."""
    rate = np.zeros(8)
    rate[0], rate[5], rate[6] = 100.0, 1000.0, 1000.0  # tensor core per SM; L2, DRAM per chip
    wi = np.zeros(8)
    wi[0], wi[5] = 100.0, 500.0
    we = np.zeros(8)
    we[6] = 200.0

    def run(ksteps, ovh=0.0, chain=0.0):
        args = (wi, we, rate, SHARED, COMPUTE, 2, 1, ksteps, 3, 4.0, 4.0, 0.5, ovh, 0.0, 0, 1.0,
                0.0, chain, 1.0)
        got = envelope.envelope_one(*args)
        want = naive.envelope_one(wi.tolist(), we.tolist(), rate.tolist(), SHARED.tolist(),
                                  COMPUTE.tolist(), *args[5:])
        assert_allclose(got, want, rtol=FASTMATH_RTOL, atol=0)
        return got[0]

    # N = 4 <= d = 4: 0.5 + 0.5 (first load) + 3 x max(1.0, 0.5) + 1.0 + 2 x 0.2,
    # less the other tile's epilogue (0.2) run out of step under the loop
    assert_allclose(run(2), 5.2, rtol=1e-9)
    # N = 20 > d: steady max(1.0, 0.5, (0.5 + 0.5) / 4) = 1.0: 1.0 + 19 + 1.0 + 0.4 - 0.2
    assert_allclose(run(10), 21.2, rtol=1e-9)
    # bookkeeping 0.4 us without a chain: on the busiest resource, compute 1.4
    assert_allclose(run(2, ovh=0.4), 1.0 + 3 * 1.4 + 1.4 + 0.2, rtol=1e-9)
    # with a 3.0 us chain over 2 tiles x 1 stream: max(1.0, (3.0 + 0.4) / 2) = 1.7
    assert_allclose(run(2, ovh=0.4, chain=3.0), 1.0 + 3 * 1.7 + 1.7 + 0.2, rtol=1e-9)
    # DRAM in the loop too (1.0 us a step) and a 5.0 us epilogue: the hidden part
    # is capped by the loop (3.0), and the total by the busiest resource, DRAM:
    # 2 tiles x (2 x 1.0 + 5.0) + latency 0.5 = 14.5 > 1.5 + 3.0 + 1.0 + 10.0 - 3.0
    wi[6], we[6] = 1000.0, 5000.0
    assert_allclose(run(2), 14.5, rtol=1e-9)


#: a case hypothesis found (CI, session 15): a tail wave's loop was counted twice,
#: once hiding its own tiles' epilogue (out of step) and again hiding the stores of
#: the wave before it, so more loop iterations made the kernel faster
LOOP_COUNTED_TWICE = {
    "work_iter": [0.0, 0.0529030074131895, 33551.52798315874, 0.0, 19.508124605862395,
                  86.11517902580722, 0.0, 14612.266436401296, 0.0040072552418791915],
    "work_epi": [1718.291240826636, 0.0, 5.132902174318775, 0.0, 91.82712226289298,
                 57.48827135635498, 0.0, 0.0, 18023.42505457058],
    "rate": [4964912.303507093, 8226.675555481435, 6034143.09964025, 0.0, 115305.26798334174,
             188437.15855866528, 1.7608410885916186, 19110.853828657142, 4.996725831263112],
    "tiles": 7, "sms": 2, "p": 2, "ksteps": 1, "stages": 1, "warps_tile": 1.0,
    "warps_full": 4.0, "lat": 0.0, "ovh_iter": 0.029106326624146597,
    "ovh_tile": 0.8716009853374346, "persistent": 0, "launch": 2.072927969021899,
    "share_eff": 1.0, "sync": 0.0,
}


def test_more_iterations_never_faster_loop_counted_once():
    cases = [dict(LOOP_COUNTED_TWICE, ksteps=k) for k in (1, 2, 4, 8)]
    lat = _envelopes(cases)["latency_us"]
    assert np.all(np.diff(lat) >= -1e-12 * lat[:-1])
    for c, got in zip(cases, lat):
        assert got - c["launch"] == pytest.approx(_twin_wave(c)[0], rel=1e-12)



def test_queued_wave_two_slots_closed_form():
    """Mean-value analysis of two slots: with demand D a tile at the busiest
    resource and a delay Z of the rest, the second customer finds the first
    at the queue with probability D / (Z + D): a wave of the two takes
    Z + D + D^2 / (Z + D), between the max of the bounds (max(Z + D, 2D))
    and their sum. Kernel and twin agree."""
    from tsbatch.kernels.envelope import _queued_wave
    # a tile: 64 KiB of DRAM traffic once per tile (Q in, O out), some tensor-core
    # work per iteration; 2 resident slots on 108 SMs
    work_iter = [4.0e6, 5.0e4, 4.0e3, 1.6e5, 0.0, 3.2e4, 0.0, 0.0, 6.0e3]
    work_epi = [0.0, 3.3e4, 128.0, 6.6e4, 0.0, 6.6e4, 6.6e4, 0.0, 0.0]
    rate = [2.35e6, 1.76e5, 2.26e4, 1.78e5, 0.0, 4.5e6, 1.7e6, 0.0, 9.0e4]
    args = (work_iter, work_epi, rate, SHARED.tolist(), COMPUTE.tolist(), 2, 108, 2, 3, 4.0,
            4.0, 0.6, 0.06, 0.0, 1.0, 0.1, 1.2, 1.0)
    floor = naive.resource_floor(work_iter, work_epi, rate, SHARED.tolist(), COMPUTE.tolist(),
                                 2, 108, 2, 4.0, 4.0)
    twin = naive.queued_wave(*args, floor)
    kern = _queued_wave(np.array(work_iter), np.array(work_epi), np.array(rate), SHARED, COMPUTE,
                        *args[5:], floor)
    assert kern == pytest.approx(twin, rel=1e-12)
    # the closed form, from the twin's one-slot increment
    one = naive.queued_wave(work_iter, work_epi, rate, SHARED.tolist(), COMPUTE.tolist(), 1,
                            *args[6:], floor / 2)  # one customer: delay + demand
    d = floor / 2
    z = one - d
    assert z > 0
    assert twin == pytest.approx(z + d + d * d / (z + d), rel=1e-12)
    assert max(z + d, 2 * d) < twin < z + 2 * d
    # the busiest resource is DRAM, all of it once per tile: the whole share queues
    assert naive.busiest(work_iter, work_epi, rate, SHARED.tolist(), COMPUTE.tolist(), 2,
                         108, 2, 4.0, 4.0)[1] == 1.0


def test_layout_conversion_paid_once_per_turnover_between_full_waves():
    """``conv``: with no stores to drain, each full wave after the first pays the
    ``p`` resident tiles' conversions, nothing else moves; a grid of one wave or
    one partial wave pays none, and a tail after full waves none of its own."""
    base = dict(work_iter=[1.0, 0.0, 0.0, 2.0, 3.0, 1.0, 0.5, 0.0, 0.0], work_epi=[0.0] * N_RES,
                rate=[10.0, 0.0, 0.0, 20.0, 30.0, 400.0, 200.0, 0.0, 0.0], sms=4, ksteps=16,
                stages=3, warps_tile=4.0, warps_full=4.0, lat=0.6, ovh_iter=0.03, ovh_tile=0.0,
                persistent=0, launch=0.0, share_eff=1.0, sync=0.0)
    for p in (1, 2, 3):
        for tiles, turns in ((4 * p, 0), (3, 0), (3 * 4 * p, 2), (3 * 4 * p + 1, 2)):
            c = dict(base, p=p, tiles=tiles)
            plain, conv = _envelopes([dict(c, conv=0.0), dict(c, conv=0.25)])["latency_us"]
            assert_allclose(conv - plain, turns * p * 0.25, rtol=1e-9, atol=1e-12)
            assert_allclose(_twin_wave(dict(c, conv=0.25))[0], conv, rtol=FASTMATH_RTOL)
    # stores that drain longer than the conversions: never less than without them
    c = dict(base, p=1, tiles=12, work_epi=[0.0] * 5 + [4000.0, 4000.0, 0.0, 0.0])
    plain, conv = _envelopes([dict(c, conv=0.0), dict(c, conv=0.25)])["latency_us"]
    assert conv >= plain


def test_turnover_exposes_the_stores_issue_not_their_drain():
    """A block exits after its C stores have been issued out of the SM (at the
    SM's share of the L2 rate) and only then is its successor launched: with the
    stores all at the L2 (issue = drain), each full wave after the first costs the
    isolated wave plus the turnover's pipelined conversions and issues beyond the
    stores, ``p max(conv, issue) + min(conv, issue) - store``; with the same stores
    draining to DRAM for longer, only the issue stays exposed."""
    base = dict(work_iter=[1.0, 0.0, 0.0, 2.0, 3.0, 1.0, 0.5, 0.0, 0.0],
                work_epi=[0.0] * 5 + [200.0, 0.0, 0.0, 0.0],
                rate=[10.0, 0.0, 0.0, 20.0, 30.0, 1600.0, 200.0, 0.0, 0.0], sms=4, ksteps=16,
                stages=3, warps_tile=4.0, warps_full=4.0, lat=0.6, ovh_iter=0.03, ovh_tile=0.0,
                persistent=0, launch=0.0, share_eff=1.0, sync=0.0)
    issue = 200.0 * 4 / 1600.0  # 0.5 us a tile
    for p, conv in ((1, 0.25), (1, 0.75), (2, 0.25), (3, 0.25)):
        c = dict(base, p=p, tiles=3 * 4 * p)
        one = naive.envelope_one(c["work_iter"], c["work_epi"], c["rate"], SHARED.tolist(),
                                 COMPUTE.tolist(), p, 4, 16, 3, 4.0, 4.0, 0.6, 0.03, 0.0, 0)
        store = one[5]
        assert store == pytest.approx(issue)  # one tile's, the others' hidden under the loop
        got = _envelopes([dict(c, conv=conv)])["latency_us"][0]
        want = 3 * one[0] + 2 * (p * max(conv, issue) + min(conv, issue) - store)
        assert_allclose(got, want, rtol=1e-9)
        assert_allclose(_twin_wave(dict(c, conv=conv))[0], got, rtol=FASTMATH_RTOL)
    # the same stores draining 4x longer to DRAM: the drain past the issue runs
    # under the next wave, the issue does not
    c = dict(base, p=1, tiles=12, conv=0.25, work_epi=[0.0] * 5 + [200.0, 100.0, 0.0, 0.0])
    one = naive.envelope_one(c["work_iter"], c["work_epi"], c["rate"], SHARED.tolist(),
                             COMPUTE.tolist(), 1, 4, 16, 3, 4.0, 4.0, 0.6, 0.03, 0.0, 0)
    assert one[5] == pytest.approx(4 * issue)
    floor = naive.busiest(c["work_iter"], c["work_epi"], c["rate"], SHARED.tolist(),
                          COMPUTE.tolist(), 1, 4, 16, 4.0, 4.0)[0]
    h, hf = naive.seam(one, one[5], 0.0, floor)  # the seam's own hiding, where it is less
    got = _envelopes([c])["latency_us"][0]
    assert_allclose(got, 3 * one[0] + 2 * max(-(h + hf), 0.25 + issue - one[5]), rtol=1e-9)
    assert got > 3 * one[0] - 2 * (h + hf)  # here the issue binds
    assert_allclose(_twin_wave(c)[0], got, rtol=FASTMATH_RTOL)



def test_exposed_copy_by_hand():
    """A loop that does not prefetch (Triton's 2-stage FMA dot, ``expose``): each
    tile's own iteration is its issue on the schedulers its warps hold (or its
    chain with the bookkeeping), its barrier stall and the exposed copy, and the
    p resident tiles run out of step in that wait. Hand computation: one SM,
    CUDA-core work 1.0 us an iteration at the full issue fraction, 200 steps,
    copy 0.3 us, barrier stall 0.1 us, no memory time."""
    rate = np.zeros(9)
    rate[1], rate[5] = 100.0, 1e9  # CUDA cores per SM; L2 per chip (no memory time)
    wi = np.zeros(9)
    wi[1] = 100.0
    we = np.zeros(9)

    def steady(p, warps, expose, sync=0.1, chain=0.0, ovh=0.0):
        args = (wi, we, rate, SHARED, COMPUTE, p, 1, 200, 2, float(warps), 4.0, 0.0, ovh, 0.0,
                0, 1.0, sync, chain, 1.0, 1, expose)
        got = envelope.envelope_one(*args)
        want = naive.envelope_one(wi.tolist(), we.tolist(), rate.tolist(), SHARED.tolist(),
                                  COMPUTE.tolist(), *args[5:20], expose=expose)
        assert_allclose(got, want, rtol=FASTMATH_RTOL, atol=0)
        return got[4]

    # 8 warps, one tile (128x128x32/2/8 on H100): the tile's iteration, its stall
    # and its copy in series: 1.0 + 0.1 + 0.3 (no other tile to issue in the wait)
    assert_allclose(steady(1, 8, 0.3), 1.4, rtol=1e-12)
    assert_allclose(steady(1, 8, 0.0), 1.1, rtol=1e-12)  # prefetching: the stall only
    # 4 warps, two tiles: (1.0 + 0.1 + 0.3) / 2 = 0.7 < 1.0, hidden by the other tile
    assert_allclose(steady(2, 4, 0.3), 1.0, rtol=1e-12)
    # ... unless the wait is long: (1.0 + 0.1 + 1.5) / 2 = 1.3
    assert_allclose(steady(2, 4, 1.5), 1.3, rtol=1e-12)
    # 2 warps, four tiles: a tile's warps hold 2 of the 4 schedulers, so its own
    # issue is 2.0 us: (2.0 + 0.1 + 3.0) / 4 = 1.275
    assert_allclose(steady(4, 2, 3.0), 1.275, rtol=1e-12)
    # one 1-warp tile (issue fraction 1/4: compute 4.0 us, its own issue the same)
    assert_allclose(steady(1, 1, 0.3), 4.0 + 0.1 + 0.3, rtol=1e-12)
    # a chain longer than the issue (2.5 us with 0.2 us of bookkeeping) is the
    # tile's own iteration: (2.5 + 0.2 + 0.1 + 0.3) / 2 = 1.55 (the chain alone
    # gives (2.5 + 0.2) / 2 = 1.35)
    assert_allclose(steady(2, 4, 0.3, chain=2.5, ovh=0.2), 1.55, rtol=1e-12)
    assert_allclose(steady(2, 4, 0.0, chain=2.5, ovh=0.2), 1.35, rtol=1e-12)
