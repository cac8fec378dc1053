"""FP8 GEMM: the resource vector of float8 rows (scale loads, FP32 promotion,
epilogue rescale), the library's FP8 tile catalog, monotonicity in bandwidths
and peaks, the H800 / H20 hardware files, and the accuracy run on PipeWeave's
FP8 data (when ../shared/data is present; no accuracy figure is asserted)."""

from __future__ import annotations

import dataclasses

import numpy as np
import polars as pl
import pytest

from kernels_catalog import gemm
from kernels_catalog.lowering import lower_program
from tsbatch.engine.evaluate import evaluate
from tsbatch.hw import get_hw, hw_dir, list_hw, load_hw_file
from tsbatch.kernels.envelope import R_CUDA, R_L2, R_TC
from tsbatch.boundary.schema import validate

BM, BN, BK = 128, 128, 128


def _lower_one(hw, **over):
    row = dict(m=4096, n=4096, k=4096, dtype="float8", a_row_major=True, b_row_major=False,
               block_m=BM, block_n=BN, block_k=BK, num_stages=6, num_warps=8,
               raster="persistent")
    row.update(over)
    cols, _ = validate(pl.DataFrame([row]), gemm.FAMILY)
    return gemm.lower(cols, get_hw(hw)), cols


@pytest.mark.parametrize("mode", ["tensor", "row", "block"])
@pytest.mark.parametrize("fast", [False, True])
def test_fp8_resource_vector_by_hand(mode, fast):
    plan, _ = _lower_one("h800", scale_mode=mode, fast_accum=fast)
    wi, we = plan.work_iter[0], plan.work_epi[0]
    assert wi[R_TC] == 2.0 * BM * BN * BK
    # promotion: one FADD (2 FLOP-equivalents) per accumulator element every
    # FP8_PROMOTE_K = 128 of K, i.e. once per 128-deep step; block scaling always
    # promotes (an FFMA with the scale product) and forms that product per row
    # and 128-column block
    promo = (not fast) or mode == "block"
    cuda = (2.0 * BM * BN * BK / gemm.FP8_PROMOTE_K) if promo else 0.0
    if mode == "block":
        cuda += 2.0 * BM * 1 * (BK / 128)
    assert wi[R_CUDA] == pytest.approx(cuda, rel=1e-12)
    # operand bytes (A row-major: 128-byte runs; B column-major: K contiguous,
    # 128-byte runs) and, under block scaling, the fp32 scales: BM per K block
    # for A, one 32-byte sector (ceil(BN / 128) = 1 scale) per K block for B
    a = BM * BK * 1.0 + (BM * 4.0 if mode == "block" else 0.0)
    b = BK * BN * 1.0 + (32.0 if mode == "block" else 0.0)
    c = BM * BN * 2.0
    np.testing.assert_allclose(plan.t_bytes[0], [a, b, c], rtol=1e-12)
    assert wi[R_L2] == pytest.approx(a + b, rel=1e-12)
    # epilogue: the bf16/fp16 conversion and store (2 per element) plus the
    # rescale: one FMUL per element (tensor), two (row), none (block: applied in
    # the loop); the scales' bytes go through L2
    extra = {"tensor": 2.0, "row": 4.0, "block": 0.0}[mode]
    assert we[R_CUDA] == pytest.approx((2.0 + extra) * BM * BN, rel=1e-12)
    scale_bytes = {"tensor": 8.0, "row": (BM + BN) * 4.0, "block": 0.0}[mode]
    assert we[R_L2] == pytest.approx(c + scale_bytes, rel=1e-12)
    # registers: both accumulators when promoting (256 threads: 64 each)
    acc = BM * BN // 256
    assert plan.regs_thread[0] == (2 * acc if promo else acc) + gemm.REGS_BASE


def test_fp8_edge_tile_and_block_scales_agree_with_tile_program():
    rows = [dict(m=m, n=n, k=k, dtype="float8", block_m=bm, block_n=bn, block_k=bk,
                 num_stages=4, num_warps=8, scale_mode=mode)
            for m, n, k in ((32, 4096, 4096), (1000, 777, 640), (4096, 4096, 256))
            for bm, bn, bk in ((128, 128, 128), (128, 256, 128), (64, 64, 64))
            for mode in ("tensor", "row", "block")]
    cols, _ = validate(pl.DataFrame(rows), gemm.FAMILY)
    hw = get_hw("h800")
    own = gemm.lower(cols, hw)
    gen = lower_program(gemm.PROGRAM, cols, hw)
    # own lowering rounds loads to 32-byte sectors: these tiles' runs are whole sectors
    np.testing.assert_allclose(own.t_bytes, gen.t_bytes, rtol=1e-12)
    np.testing.assert_allclose(own.work_iter[:, R_TC], gen.work_iter[:, R_TC], rtol=1e-12)
    # a 32-row problem on 128-row tiles moves 32 rows of A per tile, not 128
    plan, _ = _lower_one("h800", m=32)
    assert plan.t_bytes[0, 0] == 32 * BK


def test_scale_columns_leave_other_dtypes_alone():
    base = dict(m=2048, n=1024, k=4096, block_m=128, block_n=128, block_k=64, num_stages=4,
                num_warps=8)
    for dt in ("float16", "bfloat16", "float32"):
        a = evaluate(pl.DataFrame([dict(base, dtype=dt)]), "h100")
        b = evaluate(pl.DataFrame([dict(base, dtype=dt, scale_mode="block", fast_accum=True)]),
                     "h100")
        assert a["latency_us"].to_list() == b["latency_us"].to_list()


def test_fp8_library_rows_use_the_fp8_catalog():
    df = pl.DataFrame({"m": [4096, 32], "n": [4096, 4096], "k": [4096, 4096],
                       "dtype": ["float8", "float16"], "backend": ["cublas", "cublas"]})
    out = evaluate(df, "h800")
    fp8_tiles = {f"{c[0]}x{c[1]}x{c[2]}/s{c[3]}/w{c[4]}/k{c[5]}"
                 for c in gemm.LIBRARY_TILES_FP8["hopper"]}
    assert out["library_tile"][0] in fp8_tiles
    assert out["library_tile"][1] not in fp8_tiles


def test_fp8_without_fp8_tensor_cores_runs_on_fp16_rate():
    plan8, _ = _lower_one("a100", num_stages=3)
    plan16, _ = _lower_one("a100", num_stages=3, dtype="float16")
    assert plan8.rate[0, R_TC] == plan16.rate[0, R_TC] > 0.0
    assert plan8.work_iter[0, R_CUDA] > 0.0  # the fragment conversions


def _scaled(hw, **factors):
    """A copy of ``hw`` with rates multiplied (spec and measured values alike)."""
    meas = dict(hw.measured)
    kw = {}
    for key, f in factors.items():
        kw[key] = getattr(hw, key) * f
        if key in meas:
            meas[key] = meas[key] * f
    return dataclasses.replace(hw, measured=meas, **kw)


@pytest.mark.parametrize("name", ["h800", "h20"])
def test_fp8_time_never_falls_when_a_rate_falls(name):
    hw = get_hw(name)
    shapes = [(8, 4096, 4096), (32, 384, 2048), (512, 7168, 2048), (4096, 4096, 4096),
              (16384, 1024, 256), (131072, 2048, 256), (777, 5000, 1000)]
    rows = []
    for m, n, k in shapes:
        for mode in ("tensor", "row", "block"):
            rows.append(dict(m=m, n=n, k=k, dtype="float8", backend="cublas", scale_mode=mode,
                             a_row_major=True, b_row_major=False))
    df = pl.DataFrame(rows)
    base = evaluate(df, hw)["latency_us"].to_numpy()
    assert np.isfinite(base).all()
    for key in ("dram_bw_tbps", "l2_bw_tbps", "tc_fp8_tflops", "fp32_tflops", "l15_bw_tbps"):
        slow = evaluate(df, _scaled(hw, **{key: 0.5}))["latency_us"].to_numpy()
        assert (slow >= base * (1 - 1e-9)).all(), key


def test_h800_h20_files_load_and_resolve():
    assert {"h800", "h20"} <= set(list_hw())
    for key in ("h800", "h20"):
        spec = load_hw_file(hw_dir() / f"{key}.toml")
        assert spec.key == key and spec.arch == "hopper" and spec.mma == "wgmma"
        assert all(s.strip() for s in spec.sources.values())
    assert get_hw("H800").key == "h800" and get_hw("h800_sxm").key == "h800"
    assert get_hw("h20").key == "h20" and get_hw("H20 96GB").key == "h20"
    h800, h100, h20 = get_hw("h800"), get_hw("h100"), get_hw("h20")
    assert h800.sm_count == h100.sm_count == 132
    assert h800.tc_fp8_tflops == h100.tc_fp8_tflops and h800.dram_bw_tbps == 3.35
    assert h20.sm_count == 78 and h20.tc_fp8_tflops == 296.0 and h20.tc_bf16_tflops == 148.0
    assert h20.dram_bw_tbps == 4.0 and h20.l2_bytes == 60 * 2**20
    for k in ("iter_overhead_cycles", "mem_latency_us", "wgmma_share_efficiency",
              "dram_efficiency"):
        assert h800.cal(k) == h100.cal(k), k
    for k in ("mem_latency_us", "wgmma_share_efficiency", "dram_efficiency"):
        assert h20.cal(k) == h100.cal(k), k
    # the H20's clock_mhz is the tensor-rate clock (148 TFLOPS / 78 SM / 4096 FLOP/clk):
    # its per-clock figures are restated so that the shared-memory rate and the loop
    # overhead in time are the GH100 SM's at 1830 MHz
    assert h20.clock_mhz == pytest.approx(148e6 / (78 * 4096), rel=1e-3)
    assert h20.smem_bytes_per_clk * h20.clock_mhz == pytest.approx(128 * 1830, rel=1e-3)
    assert (h20.cal("iter_overhead_cycles") / h20.clock_mhz
            == pytest.approx(h100.cal("iter_overhead_cycles") / h100.clock_mhz, rel=2e-3))


def test_fp8_accuracy_on_pipeweave_data(shared_data):
    from tsbatch.measured.accuracy import run_accuracy

    path = shared_data / "gemm" / "pipeweave_fp8_gemm_train.parquet"
    if not path.exists():
        pytest.skip(f"{path} not found")
    gpus = pl.read_parquet(path, columns=["gpu"])["gpu"].unique().to_list()
    assert {get_hw(g).key for g in gpus} <= {"h800", "h20"}
    res = run_accuracy([path])
    by = res.by_gpu
    assert set(by["gpu"].to_list()) == {get_hw(g).key for g in gpus}
    assert res.skipped["infeasible_rows"] == 0
    assert res.scored["predicted_us"].is_finite().all()
    assert (by["mape_pct"] >= 0).all()
