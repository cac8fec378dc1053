"""A per-step tensor with a block per tile keyed by its tile's position in the wave.

MoE's W_other has a block per tile: ``P`` ids, each touched in one wave only.
``reuse.cache_hit_rates`` keys such a tensor (when it holds the last id range
and no sum-by-sum book-keeping walks it: ``reuse._pos_key_tensor``) by the
tile's position in its wave, so the arrays keyed by id hold ``conc`` entries
for it, not ``P`` (filled once per problem: ~10 % of MoE's cache time). The
results are those of the tile-keyed ids (``pos_keys=False``) to the bit.
"""

from __future__ import annotations

import naive
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.testing import assert_array_equal
from test_cache_block_per_tile import SAMPLINGS, _args, drawn_fraction, problem_dict

from tsbatch.kernels import reuse
from tsbatch.kernels.order import ORDER_NAMES


@st.composite
def keyed_problem(draw, integer: bool | None = None) -> dict:
    """Grids of several waves; three per-step tensors and a once-per-tile one,
    the last per-step one a block per tile (mask 0, or reuse bits on dimensions
    of one tile) in most draws, sometimes another (the keys then stay)."""
    g0, g1, g2 = draw(st.integers(1, 40)), draw(st.integers(1, 40)), draw(st.integers(1, 3))
    nsm = draw(st.sampled_from([8, 20, 132]))
    conc = nsm * draw(st.integers(1, 3))
    one = [m for m in range(1, 8)
           if all((m >> d) & 1 == 0 or n == 1 for d, n in enumerate((g0, g1, g2)))]
    mask = [draw(st.integers(0, 7)), draw(st.integers(0, 7)),
            draw(st.sampled_from([0, 0, 0] + one + [draw(st.integers(0, 7))])), 0]
    per_step = draw(st.sampled_from([[1, 1, 1, 0], [0, 1, 1, 0], [1, 1, 1, 1], [1, 0, 1, 0]]))
    frac = draw(st.booleans()) if integer is None else not integer
    if frac:
        tb = [draw(st.floats(16.0, 9000.0)) for _ in range(4)]
    else:
        tb = [float(draw(st.sampled_from([64, 512, 2048, 8192]))) for _ in range(4)]
    return problem_dict(draw, g0, g1, g2, nsm, conc, mask, per_step, tb)


def _koff(p) -> list[int]:
    g = (p["g0"], p["g1"], p["g2"])
    koff = [0]
    for t, m in enumerate(p["mask"]):
        span = 0
        if p["per_step"][t]:
            span = 1
            for d in range(3):
                if not (m >> d) & 1:
                    span *= g[d]
        koff.append(koff[-1] + span)
    return koff


def _keyed(p) -> bool:
    P = p["g0"] * p["g1"] * p["g2"]
    return naive.pos_key_tensor_one(p["per_step"], p["mask"], _koff(p), P, p["conc"]) >= 0


def _same(got, want):
    for a, b in zip(got, want):
        assert_array_equal(a.view(np.int64), b.view(np.int64))


@settings(max_examples=150, deadline=None)
@given(st.lists(keyed_problem(), min_size=1, max_size=3), st.sampled_from(SAMPLINGS))
def test_position_keys_equal_tile_keys_to_the_bit(probs, sampling):
    args = _args(probs)
    _same(reuse.cache_hit_rates(*args, **sampling),
          reuse.cache_hit_rates(*args, pos_keys=False, **sampling))


def test_position_keys_are_taken_in_most_draws():
    """The property above exercises the keyed path: most drawn problems have a
    tensor keyed by position (so a broken key shows there)."""
    assert drawn_fraction(keyed_problem(), _keyed) > 0.4


def test_moe_like_problems_equal_to_the_bit():
    """MoE persistent-raster problems (W split by the expert share or not,
    W_other a block per tile, several waves, L1.5 groups on and off)."""
    for tw, two, cap15 in ((13107.2 / 3, 11468.8 / 3, 184320.0), (8192.0, 8192.0, 184320.0),
                           (13107.2 / 3, 11468.8 / 3, 0.0), (4096.0, 12288.0, 2e4)):
        for conc in (132, 528):
            p = dict(g0=16, g1=96, g2=4, order=ORDER_NAMES["persistent"], group=8, conc=conc,
                     ksteps=64, mask=[0, 2, 1, 0, 0], per_step=[0, 1, 1, 1, 0],
                     tbytes=[64.0, 2048.0, tw, two, 2048.0], cap2=4e6,
                     assoc2=16.0, nsm=132, g15=8, cap15=cap15, assoc15=8.0)
            assert _keyed(p)
            for sampling in SAMPLINGS:
                _same(reuse.cache_hit_rates(*_args([p]), **sampling),
                      reuse.cache_hit_rates(*_args([p]), pos_keys=False, **sampling))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 1), min_size=1, max_size=6), st.data())
def test_pos_key_tensor_against_the_twin(per_step, data):
    T = len(per_step)
    mask = data.draw(st.lists(st.integers(0, 7), min_size=T, max_size=T))
    spans = data.draw(st.lists(st.integers(0, 50), min_size=T, max_size=T))
    P = data.draw(st.integers(1, 50))
    conc = data.draw(st.integers(1, 60))
    spans = [s if data.draw(st.booleans()) else P for s in spans]
    koff = np.cumsum([0] + [s if per_step[t] else 0 for t, s in enumerate(spans)])
    want = naive.pos_key_tensor_one(per_step, mask, list(koff), P, conc)
    got = reuse._pos_key_tensor(np.array(per_step, dtype=np.int64), np.array(mask, dtype=np.int64),
                                koff.astype(np.int64), P, conc)
    assert got == want
