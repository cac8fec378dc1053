"""One candidate configuration (the candidate columns) -> tile graph -> simulation.

Bridges the evaluator's candidate table and the simulator: the columns
``m, n, k, dtype, block_m, block_n, block_k, num_stages, num_warps,
group_m`` (plus optional ``tf32``, ``a_row_major``, ``b_row_major``) name one
Triton-style GEMM; :func:`simulate_config` builds its graph and runs it.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from tsbatch.errors import InputError
from tsbatch.hw import HwSpec, get_hw
from tsbatch.sim.builders import PIPELINES, gemm_graph
from tsbatch.sim.engine import SimResult, simulate
from tsbatch.sim.graph import TileGraph
from tsbatch.sim.machine import Machine, machine_from_hw, residency

__all__ = ["CONFIG_COLUMNS", "triton_mma_kind", "config_graph", "simulate_config"]

CONFIG_COLUMNS = ("m", "n", "k", "dtype", "block_m", "block_n", "block_k", "num_stages", "num_warps",
                  "group_m")


def triton_mma_kind(hw: HwSpec, dtype: str, tf32: bool, num_warps: int, block_m: int | None = None) -> str:
    """Which MMA a Triton matmul uses: ``warpgroup`` (wgmma), ``warp`` (mma.sync) or ``fma``.

    Notes
    -----
    fp32 without TF32 runs on CUDA cores. On Hopper, Triton's
    ``AccelerateMatmul`` picks MMAv3 (wgmma) only for whole warpgroups
    (``num_warps`` a multiple of 4, at least ``wgmma_min_warps``, the
    calibration constant of the hardware file) and a tile of a multiple of
    64 rows (one wgmma is 64 rows); the warpgroups then go along M while
    ``block_m > 64 x warpgroups-along-M``, else along N
    (``warpsPerTileV3``), so 8 warps on a 64-row tile still use wgmma, as two
    warpgroups side by side. Otherwise it falls back to mma.sync, which
    Hopper runs at ``mma_sync_fraction`` of the peak. ``block_m=None``
    skips the row condition.
    """
    if dtype == "float32" and not tf32:
        return "fma"
    if (hw.mma in ("wgmma", "tcgen05") and num_warps >= hw.cal("wgmma_min_warps") and num_warps % 4 == 0
            and (block_m is None or block_m % 64 == 0)):
        return "warpgroup"
    return "warp"


def config_graph(cfg: dict, hw: str | HwSpec, *, pipeline: str = "naive2", epilogue: str = "none",
                 use_tma: bool | None = None, k_iters: int | None = None) -> TileGraph:
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
    kind = triton_mma_kind(spec, dtype, tf32, ints["num_warps"], ints["block_m"]) if pipeline == "naive2" else None
    if pipeline != "naive2" and spec.mma not in ("wgmma", "tcgen05"):
        raise InputError(f"pipeline {pipeline} needs TMA and warpgroup MMA; {spec.key} has {spec.mma}")
    return gemm_graph(
        ints["m"], ints["n"], ints["k"], block_m=ints["block_m"], block_n=ints["block_n"],
        block_k=ints["block_k"], num_stages=ints["num_stages"], num_warps=ints["num_warps"],
        group_m=ints["group_m"], dtype=dtype, tf32=tf32, pipeline=pipeline, epilogue=epilogue,
        use_tma=use_tma, mma_kind=kind, a_row_major=bool(cfg.get("a_row_major", True)),
        b_row_major=bool(cfg.get("b_row_major", True)), k_iters=k_iters,
    )


def simulate_config(cfg: dict, hw: str | HwSpec, *, pipeline: str = "naive2", epilogue: str = "none",
                    machine: Machine | None = None, record: bool = False,
                    max_waves: int | None = None, k_sample: int | None = None) -> tuple[TileGraph, SimResult]:
    """Build and simulate one candidate, optionally by sampling.

    Parameters
    ----------
    max_waves : int, optional
        Wave sampling for large grids: when the grid has more than
        ``max_waves`` full waves (``sm_count x resident`` CTAs each),
        simulate only its first ``max_waves`` full waves followed by as many
        CTAs as the grid's last, partial wave has (so that the drain of the
        partial wave is simulated, not assumed), read the per-wave time
        off the CTA retirement times of the last two sampled full waves
        (the first waves start in lock step and with a cold L2, a transient
        that later waves lose), and add that time for each full wave left
        out (the waves of a regular GEMM are identical up to L2 state).
        ``None`` simulates every CTA.
    k_sample : int, optional
        K sampling for long reduction loops: simulate the kernel with only
        ``K1`` and ``2 K1`` loop iterations (tensors and addresses of the
        full problem, each run wave-sampled as above) and extrapolate the
        time linearly in the iteration count (the loop body of a
        software-pipelined GEMM reaches its steady state within a few
        iterations). ``K1`` is at least ``k_sample`` and large enough that
        one wave's loads over ``K1`` iterations cover 1.25 times the L2, so
        that, as in the full kernel, a wave finds nothing of the previous
        wave's first iterations in the L2. Used only when the loop has at
        least ``4 K1`` iterations. ``None``: no K sampling.

    Returns
    -------
    (TileGraph, SimResult)
        The graph of the full problem, and its result; when sampled, the
        result's ``cycles``/``latency_us`` are the extrapolated figures and
        the other fields are those of the largest sampled run.
    """
    g = config_graph(cfg, hw, pipeline=pipeline, epilogue=epilogue)
    m = machine or machine_from_hw(hw)
    if record:
        return g, simulate(g, m, record=True)
    iters = -(-int(cfg["k"]) // int(cfg["block_k"]))
    k1 = _k_sample_iters(g, m, cfg, k_sample) if k_sample else 0
    if k1 <= 0 or iters < 4 * k1:
        cycles, res = _simulate_waves(g, m, max_waves)
    else:
        k2 = 2 * k1
        c1, _ = _simulate_waves(config_graph(cfg, hw, pipeline=pipeline, epilogue=epilogue, k_iters=k1),
                                m, max_waves)
        c2, res = _simulate_waves(config_graph(cfg, hw, pipeline=pipeline, epilogue=epilogue, k_iters=k2),
                                  m, max_waves)
        cycles = c2 + (c2 - c1) / (k2 - k1) * (iters - k2)
    if cycles == res.cycles:
        return g, res
    return g, replace(res, cycles=cycles, latency_us=cycles / m.clock_mhz + m.launch_overhead_us)


def _slots(g: TileGraph, m: Machine) -> int:
    return m.sm_count * max(residency(m, g.warps_per_cta, g.smem_bytes_per_cta, g.regs_per_thread), 1)


def _simulate_waves(g: TileGraph, m: Machine, max_waves: int | None) -> tuple[float, SimResult]:
    """Cycles of the whole grid, wave-sampled when it has more than ``max_waves`` full waves."""
    slots = _slots(g, m)
    full = g.n_ctas // slots
    if max_waves is None or full <= max_waves:
        r = simulate(g, m)
        return r.cycles, r
    w2 = max(int(max_waves), 2)
    w1 = max(w2 - 2, 1)
    tail = g.n_ctas - full * slots
    r = simulate(g, m, max_ctas=w2 * slots + tail)
    ends = np.sort(r.cta_end)
    per_wave = (ends[w2 * slots - 1] - ends[w1 * slots - 1]) / (w2 - w1)
    return r.cycles + per_wave * (full - w2), r


def _k_sample_iters(g: TileGraph, m: Machine, cfg: dict, k_min: int) -> int:
    """``K1`` of K sampling (see :func:`simulate_config`)."""
    slots = _slots(g, m)
    wave_m = np.unique(g.cta_m[:slots]).size
    wave_n = np.unique(g.cta_n[:slots]).size
    eb = g.tensors[0].elem_bytes
    bk = int(cfg["block_k"])
    per_iter = (wave_m * int(cfg["block_m"]) + wave_n * int(cfg["block_n"])) * bk * eb
    l2_bytes = m.l2_lines * m.l2_line_bytes
    return max(int(k_min), math.ceil(1.25 * l2_bytes / max(per_iter, 1)))
