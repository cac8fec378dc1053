"""One-column grids in closed form (``reuse._cache_column``) against the simulation.

A grid of one column (``g1 == g2 == 1``) on a panel order issues its rows in
order; a per-step tensor is a block per program or one block every program
reads, so every wave's sums depend only on its size and on being the first
(tsbatch/kernels/reuse.py, ``_cache_column``'s docstring). ``cache_hit_rates``
solves such problems in closed form (``column=True``, the default) instead of
walking their waves (``column=False``). The closed form changes one piece of
arithmetic, a wave's L1.5 hit sum ``(nw - G) e`` for ``nw - G`` additions of
``e``: a relative difference of a few ulps per wave, so the two must agree to
``1e-12`` (relative, and absolute on rates near zero, where the simulation's
own rounding of ``nw - 1 - s15`` is all there is). Checked here on grids of
many lengths, wave sizes with and without a partial last wave, L2 sizes from
a few blocks (within-step distances matter) to 50 MB, with and without an
L1.5 tier, every sampling (lookbacks of one wave to all), any masks and
cadences, tensors of zero bytes, against the wave-by-wave fast path, the
general path, and the plain-Python twin (``naive.cache_column_one``).
"""

from __future__ import annotations

import naive
from closed_forms import FAST_ATOL, FAST_RTOL, PANEL_ORDERS, SAMPLINGS, problem_args
from closed_forms import close as _close
from closed_forms import rates as _rates
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from numpy.testing import assert_array_equal

from tsbatch.kernels import reuse
from tsbatch.kernels.order import ORDER_NAMES

#: closed form vs the simulation: a wave's L1.5 sum reassociated
COL_RTOL = 1e-12
COL_ATOL = 1e-12

#: the case hypothesis found (session 11): two programs of one wave on one SM, an
#: L1.5 group of that SM with 4096 B, the shared block (tensor 2, 2048 B) re-touched
#: at distance 512 + 2048 B = 5/3 units of 1536 B in a cache of 8/3 units, 8 ways:
#: one set of 2 ways, 1 whole block since, an L1.5 hit (tsbatch/kernels/sdcm.py,
#: ``_edge``). The twin's old rule ``d + 1 <= B`` read it as a miss by one ulp
SINGLE_SET_CASE = ([2], [1], [1], [1], [1], [2], [1], [[0, 0, 1, 0]], [[1, 1, 1, 0]],
                   [[512.0, 2048.0, 2048.0, 0.0]], [52428800.0], [1.0], [1], [1], [4096.0],
                   [8.0])
SINGLE_SET_SAMPLING = {"k_samples": 4, "max_waves": 8, "max_lookback": 4}


@st.composite
def column_problem(draw) -> tuple:
    """A one-column cache problem: 1-4 tensors, any masks and cadences, block
    bytes including 0, any length and wave size, an L2 from a few blocks to
    50 MB, with or without an L1.5 tier."""
    T = draw(st.integers(1, 4))
    mask = [draw(st.integers(0, 7)) for _ in range(T)]
    per_step = [draw(st.integers(0, 1)) for _ in range(T)]
    tb = [float(draw(st.sampled_from([0, 64, 96, 128, 512, 2048, 16384]))) for _ in range(T)]
    if not any(b > 0 for b, c in zip(tb, per_step) if c):
        per_step[0], tb[0] = 1, 256.0  # (a unit of 0 bytes: no problem the lowering makes)
    unit = max(max(tb), 64.0)
    nsm = draw(st.sampled_from([1, 3, 8, 12, 132]))
    conc = draw(st.one_of(st.integers(1, 40), st.just(nsm * draw(st.integers(1, 4)))))
    g0 = draw(st.one_of(st.integers(1, 12), st.integers(1, 40 * conc + 3)))
    return problem_args(draw, g0, 1, 1, conc, mask, per_step, tb, unit, nsm)


@settings(max_examples=300, deadline=None)
@given(column_problem(), st.sampled_from(SAMPLINGS), st.booleans(), st.booleans())
@example(SINGLE_SET_CASE, SINGLE_SET_SAMPLING, False, False)
def test_column_equals_the_simulation(args, sampling, drop_zero, weights):
    kw = dict(sampling, drop_zero=drop_zero, interior_weights=weights)
    col = _rates(args, **kw)
    _close(col, _rates(args, column=False, **kw), COL_RTOL, COL_ATOL)
    _close(col, _rates(args, general=True, **kw), FAST_RTOL, FAST_ATOL)


@settings(max_examples=200, deadline=None)
@given(column_problem(), st.sampled_from(SAMPLINGS), st.booleans(), st.booleans())
@example(SINGLE_SET_CASE, SINGLE_SET_SAMPLING, False, False)
def test_column_equals_its_twin(args, sampling, drop_zero, weights):
    col = _rates(args, drop_zero=drop_zero, interior_weights=weights, **sampling)
    one = [a[0] for a in args]
    g0, _, _, _, _, conc, ksteps, mask, per_step, tb = one[:10]
    cap2, assoc2, nsm, g15, cap15, assoc15 = one[10:]
    want = naive.cache_column_one(g0, conc, ksteps, mask, per_step, tb, cap2, assoc2, nsm, g15,
                                  cap15, assoc15, k_samples=sampling["k_samples"],
                                  max_waves=sampling["max_waves"], weights=weights,
                                  drop_zero=drop_zero)
    _close([c[0] for c in col], [np.array(w) for w in want], COL_RTOL, COL_ATOL)


def test_column_single_set_case():
    """The single-set case by value: tensor 2's two accesses, program 0's cold,
    program 1's an L1.5 hit (``floor(5/3) = 1`` block since, ``floor(8/3) = 2``
    ways); the private tensors miss. The kernel's three paths and the twin alike."""
    want = ([0.0, 0.0, 0.5, 0.0], [0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.5, 1.0])
    for kw in ({}, {"column": False}, {"general": True}):
        got = _rates(SINGLE_SET_CASE, drop_zero=False, interior_weights=False,
                     **SINGLE_SET_SAMPLING, **kw)
        for x, y in zip(got, want):
            assert_array_equal(x[0], y)
    one = [a[0] for a in SINGLE_SET_CASE]
    twin = naive.cache_column_one(*one[:1], *one[5:], k_samples=4, max_waves=8, weights=False,
                                  drop_zero=False)
    assert [list(x) for x in twin] == [list(y) for y in want]


def _rowwise(g0, conc, ksteps, tb, g15=8):
    """A rowwise kernel's cache problem (X, residual, the weight vector every
    block reads, Y) on an H100 (132 SMs, 50 MB L2, 8-SM L1.5 groups)."""
    return ([g0], [1], [1], [ORDER_NAMES["persistent"]], [1], [conc], [ksteps],
            [[0, 0, 1, 0]], [[1, 1, 1, 1]], [list(tb)], [5.24288e7], [16.0], [132], [g15],
            [184320.0], [8.0])


@pytest.mark.parametrize("g0", [1, 2, 7, 131, 132, 133, 263, 264, 265, 1000, 4097, 8210])
@pytest.mark.parametrize("conc", [132, 264, 528, 4224])
def test_column_rowwise_launches(g0, conc):
    """H100 rowwise launches: lengths around whole waves, up to 63 waves
    (evaluate's sampling: 8 analysed, lookback 4), shared vector of 32 B to
    16 KB, residual on and off, with and without the L1.5 tier."""
    kw = dict(k_samples=4, max_waves=8, max_lookback=4)
    for ksteps in (1, 7, 64):
        for tb in ((256.0, 0.0, 128.0, 256.0), (16384.0, 16384.0, 4096.0, 16384.0),
                   (512.0, 256.0, 32.0, 256.0)):
            for g15 in (0, 8):
                args = _rowwise(g0, conc, ksteps, tb, g15)
                _close(_rates(args, **kw), _rates(args, column=False, **kw), COL_RTOL, COL_ATOL)


def test_column_batch_of_many_lengths():
    """A batch mixing one-column grids of every length up to 600 with other
    grids: each row as alone and as simulated."""
    rng = np.random.default_rng(7)
    n = 600
    g0 = np.arange(1, n + 1)
    g1 = np.where(rng.random(n) < 0.2, 2, 1)
    args = (g0, g1, np.ones(n), np.full(n, ORDER_NAMES["grouped"]), np.full(n, 4),
            rng.choice([12, 24, 36, 132], n), rng.integers(1, 20, n),
            np.tile([0, 1, 1, 0], (n, 1)), np.ones((n, 4)),
            rng.choice([64.0, 256.0, 1024.0], (n, 4)), np.full(n, 2e5), np.full(n, 16.0),
            np.full(n, 12), np.full(n, 4), np.full(n, 3e4), np.full(n, 8.0))
    kw = dict(k_samples=4, max_waves=8, max_lookback=4)
    col = _rates(args, **kw)
    _close(col, _rates(args, column=False, **kw), COL_RTOL, COL_ATOL)
    for i in (0, 99, 311, 599):
        one = _rates([np.asarray(a)[i:i + 1] for a in args], **kw)
        for x, y in zip(one, col):
            assert_array_equal(x[0], y[i])


def test_column_falls_back_where_it_does_not_apply():
    """Block sizes that are not integers (an average edge tile), a z-order
    launch: simulated, the very same values as without the closed form."""
    for tb, order in (((256.5, 0.0, 128.0, 256.0), ORDER_NAMES["persistent"]),
                      ((256.0, 0.0, 128.0, 256.0), ORDER_NAMES["zorder"])):
        args = list(_rowwise(1000, 264, 7, tb))
        args[3] = [order]
        kw = dict(k_samples=4, max_waves=8, max_lookback=4)
        for x, y in zip(_rates(args, **kw), _rates(args, column=False, **kw)):
            assert_array_equal(x, y)
