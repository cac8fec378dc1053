"""Warm FlexAttention ``evaluate`` calls after prune's workloads, in one process, per setting.

    python bench/attention_after_prune.py [--rounds 6] [--calls 9] [--no-prune]
                                          [--setting LABEL=VAR=VALUE[,VAR=VALUE]] ...

The sequence of ``bench/regress_worker.py``'s ``time-api`` (prune's four
workloads, 21 calls each, then the attention rows through ``evaluate``), each
setting a new process with its environment variables (default: this tree as
is, ``TSBATCH_KEEP_HEAP=0``, ``TSBATCH_NUMBA_FASTLOAD=0``, both), the settings
alternated, the order flipping every round. Per setting, medians over the
rounds of each process's per-call medians: wall and process CPU seconds, and
the minor page faults of a call (``getrusage``), the sign of glibc giving the
heap's top back between calls (docs/gemm_accuracy.md, "Attention after prune,
session 5").
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent


def child(prune_first: bool, calls: int, rows_path: str) -> dict:
    import resource

    import polars as pl

    from tsbatch.engine.evaluate import evaluate

    if prune_first:
        sys.path.insert(0, str(BENCH))
        from prune_latency import WORKLOADS, configs

        from tsbatch.engine.prune import prune

        cfgs = configs(1000)
        for wl in WORKLOADS:
            for _ in range(21):
                prune(wl, cfgs, hw="h100", top=0.05)
    frame = pl.read_parquet(rows_path)
    evaluate(frame, "a100", family="attention")  # warm-up
    walls, cpus, faults = [], [], []
    for _ in range(calls):
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t0, c0 = time.perf_counter(), time.process_time()
        evaluate(frame, "a100", family="attention")
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
    med = statistics.median
    return {"wall_s": med(walls), "cpu_s": med(cpus), "minflt": med(faults), "rows": frame.height}


def attention_rows(path: Path) -> None:
    import polars as pl

    from tsbatch.measured.accuracy import ATTENTION, load_measured

    root = Path(os.environ.get("TSBATCH_SHARED_DATA", ROOT.parent / "shared" / "data"))
    d = load_measured(sorted((root / "attention").glob("*.parquet")), families=("attention",))
    pl.concat(d.frames["attention"]).select(ATTENTION.input_cols).write_parquet(path)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--child"]:
        print(json.dumps(child(argv[1] == "1", int(argv[2]), argv[3])))
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--calls", type=int, default=9)
    ap.add_argument("--no-prune", action="store_true", help="attention alone in each process")
    ap.add_argument("--setting", action="append", default=None,
                    help="LABEL=VAR=VALUE[,VAR=VALUE] (repeatable; LABEL= alone: no variable)")
    args = ap.parse_args(argv)
    settings = {}
    for s in args.setting or ["as-is=", "keep-heap-off=TSBATCH_KEEP_HEAP=0",
                              "fastload-off=TSBATCH_NUMBA_FASTLOAD=0",
                              "both-off=TSBATCH_KEEP_HEAP=0,TSBATCH_NUMBA_FASTLOAD=0"]:
        label, _, rest = s.partition("=")
        settings[label] = dict(kv.split("=", 1) for kv in rest.split(",") if kv)
    rows = Path(os.environ.get("TMPDIR", "/tmp")) / "tsbatch_attention_rows.parquet"
    if not rows.exists():
        attention_rows(rows)
    res: dict[str, list[dict]] = {k: [] for k in settings}
    labels = list(settings)
    for i in range(args.rounds):
        for label in (labels if i % 2 == 0 else labels[::-1]):
            env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_WAIT_POLICY="passive", **settings[label])
            env.pop("NUMBA_CACHE_DIR", None)
            out = subprocess.run([sys.executable, __file__, "--child", "0" if args.no_prune else "1",
                                  str(args.calls), str(rows)], cwd=ROOT, env=env, capture_output=True,
                                 text=True)
            if out.returncode:
                print(out.stderr[-2000:], file=sys.stderr)
                return 1
            res[label].append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(f"round {i + 1}/{args.rounds}", file=sys.stderr)
    med = statistics.median
    print(f"{'setting':16s} {'wall ms':>8s} {'CPU ms':>8s} {'rows/s (CPU)':>13s} {'faults/call':>12s}")
    for label, rs in res.items():
        cpu = med(r["cpu_s"] for r in rs)
        print(f"{label:16s} {med(r['wall_s'] for r in rs) * 1e3:8.1f} {cpu * 1e3:8.1f} "
              f"{rs[0]['rows'] / cpu:13,.0f} {med(r['minflt'] for r in rs):12,.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
