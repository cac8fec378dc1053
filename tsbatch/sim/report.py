"""Timeline summary, critical path, Gantt chart (PNG) and Chrome trace of a recorded run.

All functions take a :class:`~tsbatch.sim.engine.SimResult` produced with
``record=True`` and the graph it ran.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tsbatch.errors import InputError
from tsbatch.sim.engine import BIND_DATA, BIND_LAUNCH, BIND_ORDER, SimResult
from tsbatch.sim.graph import OPS, RESOURCES, TileGraph

__all__ = ["stall_breakdown", "critical_path", "summary_text", "write_gantt_png", "write_chrome_trace"]

_MEM_OPS = {"tma_load", "ldg"}
_SYNC = OPS.index("sync")
_LANES = ("tensor", "cuda", "sfu", "smem", "tma", "lsu")


def _need_record(res: SimResult) -> dict:
    if res.record is None:
        raise InputError("this needs a run with record=True")
    return res.record


def _cause(graph: TileGraph, rec: dict, c: int, v: int) -> str:
    """Why node v of CTA c became ready when it did (following sync nodes back)."""
    for _ in range(8):
        kind = int(rec["bind_kind"][c, v])
        p = int(rec["bind_pred"][c, v])
        if kind == BIND_LAUNCH or p < 0:
            return "cta launch"
        op = OPS[int(graph.op[p])]
        if op == "sync":
            if kind == BIND_ORDER and graph.group[p] != graph.group[v]:
                return "synchronization"
            v = p
            continue
        if op in _MEM_OPS:
            return "memory (tile load)"
        if kind == BIND_ORDER:
            return "order (program/barrier)"
        return f"dependency ({op})"
    return "synchronization"


def stall_breakdown(graph: TileGraph, res: SimResult) -> dict:
    """Tensor-core idle time by cause, plus issue and resource-queue waits.

    Returns
    -------
    dict
        ``tensor_idle_clk``: idle time of each SM's tensor cores between
        consecutive MMAs (and before the first / after the last), attributed
        to what the next MMA waited for; ``issue_wait_clk``: time ready nodes
        waited for sub-partition issue slots; ``queue_wait_clk``: time issued
        nodes waited for their resource, by resource.
    """
    rec = _need_record(res)
    n_sm = rec["sm_count"]
    slot_of = rec["cta_slot"]
    mma = np.flatnonzero(graph.op == OPS.index("mma"))
    idle: dict[str, float] = {}
    if mma.size:
        starts = rec["t_start"][:, mma]
        ends = rec["t_end"][:, mma]
        ctas = np.repeat(np.arange(starts.shape[0]), mma.size)
        nodes = np.tile(mma, starts.shape[0])
        sms = slot_of[ctas] % n_sm
        s = starts.ravel()
        e = ends.ravel()
        for sm in range(n_sm):
            sel = np.flatnonzero(sms == sm)
            if sel.size == 0:
                idle["no work (tail)"] = idle.get("no work (tail)", 0.0) + res.cycles
                continue
            order = sel[np.argsort(s[sel], kind="stable")]
            busy_until = 0.0
            for i in order:
                gap = s[i] - busy_until
                if gap > 1e-9:
                    cause = _cause(graph, rec, int(ctas[i]), int(nodes[i]))
                    idle[cause] = idle.get(cause, 0.0) + gap
                busy_until = max(busy_until, e[i])
            tail = res.cycles - busy_until
            if tail > 1e-9:
                idle["epilogue / tail"] = idle.get("epilogue / tail", 0.0) + tail
    issue_wait = float(np.sum(rec["t_issue"] - rec["t_ready"]))
    q = rec["t_start"] - rec["t_issue"]
    queue: dict[str, float] = {}
    for r, name in enumerate(RESOURCES):
        sel = rec["res"] == r
        if sel.any() and name != "none":
            queue[name] = float(q[:, sel].sum())
    return {"tensor_idle_clk": idle, "issue_wait_clk": issue_wait, "queue_wait_clk": queue}


def critical_path(graph: TileGraph, res: SimResult, max_steps: int = 1_000_000) -> list[tuple]:
    """The chain of nodes that determined the kernel's end, latest first.

    Each entry is ``(cta, node, label, op, t_start, t_end, via)`` where
    ``via`` says how the walk reached the previous entry: ``data``,
    ``order``, ``resource`` (the node waited for the previous occupant of its
    server) or ``launch`` (the CTA waited for its slot).
    """
    rec = _need_record(res)
    n = graph.n_nodes
    t_end = rec["t_end"]
    c, v = np.unravel_index(int(np.argmax(t_end)), t_end.shape)
    c, v = int(c), int(v)
    slot_of = rec["cta_slot"]
    path = []
    via = "end"
    for _ in range(max_steps):
        path.append((c, v, graph.labels[v] if graph.labels else str(v), OPS[int(graph.op[v])],
                     float(rec["t_start"][c, v]), float(t_end[c, v]), via))
        prev = int(rec["res_prev"][c, v])
        if rec["t_start"][c, v] > rec["t_issue"][c, v] + 1e-9 and prev >= 0:
            c, v = divmod(prev, n)
            via = "resource"
            continue
        kind = int(rec["bind_kind"][c, v])
        p = int(rec["bind_pred"][c, v])
        if kind == BIND_LAUNCH or p < 0:
            earlier = np.flatnonzero(slot_of[:c] == slot_of[c])
            if earlier.size == 0:
                break
            c = int(earlier[-1])
            v = int(np.argmax(t_end[c]))
            via = "launch"
            continue
        v = p
        via = "data" if kind == BIND_DATA else "order"
    return path


def _path_summary(path: list[tuple]) -> dict:
    out: dict[str, float] = {}
    for _, _, _, op, s, e, _ in path:
        out[op] = out.get(op, 0.0) + max(e - s, 0.0)
    return out


def summary_text(graph: TileGraph, res: SimResult, *, title: str = "") -> str:
    """Human-readable timeline summary (utilization, stalls by cause, critical path)."""
    lines = []
    if title:
        lines.append(title)
    lines.append(f"graph {graph.name}: {graph.n_nodes} template nodes x {graph.n_ctas} CTAs = "
                 f"{graph.n_logical_nodes} logical nodes, {graph.n_edges} edges per CTA")
    lines.append(f"resident CTAs per SM: {res.resident_ctas}" + ("" if res.fits else " (does NOT fit; simulated with 1)"))
    lines.append(f"time: {res.cycles:,.0f} cycles = {res.latency_us:.2f} us (incl. launch overhead)")
    if res.l15_load_lines:
        lines.append(f"L1.5 hit rate (loads): {res.l15_hit:.3f}")
    lines.append(f"L2 hit rate (loads): {res.l2_hit:.3f}   DRAM read {res.dram_read_bytes / 1e6:.2f} MB, "
                 f"write {res.dram_write_bytes / 1e6:.2f} MB")
    lines.append("utilization:")
    for k, u in res.utilization.items():
        if k == "l15" and not res.l15_load_lines:
            continue
        lines.append(f"  {k:7s} {100 * u:6.1f} %")
    if res.record is not None:
        st = stall_breakdown(graph, res)
        n_sm = res.record["sm_count"]
        lines.append("tensor-core idle time by cause (average per SM):")
        for k, t in sorted(st["tensor_idle_clk"].items(), key=lambda kv: -kv[1]):
            lines.append(f"  {k:28s} {t / n_sm:12,.0f} cycles ({100 * t / n_sm / max(res.cycles, 1e-9):5.1f} %)")
        lines.append(f"issue-slot waits (all nodes): {st['issue_wait_clk']:,.0f} cycles")
        lines.append("resource queueing (all nodes): " + ", ".join(
            f"{k} {v:,.0f}" for k, v in st["queue_wait_clk"].items() if v > 0))
        path = critical_path(graph, res)
        lines.append(f"critical path: {len(path)} nodes; time on path by op:")
        for k, t in sorted(_path_summary(path).items(), key=lambda kv: -kv[1]):
            lines.append(f"  {k:10s} {t:12,.0f} cycles")
        vias: dict[str, int] = {}
        for e in path:
            vias[e[6]] = vias.get(e[6], 0) + 1
        lines.append("  edges on path: " + ", ".join(f"{k} {v}" for k, v in sorted(vias.items())))
        lines.append("  last nodes: " + " <- ".join(f"{e[2]}@cta{e[0]}" for e in path[:6]))
    return "\n".join(lines)


def write_gantt_png(graph: TileGraph, res: SimResult, path: str | Path, *, sm: int = 0) -> Path:
    """Gantt chart of one SM's resource lanes (one colour per CTA slot)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rec = _need_record(res)
    n_sm = rec["sm_count"]
    slot_of = rec["cta_slot"]
    ctas = np.flatnonzero((slot_of >= 0) & (slot_of % n_sm == sm))
    fig, ax = plt.subplots(figsize=(12, 3.5))
    cmap = plt.get_cmap("tab10")
    for li, lane in enumerate(_LANES):
        r = RESOURCES.index(lane)
        nodes = np.flatnonzero(rec["res"] == r)
        for c in ctas:
            s = rec["t_start"][c, nodes]
            e = rec["t_end"][c, nodes]
            bars = [(float(a), float(max(b - a, 1e-3))) for a, b in zip(s, e)]
            if bars:
                ax.broken_barh(bars, (li - 0.4, 0.8), facecolors=cmap(int(slot_of[c]) // n_sm % 10),
                               edgecolor="none", alpha=0.8)
    ax.set_yticks(range(len(_LANES)))
    ax.set_yticklabels(_LANES)
    ax.set_xlabel("cycles")
    ax.set_xlim(0, max(res.cycles, 1.0))
    ax.set_title(f"{graph.name} on SM {sm} (colour = CTA slot; bars = node start..completion)")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def write_chrome_trace(graph: TileGraph, res: SimResult, path: str | Path, *, clock_mhz: float,
                       max_sms: int = 4) -> Path:
    """Chrome trace-event JSON (``chrome://tracing``, Perfetto): one process per SM.

    Threads are ``slot s / warp group g``; each node is a complete event from
    its issue (or resource start) to its completion; only the first
    ``max_sms`` SMs are written to keep the file small.
    """
    rec = _need_record(res)
    n_sm = rec["sm_count"]
    slot_of = rec["cta_slot"]
    events = []
    to_us = 1.0 / clock_mhz
    for c in np.flatnonzero((slot_of >= 0) & (slot_of % n_sm < max_sms)):
        slot = int(slot_of[c])
        sm = slot % n_sm
        for v in range(graph.n_nodes):
            s = float(rec["t_start"][c, v])
            e = float(rec["t_end"][c, v])
            events.append({
                "name": graph.labels[v] if graph.labels else f"n{v}",
                "cat": OPS[int(graph.op[v])],
                "ph": "X", "ts": s * to_us, "dur": max(e - s, 0.0) * to_us,
                "pid": sm, "tid": f"slot{slot // n_sm}.wg{int(graph.group[v])}",
                "args": {"cta": int(c), "ready_clk": float(rec["t_ready"][c, v]),
                         "issue_clk": float(rec["t_issue"][c, v])},
            })
    meta = [{"name": "process_name", "ph": "M", "pid": sm, "args": {"name": f"SM {sm}"}}
            for sm in range(min(n_sm, max_sms))]
    out = Path(path)
    out.write_text(json.dumps({"traceEvents": meta + events, "displayTimeUnit": "ns"}))
    return out
