"""One configuration explained in words a kernel author can act on.

The report follows TileSight's Figure 3f: latency and its envelope phases,
occupancy and pipeline depth, per-resource utilization, cache hit rates,
the bottleneck, and what to try next.
"""

from __future__ import annotations

from tsbatch.hw import HwSpec
from tsbatch.kernels.envelope import R_NAMES

#: what is known of spilling configurations; said by ``explain`` and ``sweep``
SPILL_CAVEAT = ("the model prices spilled accumulator registers (loaded and stored through L1 at "
                "every MMA step) but counts fewer of them than Triton 3.6 spills (41 against "
                "128-242 at 256 accumulator registers a thread), so on an H200 such tiles ran "
                "1.9-7x slower than predicted (python bench/spills.py)")

__all__ = ["explain_text"]

_ADVICE = {
    "tensor_core": "tensor cores are the limit: the schedule is near peak; only a faster MMA "
                   "path (warpgroup MMA needs num_warps a multiple of 4 and block_m a multiple "
                   "of 64 per warpgroup) or fewer wasted tile FLOPs on ragged edges helps",
    "cuda_core": "CUDA cores are the limit (FP32 FMA pipe): for a GEMM, enable TF32 or use a "
                 "16-bit dtype; in a fused kernel, fewer elementwise operations per score or "
                 "element (a larger head_dim gives the tensor cores more work per softmax)",
    "alu": "the integer/logic (ALU) pipe is the limit: compares, selects, min/max, index "
           "arithmetic and conversions; a simpler score_mod or mask, or fewer partially "
           "masked blocks",
    "sfu": "the special-function units (exp2, tanh) are the limit: one exp2 per score is "
           "the floor of an attention softmax; a larger head_dim amortises it",
    "smem": "shared-memory bandwidth is the limit: each warp re-reads its A and B fragments; "
            "larger per-warp tiles (fewer warps per block or a larger block) cut the re-reads",
    "l15": "the L1.5 tier is the limit: larger tiles raise arithmetic intensity",
    "l2": "L2 bandwidth is the limit: larger tiles raise reuse per byte; a grouped launch "
          "order keeps more of A and B in L1.5/L2",
    "dram": "DRAM bandwidth is the limit: raise L2 reuse (grouped or Z-order launch, larger "
            "group_m) or larger tiles",
    "latency": "no resource is saturated: the loop is latency-bound (pipeline too shallow "
               "for the load latency, or too few tiles to fill the GPU); add stages, more "
               "resident blocks, split-K for few tiles, or smaller tiles for more of them",
    "launch": "the kernel is so small that launch overhead dominates; fuse it or batch it",
}


def _pct(x) -> str:
    return "n/a" if x is None else f"{100.0 * float(x):5.1f} %"


def _header(row: dict, family) -> str:
    if family is None or family.name == "gemm":
        return (f"GEMM {row['m']}x{row['n']}x{row['k']} {row['dtype']}  tile "
                f"{row['block_m']}x{row['block_n']}x{row['block_k']}  stages {row['num_stages']}  "
                f"warps {row['num_warps']}  order {row.get('raster', 'grouped')}"
                f"(group_m {row.get('group_m', 8)})  split_k {row.get('split_k', 1)}")
    wl = [c for c in family.workload_columns]
    sched = [c.name for c in family.columns if c.name not in wl]
    fmt = lambda names: "  ".join(f"{c} {row[c]}" for c in names if c in row)  # noqa: E731
    return f"{family.name}: {fmt(wl)}\n  schedule: {fmt(sched)}"


def _order_lines(row: dict, family) -> list[str]:
    prog = getattr(family, "program", None) if family is not None else None
    if prog is None:
        return []
    n = prog.orders().shape[0]
    out = [f"Steady state: best of {n} legal issue order(s) of the loop body "
           f"({len(prog.body)} actions):",
           f"  {row['steady_order']}",
           f"  chain of one iteration (one issue stream, full rates) {row['t_chain_us'] * 1e3:.1f} ns"
           f" against {row['t_steady_iter_us'] * 1e3:.1f} ns per step with the SM's streams "
           f"interleaved"]
    crit = "the order's chain (dependent actions in series)" if (
        row["t_chain_us"] > 0 and row["t_steady_iter_us"] > 0
        and row["t_chain_us"] / max(row["resident_tiles"], 1) >= 0.999 * row["t_steady_iter_us"]
    ) else f"{row['bottleneck']} (resource sums)"
    out.append(f"  critical: {crit}")
    return out


def explain_text(row: dict, hw: HwSpec, family=None) -> str:
    """The report of one evaluated row (``family``: its :class:`Family`; GEMM when None)."""
    lines = []
    cfg = _header(row, family)
    lines.append(f"{cfg}\non {hw.name} ({hw.sm_count} SMs)")
    lines.append("")
    if not row["feasible"]:
        lines.append(f"INFEASIBLE: {row['infeasible_reason']}")
        return "\n".join(lines)
    lat = row["latency_us"]
    tf = row["achieved_tflops"]
    lines.append(f"Predicted latency      {lat:10.2f} us   ({0.0 if tf is None else tf:.1f} TFLOPS useful)")
    lines.append(f"  prologue (fill)      {row['t_prologue_us']:10.2f} us")
    lines.append(f"  steady state         {row['t_steady_us']:10.2f} us   "
                 f"({row['t_steady_iter_us'] * 1e3:.1f} ns per reduction step per SM)")
    lines.append(f"  epilogue (drain)     {row['t_epilogue_us']:10.2f} us")
    lines.append(f"  launch               {row['t_launch_us']:10.2f} us")
    lines.append("")
    tail = f", tail wave of {row['tail_tiles']} tiles" if row["tail_tiles"] else ""
    lines.append(f"Occupancy: {row['resident_tiles']} resident tile-blocks per SM, "
                 f"pipeline depth (loads in flight) d = resident x (stages - 1) = {row['pipeline_depth']}; "
                 f"{row['waves']} wave(s){tail}.")
    lines.extend(_order_lines(row, family))
    lines.append(f"MMA path: {row['mma_path']}"
                 + (f"; about {row['register_spill']} registers/thread spill" if row["register_spill"] else ""))
    if row["register_spill"]:
        lines.append(f"  Warning: {SPILL_CAVEAT}; prefer a configuration that does not spill.")
    lines.append("")
    lines.append("Cache: " + (f"L1.5 hit {_pct(row['l15_hit'])}, " if hw.has_l15 else "")
                 + f"L2 hit {_pct(row['l2_hit'])}; DRAM traffic {row['dram_bytes'] / 1e6:.1f} MB, "
                 f"L2 traffic {row['l2_bytes'] / 1e6:.1f} MB")
    lines.append("")
    lines.append("Resource utilization over the kernel:")
    for r in R_NAMES:
        u = row.get(f"util_{r}")
        if u is None or (r == "l15" and not hw.has_l15) or r == "net":
            continue
        bar = "#" * int(round(20 * min(max(u, 0.0), 1.0)))
        lines.append(f"  {r:12s} {_pct(u)}  {bar}")
    lines.append("")
    b = row["bottleneck"]
    lines.append(f"Bottleneck: {b}")
    lines.append(f"  -> {_ADVICE.get(b, '')}")
    return "\n".join(lines)
