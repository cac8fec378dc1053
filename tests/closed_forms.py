"""Shared by the tests of the cache model's closed forms (test_cache_column.py,
test_cache_planes.py): one problem's argument lists for ``reuse.cache_hit_rates``
and the comparison of two results."""

from __future__ import annotations

from hypothesis import strategies as st
from numpy.testing import assert_allclose

from tsbatch.kernels import reuse
from tsbatch.kernels.order import ORDER_NAMES

#: the launch orders a closed form serves (every one but z-order)
PANEL_ORDERS = [v for k, v in sorted(ORDER_NAMES.items()) if k != "zorder"]

#: vs the general path (test_cache_fast.py's tolerances)
FAST_RTOL = 1e-9
FAST_ATOL = 1e-12

#: the sampling arguments the closed forms are checked under
SAMPLINGS = (
    dict(k_samples=4, max_waves=8, max_lookback=4),  # evaluate's defaults
    dict(k_samples=3, max_waves=16, max_lookback=1),
    dict(k_samples=64, max_waves=1 << 30),  # unsampled
    dict(k_samples=4, max_waves=2, max_lookback=1 << 30),
    dict(k_samples=2, max_waves=3, max_lookback=2),
)


def problem_args(draw, g0, g1, g2, conc, mask, per_step, tb, unit, nsm) -> tuple:
    """The one-problem argument lists of ``reuse.cache_hit_rates`` for a grid and its
    tensors, the launch order, group, ksteps and the cache sizes drawn (L2 from a few
    units to an H100's, with and without L1.5 groups)."""
    cap2 = draw(st.one_of(st.floats(2.0, 300.0).map(lambda b: b * unit), st.just(5.24288e7)))
    return ([g0], [g1], [g2], [draw(st.sampled_from(PANEL_ORDERS))],
            [draw(st.sampled_from([1, 2, 8]))], [conc], [draw(st.integers(1, 40))],
            [mask], [per_step], [tb], [cap2], [float(draw(st.sampled_from([1, 4, 16])))],
            [nsm], [draw(st.sampled_from([0, 1, 2, 4, 8]))],
            [draw(st.sampled_from([2.0 * unit, 30.0 * unit, 184320.0]))],
            [float(draw(st.sampled_from([2, 8])))])


def rates(args, **kw):
    return reuse.cache_hit_rates(*args, **kw)


def close(a, b, rtol, atol):
    for x, y in zip(a, b):
        assert_allclose(x, y, rtol=rtol, atol=atol)
