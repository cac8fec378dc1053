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
from tsbatch.kernels.rowhash import dedup_rows

__all__ = [
    "REASON_OK",
    "REASON_SMEM",
    "REASON_THREADS",
    "REASON_REGISTERS",
    "REASON_EMPTY",
    "REASON_TEXT",
    "resident_one",
    "resident_tiles",
    "l1_left",
    "spill_l2_bytes",
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


#: rows from which :func:`l1_left` groups a batch by its distinct inputs
L1_LEFT_GROUP_MIN = 1024


def l1_left(smem_block, regs_thread, threads, hw):
    """The resident blocks per SM and the L1 bytes the shared-memory carve-out
    leaves them, per row.

    L1 and shared memory share the SM's SRAM (``hw.l1_smem_bytes``), split by
    the shared-memory carve-out, which the driver sets so that shared memory
    does not limit occupancy where it can (CUDA Volta/Ampere/Hopper tuning
    guides: "the driver automatically configures the shared memory capacity
    for each kernel to avoid shared memory occupancy bottlenecks"): the blocks
    that every other limit allows times their shared memory and reservation,
    at most the SM's shared memory; the rest is L1. Local memory (spilled
    registers) goes through it like any global access.

    Returns ``(resident, l1_bytes)``: resident blocks (at least 1) and the L1
    bytes left (float64). A long batch is solved once per distinct
    ``(smem_block, regs_thread, threads)`` and spread (a tile sweep has few)."""
    smem_block = np.asarray(smem_block, dtype=np.int64)
    if smem_block.shape[0] >= L1_LEFT_GROUP_MIN:
        regs_thread = np.asarray(regs_thread, dtype=np.int64)
        threads = np.asarray(threads, dtype=np.int64)
        inv, rep = dedup_rows(np.column_stack([smem_block, regs_thread, threads]))
        p, left = _l1_left(smem_block[rep], regs_thread[rep], threads[rep], hw)
        return p[inv], left[inv]
    return _l1_left(smem_block, regs_thread, threads, hw)


def _l1_left(smem_block, regs_thread, threads, hw):
    p, _why = resident_tiles(smem_block, regs_thread, threads, hw)
    p = np.maximum(p, 1)
    p_other, _why = resident_tiles(np.zeros(smem_block.shape[0], dtype=np.int64), regs_thread,
                                   threads, hw)
    carve = np.minimum(np.maximum(p_other, p) * (smem_block + hw.smem_reserved_per_block_bytes),
                       hw.sm_smem_bytes)
    return p, (hw.l1_smem_bytes - carve).astype(np.float64)


def spill_l2_bytes(spill_bytes, smem_block, regs_thread, threads, hw):
    """Per row, the local-memory bytes a loop iteration moves between L1 and
    L2: the share of the resident blocks' spilled registers (``spill_bytes`` a
    block, > 0) that the L1 left by the shared-memory carve-out
    (:func:`l1_left`) does not hold, read from L2 and written back once an
    iteration. Their traffic through L1 is the caller's (shared-memory work)."""
    spill_bytes = np.asarray(spill_bytes, dtype=np.float64)
    p, left = l1_left(smem_block, regs_thread, threads, hw)
    share = np.clip(1.0 - np.maximum(left, 0.0) / (spill_bytes * p), 0.0, 1.0)
    return 2.0 * spill_bytes * share
