"""The power-limited clock counted in waves of resident slots (warpgroup-MMA GPUs).

docs/gemm_accuracy.md, "Hopper co-resident tiles, session 12":
:func:`tsbatch.kernels.envelope.slot_clock` against its plain-Python twin
(``naive.slot_clock``) and against the lowering's rounds of tiles per SM
(``kernels_catalog.gemm.clock_factor``) for one resident tile; the matched
pair's property: at the same tiles per SM, a grid whose busiest SMs hold two
tiles at once gets a faster tensor rate than the same tiles in two rounds of
one, and full waves of pairs none.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import naive
from kernels_catalog import gemm
from tsbatch.boundary.schema import validate
from tsbatch.engine.evaluate import evaluate, evaluate_plan, get_family
from tsbatch.hw import get_hw
from tsbatch.kernels.envelope import N_RES, R_TC, evaluate_envelopes, slot_clock


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 100_000), st.integers(1, 200), st.integers(0, 8),
                          st.sampled_from([0.0, -1.0, 1.0, 1.0 / 0.75, 1.0 / 0.853, 1.5, 4.0])),
                min_size=1, max_size=30))
def test_slot_clock_matches_twin(rows):
    for tiles, sms, p, cap in rows:
        got = slot_clock(np.array([tiles]), sms, np.array([p]), np.array([cap]))[0]
        assert got == pytest.approx(naive.slot_clock(tiles, sms, p, cap), rel=1e-15), \
            (tiles, sms, p, cap)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 50_000), st.integers(1, 200), st.sampled_from([1.0 / 0.75, 1.0 / 0.853]))
def test_one_slot_is_the_lowerings_rounds_to_the_bit(tiles, sms, cap):
    """With one resident tile the waves of slots are the lowering's rounds of
    tiles per SM, and the factor equals ``gemm.clock_factor`` bit for bit (so
    that every p = 1 row keeps its prediction)."""
    rounds = -(-tiles // sms) if tiles > sms else 1
    busy = float(tiles - (rounds - 1) * sms if rounds > 1 else min(tiles, sms))
    want = gemm.clock_factor(rounds, busy, sms, cap)
    assert slot_clock(np.array([tiles]), sms, np.array([1]), np.array([cap]))[0] == want


def _tensor_only(tiles, p, sms, rate_tc, cap, share, ksteps=158, warps=4.0):
    """Latency of a grid whose tiles do tensor work only (no memory, no
    bookkeeping): the tensor rate alone, with the slot clock applied."""
    n = len(tiles)
    work_iter = np.zeros((n, N_RES))
    work_iter[:, R_TC] = 2.0 * 128 * 128 * 64
    rate = np.zeros((n, N_RES))
    rate[:, R_TC] = rate_tc
    z = np.zeros(n)
    out = evaluate_envelopes(work_iter, np.zeros((n, N_RES)), rate, np.asarray(tiles), sms,
                             np.asarray(p), np.full(n, ksteps), np.full(n, 3), np.full(n, warps),
                             4.0, z, z, z, np.zeros(n, dtype=np.int64), z,
                             share_eff=np.full(n, share), tc_cap=np.full(n, cap),
                             latency_only=True)
    return out["latency_us"]


def test_coresident_pair_faster_full_waves_not():
    """H100's rates: 144 tiles on 132 SMs, two tiles on the busiest SMs either at
    once (p = 2, one wave of slots) or in two rounds (p = 1). The co-resident
    grid's tensor rate is boosted to the measured peak (its last and only wave
    fills 144 of 264 slots), the sequential grid's by the lowering's rounds
    (2 / (1 + tc_efficiency)); with the warpgroups' sharing (0.95) the pair
    still finishes first. Full waves of pairs (264 x 3 tiles) get no boost and
    run at the shared rate: not faster than full waves of single tiles."""
    hw = get_hw("h100")
    sms, eff = hw.sm_count, hw.cal("tc_efficiency")
    share = hw.cal("wgmma_share_efficiency")
    assert sms == 132 and eff < 1.0 and share < 1.0
    rate_tc = hw.tc_tflops("bfloat16") * 1e6 / sms * eff  # per SM, power-limited
    co, seq = _tensor_only([144, 144], [2, 1], sms, rate_tc, 1.0 / eff, share)
    # two resident tiles share the SM's tensor cores (p x 4 warps > 4): 0.95
    seq_alone = _tensor_only([144], [1], sms, rate_tc, 1.0 / eff, 1.0)[0]
    assert co < seq == pytest.approx(seq_alone)
    step = 2.0 * 128 * 128 * 64 / rate_tc
    assert seq == pytest.approx(2 * 158 * step / (2.0 / (1.0 + eff)), rel=1e-12)
    assert co == pytest.approx(2 * 158 * step * eff / share, rel=1e-12)
    full_co, full_seq = _tensor_only([264 * 3, 264 * 3], [2, 1], sms, rate_tc, 1.0 / eff, share)
    assert full_co >= full_seq
    assert full_co == pytest.approx(6 * 158 * step / share, rel=1e-12)


def test_slot_clock_only_where_the_lowering_leaves_it():
    """The lowering leaves the boost to the envelope for Triton rows on
    warpgroup-MMA GPUs only: a library row on H100 and every row on A100 keep
    their lowered rate (no cap), and on A100 the plan carries none."""
    rows = [dict(m=1152, n=2048, k=10112, dtype="bfloat16", block_m=128, block_n=128, block_k=64,
                 num_stages=s, num_warps=4, backend=b) for s, b in ((3, "triton"), (5, "triton"),
                                                                     (3, "cublas"))]
    cols, is_lib = validate(pl.DataFrame(rows), get_family("gemm"))
    h = get_hw("h100")
    xcols, _parent = gemm.expand_library(cols, is_lib, h.arch)
    plan = gemm.lower(xcols, h)
    cap = plan.tc_clock_cap
    assert cap is not None
    lib = gemm._is_library(xcols["backend"])
    assert lib.any() and (~lib).sum() == 2
    assert (cap[~lib] == 1.0 / h.cal("tc_efficiency")).all()
    assert (cap[lib] == 0.0).all()
    a = get_hw("a100")
    xcols, _parent = gemm.expand_library(cols, is_lib, a.arch)
    assert gemm.lower(xcols, a).tc_clock_cap is None


def test_h100_pair_keeps_single_tiles_and_boosts_pairs():
    """End to end on H100 (1152 x 2048 x 10112, 128x128x64, 4 warps, 144 tiles):
    the sequential grid (5 stages, p = 1) is predicted as the lowering's rounds
    would (its tensor rate 2 / (1 + tc_efficiency) x the power-limited one), the
    co-resident grid (3 stages, p = 2) with its tensor rate at the measured peak:
    never slower than with the rounds' rate."""
    h = get_hw("h100")
    base = dict(m=1152, n=2048, k=10112, dtype="bfloat16", block_m=128, block_n=128,
                block_k=64, num_warps=4, a_row_major=False, b_row_major=True)
    df = pl.DataFrame([dict(base, num_stages=3), dict(base, num_stages=5)])
    res = evaluate(df, h)
    assert list(res["resident_tiles"]) == [2, 1]
    cols, _ = validate(df, get_family("gemm"))
    plan = gemm.lower(cols, h)
    eff = h.cal("tc_efficiency")
    f = slot_clock(plan.extra["tiles"], h.sm_count, np.array([2, 1]), plan.tc_clock_cap)
    assert f[0] == pytest.approx(1.0 / eff) and f[1] == pytest.approx(2.0 / (1.0 + eff))
    # the co-resident row with the rounds' factor instead (what the lowering
    # gave before): the slot clock only takes time away
    plan.tc_clock_cap = None
    plan.rate[0, R_TC] *= 2.0 / (1.0 + eff)
    plan.rate[1, R_TC] *= 2.0 / (1.0 + eff)
    old = evaluate_plan(plan, h, latency_only=True)["latency_us"]
    new = res["latency_us"].to_numpy()
    assert new[1] == pytest.approx(old[1], rel=1e-12)
    assert new[0] <= old[0] * (1.0 + 1e-12)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 3000), st.integers(1, 4), st.integers(1, 400),
                          st.sampled_from([0.0, 1.0 / 0.75, 1.0 / 0.853])),
                min_size=1, max_size=12))
def test_envelopes_scale_the_tensor_rate_and_put_it_back(rows):
    """``evaluate_envelopes(..., tc_cap=...)`` gives to the bit what the same
    call gives with the tensor-core rates multiplied by :func:`slot_clock`
    beforehand, and leaves the caller's rates as they were."""
    n = len(rows)
    tiles = np.array([r[0] for r in rows], dtype=np.int64)
    p = np.array([r[1] for r in rows], dtype=np.int64)
    ksteps = np.array([r[2] for r in rows], dtype=np.int64)
    cap = np.array([r[3] for r in rows])
    rng = np.random.default_rng(len(rows))
    work_iter = rng.uniform(0.0, 1e6, (n, N_RES))
    work_epi = rng.uniform(0.0, 1e5, (n, N_RES))
    rate = rng.uniform(1e3, 1e7, (n, N_RES))
    keep = rate.copy()
    z = np.full(n, 0.01)
    args = (work_epi, tiles, 132, p, ksteps, np.full(n, 3), np.full(n, 4.0), 4.0, np.full(n, 0.6),
            z, z, np.zeros(n, dtype=np.int64), np.full(n, 4.5))
    got = evaluate_envelopes(work_iter, args[0], rate, *args[1:], share_eff=np.full(n, 0.95),
                             tc_cap=cap)
    assert np.array_equal(rate, keep)
    pre = rate.copy()
    pre[:, R_TC] = pre[:, R_TC] * slot_clock(tiles, 132, p, cap)
    want = evaluate_envelopes(work_iter, args[0], pre, *args[1:], share_eff=np.full(n, 0.95))
    for key in ("latency_us", "t_prologue_us", "t_steady_us", "t_epilogue_us", "util"):
        assert np.array_equal(got[key], want[key], equal_nan=True), key
