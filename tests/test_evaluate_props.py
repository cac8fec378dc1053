"""Properties of the whole evaluator, ``evaluate(df, hw)``, on random GEMM batches.

* batched equals row by row, bit for bit (cache problems are deduplicated
  per distinct key, and each is computed the same way alone or in a batch);
* shuffling the rows changes no row's result;
* latency never falls when a bandwidth or a peak rate of the GPU is lowered;
* infeasible rows come back ``feasible=False`` with a reason, never raise;
* the result survives a Parquet round trip exactly.
"""

from __future__ import annotations

import dataclasses
import io

import numpy as np
import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal
from strategies import frame, gemm_frames, infeasible_gemm_row

from tsbatch.engine.evaluate import evaluate
from tsbatch.hw import HwSpec, get_hw

GPUS = st.sampled_from(["h100", "a100"])

#: rates a GPU file gives, each of which only ever slows a kernel down when lowered
#: (clock_mhz: the shared-memory rate, and per-cycle overheads become longer)
RATE_KEYS = ("dram_bw_tbps", "l2_bw_tbps", "l15_bw_tbps", "tc_fp16_tflops", "tc_bf16_tflops",
             "tc_tf32_tflops", "tc_fp8_tflops", "fp32_tflops", "clock_mhz")

#: latency comparisons across two evaluations: rates enter as divisors under
#: numba fastmath (reassociation), so equal inputs can differ in the last ulps
LATENCY_RTOL = 1e-12


#: rates a GPU file states at its clock (``clock_mhz``): a lower clock lowers them
#: too. (The clock lowered alone is checked by
#: :func:`test_a_lower_clock_alone_never_speeds_up_the_cuda_cores`: the CUDA
#: cores' boost ceiling is taken over the clock their rate is stated at,
#: ``HwSpec.fp32_clock_mhz``, which a hand-lowered clock leaves where it was.)
AT_CLOCK = {"clock_mhz": ("fp32_tflops",)}


def slower(hw: HwSpec, key: str, factor: float) -> HwSpec:
    """``hw`` with one rate scaled by ``factor`` < 1, in the spec and in
    ``[measured]`` (``rate()`` prefers the measured value); the clock together
    with the rates stated at it (:data:`AT_CLOCK`)."""
    measured = dict(hw.measured)
    changed = {}
    for k in (key, *AT_CLOCK.get(key, ())):
        if k in measured:
            measured[k] *= factor
        changed[k] = getattr(hw, k) * factor
    return dataclasses.replace(hw, **changed, measured=measured)


@settings(max_examples=25, deadline=None)
@given(gemm_frames(1, 6), GPUS)
def test_batched_equals_row_by_row(df, gpu):
    batch = evaluate(df, gpu)
    alone = pl.concat([evaluate(df[i:i + 1], gpu) for i in range(df.height)])
    assert_frame_equal(batch, alone, check_exact=True)


@settings(max_examples=25, deadline=None)
@given(gemm_frames(2, 8), st.randoms(use_true_random=False))
def test_row_order_changes_no_row(df, rnd):
    perm = list(range(df.height))
    rnd.shuffle(perm)
    assert_frame_equal(evaluate(df[perm], "h100"), evaluate(df, "h100")[perm], check_exact=True)


@settings(max_examples=40, deadline=None)
@given(gemm_frames(1, 6), GPUS, st.sampled_from(RATE_KEYS), st.floats(0.05, 0.95))
def test_latency_never_falls_when_a_rate_is_lowered(df, gpu, key, factor):
    hw = get_hw(gpu)
    base = evaluate(df, hw)
    slow = evaluate(df, slower(hw, key, factor))
    assert (base["feasible"] == slow["feasible"]).all()
    a = base["latency_us"].to_numpy()
    b = slow["latency_us"].to_numpy()
    ok = np.isnan(a) | (b >= a * (1.0 - LATENCY_RTOL))
    assert ok.all(), (key, factor, a[~ok], b[~ok])


def test_slower_dram_never_hides_more_than_a_floor_bound_wave_drained():
    """The case hypothesis found in CI (a100, DRAM at half rate): a first wave held
    at its latency + busiest-resource floor does not get longer when its stores
    do, so what the next wave runs its prologue under is what the first still has
    in flight when its last compute step ends, stores and the floor's excess
    together (which does not grow); hiding the grown stores alone made the grid
    1e-5 us faster with slower DRAM."""
    row = dict(m=580, n=2566, k=1, dtype="bfloat16", a_row_major=False, b_row_major=False,
               tf32=False, backend="triton", block_m=16, block_n=16, block_k=64, num_stages=1,
               num_warps=1, group_m=1, raster="col", split_k=1)
    hw = get_hw("a100")
    base = evaluate(pl.DataFrame([row]), hw)["latency_us"][0]
    for factor in (0.5, 0.25, 0.1):
        slow = evaluate(pl.DataFrame([row]), slower(hw, "dram_bw_tbps", factor))["latency_us"][0]
        assert slow >= base * (1.0 - LATENCY_RTOL), (factor, base, slow)


def test_a_lower_clock_never_speeds_up_a_boosted_small_call():
    """The case the property above found (h100, one tile on 132 SMs, so its
    CUDA cores and shared memory run at the power-limited boost up to
    ``max_clock_mhz``): the clock lowered with the rates stated at it never
    makes the call faster, on every GPU with a maximum clock."""
    row = dict(m=1, n=1, k=1, dtype="bfloat16", a_row_major=True, b_row_major=True,
               tf32=False, backend="cublas")
    for gpu in ("h100", "h200", "a100"):
        hw = get_hw(gpu)
        base = evaluate(pl.DataFrame([row]), hw)["latency_us"][0]
        for factor in (0.95, 0.875, 0.5):
            slow = evaluate(pl.DataFrame([row]), slower(hw, "clock_mhz", factor))["latency_us"][0]
            assert slow >= base * (1.0 - LATENCY_RTOL), (gpu, factor, base, slow)


def test_a_lower_clock_alone_never_speeds_up_the_cuda_cores():
    """The clock lowered alone (``fp32_tflops`` kept, as a hand-edited GPU file
    would): the CUDA cores' boost ceiling is taken over the clock their rate is
    stated at (``HwSpec.fp32_clock_mhz``), so it does not rise as the clock
    falls. Before, an IEEE FP32 library call on one wave's worth of tiles ran
    faster at a slower clock (h100 64 x 6976 x 1024: 26.15 -> 25.19 us at 0.9x),
    and so did A100 FMA-dot Triton rows (1,178 falls in a 3,000-row probe)."""
    rows = [dict(m=64, n=6976, k=1024, dtype="float32", a_row_major=True, b_row_major=False,
                 tf32=False, backend="cublas"),
            dict(m=8, n=12288, k=4096, dtype="float32", a_row_major=True, b_row_major=False,
                 tf32=False, backend="cublas"),
            dict(m=32, n=4096, k=64, dtype="float32", a_row_major=True, b_row_major=False,
                 tf32=False, backend="triton", block_m=32, block_n=64, block_k=16, num_stages=2,
                 num_warps=4, group_m=8, raster="grouped", split_k=1)]
    df = frame(rows)
    for gpu in ("h100", "h200", "a100"):
        hw = get_hw(gpu)
        assert hw.fp32_clock_mhz == hw.rate("clock_mhz") and hw.fp32_clock_cap == hw.clock_cap
        base = evaluate(df, hw)["latency_us"].to_numpy()
        for factor in (0.95, 0.9, 0.5):
            measured = {**hw.measured, "clock_mhz": hw.rate("clock_mhz") * factor}
            slow_hw = dataclasses.replace(hw, clock_mhz=hw.clock_mhz * factor, measured=measured)
            assert slow_hw.fp32_clock_cap == hw.fp32_clock_cap and slow_hw.clock_cap > hw.clock_cap
            slow = evaluate(df, slow_hw)["latency_us"].to_numpy()
            assert (slow >= base * (1.0 - LATENCY_RTOL)).all(), (gpu, factor, base, slow)


def test_lowering_the_fp16_peak_slows_fp16_only():
    """A hand check that the property above has teeth: halving fp16 (spec and
    measured) slows a compute-bound fp16 GEMM and leaves bf16 alone."""
    df = frame([dict(m=8192, n=8192, k=8192, dtype=d, a_row_major=True, b_row_major=True,
                     tf32=False, backend="triton", block_m=128, block_n=256, block_k=64,
                     num_stages=3, num_warps=8, group_m=8, raster="grouped", split_k=1)
                for d in ("float16", "bfloat16")])
    hw = get_hw("h100")
    a = evaluate(df, hw)["latency_us"].to_numpy()
    b = evaluate(df, slower(hw, "tc_fp16_tflops", 0.5))["latency_us"].to_numpy()
    assert b[0] > 1.5 * a[0]
    assert b[1] == a[1]


def test_the_documented_infeasible_row():
    """Block 256x256x128 with 5 stages in fp32: 1.25 MiB of shared memory."""
    row = dict(m=4096, n=4096, k=4096, dtype="float32", a_row_major=True, b_row_major=True,
               tf32=True, backend="triton", block_m=256, block_n=256, block_k=128,
               num_stages=5, num_warps=8, group_m=8, raster="grouped", split_k=1)
    out = evaluate(frame([row]), "h100")
    assert out["feasible"].to_list() == [False]
    assert "shared memory" in out["infeasible_reason"][0]
    assert out["latency_us"].to_list() == [None]


@settings(max_examples=25, deadline=None)
@given(st.lists(infeasible_gemm_row(), min_size=1, max_size=3), gemm_frames(0, 3, library=False),
       GPUS, st.randoms(use_true_random=False))
def test_infeasible_rows_are_flagged_not_raised(bad, good, gpu, rnd):
    rows = bad + good.to_dicts()
    rnd.shuffle(rows)
    out = evaluate(frame(rows), gpu)
    is_bad = np.array([r in bad for r in rows])
    feasible = out["feasible"].to_numpy()
    assert not feasible[is_bad].any()
    reasons = out["infeasible_reason"].to_list()
    lat = out["latency_us"].to_list()
    for i in range(len(rows)):
        if not feasible[i]:
            assert reasons[i], i
            assert lat[i] is None
        else:
            assert reasons[i] == "" and lat[i] is not None and lat[i] > 0


@settings(max_examples=25, deadline=None)
@given(gemm_frames(1, 6), GPUS)
def test_parquet_round_trip_is_exact(df, gpu):
    out = evaluate(df, gpu)
    buf = io.BytesIO()
    out.write_parquet(buf)
    buf.seek(0)
    back = pl.read_parquet(buf)
    assert back.schema == out.schema
    assert_frame_equal(back, out, check_exact=True)
