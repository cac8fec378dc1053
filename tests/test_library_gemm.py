"""Library (cuBLAS) GEMM rows: the rules that apply to ``backend = 'cublas'``
rows only, checked by hand (issue 21, docs/gemm_accuracy.md "Library kernels").

- the catalog's K extent is bytes: 4-byte elements take half the 16-bit K;
- a library tensor-core kernel's warp fragments hold one 32-byte MMA K-step;
- Hopper TF32 with both operands M/N-contiguous runs mma.sync, not wgmma;
- a split-K library call whose fp32 partials fit the library's workspace pays a
  second (reduction) kernel (issue 35);
- one whose partials do not fit reduces in place, its splits one after another
  (a serial chain after the first wave; issue 35, session 5).
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from kernels_catalog import gemm
from tsbatch.kernels.envelope import R_DRAM, R_SMEM
from tsbatch.engine.evaluate import evaluate
from tsbatch.hw import get_hw
from tsbatch.boundary.schema import validate


def _lower_one(hw, backend="cublas", **over):
    row = dict(m=8192, n=8192, k=8192, dtype="float32", tf32=True, a_row_major=True,
               b_row_major=True, block_m=256, block_n=128, block_k=16, num_stages=3,
               num_warps=8, raster="grouped")
    row.update(over)
    cols, _ = validate(pl.DataFrame([row]), gemm.FAMILY)
    cols = dict(cols)
    cols["backend"] = np.array([backend], dtype=object)
    return gemm.lower(cols, get_hw(hw))


def _library_frame(**over):
    row = dict(m=4096, n=4096, k=4096, dtype="float16", tf32=False, a_row_major=True,
               b_row_major=True, backend="cublas")
    row.update(over)
    return pl.DataFrame([row])


@pytest.mark.parametrize("arch", ["ampere", "hopper"])
def test_library_k_is_bytes(arch):
    """float32 library rows take the catalog's K in bytes (LIBRARY_TILE_BYTES = 2:
    half the elements); 16-bit rows keep it; float8 rows keep their own catalog."""
    dtypes = ["float16", "bfloat16", "float32", "float32", "float8"]
    tf32 = [False, False, True, False, False]
    cols = {
        "m": np.full(5, 512), "n": np.full(5, 512), "k": np.full(5, 512),
        "dtype": np.array(dtypes, dtype=object), "tf32": np.array(tf32),
        "block_m": np.zeros(5, dtype=np.int64), "block_n": np.zeros(5, dtype=np.int64),
        "block_k": np.zeros(5, dtype=np.int64), "num_stages": np.zeros(5, dtype=np.int64),
        "num_warps": np.zeros(5, dtype=np.int64), "split_k": np.ones(5, dtype=np.int64),
        "group_m": np.ones(5, dtype=np.int64), "raster": np.array(["grouped"] * 5, dtype=object),
    }
    out, parent = gemm.expand_library(cols, np.ones(5, dtype=bool), arch)
    cat = gemm.LIBRARY_TILES[arch]
    for r, dt in enumerate(dtypes):
        bk = out["block_k"][parent == r]
        if dt == "float8" and arch in gemm.LIBRARY_TILES_FP8:
            assert list(bk) == [t[2] for t in gemm.LIBRARY_TILES_FP8[arch]]
        elif dt == "float32":
            assert list(bk) == [t[2] * 2 // 4 for t in cat]  # 32 -> 16, 64 -> 32
        else:
            assert list(bk) == [t[2] for t in cat]
        # tile shapes, stages and warps are the catalog's either way
        assert list(out["block_m"][parent == r]) == [
            t[0] for t in (gemm.LIBRARY_TILES_FP8[arch] if dt == "float8" and arch in
                           gemm.LIBRARY_TILES_FP8 else cat)]


def test_library_tf32_fragments_one_mma_step():
    """256x128 TF32 tile on 8 warps (A100): warp grid 4 x 2 (64 x 64 a warp).
    Library: accumulator 256*128/256 = 128 registers, fragments
    2 x (64 + 64) rows x 32 bytes / 4 / 32 lanes = 64, base 40: 232 <= 255, no
    spill. A Triton row of the same tile the same: Triton's TF32 dot also loads
    its fragments one m16n8k8 step (32 bytes of K) ahead (ptxas for sm_80:
    128x128x32 on 4 warps 251-255 registers, where 16 elements of K, 64 bytes,
    would ask 296)."""
    lib = _lower_one("a100")
    assert int(lib.regs_thread[0]) == 128 + 64 + 40
    assert int(lib.extra["register_spill"][0]) == 0
    tri = _lower_one("a100", backend="triton")
    assert int(tri.regs_thread[0]) == 128 + 64 + 40
    assert int(tri.extra["register_spill"][0]) == 0
    # 16-bit rows: 16 elements of K are 32 bytes already, unchanged
    h_lib = _lower_one("a100", dtype="float16", tf32=False, block_k=32)
    h_tri = _lower_one("a100", dtype="float16", tf32=False, block_k=32, backend="triton")
    assert int(h_lib.regs_thread[0]) == int(h_tri.regs_thread[0]) == 128 + 64 + 40


@pytest.mark.parametrize("a_rm,b_rm,path", [
    (True, False, "wgmma"),    # both K-major
    (False, False, "wgmma"),   # A M-contiguous only: A from registers
    (True, True, "wgmma"),     # B N-contiguous only: swapped, from registers
    (False, True, "mma_sync"),  # both M/N-contiguous: no wgmma for 32-bit operands
])
def test_hopper_tf32_library_layouts(a_rm, b_rm, path):
    plan = _lower_one("h100", a_row_major=a_rm, b_row_major=b_rm, block_m=128,
                      block_n=128, block_k=32, num_stages=5, num_warps=4,
                      raster="persistent")
    assert plan.extra["mma_path"][0] == path
    # the rule is the library's: the Triton row of the same configuration, the
    # 16-bit library row and the IEEE FP32 library row are untouched by it
    tri = _lower_one("h100", backend="triton", a_row_major=a_rm, b_row_major=b_rm,
                     block_m=128, block_n=128, block_k=32, num_stages=5, num_warps=4,
                     raster="persistent")
    assert tri.extra["mma_path"][0] == "wgmma"
    h = _lower_one("h100", dtype="bfloat16", tf32=False, a_row_major=a_rm,
                   b_row_major=b_rm, block_m=128, block_n=128, block_k=64,
                   num_stages=5, num_warps=4, raster="persistent")
    assert h.extra["mma_path"][0] == "wgmma"
    f = _lower_one("h100", tf32=False, a_row_major=a_rm, b_row_major=b_rm, block_m=128,
                   block_n=128, block_k=32, num_stages=5, num_warps=4, raster="persistent")
    assert f.extra["mma_path"][0] == "fma"


def test_hopper_tf32_mn_major_runs_at_the_mma_sync_rate():
    """The mma.sync path's tensor rate is mma_sync_fraction of wgmma's."""
    hw = get_hw("h100")
    kw = dict(block_m=128, block_n=128, block_k=32, num_stages=5, num_warps=4,
              raster="persistent")
    k_major = _lower_one("h100", a_row_major=True, b_row_major=False, **kw)
    mn_major = _lower_one("h100", a_row_major=False, b_row_major=True, **kw)
    from tsbatch.kernels.envelope import R_TC
    assert mn_major.rate[0, R_TC] == pytest.approx(
        k_major.rate[0, R_TC] * hw.mma_sync_fraction, rel=1e-12)


def test_library_tile_reports_the_byte_scaled_k():
    """evaluate's library_tile names the winning tile with its K in elements."""
    hw = get_hw("h100")
    out = evaluate(_library_frame(dtype="float32", tf32=True), hw)
    bk = int(out["library_tile"][0].split("x")[2].split("/")[0])
    hopper_ks = {t[2] * 2 // 4 for t in gemm.LIBRARY_TILES["hopper"]}
    assert bk in hopper_ks and bk == 32
    out16 = evaluate(_library_frame(dtype="bfloat16"), hw)
    assert int(out16["library_tile"][0].split("x")[2].split("/")[0]) == 64


@pytest.mark.parametrize("hw", ["a100", "h100_sxm"])
def test_library_split_k_reduction_kernel(hw):
    """A library split-K row whose fp32 partials fit the library's workspace pays
    a second kernel (launch-to-start, one memory latency, the partials read at the
    L2 rate and C written at the DRAM rate); one whose partials do not fit, an
    unsplit library row, and a Triton split-K row (in-kernel atomics) pay none."""
    spec = get_hw(hw)
    tile = dict(block_m=64, block_n=64, block_k=64, num_stages=4, num_warps=4)
    m, n = 32, 1280
    plan = _lower_one(hw, m=m, n=n, k=1024, dtype="float16", tf32=False, split_k=4, **tile)
    post = plan.extra["post_us"][0]
    mn = float(m * n)
    want = (spec.launch_overhead_us + spec.cal("mem_latency_us")
            + 4 * 4.0 * mn / (spec.rate("l2_bw_tbps") * 1e6 * spec.cal("l2_efficiency"))
            + 2.0 * mn / (spec.rate("dram_bw_tbps") * 1e6 * spec.cal("dram_efficiency")))
    assert post == pytest.approx(want, rel=1e-9)
    assert post > spec.launch_overhead_us
    # partials larger than the workspace: reduced in place, no second kernel
    ws = gemm.LIBRARY_WORKSPACE_BYTES[spec.arch]
    big = int(np.sqrt(ws / 16.0)) + 64
    assert 4 * 4 * big * big > ws
    assert "post_us" not in _lower_one(hw, m=big, n=big, k=1024, dtype="float16", tf32=False,
                                       split_k=4, **tile).extra
    assert "post_us" not in _lower_one(hw, m=m, n=n, k=1024, dtype="float16", tf32=False,
                                       split_k=1, **tile).extra
    assert "post_us" not in _lower_one(hw, backend="triton", m=m, n=n, k=1024,
                                       dtype="float16", tf32=False, split_k=4, **tile).extra


def test_library_split_k_reduction_in_the_latency():
    """evaluate adds the second kernel to the epilogue and the latency: a library
    row's result is still launch + prologue + steady + epilogue, and a skinny
    GEMM whose best catalog tile splits K (A100 1920 x 2 x 7552) carries its
    reduction kernel in the epilogue."""
    out = evaluate(_library_frame(m=1920, n=2, k=7552), "a100")
    r = out.row(0, named=True)
    assert r["latency_us"] == pytest.approx(
        r["t_launch_us"] + r["t_prologue_us"] + r["t_steady_us"] + r["t_epilogue_us"], rel=1e-9)
    bm, bn, rest = r["library_tile"].split("x", 2)
    bk, st, w, sk = rest.split("/")
    assert int(sk[1:]) > 1
    plan = _lower_one("a100", m=1920, n=2, k=7552, dtype="float16", tf32=False,
                      block_m=int(bm), block_n=int(bn), block_k=int(bk), num_stages=int(st[1:]),
                      num_warps=int(w[1:]), split_k=int(sk[1:]))
    assert r["t_epilogue_us"] > plan.extra["post_us"][0] > get_hw("a100").launch_overhead_us


@pytest.mark.parametrize("hw", ["a100", "h100_sxm"])
def test_library_split_k_in_place_is_serial(hw):
    """A library split-K row whose fp32 partials do not fit the workspace reduces
    in place, its splits one after another (cuBLASLt's INPLACE scheme): a serial
    chain of split_k - 1 links, three L2 latencies each plus, on an sm80-style
    tile, the waiter's epilogue passes; a row that reduces in the workspace, an
    unsplit one and a Triton split-K row have none."""
    spec = get_hw(hw)
    cyc = 1.0 / spec.rate("clock_mhz")
    ws = gemm.LIBRARY_WORKSPACE_BYTES[spec.arch]
    tile = dict(block_m=64, block_n=64, block_k=64, num_stages=4, num_warps=4)
    m, n = 1280, 1024  # 16 fp32 partials of 1280 x 1024: 84 MB, past either workspace
    assert 16 * 4 * m * n > ws
    # k = 13824 (27648-byte rows): aligned, a TMA kernel on Hopper (no passes)
    plan = _lower_one(hw, m=m, n=n, k=13824, dtype="float16", tf32=False, split_k=16, **tile)
    link = 3.0 * spec.cal("l2_latency_cycles") * cyc
    sm80 = spec.mma not in ("wgmma", "tcgen05")
    passes = 4 * spec.cal("library_epilogue_pass_cycles") * cyc if sm80 else 0.0  # 32-row warp tiles
    assert plan.extra["serial_us"][0] == pytest.approx(15 * (link + passes), rel=1e-12)
    # misaligned (k = 13823: 2-byte rows): an sm80-style kernel everywhere, passes too
    mis = _lower_one(hw, m=m, n=n, k=13823, dtype="float16", tf32=False, split_k=16, **tile)
    assert mis.extra["serial_us"][0] == pytest.approx(
        15 * (link + 4 * spec.cal("library_epilogue_pass_cycles") * cyc), rel=1e-12)
    for over in (dict(m=32, n=64, split_k=16), dict(split_k=1)):
        assert "serial_us" not in _lower_one(hw, **{**dict(m=m, n=n, k=13824, dtype="float16",
                                                           tf32=False, **tile), **over}).extra
    assert "serial_us" not in _lower_one(hw, backend="triton", m=m, n=n, k=13824,
                                         dtype="float16", tf32=False, split_k=16, **tile).extra


def test_library_split_k_serial_chain_in_the_latency():
    """The chain follows one wave: a one-wave in-place split-K grid (A100 1280 x 64
    x 13824 on 64 x 64 / split 16: 320 tiles, 324 slots) is predicted its
    envelope plus the whole chain, in the epilogue; a grid of many waves (4096 x
    4096 on 64 x 64 / split 16, 64 waves) runs the chain under its later waves."""
    from tsbatch.engine.evaluate import evaluate_plan
    spec = get_hw("a100")
    tile = dict(block_m=64, block_n=64, block_k=64, num_stages=4, num_warps=4, split_k=16)
    for (m, n, k), whole in (((1280, 64, 13824), True), ((4096, 4096, 13824), False)):
        plan = _lower_one("a100", m=m, n=n, k=k, dtype="float16", tf32=False, **tile)
        chain = plan.extra["serial_us"][0]
        assert chain > 0.0
        on = evaluate_plan(plan, spec)
        off_plan = plan
        off_plan.extra = {k_: v for k_, v in plan.extra.items() if k_ != "serial_us"}
        off = evaluate_plan(off_plan, spec)
        add = on["latency_us"][0] - off["latency_us"][0]
        assert on["t_epilogue_us"][0] - off["t_epilogue_us"][0] == pytest.approx(add, abs=1e-9)
        if whole:
            assert on["waves"][0] == 1
            assert add == pytest.approx(chain, rel=1e-9)
        else:
            assert on["waves"][0] > 8
            assert add == 0.0


@pytest.mark.parametrize("hw", ["a100", "h100_sxm"])
def test_library_operand_alignment(hw):
    """The library's kernels load an operand as wide as its rows' alignment allows
    (CUTLASS's alignment variants), as Triton does: an odd leading dimension of a
    16-bit operand (2 bytes) is not pipelined and copies through L1 in more SRAM
    passes; 8-byte alignment keeps the pipeline, with more SRAM traffic than 16."""
    tile = dict(block_m=128, block_n=128, block_k=32, num_stages=4, num_warps=4, split_k=1,
                dtype="float16", tf32=False, a_row_major=True, b_row_major=True)
    aligned = _lower_one(hw, m=4096, n=4096, k=4096, **tile)
    odd = _lower_one(hw, m=4096, n=4096, k=4095, **tile)
    four = _lower_one(hw, m=4096, n=4096, k=4092, **tile)
    assert aligned.stages[0] == 4 and four.stages[0] == 4
    assert odd.stages[0] == 1
    assert odd.work_iter[0, R_SMEM] > four.work_iter[0, R_SMEM] > aligned.work_iter[0, R_SMEM]


def test_library_store_efficiency():
    """A library tensor-core row's C store moves its DRAM bytes at
    library_store_efficiency of the DRAM rate (its epilogue DRAM work divided by
    it); the library's SIMT SGEMM (IEEE FP32) and Triton rows store as before."""
    import dataclasses

    spec = get_hw("a100")
    assert spec.cal("library_store_efficiency") < 1.0  # a100.toml declares it
    unit = dataclasses.replace(spec, calibration={**spec.calibration,
                                                  "library_store_efficiency": 1.0})
    tile = dict(m=8192, n=8192, k=8, block_m=128, block_n=128, block_k=32, num_stages=4,
                num_warps=4, split_k=1, a_row_major=True, b_row_major=True)

    def epi(hw, backend, dtype, tf32):
        row = dict(tile, dtype=dtype, tf32=tf32)
        cols, _ = validate(pl.DataFrame([row]), gemm.FAMILY)
        cols = dict(cols)
        cols["backend"] = np.array([backend], dtype=object)
        return gemm.lower(cols, hw).work_epi[0, R_DRAM]

    lse = spec.cal("library_store_efficiency")
    for dtype, tf32 in (("float16", False), ("bfloat16", False), ("float32", True)):
        assert epi(spec, "cublas", dtype, tf32) == pytest.approx(
            epi(unit, "cublas", dtype, tf32) / lse, rel=1e-12)
        assert epi(spec, "triton", dtype, tf32) == epi(unit, "triton", dtype, tf32)
    assert epi(spec, "cublas", "float32", False) == epi(unit, "cublas", "float32", False)


def test_library_tma_descriptor_fetch(monkeypatch):
    """A Hopper library row on the wgmma path waits one memory latency (the TMA
    descriptor fetch) before its first load: in the prologue and the latency, by
    exactly the hardware's mem_latency_us; a Triton row of the same tile, an
    Ampere library row, and a Hopper library row off the TMA path (TF32 with both
    operands M/N-contiguous: the mma.sync kernel) pay nothing."""
    h100 = get_hw("h100_sxm")
    tile = dict(block_m=128, block_n=128, block_k=64, num_stages=4, num_warps=8, split_k=1,
                dtype="float16", tf32=False)
    plan = _lower_one("h100_sxm", m=4096, n=4096, k=4096, **tile)
    assert plan.extra["pre_us"][0] == pytest.approx(h100.cal("mem_latency_us"), rel=1e-12)
    assert "pre_us" not in _lower_one("h100_sxm", backend="triton", m=4096, n=4096, k=4096,
                                      **tile).extra
    assert "pre_us" not in _lower_one("a100", m=4096, n=4096, k=4096, **tile).extra
    mn_tf32 = _lower_one("h100_sxm", m=4096, n=4096, k=4096, dtype="float32", tf32=True,
                         a_row_major=False, b_row_major=True, block_m=128, block_n=128,
                         block_k=32, num_stages=4, num_warps=8, split_k=1)
    assert "pre_us" not in mn_tf32.extra or mn_tf32.extra["pre_us"][0] == 0.0
    # in the result: the prologue and the latency carry it, nothing else moves
    frame = _library_frame(m=256, n=256, k=256)
    with_fetch = evaluate(frame, "h100_sxm").row(0, named=True)
    monkeypatch.setattr(gemm, "_library_tma_prologue", lambda *a: None)
    without = evaluate(frame, "h100_sxm").row(0, named=True)
    lat = h100.cal("mem_latency_us")
    assert with_fetch["library_tile"] == without["library_tile"]
    assert with_fetch["t_prologue_us"] == pytest.approx(without["t_prologue_us"] + lat, rel=1e-9)
    assert with_fetch["latency_us"] == pytest.approx(without["latency_us"] + lat, rel=1e-9)
    assert with_fetch["t_steady_us"] == pytest.approx(without["t_steady_us"], rel=1e-12)
    assert with_fetch["latency_us"] == pytest.approx(
        with_fetch["t_launch_us"] + with_fetch["t_prologue_us"] + with_fetch["t_steady_us"]
        + with_fetch["t_epilogue_us"], rel=1e-9)


@pytest.mark.parametrize("arch", ["ampere", "hopper"])
def test_library_gemv_offered_to_unit_fp32_rows_only(arch):
    """The GEMV tile (LIBRARY_GEMV_TILES) joins the catalog of an IEEE FP32 library
    row with n = 1 (block_n = 1) or m = 1 (block_m = 1), and of no other row: not
    m = 2, not TF32, not 16-bit or FP8, not a square call."""
    spec = [  # m, n, dtype, tf32, expected GEMV key
        (9984, 1, "float32", False, "n1"), (1, 9984, "float32", False, "m1"),
        (1, 1, "float32", False, "n1"), (2, 5504, "float32", False, None),
        (9984, 2, "float32", False, None), (9984, 1, "float32", True, None),
        (9984, 1, "float16", False, None), (1, 9984, "bfloat16", False, None),
        (9984, 1, "float8", False, None), (512, 512, "float32", False, None),
    ]
    r = len(spec)
    cols = {
        "m": np.array([s[0] for s in spec]), "n": np.array([s[1] for s in spec]),
        "k": np.full(r, 4480), "dtype": np.array([s[2] for s in spec], dtype=object),
        "tf32": np.array([s[3] for s in spec]),
        "block_m": np.zeros(r, dtype=np.int64), "block_n": np.zeros(r, dtype=np.int64),
        "block_k": np.zeros(r, dtype=np.int64), "num_stages": np.zeros(r, dtype=np.int64),
        "num_warps": np.zeros(r, dtype=np.int64), "split_k": np.ones(r, dtype=np.int64),
        "group_m": np.ones(r, dtype=np.int64), "raster": np.array(["grouped"] * r, dtype=object),
    }
    out, parent = gemm.expand_library(cols, np.ones(r, dtype=bool), arch)
    cat = gemm.LIBRARY_TILES[arch]
    for i, (_m, _n, dt, _tf, key) in enumerate(spec):
        sel = parent == i
        shapes = list(zip(out["block_m"][sel], out["block_n"][sel], out["num_stages"][sel],
                          out["num_warps"][sel], out["split_k"][sel]))
        base = (gemm.LIBRARY_TILES_FP8[arch] if dt == "float8" and arch in gemm.LIBRARY_TILES_FP8
                else cat)
        want = [(t[0], t[1], t[3], t[4], t[5]) for t in base]
        if key is not None:
            g = gemm.LIBRARY_GEMV_TILES[key]
            want.append((g[0], g[1], g[3], g[4], g[5]))
            # K in the catalog's bytes: 4-byte elements take half the 2-byte K
            assert out["block_k"][sel][-1] == g[2] * gemm.LIBRARY_TILE_BYTES // 4
        assert sorted(shapes) == sorted(want), (i, shapes)
        # a 1-wide tile only where the GEMV is offered
        assert ((out["block_m"][sel] == 1) | (out["block_n"][sel] == 1)).any() == (key is not None)


@pytest.mark.parametrize("hw", ["a100", "h100_sxm"])
def test_library_gemv_streams_its_matrix(hw):
    """An FP32 GEMV-shaped library call is priced by its GEMV tile, which streams
    the matrix once: its DRAM bytes are the matrix's (4 m k, to 1 %), its time
    above the launch follows them (twice the bytes, 1.8-2.2x the time once
    DRAM-bound), it is bounded below by the bytes at the DRAM peak, and the m = 1
    call is its n = 1 transpose's twin (to 0.1 %). On A100 the padded 32-wide SIMT
    tile it replaces does 32x the FMA work, more time than the stream."""
    spec = get_hw(hw)
    rows = [dict(m=8192, n=1, k=8192), dict(m=16384, n=1, k=8192), dict(m=1, n=8192, k=8192)]
    frame = pl.DataFrame([{**_library_frame().row(0, named=True), **r, "dtype": "float32"}
                          for r in rows])
    frame = frame.with_columns(b_row_major=pl.Series([True, True, False]))
    out = evaluate(frame, hw)
    tiles = out["library_tile"].to_list()
    assert tiles[0].startswith("16x1x") and tiles[2].startswith("1x16x"), tiles
    assert out["bottleneck"][1] == "dram"
    lat = out["latency_us"].to_numpy()
    body = lat - out["t_launch_us"].to_numpy()
    stream = 4.0 * np.array([8192 * 8192, 16384 * 8192, 8192 * 8192])
    assert np.allclose(out["dram_bytes"].to_numpy() / stream, 1.0, atol=0.01)
    assert 1.8 <= body[1] / body[0] <= 2.2
    peak = stream / (spec.rate("dram_bw_tbps") * 1e6)  # us at the DRAM peak
    assert (body >= peak).all()
    # the same stream (C's store and the vector's own loads differ by a few ns)
    assert lat[2] == pytest.approx(lat[0], rel=1e-3)
    if hw == "a100":
        # the smallest SIMT tile's FMA work alone (32 columns where one is used)
        # is more than the stream on A100 (19.5 TFLOPS FP32 against 1.7 TB/s;
        # on H100 its 67 TFLOPS put the two closer)
        fma_padded = 2.0 * 16384 * 32 * 8192 / (spec.rate("fp32_tflops") * 1e6)
        assert body[1] < fma_padded


def test_library_stream_k_valid_follows_cutlass():
    """The stream-K rule (CUTLASS's sm90 heuristic): data-parallel when the grid fills
    half the SMs or more, or when its units a tile, min(SMs // tiles, k_tiles // 8),
    are fewer than two; otherwise split, into any count of 2, 4, 8, 16 that fits the
    SMs (split <= SMs // tiles). H100's 132 SMs, 64x64x64 tiles: M = 6, N = 4096,
    K = 10944 is 64 tiles -> 2 only (cuBLAS's nvjet ..._splitK trace: grid 2 x 64);
    32 x 1280 x 1024: 20 tiles, 16 K steps -> 2 and 4; 640^3: 100 tiles -> none;
    K = 512 (8 steps) and K = 960 (15 steps: 1 unit) -> none; 8 tiles of 256 K
    steps -> all four; 65 tiles -> 2, 66 -> none."""
    m = np.array([6, 32, 640, 32, 32, 8, 64, 64])
    n = np.array([4096, 1280, 640, 1280, 1280, 512, 4160, 4224])
    k = np.array([10944, 1024, 640, 512, 960, 16384, 1024, 1024])
    want = [[2], [2, 4], [], [], [], [2, 4, 8, 16], [2], []]
    assert gemm.LIBRARY_STREAM_K_SPLITS == (2, 4, 8, 16)
    for i in range(m.size):
        got = [s for s in gemm.LIBRARY_STREAM_K_SPLITS
               if gemm.library_stream_k_valid(m[i], n[i], k[i], 64, 64, 64, s, 132)]
        assert got == want[i], (i, got)
        assert not gemm.library_stream_k_valid(m[i], n[i], k[i], 64, 64, 64, 1, 132)
    # the floor's kernels: the catalog's split tile shapes at each count
    for arch in ("ampere", "hopper"):
        tiles = gemm.library_stream_k_tiles(arch)
        shapes = {c[:5] for c in gemm.LIBRARY_TILES[arch] if c[5] > 1}
        assert {c[:5] for c in tiles} == shapes
        assert sorted(c[5] for c in tiles) == sorted(list(gemm.LIBRARY_STREAM_K_SPLITS) * len(shapes))


@pytest.mark.parametrize("arch", ["ampere", "hopper"])
def test_library_stream_k_points(arch):
    """The stream-K floor's points of a row: smaller problems (m' <= m, n' <= n,
    the same k) whose smallest-tile grid is under half the SMs, the maximal ones
    only; none where K has fewer than 16 of that tile's steps, for float8 rows or
    IEEE FP32 (CUDA-core) rows. A row under half the SMs is its own point."""
    sms = 132
    plain = [c for c in gemm.LIBRARY_TILES[arch] if c[5] == 1]
    bm0, bn0, bk0 = min(plain, key=lambda c: c[0] * c[1])[:3]
    h = (sms - 1) // 2
    rows = [(32, 1280, 1024, "float16", False), (4096, 4096, 4096, "bfloat16", False),
            (4096, 4096, 512, "float16", False), (64, 64, 64, "float16", False),
            (256, 256, 4096, "float8", False), (4096, 1, 4096, "float32", False),
            (4096, 1, 4096, "float32", True), (32, 1280, 1024, "float32", False)]
    cols = {"m": np.array([r[0] for r in rows]), "n": np.array([r[1] for r in rows]),
            "k": np.array([r[2] for r in rows]),
            "dtype": np.array([r[3] for r in rows], dtype=object),
            "tf32": np.array([r[4] for r in rows])}
    parent, pts = gemm.library_stream_k_points(cols, np.ones(len(rows), dtype=bool), arch, sms)
    for i, (m, n, k, dt, tf) in enumerate(rows):
        sel = parent == i
        kt = -(-k // max(bk0 * gemm.LIBRARY_TILE_BYTES // (4 if dt == "float32" else 2), 1))
        if dt == "float8" or (dt == "float32" and not tf) or kt < 16:
            assert not sel.any(), i
            continue
        pm, pn = pts["m"][sel], pts["n"][sel]
        assert sel.any() and (pm <= m).all() and (pn <= n).all() and (pts["k"][sel] == k).all()
        grid = (-(-pm // bm0)) * (-(-pn // bn0))
        assert (2 * grid < sms).all()
        # maximal: one more tile row or column leaves the set (or the problem)
        for a, b in zip(pm, pn):
            assert a == m or (-(-a // bm0) + 1) * (-(-b // bn0)) > h
            assert b == n or (-(-a // bm0)) * (-(-b // bn0) + 1) > h
        if 2 * (-(-m // bm0)) * (-(-n // bn0)) < sms:
            assert list(zip(pm, pn)) == [(m, n)]


@pytest.mark.parametrize("hw", ["a100", "h100_sxm", "h200"])
def test_library_stream_k_floor(hw, monkeypatch):
    """A library call the stream-K rule splits (a grid under half the SMs, 16+ K
    steps) is priced at least its split kernel, and a larger one never below it:
    grown in m or n across the switch, the prediction does not fall (CUTLASS's
    rule alone would: H100 32 x 4160 x 1024 split 13.8 us, 32 x 4224 unsplit 9.2,
    docs/gemm_accuracy.md "The library's small calls, session 10"). Every row is
    at least what it was without the floor (the catalog's best tile), calls with a
    short K or a large problem are unchanged, and the result is still launch +
    prologue + steady + epilogue."""
    from tsbatch.engine import evaluate as ev

    rows = ([dict(m=m, n=1024, k=1024) for m in range(8, 1100, 24)]
            + [dict(m=32, n=n, k=1024) for n in range(128, 9000, 128)]
            + [dict(m=32, n=1280, k=1024), dict(m=32, n=1280, k=256),
               dict(m=4096, n=4096, k=4096)])
    nm = 46
    assert rows[nm - 1]["m"] == 8 + 24 * 45 and rows[nm]["m"] == 32
    frame = pl.DataFrame([{**_library_frame().row(0, named=True), **r} for r in rows])
    out = evaluate(frame, hw)
    lat = out["latency_us"].to_numpy()
    parts = (out["t_launch_us"] + out["t_prologue_us"] + out["t_steady_us"]
             + out["t_epilogue_us"]).to_numpy()
    assert np.allclose(lat, parts, rtol=1e-9)
    for s in (slice(0, nm), slice(nm, len(rows) - 3)):
        seg = lat[s]
        assert (np.diff(seg) >= -1e-3 * seg[:-1]).all(), s
    # the floor: at least the fastest split tile (rule's split count) of the call itself
    spec = get_hw(hw)
    cols, is_lib = validate(frame, gemm.FAMILY)
    floor = ev._library_stream_k_floor(cols, is_lib, spec, 4, ev.WAVE_SAMPLES, 4, None, None)
    on = len(rows) - 3
    assert np.isfinite(floor[on]) and lat[on] >= floor[on] * (1 - 1e-12)
    assert np.isneginf(floor[on + 1])  # K = 256: 4 steps of 64, data-parallel
    assert (lat >= np.maximum(floor, 0.0) * (1 - 1e-12)).all()
    # without the floor: the catalog's best tile
    monkeypatch.setattr(gemm, "library_stream_k_points",
                        lambda *a, **k: (np.zeros(0, dtype=np.int64), None))
    base = evaluate(frame, hw)["latency_us"].to_numpy()
    assert (lat >= base * (1 - 1e-12)).all()
    assert lat[on] > base[on]
    assert lat[on + 1] == base[on + 1] and lat[on + 2] == base[on + 2]
    # the output marks the rows the floor, not the named tile, prices
    marked = [t.endswith(" +stream-K floor") for t in out["library_tile"].to_list()]
    assert marked == list(lat > base) and marked[on] and not marked[on + 1]
