"""The GEMM lowering kernel (``kernels_catalog.gemm._lower_rows``, through
``lower``) against its plain-Python twin, row by row, on every GPU file."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import naive
import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels_catalog import gemm
from tsbatch.engine.evaluate import evaluate, get_family
from tsbatch.hw import get_hw, list_hw
from tsbatch.kernels.envelope import R_CUDA, R_DRAM, R_L2, R_SMEM, R_TC
from tsbatch.boundary.schema import validate

pow2 = lambda lo, hi: st.integers(lo, hi).map(lambda e: 2 ** e)  # noqa: E731

row = st.fixed_dictionaries({
    "m": st.integers(1, 70000), "n": st.integers(1, 70000), "k": st.integers(1, 70000),
    "block_m": pow2(3, 9), "block_n": pow2(3, 9), "block_k": pow2(3, 8),
    "num_stages": st.integers(1, 8), "num_warps": pow2(0, 6), "split_k": st.integers(1, 16),
    "dtype": st.sampled_from(sorted(naive.GEMM_DTYPES)), "tf32": st.booleans(),
    "a_row_major": st.booleans(), "b_row_major": st.booleans(),
    "triton_version": st.sampled_from(["3.0", "3.1.0", "3.2", "3.3", "3.6.0", "3.10+git"]),
})


def _check(rows: list[dict], hw) -> None:
    cols, _ = validate(pl.DataFrame(rows), get_family("gemm"))
    plan = gemm.lower(cols, hw)
    blocked = gemm.admit(cols)  # rows Triton cannot build are lowered from placeholders
    for i, r in enumerate(rows):
        if blocked[i]:
            assert min(r["block_m"], r["block_n"], r["block_k"]) < gemm.TRITON_MIN_DOT \
                or (gemm.DTYPES[r["dtype"]][0] == 1 and r["block_k"] < gemm.TRITON_MIN_DOT_K_8BIT) \
                or r["block_m"] * r["block_n"] > gemm.TRITON_MAX_TENSOR_NUMEL, r
            assert plan.unlowered[i]
            continue
        want = naive.gemm_lower_one(r, hw)
        got = {
            "g0": plan.g0[i], "g1": plan.g1[i], "ksteps": plan.ksteps[i],
            "tiles": plan.extra["tiles"][i], "smem_block": plan.smem_block[i],
            "stages": plan.stages[i],
            "threads": plan.threads[i], "regs_thread": plan.regs_thread[i],
            "register_spill": plan.extra["register_spill"][i],
            "mma_path": str(plan.extra["mma_path"][i]),
            "tensor_core": plan.work_iter[i, R_TC], "cuda_core": plan.work_iter[i, R_CUDA],
            "l2_iter": plan.work_iter[i, R_L2], "smem": plan.work_iter[i, R_SMEM],
            "t_bytes": tuple(plan.t_bytes[i]), "t_foot": tuple(plan.t_foot[i]), "l2_epi": plan.work_epi[i, R_L2],
            "t_crit": tuple((plan.t_bytes if plan.t_crit is None else plan.t_crit)[i]),
            "c_more": 0.0 if plan.epi_crit is None else plan.epi_crit[i, 0],
            "t_dram_scale": (1.0, 1.0, 1.0) if plan.t_dram_scale is None else tuple(plan.t_dram_scale[i]),
            "dram_epi": plan.work_epi[i, R_DRAM], "cuda_epi": plan.work_epi[i, R_CUDA],
            "tc_rate": plan.rate[i, R_TC], "share_eff": plan.share_eff[i],
            "cuda_rate": plan.rate[i, R_CUDA], "smem_rate": plan.rate[i, R_SMEM],
            "useful_flops": plan.useful_flops[i],
            "chain_us": 0.0 if plan.chain_us is None else plan.chain_us[i],
            "conv_us": 0.0 if plan.conv_us is None else plan.conv_us[i],
            "expose_us": 0.0 if plan.expose_us is None else plan.expose_us[i],
            "tc_clock_cap": 0.0 if plan.tc_clock_cap is None else plan.tc_clock_cap[i],
            "smem_clock_cap": 0.0 if plan.smem_clock_cap is None else plan.smem_clock_cap[i],
            "cuda_clock_cap": 0.0 if plan.cuda_clock_cap is None else plan.cuda_clock_cap[i],
        }
        for key, w in want.items():
            g = got[key]
            if isinstance(w, tuple):
                np.testing.assert_allclose(g, w, rtol=1e-15, err_msg=f"{key} row {r}")
            elif isinstance(w, float):
                assert g == pytest.approx(w, rel=1e-15), (key, r)
            else:
                assert g == w, (key, r, g, w)
        assert plan.g2[i] == r["split_k"]


@settings(max_examples=60, deadline=None)
@given(st.lists(row, min_size=1, max_size=40), st.sampled_from(list_hw()))
def test_lowering_matches_twin(rows, gpu):
    _check(rows, get_hw(gpu))


def test_lowering_covers_every_mma_path():
    """wgmma, warp MMA and FMA rows, with and without spills, in one batch."""
    hw = get_hw("h100_sxm")
    base = dict(m=4096, n=4096, k=4096, block_k=64, num_stages=3, split_k=1, tf32=False,
                a_row_major=True, b_row_major=True)
    rows = [dict(base, block_m=128, block_n=256, num_warps=8, dtype="float16"),   # wgmma
            dict(base, block_m=32, block_n=64, num_warps=4, dtype="bfloat16"),    # mma_sync
            dict(base, block_m=64, block_n=64, num_warps=4, dtype="float32"),     # fma
            dict(base, block_m=256, block_n=256, num_warps=1, dtype="float16",
                 split_k=4, a_row_major=False, b_row_major=False)]                # spills
    cols, _ = validate(pl.DataFrame(rows), get_family("gemm"))
    plan = gemm.lower(cols, hw)
    assert list(plan.extra["mma_path"]) == ["wgmma", "mma_sync", "fma", "mma_sync"]
    assert plan.extra["register_spill"][3] > 0
    _check(rows, hw)
    # the evaluator's text column is gathered from the plan's codes: the same names
    from kernels_catalog.base import MMA_PATHS

    assert [MMA_PATHS[c] for c in plan.extra["mma_path_code"]] == list(plan.extra["mma_path"])
    out = evaluate(pl.DataFrame(rows), "h100_sxm")
    assert out["mma_path"].dtype == pl.String
    assert out["mma_path"].to_list() == ["wgmma", "mma_sync", "fma", "mma_sync"]


def test_program_mma_paths_through_the_evaluator():
    """A tile program's rows on Hopper's warpgroup MMA and on mma.sync (FlashAttention
    tiles of 128 rows and 8 warps, of 32 rows and 4) name their path in the evaluator's
    output as the plan does."""
    from kernels_catalog.base import MMA_PATHS
    from kernels_catalog.lowering import lower_program

    fam = get_family("attention")
    rows = [dict(batch=2, heads=8, seq_len=1024, head_dim=64, dtype="float16", block_m=128,
                 block_n=64, num_stages=3, num_warps=8),
            dict(batch=2, heads=8, seq_len=1024, head_dim=64, dtype="float16", block_m=32,
                 block_n=64, num_stages=3, num_warps=4)]
    cols, _ = validate(pl.DataFrame(rows), fam)
    plan = lower_program(fam.program, cols, get_hw("h100_sxm"))
    names = [MMA_PATHS[c] for c in plan.extra["mma_path_code"]]
    assert names == list(plan.extra["mma_path"]) == ["wgmma", "mma_sync"]
    out = evaluate(pl.DataFrame(rows), "h100_sxm", family="attention")
    assert out["mma_path"].to_list() == names


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(pow2(4, 8), pow2(4, 8), pow2(0, 4), st.integers(1, 4),
                          st.integers(0, 8)), min_size=1, max_size=30),
       st.floats(0.01, 0.2), st.floats(0.0, 0.1))
def test_epilogue_chain_matches_twin(rows, pass_us, hide_us):
    bm, bn, w, ks, p = (np.array(c) for c in zip(*rows))
    out = np.empty(len(rows))
    gemm._epilogue_chain(bm.astype(np.int64), bn.astype(np.int64), w.astype(np.int64),
                         ks.astype(np.int64), p.astype(np.int64), pass_us, hide_us, out)
    for j, r in enumerate(rows):
        assert out[j] == pytest.approx(naive.library_epilogue_chain_one(*r, pass_us, hide_us),
                                       rel=1e-12, abs=1e-15)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(pow2(4, 8), pow2(4, 8), pow2(0, 4), st.integers(1, 16),
                          st.booleans()), min_size=1, max_size=30),
       st.floats(0.01, 2.0), st.floats(0.0, 0.2))
def test_split_serial_chain_matches_twin(rows, link_us, pass_us):
    bm, bn, w, sk, sm80 = (np.array(c) for c in zip(*rows))
    out = np.empty(len(rows))
    gemm._split_serial_chain(bm.astype(np.int64), bn.astype(np.int64), w.astype(np.int64),
                             sk.astype(np.int64), sm80.astype(np.bool_), link_us, pass_us, out)
    for j, r in enumerate(rows):
        assert out[j] == pytest.approx(naive.library_split_serial_one(*r, link_us, pass_us),
                                       rel=1e-12, abs=1e-15)


def test_library_epilogue_chain_in_the_plan():
    """Library tensor-core rows carry their epilogue's passes in the per-tile
    overhead where the main loop is one step (a store-bound k = 4), less one
    iteration's issue per further step (k = 64, two steps), none where other
    tiles' loops run under them all (k = 8192); Triton rows and the library's
    SIMT SGEMM none."""
    hw = get_hw("a100")
    base = dict(m=6656, n=1664, block_k=32, num_stages=4, split_k=1, tf32=False,
                a_row_major=False, b_row_major=True)
    rows = [dict(base, k=4, block_m=128, block_n=128, num_warps=4, dtype="float16",
                 backend="cublas"),
            dict(base, k=4, block_m=64, block_n=64, num_warps=4, dtype="float16",
                 backend="cublas"),
            dict(base, k=8192, block_m=128, block_n=128, num_warps=4, dtype="float16",
                 backend="cublas"),
            dict(base, k=4, block_m=128, block_n=128, num_warps=4, dtype="float16",
                 backend="triton"),
            dict(base, k=4, block_m=128, block_n=64, block_k=16, num_warps=4,
                 dtype="float32", backend="cublas"),
            dict(base, k=64, block_m=128, block_n=128, num_warps=4, dtype="float16",
                 backend="cublas")]
    cols, _ = validate(pl.DataFrame(rows), get_family("gemm"))
    plan = gemm.lower(cols, hw)
    base_ovh = hw.cal("tile_overhead_cycles") / hw.rate("clock_mhz")
    pass_us = hw.cal("library_epilogue_pass_cycles") / hw.rate("clock_mhz")
    hide_us = hw.cal("iter_overhead_cycles") / hw.rate("clock_mhz")
    p = [naive.resident_one(plan.smem_block[i], plan.regs_thread[i], plan.threads[i], 32,
                            hw.sm_smem_bytes, hw.smem_per_block_bytes,
                            hw.smem_reserved_per_block_bytes, hw.sm_registers,
                            hw.register_alloc_unit, hw.sm_max_warps, hw.sm_max_threads,
                            hw.sm_max_blocks, hw.max_threads_per_block)[0] for i in range(2)]
    # 128 x 128 on 4 warps: 64-row warp tiles, 8 passes; 64 x 64: 32 rows, 4 passes
    assert plan.ovh_tile_us[0] - base_ovh == pytest.approx(8 * pass_us / p[0], rel=1e-12)
    assert plan.ovh_tile_us[1] - base_ovh == pytest.approx(4 * pass_us / p[1], rel=1e-12)
    assert plan.ovh_tile_us[2] == base_ovh  # 256 steps: another tile's loop runs under them
    assert plan.ovh_tile_us[3] == base_ovh  # Triton: one layout conversion
    assert plan.ovh_tile_us[4] == base_ovh  # the SIMT SGEMM (IEEE float32)
    assert plan.ksteps[5] == 2 and plan.smem_block[5] == plan.smem_block[0]
    assert plan.ovh_tile_us[5] - base_ovh == pytest.approx((8 * pass_us - hide_us) / p[0],
                                                           rel=1e-12)
    # and the latency: with the passes costed, the small-K library call is slower
    # than with them left out (library_epilogue_pass_cycles = 0), the long-K one
    # the same
    off = dataclasses.replace(hw, calibration={**hw.calibration,
                                               "library_epilogue_pass_cycles": 0.0})
    calls = pl.DataFrame([{k: r[k] for k in ("m", "n", "k", "dtype", "tf32", "a_row_major",
                                             "b_row_major", "backend")} for r in rows[:3:2]])
    on_lat = evaluate(calls, hw)["latency_us"].to_numpy()
    off_lat = evaluate(calls, off)["latency_us"].to_numpy()
    assert on_lat[0] > off_lat[0]
    assert on_lat[1] == off_lat[1]


@pytest.mark.parametrize("hw_name", ["h100", "h200"])
def test_library_epilogue_passes_not_on_tma_kernels(hw_name):
    """On Hopper a library call whose leading dimensions are all multiples of 16
    bytes runs a TMA kernel (warpgroup MMA, TMA-store epilogue): no passes; one
    with a misaligned K (odd k, 2-byte rows) runs an sm80-style kernel and pays
    them; and the aligned call is not predicted slower than the misaligned one
    an element longer (bench/monotone.py's rule)."""
    hw = get_hw(hw_name)
    base = dict(m=2432, n=7552, block_m=64, block_n=128, block_k=64, num_stages=6,
                num_warps=4, split_k=1, tf32=False, a_row_major=True, b_row_major=False,
                dtype="float16", backend="cublas")
    rows = [dict(base, k=64), dict(base, k=63)]
    cols, _ = validate(pl.DataFrame(rows), get_family("gemm"))
    plan = gemm.lower(cols, hw)
    base_ovh = hw.cal("tile_overhead_cycles") / hw.rate("clock_mhz")
    assert plan.ovh_tile_us[0] == base_ovh
    assert plan.ovh_tile_us[1] > base_ovh
    calls = pl.DataFrame([{k: r[k] for k in ("m", "n", "k", "dtype", "tf32", "a_row_major",
                                             "b_row_major", "backend")}
                          for r in (dict(base, k=64), dict(base, k=65))])
    lat = evaluate(calls, hw)["latency_us"].to_numpy()
    assert lat[0] <= lat[1]


@pytest.mark.parametrize("bm", [16, 32, 64, 128, 256])
@pytest.mark.parametrize("bn", [16, 32, 64, 128, 256])
@pytest.mark.parametrize("warps", [1, 2, 4, 8])
def test_fma_smem_bytes_matches_twin(bm, bn, warps):
    for bk in (16, 32, 64):
        for a_rm in (False, True):
            for b_rm in (False, True):
                assert gemm._fma_smem_bytes(bm, bn, bk, warps, a_rm, b_rm) == \
                    naive.fma_smem_bytes(bm, bn, bk, warps, a_rm, b_rm)


def test_fma_smem_bytes_by_hand():
    # 64 x 64 tile, 4 warps: 32 accumulator elements a thread, so Triton's blocked
    # layout gives each thread 4 x 4 blocks; 16 lanes x 4 columns span the 64
    # columns, 2 lanes along M, the 4 warps along M: 8 rows and 4 columns a lane.
    # Per k and warp: A column-major, 2 LDS.128 of 4 rows, lanes n and n^1 on the
    # same row (2 phases, 1 wavefront each): 4; A row-major, 8 rows' 4-k vectors,
    # the same 2 phases, a quarter per k: 4; B row-major, one LDS.128 of 4 phases of
    # 8 lanes x 16 contiguous bytes: 4; B column-major, 4 columns' 4-k vectors in 4
    # phases of 8 lanes whose columns are 4 x 32 words apart (one bank group, 8
    # conflicts), a quarter per k: 4 x 4 x 8 / 4 = 32
    per_k = {(True, True): 4 + 4, (False, True): 4 + 4, (True, False): 4 + 32,
             (False, False): 4 + 32}
    for (a_rm, b_rm), wf in per_k.items():
        assert gemm._fma_smem_bytes(64, 64, 32, 4, a_rm, b_rm) == 128.0 * 32 * 4 * wf
    # 16 x 32 tile, 2 warps: 4 elements a thread, 2 x 2 blocks, 16 lanes along N:
    # 4 rows, 2 columns. A column-major: 2 LDS.64 a k, lanes n and n^1 alike (one
    # phase): 2; B row-major: one LDS.64 of 2 phases: 2; B column-major: 2 columns,
    # 8 lanes a phase 2 x 16 words apart (stride 8 vectors: one bank group): 2 x 8
    assert gemm._fma_smem_bytes(16, 32, 16, 2, False, True) == 128.0 * 16 * 2 * (2 + 2)
    assert gemm._fma_smem_bytes(16, 32, 16, 2, False, False) == 128.0 * 16 * 2 * (2 + 16)
    # the layout decides it, not the tile alone: B column-major costs more on every shape
    for bm, bn, w in ((16, 16, 1), (128, 32, 4), (32, 128, 8), (256, 256, 8)):
        assert gemm._fma_smem_bytes(bm, bn, 32, w, True, False) > \
            gemm._fma_smem_bytes(bm, bn, 32, w, True, True)


def _fp32_row(bm, bn, bk, warps, stages=3, m=8192, n=8192, k=8192):
    return dict(m=m, n=n, k=k, block_m=bm, block_n=bn, block_k=bk, num_stages=stages,
                num_warps=warps, split_k=1, dtype="float32", tf32=False, a_row_major=True,
                b_row_major=False)


def test_fma_spill_registers_and_l2_reload_chain_by_hand():
    """Triton's FMA dot keeps BK / 8 k of fragments live; its spills are reloaded
    once an iteration, from L2 where the resident blocks' spills do not fit the L1
    that the driver's shared-memory carve-out leaves, else from L1; the resident
    tiles' warps wait on them together, so each tile's iteration adds its wait / p
    to the scheduler's issue time."""
    a100 = get_hw("a100")
    rows = [_fp32_row(128, 128, 64, 4), _fp32_row(128, 128, 32, 4), _fp32_row(64, 64, 32, 4)]
    cols, _ = validate(pl.DataFrame(rows), get_family("gemm"))
    plan = gemm.lower(cols, a100)
    # 128x128 on 4 warps: 128 accumulators; Triton's layout gives a thread 32 rows of
    # A and 4 columns of B; 8 slices of BK = 64: 128 + 36 x 8 + 20 = 436 registers
    # wanted, 255 allowed, 181 spilled; BK = 32: 128 + 36 x 4 + 20 = 292, 37 spilled
    assert list(plan.extra["register_spill"]) == [181, 37, 0]
    # A warp's chain: its FFMAs at one scheduler's share of the FP32 rate, then its
    # own shared loads: A row-major, 32 rows a thread, every lane on one row (2
    # phases, 1 wavefront, a quarter per k: 16 a k); B column-major, 4 columns in 4
    # phases of 8 conflicting lanes (32 a k): 48 wavefronts a k and warp
    fp32_sched = a100.rate("fp32_tflops") * 1e6 / a100.sm_count / 4  # FLOP/us
    clock = a100.rate("clock_mhz")
    own = lambda bm, bn, bk, w: 2.0 * bm * bn * bk / w / fp32_sched + 48 * bk / clock  # noqa: E731
    # BK = 64: 255 registers x 128 threads allow 2 blocks, so the driver carves all
    # 164 KiB of shared memory (2 x 129 KiB would be more): 192 - 164 = 28 KiB of L1
    # against 181 x 4 x 128 = 90.5 KiB of spills on the one resident block: 181
    # reloads from L2 an iteration
    stall = 181 * a100.cal("l2_latency_cycles") / clock
    assert plan.chain_us[0] == pytest.approx(own(128, 128, 64, 4) + stall, rel=1e-12)
    # BK = 32: 2 blocks of 65 KiB shared memory fit, the carve-out is 130 KiB,
    # leaving 62 KiB of L1 for 2 x 37 x 4 x 128 = 37 KiB of spills: 37 reloads from L1
    l1_wait = 37 * a100.cal("l1_latency_cycles") / clock
    assert a100.cal("l1_latency_cycles") == 33.0
    assert plan.chain_us[1] == pytest.approx(own(128, 128, 32, 4) + l1_wait, rel=1e-12)
    # the two resident tiles' warps wait together: half the wait a tile's iteration,
    # as CUDA-core issue time (BK = 64: one tile, the whole L2 wait)
    cuda_rate = plan.rate[:, R_CUDA]
    assert plan.work_iter[1, R_CUDA] == pytest.approx(
        2.0 * 128 * 128 * 32 + l1_wait / 2 * cuda_rate[1], rel=1e-12)
    assert plan.work_iter[0, R_CUDA] == pytest.approx(
        2.0 * 128 * 128 * 64 + stall * cuda_rate[0], rel=1e-12)
    assert plan.work_iter[2, R_CUDA] == 2.0 * 64 * 64 * 32
    # 64x64 on 4 warps: 8 rows, 4 columns a thread, 16 lanes along N: A 4 + B 32 a k
    assert plan.chain_us[2] == pytest.approx(
        2.0 * 64 * 64 * 32 / 4 / fp32_sched + 36 * 32 / clock, rel=1e-12)
    # the chain makes the spilling tile slower than its FFMAs and than the BK = 32 tile
    res = evaluate(pl.DataFrame(rows), "a100")
    lat = res["latency_us"].to_list()
    assert lat[0] > 2.5 * lat[1]


def test_fma_spill_twin_every_layout():
    """The twin prices the FMA dot's spills as the lowering does in every layout:
    the layout-aware spill / no-spill split, L1 and L2 reloads on the chain and
    their wait / p on the CUDA cores (A100 and H100; 1, 2 and 4 resident tiles)."""
    rows = [_fp32_row(bm, bn, bk, w, stages) | {"a_row_major": a_rm, "b_row_major": b_rm}
            for bm, bn, bk, w, stages in ((128, 128, 32, 4, 4), (128, 128, 32, 4, 3),
                                           (128, 64, 32, 2, 2), (128, 128, 64, 4, 3))
            for a_rm in (False, True) for b_rm in (False, True)]
    for gpu in ("a100", "h100_sxm"):
        _check(rows, get_hw(gpu))
    cols, _ = validate(pl.DataFrame(rows), get_family("gemm"))
    plan = gemm.lower(cols, get_hw("a100"))
    spill = list(plan.extra["register_spill"])
    # 128x128x32 on 4 warps spills 37 words except with A column-major, B row-major
    assert spill[:4] == [37, 0, 37, 37] and spill[4:8] == [37, 0, 37, 37]
    assert spill[8:12] == [37, 37, 37, 37] and spill[12:] == [181] * 4


FMA_TABLE = Path(__file__).parent / "data" / "triton30_fma_sm80_sm90.csv"


def test_fma_loads_match_the_compiler():
    """Triton's FMA-dot layout as the model builds it issues, per thread and
    iteration, exactly the FFMAs and the LDS.128 / LDS.64 that ptxas emits in
    the main loop of every compiled IEEE FP32 tile and layout (Triton 3.0, sm_80
    and sm_90: ``bench/triton_fma_footprints.py``), and the register estimate
    splits them into spilling and non-spilling as ptxas does."""
    t = pl.read_csv(FMA_TABLE)
    assert t.height >= 600 and set(t["arch"].unique()) == {80, 90}
    for r in t.iter_rows(named=True):
        got = gemm.fma_loads(r["block_m"], r["block_n"], r["block_k"], r["num_warps"],
                             r["a_row_major"], r["b_row_major"])
        assert (got["ffma"], got[4], got[2]) == \
            (r["loop_ffma"], r["loop_lds128"], r["loop_lds64"]), r
    want = np.array([gemm.fma_registers(r["block_m"], r["block_n"], r["block_k"], r["num_warps"])
                     for r in t.iter_rows(named=True)])
    cap = np.minimum(255, 65536 // (32 * t["num_warps"].to_numpy()) // 8 * 8)
    spills = t["spill_stores"].to_numpy() > 0
    heavy = t["loop_ldl"].to_numpy() >= 100  # spills reloaded every iteration
    assert ((want > cap) == spills).mean() >= 0.85
    assert (want[heavy] > cap[heavy]).all()  # every heavily spilling kernel is predicted to spill
    quiet = ~spills
    assert np.abs(want[quiet] - t["regs"].to_numpy()[quiet]).mean() <= 35
    # whether ptxas spills follows the operand layouts: the layout-aware demand,
    # fitted on the kernels below the cap, splits them as ptxas does on 606 of the
    # 640, and spilling only where both exceed the cap on 604 (the estimate alone 602)
    demand = np.array([gemm.fma_register_demand(r["block_m"], r["block_n"], r["block_k"],
                                                r["num_warps"], r["a_row_major"], r["b_row_major"])
                       for r in t.iter_rows(named=True)])
    assert ((demand > cap) == spills).sum() >= 606
    twin = [naive.fma_demand(r["block_m"], r["block_n"], r["block_k"], r["num_warps"],
                             r["a_row_major"], r["b_row_major"]) for r in t.iter_rows(named=True)]
    np.testing.assert_allclose(demand, twin, rtol=1e-15)
    both = (want > cap) & (demand > cap)
    assert (both == spills).sum() >= 604
    assert (both[heavy]).all()
    low = quiet & (t["regs"].to_numpy() < 250)
    assert np.abs(demand[low] - t["regs"].to_numpy()[low]).mean() <= 9.0
    # 128x128x32 on 4 warps: 238 registers with A column-major and B row-major, no
    # spill; the three other layouts spill (sm_80: 5, 19 and 54 words)
    for a_rm, b_rm, spilled in ((False, True, False), (False, False, True),
                                (True, False, True), (True, True, True)):
        assert (gemm.fma_register_demand(128, 128, 32, 4, a_rm, b_rm) > 255) == spilled
    # the lowering asks what fma_registers says, registers plus spill, where both
    # exceed the cap, and no more than the cap elsewhere
    rows = [_fp32_row(r["block_m"], r["block_n"], r["block_k"], r["num_warps"]) | {
        "a_row_major": r["a_row_major"], "b_row_major": r["b_row_major"]}
        for r in t.filter(pl.col("arch") == 80).iter_rows(named=True)]
    cols, _ = validate(pl.DataFrame(rows), get_family("gemm"))
    plan = gemm.lower(cols, get_hw("a100"))
    sm80 = t["arch"].to_numpy() == 80
    np.testing.assert_array_equal(plan.regs_thread + plan.extra["register_spill"],
                                  np.where(both[sm80], want[sm80], np.minimum(want[sm80], cap[sm80])))


def test_tf32_mn_major_operand_on_warpgroup_mma_by_hand():
    """Triton feeds TF32 to warpgroup MMA K-major only: each element of an
    M/N-contiguous operand is written into the K-major tile by a 4-byte store,
    costing its warp's bank-conflict wavefronts (16 per 32 elements for a
    128-wide operand, 8 for a 64-wide one) as shared-memory work; before Triton
    3.3 that operand passes through registers inside the iteration (one ring
    slot, the loop unpipelined: stages 1), from 3.3 it rides the ring. K-major
    operands, the mma.sync path (A100) and the library rows pay nothing extra;
    every warpgroup-MMA ring holds num_stages slots (Triton 3.1 and 3.6)."""
    base = dict(m=4096, n=4096, k=4096, block_k=32, num_stages=3, num_warps=4, split_k=1,
                dtype="float32", tf32=True)
    layouts = [(True, False), (True, True), (False, False), (False, True)]  # K-major first
    h100 = get_hw("h100")
    bpc = h100.smem_bytes_per_clk
    for bm, bn in ((128, 128), (64, 128), (128, 64)):
        for version, staged in (("3.1", True), ("3.6.0", False)):
            rows = [dict(base, block_m=bm, block_n=bn, a_row_major=a, b_row_major=b,
                         triton_version=version) for a, b in layouts]
            cols, _ = validate(pl.DataFrame(rows), get_family("gemm"))
            plan = gemm.lower(cols, h100)
            assert np.all(plan.share_eff == h100.cal("wgmma_share_efficiency"))  # wgmma
            a_el, b_el = bm * 32, 32 * bn  # elements of each operand tile per iteration
            a_cost = a_el * ((bm // 8 if bm < 128 else 16) / 32 * bpc - 4)
            b_cost = b_el * ((bn // 8 if bn < 128 else 16) / 32 * bpc - 4)
            extra = plan.work_iter[:, R_SMEM] - plan.work_iter[0, R_SMEM]
            assert extra.tolist() == pytest.approx([0.0, b_cost, a_cost, a_cost + b_cost])
            assert plan.stages.tolist() == ([3, 1, 1, 1] if staged else [3, 3, 3, 3])
            full = 3 * (a_el + b_el) * 4
            assert plan.smem_block.tolist() == ([full, (3 * a_el + b_el) * 4,
                                                 (a_el + 3 * b_el) * 4, (a_el + b_el) * 4]
                                                if staged else [full] * 4)
    rows = [dict(base, block_m=128, block_n=128, a_row_major=a, b_row_major=b)
            for a, b in layouts]
    cols, _ = validate(pl.DataFrame(rows), get_family("gemm"))
    a100 = gemm.lower(cols, get_hw("a100"))
    assert np.all(a100.work_iter[:, R_SMEM] == a100.work_iter[0, R_SMEM])
    assert a100.smem_block.tolist() == [2 * 2 * 128 * 32 * 4] * 4  # mma.sync: stages - 1
    assert a100.stages.tolist() == [3] * 4
    lib = [dict(r, backend="cublas") for r in rows]
    cols, _ = validate(pl.DataFrame(lib), get_family("gemm"))
    plan = gemm.lower(cols, h100)
    # (the library's both-M/N-contiguous TF32 runs mma.sync: its own fragment reads)
    op_cost = 128 * 32 * (16 / 32 * bpc - 4)
    assert np.all(plan.work_iter[:, R_SMEM] - plan.work_iter[0, R_SMEM] < 0.5 * op_cost)
    assert plan.stages.tolist() == [3] * 4


@pytest.mark.parametrize("width", [16, 32, 64, 128, 256])
def test_mn32_wavefronts_match_the_lane_by_lane_count(width):
    assert gemm.mn32_wavefronts(width) == naive.mn32_store_wavefronts(width)


TF32_TABLES = [Path(__file__).parent / "data" / name
               for name in ("triton31_tf32_sm80_sm90.csv", "triton36_tf32_sm90.csv")]


@pytest.mark.parametrize("table", TF32_TABLES, ids=lambda p: p.stem)
def test_tf32_shared_memory_and_launches_match_the_compiler(table):
    """The TF32 tiles of the measured sets as Triton 3.1 (sm_80 and sm_90) and
    3.6 (sm_90) compile them (``bench/triton_fma_footprints.py --tf32``), each
    row at its own release: the model's shared memory per block is the
    compiler's to within 2 KiB on nine kernels in ten of each MMA path, and says
    which of them launch (at most the per-block limit) on all."""
    t = pl.read_csv(table)
    for arch, gpu in ((80, "a100"), (90, "h100")):
        if not (t["arch"] == arch).any():
            continue
        part = t.filter(pl.col("arch") == arch)
        rows = [dict(m=4096, n=4096, k=4096, split_k=1, dtype="float32", tf32=True,
                     triton_version=r["triton"], **{c: r[c] for c in (
                         "block_m", "block_n", "block_k", "num_stages", "num_warps",
                         "a_row_major", "b_row_major")}) for r in part.iter_rows(named=True)]
        cols, _ = validate(pl.DataFrame(rows), get_family("gemm"))
        hw = get_hw(gpu)
        plan = gemm.lower(cols, hw)
        got, want = plan.smem_block, part["shared"].to_numpy()
        for path in np.unique(plan.extra["mma_path"]):
            sel = plan.extra["mma_path"] == path
            assert (np.abs(got[sel] - want[sel]) <= 2048).mean() >= 0.9, (gpu, path)
        limit = hw.smem_per_block_bytes
        assert np.array_equal(got <= limit, want <= limit), gpu
    # what the staged / pipelined split rests on: a warpgroup-MMA loop whose two
    # operands are M/N-contiguous issues no cp.async before Triton 3.3 (they are
    # loaded into registers and stored), and copies them with cp.async from 3.3
    both_mn = t.filter((pl.col("arch") == 90) & (pl.col("loop_hgmma") > 0)
                       & ~pl.col("a_row_major") & pl.col("b_row_major"))
    staged = gemm.triton_release(both_mn["triton"].to_numpy()) < gemm.TRITON_PIPELINED_MN32
    assert both_mn.height > 0
    assert np.array_equal(both_mn["loop_ldgsts"].to_numpy() == 0, staged)

@settings(max_examples=200, deadline=None)
@given(st.integers(1, 1 << 20), st.sampled_from([1, 2, 4]))
def test_operand_vector_bytes_matches_twin(ld, eb):
    """Triton's vector width of an operand load (the largest power of two
    dividing the leading dimension, times the element size, at most 16 B) and
    the SRAM passes it costs, kernel against the plain-Python twin."""
    v = gemm.vector_bytes(ld, eb)
    assert v == naive.operand_vector_bytes(ld, eb)
    assert gemm.sram_passes(v) == naive.operand_sram_passes(v)


def test_operand_vector_bytes_by_hand():
    # fp16: 4096 elements -> 16 B; an odd leading dimension -> one element (2 B),
    # which Triton loads into registers inside the iteration (not pipelined)
    assert gemm.vector_bytes(4096, 2) == 16
    assert gemm.vector_bytes(43, 2) == 2
    assert gemm.vector_bytes(6, 2) == 4
    assert gemm.vector_bytes(7491, 4) == 4
    # 16 B copies bypass L1: one pass; 2 B copies fill L1, are read back and
    # stored, the last two at a whole 128 B wavefront per 64 B warp access
    assert gemm.sram_passes(16) == 1.0
    assert gemm.sram_passes(2) == 1.0 + 2.0 * 2.0
    assert gemm.sram_passes(4) == 3.0


_size = st.one_of(st.integers(1, 1 << 16), st.integers(1, 1 << 62))
_blk = st.one_of(st.sampled_from([1, 8, 16, 24, 32, 64, 128, 256, 1 << 20, 3 << 20]),
                 st.integers(1, 1 << 40))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.fixed_dictionaries({
    "m": _size, "n": _size, "k": _size, "block_m": _blk, "block_n": _blk, "block_k": _blk,
    "num_stages": st.integers(1, 1 << 40), "num_warps": st.sampled_from([1, 2, 4, 3, 8, 1 << 21]),
    "split_k": st.one_of(st.just(1), st.integers(1, 1 << 40)),
    "dtype": st.sampled_from(["float16", "bfloat16", "float32", "float8"]),
    "backend": st.sampled_from(["triton", "cublas"])}), min_size=1, max_size=20))
def test_admit_kernel_matches_twin(rows):
    """admit's numba kernel against the plain-Python twin, sizes up to where
    products overflow int64 and float64 ranges alike."""
    cols = {c: np.array([r[c] for r in rows], dtype=object if c in ("dtype", "backend")
                        else np.int64) for c in rows[0]}
    got = gemm.admit(cols)
    assert got.tolist() == [naive.gemm_admit(r) for r in rows]


def test_dram_access_runs_by_hand():
    """A contiguous run of a tile load shorter than the GPU's dram_access_bytes
    costs a whole access of DRAM time (H100 128 B, A100 64 B), at most twice its
    sectors: the DRAM share of each operand's bytes is scaled by
    min(ceil(run / access) x access over its 32-byte sectors, 2); a tile spanning its operand's whole contiguous extent (k <=
    BK) reads its rows back to back as one run; 32 B (the default) scales
    nothing. Only the DRAM column moves: L2 and L1.5 traffic stay the sectors."""
    import dataclasses

    base = dict(m=8, n=129792, k=4096, block_m=16, block_n=32, num_stages=3, num_warps=2,
                split_k=1, dtype="float32", tf32=True, a_row_major=True)
    rows = [dict(base, block_k=16, b_row_major=False),   # B runs BK x 4 = 64 B
            dict(base, block_k=32, b_row_major=False),   # 128 B
            dict(base, block_k=16, b_row_major=True),    # BN x 4 = 128 B
            dict(base, block_k=16, b_row_major=False, dtype="float16", tf32=False),  # 32 B
            dict(base, block_k=16, b_row_major=False, k=8)]  # k <= BK: one run of 8 x 32 x 4
    cols, _ = validate(pl.DataFrame(rows), get_family("gemm"))
    # A (16 x BK, row-major): runs of BK x 4 = 64 / 128 B, 32 B for fp16 BK 16;
    # k = 8 <= BK: 8 x 16 x 4 = 512 B
    want = {"h100_sxm": ([2.0, 1.0, 1.0, 2.0, 1.0], [2.0, 1.0, 2.0, 2.0, 1.0]),
            "a100": ([1.0, 1.0, 1.0, 2.0, 1.0], [1.0, 1.0, 1.0, 2.0, 1.0])}
    for gpu, (b_scale, a_scale) in want.items():
        hw = get_hw(gpu)
        plan = gemm.lower(cols, hw)
        np.testing.assert_array_equal(plan.t_dram_scale[:, 1], b_scale)
        np.testing.assert_array_equal(plan.t_dram_scale[:, 0], a_scale)
        np.testing.assert_array_equal(plan.t_dram_scale[:, 2], 1.0)  # C: once per tile
        flat = dataclasses.replace(hw, calibration={**hw.calibration, "dram_access_bytes": 32.0})
        assert gemm.lower(cols, flat).t_dram_scale is None
        frame = pl.DataFrame(rows)
        got, ref = evaluate(frame, hw), evaluate(frame, flat)
        # the same cache split (hit rates), so the DRAM bytes scale by operand
        np.testing.assert_array_equal(got["l2_hit"], ref["l2_hit"])
        assert (got["dram_bytes"] >= ref["dram_bytes"]).all()
        moved = np.array(b_scale) * np.array(a_scale) > 1.0
        assert ((got["dram_bytes"] > ref["dram_bytes"]).to_numpy() == moved).all()
        assert (got["latency_us"] >= ref["latency_us"]).all()


def test_k_tail_is_not_fetched_by_hand():
    """Triton's masked loads fetch only the k / split_k elements of K a tile's
    ksteps steps cover (on average k / ksteps a step), not ksteps x BK; library
    rows keep whole BK steps. 8 x 76672 x 2 with BK = 16: A moves 8 rows x 2 x 2
    B (sector efficiency of its 32-byte rows: 1), B 2 x 32 x 2 B a step; k = 40,
    BK = 16: 3 steps of 40 / 3."""
    base = dict(m=8, n=76672, block_m=16, block_n=32, block_k=16, num_stages=3, num_warps=2,
                split_k=1, dtype="float16", tf32=False, a_row_major=True, b_row_major=True)
    rows = [dict(base, k=2), dict(base, k=40), dict(base, k=48), dict(base, k=2, backend="cublas")]
    cols, _ = validate(pl.DataFrame(rows), get_family("gemm"))
    plan = gemm.lower(cols, get_hw("h100_sxm"))
    assert plan.ksteps.tolist() == [1, 3, 3, 1]
    kk = [2.0, 40 / 3, 16.0, 16.0]
    np.testing.assert_allclose(plan.t_bytes[:, 0], [8 * x * 2 for x in kk], rtol=1e-15)
    np.testing.assert_allclose(plan.t_bytes[:, 1], [x * 32 * 2 for x in kk], rtol=1e-15)
    # the cache model's blocks stay whole tiles
    np.testing.assert_allclose(plan.t_foot[:, 1], 16 * 32 * 2, rtol=1e-15)


def test_narrow_operand_pointer_registers_by_hand():
    """A tensor-core Triton tile keeps one 64-bit pointer (2 registers) per
    vector it loads, loop-carried where the loop iterates; REGS_BASE covers
    16-byte vectors, an operand loaded narrower adds the rest. 5376 x 5376 x 43
    fp16, A row-major, B column-major: both leading dimensions (43) odd, 2-byte
    vectors. 128x128x16 on 4 warps (128 threads): each operand 128 x 16 / 128
    = 16 elements a thread, 16 pointers against 2 at 16 bytes: 2 x (16 - 2) = 28
    registers each, 56 in all over k = 48 (aligned, same 3 steps); BK = 64
    (one step, k = 43 <= BK) adds none; the library's rows add none."""
    base = dict(m=5376, n=5376, block_m=128, block_n=128, block_k=16, num_stages=3,
                num_warps=4, split_k=1, dtype="float16", tf32=False, a_row_major=True,
                b_row_major=False)
    rows = [dict(base, k=43), dict(base, k=48), dict(base, k=43, block_k=64),
            dict(base, k=48, block_k=64), dict(base, k=43, backend="cublas"),
            dict(base, k=48, backend="cublas")]
    cols, _ = validate(pl.DataFrame(rows), get_family("gemm"))
    hw = get_hw("h100_sxm")
    plan = gemm.lower(cols, hw)
    assert plan.ksteps.tolist() == [3, 3, 1, 1, 3, 3]
    regs = plan.regs_thread.astype(np.int64)
    spill = np.asarray(plan.extra["register_spill"], dtype=np.int64)
    want = regs + spill  # registers asked, spilled or not
    assert want[0] - want[1] == 56
    assert want[2] == want[3]
    assert want[4] == want[5]


def test_map_codes_one_value_by_identity_or_equality():
    """The one-value shortcut of map_codes and the library test agree with the
    per-row forms on columns of one object, of equal but distinct objects, of
    mixed values and of non-strings."""
    from kernels_catalog.base import map_codes, same_object

    table = {"a": 3, "bb": 5}
    one = np.array(["a"], dtype=object)[np.zeros(1000, dtype=np.int64)]
    distinct = np.array(["".join(["b", "b"]) for _ in range(1000)], dtype=object)
    mixed = np.array(["a", "bb"], dtype=object)[np.arange(1000) % 2]
    assert same_object(one) and not same_object(mixed)
    assert not same_object(distinct) and (distinct == "bb").all()
    for v in (one, distinct, mixed, one[::3], mixed[::2]):
        want = np.array([table[x] for x in v], dtype=np.int64)
        np.testing.assert_array_equal(map_codes(v, table), want)
        lib = np.where(v == "a", "cublas", "triton").astype(object)
        np.testing.assert_array_equal(gemm._is_library(lib),
                                      np.array([x == "cublas" for x in lib]))
    with pytest.raises(KeyError):
        map_codes(np.array(["zz"], dtype=object)[np.zeros(5, dtype=np.int64)], table)
    same = np.array(["cublas"], dtype=object)[np.zeros(6, dtype=np.int64)]
    assert same_object(same) and gemm._is_library(same).all()
    odd = np.array([None], dtype=object)[np.zeros(4, dtype=np.int64)]
    np.testing.assert_array_equal(gemm._is_library(odd), np.zeros(4, dtype=bool))


def test_map_codes_of_long_columns_by_distinct_object():
    """A column of at least MAP_CODES_GROUP_MIN rows is looked up once per distinct
    object: the codes equal the per-row look-ups on columns of few objects, of equal
    strings that are distinct objects (each its own group), of one object, and of more
    objects than the grouping takes (the per-row path); a string not in the table is a
    KeyError however many rows hold it."""
    from kernels_catalog.base import MAP_CODES_GROUP_MIN, map_codes

    table = {"row": 0, "col": 1, "persistent": 4}
    n = MAP_CODES_GROUP_MIN * 3 + 5
    rng = np.random.default_rng(0)
    few = np.array(["row", "col", "persistent"], dtype=object)[rng.integers(0, 3, n)]
    copies = np.array(["".join(list(x)) for x in few], dtype=object)
    one = np.array(["col"], dtype=object)[np.zeros(n, dtype=np.int64)]
    # a few hundred distinct objects of equal strings: more than an eighth of the rows
    many = np.array(["".join(list(x)) for x in few[: n // 4]], dtype=object)[
        rng.integers(0, n // 4, n)]
    # a hundred objects of the three strings: grouped, equal strings looked up again
    several = np.array(["".join(list(x)) for x in few[:100]], dtype=object)[
        rng.integers(0, 100, n)]
    for v in (few, copies, one, many, several, few[::2]):
        want = np.array([table[x] for x in v], dtype=np.int64)
        got = map_codes(v, table)
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, want)
    bad = few.copy()
    bad[n // 2] = "zorder?"
    with pytest.raises(KeyError):
        map_codes(bad, table)


def test_power_limited_boost_capped_at_max_clock_by_hand():
    """A grid of fewer tiles than SMs boosts the tensor-core rate up to the
    measured peak (1 / tc_efficiency) and the CUDA-core and shared-memory rates,
    per-clock figures at the measured clock, only up to max_clock_mhz / clock."""
    hw = get_hw("a100")
    base = {"m": 6144, "n": 16, "k": 45696, "block_k": 32, "num_stages": 3,
            "num_warps": 4, "split_k": 1, "dtype": "float32", "tf32": False,
            "a_row_major": True, "b_row_major": True, "triton_version": "3.0"}
    rows = [dict(base, block_m=64, block_n=16),   # 96 tiles on 108 SMs: boosted
            dict(base, block_m=32, block_n=16),   # 192 tiles: no boost
            dict(base, block_m=64, block_n=16, dtype="float16")]
    cols, _ = validate(pl.DataFrame(rows), get_family("gemm"))
    plan = gemm.lower(cols, hw)
    sms, eff = hw.sm_count, hw.cal("tc_efficiency")
    cap = 1410.0 / 1387.0
    assert hw.max_clock_mhz == 1410.0 and hw.rate("clock_mhz") == 1387.0
    cuda0 = hw.rate("fp32_tflops") * 1e6 / sms
    smem0 = hw.smem_bytes_per_clk * 1387.0
    assert plan.rate[0, R_CUDA] == pytest.approx(cuda0 * cap, rel=1e-12)
    assert plan.rate[0, R_SMEM] == pytest.approx(smem0 * cap, rel=1e-12)
    assert plan.rate[1, R_CUDA] == pytest.approx(cuda0, rel=1e-12)
    assert plan.rate[1, R_SMEM] == pytest.approx(smem0, rel=1e-12)
    # the tensor-core rate keeps the full boost: 108 / 96 = 1.125 < 1 / 0.85
    tc0 = hw.tc_tflops("float16") * 1e6 / sms * hw.mma_sync_fraction * eff
    assert plan.rate[2, R_TC] == pytest.approx(tc0 * sms / 96.0, rel=1e-12)
    assert plan.rate[2, R_CUDA] == pytest.approx(cuda0 * cap, rel=1e-12)


def test_last_round_boost_by_hand():
    """A Triton grid of more tiles than SMs runs its last round of tiles on the
    SMs it keeps busy, at their power-limited clock: the tensor-core rate is
    rounds / (rounds - 1 + 1 / min(1 / tc_efficiency, sms / last)) times the
    full-grid rate (the per-clock rates of a tensor-core row likewise, up to
    the maximum clock); a full last round gets none, a library row none."""
    hw = get_hw("a100")
    sms, eff = hw.sm_count, hw.cal("tc_efficiency")
    assert sms == 108 and eff == 0.85
    base = {"k": 4096, "block_m": 64, "block_n": 64, "block_k": 32, "num_stages": 3,
            "num_warps": 4, "split_k": 1, "dtype": "float16", "tf32": False,
            "a_row_major": True, "b_row_major": False, "triton_version": "3.0"}
    rows = [dict(base, m=64 * 13, n=64 * 18),   # 234 tiles: rounds 3, last 18
            dict(base, m=64 * 12, n=64 * 18),   # 216 tiles: rounds 2, last 108
            dict(base, m=64 * 1, n=64 * 109),   # 109 tiles: rounds 2, last 1
            dict(base, m=64 * 9, n=64 * 12)]    # 108 tiles: one full round
    cols, _ = validate(pl.DataFrame(rows), get_family("gemm"))
    plan = gemm.lower(cols, hw)
    assert list(plan.extra["tiles"]) == [234, 216, 109, 108]
    tc0 = hw.tc_tflops("float16") * 1e6 / sms * hw.mma_sync_fraction * eff
    assert plan.rate[0, R_TC] == pytest.approx(tc0 * 3.0 / (2.0 + eff), rel=1e-12)
    assert plan.rate[1, R_TC] == pytest.approx(tc0, rel=1e-12)
    assert plan.rate[2, R_TC] == pytest.approx(tc0 * 2.0 / (1.0 + eff), rel=1e-12)
    assert plan.rate[3, R_TC] == pytest.approx(tc0, rel=1e-12)
    # the per-clock rates of a tensor-core row with the clock, up to the maximum
    # (1410 / 1387 on A100); an FMA row's (IEEE FP32) not past one round
    cap = 1410.0 / 1387.0
    cuda0 = hw.rate("fp32_tflops") * 1e6 / sms
    smem0 = hw.smem_bytes_per_clk * 1387.0
    assert plan.rate[0, R_CUDA] == pytest.approx(cuda0 * 3.0 / (2.0 + 1.0 / cap), rel=1e-12)
    assert plan.rate[0, R_SMEM] == pytest.approx(smem0 * 3.0 / (2.0 + 1.0 / cap), rel=1e-12)
    assert plan.rate[1, R_CUDA] == pytest.approx(cuda0, rel=1e-12)
    fma = [dict(rows[0], dtype="float32", tf32=False)]
    cols, _ = validate(pl.DataFrame(fma), get_family("gemm"))
    p32 = gemm.lower(cols, hw)
    assert p32.extra["tiles"][0] == 234 and p32.extra["mma_path"][0] == "fma"
    assert p32.rate[0, R_CUDA] == pytest.approx(cuda0, rel=1e-12)
    assert p32.rate[0, R_SMEM] == pytest.approx(smem0, rel=1e-12)
    # a library row of more tiles than SMs on A100: cuBLAS's sm80 kernels are a
    # grid of their tiles, so the same rule on the tile the model prices
    lib = [dict(r, backend="cublas") for r in rows[:1]]
    cols, _ = validate(pl.DataFrame(lib), get_family("gemm"))
    plan = gemm.lower(cols, hw)
    t = int(plan.extra["tiles"][0])
    assert t > sms and t % sms != 0  # a partly filled last round
    rounds = -(-t // sms)
    tail = min(1.0 / eff, sms / (t - (rounds - 1) * sms))
    assert plan.rate[0, R_TC] == pytest.approx(tc0 * rounds / (rounds - 1 + 1.0 / tail), rel=1e-12)
    # on H100 the library's aligned kernels are persistent and tile-scheduled: a
    # library row of a partly filled last round keeps the full-grid rate
    h = get_hw("h100")
    hs, he = h.sm_count, h.cal("tc_efficiency")
    lib = [dict(base, m=64 * 14, n=64 * 19, backend="cublas")]
    cols, _ = validate(pl.DataFrame(lib), get_family("gemm"))
    plan = gemm.lower(cols, h)
    t = int(plan.extra["tiles"][0])
    assert t > hs and t % hs != 0
    path = 1.0 if plan.extra["mma_path"][0] == "wgmma" else h.mma_sync_fraction
    assert plan.rate[0, R_TC] == pytest.approx(h.tc_tflops("float16") * 1e6 / hs * path * he,
                                               rel=1e-12)


def test_one_wide_operand_lowered_as_its_k_contiguous_layout():
    """B row-major with n = 1 (A column-major with m = 1) has both strides 1:
    the same memory as the K-contiguous layout, lowered identically to it;
    with n > 1 the two layouts differ (the FMA dot's shared loads)."""
    hw = get_hw("a100")
    base = {"k": 4480, "block_m": 64, "block_n": 16, "block_k": 32, "num_stages": 3,
            "num_warps": 4, "split_k": 1, "dtype": "float32", "tf32": False,
            "triton_version": "3.0"}
    rows = [dict(base, m=9984, n=1, a_row_major=False, b_row_major=True),
            dict(base, m=9984, n=1, a_row_major=False, b_row_major=False),
            dict(base, m=1, n=9984, block_m=16, block_n=64, a_row_major=False, b_row_major=True),
            dict(base, m=1, n=9984, block_m=16, block_n=64, a_row_major=True, b_row_major=True),
            dict(base, m=9984, n=2, a_row_major=False, b_row_major=True),
            dict(base, m=9984, n=2, a_row_major=False, b_row_major=False)]
    cols, _ = validate(pl.DataFrame(rows), get_family("gemm"))
    plan = gemm.lower(cols, hw)
    for a, b in ((0, 1), (2, 3)):
        np.testing.assert_array_equal(plan.work_iter[a], plan.work_iter[b])
        np.testing.assert_array_equal(plan.t_bytes[a], plan.t_bytes[b])
        assert plan.chain_us[a] == plan.chain_us[b]
    assert plan.work_iter[4, R_SMEM] != plan.work_iter[5, R_SMEM]


@pytest.mark.parametrize("bm", [64, 128, 256, 512])
@pytest.mark.parametrize("bn", [16, 64, 256, 512])
@pytest.mark.parametrize("warps", [4, 8, 16])
@pytest.mark.parametrize("per_instruction", [True, False])
def test_wgmma_smem_reads_matches_twin(bm, bn, warps, per_instruction):
    wg_m, wg_n = gemm._warpgroup_grid(bm, warps)
    for bk, eb in ((16, 2), (64, 2), (128, 1), (32, 4)):
        assert gemm.wgmma_smem_reads(bm, bn, bk, eb, wg_m, wg_n, per_instruction) \
            == naive.wgmma_smem_reads(bm, bn, bk, eb, wg_m, wg_n, per_instruction)


def test_wgmma_reads_b_once_per_64_rows_by_hand():
    """Triton on sm_90 issues one m64nN wgmma per 64 rows of a warpgroup, each
    reading its B columns: a 128-row tile reads B twice whether one warpgroup
    (4 warps) repeats the instruction or two warpgroups (8 warps) take 64 rows
    each; a 64-row tile once, with A read by each warpgroup along N. The
    library's rows keep one B read per warpgroup along M."""
    hw = get_hw("h100_sxm")
    base = dict(m=4096, n=4096, k=4096, block_k=64, num_stages=3, split_k=1, tf32=False,
                a_row_major=True, b_row_major=False, dtype="float16")
    rows = [dict(base, block_m=128, block_n=64, num_warps=4),
            dict(base, block_m=128, block_n=64, num_warps=8),
            dict(base, block_m=64, block_n=128, num_warps=4),
            dict(base, block_m=64, block_n=128, num_warps=8),
            dict(base, block_m=256, block_n=128, num_warps=8)]
    cols, _ = validate(pl.DataFrame(rows), get_family("gemm"))
    plan = gemm.lower(cols, hw)
    assert list(plan.extra["mma_path"]) == ["wgmma"] * 5
    bk, eb = 64, 2
    copies = [(r["block_m"] + r["block_n"]) * bk * eb for r in rows]  # 16-byte cp.async
    reads = [bk * eb * (128 + 2 * 64),   # A once, B for rows 0-63 and 64-127
             bk * eb * (128 + 2 * 64),   # the same with a warpgroup on each half
             bk * eb * (64 + 128),       # one m64n128 instruction
             bk * eb * (2 * 64 + 128),   # two warpgroups along N: A twice, B halves once
             bk * eb * (256 + 4 * 128)]  # two warpgroups of 128 rows: B four times
    for i in range(5):
        assert plan.work_iter[i, R_SMEM] == reads[i] + copies[i], rows[i]
    assert plan.work_iter[0, R_SMEM] == plan.work_iter[1, R_SMEM]
    lib = [dict(r, backend="cublas") for r in rows[:2]]
    cols, _ = validate(pl.DataFrame(lib), get_family("gemm"))
    plan = gemm.lower(cols, hw)
    assert list(plan.extra["mma_path"]) == ["wgmma"] * 2
    assert plan.work_iter[0, R_SMEM] == bk * eb * (128 + 64) + copies[0]
    assert plan.work_iter[1, R_SMEM] == bk * eb * (128 + 2 * 64) + copies[1]


def test_layout_conversion_only_on_triton_wgmma_tiles():
    """The epilogue's layout conversion between full waves: Triton's Hopper wgmma
    tiles (2 x BM x BN x output bytes at the SM's shared-memory rate); not the
    library's rows (TMA-store epilogue), not A100's mma.sync tiles."""
    # m = 66 x 128: 4224 tiles, 32 full rounds on 132 SMs (no last-round clock)
    base = dict(m=8448, n=8192, k=4096, block_m=128, block_n=128, block_k=64, num_stages=4,
                num_warps=4, split_k=1, tf32=False, a_row_major=True, b_row_major=True,
                dtype="float16")
    cols, _ = validate(pl.DataFrame([dict(base, backend="triton"), dict(base, backend="cublas")]),
                       get_family("gemm"))
    h100 = get_hw("h100")
    plan = gemm.lower(cols, h100)
    assert str(plan.extra["mma_path"][0]) == "wgmma"
    want = 2.0 * 128 * 128 * 2 / (h100.smem_bytes_per_clk * h100.rate("clock_mhz"))
    assert plan.conv_us[0] == pytest.approx(want, rel=1e-12)  # 0.30 us at 1730 MHz
    assert plan.conv_us[1] == 0.0
    a100 = gemm.lower(cols, get_hw("a100"))
    assert a100.conv_us is None or not a100.conv_us.any()


def test_library_kernel_has_one_alignment_by_hand():
    """A library kernel loads A and B at one alignment (CUTLASS's generator:
    A and B of the same ``alignment``, C of ``min(8, alignment)``): a call runs
    at the narrowest of A's, B's and C's leading dimensions (C's where it allows
    fewer than 8 elements). A100 fp16 128x128x32 / 3 stages / 8 warps, A and B
    column-major: m = 2396 (A's rows 8-byte aligned) moves the library row's A
    and B copies from one SRAM pass to three (sram_passes(8)), 2 x 128 x 32 x 2
    bytes each, and the Triton row's A copy only; n = 1151 (C's rows 2 bytes)
    stages the library row's loads through registers (one pipeline stage) and
    not the Triton row's (its A and B are aligned); an fp8 call whose C rows
    hold 8 bf16 elements (n = 8) keeps its 16-byte loads."""
    base = dict(m=2400, n=1152, k=2048, block_m=128, block_n=128, block_k=32, num_stages=3,
                num_warps=8, split_k=1, dtype="float16", tf32=False, a_row_major=False,
                b_row_major=False)
    rows = [dict(base), dict(base, m=2396), dict(base, backend="cublas"),
            dict(base, m=2396, backend="cublas"), dict(base, n=1151),
            dict(base, n=1151, backend="cublas")]
    cols, _ = validate(pl.DataFrame(rows), get_family("gemm"))
    plan = gemm.lower(cols, get_hw("a100"))
    smem = plan.work_iter[:, R_SMEM]
    tile = 128 * 32 * 2
    assert smem[1] - smem[0] == (gemm.sram_passes(8) - 1.0) * tile
    assert smem[3] - smem[2] == 2 * (gemm.sram_passes(8) - 1.0) * tile
    assert plan.stages.tolist() == [3, 3, 3, 3, 3, 1]
    # and the twin agrees row by row (it writes C at the full DRAM rate)
    hw = get_hw("a100")
    _check(rows, dataclasses.replace(hw, calibration={**hw.calibration,
                                                      "library_store_efficiency": 1.0}))
    fp8 = dict(m=4096, n=8, k=4096, block_m=128, block_n=128, block_k=128, num_stages=4,
               num_warps=4, split_k=1, dtype="float8", tf32=False, a_row_major=True,
               b_row_major=False)
    cols, _ = validate(pl.DataFrame([fp8, dict(fp8, n=16), dict(fp8, backend="cublas"),
                                     dict(fp8, n=16, backend="cublas")]), get_family("gemm"))
    plan = gemm.lower(cols, get_hw("h100_sxm"))
    smem = plan.work_iter[:, R_SMEM]
    assert smem[2] == smem[3] and smem[0] == smem[1]


def test_two_stage_fma_dot_exposes_its_copy_by_hand():
    """Triton's 2-stage FMA dot does not prefetch (bench/triton_fma_loop.py
    --stages 2): its rows carry the copy's exposed latency and transfer, an L2
    hit's ``l2_latency_cycles`` plus the A and B tiles' SRAM writes at the SM's
    shared-memory rate; 3 stages and TF32 (tensor cores) carry none."""
    hw = get_hw("h100_sxm")
    base = {"m": 8192, "n": 8192, "k": 8192, "block_m": 128, "block_n": 128, "block_k": 32,
            "num_stages": 2, "num_warps": 8, "split_k": 1, "dtype": "float32", "tf32": False,
            "a_row_major": True, "b_row_major": True, "triton_version": "3.0"}
    rows = [base, dict(base, num_stages=3), dict(base, tf32=True)]
    cols, _ = validate(pl.DataFrame(rows), get_family("gemm"))
    plan = gemm.lower(cols, hw)
    clock = hw.rate("clock_mhz")
    # 128 x 32 + 32 x 128 fp32 elements in 16-byte vectors: 32 KiB through the SRAM
    # once, at 128 bytes a clock (4,096 tiles in rounds: no boost)
    smem = plan.rate[0, R_SMEM]
    assert smem == pytest.approx(hw.smem_bytes_per_clk * clock, rel=1e-12)
    want = hw.cal("l2_latency_cycles") / clock + 32768.0 / smem
    assert want == pytest.approx(456.0 / clock, rel=1e-12)  # 200 + 256 cycles
    assert plan.expose_us[0] == pytest.approx(want, rel=1e-12)
    assert (plan.expose_us[1:] == 0.0).all()
