"""Resident tiles per SM (TileSight §3.4 "Resident tiles and waves").

The number of tile-blocks an SM holds at once is the minimum over the
limits that bind it: shared memory (with the per-block reservation),
registers (allocated per warp in units of ``reg_unit``), warps and
threads, and the architecture's block limit. A block that cannot be
resident at all is infeasible; the reason code says which limit failed.
"""

from __future__ import annotations

import numpy as np

from tsbatch.kernels._config import jit_scalar, jit_serial
from tsbatch.kernels._threads import even_bounds, run_shares

__all__ = [
    "REASON_OK",
    "REASON_SMEM",
    "REASON_THREADS",
    "REASON_REGISTERS",
    "REASON_EMPTY",
    "REASON_TEXT",
    "resident_one",
    "resident_tiles",
]

REASON_OK = 0
REASON_SMEM = 1
REASON_THREADS = 2
REASON_REGISTERS = 3
REASON_EMPTY = 4
REASON_TEXT = {
    REASON_OK: "",
    REASON_SMEM: "shared memory per block exceeds the per-block limit",
    REASON_THREADS: "threads per block exceed the per-block limit",
    REASON_REGISTERS: "registers of one block exceed the SM register file",
    REASON_EMPTY: "empty problem (a size is zero)",
}


@jit_scalar
def resident_one(smem_block, regs_thread, threads, warp_size, sm_smem, smem_block_max,
                 smem_reserved, sm_regs, reg_unit, sm_max_warps, sm_max_threads,
                 sm_max_blocks, max_threads_block):
    """Resident blocks per SM and a reason code (0 when feasible)."""
    if smem_block > smem_block_max:
        return 0, REASON_SMEM
    if threads > max_threads_block or threads <= 0:
        return 0, REASON_THREADS
    warps = (threads + warp_size - 1) // warp_size
    regs_warp = ((regs_thread * warp_size + reg_unit - 1) // reg_unit) * reg_unit
    regs_block = regs_warp * warps
    if regs_block > sm_regs:
        return 0, REASON_REGISTERS
    r = sm_max_blocks
    by_warps = sm_max_warps // warps
    if by_warps < r:
        r = by_warps
    by_threads = sm_max_threads // threads
    if by_threads < r:
        r = by_threads
    if regs_block > 0:
        by_regs = sm_regs // regs_block
        if by_regs < r:
            r = by_regs
    per_block = smem_block + smem_reserved
    if per_block > 0:
        by_smem = sm_smem // per_block
        if by_smem < r:
            r = by_smem
    if r <= 0:
        return 0, REASON_SMEM
    return r, REASON_OK


@jit_serial
def _resident_batch(smem_block, regs_thread, threads, warp_size, sm_smem, smem_block_max,
                    smem_reserved, sm_regs, reg_unit, sm_max_warps, sm_max_threads,
                    sm_max_blocks, max_threads_block, out_r, out_reason, lo, hi):
    for i in range(np.uint64(lo), np.uint64(hi)):  # unsigned: no wraparound check per access
        r, why = resident_one(smem_block[i], regs_thread[i], threads[i], warp_size, sm_smem,
                              smem_block_max, smem_reserved, sm_regs, reg_unit, sm_max_warps,
                              sm_max_threads, sm_max_blocks, max_threads_block)
        out_r[i] = r
        out_reason[i] = why


def resident_tiles(smem_block, regs_thread, threads, hw, warp_size=32):
    """Vectorized resident blocks per SM for a :class:`~tsbatch.hw.HwSpec`.

    Returns ``(resident, reason)`` int64 arrays.
    """
    smem_block = np.ascontiguousarray(smem_block, dtype=np.int64)
    n = smem_block.shape[0]
    out_r = np.empty(n, dtype=np.int64)
    out_reason = np.empty(n, dtype=np.int64)
    args = (smem_block, np.ascontiguousarray(regs_thread, dtype=np.int64),
            np.ascontiguousarray(threads, dtype=np.int64), warp_size,
            hw.sm_smem_bytes, hw.smem_per_block_bytes, hw.smem_reserved_per_block_bytes,
            hw.sm_registers, hw.register_alloc_unit, hw.sm_max_warps, hw.sm_max_threads,
            hw.sm_max_blocks, hw.max_threads_per_block, out_r, out_reason)
    run_shares(_resident_batch, args, even_bounds(n))
    return out_r, out_reason
