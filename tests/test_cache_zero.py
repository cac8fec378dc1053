"""Per-step tensors of zero bytes in ``reuse.cache_hit_rates`` (``drop_zero``).

A program's tensor that a configuration turns off (an epilogue's second B
tile, a norm's re-read of a row held in registers, a MoE kernel's share of
the other experts' weights) is a per-step tensor of zero bytes. It moves
nothing: it gets ``(0, 0, 1)``, and its accesses are left out of the
sequence where the other tensors' results stay the same to the bit
(``reuse._live_tensors``). These tests hold every other tensor's results
equal, bit for bit, to the sequence that keeps its accesses
(``drop_zero=False``), on the fast and the general path with the closed
forms off (``column=False``), and to the closed forms' tolerance with them
on (a kept zero tensor can bar a closed form: then one side is the closed
form and the other the simulation, equal to rounding); and the twin
(``tests/naive.py``) equal where the union is exact.
"""

from __future__ import annotations

import naive
import numpy as np
from closed_forms import FAST_ATOL, FAST_RTOL
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.testing import assert_allclose, assert_array_equal

from tsbatch.kernels import reuse
from tsbatch.kernels.order import ORDER_NAMES

SAMPLINGS = (
    dict(k_samples=4, max_waves=8, max_lookback=4),  # evaluate's defaults
    dict(k_samples=3, max_waves=16),
    dict(k_samples=4, max_waves=2, max_lookback=1 << 30),
)
ORDERS = sorted(ORDER_NAMES.values())


def _args(p: dict) -> tuple:
    one = lambda k: [p[k]]  # noqa: E731
    return (one("g0"), one("g1"), one("g2"), one("order"), one("group"), one("conc"),
            one("ksteps"), [p["mask"]], [p["per_step"]], [p["tbytes"]], one("cap2"),
            one("assoc2"), one("nsm"), one("g15"), one("cap15"), one("assoc15"))


@st.composite
def zero_problem(draw, big: bool = False) -> dict:
    """2-5 tensors, at least one per-step tensor of bytes and one of zero bytes,
    any reuse masks. ``big``: H100-sized waves and groups (132 SMs, 8-SM L1.5
    groups) on grids up to 60 x 60, where the L1.5 pattern pool fills."""
    T = draw(st.integers(2, 5))
    mask = [draw(st.integers(0, 7)) for _ in range(T)]
    per_step = [1, 1] + [draw(st.integers(0, 1)) for _ in range(T - 2)]
    sizes = [64.0, 128.0, 512.0, 2048.0, 8192.0]
    tb = [draw(st.sampled_from(sizes)), 0.0] + [
        draw(st.sampled_from(sizes + [0.0])) for _ in range(T - 2)]
    perm = draw(st.permutations(range(T)))
    mask, per_step, tb = ([x[i] for i in perm] for x in (mask, per_step, tb))
    if big:
        g0, g1, g2 = draw(st.integers(1, 60)), draw(st.integers(1, 60)), draw(st.integers(1, 2))
        nsm, g15 = 132, 8
        conc = 132 * draw(st.integers(1, 4))
        ksteps = draw(st.integers(1, 200))
    else:
        g0, g1, g2 = draw(st.integers(1, 8)), draw(st.integers(1, 8)), draw(st.integers(1, 3))
        nsm = draw(st.integers(1, 12))
        g15 = draw(st.sampled_from([0, 1, 2, 3, 4]))
        conc = nsm * draw(st.integers(1, 3))
        ksteps = draw(st.integers(1, 5))
    unit = max(tb)
    return dict(g0=g0, g1=g1, g2=g2, order=draw(st.sampled_from(ORDERS)),
                group=draw(st.sampled_from([1, 2, 3, 8])), conc=conc, ksteps=ksteps,
                mask=mask, per_step=per_step, tbytes=tb,
                cap2=draw(st.floats(2.0, 2000.0)) * unit,
                assoc2=float(draw(st.sampled_from([1, 2, 4, 16]))), nsm=nsm, g15=g15,
                cap15=draw(st.floats(1.0, 30.0)) * unit,
                assoc15=float(draw(st.sampled_from([2, 4, 8]))))


def _bits(a):
    return np.ascontiguousarray(a).view(np.int64)


def _check(p: dict, sampling: dict) -> None:
    args = _args(p)
    zero = np.array([s != 0 and b == 0.0 for s, b in zip(p["per_step"], p["tbytes"])])
    for general in (False, True):
        for column in (False, True):
            kept = reuse.cache_hit_rates(*args, general=general, drop_zero=False,
                                         column=column, **sampling)
            left = reuse.cache_hit_rates(*args, general=general, column=column, **sampling)
            for a, b, moved in zip(kept, left, (0.0, 0.0, 1.0)):
                if column:
                    # a zero tensor the sequence keeps can bar the closed forms
                    # (its key dimensions), so one side may be the closed form
                    # and the other the simulation: equal to their tolerance
                    assert_allclose(a[0][~zero], b[0][~zero], rtol=FAST_RTOL, atol=FAST_ATOL)
                else:
                    assert_array_equal(_bits(a[0][~zero]), _bits(b[0][~zero]))
                assert_array_equal(b[0][zero], moved)


@settings(max_examples=200, deadline=None)
@given(zero_problem(), st.sampled_from(SAMPLINGS))
def test_zero_tensors_change_no_other_result(p, sampling):
    _check(p, sampling)


@settings(max_examples=40, deadline=None)
@given(zero_problem(big=True), st.sampled_from(SAMPLINGS))
def test_zero_tensors_change_no_other_result_h100_like(p, sampling):
    _check(p, sampling)


def test_zero_tensor_with_a_full_pattern_pool():
    """Grids whose L1.5 group patterns fill the pattern pool (MoE-like, the
    experts as planes, a tile-keyed zero tensor beside A and B; found among
    bench sweeps' problems): a stored group's probabilities
    are summed before they are added, so the pool must store the patterns it
    would with the zero tensor's accesses (``_group_l15``'s room ``mp``)."""
    for g1, g2, conc, ksteps in ((64, 32, 1056, 112), (64, 8, 924, 224), (96, 8, 1056, 256)):
        p = dict(g0=9, g1=g1, g2=g2, order=ORDER_NAMES["col"], group=8, conc=conc,
                 ksteps=ksteps, mask=[0, 2, 1, 0, 0], per_step=[0, 1, 1, 1, 0],
                 tbytes=[64.0, 2048.0, 8192.0, 0.0, 2048.0], cap2=52428800.0, assoc2=16.0,
                 nsm=132, g15=8, cap15=184320.0, assoc15=8.0)
        _check(p, SAMPLINGS[0])


def test_fractional_bytes_keep_the_zero_tensor_in_the_sequence():
    """A block size that is not an integer: sums may round otherwise when their
    terms move, so the zero tensor stays in the sequence (its rates still
    ``(0, 0, 1)``), the others' results those of ``drop_zero=False``."""
    p = dict(g0=40, g1=30, g2=1, order=ORDER_NAMES["grouped"], group=8, conc=264, ksteps=16,
             mask=[2, 1, 1, 0], per_step=[1, 1, 1, 0], tbytes=[2042.0175, 4096.0, 0.0, 4096.0],
             cap2=2e7, assoc2=16.0, nsm=132, g15=8, cap15=184320.0, assoc15=8.0)
    _check(p, SAMPLINGS[0])
    per_step = np.array(p["per_step"], dtype=np.int64)
    assert_array_equal(reuse._live_tensors(per_step, np.array(p["tbytes"]),
                                           np.array(p["mask"]), 1200, 40, 30, 1), per_step)


def test_live_tensors_rules():
    ps = np.array([1, 1, 1, 0], dtype=np.int64)
    tb = np.array([512.0, 1024.0, 0.0, 64.0])
    live = lambda mask, g=(8, 8, 1), tbytes=tb: reuse._live_tensors(  # noqa: E731
        ps, tbytes, np.array(mask, dtype=np.int64), g[0] * g[1] * g[2], *g)
    assert_array_equal(live([2, 1, 0, 0]), [1, 1, 0, 0])  # a block per tile
    assert_array_equal(live([2, 1, 1, 0]), [1, 1, 0, 0])  # B's reuse
    assert_array_equal(live([2, 1, 4, 0]), [1, 1, 0, 0])  # reuse along a dimension of one tile
    assert_array_equal(live([2, 1, 3, 0]), [1, 1, 1, 0])  # labels of their own: kept
    assert_array_equal(live([2, 1, 0, 0], tbytes=np.array([0.0, 0.0, 0.0, 64.0])), [1, 1, 1, 0])
    assert_array_equal(live([2, 1, 0, 0], g=(1 << 20, 1 << 20, 1)), [1, 1, 1, 0])  # sums past 2^50


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 5), st.integers(1, 5), st.sampled_from(ORDERS), st.integers(1, 4),
       st.sampled_from([0, 1, 2]), st.booleans())
def test_zero_tensor_against_the_twin(g0, g1, order, ksteps, zmask, l15):
    """One wave (the union exact): the kernel as the twin, which keeps the zero
    tensor's accesses in its sequence and gives it ``(0, 0, 1)``."""
    P = g0 * g1
    p = dict(g0=g0, g1=g1, g2=1, order=order, group=2, conc=P + 1, ksteps=ksteps,
             mask=[2, 1, zmask, 0], per_step=[1, 1, 1, 0], tbytes=[512.0, 1024.0, 0.0, 256.0],
             cap2=40.0 * 768.0, assoc2=4.0, nsm=4 if l15 else 1, g15=2 if l15 else 0,
             cap15=6.0 * 768.0 if l15 else 0.0, assoc15=4.0)
    got = np.array([r[0] for r in reuse.cache_hit_rates(*_args(p), k_samples=ksteps,
                                                         max_waves=1 << 30)])
    want = np.array(naive.cache_hit_rates_one(
        p["g0"], p["g1"], p["g2"], p["order"], p["group"], p["conc"], p["ksteps"], p["mask"],
        p["per_step"], p["tbytes"], p["cap2"], p["assoc2"], p["nsm"], p["g15"], p["cap15"],
        p["assoc15"]))
    assert_allclose(got, want, rtol=0, atol=1e-11)
    assert_array_equal(got[:, 2], [0.0, 0.0, 1.0])


# ----------------------------------------------------------------------
# waves only book-kept, non-integer block sizes (``seq_book``)
# ----------------------------------------------------------------------
@st.composite
def fractional_problem(draw) -> dict:
    """Panel orders, H100-sized waves, block sizes that are not integers (an
    edge tile's average rows, a MoE tile's average tokens), 2-4 per-step
    tensors reused along rows or columns, enough waves to book-keep some."""
    T = draw(st.integers(2, 4))
    mask = [draw(st.sampled_from([1, 2, 3, 5, 6])) for _ in range(T)]
    per_step = [1, 1] + [draw(st.integers(0, 1)) for _ in range(T - 2)]
    tb = [draw(st.floats(16.0, 9000.0)) for _ in range(T)]
    g0, g1 = draw(st.integers(1, 70)), draw(st.integers(1, 70))
    return dict(g0=g0, g1=g1, g2=draw(st.integers(1, 3)),
                order=draw(st.sampled_from([ORDER_NAMES[o] for o in ("row", "col", "grouped",
                                                                      "persistent")])),
                group=draw(st.sampled_from([1, 2, 4, 8])), conc=132 * draw(st.integers(1, 3)),
                ksteps=draw(st.integers(1, 100)), mask=mask, per_step=per_step, tbytes=tb,
                cap2=draw(st.sampled_from([2e5, 4e6, 5e7])), assoc2=16.0, nsm=132,
                g15=draw(st.sampled_from([0, 8])), cap15=184320.0, assoc15=8.0)


@settings(max_examples=120, deadline=None)
@given(fractional_problem(), st.sampled_from(SAMPLINGS))
def test_seq_book_keeping_equals_the_per_access_pass(p, sampling):
    args = _args(p)
    want = reuse.cache_hit_rates(*args, seq_book=False, **sampling)
    got = reuse.cache_hit_rates(*args, **sampling)
    for a, b in zip(want, got):
        assert_array_equal(_bits(a), _bits(b))


def test_seq_book_keeping_on_a_long_grid():
    """An epilogue-like grid of 24 waves (8 analysed, the rest book-kept), A's
    block the average of a ragged edge (4097 rows in 33 tiles of 128)."""
    p = dict(g0=33, g1=224, g2=1, order=ORDER_NAMES["grouped"], group=8, conc=396, ksteps=64,
             mask=[2, 1, 1, 0], per_step=[1, 1, 1, 0],
             tbytes=[4097 / 33 * 64 * 2, 128 * 64 * 2, 128 * 64 * 2, 128 * 128 * 2],
             cap2=5e7 * 0.5, assoc2=16.0, nsm=132, g15=8, cap15=184320.0, assoc15=8.0)
    for sampling in SAMPLINGS:
        want = reuse.cache_hit_rates(*_args(p), seq_book=False, **sampling)
        got = reuse.cache_hit_rates(*_args(p), **sampling)
        for a, b in zip(want, got):
            assert_array_equal(_bits(a), _bits(b))


def test_zero_tensor_barring_a_closed_form():
    """A kept zero tensor whose key dimensions bar :func:`reuse._cache_planes`
    (found by hypothesis): the dropped sequence takes the closed form, the kept
    one the simulation; their L2 hit rates differ in the last bit, the
    simulation's with and without the zero tensor not at all."""
    p = dict(g0=1, g1=2, g2=2, order=ORDER_NAMES["row"], group=1, conc=4, ksteps=1,
             mask=[2, 0, 2], per_step=[1, 1, 1], tbytes=[64.0, 0.0, 64.0], cap2=128.0,
             assoc2=1.0, nsm=4, g15=3, cap15=192.0, assoc15=2.0)
    _check(p, SAMPLINGS[0])
