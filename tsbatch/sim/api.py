"""One candidate configuration (the candidate columns) -> tile graph -> simulation.

Bridges the evaluator's candidate table and the simulator: the columns
``m, n, k, dtype, block_m, block_n, block_k, num_stages, num_warps,
group_m`` (plus optional ``tf32``, ``a_row_major``, ``b_row_major``) name one
Triton-style GEMM; :func:`simulate_config` builds its graph and runs it.
"""

from __future__ import annotations

import math
from dataclasses import replace

from tsbatch.errors import InputError
from tsbatch.hw import HwSpec, get_hw
from tsbatch.sim.builders import PIPELINES, gemm_graph
from tsbatch.sim.engine import SimResult, simulate
from tsbatch.sim.graph import TileGraph
from tsbatch.sim.machine import Machine, machine_from_hw, residency

__all__ = ["CONFIG_COLUMNS", "triton_mma_kind", "config_graph", "simulate_config"]

CONFIG_COLUMNS = ("m", "n", "k", "dtype", "block_m", "block_n", "block_k", "num_stages", "num_warps",
                  "group_m")


def triton_mma_kind(hw: HwSpec, dtype: str, tf32: bool, num_warps: int) -> str:
    """Which MMA a Triton matmul uses: ``warpgroup`` (wgmma), ``warp`` (mma.sync) or ``fma``.

    Notes
    -----
    fp32 without TF32 runs on CUDA cores; Hopper issues wgmma from
    ``wgmma_min_warps`` warps per block (calibration constant of the
    hardware file), else mma.sync at ``mma_sync_fraction`` of the peak.
    """
    if dtype == "float32" and not tf32:
        return "fma"
    if hw.mma in ("wgmma", "tcgen05") and num_warps >= hw.cal("wgmma_min_warps"):
        return "warpgroup"
    return "warp"


def config_graph(cfg: dict, hw: str | HwSpec, *, pipeline: str = "naive2", epilogue: str = "none",
                 use_tma: bool | None = None) -> TileGraph:
    """The tile graph of one candidate row (a mapping with :data:`CONFIG_COLUMNS`)."""
    spec = get_hw(hw)
    missing = [c for c in CONFIG_COLUMNS if c not in cfg or cfg[c] is None]
    if missing:
        raise InputError(f"candidate is missing column(s) {', '.join(missing)}")
    ints = {}
    for c in CONFIG_COLUMNS:
        if c == "dtype":
            continue
        v = cfg[c]
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise InputError(f"column {c} must be a positive integer, got {cfg[c]!r}")
        ints[c] = v
    dtype = str(cfg["dtype"])
    tf32 = bool(cfg.get("tf32", dtype == "float32"))
    if pipeline not in PIPELINES:
        raise InputError(f"pipeline must be one of {', '.join(PIPELINES)}, got {pipeline!r}")
    kind = triton_mma_kind(spec, dtype, tf32, ints["num_warps"]) if pipeline == "naive2" else None
    if pipeline != "naive2" and spec.mma not in ("wgmma", "tcgen05"):
        raise InputError(f"pipeline {pipeline} needs TMA and warpgroup MMA; {spec.key} has {spec.mma}")
    return gemm_graph(
        ints["m"], ints["n"], ints["k"], block_m=ints["block_m"], block_n=ints["block_n"],
        block_k=ints["block_k"], num_stages=ints["num_stages"], num_warps=ints["num_warps"],
        group_m=ints["group_m"], dtype=dtype, tf32=tf32, pipeline=pipeline, epilogue=epilogue,
        use_tma=use_tma, mma_kind=kind, a_row_major=bool(cfg.get("a_row_major", True)),
        b_row_major=bool(cfg.get("b_row_major", True)),
    )


def simulate_config(cfg: dict, hw: str | HwSpec, *, pipeline: str = "naive2", epilogue: str = "none",
                    machine: Machine | None = None, record: bool = False,
                    max_waves: int | None = None) -> tuple[TileGraph, SimResult]:
    """Build and simulate one candidate.

    Parameters
    ----------
    max_waves : int, optional
        Wave sampling for very large grids: when the grid has more than
        ``max_waves`` full waves (``sm_count x resident`` CTAs each), simulate
        the first ``max_waves // 2`` and ``max_waves`` waves and extrapolate
        the per-wave time linearly to the whole grid (the waves of a regular
        GEMM are identical up to L2 state). ``None`` simulates everything.
    """
    g = config_graph(cfg, hw, pipeline=pipeline, epilogue=epilogue)
    m = machine or machine_from_hw(hw)
    slots = m.sm_count * max(residency(m, g.warps_per_cta, g.smem_bytes_per_cta, g.regs_per_thread), 1)
    total_waves = g.n_ctas / slots
    if max_waves is None or record or total_waves <= max_waves:
        return g, simulate(g, m, record=record)
    w2 = max(int(max_waves), 2)
    w1 = w2 // 2
    r1 = simulate(g, m, max_ctas=w1 * slots)
    r2 = simulate(g, m, max_ctas=w2 * slots)
    per_wave = (r2.cycles - r1.cycles) / (w2 - w1)
    cycles = r2.cycles + per_wave * (math.ceil(total_waves) - w2)
    # the last, partial wave is shorter only if it leaves SMs idle; a full-length wave is the
    # conservative choice for a tail that still fills most SMs
    return g, replace(r2, cycles=cycles, latency_us=cycles / m.clock_mhz + m.launch_overhead_us)
