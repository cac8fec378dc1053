"""Sampled waves stand for the waves they represent.

When a launch has more waves than ``max_waves``, the cache model analyses
evenly spaced waves: the first (cold: nothing earlier to hit), the last
(possibly partial) and ``max_waves - 2`` interior ones. The first and last
count once; each interior sample counts for ``(W - 2) / (max_waves - 2)``
interior waves. On a launch whose interior waves are all alike the sampled
result must then equal the exhaustive one; an equal-weight average of the
samples (the estimator before) over-counts the cold wave and does not.
"""

from __future__ import annotations

import pytest
from numpy.testing import assert_allclose
from strategies import ROW, cache_args

from tsbatch.kernels import reuse


def _row_waves_problem(g15: int, cap2_units: float) -> dict:
    # row order, one wave = one full row of tiles: every wave reads A's row w
    # (new) and all of B's columns (read by the wave before), so waves
    # 1 .. W-1 are identical and wave 0 finds B cold
    unit = 128.0
    return dict(g0=40, g1=8, g2=1, order=ROW, group=1, conc=8, ksteps=4,
                tbytes=[unit, unit, unit], cap2=cap2_units * unit, assoc2=16.0, nsm=4, g15=g15,
                cap15=(6 * unit) if g15 else 0.0, assoc15=4.0)


@pytest.mark.parametrize("g15", [0, 2])
@pytest.mark.parametrize("general", [False, True])
def test_sampled_waves_equal_exhaustive_when_interior_waves_alike(g15, general):
    p = _row_waves_problem(g15, cap2_units=40.0)
    args = cache_args([p])
    exh = reuse.cache_hit_rates(*args, k_samples=4, max_waves=1 << 30, max_lookback=4,
                                general=general)
    for mw in (3, 5, 8, 16):
        got = reuse.cache_hit_rates(*args, k_samples=4, max_waves=mw, max_lookback=4,
                                    general=general)
        for a, b in zip(got, exh):
            assert_allclose(a, b, rtol=1e-12, atol=1e-14)
    # the check can fail: the cold wave differs from the rest, so only its
    # own weight makes the sampled sums exact
    two = reuse.cache_hit_rates(*args, k_samples=4, max_waves=2, max_lookback=4,
                                general=general)  # waves 0 and W-1, equal weight
    assert abs(two[2][0, 1] - exh[2][0, 1]) > 1e-3  # B's DRAM share
