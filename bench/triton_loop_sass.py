"""The K loop of PyTorch Inductor's Triton mm template on sm_90a, from the compiler.

Compiles the mm kernel of ``bench/triton_narrow_sass.py`` (Inductor's template:
pointer loads, grouped launch order) for 5376 x 5376 x K fp16, A row-major and
B column-major, with the Triton of this environment for ``GPUTarget("cuda", 90,
32)``, without a GPU, and prints for each tile configuration the body of its
main loop (the backward branch whose body holds the HGMMAs) in issue order,
runs of one opcode folded into ``OP xN``: the per-iteration waits (``DEPBAR.LE
SB0, n``: the cp.async groups still allowed in flight; ``WARPGROUP.DEPBAR.LE
gsb0, n``: the wgmma groups), CTA barriers, the proxy fence, the HGMMAs and the
LDGSTS copies with their commit groups. docs/gemm_accuracy.md, "Triton's large
Hopper GEMMs, session 5". Compiler facts, not timings; needs ``triton``.

``--arch 80`` compiles for sm_80 instead (A100: ``mma.sync``, the loop is the
one whose body holds the most HMMAs) and prints, for each of the four operand
layouts, the loop body's instructions per warp and K step by class: HMMA,
shared-memory loads (LDSM / LDS), async copies (LDGSTS), waits and barriers
(LDGDEPBAR, DEPBAR, BAR), the rest (address and loop arithmetic, predicates,
branch); docs/gemm_accuracy.md, "A100 2-warp tiles and the long-K reuse loss,
session 11".

    python bench/triton_loop_sass.py [--k 4096] [--config 64x128x64/s3/w4 ...]
    python bench/triton_loop_sass.py --arch 80 [--config 16x32x16/s3/w2 ...]
    python bench/triton_loop_sass.py --arch 80 --order --config 32x32x16/s1/w2

``--order`` (with ``--arch 80``) prints instead the loop body's global loads,
async copies, shared stores and loads, HMMAs and barriers in issue order (runs
folded): where the next K step's loads issue against this step's MMAs
(docs/gemm_accuracy.md, "One-stage loops and BK 16, session 13").
"""
from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

DEFAULT = ["64x128x64/s3/w4", "128x128x64/s3/w4", "128x128x64/s5/w4", "128x64x64/s3/w8",
           "64x64x128/s3/w4"]
KEEP = ("LDGSTS", "LDGDEPBAR", "DEPBAR", "BAR.SYNC", "FENCE", "WARPGROUP", "HGMMA", "BRA")


def loop_body(sass: str, mma: str = "HGMMA") -> list[str]:
    """The instructions (opcode and operands) of the loop whose backward branch
    encloses the most ``mma`` instructions (HGMMA; HMMA on sm_80), in order."""
    ins = []
    for line in sass.splitlines():
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m:
            ins.append((int(m.group(1), 16), m.group(2).strip()))
    best, body = 0, []
    for i, (addr, text) in enumerate(ins):
        b = re.search(r"\bBRA\s+(?:`\()?0x([0-9a-f]+)", text)
        if not b:
            continue
        tgt = int(b.group(1), 16)
        if tgt >= addr:
            continue
        seg = [t for a, t in ins if tgt <= a <= addr]
        n = sum(mma in t for t in seg)
        if n > best:
            best, body = n, seg
    return body


def fold(body: list[str]) -> list[str]:
    """The kept opcodes of a loop body, runs of one opcode folded."""
    out: list[list] = []
    for t in body:
        op = t.split()[1] if t.startswith("@") else t.split()[0]
        if not op.startswith(KEEP):
            continue
        label = t if op.startswith(("DEPBAR", "WARPGROUP.DEPBAR")) else op
        if out and out[-1][0] == label:
            out[-1][1] += 1
        else:
            out.append([label, 1])
    return [f"{lab} x{n}" if n > 1 else lab for lab, n in out]


#: the opcodes :func:`memory_order` keeps: global loads and async copies, shared
#: stores and loads, the MMAs and the waits / barriers between them
ORDER_KEEP = ("LDG", "LDGSTS", "LDGDEPBAR", "STS", "LDSM", "LDS", "HMMA", "BAR", "DEPBAR")


def memory_order(body: list[str]) -> list[str]:
    """The loop body's memory, MMA and barrier opcodes (no suffixes) in issue
    order, runs of one opcode folded: where the next K step's global loads issue
    relative to this step's MMAs."""
    out: list[list] = []
    for t in body:
        op = (t.split()[1] if t.startswith("@") else t.split()[0]).split(".")[0]
        if op not in ORDER_KEEP:
            continue
        if out and out[-1][0] == op:
            out[-1][1] += 1
        else:
            out.append([op, 1])
    return [f"{lab} x{n}" if n > 1 else lab for lab, n in out]


SM80_DEFAULT = ["16x32x16/s3/w2", "16x32x32/s4/w2", "128x64x32/s2/w2", "64x64x32/s3/w4",
                "128x128x32/s3/w4"]
SM80_CLASSES = (("hmma", ("HMMA",)), ("shared loads", ("LDSM", "LDS")), ("ldgsts", ("LDGSTS",)),
                ("waits/barriers", ("LDGDEPBAR", "DEPBAR", "BAR")))


def classes(body: list[str]) -> dict:
    """Instructions of a loop body by class (NOPs left out)."""
    out = {name: 0 for name, _ in SM80_CLASSES}
    out["other"] = 0
    for t in body:
        op = (t.split()[1] if t.startswith("@") else t.split()[0]).split(".")[0]
        if op == "NOP":
            continue
        name = next((nm for nm, ops in SM80_CLASSES if op in ops), "other")
        out[name] += 1
    out["total"] = sum(out.values())
    return out


def main_sm80(args) -> int:
    import triton_narrow_sass as tns  # needs triton

    for cfg in args.config or SM80_DEFAULT:
        m = re.fullmatch(r"(\d+)x(\d+)x(\d+)/s(\d+)/w(\d+)", cfg)
        if not m:
            sys.exit(f"bench/triton_loop_sass.py: bad --config {cfg!r} (BMxBNxBK/sS/wW)")
        bm, bn, bk, s, w = map(int, m.groups())
        for a_rm, b_rm in ((True, False), (True, True), (False, False), (False, True)):
            with tempfile.TemporaryDirectory() as tmp:
                dump = Path(tmp) / "k.sass"
                tns.run(args.k, a_rm, b_rm, bm, bn, bk, w, s, dump=dump, arch=80)
                body = loop_body(dump.read_text(), "HMMA")
            lay = f"A:{'row' if a_rm else 'col'} B:{'row' if b_rm else 'col'}"
            if not body:  # a short constant K: the compiler unrolls the whole loop
                print(f"{cfg} {lay} K={args.k}: no loop (no backward branch around HMMAs: unrolled)",
                      flush=True)
                continue
            if args.order:
                print(f"{cfg} {lay} K={args.k}: " + " | ".join(memory_order(body)), flush=True)
                continue
            c = classes(body)
            # K steps the body runs: its HMMAs over one step's per warp (m16n8k16)
            steps = c["hmma"] / (bm * bn * bk / (16 * 8 * 16) / w) if c["hmma"] else 0.0
            per = {k: round(v / steps, 1) for k, v in c.items()} if steps else c
            print(f"{cfg} {lay} K={args.k}: {steps:g} K step(s) a loop body; per warp and step: "
                  + ", ".join(f"{k} {v:g}" for k, v in per.items()), flush=True)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--config", nargs="*", default=None, help="BMxBNxBK/sS/wW")
    ap.add_argument("--arch", type=int, default=90, choices=[80, 90],
                    help="sm_90a (default: the HGMMA loop in issue order) or sm_80 (instructions by class)")
    ap.add_argument("--order", action="store_true",
                    help="with --arch 80: the loop's loads, stores, MMAs and barriers in issue order")
    args = ap.parse_args(argv)
    if args.arch == 80:
        return main_sm80(args)
    args.config = args.config or DEFAULT
    import triton_narrow_sass as tns  # needs triton

    for cfg in args.config:
        m = re.fullmatch(r"(\d+)x(\d+)x(\d+)/s(\d+)/w(\d+)", cfg)
        if not m:
            sys.exit(f"bench/triton_loop_sass.py: bad --config {cfg!r} (BMxBNxBK/sS/wW)")
        bm, bn, bk, s, w = map(int, m.groups())
        with tempfile.TemporaryDirectory() as tmp:
            dump = Path(tmp) / "k.sass"
            regs, spill, smem, _c, total = tns.run(args.k, True, False, bm, bn, bk, w, s, dump=dump)
            body = loop_body(dump.read_text())
        print(f"{cfg} K={args.k}: regs {regs}, spill {spill} B, shared {smem} B, "
              f"{len(body)} loop instructions")
        print("   " + " | ".join(fold(body)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
