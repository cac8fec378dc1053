"""Page faults of warm ``evaluate`` calls against glibc's trim threshold (tsbatch.kernels._heap).

    python bench/heap_faults.py [--hw h100] [--families gemm,attention,moe_ep,rowwise]
                                [--rows 100000] [--calls 6] [--trim-mib 64,256] [--json OUT.json]

A warm call of ``evaluate`` on a table of ~100k rows frees its temporaries
(tens of MiB) at the end; glibc gives the free top of its heap back to the
system once it exceeds the trim threshold, and the next call faults the same
memory in again, page by page. This prints, per family and threshold, what a
warm call costs: the median over ``--calls`` calls of its minor page faults,
its system and its wall seconds.

Each threshold runs in a process of its own with glibc's thresholds given in
the environment (``MALLOC_MMAP_THRESHOLD_`` at tsbatch's 32 MiB,
``MALLOC_TRIM_THRESHOLD_`` at the threshold), which tsbatch then leaves alone
(:func:`tsbatch.kernels._heap.keep_freed_heap`), so the processes differ in
the trim threshold only; ``shipped`` is a process without them, where tsbatch
sets its own (``TRIM_THRESHOLD``). The tables are ``bench/family_speed.py``'s
(the fused families on the GPU's own system). The processes run one after the
other: compare the faults, which the machine's other jobs do not move; the
seconds are one run's.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
DEFAULT_FAMILIES = "gemm,attention,moe_ep,rowwise"


def _worker(hw: str, families: list[str], rows: int, calls: int) -> dict:
    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(BENCH))
    import family_speed as fs  # noqa: PLC0415
    from tsbatch.engine.evaluate import evaluate  # noqa: PLC0415

    sweeps = fs.builtin_sweeps()
    out = {}
    for fam in families:
        own, _ = fs.gpu_tables([fam], hw, rows, sweeps)
        table = own[fam] if fam in own else fs.family_table(fam, rows, sweeps=sweeps)
        evaluate(table.head(2000), hw, family=fam)  # load or compile the kernels
        evaluate(table, hw, family=fam)  # the first whole call: its heap grows once
        faults, sys_s, wall = [], [], []
        for _ in range(calls):
            r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            evaluate(table, hw, family=fam)
            r1 = resource.getrusage(resource.RUSAGE_SELF)
            wall.append(time.perf_counter() - t0)
            faults.append(r1.ru_minflt - r0.ru_minflt)
            sys_s.append(r1.ru_stime - r0.ru_stime)
        out[fam] = {"rows": table.height, "faults": statistics.median(faults),
                    "system_s": statistics.median(sys_s), "wall_s": statistics.median(wall)}
    return out


def _child_env(trim_mib: int | None) -> dict:
    from tsbatch.kernels._heap import MMAP_THRESHOLD  # noqa: PLC0415

    env = {k: v for k, v in os.environ.items()
           if not k.startswith("MALLOC_") and k not in ("GLIBC_TUNABLES", "TSBATCH_KEEP_HEAP")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in [env.get("PYTHONPATH")] if p])
    env.setdefault("OMP_WAIT_POLICY", "passive")
    if trim_mib is not None:
        env["MALLOC_MMAP_THRESHOLD_"] = str(MMAP_THRESHOLD)
        env["MALLOC_TRIM_THRESHOLD_"] = str(trim_mib << 20)
    return env


def _mib_list(text: str) -> list[int]:
    try:
        vals = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"whole MiB, comma-separated, got {text!r}") from None
    if not vals or any(v < 1 for v in vals):
        raise argparse.ArgumentTypeError(f"positive MiB, got {text!r}")
    return vals


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hw", default="h100")
    ap.add_argument("--families", default=DEFAULT_FAMILIES,
                    help="families with a built-in sweep (default %(default)s)")
    ap.add_argument("--rows", type=int, default=100_000, help="rows of each family's table")
    ap.add_argument("--calls", type=int, default=6, help="timed warm calls per family")
    ap.add_argument("--trim-mib", type=_mib_list, default=[64, 256],
                    help="trim thresholds to compare, MiB (default 64,256); 'shipped' is always added")
    ap.add_argument("--json", type=Path, help="write the figures as JSON")
    ap.add_argument("--worker", nargs=1, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    families = [f for f in args.families.split(",") if f]
    if args.rows < 1 or args.calls < 1:
        ap.error("--rows and --calls must be positive")
    if args.worker:
        print(json.dumps(_worker(args.hw, families, args.rows, args.calls)))
        return 0
    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(BENCH))
    from family_speed import builtin_sweeps  # noqa: PLC0415

    known = builtin_sweeps()
    bad = [f for f in families if f not in known]
    if bad:
        ap.error(f"--families: no built-in sweep for {', '.join(bad)}; families with one: {', '.join(known)}")
    settings: list[tuple[str, int | None]] = [(f"{m} MiB", m) for m in args.trim_mib] + [("shipped", None)]
    results = {}
    for label, mib in settings:
        print(f"heap_faults: {label} ...", file=sys.stderr, flush=True)
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", label, "--hw", args.hw,
               "--families", ",".join(families), "--rows", str(args.rows), "--calls", str(args.calls)]
        r = subprocess.run(cmd, env=_child_env(mib), capture_output=True, text=True)
        if r.returncode != 0:
            print(f"heap_faults: {label}: the worker failed:\n{r.stderr.strip()[-2000:]}", file=sys.stderr)
            return 1
        results[label] = json.loads(r.stdout.strip().splitlines()[-1])
    print(f"warm evaluate on {args.hw}, medians of {args.calls} calls; per setting: minor page faults a "
          f"call / system s / wall s")
    head = f"{'family':>18} {'rows':>8}" + "".join(f" {lab:>28}" for lab, _ in settings)
    print(head)
    for fam in families:
        cells = "".join(f" {results[lab][fam]['faults']:>10,.0f} / {results[lab][fam]['system_s']:.3f} / "
                        f"{results[lab][fam]['wall_s']:.3f}" for lab, _ in settings)
        print(f"{fam:>18} {results[settings[0][0]][fam]['rows']:>8,}{cells}")
    if args.json:
        args.json.write_text(json.dumps({"hw": args.hw, "calls": args.calls, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
