"""``tsbatch comm``: evaluate, explain and sweep collectives and fused compute–communication.

    tsbatch comm systems
    tsbatch comm evaluate CANDIDATES.parquet -o OUT.parquet [--family collective|ag_gemm|gemm_rs|ulysses]
    tsbatch comm explain --system dgx_h100 --collective all_reduce --num-gpus 8 --bytes 64MiB \\
                         [--gpus-per-node 8 --algorithm ring --protocol simple --channels 16]
    tsbatch comm explain --family gemm_rs --system dgx_h100 --num-gpus 8 --param m=8192 ...
    tsbatch comm sweep sweeps/comm_layouts.toml [-o RANKED.parquet] [--top 10] [-q]
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import math
import tomllib
from pathlib import Path

import polars as pl

from tsbatch.errors import InputError

__all__ = ["add_parser", "run", "parse_bytes", "explain_collective", "explain_fused", "run_sweep", "sweep_frame"]

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "kb": 1000, "m": 1 << 20, "mib": 1 << 20,
          "mb": 10**6, "g": 1 << 30, "gib": 1 << 30, "gb": 10**9}


def parse_bytes(text: str) -> int:
    """``65536``, ``64KiB``, ``1MiB``, ``2g`` -> bytes."""
    t = str(text).strip().lower()
    num = t.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = t[len(num):]
    try:
        v = float(num) * _UNITS[unit]
    except (ValueError, KeyError):
        raise InputError(f"--bytes: cannot read '{text}' as a size (e.g. 65536, 64KiB, 1MiB)") from None
    if v <= 0:
        raise InputError(f"--bytes must be positive, got {text}")
    return int(v)


def _families():
    """The families of several GPUs (those evaluating their frames themselves)."""
    from kernels_catalog.registry import FAMILIES

    return {name: fam for name, fam in FAMILIES.items() if fam.evaluate is not None}


def _evaluate(frame: pl.DataFrame, family: str) -> pl.DataFrame:
    from tsbatch.engine.evaluate import evaluate

    fams = _families()
    if family not in fams:
        raise InputError(f"unknown family '{family}'; known: {', '.join(fams)}")
    return fams[family].evaluate(frame, None, evaluate)


def _fmt_bytes(b: float) -> str:
    for unit, f in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= f:
            return f"{b / f:.3g} {unit}"
    return f"{b:.0f} B"


# ------------------------------------------------------------------ explain
def explain_collective(system: str, collective: str, num_gpus: int, nbytes: int,
                       gpus_per_node: int | None = None, algorithm: str | None = None,
                       protocol: str | None = None, channels: int | None = None) -> str:
    """The stages, per-link bytes, bottleneck and NCCL's choice of one collective, in words."""
    from tsbatch.collectives.model import evaluate, validate
    from tsbatch.collectives.plan import build_plan
    from tsbatch.kernels.alphabeta import stage_times

    row = {"system": [system], "collective": [collective], "num_gpus": [num_gpus], "bytes": [nbytes]}
    if gpus_per_node:
        row["gpus_per_node"] = [gpus_per_node]
    if algorithm:
        row["algorithm"] = [algorithm]
    if protocol:
        row["protocol"] = [protocol]
    if channels:
        row["channels"] = [channels]
    frame = pl.DataFrame(row)
    out = evaluate(frame).row(0, named=True)
    v = validate(frame).row(0, named=True)
    plan = build_plan(v["_system"], collective, num_gpus, int(v["_gpn"]), v["_algorithm"], v["_protocol"],
                      v["_channels"])
    sy = plan.system
    lines = [f"{collective} of {_fmt_bytes(nbytes)} on {num_gpus} GPUs ({v['_gpn']} per node) of "
             f"{sy.key}: {sy.name}", f"  links: {sy.summary()}"]
    if not out["feasible"]:
        lines.append(f"  infeasible: {out['infeasible_reason']}")
        return "\n".join(lines)
    topo = plan.topology
    lines.append(f"  predicted {out['latency_us']:.2f} us  (algorithm bandwidth {out['alg_bw_gbps']:.1f} GB/s, "
                 f"bus bandwidth {out['bus_bw_gbps']:.1f} GB/s)")
    lines.append(f"  NCCL's choice: {out['algorithm_used']} / {out['protocol_used']}; candidates "
                 "(NCCL-model time -> Eq. 11 time):")
    chosen = None
    for var in plan.variants:
        sel = var.sel_lat_us + nbytes * var.sel_inv_bw
        line = var.kernel_lines()[var.line_index(float(nbytes))]
        stages = var.kernel_stages(line.stages)
        t = var.base_us
        for alpha, reps, loads in stages:
            worst = max((f * nbytes / (min(topo.bw[lk] * line.proto_eff, line.cap_gbps) * 1e3)
                         for lk, f in loads.items()), default=0.0)
            t += reps * (alpha + worst)
        mark = "*" if (var.algorithm, var.protocol) == (out["algorithm_used"], out["protocol_used"]) else " "
        if mark == "*":
            chosen = var
        sel_txt = "n/a" if not math.isfinite(sel) else f"{sel:9.2f}"
        lines.append(f"   {mark} {var.algorithm:>18s} / {var.protocol:<6s} {sel_txt} us -> {t:9.2f} us")
    var = chosen
    line = var.kernel_lines()[var.line_index(float(nbytes))]
    burst = var.window_bytes > 0 and nbytes < var.window_bytes
    lines.append(f"  fixed cost {var.base_us:.2f} us (NCCL base latency + harness launch and rank skew); "
                 f"protocol bandwidth factor {line.proto_eff:.3g}"
                 + (f", per-link cap {line.cap_gbps:.0f} GB/s" if math.isfinite(line.cap_gbps) else "")
                 + (f"; {line.channels} of {var.n_chan} NCCL channels at this size"
                    if math.isfinite(var.chan_unit) else "")
                 + ("; within NCCL_BUFFSIZE: network at its burst rate" if burst else ""))
    lines.append(f"  stages ({var.n_stages} in all{', pipelined: loads add, one serialization' if var.pipelined else ''}):")
    import numpy as np

    for s in line.stages:
        links = sorted(s.loads.items(), key=lambda kv: -kv[1] / topo.bw[kv[0]])
        ptr = np.array([0, len(links)], dtype=np.int64)
        st = stage_times(float(nbytes), np.array([s.alpha_us]), np.array([1.0]), ptr,
                         np.array([lk for lk, _ in links], dtype=np.int64),
                         np.array([f for _, f in links]), np.array(topo.bw), line.proto_eff, line.cap_gbps)[0]
        lines.append(f"   - {s.name} x{s.reps}: {len(s.exchanges)} exchanges, alpha {s.alpha_us:.2f} us, "
                     f"{st:.2f} us each")
        for lk, f in links[:4]:
            lines.append(f"       {topo.name(lk):<22s} {_fmt_bytes(f * nbytes):>10s}  "
                         f"({topo.bw[lk]:.1f} GB/s achieved, {topo.cls[lk]})")
        if len(links) > 4:
            lines.append(f"       ... {len(links) - 4} more links")
    lines.append(f"  bottleneck link: {out['bottleneck_link']}")
    return "\n".join(lines)


def explain_fused(family: str, params: dict) -> str:
    """Compute, communication and the overlap achieved of one fused configuration."""
    out = _evaluate(pl.DataFrame({k: [v] for k, v in params.items()}), family).row(0, named=True)
    head = ", ".join(f"{k}={v}" for k, v in params.items())
    lines = [f"{family}: {head}"]
    if not out["feasible"]:
        lines.append(f"  infeasible: {out['infeasible_reason']}")
        return "\n".join(lines)
    c = int(params.get("chunks", 1))
    lines += [
        f"  predicted {out['latency_us']:.2f} us over {c} chunk(s)",
        f"  compute {out['compute_us']:.2f} us ({out['chunk_compute_us']:.2f} per chunk), "
        f"communication {out['comm_us']:.2f} us ({out['chunk_comm_us']:.2f} per chunk: "
        f"{out['comm_collective']} {out['comm_algorithm']}/{out['comm_protocol']}, bottleneck {out['comm_bottleneck_link']})",
        f"  exposed communication {out['exposed_comm_us']:.2f} us; overlap achieved {out['overlap_pct']:.1f} % "
        "of the shorter of compute and communication",
        "  one chunk's collective:",
    ]
    sub = explain_collective(params["system"], out["comm_collective"], int(params["num_gpus"]),
                             int(out["chunk_comm_bytes"]), params.get("gpus_per_node"),
                             params.get("algorithm"), params.get("protocol"))
    lines += ["    " + ln for ln in sub.splitlines()]
    return "\n".join(lines)


# ------------------------------------------------------------------ sweep
def sweep_frame(path: str | Path) -> tuple[str, pl.DataFrame, dict]:
    """A sweep file's family, its rows (fixed values x axes, sizes in bytes) and its
    parsed TOML, unevaluated."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: sweep file not found")
    try:
        doc = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{path}: not valid TOML ({exc})") from None
    family = doc.get("family", "collective")
    fams = _families()
    if family not in fams:
        raise InputError(f"{path}: unknown family '{family}'; known: {', '.join(fams)}")
    fixed = doc.get("fixed", {})
    axes = doc.get("axes", {})
    for k, v in axes.items():
        if not isinstance(v, list) or not v:
            raise InputError(f"{path}: axes.{k} must be a non-empty list")
    names = list(axes)
    combos = list(itertools.product(*(axes[k] for k in names))) if names else [()]
    rows = {k: [v] * len(combos) for k, v in fixed.items()}
    for i, k in enumerate(names):
        rows[k] = [c[i] for c in combos]
    for k, v in list(rows.items()):
        if k == "bytes":
            rows[k] = [parse_bytes(x) if isinstance(x, str) else int(x) for x in v]
    return family, pl.DataFrame(rows), doc


def run_sweep(path: str | Path) -> tuple[pl.DataFrame, dict]:
    """Expand a sweep file (fixed values x axes), evaluate, rank within each workload."""
    path = Path(path)
    family, frame, doc = sweep_frame(path)
    fams = _families()
    out = _evaluate(frame, family)
    by = doc.get("rank", {}).get("by") or [c for c in fams[family].workload_columns if c in out.columns]
    out = out.with_columns(
        pl.col("latency_us").fill_nan(None).rank("ordinal").over(by).alias("rank")
    ).sort([*by, "rank"], nulls_last=True)
    meta = {"tsbatch.family": family,
            "tsbatch.sweep_sha256": hashlib.sha256(path.read_bytes()).hexdigest()[:16],
            "tsbatch.rank_by": json.dumps(by), "tsbatch.axes": json.dumps(list(doc.get("axes", {})))}
    return out, meta


# ------------------------------------------------------------------ CLI
def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``tsbatch comm`` and its subcommands."""
    p = subparsers.add_parser("comm", help="collectives and fused compute-communication across GPUs",
                              description="α–β collectives over real topologies (TileSight §3.6).")
    sub = p.add_subparsers(dest="comm_command", required=True, metavar="SUBCOMMAND")
    s = sub.add_parser("systems", help="list the multi-GPU systems")
    s.set_defaults(func=run)
    e = sub.add_parser("evaluate", help="predict every row of a candidate Parquet file")
    e.add_argument("candidates")
    e.add_argument("-o", "--output", required=True)
    e.add_argument("--family", default="collective", help="collective (default), ag_gemm, gemm_rs, ulysses")
    e.set_defaults(func=run)
    x = sub.add_parser("explain", help="stages, per-link bytes, bottleneck; overlap for fused families")
    x.add_argument("--family", default="collective")
    x.add_argument("--system", required=True)
    x.add_argument("--collective")
    x.add_argument("--num-gpus", type=int, required=True)
    x.add_argument("--gpus-per-node", type=int)
    x.add_argument("--bytes")
    x.add_argument("--algorithm")
    x.add_argument("--protocol")
    x.add_argument("--channels", type=int)
    x.add_argument("--chunks", type=int, default=1)
    x.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                   help="a fused family's column (m=8192, dtype=float16, block_m=128, ...)")
    x.set_defaults(func=run)
    w = sub.add_parser("sweep", help="evaluate a declarative sweep file and rank within each workload")
    w.add_argument("sweep")
    w.add_argument("-o", "--output")
    w.add_argument("--top", type=int, default=5, help="rows shown per workload (default 5)")
    w.add_argument("-q", "--quiet", action="store_true",
                   help="print nothing (with -o: only write the ranked table)")
    w.set_defaults(func=run)
    return p


def _value(text: str):
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    return text


def run(args: argparse.Namespace) -> int:
    cmd = args.comm_command
    if cmd == "systems":
        from tsbatch.collectives.systems import get_system, list_systems

        for key in list_systems():
            s = get_system(key)
            print(f"{key:<24s} {s.gpus_per_node} x {s.gpu:<13s} up to {s.max_nodes:>4d} node(s)  {s.summary()}")
            print(f"{'':<24s} aliases: {', '.join(a for a in s.aliases if a != key) or '-'}")
        return 0
    if cmd == "evaluate":
        path = Path(args.candidates)
        if not path.is_file():
            raise InputError(f"{path}: no such file")
        if Path(args.output).is_dir():
            raise InputError(f"{args.output}: output path is a directory")
        try:
            frame = pl.read_parquet(path)
        except Exception as exc:  # noqa: BLE001
            raise InputError(f"{path}: cannot read as Parquet ({type(exc).__name__})") from None
        out = _evaluate(frame, args.family)
        from tsbatch.boundary.io import write_parquet

        write_parquet(out, args.output, {"tsbatch.family": args.family,
                                         "tsbatch.input_sha256": hashlib.sha256(path.read_bytes()).hexdigest()})
        print(f"wrote {out.height} rows to {args.output}")
        return 0
    if cmd == "explain":
        if args.family == "collective":
            if not args.collective or not args.bytes:
                raise InputError("--collective and --bytes are required for a collective")
            print(explain_collective(args.system, args.collective, args.num_gpus, parse_bytes(args.bytes),
                                     args.gpus_per_node, args.algorithm, args.protocol, args.channels))
            return 0
        params = {"system": args.system, "num_gpus": args.num_gpus, "chunks": args.chunks}
        for opt in ("gpus_per_node", "algorithm", "protocol"):
            if getattr(args, opt):
                params[opt] = getattr(args, opt)
        for kv in args.param:
            if "=" not in kv:
                raise InputError(f"--param '{kv}': expected KEY=VALUE")
            k, v = kv.split("=", 1)
            params[k.strip()] = _value(v.strip())
        print(explain_fused(args.family, params))
        return 0
    if cmd == "sweep":
        out, meta = run_sweep(args.sweep)
        if args.output:
            from tsbatch.boundary.io import write_parquet

            write_parquet(out, args.output, meta)
            if not args.quiet:
                print(f"wrote {out.height} ranked rows to {args.output}")
        if args.quiet:
            return 0
        by = json.loads(meta["tsbatch.rank_by"])
        axes = json.loads(meta["tsbatch.axes"])
        show = out.filter(pl.col("rank") <= args.top)
        extra = [c for c in ("algorithm_used", "protocol_used", "bottleneck_link", "compute_us", "comm_us",
                             "exposed_comm_us", "overlap_pct", "comm_algorithm") if c in out.columns]
        cols = list(dict.fromkeys([*by, *axes, "latency_us", *extra, "rank"]))
        with pl.Config(tbl_rows=400, tbl_cols=len(cols), tbl_width_chars=250, float_precision=2,
                       tbl_hide_column_data_types=True, tbl_hide_dataframe_shape=True):
            print(show.select(cols))
        print(f"{out.height} candidates ranked within ({', '.join(by)}); "
              f"{int((~out['feasible']).sum())} infeasible")
        return 0
    raise InputError(f"unknown comm subcommand {cmd}")
