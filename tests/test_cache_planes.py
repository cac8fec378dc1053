"""Plane-keyed grids in closed form (``reuse._cache_planes``) against the simulation.

Attention's per-step tensors (K, V) have one block per batch x KV head and
step, read by every query tile and every query head of the KV group: a block
per plane of the grid, read by ``R = g0 g1`` consecutive programs of every
panel order (tsbatch/kernels/reuse.py, ``_cache_planes``' docstring).
``cache_hit_rates`` solves such problems in closed form (``column=True``, the
default) instead of walking their waves (``column=False``). As for
``_cache_column`` (tests/test_cache_column.py) the one change of arithmetic
is a wave's L1.5 hit sum ``(nw - sum G) e`` for that many additions of ``e``,
so the two must agree to ``1e-12`` (relative, and absolute on rates near
zero). Checked on grids of many shapes and phases of the planes against the
waves, with and without an L1.5 tier, every sampling, any cadences and
zero-byte tensors, against the wave-by-wave fast path, the general path and
the plain-Python twin (``naive.cache_planes_one``), which counts each
segment's L1.5 groups slot by slot.
"""

from __future__ import annotations

import naive
from closed_forms import FAST_ATOL, FAST_RTOL, PANEL_ORDERS, SAMPLINGS, problem_args
from closed_forms import close as _close
from closed_forms import rates as _rates
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.testing import assert_array_equal

from tsbatch.kernels import reuse
from tsbatch.kernels.order import ORDER_NAMES

RTOL = 1e-12
ATOL = 1e-12


def _applies(g0, g1, g2, mask, per_step, tb, drop_zero):
    span = (1 if g0 > 1 else 0) | (2 if g1 > 1 else 0) | (4 if g2 > 1 else 0)
    keyed = {span & ~m for m, c, b in zip(mask, per_step, tb)
             if c and not (b == 0 and drop_zero)}
    return len(keyed) == 1 and keyed <= {0, 4}


@st.composite
def plane_problem(draw) -> tuple:
    """A cache problem whose per-step tensors are mostly keyed by the plane
    (masks 3 or 7; now and then any mask: then simulated), 1-4 tensors, block
    bytes including 0, grids of 1-40 x 1-8 x 1-12 tiles, any wave size."""
    T = draw(st.integers(1, 4))
    per_step = [draw(st.integers(0, 1)) for _ in range(T)]
    anym = draw(st.integers(0, 9)) == 0
    mask = [draw(st.integers(0, 7)) if anym or not c else draw(st.sampled_from([3, 3, 7]))
            for c in per_step]
    tb = [float(draw(st.sampled_from([0, 64, 96, 128, 512, 2048, 16384]))) for _ in range(T)]
    if not any(b > 0 for b, c in zip(tb, per_step) if c):
        per_step[0], tb[0], mask[0] = 1, 256.0, 3
    unit = max(max(tb), 64.0)
    nsm = draw(st.sampled_from([1, 3, 8, 12, 132]))
    conc = draw(st.one_of(st.integers(1, 40), st.just(nsm * draw(st.integers(1, 4)))))
    g0 = draw(st.integers(1, 40))
    g1 = draw(st.sampled_from([1, 1, 2, 3, 8]))
    g2 = draw(st.integers(1, 12))
    return problem_args(draw, g0, g1, g2, conc, mask, per_step, tb, unit, nsm)


@settings(max_examples=300, deadline=None)
@given(plane_problem(), st.sampled_from(SAMPLINGS), st.booleans(), st.booleans())
def test_planes_equal_the_simulation(args, sampling, drop_zero, weights):
    kw = dict(sampling, drop_zero=drop_zero, interior_weights=weights)
    got = _rates(args, **kw)
    _close(got, _rates(args, column=False, **kw), RTOL, ATOL)
    _close(got, _rates(args, general=True, **kw), FAST_RTOL, FAST_ATOL)


@settings(max_examples=200, deadline=None)
@given(plane_problem(), st.sampled_from(SAMPLINGS), st.booleans(), st.booleans())
def test_planes_equal_their_twin(args, sampling, drop_zero, weights):
    one = [a[0] for a in args]
    g0, g1, g2, _, _, conc, ksteps, mask, per_step, tb = one[:10]
    cap2, assoc2, nsm, g15, cap15, assoc15 = one[10:]
    if not _applies(g0, g1, g2, mask, per_step, tb, drop_zero):
        return
    got = _rates(args, drop_zero=drop_zero, interior_weights=weights, **sampling)
    want = naive.cache_planes_one(g0, g1, g2, conc, ksteps, mask, per_step, tb, cap2, assoc2,
                                  nsm, g15, cap15, assoc15, k_samples=sampling["k_samples"],
                                  max_waves=sampling["max_waves"], weights=weights,
                                  drop_zero=drop_zero)
    _close([c[0] for c in got], [np.array(w) for w in want], RTOL, RTOL)


def _attention(q_tiles, group, planes, conc, ksteps, tb, g15=8):
    """A FlashAttention cache problem (Q, K, V, O; K and V per step, reused
    along the query tiles and the query heads of a KV group) on an H100
    (132 SMs, 50 MB L2, 8-SM L1.5 groups), column order."""
    return ([q_tiles], [group], [planes], [ORDER_NAMES["col"]], [1], [conc], [ksteps],
            [[0, 3, 3, 0]], [[0, 1, 1, 0]], [list(tb)], [5.24288e7], [16.0], [132], [g15],
            [184320.0], [8.0])


@pytest.mark.parametrize("q_tiles", [1, 7, 64, 131, 133, 256, 951])
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("conc", [132, 264, 396, 660])
def test_planes_attention_launches(q_tiles, group, conc):
    """H100 attention launches: query tiles around whole waves, GQA groups,
    4-64 planes (evaluate's sampling: 8 waves analysed, lookback 4), K/V
    blocks of 4-32 KB, with and without the L1.5 tier: equal to the bit."""
    kw = dict(k_samples=4, max_waves=8, max_lookback=4)
    for planes in (1, 4, 64):
        for ksteps in (1, 9, 257):
            for tb in ((16384.0, 8192.0, 8192.0, 16384.0), (8192.0, 32768.0, 32768.0, 8192.0)):
                for g15 in (0, 8):
                    args = _attention(q_tiles, group, planes, conc, ksteps, tb, g15)
                    for x, y in zip(_rates(args, **kw), _rates(args, column=False, **kw)):
                        assert_array_equal(x, y)


def test_planes_batch_of_many_shapes():
    """A batch mixing plane-keyed grids of many shapes with others: each row
    as alone and as simulated."""
    rng = np.random.default_rng(11)
    n = 500
    g0 = rng.integers(1, 300, n)
    g1 = rng.choice([1, 2, 4, 8], n)
    g2 = rng.integers(1, 40, n)
    mask = np.where(rng.random((n, 1)) < 0.8, [0, 3, 3, 0], [0, 1, 2, 0])
    args = (g0, g1, g2, rng.choice(PANEL_ORDERS, n), np.full(n, 4),
            rng.choice([12, 24, 132, 264], n), rng.integers(1, 300, n), mask,
            np.tile([0, 1, 1, 0], (n, 1)), rng.choice([4096.0, 8192.0, 32768.0], (n, 4)),
            np.full(n, 2e6), np.full(n, 16.0), np.full(n, 12), np.full(n, 4),
            np.full(n, 3e4), np.full(n, 8.0))
    kw = dict(k_samples=4, max_waves=8, max_lookback=4)
    got = _rates(args, **kw)
    _close(got, _rates(args, column=False, **kw), RTOL, ATOL)
    for i in (0, 57, 311, 499):
        one = _rates([np.asarray(a)[i:i + 1] for a in args], **kw)
        for x, y in zip(one, got):
            assert_array_equal(x[0], y[i])


def test_planes_fall_back_where_they_do_not_apply():
    """Block sizes that are not integers, a z-order launch, K keyed by the
    query tile: simulated, the very same values as without the closed form."""
    base = _attention(300, 4, 8, 264, 65, (16384.0, 8192.0, 8192.0, 16384.0))
    cases = []
    a = list(base)
    a[9] = [[16384.0, 8192.5, 8192.0, 16384.0]]
    cases.append(a)
    a = list(base)
    a[3] = [ORDER_NAMES["zorder"]]
    cases.append(a)
    a = list(base)
    a[7] = [[0, 2, 3, 0]]
    cases.append(a)
    kw = dict(k_samples=4, max_waves=8, max_lookback=4)
    for args in cases:
        for x, y in zip(_rates(args, **kw), _rates(args, column=False, **kw)):
            assert_array_equal(x, y)
