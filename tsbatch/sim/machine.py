"""The simulated machine: per-SM and chip-wide resources in cycles, from an ``HwSpec``.

The simulator works in SM clock cycles. :func:`machine_from_hw` turns a
hardware spec (measured values preferred, ``HwSpec.rate``) into the per-SM
throughputs of the compute pipelines (tensor core, CUDA core, SFU), the
per-SM engines (TMA, LSU, shared memory) and the chip-wide L2 and DRAM
servers, plus the few latencies that the hardware files do not carry
(:class:`SimParams`, every value with its source).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tsbatch.errors import InputError
from tsbatch.hw import HwSpec, get_hw

__all__ = ["SimParams", "Machine", "machine_from_hw", "residency"]

#: sources of the :class:`SimParams` defaults
PARAM_SOURCES = {
    "tma_bytes_per_clk": "GTSim §5 (TMA microbenchmark): 128 B transactions at ~100 B/cycle per SM",
    "lsu_bytes_per_clk": "L1<->L2 interface of one SM: 64 B/clk (Jia et al., 'Dissecting the Ampere GPU "
    "architecture through microbenchmarking', 2021; same width on Hopper, Luo et al. 2024)",
    "l2_hit_latency_clk": "L2 hit latency ~260 cycles (Luo et al. 2024, H100; Jia et al. 2021 report "
    "~200-270 on A100 depending on partition)",
    "dram_extra_latency_clk": "extra latency of an L2 miss served by HBM: ~300 cycles over an L2 hit "
    "(Luo et al. 2024: ~480-560 cycles global-memory latency on H100)",
    "tc_latency_clk": "tensor-core pipeline drain after the last sub-operation (~32 cycles; wgmma/mma "
    "latency tables of Luo et al. 2024)",
    "alu_latency_clk": "CUDA-core dependent-issue latency (~4-6 cycles), rounded up for a tile op",
    "sfu_latency_clk": "MUFU latency ~20 cycles (Jia et al. 2021)",
    "smem_latency_clk": "shared-memory load latency ~30 cycles (Jia et al. 2021)",
    "issue_clk": "cycles a tile-level node holds its sub-partition issue slots (a handful of "
    "instructions: address setup, barrier arrive/wait); first-principles estimate",
    "cta_launch_clk": "CTA rasterisation + prologue before the first tile op (index math, "
    "descriptor setup); first-principles estimate",
}


@dataclass(frozen=True)
class SimParams:
    """Simulator constants not carried by the hardware files (see ``PARAM_SOURCES``)."""

    tma_bytes_per_clk: float = 100.0
    lsu_bytes_per_clk: float = 64.0
    l2_hit_latency_clk: float = 260.0
    dram_extra_latency_clk: float = 300.0
    tc_latency_clk: float = 32.0
    alu_latency_clk: float = 8.0
    sfu_latency_clk: float = 20.0
    smem_latency_clk: float = 30.0
    issue_clk: float = 4.0
    cta_launch_clk: float = 200.0


@dataclass(frozen=True)
class Machine:
    """Everything the event loop needs, in cycles and bytes.

    Per-SM rates are per clock of one SM; ``l2_bytes_per_clk`` and
    ``dram_bytes_per_clk`` are chip-wide servers shared by all SMs. The
    L1.5 tier (``l15_group_sms > 0``; Hopper) is one cache of ``l15_lines``
    lines per group of ``l15_group_sms`` consecutive SMs, served at
    ``l15_bytes_per_clk`` per SM of the group.
    ``tc_flop_per_clk`` is per SM for the graph's tensor-core dtype; the
    sub-partition share is a quarter of it (``n_subpartitions``).
    """

    name: str
    sm_count: int
    clock_mhz: float
    n_subpartitions: int
    sm_max_warps: int
    sm_max_blocks: int
    sm_registers: int
    register_alloc_unit: int
    sm_smem_bytes: int
    smem_reserved_per_block_bytes: int
    tc_flop_per_clk: dict
    cuda_op_per_clk: float
    sfu_op_per_clk: float
    smem_bytes_per_clk: float
    tma_bytes_per_clk: float
    lsu_bytes_per_clk: float
    l2_bytes_per_clk: float
    dram_bytes_per_clk: float
    l2_lines: int
    l2_assoc: int
    l2_line_bytes: int
    l15_group_sms: int
    l15_lines: int
    l15_assoc: int
    l15_bytes_per_clk: float
    l2_hit_latency_clk: float
    dram_extra_latency_clk: float
    tc_latency_clk: float
    alu_latency_clk: float
    sfu_latency_clk: float
    smem_latency_clk: float
    issue_clk: float
    cta_launch_clk: float
    launch_overhead_us: float
    mma_sync_fraction: float
    has_tma: bool

    def replace(self, **kw) -> "Machine":
        return dataclasses.replace(self, **kw)

    def tc_rate(self, dtype: str, kind: str) -> float:
        """Tensor-core FLOP/clk per SM for a dtype and MMA kind (``fma``: CUDA cores)."""
        if kind == "fma":
            return 2.0 * self.cuda_op_per_clk
        if dtype not in self.tc_flop_per_clk:
            raise InputError(f"machine {self.name}: no tensor-core rate for dtype {dtype!r}")
        rate = self.tc_flop_per_clk[dtype]
        if rate <= 0:
            raise InputError(f"machine {self.name}: tensor cores do not support {dtype!r}")
        if kind == "warp":
            rate *= self.mma_sync_fraction
        return rate


def machine_from_hw(hw: str | HwSpec, params: SimParams | None = None, *, sm_count: int | None = None,
                    l15: bool = False) -> Machine:
    """Build the simulated machine of a GPU.

    Parameters
    ----------
    hw : str or HwSpec
        GPU name (``"h100"``, ``"a100"``) or spec.
    params : SimParams, optional
        Simulator constants; defaults to :class:`SimParams`.
    sm_count : int, optional
        Simulate only this many SMs while keeping per-SM rates and the
        chip-wide L2/DRAM servers (the single-SM configuration of GTSim §7).
    l15 : bool
        Model the hardware file's L1.5 tier (TileSight's per-SM-group cache;
        Hopper and Blackwell files have one). Off by default: read as a
        cache that serves the tile loads of the CTAs of one SM group, it
        lets Triton's large GEMMs run at the tensor-core ceiling, and the
        measured H100 set says they do not (``docs/sim.md``, "Known
        approximations").

    Notes
    -----
    Per-SM rates divide the chip's measured peak by the SM count and the
    sustained clock; ``tc_efficiency``, ``dram_efficiency`` and
    ``l2_capacity_fraction`` (the named calibration constants of
    ``hw/*.toml``) scale the tensor-core rate, DRAM bandwidth and usable L2.
    """
    spec = get_hw(hw)
    p = params or SimParams()
    clk_hz = spec.rate("clock_mhz") * 1e6
    per_sm = 1.0 / (spec.sm_count * clk_hz)
    tc_eff = spec.cal("tc_efficiency")
    tc = {}
    for dt in ("float16", "bfloat16", "tf32", "float8"):
        tc[dt] = spec.tc_tflops(dt) * 1e12 * per_sm * tc_eff
    tc["float32"] = tc["tf32"]
    n = spec.sm_count if sm_count is None else int(sm_count)
    if n <= 0:
        raise InputError(f"sm_count must be positive, got {sm_count}")
    launch_us = spec.launch_us
    line = spec.l2_line_bytes
    g15 = spec.l15_group_sms if (l15 and spec.has_l15) else 0
    return Machine(
        name=spec.key,
        sm_count=n,
        clock_mhz=spec.rate("clock_mhz"),
        n_subpartitions=spec.warp_schedulers,
        sm_max_warps=spec.sm_max_warps,
        sm_max_blocks=spec.sm_max_blocks,
        sm_registers=spec.sm_registers,
        register_alloc_unit=spec.register_alloc_unit,
        sm_smem_bytes=spec.sm_smem_bytes,
        smem_reserved_per_block_bytes=spec.smem_reserved_per_block_bytes,
        tc_flop_per_clk=tc,
        cuda_op_per_clk=spec.rate("fp32_tflops") * 1e12 / 2.0 * per_sm,
        sfu_op_per_clk=spec.sfu_tops * 1e12 / (spec.sm_count * spec.clock_mhz * 1e6),
        smem_bytes_per_clk=spec.smem_bytes_per_clk,
        tma_bytes_per_clk=p.tma_bytes_per_clk,
        lsu_bytes_per_clk=p.lsu_bytes_per_clk,
        l2_bytes_per_clk=spec.rate("l2_bw_tbps") * 1e12 * spec.cal("l2_efficiency") / clk_hz,
        dram_bytes_per_clk=spec.rate("dram_bw_tbps") * 1e12 * spec.cal("dram_efficiency") / clk_hz,
        l2_lines=int(spec.l2_bytes * spec.cal("l2_capacity_fraction")) // line,
        l2_assoc=spec.l2_assoc,
        l2_line_bytes=line,
        l15_group_sms=int(g15),
        l15_lines=int(spec.l15_bytes) // line if g15 else 0,
        l15_assoc=int(spec.l15_assoc) if g15 else 0,
        l15_bytes_per_clk=spec.rate("l15_bw_tbps") * 1e12 * per_sm if g15 else 0.0,
        l2_hit_latency_clk=p.l2_hit_latency_clk,
        dram_extra_latency_clk=p.dram_extra_latency_clk,
        tc_latency_clk=p.tc_latency_clk,
        alu_latency_clk=p.alu_latency_clk,
        sfu_latency_clk=p.sfu_latency_clk,
        smem_latency_clk=p.smem_latency_clk,
        issue_clk=p.issue_clk,
        cta_launch_clk=p.cta_launch_clk,
        launch_overhead_us=float(launch_us),
        mma_sync_fraction=spec.mma_sync_fraction,
        has_tma=spec.mma in ("wgmma", "tcgen05"),
    )


def residency(m: Machine, warps_per_cta: int, smem_bytes_per_cta: int, regs_per_thread: int) -> int:
    """Resident CTAs per SM (0 if one CTA does not fit).

    Notes
    -----
    The minimum of the block, warp, shared-memory and register limits
    (CUDA Occupancy Calculator); registers are allocated per warp in units
    of ``register_alloc_unit``.
    """
    if warps_per_cta <= 0:
        raise InputError(f"warps_per_cta must be positive, got {warps_per_cta}")
    by_blocks = m.sm_max_blocks
    by_warps = m.sm_max_warps // warps_per_cta
    smem = smem_bytes_per_cta + m.smem_reserved_per_block_bytes
    by_smem = m.sm_smem_bytes // smem if smem > 0 else by_blocks
    unit = m.register_alloc_unit
    regs_warp = -(-min(regs_per_thread, 255) * 32 // unit) * unit
    by_regs = m.sm_registers // (regs_warp * warps_per_cta) if regs_warp > 0 else by_blocks
    return int(max(0, min(by_blocks, by_warps, by_smem, by_regs)))
