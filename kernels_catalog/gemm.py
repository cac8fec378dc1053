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

import numpy as np

from kernels_catalog.base import Column, Family, TilePlan
from tsbatch.kernels.envelope import (
    N_RES, R_CUDA, R_DRAM, R_L15, R_L2, R_SMEM, R_TC,
)
from tsbatch.kernels.order import ORDER_GROUPED, ORDER_NAMES, ORDER_PERSISTENT

__all__ = ["FAMILY", "COLUMNS", "DTYPES", "LIBRARY_TILES", "lower", "expand_library", "warp_grid", "warpgroup_grid"]

#: input dtype -> (bytes per element, output bytes, tensor-core rate key)
DTYPES = {
    "float16": (2, 2, "float16"),
    "bfloat16": (2, 2, "bfloat16"),
    "float32": (4, 4, "tf32"),
    "float8": (1, 2, "float8"),
}
_DTYPE_CODE = {name: i for i, name in enumerate(DTYPES)}

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
           "with fp32 atomics)", required=False, default=1, positive=True),
)

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

#: register estimate: fixed per-thread cost of addresses, loop state, masks
REGS_BASE = 40


def warp_grid(block_m: np.ndarray, block_n: np.ndarray, warps: np.ndarray):
    """Warps along M and N for warp-level MMA (grow M while its per-warp rows
    exceed the per-warp columns, as Triton's MMA layout does)."""
    wm = np.ones_like(warps)
    wn = np.ones_like(warps)
    for _ in range(6):  # up to 64 warps
        need = wm * wn < warps
        grow_m = need & ((block_m // (16 * wm)) >= (block_n // (8 * wn))) & (block_m >= 32 * wm)
        grow_n = need & ~grow_m & (block_n >= 16 * wn)
        wm = np.where(grow_m, wm * 2, wm)
        wn = np.where(grow_n, wn * 2, wn)
        stuck = need & ~grow_m & ~grow_n
        wm = np.where(stuck, wm * 2, wm)
    return wm, wn


def warpgroup_grid(block_m: np.ndarray, warps: np.ndarray):
    """Warpgroups along M and N for warpgroup MMA: along M while a warpgroup
    still gets more than its 64 rows, then along N (Triton's warpsPerTileV3)."""
    wg_m = np.ones_like(warps)
    wg_n = np.ones_like(warps)
    for _ in range(4):  # up to 64 warps
        need = 4 * wg_m * wg_n < warps
        along_m = need & (block_m > 64 * wg_m)
        wg_m = np.where(along_m, wg_m * 2, wg_m)
        wg_n = np.where(need & ~along_m, wg_n * 2, wg_n)
    return wg_m, wg_n


def lower(cols: dict, hw) -> TilePlan:
    """Lower validated GEMM candidate columns to a :class:`TilePlan` for ``hw``.

    ``cols`` maps every name of :data:`COLUMNS` to a numpy array (defaults
    filled, strings as object arrays, library rows already expanded).
    """
    i64 = lambda a: np.asarray(a, dtype=np.int64)  # noqa: E731
    m, n, k = i64(cols["m"]), i64(cols["n"]), i64(cols["k"])
    bm, bn, bk = i64(cols["block_m"]), i64(cols["block_n"]), i64(cols["block_k"])
    stages, warps = i64(cols["num_stages"]), i64(cols["num_warps"])
    split = i64(cols["split_k"])
    group = i64(cols["group_m"])
    rows = m.shape[0]
    dtype = np.asarray(cols["dtype"], dtype=object)
    tf32 = np.asarray(cols["tf32"], dtype=bool)
    a_rm = np.asarray(cols["a_row_major"], dtype=bool)
    b_rm = np.asarray(cols["b_row_major"], dtype=bool)
    raster = np.asarray(cols["raster"], dtype=object)
    order = _map_codes(raster, ORDER_NAMES)
    dcode = _map_codes(dtype, _DTYPE_CODE)
    eb_tab = np.array([v[0] for v in DTYPES.values()], dtype=np.int64)
    ob_tab = np.array([v[1] for v in DTYPES.values()], dtype=np.int64)
    eb = eb_tab[dcode]
    ob = ob_tab[dcode]
    is_f32 = dcode == _DTYPE_CODE["float32"]
    on_tc = ~is_f32 | tf32

    g0 = -(-m // bm)
    g1 = -(-n // bn)
    g2 = split
    k_per = -(-k // split)
    ksteps = np.maximum(-(-k_per // bk), 1)
    tiles = g0 * g1 * g2

    # ---- MMA path: warpgroup MMA on Hopper when a warpgroup covers 64 rows
    wgmma_min = hw.cal("wgmma_min_warps")
    use_wgmma = np.zeros(rows, dtype=bool)
    if hw.mma in ("wgmma", "tcgen05"):
        # Triton's MMAv3 needs whole warpgroups and a multiple of 64 rows; the
        # warpgroups are laid out over M while rows remain, then over N
        # (AccelerateMatmul.cpp, warpsPerTileV3), so 8 warps on a 64-row tile
        # still issue wgmma, as two warpgroups side by side along N
        use_wgmma = on_tc & (warps >= wgmma_min) & (warps % 4 == 0) & (bm % 64 == 0)
    wg_m, wg_n = warpgroup_grid(bm, warps)
    wm, wn = warp_grid(bm, bn, warps)

    # ---- per-block resources
    ab_elems = bm * bk + bk * bn
    # Triton's software pipeliner keeps num_stages - 1 ring slots of A and B in
    # shared memory (one stage computes from registers while the others are in
    # flight); this matches which configurations of the measured A100 and H100
    # sets ran and which failed for lack of shared memory.
    smem_block = np.maximum(stages - 1, 1) * ab_elems * eb
    threads = warps * 32
    acc_regs = (bm * bn) // np.maximum(threads, 1)
    frag_regs = np.where(use_wgmma, 0, 2 * ((bm // wm) + (bn // wn)) * 16 * eb // (4 * 32))
    regs_want = acc_regs + frag_regs + REGS_BASE
    regs_cap = np.minimum(hw.max_registers_per_thread,
                          (hw.sm_registers // np.maximum(threads, 1)) // 8 * 8)
    regs = np.minimum(regs_want, regs_cap)
    spill = np.maximum(regs_want - regs_cap, 0)

    # ---- resource vector per iteration (Eq. 1), before the cache split
    work_iter = np.zeros((rows, N_RES), dtype=np.float64)
    work_epi = np.zeros((rows, N_RES), dtype=np.float64)
    flops_iter = 2.0 * bm * bn * bk
    work_iter[:, R_TC] = np.where(on_tc, flops_iter, 0.0)
    work_iter[:, R_CUDA] = np.where(on_tc, 0.0, flops_iter)
    a_bytes = (bm * bk * eb).astype(np.float64)
    b_bytes = (bk * bn * eb).astype(np.float64)
    # sector efficiency of the contiguous runs of each load (32-byte sectors)
    a_run = np.where(a_rm, bk, bm) * eb
    b_run = np.where(b_rm, bn, bk) * eb
    a_fetch = a_bytes * (np.ceil(a_run / 32.0) * 32.0 / a_run)
    b_fetch = b_bytes * (np.ceil(b_run / 32.0) * 32.0 / b_run)
    work_iter[:, R_L2] = a_fetch + b_fetch  # split by the cache model later
    smem_reads = np.where(use_wgmma, bk * eb * (wg_n * bm + wg_m * bn),
                          bk * eb * (wn * bm + wm * bn))
    smem_writes = ab_elems * eb
    spill_bytes = spill * 4.0 * threads * 2.0
    work_iter[:, R_SMEM] = smem_reads + smem_writes + spill_bytes
    c_bytes = (bm * bn * ob).astype(np.float64)
    c_store = np.where(split > 1, bm * bn * 4.0 * 2.0, c_bytes)  # fp32 atomics: read+write
    work_epi[:, R_L2] = c_store
    work_epi[:, R_DRAM] = np.where(split > 1, bm * bn * 4.0, c_bytes)
    work_epi[:, R_CUDA] = 2.0 * bm * bn

    # ---- rates per microsecond (per SM for private resources, chip for shared)
    sms = hw.sm_count
    clock_mhz = hw.rate("clock_mhz")
    rate = np.zeros((rows, N_RES), dtype=np.float64)
    tc_chip = np.zeros(rows, dtype=np.float64)
    for name, code in _DTYPE_CODE.items():
        sel = dcode == code
        if sel.any():
            tc_chip[sel] = hw.tc_tflops(DTYPES[name][2]) * 1e6  # FLOP per us
    path = np.where(use_wgmma, 1.0, hw.mma_sync_fraction)
    rate[:, R_TC] = tc_chip / sms * path * hw.cal("tc_efficiency")
    rate[:, R_CUDA] = hw.rate("fp32_tflops") * 1e6 / sms
    rate[:, R_SMEM] = hw.smem_bytes_per_clk * clock_mhz  # bytes per us per SM
    rate[:, R_L15] = hw.rate("l15_bw_tbps") * 1e6 / sms if hw.has_l15 else 0.0
    rate[:, R_L2] = hw.rate("l2_bw_tbps") * 1e6 * hw.cal("l2_efficiency")
    rate[:, R_DRAM] = hw.rate("dram_bw_tbps") * 1e6 * hw.cal("dram_efficiency")

    # ---- tensor accesses: A reused along grid dim 1, B along dim 0, C once
    t_mask = np.empty((rows, 3), dtype=np.int64)
    t_mask[:, 0] = 0b010
    t_mask[:, 1] = 0b001
    t_mask[:, 2] = 0b000
    t_per_step = np.empty((rows, 3), dtype=np.int64)
    t_per_step[:, :2] = 1
    t_per_step[:, 2] = 0
    t_bytes = np.stack([a_fetch, b_fetch, c_bytes], axis=1)

    launch = hw.launch_us
    cyc = 1.0 / clock_mhz
    return TilePlan(
        g0=g0, g1=g1, g2=g2, order=order, group=group, ksteps=ksteps, stages=stages,
        smem_block=smem_block, regs_thread=regs, threads=threads, warps=warps,
        t_mask=t_mask, t_per_step=t_per_step, t_bytes=t_bytes,
        work_iter=work_iter, work_epi=work_epi, rate=rate, warps_full=4.0,
        lat_us=np.full(rows, hw.cal("mem_latency_us")),
        ovh_iter_us=np.full(rows, hw.cal("iter_overhead_cycles") * cyc),
        ovh_tile_us=np.full(rows, hw.cal("tile_overhead_cycles") * cyc),
        launch_us=np.full(rows, launch),
        persistent=(order == ORDER_PERSISTENT).astype(np.int64),
        useful_flops=2.0 * m * n * k,
        share_eff=np.where(use_wgmma, hw.cal("wgmma_share_efficiency"), 1.0),
        sync_us=np.full(rows, hw.cal("iter_sync_cycles") * cyc),
        extra={
            "mma_path": np.where(use_wgmma, "wgmma", np.where(on_tc, "mma_sync", "fma")),
            "register_spill": spill,
            "tiles": tiles,
        },
    )


def _map_codes(values: np.ndarray, table: dict) -> np.ndarray:
    """Map an object array of strings to integer codes (vectorized)."""
    if values.size and type(values[0]) is str and (values == values[0]).all():
        return np.full(values.shape[0], table[values[0]], dtype=np.int64)  # one value: no sort
    uniq, inv = np.unique(values.astype(str), return_inverse=True)
    codes = np.array([table[u] for u in uniq], dtype=np.int64)
    return codes[inv]


def expand_library(cols: dict, is_lib: np.ndarray, arch: str):
    """Replace each library row by one row per catalog tile.

    Returns ``(expanded_cols, parent)`` where ``parent[j]`` is the input row
    that expanded row ``j`` stands for; non-library rows map to themselves.
    """
    cat = LIBRARY_TILES.get(arch, LIBRARY_TILES["ampere"])
    n = len(is_lib)
    lib_idx = np.flatnonzero(is_lib)
    keep = np.flatnonzero(~is_lib)
    reps = len(cat)
    parent = np.concatenate([keep, np.repeat(lib_idx, reps)])
    out = {name: np.asarray(v)[parent] for name, v in cols.items()}
    if lib_idx.size:
        tile = np.array([c[:6] for c in cat], dtype=np.int64)
        tiled = np.tile(tile, (lib_idx.size, 1))
        sl = slice(keep.size, None)
        for j, name in enumerate(("block_m", "block_n", "block_k", "num_stages", "num_warps",
                                  "split_k")):
            col = np.asarray(out[name]).astype(np.int64, copy=True)
            col[sl] = tiled[:, j]
            out[name] = col
        rast = np.asarray(out["raster"], dtype=object).copy()
        rast[sl] = np.tile(np.array([c[6] for c in cat], dtype=object), lib_idx.size)
        out["raster"] = rast
        grp = np.asarray(out["group_m"]).astype(np.int64, copy=True)
        grp[sl] = 8
        out["group_m"] = grp
    assert parent.shape[0] == keep.size + reps * lib_idx.size and n >= 0
    return out, parent


FAMILY = Family(
    name="gemm",
    columns=COLUMNS,
    workload_columns=("m", "n", "k", "dtype", "a_row_major", "b_row_major", "tf32"),
    lower=lower,
    doc=__doc__ or "",
)
