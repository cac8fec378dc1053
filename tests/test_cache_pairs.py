"""Two per-step tensors touched together, simulated as one (swiglu's B and B_up).

gemm_epilogue's swiglu reads a second B tile, B_up, right after B in every
tile and step, with B's reuse mask and B's block bytes. ``reuse.cache_hit_rates``
simulates such a pair (``reuse._pair_tensors``: consecutive in the step, equal
masks, equal bytes, integer sizes) as one tensor of twice the bytes whose own
distances take the partner's bytes (within the step, across waves, in the L1.5
groups), and gives the partner the kept tensor's results. The results are
those of the per-access pair (``pairs=False``) to the bit.
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
def paired_problem(draw, integer: bool | None = None) -> dict:
    """Grids of one to many waves; per-step A, B and B_up (B_up with B's mask
    and bytes) in most draws, sometimes a tensor between them, a zero-byte
    one, a block-per-tile pair or unequal bytes (then nothing is merged);
    a once-per-tile tensor; integer (mostly) or fractional sizes."""
    g0, g1, g2 = draw(st.integers(1, 40)), draw(st.integers(1, 40)), draw(st.integers(1, 3))
    nsm = draw(st.sampled_from([8, 20, 132]))
    conc = nsm * draw(st.integers(1, 3))
    frac = draw(st.integers(0, 4)) == 0 if integer is None else not integer
    sizes = [64.0, 512.0, 1024.0, 2048.0, 8192.0]
    if frac:
        a, b, x = (draw(st.floats(16.0, 9000.0)) for _ in range(3))
    else:
        a, b, x = (draw(st.sampled_from(sizes)) for _ in range(3))
    ma, mx = draw(st.integers(0, 7)), draw(st.integers(0, 7))
    # (B reused along the rows or the columns in most draws, as an epilogue's)
    mb = draw(st.sampled_from([1, 2, 1, 2, 3, 5, 6] + [draw(st.integers(0, 7))]))
    kind = draw(st.sampled_from(["pair"] * 5 + ["between", "zero", "unequal", "first"]))
    once = draw(st.sampled_from([0.0, 1024.0, 4096.0]))
    if kind == "between":  # another tensor between B and B_up: not consecutive
        mask, per_step, tb = [ma, mb, mx, mb, 0], [1, 1, 1, 1, 0], [a, b, x, b, once]
    elif kind == "zero":  # a zero-byte tensor between them (left out where exact)
        mask, per_step, tb = [ma, mb, mx, mb, 0], [1, 1, 1, 1, 0], [a, b, 0.0, b, once]
    elif kind == "unequal":
        mask, per_step, tb = [ma, mb, mb, 0], [1, 1, 1, 0], [a, b, b + 64.0, once]
    elif kind == "first":  # the pair first in the step, a once-per-tile tensor between
        mask, per_step, tb = [mb, 0, mb, ma], [1, 0, 1, 1], [b, once, b, a]
    else:
        mask, per_step, tb = [ma, mb, mb, 0], [1, 1, 1, 0], [a, b, b, once]
    return problem_dict(draw, g0, g1, g2, nsm, conc, mask, per_step, tb)


def _merged(p) -> bool:
    ps = p["per_step"]
    if all(v == 0.0 for v, s in zip(p["tbytes"], ps) if s):
        return False
    return naive.pair_tensors_one(ps, p["tbytes"], p["mask"], p["g0"], p["g1"], p["g2"])[0] >= 0


def _same(got, want):
    for a, b in zip(got, want):
        assert_array_equal(a.view(np.int64), b.view(np.int64))


def _same_rows(probs, sampling, **kw):
    """Each problem alone and the batch: one record of T tensors a batch."""
    groups: dict[int, list] = {}
    for p in probs:
        groups.setdefault(len(p["mask"]), []).append(p)
    for ps in groups.values():
        args = _args(ps)
        _same(reuse.cache_hit_rates(*args, **kw, **sampling),
              reuse.cache_hit_rates(*args, pairs=False, **kw, **sampling))


@settings(max_examples=200, deadline=None)
@given(st.lists(paired_problem(), min_size=1, max_size=3), st.sampled_from(SAMPLINGS),
       st.booleans())
def test_merged_pair_equals_the_pair_to_the_bit(probs, sampling, column):
    # (column=False: the closed forms' problems simulated too, so merged as well)
    _same_rows(probs, sampling, column=column)


def test_pairs_are_merged_in_most_draws():
    """The property above exercises the merged path: most drawn problems have
    a pair (so a broken addend shows there)."""
    assert drawn_fraction(paired_problem(), _merged) > 0.4


def test_swiglu_like_problems_equal_to_the_bit():
    """gemm_epilogue's swiglu problems: A (reused along the columns), B and
    B_up (along the rows), the bias and residual once per tile; grouped and
    row orders, one to many waves, L1.5 on and off, L2 from tight to ample."""
    for g0, g1 in ((8, 28), (64, 112), (128, 56), (3, 200)):
        for order, group in ((ORDER_NAMES["grouped"], 8), (ORDER_NAMES["row"], 1)):
            for cap2, cap15 in ((5e7, 184320.0), (4e6, 184320.0), (4e6, 0.0), (2e5, 2e4)):
                p = dict(g0=g0, g1=g1, g2=1, order=order, group=group, conc=132, ksteps=64,
                         mask=[2, 1, 1, 0, 0, 0], per_step=[1, 1, 1, 0, 0, 0],
                         tbytes=[16384.0, 16384.0, 16384.0, 0.0, 0.0, 32768.0], cap2=cap2,
                         assoc2=16.0, nsm=132, g15=8 if cap15 else 0, cap15=cap15, assoc15=8.0)
                assert _merged(p)
                for sampling in SAMPLINGS:
                    _same_rows([p], sampling, column=False)
                    _same_rows([p], sampling)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 1), min_size=1, max_size=6), st.data())
def test_pair_tensors_against_the_twin(per_step, data):
    T = len(per_step)
    mask = data.draw(st.lists(st.sampled_from([0, 1, 2, 3, 5]), min_size=T, max_size=T))
    tb = data.draw(st.lists(st.sampled_from([0.0, 64.0, 64.5, 2048.0, 3e15]),
                            min_size=T, max_size=T))
    g0, g1, g2 = (data.draw(st.integers(1, 20)) for _ in range(3))
    want = naive.pair_tensors_one(per_step, tb, mask, g0, g1, g2)
    got = reuse._pair_tensors(np.array(per_step, dtype=np.int64), np.array(tb, dtype=np.float64),
                              np.array(mask, dtype=np.int64), g0 * g1 * g2, g0, g1, g2)
    assert tuple(got) == want
