"""The power-limited clock taken by waves of resident slots (warpgroup-MMA GPUs).

docs/gemm_accuracy.md, "The power-limited clock by waves, session 13":
:func:`tsbatch.kernels.envelope.wave_time` with a tail-wave clock (``tail_tc``,
``tail_smem``, ``tail_cuda``) against its plain-Python twin ``naive.wave_time``;
the lowering leaves the clock to the envelope for Triton tensor-core rows on
warpgroup-MMA GPUs only; full waves keep the rates given; the last wave is
never faster than its share of the slots of a full wave; the L1.5 share of an
uneven wave; the measured matched pair's order (co-resident before sequential).
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
from tsbatch.engine.evaluate import evaluate, get_family
from tsbatch.hw import get_hw
from tsbatch.kernels.envelope import (
    COMPUTE, N_RES, R_CUDA, R_L15, R_SMEM, R_TC, SHARED, _l15_share, evaluate_envelopes,
)


def _case(seed, n):
    rng = np.random.default_rng(seed)
    tiles = rng.integers(1, 3000, n)
    p = rng.integers(1, 5, n)
    ksteps = rng.integers(1, 300, n)
    stages = rng.integers(1, 6, n)
    work_iter = rng.uniform(0.0, 1e5, (n, N_RES)) * (rng.uniform(size=(n, N_RES)) < 0.8)
    work_epi = rng.uniform(0.0, 1e5, (n, N_RES)) * (rng.uniform(size=(n, N_RES)) < 0.6)
    rate = rng.uniform(1e3, 1e7, (n, N_RES))
    caps = rng.choice([0.0, 1.0 / 0.75, 1.0 / 0.853, 2.0], n)
    smem = np.where(caps > 0.0, rng.uniform(1.0, 1.2, n), 1.0)
    cuda = np.where(caps > 0.0, rng.uniform(1.0, 1.2, n), 1.0)
    return dict(tiles=tiles, p=p, ksteps=ksteps, stages=stages, work_iter=work_iter,
                work_epi=work_epi, rate=rate, caps=caps, smem=smem, cuda=cuda,
                warps=rng.choice([1.0, 2.0, 4.0, 8.0], n), lat=rng.uniform(0.0, 1.0, n),
                ovh=rng.uniform(0.0, 0.1, n), ovh_tile=rng.uniform(0.0, 0.5, n),
                share=rng.choice([1.0, 0.95], n), sync=rng.uniform(0.0, 0.1, n) * (rng.uniform(size=n) < 0.3),
                sms=int(rng.choice([8, 66, 132])))


def _run(c, tc_cap=True):
    n = len(c["tiles"])
    return evaluate_envelopes(c["work_iter"], c["work_epi"], c["rate"], c["tiles"], c["sms"],
                              c["p"], c["ksteps"], c["stages"], c["warps"], 4.0, c["lat"],
                              c["ovh"], c["ovh_tile"], np.zeros(n, dtype=np.int64), np.zeros(n),
                              share_eff=c["share"], sync=c["sync"],
                              tc_cap=c["caps"] if tc_cap else None,
                              smem_cap=c["smem"] if tc_cap else None,
                              cuda_cap=c["cuda"] if tc_cap else None)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_tail_wave_clock_matches_twin(seed):
    """The kernel's grid time with the tail-wave clock equals the plain-Python
    twin's, and the caller's rates are as they were."""
    c = _case(seed, 16)
    keep = c["rate"].copy()
    got = _run(c)
    assert np.array_equal(c["rate"], keep)
    for i in range(len(c["tiles"])):
        want = naive.wave_time(list(c["work_iter"][i]), list(c["work_epi"][i]), list(c["rate"][i]),
                               SHARED.tolist(), COMPUTE.tolist(), int(c["tiles"][i]), c["sms"],
                               int(c["p"][i]), int(c["ksteps"][i]), int(c["stages"][i]),
                               float(c["warps"][i]), 4.0, float(c["lat"][i]), float(c["ovh"][i]),
                               float(c["ovh_tile"][i]), 0, float(c["share"][i]),
                               float(c["sync"][i]), tail_tc=float(c["caps"][i]),
                               tail_smem=float(c["smem"][i]), tail_cuda=float(c["cuda"][i]))
        for key, w in zip(("latency_us", "t_prologue_us", "t_steady_us", "t_epilogue_us"), want):
            assert got[key][i] == pytest.approx(w, rel=1e-9, abs=1e-9), (key, i)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_no_cap_and_whole_waves_are_unchanged(seed):
    """Rows without a cap, and grids of whole waves of slots (no tail), take the
    same time as without the tail-wave clock, to the bit."""
    c = _case(seed, 16)
    c["tiles"][::2] = c["sms"] * c["p"][::2] * (1 + c["tiles"][::2] % 4)
    c["caps"][1::4] = 0.0
    got = _run(c)["latency_us"]
    want = _run(c, tc_cap=False)["latency_us"]
    same = (c["caps"] <= 0.0) | (c["tiles"] % (c["sms"] * c["p"]) == 0)
    assert np.array_equal(got[same], want[same])


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_tail_never_below_its_share_of_a_full_wave(seed):
    """A grid of one partly filled wave takes at least ``tiles / (sms p)`` of a
    full wave at the rates given (the chip's power over the wave), and never
    more than the same wave at those rates."""
    c = _case(seed, 16)
    c["tiles"] = np.minimum(c["tiles"], c["sms"] * c["p"] - 1)
    c["tiles"] = np.maximum(c["tiles"], 1)
    c["caps"] = np.where(c["caps"] > 0.0, c["caps"], 1.0 / 0.75)
    got = _run(c)["latency_us"]
    slow = _run(c, tc_cap=False)["latency_us"]
    full = dict(c, tiles=c["sms"] * c["p"])
    one = _run(full, tc_cap=False)["latency_us"]
    share = c["tiles"] / (c["sms"] * c["p"])
    assert (got >= one * share * (1.0 - 1e-12)).all()
    assert (got <= slow * (1.0 + 1e-12)).all()


@given(st.integers(1, 5000), st.integers(1, 200))
def test_l15_share(tail, sms):
    """1 where every busy SM holds as many tiles as the busiest (one tile, or an
    even wave), else the busiest SMs' tiles over the mean, below 2."""
    pt = -(-tail // sms)
    f = _l15_share(tail, sms, pt)
    assert 1.0 <= f < 2.0
    if tail <= sms or tail % sms == 0:
        assert f == 1.0
    else:
        assert f == pytest.approx(pt * sms / tail)


def test_caps_only_where_the_lowering_leaves_the_clock():
    """Triton tensor-core rows on warpgroup-MMA GPUs carry the caps (the tensor
    rate's 1 / tc_efficiency, the shared memory's and CUDA cores' up to their
    maximum clock) with their rates unboosted; a library row, an IEEE FP32 (FMA)
    row and every row on A100 carry none."""
    rows = [dict(m=1152, n=2048, k=10112, dtype=d, block_m=128, block_n=128, block_k=32,
                 num_stages=3, num_warps=4, backend=b)
            for d, b in (("bfloat16", "triton"), ("float32", "triton"), ("bfloat16", "cublas"))]
    cols, is_lib = validate(pl.DataFrame(rows), get_family("gemm"))
    h = get_hw("h100")
    xcols, _parent = gemm.expand_library(cols, is_lib, h.arch)
    plan = gemm.lower(xcols, h)
    lib = gemm._is_library(xcols["backend"])
    fma = np.asarray(plan.extra["mma_path"]) == "fma"
    tc = ~lib & ~fma
    eff = h.cal("tc_efficiency")
    assert tc.sum() == 1 and fma.sum() == 1
    assert (plan.tc_clock_cap[tc] == 1.0 / eff).all()
    assert (plan.smem_clock_cap[tc] == min(1.0 / eff, h.clock_cap)).all()
    assert (plan.cuda_clock_cap[tc] == min(1.0 / eff, h.fp32_clock_cap)).all()
    assert (plan.tc_clock_cap[~tc] == 0.0).all()
    # the tensor-core row's shared-memory rate is the measured clock's, unboosted
    assert plan.rate[tc, R_SMEM][0] == h.smem_bytes_per_clk * h.rate("clock_mhz")
    a = get_hw("a100")
    xcols, _parent = gemm.expand_library(cols, is_lib, a.arch)
    assert gemm.lower(xcols, a).tc_clock_cap is None


def test_h100_pair_order():
    """End to end on H100, 1152 x 2048 x 10112, 128x128x64, 144 tiles: the grid
    whose busiest SMs hold their two tiles at once (3 stages, p = 2, one partly
    filled wave of slots) is predicted faster than the same tiles in two rounds
    of one (5 stages, p = 1), as measured (105-107 against 126-131 us), at 4
    and 8 warps."""
    h = get_hw("h100")
    base = dict(m=1152, n=2048, k=10112, dtype="bfloat16", block_m=128, block_n=128,
                block_k=64, a_row_major=True, b_row_major=False)
    df = pl.DataFrame([dict(base, num_stages=s, num_warps=w) for w in (4, 8) for s in (3, 5)])
    res = evaluate(df, h)
    assert list(res["resident_tiles"]) == [2, 1, 2, 1]
    t = res["latency_us"].to_numpy()
    assert t[0] < t[1] and t[2] < t[3]
