"""Compile tsbatch's kernels ahead of time, for a wheel to ship.

    TSBATCH_PRECOMPILE=1 python -m tsbatch._precompile [--list]

Runs small instances of what users run first — ``explain``, ``sweep`` of
every built-in sweep, ``prune()``, ``evaluate`` with ranking and cache-model
sampling, the collectives and the simulator — so that every kernel compiles
for the signatures those paths use. With ``TSBATCH_PRECOMPILE=1`` the compiled
code is written to ``_nbcache/`` beside each kernel module
(:mod:`tsbatch.kernels._fastload`); the wheel build (``setup.py``) runs this
in the build tree so that the wheel carries it. Without the variable it only
warms the usual numba cache (``__pycache__`` or ``NUMBA_CACHE_DIR``), which is
also a way to prepare an editable install.

Each step runs on its own; one that fails is reported and skipped (its
kernels then compile on first use, as without precompiling). Exit status 0
unless every step failed.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import os
import sys
import tempfile
import time
from pathlib import Path


def _cli(*argv: str) -> None:
    from tsbatch.front.cli import main

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            rc = main(list(argv))
        except SystemExit as e:  # argparse
            rc = e.code
    if rc not in (0, None):
        raise RuntimeError(f"tsbatch {' '.join(argv)} exited with {rc}")


def _gemm_configs(n: int) -> list[dict]:
    space = itertools.product([16, 32, 64, 128, 256], [16, 32, 64, 128, 256], [32, 64, 128],
                              [2, 3, 4, 5], [2, 4, 8], [1, 8], [1, 2])
    keys = ("block_m", "block_n", "block_k", "num_stages", "num_warps", "group_m", "split_k")
    return [dict(zip(keys, v)) for v in itertools.islice(space, n)]


def _steps(tmp: Path) -> list[tuple[str, object]]:
    import tomllib

    from tsbatch.engine.sweep import list_sweeps, sweep_dir

    out = str(tmp / "o.parquet")
    steps = [
        ("explain gemm", lambda: _cli("explain", "--hw", "h100", "--m", "4096", "--n", "4096",
                                      "--k", "4096", "--block-m", "128", "--block-n", "128",
                                      "--block-k", "64", "--num-stages", "4",
                                      "--num-warps", "8")),
        ("explain attention_fa3", lambda: _cli("explain", "--hw", "h100", "--family",
                                               "attention_fa3", "batch=1", "heads=64",
                                               "seq_len=8192", "head_dim=128",
                                               "dtype=bfloat16")),
        ("prune", _prune),
    ]
    for name in list_sweeps():
        spec = tomllib.loads((sweep_dir() / f"{name}.toml").read_text())
        family = spec.get("family", spec.get("sweep", {}).get("family", "gemm"))
        if family in ("collective", "ag_gemm", "gemm_rs", "ulysses", "moe_ep"):
            steps.append((f"comm sweep {name}",
                          lambda name=name: _cli("comm", "sweep", name, "-o", out, "-q")))
        else:
            hw = "h100"
            steps.append((f"sweep {name}",
                          lambda name=name, hw=hw: _cli("sweep", name, "--hw", hw, "--top", "5%",
                                                        "-o", out, "-q")))
    steps += [
        ("sweep tiny, sampled", lambda: _cli("sweep", "tiny", "--hw", "a100", "--wave-samples",
                                             "4", "-o", out, "-q")),
        ("evaluate --rank", lambda: _evaluate_rank(tmp)),
        ("large-batch kernels", _large_batch),
        ("comm explain", lambda: _cli("comm", "explain", "--system", "dgx_h100", "--collective",
                                      "all_reduce", "--num-gpus", "8", "--bytes", "16777216")),
        ("simulate", lambda: _cli("simulate", "--hw", "h100", "--m", "1024", "--n", "1024",
                                  "--k", "1024", "--block-m", "128", "--block-n", "128",
                                  "--block-k", "64", "--num-stages", "4", "--num-warps", "8",
                                  "--pipeline", "ws_pingpong", "--out-dir", str(tmp / "sim"))),
    ]
    return steps


def _prune() -> None:
    from tsbatch.engine.prune import prune

    prune({"m": 4096, "n": 4096, "k": 4096, "dtype": "float16"}, _gemm_configs(1000),
          hw="h100", top=0.05)


def _large_batch() -> None:
    """The kernels only batches of ``KERNEL_MIN_ROWS`` rows or more run (their
    wrappers make every argument the type evaluate passes)."""
    import numpy as np

    from tsbatch.kernels import traffic
    from tsbatch.kernels.envelope import N_RES

    n, T = traffic.KERNEL_MIN_ROWS, 3
    z = np.zeros((n, T))
    traffic.split_traffic(z, np.ones((n, T), dtype=np.int64), z, z, z,
                          np.arange(n, dtype=np.int64), True, np.zeros((n, N_RES)),
                          np.zeros((n, N_RES)), np.ones(n, dtype=np.int64),
                          np.ones(n, dtype=np.int64))
    traffic.bottleneck_codes(np.zeros((n, N_RES)), np.ones(n), np.zeros(n), 0.6)


def _evaluate_rank(tmp: Path) -> None:
    import polars as pl

    src = tmp / "c.parquet"
    rows = [dict(c, m=m, n=2048, k=1024, dtype=dt) for c in _gemm_configs(200)
            for m, dt in ((1024, "float16"), (333, "bfloat16"))]
    pl.DataFrame(rows).write_parquet(src)
    _cli("evaluate", str(src), "--hw", "h100", "--top", "5%", "-o", str(tmp / "t.parquet"), "-q")
    _cli("evaluate", str(src), "--hw", "h100", "--rank", "-o", str(tmp / "r.parquet"), "-q")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--list", action="store_true", help="list the steps and exit")
    args = ap.parse_args(argv)
    os.environ.setdefault("TQDM_DISABLE", "1")
    with tempfile.TemporaryDirectory(prefix="tsbatch-precompile-") as d:
        steps = _steps(Path(d))
        if args.list:
            print("\n".join(name for name, _ in steps))
            return 0
        failed = 0
        t_all = time.perf_counter()
        for name, step in steps:
            t = time.perf_counter()
            try:
                step()
            except Exception as e:  # noqa: BLE001 - report and go on: a miss only costs compile time
                failed += 1
                print(f"tsbatch precompile: {name}: skipped ({type(e).__name__}: {e})",
                      file=sys.stderr)
                continue
            print(f"tsbatch precompile: {name}: {time.perf_counter() - t:.1f} s", file=sys.stderr)
        print(f"tsbatch precompile: {len(steps) - failed} of {len(steps)} steps in "
              f"{time.perf_counter() - t_all:.0f} s", file=sys.stderr)
    return 1 if failed == len(steps) else 0


if __name__ == "__main__":
    sys.exit(main())
