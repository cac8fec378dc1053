"""``tsbatch simulate``: simulate one configuration and explain its timeline.

Wire-up (in ``tsbatch/front/cli.py``)::

    from tsbatch.sim import cli as sim_cli
    sim_cli.add_parser(subparsers)          # registers "simulate"
    ...
    if args.command == "simulate":
        return sim_cli.run(args)

``run`` prints the summary (per-resource utilization, tensor-core stalls by
cause, critical path) and writes ``<out-dir>/<name>.gantt.png`` and
``<out-dir>/<name>.trace.json`` (Chrome trace events).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tsbatch.errors import InputError
from tsbatch.hw import get_hw
from tsbatch.sim.api import CONFIG_COLUMNS, config_graph
from tsbatch.sim.builders import PIPELINES
from tsbatch.sim.engine import simulate
from tsbatch.sim.machine import machine_from_hw
from tsbatch.sim.report import summary_text, write_chrome_trace, write_gantt_png

__all__ = ["add_parser", "run", "main"]

_INT_OPTS = ("m", "n", "k", "block_m", "block_n", "block_k", "num_stages", "num_warps", "group_m")
_DEFAULTS = {"block_m": 128, "block_n": 128, "block_k": 64, "num_stages": 3, "num_warps": 4,
             "group_m": 8, "dtype": "float16"}


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register the ``simulate`` subcommand on an ``argparse`` subparsers object."""
    p = subparsers.add_parser(
        "simulate",
        help="simulate one configuration with the tile-graph simulator and explain its timeline",
        description="Event-driven tile-graph simulation (GTSim) of one GEMM configuration.",
    )
    p.add_argument("--hw", required=True, help="GPU name (a100, h100, ...)")
    for name in _INT_OPTS:
        p.add_argument("--" + name.replace("_", "-"), dest=name, type=int, default=None,
                       help=f"{name} (default {_DEFAULTS.get(name, 'from --candidates')})")
    p.add_argument("--dtype", default=None, help="float16, bfloat16, float32 (default float16)")
    p.add_argument("--tf32", action="store_true", help="float32 inputs on tensor cores (TF32)")
    p.add_argument("--pipeline", default="naive2", choices=PIPELINES,
                   help="pipeline organization (naive2 = non-specialized software pipeline, as Triton)")
    p.add_argument("--epilogue", default="none", choices=("none", "silu"))
    p.add_argument("--l15", action="store_true",
                   help="model the hardware file's L1.5 tier (off by default, see docs/sim.md)")
    p.add_argument("--candidates", default=None, help="Parquet/CSV candidate file to take one row from")
    p.add_argument("--row", type=int, default=0, help="row index in --candidates (default 0)")
    p.add_argument("--out-dir", default=".", help="where to write the Gantt PNG and Chrome trace")
    p.set_defaults(func=run)
    return p


def _config_from_args(args) -> dict:
    cfg: dict = {}
    if getattr(args, "candidates", None):
        import polars as pl

        path = Path(args.candidates)
        if not path.exists():
            raise InputError(f"candidate file {path} does not exist")
        try:
            df = pl.read_parquet(path) if path.suffix in (".parquet", ".pq") else pl.read_csv(path)
        except Exception as exc:  # polars raises several types for unreadable files
            raise InputError(f"{path}: cannot read candidates ({exc})") from exc
        if not 0 <= args.row < df.height:
            raise InputError(f"--row {args.row} is out of range for {path} ({df.height} rows)")
        row = df.row(args.row, named=True)
        missing = [c for c in CONFIG_COLUMNS if c not in row]
        if missing:
            raise InputError(f"{path}: missing column(s) {', '.join(missing)}")
        cfg = {c: row[c] for c in CONFIG_COLUMNS}
        for c in ("tf32", "a_row_major", "b_row_major"):
            if c in row and row[c] is not None:
                cfg[c] = bool(row[c])
    for name in _INT_OPTS:
        v = getattr(args, name, None)
        if v is not None:
            if v <= 0:
                raise InputError(f"--{name.replace('_', '-')} must be positive, got {v}")
            cfg[name] = v
    if getattr(args, "dtype", None):
        cfg["dtype"] = args.dtype
    if getattr(args, "tf32", False):
        cfg["tf32"] = True
    for name, d in _DEFAULTS.items():
        cfg.setdefault(name, d)
    for name in ("m", "n", "k"):
        if name not in cfg:
            raise InputError(f"--{name} is required (or give --candidates)")
    if cfg["dtype"] not in ("float16", "bfloat16", "float32", "float8"):
        raise InputError(f"--dtype must be float16, bfloat16, float32 or float8, got {cfg['dtype']!r}")
    return cfg


def run(args) -> int:
    """Simulate, print the summary, write the Gantt PNG and the Chrome trace; returns 0."""
    try:
        spec = get_hw(args.hw)
    except KeyError as exc:
        raise InputError(str(exc)) from exc
    cfg = _config_from_args(args)
    pipeline = getattr(args, "pipeline", "naive2")
    g = config_graph(cfg, spec, pipeline=pipeline, epilogue=getattr(args, "epilogue", "none"))
    machine = machine_from_hw(spec, l15=bool(getattr(args, "l15", False)))
    res = simulate(g, machine, record=True)
    title = (f"tsbatch simulate: {spec.name}, {cfg['m']}x{cfg['n']}x{cfg['k']} {cfg['dtype']}, tile "
             f"{cfg['block_m']}x{cfg['block_n']}x{cfg['block_k']}, stages {cfg['num_stages']}, "
             f"warps {cfg['num_warps']}, group_m {cfg['group_m']}, pipeline {pipeline}")
    print(summary_text(g, res, title=title))
    out = Path(getattr(args, "out_dir", ".") or ".")
    out.mkdir(parents=True, exist_ok=True)
    stem = (f"sim_{spec.key}_{cfg['m']}x{cfg['n']}x{cfg['k']}_{cfg['block_m']}x{cfg['block_n']}x"
            f"{cfg['block_k']}_s{cfg['num_stages']}w{cfg['num_warps']}_{pipeline}")
    png = write_gantt_png(g, res, out / f"{stem}.gantt.png")
    trace = write_chrome_trace(g, res, out / f"{stem}.trace.json", clock_mhz=machine.clock_mhz)
    print(f"wrote {png}")
    print(f"wrote {trace}")
    return 0


def main(argv=None) -> int:
    """Stand-alone entry (``python -m tsbatch.sim.cli simulate ...``) until the lead wires it in."""
    import sys

    parser = argparse.ArgumentParser(prog="tsbatch")
    sub = parser.add_subparsers(dest="command", required=True)
    add_parser(sub)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
