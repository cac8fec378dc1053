"""The main loop of Triton's FMA dot (IEEE FP32) as ptxas schedules it, per operand layout.

Compiles the Inductor matmul template of ``bench/triton_fma_footprints.py``
(no GPU needed) for one tile in all four layouts and reads the SASS of the
main loop (the backward branch whose body holds the most FFMAs):

- the instruction mix beside the FFMAs (shared loads, local loads and stores of
  spilled registers, address arithmetic);
- register-bank pressure of the FFMAs: how many read three source registers
  from one bank that the operand reuse cache does not supply (a source is
  supplied when the previous FFMA read the same register in the same slot with
  ``.reuse``), for 2 banks (``R % 2``) and 4 banks (``R % 4``);
- where the copy of the next tile is issued (``LDGSTS``) and waited for
  (``DEPBAR.LE SB0, n``: ``n = 0`` waits for the copy just issued) among the
  loop's FFMAs.

Needs ``triton`` (not a tsbatch dependency; 3.0.0 for the figures of
docs/gemm_accuracy.md, "IEEE FP32 operand layouts, session 11")::

    python bench/triton_fma_loop.py 128 128 32 4 --stages 3 --arch 80 90
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import triton_fma_footprints as T  # noqa: E402


def sass(bm: int, bn: int, bk: int, warps: int, a_rm: bool, b_rm: bool, arch: int,
         stages: int) -> tuple[str, int, int]:
    """The cubin's SASS, registers and spill-store bytes of one compiled tile."""
    out, regs, spill, _shared = T.compile_sass(bm, bn, bk, warps, a_rm, b_rm, arch, stages)
    return out, regs, spill


def loop_body(text: str) -> list[str]:
    """The instructions of the backward branch whose body holds the most FFMAs."""
    return T.loop_body(text, ("FFMA",))


def _op(t: str) -> str:
    return re.sub(r"^@!?U?P\w+\s+", "", t).split()[0]


def bank_conflicts(body: list[str], banks: int) -> int:
    """FFMAs whose register sources not supplied by the reuse cache all fall in one bank
    (three of them)."""
    n = 0
    prev: dict = {}
    for t in body:
        if _op(t) != "FFMA":
            prev = {}
            continue
        args = re.sub(r"^@!?U?P\w+\s+", "", t).split(None, 1)[1]
        srcs = [a.strip() for a in args.split(",")][1:4]
        cur, regs = {}, []
        for slot, s in enumerate(srcs):
            m = re.match(r"-?\|?R(\d+)(\.reuse)?", s)
            if not m:
                continue
            r = int(m.group(1))
            if m.group(2):
                cur[slot] = r
            if prev.get(slot) != r:
                regs.append(r % banks)
        prev = cur
        if regs and max(collections.Counter(regs).values()) >= 3:
            n += 1
    return n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tile", nargs=4, type=int, metavar=("BM", "BN", "BK", "WARPS"))
    ap.add_argument("--stages", type=int, default=3)
    ap.add_argument("--arch", type=int, nargs="+", default=[80, 90])
    args = ap.parse_args(argv)
    bm, bn, bk, warps = args.tile
    for arch in args.arch:
        for a_rm, b_rm in ((False, True), (False, False), (True, True), (True, False)):
            text, regs, spill = sass(bm, bn, bk, warps, a_rm, b_rm, arch, args.stages)
            body = loop_body(text)
            ops = collections.Counter(_op(t) for t in body)
            ffma = ops.pop("FFMA", 0)
            nf, events = 0, []
            for t in body:
                o = _op(t)
                if o == "FFMA":
                    nf += 1
                elif o.startswith(("LDGSTS", "DEPBAR", "BAR")):
                    events.append(f"{o}{' ' + t.split()[-1] if o.startswith('DEPBAR') else ''}@{nf}")
            lay = f"A:{'row' if a_rm else 'col'} B:{'row' if b_rm else 'col'}"
            print(f"sm_{arch} {bm}x{bn}x{bk}/{args.stages}/{warps} {lay}: {regs} registers, "
                  f"{spill} B spilled; loop FFMA {ffma}, other {sum(ops.values())} "
                  f"({', '.join(f'{k} {v}' for k, v in ops.most_common(8))}); "
                  f"3-source one-bank FFMAs {bank_conflicts(body, 2)} (2 banks), "
                  f"{bank_conflicts(body, 4)} (4 banks)")
            first = [e for e in events if not e.startswith("LDGSTS")]
            copies = [e for e in events if e.startswith("LDGSTS")]
            print(f"    copy issued at FFMA {copies[0].split('@')[1] if copies else '-'}; "
                  + " ".join(first))
    return 0


if __name__ == "__main__":
    sys.exit(main())
