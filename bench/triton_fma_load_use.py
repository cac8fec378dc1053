"""Load-to-use distance of Triton's FMA dot (IEEE FP32) per operand layout: for
each shared load (LDS*) of the main loop, how many FFMAs ptxas schedules
before the first FFMA that reads one of its registers (min, 10th percentile,
median, and how many loads are used within 16 FFMAs); docs/gemm_accuracy.md
"H100 IEEE FP32 A:row B:row residual, session 12". Needs ``triton``;
``--ptxas`` replaces the ptxas bundled with it (Triton 3.9's refuses its own
PTX 9.4: ``--ptxas /usr/local/cuda/bin/ptxas``)::

    python bench/triton_fma_load_use.py 128 64 32 8 --stages 4 --arch 90 --ptxas /usr/local/cuda/bin/ptxas
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import triton_fma_footprints as T  # noqa: E402

_PRED = re.compile(r"^@!?U?P\w+\s+")


def _op(t: str) -> str:
    return _PRED.sub("", t).split()[0]


def _args(t: str) -> list[str]:
    return [a.strip() for a in _PRED.sub("", t).split(None, 1)[1].split(",")]


def load_use(body: list[str]) -> list[int]:
    """FFMAs between each shared load and the first FFMA reading its registers."""
    out = []
    for i, t in enumerate(body):
        o = _op(t)
        if not o.startswith("LDS"):
            continue
        m = re.match(r"R(\d+)", _args(t)[0])
        if not m:
            continue
        width = {"LDS.128": 4, "LDS.64": 2}.get(o, 1)
        regs = {f"R{int(m.group(1)) + j}" for j in range(width)}
        n = 0
        for t2 in body[i + 1:]:
            if _op(t2) == "FFMA":
                n += 1
                if regs & {a.split(".")[0].lstrip("-|") for a in _args(t2)[1:]}:
                    out.append(n)
                    break
    return sorted(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tile", nargs=4, type=int, metavar=("BM", "BN", "BK", "WARPS"))
    ap.add_argument("--stages", type=int, default=3)
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--ptxas", default=None)
    args = ap.parse_args(argv)
    if args.ptxas:
        run = subprocess.run

        def patched(cmd, **kw):
            if "ptxas" in str(cmd[0]):
                cmd = [args.ptxas] + list(cmd[1:])
            return run(cmd, **kw)
        subprocess.run = patched
    bm, bn, bk, warps = args.tile
    for a_rm, b_rm in ((False, True), (True, True), (False, False), (True, False)):
        text, regs, _spill, _shared = T.compile_sass(bm, bn, bk, warps, a_rm, b_rm, args.arch,
                                                     args.stages)
        d = load_use(T.loop_body(text, ("FFMA",)))
        lay = f"A:{'row' if a_rm else 'col'} B:{'row' if b_rm else 'col'}"
        print(f"sm_{args.arch} {bm}x{bn}x{bk}/{args.stages}/{warps} {lay}: {regs} registers; "
              f"{len(d)} shared loads, FFMAs to first use min {d[0]} p10 {d[len(d) // 10]} "
              f"median {statistics.median(d)}; used within 16 FFMAs {sum(x <= 16 for x in d)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
