"""GEMM ``C[m, n] = A[m, k] @ B[k, n]`` as a tiled, software-pipelined kernel.

The symbolic tile program, as a kernel author would sketch it (Triton's
matmul template, CUTLASS's mainloop)::

    for tile (i, j, z) in launch_order(grid = [ceil(m/BM), ceil(n/BN), split_k]):
        acc[BM, BN] = 0                              # registers, fp32
        for s in range(ceil(k / split_k / BK)):      # reduction loop, `stages` deep
            a = load A[i, s]   (BM x BK)  -> smem ring slot   # reuse dims {j}
            b = load B[s, j]   (BK x BN)  -> smem ring slot   # reuse dims {i}
            acc += a @ b                              # tensor cores
        store C[i, j] (BM x BN)                       # once per tile

Lowering evaluates this program's sizes for the whole batch at once.

Candidate columns are those of the measured Triton data sets
(``shared/data/gemm/*_triton_mm.parquet``); see :data:`COLUMNS` for the
optional ones and their defaults. Rows whose ``backend`` is ``cublas``
carry no tile configuration: they are predicted as the best entry of
:data:`LIBRARY_TILES` for the GPU's architecture (:func:`expand_library`).
"""

from __future__ import annotations

import math
import re

import numpy as np

from pathlib import Path

from kernels_catalog.base import (
    MAX_CACHE_BLOCKS, MAX_GRID_TILES, SIZE_LIMIT, Column, Family, TilePlan, clamp_group,
    map_codes, mma_path_extra, same_object,
)
from kernels_catalog.program import load_program
from tsbatch.kernels._config import jit_exact
from tsbatch.kernels._threads import even_bounds, run_shares
from tsbatch.kernels.occupancy import l1_left, resident_tiles
from tsbatch.kernels.envelope import (
    N_RES, R_CUDA, R_DRAM, R_L15, R_L2, R_SMEM, R_TC, clock_factor,
)
from tsbatch.kernels.order import ORDER_GROUPED, ORDER_NAMES, ORDER_PERSISTENT

__all__ = ["FAMILY", "COLUMNS", "DTYPES", "LIBRARY_TILES", "LIBRARY_TILES_FP8",
           "LIBRARY_GEMV_TILES", "SCALE_MODES",
           "TRITON_VERSION_DEFAULT", "TRITON_PIPELINED_MN32", "triton_release", "mn32_wavefronts",
           "wgmma_smem_reads", "WGMMA_M", "WGMMA_N_MAX",
           "FP8_PROMOTE_K", "FP8_SCALE_BLOCK", "ADMIT_RULES", "admit", "lower", "expand_library",
           "LIBRARY_STREAM_K_MIN_ITERS", "LIBRARY_STREAM_K_SPLITS", "library_stream_k_tiles",
           "library_stream_k_valid", "library_stream_k_points"]

#: input dtype -> (bytes per element, output bytes, tensor-core rate key)
DTYPES = {
    "float16": (2, 2, "float16"),
    "bfloat16": (2, 2, "bfloat16"),
    "float32": (4, 4, "tf32"),
    "float8": (1, 2, "float8"),
}
_DTYPE_CODE = {name: i for i, name in enumerate(DTYPES)}

#: the Triton release a candidate row without ``triton_version`` is modelled for
TRITON_VERSION_DEFAULT = "3.6"
#: what a ``triton_version`` value must look like: major.minor, then anything
#: (a patch number, a local build tag) that the model ignores
TRITON_VERSION_PATTERN = r"\d+\.\d+([.+\-].*)?"
#: the first release that copies M/N-contiguous TF32 operands for warpgroup MMA
#: with 4-byte cp.async, pipelined (earlier ones stage them through registers),
#: as ``major * 1000 + minor`` (:func:`triton_release`)
TRITON_PIPELINED_MN32 = 3003


def _release_code(text: str) -> int:
    major, minor = str(text).split(".")[:2]
    return int(major) * 1000 + int(re.match(r"\d+", minor).group())


def triton_release(versions) -> np.ndarray:
    """``major * 1000 + minor`` of each ``triton_version`` text (already checked
    against :data:`TRITON_VERSION_PATTERN`), as int64."""
    arr = np.asarray(versions, dtype=object)
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    if (arr == arr[0]).all():  # one release (the usual case): no per-row lookup
        return np.full(arr.shape[0], _release_code(arr[0]), dtype=np.int64)
    return map_codes(arr, {v: _release_code(v) for v in set(arr.tolist())})


COLUMNS = (
    Column("m", "int", "rows of A and C", positive=True),
    Column("n", "int", "columns of B and C", positive=True),
    Column("k", "int", "reduction length", positive=True),
    Column("dtype", "str", "input element type", choices=tuple(DTYPES)),
    Column("a_row_major", "bool", "A stored row-major (k contiguous)", required=False, default=True),
    Column("b_row_major", "bool", "B stored row-major (n contiguous)", required=False, default=True),
    Column("tf32", "bool", "float32 inputs multiplied on tensor cores as TF32 "
           "(false: CUDA-core FP32 FMA)", required=False, default=False),
    Column("backend", "str", "'triton' (tile columns given) or 'cublas' (best library tile)",
           required=False, default="triton", choices=("triton", "cublas")),
    Column("block_m", "int", "tile rows (BM)", positive=True),
    Column("block_n", "int", "tile columns (BN)", positive=True),
    Column("block_k", "int", "reduction step per iteration (BK)", positive=True),
    Column("num_stages", "int", "software-pipeline stages (shared-memory ring slots)", positive=True),
    Column("num_warps", "int", "warps per block", positive=True),
    Column("group_m", "int", "rows per super-group of the grouped launch order",
           required=False, default=8, positive=True),
    Column("raster", "str", "launch order: grouped (Triton/Inductor default), row (along N), "
           "col (along M), zorder, persistent (grouped order, one program per slot)",
           required=False, default="grouped", choices=tuple(ORDER_NAMES)),
    Column("split_k", "int", "splits of the reduction across blocks (partials reduced "
           "with fp32 atomics; a library row's partials, when they fit the library's "
           "workspace, by a second reduction kernel)", required=False, default=1, positive=True),
    Column("triton_version", "str", "Triton release the kernels are compiled with "
           "(major.minor, e.g. '3.1'; a patch or local suffix is ignored); it selects the "
           "code generation where releases differ: before 3.3 a TF32 operand that is "
           "M/N-contiguous is staged through registers for warpgroup MMA (Hopper), "
           "unpipelined; from 3.3 it is copied into the ring with 4-byte cp.async",
           required=False, default=TRITON_VERSION_DEFAULT, pattern=TRITON_VERSION_PATTERN,
           pattern_doc="a Triton release, major.minor (e.g. '3.1'; '3.6.0' and '3.10+git' also)"),
    Column("scale_mode", "str", "float8 only: how A and B are scaled back to real values: "
           "'tensor' (one scale each, applied in the epilogue), 'row' (a scale per row of A "
           "and per column of B, epilogue), 'block' (DeepSeek-V3: A per 1x128 and B per "
           "128x128 block along K, applied on CUDA cores to every 128-deep partial sum); "
           "ignored for other dtypes", required=False, default="tensor",
           choices=("tensor", "row", "block")),
    Column("fast_accum", "bool", "float8 only: accumulate in the tensor cores' reduced-"
           "precision accumulator without promotion (cuBLASLt CUBLASLT_MATMUL_DESC_FAST_ACCUM, "
           "torch._scaled_mm use_fast_accum); false: CUTLASS-style promotion to an FP32 "
           "accumulator on CUDA cores every FP8_PROMOTE_K reduction elements",
           required=False, default=False),
)

#: scale modes of float8 rows (column ``scale_mode``)
SCALE_MODES = ("tensor", "row", "block")
_SCALE_CODE = {name: i for i, name in enumerate(SCALE_MODES)}

#: columns that may be null on library rows (backend == 'cublas')
TILE_COLUMNS = ("block_m", "block_n", "block_k", "num_stages", "num_warps")

#: Library (cuBLAS/CUTLASS) tile catalog per architecture:
#: (block_m, block_n, block_k, num_stages, num_warps, split_k, raster).
#: From CUTLASS's default GEMM configurations for sm80 (128x256x32 / 256x128x32
#: 3-stage 8-warp, 128x128x32 4-5-stage 4-warp, 64x64 for small problems, and
#: split-K for skinny outputs) and sm90 (TMA warp-specialized persistent
#: kernels with 128x256x64 / 256x128x64 / 128x128x64 tiles, 4+ stages).
LIBRARY_TILES = {
    "ampere": (
        (256, 128, 32, 3, 8, 1, "grouped"),
        (128, 256, 32, 3, 8, 1, "grouped"),
        (128, 128, 32, 4, 4, 1, "grouped"),
        (128, 128, 64, 3, 4, 1, "grouped"),
        (128, 64, 32, 4, 4, 1, "grouped"),
        (64, 128, 32, 4, 4, 1, "grouped"),
        (64, 64, 32, 5, 4, 1, "grouped"),
        (64, 64, 64, 4, 4, 1, "grouped"),
        (128, 128, 32, 4, 4, 4, "grouped"),
        (64, 64, 64, 4, 4, 4, "grouped"),
        (64, 64, 64, 4, 4, 16, "grouped"),
        (32, 32, 64, 4, 4, 1, "grouped"),
    ),
    "hopper": (
        (128, 256, 64, 4, 8, 1, "persistent"),
        (256, 128, 64, 4, 8, 1, "persistent"),
        (128, 128, 64, 5, 8, 1, "persistent"),
        (128, 128, 64, 5, 4, 1, "persistent"),
        (64, 128, 64, 6, 4, 1, "persistent"),
        (64, 64, 64, 6, 4, 1, "persistent"),
        (128, 128, 64, 5, 4, 4, "persistent"),
        (64, 64, 64, 6, 4, 4, "persistent"),
        (64, 64, 64, 6, 4, 16, "persistent"),
    ),
}
LIBRARY_TILES["blackwell"] = LIBRARY_TILES["hopper"]
LIBRARY_TILES["cdna2"] = LIBRARY_TILES["ampere"]

#: The library's GEMV kernels (cuBLAS ``gemv2N``/``gemv2T``/``gemvx::kernel`` in
#: profiler traces; CUTLASS ``cutlass/gemm/kernel/gemv.h``), as catalog tiles one
#: output element wide: an extra candidate of the IEEE FP32 library rows with
#: ``n = 1`` (key ``"n1"``: ``block_n = 1``) or ``m = 1`` (``"m1"``: ``block_m =
#: 1``), same tuple layout as :data:`LIBRARY_TILES`, every architecture. A GEMV
#: streams the matrix once on the CUDA cores, one FMA per element, where the
#: catalog's smallest SIMT tile (32 x 32) pads the unit dimension to 32 and does 32
#: times the FMA work (A100 9984 x 1 x 4480 fp32: 32x32 tile 188 us, cuda_core-bound,
#: measured 132-138). The shape is CUTLASS's GEMV for a K-contiguous matrix at
#: its defaults: 128 threads (4 warps) a block, 16-byte accesses (4 fp32), and
#: ``kThreadsPerRow = min(128 / (4 x 4 B), 16) = 8`` threads along K a row, so 16
#: rows a block and 8 x 4 = 32 elements (128 bytes) of K a row per iteration:
#: ``block_k`` 64 in the catalog's 2-byte units (:data:`LIBRARY_TILE_BYTES`); the
#: 4 stages of the small catalog tiles stand for its loads in flight (the GEMV
#: keeps no shared memory: the tile model's ring is its registers' loads in
#: flight; docs/gemm_accuracy.md, "The library's GEMV-like kernels, session 9").
#: Not offered to tensor-core rows (16-bit, TF32, FP8): their tiles stream a
#: 1-wide operand at the DRAM rate already (the padded MMA work is under the
#: stream), and the tile model would price a 1-wide tile of those dtypes on the
#: tensor cores, which a GEMV does not use.
LIBRARY_GEMV_TILES = {
    "n1": (16, 1, 64, 4, 4, 1, "grouped"),
    "m1": (1, 16, 64, 4, 4, 1, "grouped"),
}

#: Element size (bytes) the ``block_k`` of :data:`LIBRARY_TILES` is written for.
#: The library's tiles keep the bytes of a K slice, not its elements: CUTLASS's
#: sm80 kernel lists (python/cutlass_library/generator.py) give the 16-bit
#: GenerateSM80_TensorOp_16816 tiles K = 32 / 64 and the TF32
#: GenerateSM80_TensorOp_1688 tiles the same shapes and stages at K = 16 / 32
#: (256x128x16/3, 128x128x16/5, 64x64x16/10, ..., 256x128x32/3, 128x128x32/4,
#: 64x64x32/5): 64 or 128 bytes of K a row, which on Hopper is the 128-byte TMA
#: swizzle row (as the FP8 tiles' K = 128 below). A library row of 4-byte
#: elements (float32, IEEE or TF32) takes ``block_k * LIBRARY_TILE_BYTES / 4``.
LIBRARY_TILE_BYTES = 2

#: The library's workspace per architecture (bytes): cuBLAS's documented
#: recommendation for ``cublasSetWorkspace`` / the cuBLASLt preference, which
#: PyTorch follows (4 MiB before Hopper, 32 MiB from Hopper on; PyTorch PR
#: #120925). A split-K call whose ``split_k`` fp32 partial C's fit in it
#: reduces them with a second kernel (:func:`_library_split_reduction`); a
#: larger one cannot keep its partials there and reduces in place, priced as
#: the tiles' own read-modify-write of C (the epilogue of every split-K row).
LIBRARY_WORKSPACE_BYTES = {"ampere": 4 << 20, "cdna2": 4 << 20, "hopper": 32 << 20,
                           "blackwell": 32 << 20}

#: The library's stream-K / split-K decision for a grid under half the SMs
#: (CUTLASS's sm90 persistent scheduler, ``cutlass/gemm/kernel/tile_scheduler_params.h``,
#: ``PersistentTileSchedulerSm90StreamKParams`` under ``DecompositionMode::Heuristic``):
#: a grid of ``tiles`` output tiles of ``k_tiles`` K steps each runs data-parallel
#: when its (only, partly filled) wave is at least half full (``2 * tail_tiles >=
#: ctas_per_wave``) or when ``k_tiles <= min_iters_per_sk_unit_`` (8); otherwise its
#: K iterations are spread over ``units = min(SMs, tiles * k_tiles / 8)`` work units,
#: a split-K of ``units / tiles`` splits where that divides (stream-K's fractional
#: split otherwise). cuBLAS's sm90 kernels for small-M calls split too in profiler
#: traces: a ``nvjet_*_64x8_64x16_*_splitK`` GEMM followed by
#: ``cublasLt::splitKreduce_kernel`` (M = 6, N = 4096, K = 10944 on H100: grid 2 x 64,
#: two splits of 64 tiles). The model splits where the rule gives two or more units
#: a tile (:func:`library_stream_k_valid`). This is CUTLASS's constant, not a
#: fitted one.
LIBRARY_STREAM_K_MIN_ITERS = 8

#: Library tile catalog for float8 rows, per architecture (same tuple layout).
#: Hopper FP8 GEMMs (cuBLASLt's sm90 e4m3/e5m2 kernels, CUTLASS 3.x
#: ``KernelTmaWarpSpecializedCooperative``/``Pingpong`` FP8 examples, DeepGEMM)
#: take block_k = 128: a 1-byte operand's 128-element K slice is one 128-byte
#: TMA swizzle row, and four wgmma k32 steps. Tiles are 128x128x128 and
#: 128x256x128 / 256x128x128 (two consumer warpgroups, 8 MMA warps), persistent.
#: No 64-row tile and no split-K: on the H20 (shared/data/gemm/
#: pipeweave_fp8_gemm_train.parquet) every m <= 128 problem of a given k takes
#: the time of one 128x128 tile per SM at the full per-SM FP8 rate whatever n
#: (m = 32, k = 4096: 40.3-40.7 us from n = 768 to 4608), which a 64-row tile
#: or split-K would halve or more; the library does not run them for FP8.
#: Stages: as many 32 / 48 KiB A+B slots as fit beside the epilogue's shared
#: memory (CUTLASS StageCountAutoCarveout: 6 and 4 in 227 KiB; 4 and 3 in the
#: ~100 KiB of sm_120 parts).
LIBRARY_TILES_FP8 = {
    "hopper": (
        (128, 128, 128, 6, 8, 1, "persistent"),
        (128, 256, 128, 4, 8, 1, "persistent"),
        (256, 128, 128, 4, 8, 1, "persistent"),
        # the same tiles in ~100 KiB of shared memory (sm_120 parts: RTX PRO 6000)
        (128, 128, 128, 4, 8, 1, "persistent"),
        (128, 256, 128, 3, 8, 1, "persistent"),
    ),
}
LIBRARY_TILES_FP8["blackwell"] = LIBRARY_TILES_FP8["hopper"]

#: CUTLASS's FP8 accumulation promotion (``GmmaFP8Accumulation``,
#: ``mma_promotion_interval`` = 4 wgmma k-steps of 32 = 128 reduction elements;
#: DeepSeek-V3 tech report Sec. 3.3.2 gives the same N_C = 128): Hopper's FP8
#: wgmma accumulates with about 14 bits of mantissa, so without fast accumulation
#: the kernel adds the MMA's partial sum into an FP32 register accumulator on CUDA
#: cores every FP8_PROMOTE_K elements of K (one FADD per accumulator element) and
#: keeps both accumulators in registers. Block scaling (scale_mode 'block') does
#: the same step as an FMA with the block's scale product, at its 128-wide blocks.
FP8_PROMOTE_K = 128
#: K (and N, for B) extent of one DeepSeek-V3 block scale (1x128 for A, 128x128 for B)
FP8_SCALE_BLOCK = 128
#: register estimate: fixed per-thread cost of addresses, loop state, masks
REGS_BASE = 40
#: the same for Triton's FMA dot (IEEE FP32), whose operand fragments the
#: estimate counts in full (:data:`FMA_K_PER_SLICE`): with 20, the estimate
#: agrees with ptxas on which kernels spill on 602 of 640 compiled tiles and
#: layouts and is within 20 registers of it on the others (Triton 3.0, sm_80
#: and sm_90, ``bench/triton_fma_footprints.py``, ``tests/test_lowering.py``)
REGS_BASE_FMA = 20
#: ptxas keeps the fragments of about one k in eight of the FMA dot's
#: unrolled BK live at once (its loads hoisted ahead of the FFMAs that use
#: them): a thread holds ``(rows + cols) * BK / 8`` operand registers
FMA_K_PER_SLICE = 8
#: Whether ptxas spills an FMA dot depends on its operand layouts, which the
#: estimate above does not see: ptxas's registers of the 538 compiled kernels
#: that neither spill nor reach 250 registers (Triton 3.0, sm_80 and sm_90,
#: ``tests/data/triton30_fma_sm80_sm90.csv``) are, by least squares, the
#: accumulators plus FMA_DEMAND_ROW_SLICE per row of A and k-slice, 3.1 more per
#: row of a K-contiguous A and 4.2 per column of a K-contiguous B (an operand read
#: as 16-byte vectors of four k keeps the whole vector of each row live),
#: FMA_DEMAND_COPY per 16-byte cp.async vector a thread copies an iteration (its
#: addresses) and FMA_DEMAND_BASE (mean |error| 8.9 registers, the estimate
#: above 19.3). A kernel whose estimate exceeds the cap spills only where this
#: demand does too (the spill / no-spill split right on 604 of the 640 kernels:
#: 128x128x32 on 4 warps spills in three layouts, not with A column-major and B
#: row-major, 238 registers); how much it spills stays the estimate's
FMA_DEMAND_ROW_SLICE = 0.37
FMA_DEMAND_A_K_MAJOR = 3.1
FMA_DEMAND_B_K_MAJOR = 4.2
FMA_DEMAND_COPY = 2.7
FMA_DEMAND_BASE = 25.4

#: GEMM's tile program (its DAG, tensors with reuse dimensions, footprints): the
#: family's representation shared with every other family; the numbers per row
#: come from :func:`lower`, which adds the rules expressions do not carry
PROGRAM = load_program(Path(__file__).parent / "programs" / "gemm.toml")


@jit_exact
def _warp_grid(bm, bn, warps):
    """Warps along M and N for warp-level MMA (grow M while its per-warp rows
    exceed the per-warp columns, as Triton's MMA layout does)."""
    wm = 1
    wn = 1
    for _ in range(6):  # up to 64 warps
        if wm * wn >= warps:
            break
        if bm // (16 * wm) >= bn // (8 * wn) and bm >= 32 * wm:
            wm *= 2
        elif bn >= 16 * wn:
            wn *= 2
        else:
            wm *= 2
    return wm, wn


@jit_exact
def _warpgroup_grid(bm, warps):
    """Warpgroups along M and N for warpgroup MMA: along M while a warpgroup
    still gets more than its 64 rows, then along N (Triton's warpsPerTileV3)."""
    wg_m = 1
    wg_n = 1
    for _ in range(4):  # up to 64 warps
        if 4 * wg_m * wg_n >= warps:
            break
        if bm > 64 * wg_m:
            wg_m *= 2
        else:
            wg_n *= 2
    return wg_m, wg_n


@jit_exact
def _fma_layout(bm, bn, warps):
    """Triton's FMA-dot accumulator layout for a ``bm x bn`` tile (Triton 3.0 and
    3.1, compiled for sm_80 and sm_90 and read from the TTGIR): the conversion to
    TritonGPU gives ``tt.dot`` a blocked layout of ``sizePerThread = [s, s]``, s = 4
    when a thread gets at least 16 accumulator elements, 2 at 4, else 1, order
    [1, 0]; the default builder lays lanes, then warps, along N while N has
    ``s``-wide column groups left, the rest along M, and no later pass changes it
    for an FMA dot. Returns ``(s, tm, tn, rows, cols)``: the block width, lanes
    along M and N, and the rows of A and columns of B each thread holds (``s``
    consecutive ones per repetition)."""
    th = 32 * warps
    per = (bm * bn) // th if th > 0 else 0
    s = 4 if per >= 16 else (2 if per >= 4 else 1)
    groups = bn // s
    if groups < 1:
        groups = 1
    tcta = groups if groups < th else th
    tn = tcta if tcta < 32 else 32
    wn = tcta // tn
    if wn > warps:
        wn = warps
    if wn < 1:
        wn = 1
    tm = 32 // tn
    wm = warps // wn
    if wm < 1:
        wm = 1
    reps_m = bm // (s * tm * wm)
    if reps_m < 1:
        reps_m = 1
    reps_n = bn // (s * tn * wn)
    if reps_n < 1:
        reps_n = 1
    return s, tm, tn, s * reps_m, s * reps_n


def fma_loads(bm: int, bn: int, bk: int, warps: int, a_rm: bool, b_rm: bool) -> dict:
    """Per-thread instructions of one iteration of Triton's FMA dot, as
    :func:`_fma_layout` and :func:`_fma_smem_bytes` count them: FFMAs and
    shared loads by width in words (``{"ffma": n, 4: LDS.128, 2: LDS.64,
    1: LDS.32}``); the SASS of the compiled kernels is the check
    (``bench/triton_fma_footprints.py``)."""
    s, _tm, _tn, rows, cols = _fma_layout(bm, bn, warps)
    out = {"ffma": rows * cols * bk, 4: 0, 2: 0, 1: 0}
    if a_rm:
        out[4] += rows * bk // 4   # a vector of four k per row
    else:
        out[s] += rows // s * bk    # a vector of s rows per k
    if b_rm:
        out[s] += cols // s * bk
    else:
        out[4] += cols * bk // 4
    return out


def fma_registers(bm: int, bn: int, bk: int, warps: int) -> int:
    """Registers a thread of Triton's FMA dot asks for (before the cap), as the
    lowering estimates them."""
    _s, _tm, _tn, rows, cols = _fma_layout(bm, bn, warps)
    return (bm * bn // (32 * warps) + (rows + cols) * max(bk // FMA_K_PER_SLICE, 1)
            + REGS_BASE_FMA)


@jit_exact
def _fma_demand(bm, bn, bk, warps, a_rm, b_rm):
    """ptxas's register demand of Triton's FMA dot from its operand layouts
    (:data:`FMA_DEMAND_ROW_SLICE`): whether the kernel spills."""
    _s, _tm, _tn, rows, cols = _fma_layout(bm, bn, warps)
    th = 32 * warps
    slices = bk // FMA_K_PER_SLICE
    if slices < 1:
        slices = 1
    d = (bm * bn) // th + FMA_DEMAND_ROW_SLICE * rows * slices + FMA_DEMAND_BASE
    d += FMA_DEMAND_COPY * (bm * bk + bk * bn) / 4.0 / th
    if a_rm:
        d += FMA_DEMAND_A_K_MAJOR * rows
    if not b_rm:
        d += FMA_DEMAND_B_K_MAJOR * cols
    return d


def fma_register_demand(bm: int, bn: int, bk: int, warps: int, a_rm: bool, b_rm: bool) -> float:
    """ptxas's register demand of Triton's FMA dot from its operand layouts, as
    the lowering estimates it to decide whether the kernel spills."""
    return float(_fma_demand(bm, bn, bk, warps, a_rm, b_rm))


@jit_exact
def _phase_conflict(d, stride):
    """Bank-conflict degree of ``d`` distinct 16-byte vectors read in one phase of
    a 128-bit shared load, ``stride`` 16-byte units apart: the 8 groups of 4 banks
    are visited with period ``8 / gcd(8, stride)``."""
    g = 8
    st = stride % 8
    while st:
        g, st = st, g % st
    distinct = 8 // g
    if distinct > d:
        distinct = d
    return (d + distinct - 1) // distinct


@jit_exact
def _fma_smem_bytes(bm, bn, bk, warps, a_rm, b_rm):
    """Shared-memory traffic of Triton's FMA dot (IEEE FP32) per iteration, as
    bytes of 128-byte wavefronts.

    The operands are staged without swizzling, in the order of their global
    load (a dot operand with a blocked parent: vec = perPhase = maxPhase = 1), and
    each thread reads, per k, its rows of A and its columns of B
    (:func:`_fma_layout`): vectors of ``s`` elements along a contiguous M (A
    column-major) or N (B row-major), 16-byte vectors of four k along a
    contiguous K (A row-major, B column-major); the SASS of Triton 3.0 / 3.1 for
    sm_80 has exactly these LDS.32 / .64 / .128 counts.

    A shared load of ``v`` words a lane returns 128 bytes a cycle, so it runs in
    ``v`` phases of ``32 / v`` lanes, each one wavefront per bank conflict among
    its distinct addresses; lanes of different phases that read the same address
    are not merged, except that a load whose lanes ``n`` and ``n ^ 1`` (or
    ``n ^ 2``) always read the same address runs in half the phases (NVIDIA's
    uniform-address rule for 64- and 128-bit shared loads). In Triton's layout
    that holds for A, whose address does not depend on the lane along N, and never
    for B. On the measured A100 and H100 FP32 rows a K-contiguous B, whose columns
    all fall in one bank group, runs 2-5x slower than an N-contiguous one, as
    these phases say (a warp-wide conflict count says 1-2.25x). Per k and warp:

    - A column-major: ``rows / s`` loads of ``max(1, s / 2)`` wavefronts;
    - B row-major: ``cols / s`` loads of ``s`` wavefronts (contiguous phases);
    - A row-major: per row and four k, 2 phases of 16 lanes whose lanes along M
      read rows ``s * BK`` words apart (:func:`_phase_conflict`);
    - B column-major: per column and four k, 4 phases of 8 lanes whose lanes along
      N read columns ``s * BK`` words apart.
    """
    s, tm, tn, rows, cols = _fma_layout(bm, bn, warps)
    stride = (s * bk) // 4
    if a_rm:
        d = 1 if tn >= 16 else 16 // tn
        a_wf = rows * _phase_conflict(d, stride) / 2.0
    else:
        a_wf = rows / 2.0 if s > 1 else float(rows)
    if b_rm:
        b_wf = float(cols)
    else:
        d = 8 if tn >= 8 else tn
        b_wf = float(cols * _phase_conflict(d, stride))
    return 128.0 * bk * warps * (a_wf + b_wf)


@jit_exact
def mn32_wavefronts(width):
    """Shared-memory wavefronts of one warp's 4-byte store of an M/N-contiguous
    TF32 operand into Triton's K-major tile for warpgroup MMA (Triton 3.0-3.6
    for sm_90: a blocked layout of four elements along M (N) a thread,
    ``min(32, width / 4)`` threads of a warp along M and the rest along K,
    ``threadsPerWarp = [width / 4, 128 / width]``; a 128-byte-swizzled K-major
    tile, ``vec = 4``, the 16-byte chunk XORed with the row mod 8). One store
    instruction writes element ``j`` of each thread's four: its lanes' rows
    ``4 l + j`` fall on two swizzle phases and its ``128 / width`` values of k
    on as many banks of a chunk (up to four), so the warp's 32 words land on
    ``2 min(4, 128 / width)`` banks: ``width / 8`` wavefronts for a 64-wide
    operand, 16 from 128 on (``tests/test_lowering.py`` counts the banks lane
    by lane). ``width`` is the operand's contiguous extent (BM of A, BN of B)."""
    tpm = width // 4
    if tpm > 32:
        tpm = 32
    if tpm < 1:
        tpm = 1
    return tpm / 2.0


@jit_exact
def _cdiv(a, b):
    return -((-a) // b) if b != 0 else 0


@jit_exact
def vector_bytes(ld, eb):
    """Bytes one thread moves per global access of an operand whose rows start
    ``ld`` elements apart: Triton vectorizes a load along the contiguous
    dimension only as far as it can prove each row's start aligned, i.e. to
    the largest power of two dividing ``ld`` (a compile-time constant in
    PyTorch's mm template), times the element bytes, at most 16."""
    v = ld & -ld
    v = v * eb
    return v if v < 16 else 16


#: a contiguous run shorter than the DRAM access costs at most this many times
#: its 32-byte sectors (H100: 32-byte runs measured as 64-byte ones)
DRAM_SHORT_RUN_CAP = 2.0


@jit_exact
def dram_access_scale(run, g_dram):
    """DRAM time per sector-rounded byte of a contiguous run of ``run`` bytes
    when the DRAM moves ``g_dram``-byte accesses: 1 for runs of whole accesses,
    up to :data:`DRAM_SHORT_RUN_CAP` for short ones."""
    return min(math.ceil(run / g_dram) * g_dram / (math.ceil(run / 32.0) * 32.0),
               DRAM_SHORT_RUN_CAP)


@jit_exact
def sram_passes(v):
    """Shared-memory/L1 SRAM traffic of an operand copied ``v`` bytes a thread,
    in multiples of its bytes. A 16-byte ``cp.async.cg`` bypasses L1 and only
    writes shared memory (1). Narrower copies are cached in L1 on the way
    (``cp.async.ca`` for 4 and 8 bytes; ``ld.global`` into registers, then
    ``st.shared``, below 4): the L1 fill, the read out of L1 and the shared
    store each pass the SRAM, the last two at one 128-byte wavefront per warp
    instruction at best, so a warp instruction of ``32 v < 128`` bytes costs a
    whole wavefront."""
    if v >= 16:
        return 1.0
    per = 128.0 / (32.0 * v) if v < 4 else 1.0
    return 1.0 + 2.0 * per


#: Triton's warpgroup MMA (sm_90) instruction: 64 rows (``wgmma.mma_async.m64nNk*``,
#: one warpgroup of four warps, 16 rows each) and at most 256 columns
WGMMA_M = 64
WGMMA_N_MAX = 256


@jit_exact
def wgmma_smem_reads(bm, bn, bk, eb, wg_m, wg_n, per_instruction):
    """Shared-memory bytes the warpgroup MMAs of one ``bm x bn x bk`` tile step
    read (A and B both from shared memory, by descriptor).

    ``per_instruction`` (Triton on sm_90): every ``wgmma`` instruction reads its
    own operands, and Triton's lowering issues ``bm / 64`` of them along M and
    ``ceil(bn / wg_n / 256)`` along N for each K slice, each with its A rows and
    its B columns (TritonGPU ``warpsPerTileV3`` lays the ``wg_m x wg_n``
    warpgroups out, the MMAv3 instruction shape is m64nNk with N <= 256, and the
    WGMMA lowering loops over the M and N repetitions of that shape): B is read
    once per 64 rows, so a 128-row tile reads it twice whether one warpgroup
    repeats the instruction over its 128 rows or two warpgroups take 64 each,
    and A once per warpgroup along N and per 256 columns. Otherwise (the
    library's kernels, Blackwell) one read of A per warpgroup along N and of B
    per warpgroup along M."""
    if not per_instruction:
        return bk * eb * (wg_n * bm + wg_m * bn)
    n_wg = bn // wg_n
    reps_n = (n_wg + WGMMA_N_MAX - 1) // WGMMA_N_MAX
    reps_m = bm // WGMMA_M
    if reps_m < wg_m:
        reps_m = wg_m
    return bk * eb * (wg_n * reps_n * bm + reps_m * bn)


@jit_exact
def _lower_rows(m, n, k, bm, bn, bk, stages, warps, split, dcode, tf32, a_rm, b_rm, eb_tab,
                ob_tab, tc_tab, f32_code, wgmma_ok, wgmma_min, max_regs, sm_regs, sync_frac,
                tc_eff, wg_share, g0, g1, ksteps, tiles, smem_block, threads, regs, spill, use_wg,
                on_tc, t_bytes, t_foot, t_crit, work_iter, work_epi, rate, share_eff, useful_flops, smem_bpc,
                f8_code, f16_code, scode, fast, lib, hopper_wg, staged_mn, pipe_stages,
                copy_smem, sms, g_dram, t_dram_scale, clk_cap, cuda_cap, lib_rounds, slot_tc, tc_cap,
                smem_capr, cuda_capr, lo, hi):
    """One pass over rows ``lo:hi`` (a share; :func:`lower` runs the shares on the
    thread pool): every per-row quantity of :func:`lower` (the
    docstring there); ``tc_tab[d]`` is dtype ``d``'s tensor-core rate per SM
    before the MMA path's share and the calibrated efficiency ``tc_eff``.
    ``scode``/``fast`` are the float8 rows' scale mode (:data:`SCALE_MODES`)
    and fast-accumulation flag (ignored on other rows); ``lib`` marks library
    (cuBLAS) rows, whose FP32 kernels stage conflict-free operand layouts;
    ``smem_bpc`` the SM's shared-memory bytes per clock; ``hopper_wg`` says
    the GPU's tensor cores take warpgroup MMA (sm_90), where Triton's rules for
    the ring and for M/N-contiguous TF32 operands apply, and ``staged_mn[i]`` that row ``i``'s Triton release stages those
    operands through registers (before 3.3, :data:`TRITON_PIPELINED_MN32`);
    ``pipe_stages`` receives the stages the envelope pipelines (1 where a
    staged operand serialises the loop or an operand is loaded inside the
    iteration), ``copy_smem`` the SRAM bytes of the A and B tile copies per
    iteration (part of ``work_iter[:, R_SMEM]``); ``lib_rounds`` says the
    library's kernels on this GPU are grids of tiles run in rounds (sm80-style
    kernels: GPUs without warpgroup or tcgen05 MMA), so its rows take the last
    round's clock as Triton's do; ``slot_tc`` (warpgroup MMA) leaves a Triton
    tensor-core row's clock to the envelope, which takes it by waves of resident
    slots (envelope.wave_time's tail wave), and ``tc_cap``, ``smem_capr`` and
    ``cuda_capr`` receive the caps of its tensor, shared-memory and CUDA-core
    rates (0 elsewhere)."""
    for i in range(lo, hi):
        bmi = bm[i]
        bni = bn[i]
        bki = bk[i]
        w = warps[i]
        sk = split[i]
        eb = eb_tab[dcode[i]]
        ob = ob_tab[dcode[i]]
        tc = dcode[i] != f32_code or tf32[i]
        on_tc[i] = tc
        f8 = dcode[i] == f8_code
        # FP8 operands on a GPU without FP8 tensor cores (Ampere, CDNA2): the kernel
        # converts each operand fragment to fp16 after its shared-memory load and
        # multiplies on the fp16 tensor cores (Triton lowers an fp8 tl.dot so below
        # sm_89: TritonGPU "decompose unsupported conversions"/FP8 upcast)
        emul8 = f8 and tc_tab[dcode[i]] <= 0.0
        # FP32 promotion of the FP8 partial sums (FP8_PROMOTE_K), always under
        # block scaling, which applies its scales at the same step
        promo = f8 and (not fast[i] or scode[i] == 2)
        a = _cdiv(m[i], bmi)
        b = _cdiv(n[i], bni)
        g0[i] = a
        g1[i] = b
        ks = _cdiv(_cdiv(k[i], sk), bki)
        ksteps[i] = ks if ks > 1 else 1
        tiles[i] = a * b * sk
        # MMA path: Triton's MMAv3 needs whole warpgroups and a multiple of 64 rows;
        # the warpgroups are laid out over M while rows remain, then over N
        # (AccelerateMatmul.cpp, warpsPerTileV3), so 8 warps on a 64-row tile still
        # issue wgmma, as two warpgroups side by side along N
        wg = wgmma_ok and tc and w >= wgmma_min and w % 4 == 0 and bmi % 64 == 0
        # global loads vectorized to the alignment of the operand rows' starts
        # (vector_bytes): Triton's, and the library's too, whose kernels come in
        # operand alignments of 16 bytes down to one element (CUTLASS generates
        # each tile at several, e.g. alignment_constraints = [8, 4, 2] for the
        # sm80 16-bit tensor-op list, [4, 2, 1] for TF32) and are picked by the
        # alignment the leading dimensions allow
        va = vector_bytes(k[i] if a_rm[i] else m[i], eb)
        vb = vector_bytes(n[i] if b_rm[i] else k[i], eb)
        if lib[i]:
            # a library kernel has one operand alignment (CUTLASS's generator,
            # CreateGemmOperator: A and B are TensorDescriptions of the same
            # `alignment`, C of `alignment_c = min(8, alignment)`; can_implement
            # asks each leading dimension to be a multiple of its own), so a call
            # with any leading dimension narrower than 16 bytes runs a kernel that
            # loads both A and B at that narrowest width; C's rows (n, where C has
            # more than one column) bound it where they allow fewer than 8 of C's
            # elements
            al = va // eb if va // eb < vb // eb else vb // eb
            if n[i] > 1:
                ac = vector_bytes(n[i], ob) // ob
                if ac < 8 and ac < al:
                    al = ac
            va = al * eb
            vb = al * eb
        if wg and lib[i] and dcode[i] == f32_code and not a_rm[i] and b_rm[i]:
            # library TF32 with both operands M/N-contiguous (A column-major, B
            # row-major): wgmma reads 32-bit operands from shared memory K-major only
            # (PTX wgmma.mma_async: the .tf32 forms have no imm-trans-a/b, the 16-bit
            # forms do); one non-K-major operand can be fed from registers (wgmma's A
            # operand, swapping A and B for a non-K-major B), two cannot, so the
            # library runs its mma.sync (sm80-style) kernel
            wg = False
        use_wg[i] = wg
        # Triton's warpgroup-MMA TF32 dot with an M/N-contiguous operand (PTX: wgmma
        # takes 32-bit operands from shared memory K-major only). Before Triton 3.3
        # that operand is loaded into registers (LDG.128, four elements along M or N
        # a thread) and stored K-major one 4-byte element at a time (STS), inside
        # the iteration that consumes it, and the loop waits for its wgmma to retire
        # (wgmma.wait_group 0): nothing of it is in flight across iterations, so the
        # loop runs unpipelined. From 3.3 on the same elements are copied with
        # 4-byte cp.async into the ring, pipelined (bench/triton_fma_footprints.py
        # --tf32: SASS of Triton 3.0-3.2 and 3.3-3.6 for sm_90a)
        mn32 = wg and hopper_wg and not lib[i] and dcode[i] == f32_code
        a_mn = mn32 and not a_rm[i]
        b_mn = mn32 and b_rm[i]
        staged = staged_mn[i] and (a_mn or b_mn)
        pipe_stages[i] = 1 if staged else stages[i]
        # Triton pipelines a load only from 32 bits a thread (cp.async moves 4,
        # 8 or 16 bytes; AssignLatencies.cpp isSmallLoad): an operand whose rows
        # start at a 2-byte alignment (a 16-bit operand with an odd leading
        # dimension) is loaded into registers inside the iteration that uses it;
        # so is the library's (no cp.async of 2 bytes: CUTLASS's alignment-1
        # 16-bit kernels stage through registers)
        a_sync = va < 4
        b_sync = vb < 4
        if (a_sync or b_sync) and not staged:
            pipe_stages[i] = 1
        elif stages[i] == 1 and eb == 2 and tc and not wg and not lib[i] and not staged:
            # Triton's one-stage mma.sync loop of 16-bit operands (fp16, bf16) loads
            # each K step into registers and stores it to shared memory once the step
            # before has read its operands; ptxas issues the next step's global loads
            # ahead of this step's HMMAs, so one load of each tile is in flight under
            # the step's MMAs: the envelope's two-stage ring (one load ahead), not its
            # no-prefetch loop. A property of the compiled loop, by operand width
            # (bench/triton_loop_sass.py --order --overlap, Triton 3.9, sm_80 and
            # sm_90, 32x32x16, 16x32x16, 32x16x16 / 1 stage / 2 warps, all four
            # layouts): with 16-bit operands 0.68-0.96 of the step's HMMAs issue
            # between a load and the store that waits for it (mean over the loop's
            # stores); with TF32 0-0.42 in 23 of 24 (32x32x16 on sm_80 0-0.26: ptxas
            # puts the next step's loads into the registers the step's HMMAs read,
            # so they issue after those HMMAs), and with FP8 (sm_90) none. TF32 and
            # FP8 keep the no-prefetch loop
            pipe_stages[i] = 2
        wg_m, wg_n = _warpgroup_grid(bmi, w)
        wm, wn = _warp_grid(bmi, bni, w)
        # per-block resources; Triton's software pipeliner keeps num_stages - 1 ring
        # slots of A and B in shared memory (one stage computes from registers while
        # the others are in flight), which matches which configurations of the
        # measured A100 and H100 sets ran and which failed for lack of shared memory
        if wg and hopper_wg and not lib[i]:
            # on the warpgroup-MMA path (sm_90) Triton's ring holds num_stages slots
            # (Triton 3.1 and 3.6, 16-bit and TF32: the compiler's shared memory to
            # within 2 KiB, and the launch outcome of every measured H100 TF32
            # configuration), and an operand staged through registers one
            a_sl = 1 if (staged and a_mn) or a_sync else stages[i]
            b_sl = 1 if (staged and b_mn) or b_sync else stages[i]
            smem_block[i] = (a_sl * bmi * bki + b_sl * bki * bni) * eb
        else:
            st = stages[i] - 1
            if st < 1:
                st = 1
            # an operand loaded inside the iteration holds one buffer, not a ring
            smem_block[i] = ((1 if a_sync else st) * bmi * bki
                             + (1 if b_sync else st) * bki * bni) * eb
        th = w * 32
        threads[i] = th
        th1 = th if th > 1 else 1
        acc_regs = (bmi * bni) // th1
        if promo:
            # the MMA's partial accumulator and the FP32 accumulator it is
            # promoted into both live in registers (CUTLASS GmmaFP8Accumulation)
            acc_regs *= 2
        if tc or lib[i]:
            # operand fragments of one MMA step (16 elements of K), double-buffered,
            # at most one instruction K-step of 32 bytes (mma k16 for 16-bit
            # operands, k8 for TF32): a library (CUTLASS) kernel's warp-level
            # MmaTensorOp double-buffers per-k-group fragments, and Triton's TF32
            # dot on mma.sync loads them one m16n8k8 step ahead too (ptxas for
            # sm_80, Triton 3.0: 128x128x32 on 4 warps 251-255 registers and at
            # most 48 bytes of spills, 64x64x32 96-126; 16 elements of K would
            # ask 296 and 136), so TF32 does not double them
            kb = 16 * eb
            if tc and kb > 32:
                kb = 32
            # Triton's TF32 dot keeps more of them in flight as BK grows: BK / 16
            # m16n8k8 steps from BK = 64 on (ptxas for sm_80: 64x64x64, 64x64x128,
            # 128x64x64, 64x128x64 and 128x128x64 on 8 warps 128-252 registers
            # where this asks 136-200; 128x128x64 on 4 warps 255 and 0-296 bytes
            # of spills where it asks 296)
            steps = 2
            if tc and not lib[i] and eb == 4 and bki // 16 > steps:
                steps = bki // 16
            frag = 0 if wg else steps * ((bmi // wm) + (bni // wn)) * kb // (4 * 32)
        else:
            # Triton's FMA dot: one k at a time, a thread holds its rows of A and
            # its columns of B (the library's SGEMM keeps the estimate above)
            _s, _tm, _tn, f_rows, f_cols = _fma_layout(bmi, bni, w)
            slices = bki // FMA_K_PER_SLICE
            frag = (f_rows + f_cols) * (slices if slices > 1 else 1)
        want = acc_regs + frag + (REGS_BASE if tc or lib[i] else REGS_BASE_FMA)
        cap = (sm_regs // th1) // 8 * 8
        if max_regs < cap:
            cap = max_regs
        sp = want - cap if want > cap else 0
        if sp > 0 and not (tc or lib[i]) and _fma_demand(bmi, bni, bki, w, a_rm[i], b_rm[i]) <= cap:
            # the FMA dot spills only where its layouts' demand exceeds the cap too
            want = cap
            sp = 0
        # the loop-carried pointer tensors of a tensor-core Triton tile (a_ptrs,
        # b_ptrs += BK each step): one 64-bit pointer (2 registers) per vector
        # a thread loads, BM x BK / threads / (v / eb) of them for A. REGS_BASE
        # covers them at 16-byte vectors; an operand loaded narrower (an
        # unaligned leading dimension: vector_bytes) keeps eb / v of them per
        # element, 2 x 64 of them per operand for 128x128x64 on 4 warps at 2
        # bytes. Only where the loop iterates (ksteps > 1): with the sizes
        # compile-time constants a one-step loop is straight-line code and its
        # pointers die at their load. Spilled pointers are reloaded and stored
        # once per iteration, not once per MMA step as the accumulator is. The
        # FMA dot's registers are estimated from its own ptxas footprints
        # (_fma_layout) and do not take this term
        px = 0
        if tc and not lib[i] and ksteps[i] > 1:
            ea = (bmi * bki) // th1
            eb_ = (bki * bni) // th1
            if va < 16:
                px += 2 * (ea * eb // va - ea * eb // 16)
            if vb < 16:
                px += 2 * (eb_ * eb // vb - eb_ * eb // 16)
        want += px
        regs[i] = want if want < cap else cap
        sp_ptr = (want - cap if want > cap else 0) - sp
        spill[i] = sp + sp_ptr
        # resource vector per iteration (Eq. 1), before the cache split
        flops = 2.0 * bmi * bni * bki
        work_iter[i, R_TC] = flops if tc else 0.0
        work_iter[i, R_CUDA] = 0.0 if tc else flops
        # edge tiles: rows of A (columns of B, elements of C) beyond m (n) are not
        # fetched (TMA fills out-of-bounds boxes with zeros without reading them;
        # Triton's masked loads and stores issue no transaction for masked lanes):
        # a tile moves min(BM, m) rows on average over the grid, m / ceil(m / BM)
        rows_a = m[i] / a if m[i] < a * bmi else float(bmi)
        cols_b = n[i] / b if n[i] < b * bni else float(bni)
        # and along K, for Triton: a loop of ks steps over its k / split_k
        # elements moves that many, not ks x BK (tl.load's mask k < K: the tail of
        # the last step issues nothing). Library rows keep whole BK steps: which
        # kernel cuBLAS runs for a small K is not the tile modelled here (its
        # small-K rows ran 1.25-1.48x slower than predicted already; the library
        # lowering's subject, docs/gemm_accuracy.md "session 2, continued")
        kdim = _cdiv(k[i], sk)
        kk = kdim / ks if kdim < ks * bki and not lib[i] else float(bki)
        a_bytes = rows_a * kk * eb
        b_bytes = kk * cols_b * eb
        # sector efficiency of the contiguous runs of each load (32-byte sectors)
        a_run = (bki if a_rm[i] else bmi) * eb
        b_run = (bni if b_rm[i] else bki) * eb
        a_eff = math.ceil(a_run / 32.0) * 32.0 / a_run
        b_eff = math.ceil(b_run / 32.0) * 32.0 / b_run
        a_fetch = a_bytes * a_eff
        b_fetch = b_bytes * b_eff
        # the busiest SM's tiles are whole ones wherever the grid has one: an edge
        # tile's in-bound rows, min(BM, m), not the grid's average (``t_crit``)
        rows_w = float(m[i]) if m[i] < bmi else float(bmi)
        cols_w = float(n[i]) if n[i] < bni else float(bni)
        a_crit = rows_w * kk * eb * a_eff
        b_crit = kk * cols_w * eb * b_eff
        # the DRAM's access: a run shorter than g_dram (dram_access_bytes) costs a
        # whole access of DRAM time, over the sectors counted above, and at most
        # twice them (H100: 32 B and 64 B runs measured alike, 1.65 / 1.66 against
        # 1.19-1.21 for 128-256 B; docs/gemm_accuracy.md); a tile that spans its
        # operand's whole contiguous extent reads its rows as one run
        if a_rm[i]:
            ra = (k[i] * bmi if k[i] <= bki else bki) * eb
        else:
            ra = (m[i] * bki if m[i] <= bmi else bmi) * eb
        if b_rm[i]:
            rb = (n[i] * bki if n[i] <= bni else bni) * eb
        else:
            rb = (k[i] * bni if k[i] <= bki else bki) * eb
        t_dram_scale[i, 0] = dram_access_scale(ra, g_dram)
        t_dram_scale[i, 1] = dram_access_scale(rb, g_dram)
        t_dram_scale[i, 2] = 1.0
        # the cache model's blocks: the same fetch at the full tile size, so that
        # a problem's cache key does not change with m and n within one grid
        # (the traffic above counts in-bound rows only)
        a_foot = float(bmi * bki * eb) * a_eff
        b_foot = float(bki * bni * eb) * b_eff
        blocks = bki / FP8_SCALE_BLOCK  # 128-deep scale blocks per iteration
        if f8 and scode[i] == 2:
            # DeepSeek-V3 block scales, fp32, loaded with the operands they scale
            # and reused as they are: A's 1x128 scales (one per row and K block,
            # stored K-block-major so a tile's BM scales are contiguous) along
            # grid dim 1, B's 128x128 scales (ceil(BN/128) per K block, at least
            # one 32-byte sector) along dim 0
            a_fetch += rows_a * 4.0 * blocks
            a_crit += rows_w * 4.0 * blocks
            a_foot += bmi * 4.0 * blocks
            nb = (bni + FP8_SCALE_BLOCK - 1) // FP8_SCALE_BLOCK
            b_fetch += (nb * 4.0 if nb * 4.0 > 32.0 else 32.0) * blocks
            b_crit += (nb * 4.0 if nb * 4.0 > 32.0 else 32.0) * blocks
            b_foot += (nb * 4.0 if nb * 4.0 > 32.0 else 32.0) * blocks
        work_iter[i, R_L2] = a_fetch + b_fetch  # split by the cache model later
        if wg:
            smem_reads = wgmma_smem_reads(bmi, bni, bki, eb, wg_m, wg_n,
                                          hopper_wg and not lib[i])
        elif tc or lib[i]:
            # (the library's SGEMM kernels transpose A and B into M- and
            # N-contiguous shared tiles on the way in: conflict-free reads)
            smem_reads = bki * eb * (wn * bmi + wm * bni)
        else:
            smem_reads = _fma_smem_bytes(bmi, bni, bki, w, a_rm[i], b_rm[i])
        # spilled accumulator registers live in local memory (L1, which shares the
        # SM's SRAM and its bandwidth with shared memory): every MMA instruction
        # along K reads and writes the whole accumulator, so each spilled 4-byte
        # register is loaded and stored once per instruction step of the tile's
        # BK: BK / 16 steps for 2-byte operands (32 bytes of K per MMA), BK / 8
        # for TF32, BK / 32 for 1-byte. Triton's FMA dot spills operand
        # fragments and addresses instead, each reloaded about once per
        # iteration (ptxas: 180-340 local loads per iteration for 150-370
        # spilled words, bench/triton_fma_footprints.py)
        if tc or lib[i]:
            ksub = 32 // eb if tc else 1
            passes = (bki + ksub - 1) // ksub
        else:
            passes = 1
        # the tile copies: once through the SRAM at 16 bytes a thread, three
        # times and in whole wavefronts when narrower (sram_passes)
        copy_smem[i] = (sram_passes(va) * bmi * bki + sram_passes(vb) * bki * bni) * eb
        work_iter[i, R_SMEM] = smem_reads + copy_smem[i] + sp * 4.0 * th * 2.0 * passes + sp_ptr * 4.0 * th * 2.0
        if a_mn or b_mn:
            # each element of an M/N-contiguous TF32 operand is written into the
            # K-major swizzled tile by a 4-byte store (STS before Triton 3.3, the
            # shared half of a 4-byte cp.async from 3.3), whose warp-wide bank
            # conflicts set its cost: :func:`mn32_wavefronts` wavefronts, one
            # cycle of the shared-memory pipe each, per 32 elements
            mn = 0.0
            if a_mn:
                mn += bmi * bki * (mn32_wavefronts(bmi) / 32.0 * smem_bpc - eb)
            if b_mn:
                mn += bki * bni * (mn32_wavefronts(bni) / 32.0 * smem_bpc - eb)
            work_iter[i, R_SMEM] += mn
        if emul8:
            # one packed fp8x2 -> f16x2 conversion (2 FLOP-equivalent issue slots)
            # per two operand elements each warp reads from shared memory
            work_iter[i, R_CUDA] += smem_reads / eb
        if promo:
            # every FP8_PROMOTE_K of K: acc32 += partial (FADD) for each of the
            # BM x BN accumulator elements, 2 FLOP-equivalents each at the FP32
            # rate (an FADD takes an FMA's issue slot); under block scaling an FFMA
            # with the block's scale product (same count), plus that product for
            # each row and 128-column block (one FMUL each)
            work_iter[i, R_CUDA] += 2.0 * bmi * bni * (bki / FP8_PROMOTE_K)
            if scode[i] == 2:
                nb = (bni + FP8_SCALE_BLOCK - 1) // FP8_SCALE_BLOCK
                work_iter[i, R_CUDA] += 2.0 * bmi * nb * blocks
        c_bytes = rows_a * cols_b * ob
        # split-K partials: fp32 atomics, read and write
        work_epi[i, R_L2] = bmi * bni * 4.0 * 2.0 if sk > 1 else c_bytes
        work_epi[i, R_DRAM] = bmi * bni * 4.0 if sk > 1 else c_bytes
        work_epi[i, R_CUDA] = 2.0 * bmi * bni
        if f8 and scode[i] == 0:
            # per-tensor scales: the epilogue multiplies each accumulator element by
            # scale_a * scale_b (one FMUL) after loading the two fp32 scalars
            work_epi[i, R_CUDA] += 2.0 * bmi * bni
            work_epi[i, R_L2] += 8.0
        elif f8 and scode[i] == 1:
            # per-row (A) and per-column (B) scales: BM + BN fp32 loads per tile and
            # two FMULs per accumulator element in the epilogue
            work_epi[i, R_CUDA] += 4.0 * bmi * bni
            work_epi[i, R_L2] += (bmi + bni) * 4.0
        tc_rate = tc_tab[f16_code] if emul8 else tc_tab[dcode[i]]
        rate[i, R_TC] = tc_rate * (1.0 if wg else sync_frac) * tc_eff
        t_bytes[i, 0] = a_fetch
        t_bytes[i, 1] = b_fetch
        t_bytes[i, 2] = c_bytes
        t_foot[i, 0] = a_foot
        t_foot[i, 1] = b_foot
        t_foot[i, 2] = float(bmi * bni * ob)
        t_crit[i, 0] = a_crit
        t_crit[i, 1] = b_crit
        t_crit[i, 2] = rows_w * cols_w * ob
        share_eff[i] = wg_share if wg else 1.0
        useful_flops[i] = 2.0 * m[i] * n[i] * k[i]
        tc_cap[i] = 0.0
        smem_capr[i] = 0.0
        cuda_capr[i] = 0.0
        if tc_eff < 1.0:
            # the power-limited clock (lower()'s comment): a grid that keeps fewer
            # SMs busy runs them faster, up to the full measured rate. A grid of
            # more tiles than SMs runs `rounds` rounds on its busiest SMs, the
            # last keeping `busy` SMs busy at their clock, the earlier ones at
            # the full grid's: Triton rows, and library rows where the library's
            # kernels are grids of tiles (``lib_rounds``: sm80-style); not the
            # persistent, tile-scheduled library kernels of warpgroup / tcgen05
            # GPUs, whose tail the round count does not describe
            rounds = _cdiv(tiles[i], sms) if tiles[i] > sms else 1
            if rounds == 1 or lib_rounds or not lib[i]:
                busy = float(tiles[i] - (rounds - 1) * sms if rounds > 1
                             else (tiles[i] if tiles[i] < sms else sms))
                cap = 1.0 / tc_eff
                if slot_tc and not lib[i] and tc:
                    # warpgroup-MMA GPUs (``slot_tc``): the clock is taken by
                    # waves of the sms x p resident slots, which needs the
                    # residency: the envelope runs the full waves at these rates
                    # and the last wave at the rates times these caps
                    # (envelope.wave_time, lower()'s comment)
                    tc_cap[i] = cap
                    smem_capr[i] = min(cap, clk_cap)
                    cuda_capr[i] = min(cap, cuda_cap)
                    continue
                rate[i, R_TC] *= clock_factor(rounds, busy, sms, cap)
                # the CUDA-core and shared-memory rates are per-clock figures at
                # the measured clock: they rise with the clock up to its maximum
                # (clk_cap = HwSpec.clock_cap, max_clock_mhz over the measured
                # clock, cuda_cap = HwSpec.fp32_clock_cap, over the clock the FP32
                # rate is stated at; inf: no maximum given); an FMA row's
                # full-grid rate is its per-clock peak at the measured clock, not
                # a power-limited one, so no headroom is claimed for its last round
                if rounds == 1 or tc:
                    rate[i, R_CUDA] *= clock_factor(rounds, busy, sms, min(cap, cuda_cap))
                    rate[i, R_SMEM] *= clock_factor(rounds, busy, sms, min(cap, clk_cap))


#: Triton's largest tensor, in elements (``triton.language.TRITON_MAX_TENSOR_NUMEL``)
TRITON_MAX_TENSOR_NUMEL = 1 << 20
#: tl.dot's smallest block dimension (M, N and K of both operands)
TRITON_MIN_DOT = 16
#: tl.dot's smallest K for 8-bit operands (float8; int8 too): Triton's NVIDIA
#: backend asks K >= 32 of them, 16 of 16-bit ones (``min_dot_size`` in
#: triton/backends/nvidia/compiler.py, 3.9.0: 32 for an 8-bit ``primitive_bitwidth``),
#: the K of the tensor cores' 8-bit MMA shapes (mma.sync m16n8k32, wgmma k32).
#: tests/test_issue37.py checks it against the installed Triton
TRITON_MIN_DOT_K_8BIT = 32
#: Why a row is not lowered (:func:`admit`); codes are 1-based indices. Sizes whose
#: products the model cannot represent, then what Triton cannot build (its own
#: rules: power-of-two ``tl.arange`` extents and warp counts, ``tl.dot``'s 16-wide
#: minimum (32 along K for 8-bit operands), the tensor-size cap)
ADMIT_RULES = (
    "sizes too large: 2*m*n*k FLOPs or an operand's bytes exceed int64 (2^63)",
    "grid too large: more than 2^31 - 1 tiles (ceil(m/block_m) x ceil(n/block_n) x split_k; "
    "CUDA's gridDim.x limit)",
    "sizes too large for the cache model: more than 2^24 operand blocks "
    "(split_k x (ceil(m/block_m) + ceil(n/block_n)))",
    "sizes too large: the grid's tiles times their reduction steps exceed 2^62",
    "shared memory per block exceeds the per-block limit",
    "threads per block exceed the per-block limit",
    "triton: block_m must be a power of two",
    "triton: block_n must be a power of two",
    "triton: block_k must be a power of two",
    "triton: num_warps must be a power of two",
    "triton: tl.dot needs block_m >= 16",
    "triton: tl.dot needs block_n >= 16",
    "triton: tl.dot needs block_k >= 16",
    "triton: tl.dot needs block_k >= 32 for 8-bit (float8) operands",
    "triton: a block has more than 2^20 elements (TRITON_MAX_TENSOR_NUMEL)",
)


@jit_exact
def _admit_rows(m, n, k, bm, bn, bk, stages, warps, split, eb, tri, code, lo, hi):
    """Rows ``lo:hi`` of :func:`admit` (``code`` receives the rule codes). Sizes
    in float64 (a product that would wrap in int64 overflows to inf and is
    caught); ``tri`` marks the rows Triton's rules apply to."""
    big = 2.0 ** 63
    for i in range(lo, hi):
        mf = float(m[i])
        nf = float(n[i])
        kf = float(k[i])
        bmf = float(bm[i])
        bnf = float(bn[i])
        bkf = float(bk[i])
        sp = max(float(split[i]), 1.0)
        ebf = eb[i]
        flops = 2.0 * mf * nf * kf
        elems = max(max(mf * kf, kf * nf), mf * nf) * 4.0
        ga = math.ceil(mf / max(bmf, 1.0))
        gb = math.ceil(nf / max(bnf, 1.0))
        tiles = ga * gb * sp
        blocks = (ga + gb) * sp
        steps = math.ceil(math.ceil(kf / sp) / max(bkf, 1.0))
        smem = max(float(stages[i]) - 1.0, 1.0) * (bmf * bkf + bkf * bnf) * ebf
        c = 0
        if not (flops < big) or not (elems < big):
            c = 1
        elif not (tiles <= MAX_GRID_TILES):
            c = 2
        elif not (blocks <= MAX_CACHE_BLOCKS):
            c = 3
        elif not (tiles * max(steps, 1.0) < SIZE_LIMIT):
            c = 4
        elif not (smem < SIZE_LIMIT):
            c = 5
        elif not (float(warps[i]) < 2.0 ** 20):
            c = 6
        elif tri[i]:
            a, b, d, w = bm[i], bn[i], bk[i], warps[i]
            if not (a > 0 and (a & (a - 1)) == 0):
                c = 7
            elif not (b > 0 and (b & (b - 1)) == 0):
                c = 8
            elif not (d > 0 and (d & (d - 1)) == 0):
                c = 9
            elif not (w > 0 and (w & (w - 1)) == 0):
                c = 10
            elif a < TRITON_MIN_DOT:
                c = 11
            elif b < TRITON_MIN_DOT:
                c = 12
            elif d < TRITON_MIN_DOT:
                c = 13
            elif ebf == 1.0 and d < TRITON_MIN_DOT_K_8BIT:
                c = 14
            elif (bmf * bnf > TRITON_MAX_TENSOR_NUMEL or bmf * bkf > TRITON_MAX_TENSOR_NUMEL
                  or bkf * bnf > TRITON_MAX_TENSOR_NUMEL):
                c = 15
        code[i] = c


def admit(cols: dict, dcode: np.ndarray | None = None) -> np.ndarray:
    """Per row, the 1-based code of the first :data:`ADMIT_RULES` entry it
    breaks (0: none). Sizes are checked in float64, so a product that would
    wrap in int64 is caught; the Triton rules apply to ``backend = 'triton'``
    rows (library rows carry catalog tiles). ``dcode``: the rows' dtype codes,
    where the caller has them. One pass of :func:`_admit_rows`, in shares (plain-Python
    twin: ``tests/naive.py: gemm_admit``)."""
    i64 = lambda a: np.ascontiguousarray(a, dtype=np.int64)  # noqa: E731
    m = i64(cols["m"])
    rows = m.shape[0]
    if dcode is None:
        dcode = map_codes(np.asarray(cols["dtype"], dtype=object), _DTYPE_CODE) if rows \
            else np.zeros(0, dtype=np.int64)
    eb = np.array([v[0] for v in DTYPES.values()], dtype=np.float64)[dcode]
    split = i64(cols["split_k"]) if "split_k" in cols else np.ones(rows, dtype=np.int64)
    tri = ~_is_library(cols["backend"]) if "backend" in cols else np.ones(rows, dtype=np.bool_)
    code = np.zeros(rows, dtype=np.int64)
    run_shares(_admit_rows, (m, i64(cols["n"]), i64(cols["k"]), i64(cols["block_m"]),
               i64(cols["block_n"]), i64(cols["block_k"]), i64(cols["num_stages"]),
               i64(cols["num_warps"]), split, eb, np.ascontiguousarray(tri, dtype=np.bool_),
               code), even_bounds(rows))  # rows in shares on the thread pool
    return code


#: the values a row not admitted is lowered with (its results are dropped)
_PLACEHOLDER = {"m": 16, "n": 16, "k": 16, "block_m": 16, "block_n": 16, "block_k": 16,
                "num_stages": 2, "num_warps": 4, "split_k": 1, "group_m": 1}


def _is_library(backend) -> np.ndarray:
    """``backend == 'cublas'`` per row; a column of one string object is one test."""
    b = np.asarray(backend, dtype=object)
    if b.size and type(b[0]) is str and same_object(b):
        return np.full(b.shape[0], b[0] == "cublas", dtype=np.bool_)
    return b == "cublas"


def lower(cols: dict, hw) -> TilePlan:
    """Lower validated GEMM candidate columns to a :class:`TilePlan` for ``hw``.

    ``cols`` maps every name of :data:`COLUMNS` to a numpy array (defaults
    filled, strings as object arrays, library rows already expanded).

    Per row (one pass of :func:`_lower_rows`): the grid ``ceil(m / BM) x
    ceil(n / BN) x split_k``, ``ceil(ceil(k / split_k) / BK)`` steps; warpgroup
    MMA on Hopper and Blackwell for tensor-core rows of whole warpgroups
    (``num_warps >= wgmma_min_warps``) and tiles of a multiple of 64 rows,
    else warp MMA (or FMA for float32 without TF32); shared memory of
    ``max(stages - 1, 1)`` ring slots of the A and B tiles; registers from
    the accumulator, the MMA fragments and a fixed base, capped by the SM's
    registers per thread (the excess spills); per iteration the MMA FLOPs,
    the A and B tile bytes (the in-bound rows of edge tiles and, for Triton,
    the K the loop covers) rounded up to 32-byte sectors of their contiguous
    runs, with the DRAM time of runs shorter than ``dram_access_bytes`` at a
    whole access (``t_dram_scale``), the shared-memory traffic (with the spilled registers' loads and
    stores at every MMA step along ``BK``, through L1); per tile the C store (fp32 atomics,
    read and written, under split-K).
    """
    i64 = lambda a: np.ascontiguousarray(a, dtype=np.int64)  # noqa: E731
    b8 = lambda a: np.ascontiguousarray(a, dtype=np.bool_)  # noqa: E731
    dcode = map_codes(np.asarray(cols["dtype"], dtype=object), _DTYPE_CODE)
    blocked = admit(cols, dcode)
    if blocked.any():  # lowered with harmless values; residency marks them infeasible
        bad = blocked > 0
        cols = dict(cols)
        for c, v in _PLACEHOLDER.items():
            if c in cols:
                cols[c] = np.where(bad, v, np.asarray(cols[c], dtype=np.int64))
    m, n, k = i64(cols["m"]), i64(cols["n"]), i64(cols["k"])
    split = i64(cols["split_k"])
    group = i64(cols["group_m"])
    rows = m.shape[0]
    lib = _is_library(cols["backend"]) if "backend" in cols else np.zeros(rows, dtype=np.bool_)
    order = map_codes(np.asarray(cols["raster"], dtype=object), ORDER_NAMES)
    # float8 options; absent when a caller lowers columns validated elsewhere
    scode = (map_codes(np.asarray(cols["scale_mode"], dtype=object), _SCALE_CODE)
             if "scale_mode" in cols else np.zeros(rows, dtype=np.int64))
    fast = cols["fast_accum"] if "fast_accum" in cols else np.zeros(rows, dtype=np.bool_)
    eb_tab = np.array([v[0] for v in DTYPES.values()], dtype=np.int64)
    ob_tab = np.array([v[1] for v in DTYPES.values()], dtype=np.int64)
    sms = hw.sm_count
    tc_tab = np.array([hw.tc_tflops(v[2]) * 1e6 / sms for v in DTYPES.values()])

    g0, g1, ksteps, tiles = (np.empty(rows, dtype=np.int64) for _ in range(4))
    smem_block, threads, regs, spill = (np.empty(rows, dtype=np.int64) for _ in range(4))
    use_wgmma = np.empty(rows, dtype=np.bool_)
    on_tc = np.empty(rows, dtype=np.bool_)
    t_bytes = np.empty((rows, 3), dtype=np.float64)
    t_foot = np.empty((rows, 3), dtype=np.float64)
    t_crit = np.empty((rows, 3), dtype=np.float64)
    work_iter = np.zeros((rows, N_RES), dtype=np.float64)
    work_epi = np.zeros((rows, N_RES), dtype=np.float64)
    # rates per microsecond (per SM for private resources, chip for shared)
    clock_mhz = hw.rate("clock_mhz")
    rate = np.zeros((rows, N_RES), dtype=np.float64)
    rate[:, R_CUDA] = hw.rate("fp32_tflops") * 1e6 / sms
    rate[:, R_SMEM] = hw.smem_bytes_per_clk * clock_mhz  # bytes per us per SM
    rate[:, R_L15] = hw.rate("l15_bw_tbps") * 1e6 / sms if hw.has_l15 else 0.0
    rate[:, R_L2] = hw.rate("l2_bw_tbps") * 1e6 * hw.cal("l2_efficiency")
    rate[:, R_DRAM] = hw.rate("dram_bw_tbps") * 1e6 * hw.cal("dram_efficiency")
    share_eff = np.empty(rows, dtype=np.float64)
    tc_cap = np.empty(rows, dtype=np.float64)
    smem_capr = np.empty(rows, dtype=np.float64)
    cuda_capr = np.empty(rows, dtype=np.float64)
    useful_flops = np.empty(rows, dtype=np.float64)
    pipe_stages = np.empty(rows, dtype=np.int64)
    copy_smem = np.empty(rows, dtype=np.float64)
    # DRAM time per byte of each operand's DRAM share (1 where dram_access_bytes
    # is one sector: the plan then carries none)
    g_dram = max(hw.cal("dram_access_bytes"), 32.0)
    t_dram_scale = np.empty((rows, 3), dtype=np.float64)
    # the release matters only to Hopper's TF32 rows: parse it for those alone
    staged_mn = np.zeros(rows, dtype=np.bool_)
    if hw.mma == "wgmma" and "triton_version" in cols:
        sel = np.flatnonzero(b8(cols["tf32"]) & (dcode == _DTYPE_CODE["float32"]))
        if sel.size:
            staged_mn[sel] = (triton_release(np.asarray(cols["triton_version"], dtype=object)[sel])
                              < TRITON_PIPELINED_MN32)
    # an operand one element wide along N with its rows along N (B row-major
    # with n = 1; A column-major with m = 1, its transpose) has both strides 1
    # (the leading dimension is that one element): the same memory as the
    # K-contiguous layout, which the kernel runs as and which is lowered here.
    # Measured: the A100 rows of 9984 x 1 x 4480 fp32 (B row-major 3.0-3.7x
    # faster predicted than measured, the column-major twin 1.0-1.3) and the
    # n = 1 fp16 problems of shared/data/gemm/a100_triton_mm.parquet take the
    # same time under both flags (median ratio 1.000-1.001 over 150
    # configuration pairs). k = 1 (A row-major / B column-major) is left as it
    # is (docs/gemm_accuracy.md, session 3 continued)
    a_rm = b8(np.where(b8(cols["a_row_major"]), True, m == 1))
    b_rm = b8(np.where(b8(cols["b_row_major"]), n != 1, False))
    # rows in shares on the thread pool (the kernel releases the GIL)
    run_shares(_lower_rows, (
                m, n, k, i64(cols["block_m"]), i64(cols["block_n"]), i64(cols["block_k"]),
                i64(cols["num_stages"]), i64(cols["num_warps"]), split, dcode,
                b8(cols["tf32"]), a_rm, b_rm, eb_tab,
                ob_tab, tc_tab, _DTYPE_CODE["float32"], hw.mma in ("wgmma", "tcgen05"),
                float(hw.cal("wgmma_min_warps")), int(hw.max_registers_per_thread),
                int(hw.sm_registers), float(hw.mma_sync_fraction), float(hw.cal("tc_efficiency")),
                float(hw.cal("wgmma_share_efficiency")), g0, g1, ksteps, tiles, smem_block,
                threads, regs, spill, use_wgmma, on_tc, t_bytes, t_foot, t_crit, work_iter, work_epi, rate,
                share_eff, useful_flops, float(hw.smem_bytes_per_clk), _DTYPE_CODE["float8"],
                _DTYPE_CODE["float16"], scode, b8(fast), lib, hw.mma == "wgmma", b8(staged_mn),
                pipe_stages, copy_smem, sms, g_dram, t_dram_scale, hw.clock_cap, hw.fp32_clock_cap,
                hw.mma not in ("wgmma", "tcgen05"), hw.mma == "wgmma", tc_cap, smem_capr, cuda_capr),
               even_bounds(rows))

    lse = hw.cal("library_store_efficiency")
    if lse != 1.0 and lib.any():
        # the library's tensor-core kernels write C at their own share of the
        # DRAM rate (hw.py CALIBRATION_DEFAULTS; its SIMT SGEMM at the full one)
        lst = lib & on_tc
        work_epi[lst, R_DRAM] /= lse
    # the envelope's busiest SM runs whole tiles (t_crit): its C stores, beyond the
    # grid's average tile's, at the L2 and DRAM (split-K partials are whole already)
    epi_crit = None
    if (t_crit != t_bytes).any():  # a grid with edge tiles
        c_more = np.where(split > 1, 0.0, t_crit[:, 2] - t_bytes[:, 2])
        epi_crit = np.column_stack([c_more, c_more])
        if lse != 1.0 and lib.any():
            epi_crit[lib & on_tc, 1] /= lse

    # power-limited tensor clock: tc_efficiency is the sustained share of the
    # tensor-core peak when every SM issues MMAs (the ceiling of measured GEMM
    # throughput: the chip holds its power limit by lowering the clock). Dynamic
    # power scales with the busy SMs times the clock, so a grid that keeps only
    # `active` SMs busy runs them up to sms / active times faster, up to the full
    # measured rate: tc_efficiency x min(1 / tc_efficiency, sms / active). On the
    # H800 FP8 data (shared/data/gemm/pipeweave_fp8_gemm_train.parquet) a 32-tile
    # m = 32 GEMM runs 2.61 ns per k (n = 4096), which is one 128x128x128 tile per
    # SM at the full measured rate plus iter_overhead_cycles, where the largest
    # GEMMs sustain 0.72 of it
    # GEMMs sustain 0.72 of it. The clock drives the SM's other issue-rate
    # resources alike (CUDA cores, shared memory), which rise with it: that
    # 128x128x128 FP8 tile moves 80 KiB of shared memory per 128-deep step,
    # 142 B/clk at the measured 1730 MHz against the SM's 128 B/clk, so it runs
    # at that speed only at a higher clock. The tensor-core rate so boosted is
    # bounded by its measured peak; the CUDA-core and shared-memory rates are
    # per-clock figures at the measured clock (not reduced by tc_efficiency on a
    # full grid), so their boost is bounded by the GPU's maximum clock instead:
    # min(boost, max_clock_mhz / measured clock_mhz) (A100 1410 / 1387 = 1.017,
    # GH100 1980 / 1730 = 1.145; uncapped where the hw file gives no maximum);
    # the CUDA cores' over the clock their rate (fp32_tflops, stated on its own)
    # is stated at, HwSpec.fp32_clock_mhz, the same clock as loaded, so that a
    # clock lowered alone never raises their ceiling (it did: h100 IEEE FP32
    # library 64 x 6976 x 1024 26.15 -> 25.19 us at 0.9 x the clock)
    # (applied per row in _lower_rows: rate[:, R_TC / R_CUDA / R_SMEM] x boost)
    # A Triton grid of more tiles than SMs runs in rounds: each SM runs
    # `rounds = ceil(tiles / sms)` tiles or one fewer, so the last round keeps only
    # `last = tiles - (rounds - 1) sms` SMs busy. That round draws the power of
    # `last` SMs and runs at their clock, boost `min(1 / tc_efficiency, sms /
    # last)` (the sub-wave rule above with `last` for `active`); the earlier
    # rounds keep every SM busy and run at the measured full-grid rate. The
    # busiest SM's tensor-core time is then (rounds - 1) + 1 / boost rounds at
    # the full-grid rate, i.e. the rate x rounds / (rounds - 1 + 1 / boost),
    # and on a tensor-core row the CUDA-core and shared-memory rates likewise
    # with the boost capped at max_clock_mhz / clock_mhz (an FMA row's full-grid
    # rate is the per-clock peak, not a power-limited one: no headroom claimed):
    # continuous with the sub-wave rule at tiles = sms (rounds 1) and, per unit
    # of tensor work, non-decreasing in the tiles. Measured on A100, H100 and
    # H200 Triton fp16 / bf16 rows alike: compute-side rows run 0.87-0.93 of the
    # unboosted prediction at fill 0.6-0.8 against 1.00-1.05 full
    # (docs/gemm_accuracy.md, "The partly filled last wave, session 10"). Library
    # rows likewise where the library runs sm80-style kernels, a grid of its
    # tiles launched as Triton's is (Ampere; "The last round on the library's
    # tiles, session 10"); not on GPUs with warpgroup or tcgen05 MMA, whose
    # library kernels are persistent and tile-scheduled (CUTLASS 3's sm90
    # kernels: a grid of the SMs, with stream-K decompositions that even out
    # the last round), so the round count of the model's guessed tile does not
    # describe their tail.
    # On GPUs with warpgroup MMA (sm_90) a Triton tensor-core row's clock is taken
    # by waves of resident slots instead (envelope.wave_time's tail_tc, applied
    # with the residency): the full waves of sms x p slots run at the full grid's
    # rates (tc_efficiency, the measured clock), the last, partly filled wave at
    # the measured tensor peak and the shared memory's and CUDA cores' maximum
    # clock (the caps below), never faster than its share of the slots of a full
    # wave (the chip's power over that wave), with its L1.5 requests shared over
    # its busy SMs. The power limit binds where every slot of every SM runs a
    # tile: measured on the H100 Triton rows, the same 128x128x64 tile at the
    # same tiles per SM runs 16-19 % faster when the busiest SMs hold two tiles
    # at once (one wave of two resident slots, 144 or 160 tiles on 132 SMs) than
    # when they run them in two rounds of one, while full waves of pairs run 5 %
    # slower than full waves of single tiles (docs/gemm_accuracy.md, "Hopper
    # co-resident tiles, session 12", "The power-limited clock by waves, session 13")

    # a Triton FMA-dot warp's own shared loads per iteration: the shared-memory
    # work less the stores of the A and B tiles and the spills' local traffic
    # (once an iteration on this path)
    mma = on_tc | lib
    chain = None
    if not mma.all():  # the FMA rows' chain (None: no row has one)
        own_loads = work_iter[:, R_SMEM] - copy_smem - spill * 8.0 * threads
        chain, stall = _fma_chain(hw, mma, spill, smem_block, regs, threads,
                                  i64(cols["num_warps"]), work_iter[:, R_CUDA], rate[:, R_CUDA],
                                  own_loads)
        # the resident tiles' warps wait on their reloads together (_fma_chain):
        # the scheduler's issue time, as CUDA-core work at its rate
        work_iter[:, R_CUDA] += stall * rate[:, R_CUDA]
    # Triton's 2-stage FMA dot does not prefetch: the single ring slot is refilled
    # after the iteration's last shared load and waited for at once (Triton 3.0's
    # SASS for sm_80 and sm_90: bench/triton_fma_loop.py --stages 2 prints the copy
    # issued at FFMA 1,874-2,012 of 2,048 and its wait 24-128 FFMAs later on
    # 128x128x32/8 warps). Each iteration exposes the copy: the latency of an L2
    # hit (the operands are L2-resident: 77-94 % hits on the measured rows) and its
    # transfer into shared memory at the SM's SRAM rate (the L2 runs at 6-38 % of
    # its rate on these compute-bound rows, so not at the SM's share of it, which
    # the envelope's memory time is); the other resident tiles run in that wait
    # (envelope_one's ``expose``, docs/gemm_accuracy.md "The 2-stage FMA loop,
    # session 11")
    expose = None
    fma2 = ~mma & (pipe_stages == 2)
    if fma2.any():
        smem_rate = np.where(rate[:, R_SMEM] > 0.0, rate[:, R_SMEM], 1.0)
        expose = np.where(fma2, hw.cal("l2_latency_cycles") / clock_mhz + copy_smem / smem_rate,
                          0.0)

    # tensor accesses from the tile program: A reused along grid dim 1, B along
    # dim 0, C once per tile
    tens = PROGRAM.tensors
    t_mask = np.tile(np.array([t.mask for t in tens], dtype=np.int64), (rows, 1))
    t_per_step = np.tile(np.array([int(t.cadence == "step") for t in tens], dtype=np.int64),
                         (rows, 1))

    cyc = 1.0 / clock_mhz
    path_code = np.where(use_wgmma, 2, on_tc.astype(np.int64))
    ovh_tile = np.full(rows, hw.cal("tile_overhead_cycles") * cyc)
    # the library epilogue's passes through shared memory (_epilogue_chain): the
    # sm80-style kernels' default epilogue. Not the TMA kernels of Hopper and later
    # (warpgroup MMA, every leading dimension a multiple of 16 bytes: a TMA
    # descriptor's global strides must be, cuTensorMapEncodeTiled), whose
    # epilogue stores C by TMA from a subtile the other consumer warpgroup's loop
    # runs under; a call whose rows are not 16-byte aligned runs an sm80-style
    # kernel (mma.sync, cp.async or register staging) and pays the passes
    sel = np.flatnonzero(lib & on_tc)
    if sel.size:
        eb_sel = eb_tab[dcode[sel]]
        ld_ok = lambda ld: (ld * eb_sel) % 16 == 0  # noqa: E731
        ms, ns, ks = m[sel], n[sel], k[sel]
        tma = (use_wgmma[sel] & ld_ok(np.where(a_rm[sel], ks, ms))
               & ld_ok(np.where(b_rm[sel], ns, ks)) & ld_ok(ns))
        sel = sel[~tma]
    sm80 = np.zeros(rows, dtype=np.bool_)
    sm80[sel] = True
    if sel.size:
        p_lib, _why = resident_tiles(smem_block[sel], regs[sel], threads[sel], hw)
        extra = np.empty(sel.size, dtype=np.float64)
        _epilogue_chain(i64(cols["block_m"])[sel], i64(cols["block_n"])[sel],
                        i64(cols["num_warps"])[sel], ksteps[sel],
                        np.ascontiguousarray(p_lib, dtype=np.int64),
                        hw.cal("library_epilogue_pass_cycles") * cyc,
                        hw.cal("iter_overhead_cycles") * cyc, extra)
        ovh_tile[sel] += extra
    # Triton's Hopper epilogue converts the accumulator from the wgmma layout to a
    # blocked one through shared memory before its stores (a convert_layout: the
    # tile written and read back, 2 x BM x BN x output bytes at the SM's
    # shared-memory rate); serial between full waves (envelope.wave_time). The
    # library's persistent TMA kernels store from a subtile under the loop instead
    tri_wg = use_wgmma & ~lib & (order != ORDER_PERSISTENT)
    conv = None
    if tri_wg.any():
        conv = np.where(tri_wg & (rate[:, R_SMEM] > 0.0),
                        2.0 * t_foot[:, 2] / np.where(rate[:, R_SMEM] > 0.0, rate[:, R_SMEM], 1.0),
                        0.0)
    post = _library_split_reduction(hw, lib, split, m, n, ob_tab[dcode], rate[:, R_DRAM], rate[:, R_L2])
    pre = _library_tma_prologue(hw, lib, use_wgmma)
    serial = _library_split_serial(hw, lib, split, m, n, i64(cols["block_m"]),
                                   i64(cols["block_n"]), i64(cols["num_warps"]), sm80, cyc)
    group = clamp_group(group, g0)
    capped = bool((tc_cap > 0.0).any())  # rows whose clock the envelope takes by waves
    return TilePlan(
        g0=g0, g1=g1, g2=split, order=order, group=group, ksteps=ksteps,
        stages=pipe_stages, smem_block=smem_block, regs_thread=regs,
        threads=threads, warps=i64(cols["num_warps"]),
        t_mask=t_mask, t_per_step=t_per_step, t_bytes=t_bytes, t_foot=t_foot,
        t_crit=t_crit if epi_crit is not None else None, epi_crit=epi_crit,
        t_dram_scale=t_dram_scale if g_dram > 32.0 else None,
        work_iter=work_iter, work_epi=work_epi, rate=rate, warps_full=4.0,
        lat_us=np.full(rows, hw.cal("mem_latency_us")),
        ovh_iter_us=np.full(rows, hw.cal("iter_overhead_cycles") * cyc),
        ovh_tile_us=ovh_tile,
        launch_us=np.full(rows, hw.launch_us),
        persistent=(order == ORDER_PERSISTENT).astype(np.int64),
        chain_us=chain,
        conv_us=conv,
        expose_us=expose,
        useful_flops=useful_flops,
        share_eff=share_eff,
        sync_us=np.full(rows, hw.cal("iter_sync_cycles") * cyc),
        tc_clock_cap=tc_cap if capped else None,
        smem_clock_cap=smem_capr if capped else None,
        cuda_clock_cap=cuda_capr if capped else None,
        blocked=blocked if blocked.any() else None,
        rules=ADMIT_RULES if blocked.any() else (),
        unlowered=(blocked > 0) if blocked.any() else None,
        extra={
            **mma_path_extra(path_code),
            "register_spill": spill,
            "tiles": tiles,
            **({"post_us": post} if post is not None else {}),
            **({"pre_us": pre} if pre is not None else {}),
            **({"serial_us": serial} if serial is not None else {}),
        },
    )


@jit_exact
def _epilogue_chain(bm, bn, warps, ksteps, p, pass_us, hide_us, out):
    """Per-tile time (us) the epilogue of a library sm80-style tensor-core tile
    adds to its SM, written into ``out`` (one row per such row).

    The library's sm80-style kernels (CUTLASS's default tensor-op epilogue,
    ``cutlass/epilogue/threadblock/epilogue.h``; cuBLAS's sm80 kernels, and on
    Hopper the kernels of calls a TMA kernel cannot take) move the accumulator
    tile to global memory through shared memory in
    ``OutputTileIterator::kIterations`` passes, one per 8 rows of a warp tile
    (``kTensorOpRows``; the warp tile of :func:`_warp_grid`), each pass a block
    barrier, the warps' shared stores, a second barrier, the shared loads and
    then the global stores: a chain of ``pass_us`` a pass
    (``library_epilogue_pass_cycles``) before the slice's stores can issue.
    Triton's epilogue converts the tile's layout once. The ``p`` tiles resident
    on an SM run their chains side by side (latency, not issue), so a tile adds
    ``chain / p`` to its SM. Each main-loop step past the first hides
    ``hide_us`` of it (``iter_overhead_cycles``: the part of another resident
    tile's loop step, its issue, that no rate sets; the step itself is longer,
    so this is a lower bound on what runs under the chain): a chain is never
    hidden all at once when K crosses a multiple of BK (an extra step adds at
    least ``hide_us`` to the tile, the chain falls by ``hide_us / p``), so the
    prediction never falls for more K. The rule reads no rate, so no rate
    falling can shorten a kernel."""
    for i in range(bm.shape[0]):
        wm, wn = _warp_grid(bm[i], bn[i], warps[i])
        passes = bm[i] // wm // 8
        if passes < 1:
            passes = 1
        q = p[i] if p[i] > 1 else 1
        c = passes * pass_us - (ksteps[i] - 1) * hide_us
        out[i] = c / q if c > 0.0 else 0.0


def _library_split_reduction(hw, lib, split, m, n, ob, dram_rate, l2_rate):
    """Per-row time (us) of a library split-K call's second kernel, 0 elsewhere;
    None when no row has one.

    cuBLASLt reduces split-K partials outside the GEMM kernel unless it asks for
    in-place reduction (``cublasLtReductionScheme_t``: COMPUTE_TYPE / OUTPUT_TYPE
    keep the partials in the workspace, the reason the library asks for 4 MiB on
    Ampere and 32 MiB on Hopper), and CUTLASS's parallel split-K is the GEMM
    kernel writing ``split_k`` partial C's followed by a reduction kernel
    (``cutlass::reduction::kernel::ReduceSplitK``). That kernel is a second
    launch in the same stream: its launch-to-start latency (``[launch]
    launch_overhead_us``, the spec value, not the harness floor of the first
    kernel), one memory latency, and a stream over the ``split_k`` fp32
    partials read and C written at the DRAM rate.
    """
    if not lib.any():
        return None
    mn = m.astype(np.float64) * n
    ws = LIBRARY_WORKSPACE_BYTES.get(hw.arch, LIBRARY_WORKSPACE_BYTES["ampere"])
    sel = lib & (split > 1) & (split * 4.0 * mn <= ws)
    if not sel.any():
        return None
    return np.where(sel, float(hw.launch_overhead_us) + hw.cal("mem_latency_us")
                    + split * 4.0 * mn / l2_rate + ob * mn / dram_rate, 0.0)


@jit_exact
def _split_serial_chain(bm, bn, warps, split, sm80, link_us, pass_us, out):
    """``(split_k - 1)`` links of a library in-place split-K chain per row
    (:func:`_library_split_serial`), written into ``out``: each link
    ``link_us``, plus on sm80-style tensor-core tiles (``sm80``) the waiter's
    own epilogue passes (one of ``pass_us`` per 8 rows of its warp tile, as
    :func:`_epilogue_chain` counts them)."""
    for i in range(bm.shape[0]):
        c = link_us
        if sm80[i]:
            wm, wn = _warp_grid(bm[i], bn[i], warps[i])
            passes = bm[i] // wm // 8
            if passes < 1:
                passes = 1
            c += passes * pass_us
        s = split[i] - 1
        out[i] = s * c if s > 0 else 0.0


def _library_split_serial(hw, lib, split, m, n, bm, bn, warps, sm80, cyc):
    """Per-row serial chain (us) of a library split-K call that reduces in
    place, 0 elsewhere; None when no row has one.

    A split-K call whose fp32 partials do not fit the library's workspace
    (:data:`LIBRARY_WORKSPACE_BYTES`; the others reduce in a second kernel,
    :func:`_library_split_reduction`) reduces in C itself: cuBLASLt's
    ``CUBLASLT_REDUCTION_SCHEME_INPLACE``, "using the output buffer (and output
    data type) and counters (in workspace) to guarantee the sequentiality"
    (``cublasLt.h``), as CUTLASS's serial split-K (``kSplitKSerial``,
    ``cutlass/gemm/kernel/gemm.h``: split ``s`` waits on the tile's semaphore
    until split ``s - 1`` released it, adds its partial to the C that split
    wrote, then releases ``s + 1``). The splits of one output tile therefore
    finish one after another: ``split_k - 1`` links, each the predecessor's
    C stores made visible before its release (``st.release.gpu``: one L2 round
    trip), the waiter's acquire poll that sees it (one more) and its load of
    the source C tile (one more), three ``l2_latency_cycles``, then the
    waiter's own epilogue passes on sm80-style tiles (``sm80``;
    ``library_epilogue_pass_cycles`` each, the passes of
    :func:`_epilogue_chain`). Nothing fitted. The envelope takes it as a
    critical path: the kernel lasts at least one wave plus the chain
    (:func:`tsbatch.engine.evaluate.evaluate_plan`), which later waves hide.
    """
    if not lib.any():
        return None
    ws = LIBRARY_WORKSPACE_BYTES.get(hw.arch, LIBRARY_WORKSPACE_BYTES["ampere"])
    sel = np.flatnonzero(lib & (split > 1) & (split * 4.0 * m.astype(np.float64) * n > ws))
    if sel.size == 0:
        return None
    out = np.zeros(lib.shape[0], dtype=np.float64)
    chain = np.empty(sel.size, dtype=np.float64)
    _split_serial_chain(bm[sel], bn[sel], warps[sel], split[sel], sm80[sel],
                        3.0 * hw.cal("l2_latency_cycles") * cyc,
                        hw.cal("library_epilogue_pass_cycles") * cyc, chain)
    out[sel] = chain
    return out


def _library_tma_prologue(hw, lib, use_wgmma):
    """Per-row time (us) a library tensor-core kernel on Hopper and later waits
    before its first operand load, 0 elsewhere; None when no row has one.

    The library's sm90 (and sm100) kernels load A and B with TMA, whose copies
    name a tensor map (``CUtensorMap``, 128 bytes) that lives in global memory
    (a ``__grid_constant__`` kernel parameter): the producer warp fetches it
    (``prefetch.tensormap``, CUTLASS ``prefetch_tma_descriptor``) before its
    first ``cp.async.bulk.tensor``, a dependent memory access the tile's first
    load waits on, one ``mem_latency_us``. A Triton kernel (Inductor's template:
    ``cp.async`` from addresses it computes in registers) and the library's
    sm80 kernels (Ampere; Hopper's mma.sync TF32 and SIMT rows, which do not
    run the wgmma path) issue their first load at once. Nothing fitted: the
    model's own memory latency.
    """
    if hw.mma not in ("wgmma", "tcgen05"):
        return None
    sel = lib & use_wgmma
    if not sel.any():
        return None
    return np.where(sel, hw.cal("mem_latency_us"), 0.0)


def _fma_chain(hw, mma, spill, smem_block, regs, threads, warps, flops_iter, fp32_rate,
               smem_loads):
    """Per-row chain of one iteration (us) of a warp of Triton's FMA dot, 0 on
    the tensor-core and library rows (``mma``), None when no row has one; and
    per row the reload stall (us) each of its tiles' iterations adds to the SM's
    issue time, 0 where the row does not spill.

    A warp issues its FFMAs at one scheduler's share of the SM's FP32 rate, and
    the FFMAs of each k wait for that k's operands, so the warp's own shared
    loads (``smem_loads`` bytes a block, 128-byte wavefronts, shared by its
    warps) run in series with them: with a warp or two per scheduler (one
    128x128 block of 4 warps, a 64x64x128 block that fills shared memory) no
    other warp fills the gap. ptxas keeps only about BK / 8 k of fragments in
    flight (:data:`FMA_K_PER_SLICE`), too few to hide the loads of a
    bank-conflicting operand.

    Spilled registers add their reloads, each an iteration, each a wait on the
    chain: spilled registers of ``spill x 4 x threads`` bytes a resident block
    are reloaded from L1 (``l1_latency_cycles``) while the resident blocks' spills
    fit the L1 that the shared-memory carve-out leaves, and from L2
    (``l2_latency_cycles``) when they do not
    (:func:`tsbatch.kernels.occupancy.l1_left`). (ptxas on Triton
    3.0 for sm_80: 128x128x64 on 4 warps spills 776-1,488 bytes a thread, 97-186
    KB a block, where 28 KB of L1 are left, and reloads 190-340 words an
    iteration; those tiles run 3x (A100) and 5x (H100) slower than their FFMAs;
    128x128x32 on 4 warps reloads 34 words an iteration from L1 with A and B
    row-major and runs 1.18x its FFMAs, none with A column-major, 1.04x.)

    The other warps on a scheduler do not hide those waits as they hide the
    chain's: the warps of the resident tiles run the same loop at one issue rate
    and reach their reloads together, so the scheduler idles one reload stall per
    round of the ``p`` resident tiles' iterations, ``stall / p`` per tile's
    iteration (the second return). The tensor-core and library rows keep their
    spills in the shared-memory traffic only."""
    n = spill.shape[0]
    stall = np.zeros(n, dtype=np.float64)
    idx = np.flatnonzero(~mma)
    if idx.size == 0:
        return None, stall
    clock = hw.rate("clock_mhz")
    chain = np.zeros(n, dtype=np.float64)
    chain[idx] = (flops_iter[idx] / warps[idx] / (fp32_rate[idx] / hw.warp_schedulers)
                  + smem_loads[idx] / 128.0 / warps[idx] / clock)
    sp = idx[spill[idx] > 0]
    if sp.size:
        p, left = l1_left(smem_block[sp], regs[sp], threads[sp], hw)
        miss = spill[sp] * 4.0 * threads[sp] * p > left
        wait = spill[sp] * np.where(miss, hw.cal("l2_latency_cycles"),
                                    hw.cal("l1_latency_cycles")) / clock
        chain[sp] += wait
        stall[sp] = wait / p
    return chain, stall


def expand_library(cols: dict, is_lib: np.ndarray, arch: str, stream_k_sms: int = 0):
    """Replace each library row by one row per catalog tile.

    float8 rows take :data:`LIBRARY_TILES_FP8` where the architecture has one,
    every other row :data:`LIBRARY_TILES`, whose ``block_k`` is scaled to the
    same bytes of K for elements wider than :data:`LIBRARY_TILE_BYTES`. Returns ``(expanded_cols, parent)``
    where ``parent[j]`` is the input row that expanded row ``j`` stands for;
    non-library rows map to themselves (and come first, in input order).

    ``stream_k_sms`` > 0 (the stream-K floor, :func:`library_stream_k_points`): the
    split tiles of :func:`library_stream_k_tiles` instead of the catalog (the caller
    keeps those :func:`library_stream_k_valid` allows). The rows must not be float8.
    """
    cat = LIBRARY_TILES.get(arch, LIBRARY_TILES["ampere"])
    if stream_k_sms:
        cat = library_stream_k_tiles(arch)
    lib_idx = np.flatnonzero(is_lib)
    keep = np.flatnonzero(~is_lib)
    groups = [(lib_idx, cat)]
    cat8 = LIBRARY_TILES_FP8.get(arch)
    if cat8 is not None and lib_idx.size and "dtype" in cols:
        is8 = np.asarray(cols["dtype"], dtype=object)[lib_idx] == "float8"
        if is8.any():
            groups = [(lib_idx[~is8], cat), (lib_idx[is8], cat8)]
    if lib_idx.size and "dtype" in cols and "tf32" in cols and not stream_k_sms:
        # IEEE FP32 rows one element wide in n or m: the GEMV tile besides the catalog
        dt = np.asarray(cols["dtype"], dtype=object)[lib_idx]
        ieee = (dt == "float32") & ~np.asarray(cols["tf32"], dtype=np.bool_)[lib_idx]
        n1 = ieee & (np.asarray(cols["n"])[lib_idx] == 1)
        m1 = ieee & ~n1 & (np.asarray(cols["m"])[lib_idx] == 1)
        if n1.any() or m1.any():
            gemv = n1 | m1
            groups = [(idx[~np.isin(idx, lib_idx[gemv])], c) for idx, c in groups]
            groups += [(lib_idx[n1], cat + (LIBRARY_GEMV_TILES["n1"],)),
                       (lib_idx[m1], cat + (LIBRARY_GEMV_TILES["m1"],))]
    parent = np.concatenate([keep] + [np.repeat(idx, len(c)) for idx, c in groups])
    out = {name: np.asarray(v)[parent] for name, v in cols.items()}
    if lib_idx.size:
        tile = np.concatenate([np.tile(np.array([c[:6] for c in cg], dtype=np.int64),
                                       (idx.size, 1)) for idx, cg in groups])
        sl = slice(keep.size, None)
        for j, name in enumerate(("block_m", "block_n", "block_k", "num_stages", "num_warps",
                                  "split_k")):
            col = np.asarray(out[name]).astype(np.int64, copy=True)
            col[sl] = tile[:, j]
            out[name] = col
        rast = np.asarray(out["raster"], dtype=object).copy()
        rast[sl] = np.concatenate([np.tile(np.array([c[6] for c in cg], dtype=object), idx.size)
                                   for idx, cg in groups])
        out["raster"] = rast
        if "dtype" in out:
            # K extent in bytes (LIBRARY_TILE_BYTES): wider elements, fewer of them
            eb = np.array([v[0] for v in DTYPES.values()], dtype=np.int64)[
                map_codes(np.asarray(out["dtype"], dtype=object)[sl], _DTYPE_CODE)]
            bk = out["block_k"]
            bk[sl] = np.where(eb > LIBRARY_TILE_BYTES,
                              np.maximum(bk[sl] * LIBRARY_TILE_BYTES // eb, 1), bk[sl])
        grp = np.asarray(out["group_m"]).astype(np.int64, copy=True)
        grp[sl] = 8
        out["group_m"] = grp
    assert parent.shape[0] == keep.size + sum(idx.size * len(c) for idx, c in groups)
    return out, parent


FAMILY = Family(
    name="gemm",
    columns=COLUMNS,
    workload_columns=("m", "n", "k", "dtype", "a_row_major", "b_row_major", "tf32"),
    lower=lower,
    doc=__doc__ or "",
    program=PROGRAM,
)


#: split counts the stream-K floor prices (:func:`library_stream_k_tiles`)
LIBRARY_STREAM_K_SPLITS = (2, 4, 8, 16)


def library_stream_k_tiles(arch: str) -> tuple:
    """The split kernels of the stream-K floor: each tile shape of the catalog's
    split-K tiles at every count of :data:`LIBRARY_STREAM_K_SPLITS` (catalog tuples)."""
    cat = LIBRARY_TILES.get(arch, LIBRARY_TILES["ampere"])
    shapes = dict.fromkeys(c[:5] + (c[6],) for c in cat if c[5] > 1)
    return tuple(sh[:5] + (sp, sh[5]) for sh in shapes for sp in LIBRARY_STREAM_K_SPLITS)


def library_stream_k_valid(m, n, k, bm, bn, bk, split, sms: int) -> np.ndarray:
    """Per row: whether the stream-K rule splits a ``bm x bn x bk`` tile (``bk`` in
    elements) of an ``m x n x k`` call on ``sms`` SMs into ``split`` parts.

    CUTLASS's rule (:data:`LIBRARY_STREAM_K_MIN_ITERS`) splits a grid of ``tiles``
    under half the SMs whose stream-K units a tile, ``min(sms // tiles, k_tiles //
    8)`` (the whole part of ``min(SMs, tiles * k_tiles / 8) / tiles``), are two or
    more. The floor lets the library take the fastest of the counts that fit the
    SMs (``split <= sms // tiles``; 2, 4, 8, 16) rather than the rule's own count:
    that count grows with K (``k_tiles // 8``), and a prediction taking it would
    fall where K passes a multiple of 8 steps (more splits, less K each: A100 32 x
    1280 x 1472 -> 1536, 16.36 -> 14.99 us); a fixed set of counts, each slower as
    m, n or k grow and fewer of them as the grid grows, keeps the floor monotone
    (docs/gemm_accuracy.md, "The library's skinny calls, session 11")."""
    m = np.asarray(m, dtype=np.int64)
    n = np.asarray(n, dtype=np.int64)
    k = np.asarray(k, dtype=np.int64)
    tiles = (-(-m // np.asarray(bm, dtype=np.int64))) * (-(-n // np.asarray(bn, dtype=np.int64)))
    k_tiles = -(-k // np.maximum(np.asarray(bk, dtype=np.int64), 1))
    fill = sms // np.maximum(tiles, 1)
    units = np.minimum(fill, k_tiles // LIBRARY_STREAM_K_MIN_ITERS)
    split = np.asarray(split, dtype=np.int64)
    return (2 * tiles < sms) & (units >= 2) & (split >= 2) & (split <= fill)


def library_stream_k_points(cols: dict, is_lib: np.ndarray, arch: str, sms: int):
    """The problems whose split kernel bounds a library row from below (the
    stream-K floor; docs/gemm_accuracy.md, "The library's skinny calls, session 11").

    The library splits K where the grid of its tiles fills under half the SMs and the
    reduction is long (:func:`library_stream_k_valid`), and the split kernel (plus its
    reduction) is slower than the unsplit grid the catalog would price, so a
    prediction taking the split kernel there and the unsplit one just above would
    fall as m or n grows. The floor keeps the model monotone in m and n: a row is
    priced at least the split kernel of every smaller problem (m' <= m, n' <= n, the
    same k, dtype and layouts) that the rule splits. "Splits" is judged on the grid
    of the catalog's smallest unsplit tile (the largest grid, so the set is closed
    under shrinking m or n) with that tile's K step: ``2 * tiles < sms`` and
    ``k_tiles >= 2 * LIBRARY_STREAM_K_MIN_ITERS``. Only its maximal members matter
    (the floor's split kernels are slower and fewer as m and n grow): for each count ``a`` of tile rows,
    the most tile columns ``b = min(ceil(n / bn), h // a)`` with ``h = (sms - 1) //
    2``, the point ``(min(m, a bm), min(n, b bn))``, kept where the next ``a`` has
    fewer columns. Not for float8 rows (no split tiles) nor IEEE FP32 ones (``tf32``
    false: CUDA-core kernels, where neither the rule's source nor the traces apply;
    their split tiles also carried the per-clock fall of the sub-wave rule, since
    fixed: ``HwSpec.fp32_clock_mhz``).

    Returns ``(parent, points)``: ``points`` holds ``cols``' columns for one row per
    point with ``m`` and ``n`` replaced, ``parent`` the input row each stands for.
    """
    cat = LIBRARY_TILES.get(arch, LIBRARY_TILES["ampere"])
    plain = [c for c in cat if c[5] == 1]
    empty = np.zeros(0, dtype=np.int64)
    if sms < 3 or not plain or not any(c[5] > 1 for c in cat):
        return empty, None
    bm0, bn0, bk0 = min(plain, key=lambda c: c[0] * c[1])[:3]
    idx = np.flatnonzero(is_lib)
    if idx.size == 0:
        return empty, None
    m = np.asarray(cols["m"])[idx].astype(np.int64)
    n = np.asarray(cols["n"])[idx].astype(np.int64)
    k = np.asarray(cols["k"])[idx].astype(np.int64)
    dt = np.asarray(cols["dtype"], dtype=object)[idx]
    tf = (np.asarray(cols["tf32"], dtype=np.bool_)[idx] if "tf32" in cols
          else np.zeros(idx.size, dtype=np.bool_))
    eb = np.array([v[0] for v in DTYPES.values()], dtype=np.int64)[map_codes(dt, _DTYPE_CODE)]
    bk = np.maximum(bk0 * LIBRARY_TILE_BYTES // eb, 1)
    ieee = (dt == "float32") & ~tf  # CUDA-core (SIMT) kernels: not the traced ones
    ok = (dt != "float8") & ~ieee & ((-(-k // bk)) >= 2 * LIBRARY_STREAM_K_MIN_ITERS)
    sel = np.flatnonzero(ok)
    if sel.size == 0:
        return empty, None
    h = (sms - 1) // 2
    a_q = np.minimum(-(-m[sel] // bm0), h)
    b_q = -(-n[sel] // bn0)
    a = np.arange(1, h + 2, dtype=np.int64)[None, :]
    b = np.minimum(b_q[:, None], h // a)  # the most tile columns beside a tile rows
    live = a <= a_q[:, None]
    nxt = np.concatenate([b[:, 1:], np.zeros((sel.size, 1), dtype=np.int64)], axis=1)
    keep = live & ((a == a_q[:, None]) | (nxt != b)) & (b > 0)
    r, c = np.nonzero(keep)
    rows = sel[r]
    pm = np.minimum(m[rows], a[0, c] * bm0)
    pn = np.minimum(n[rows], b[r, c] * bn0)
    parent = idx[rows]
    points = {name: np.asarray(v)[parent] for name, v in cols.items()}
    points["m"] = pm
    points["n"] = pn
    return parent, points
