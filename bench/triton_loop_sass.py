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
(docs/gemm_accuracy.md, "One-stage loops and BK 16, session 13"). With
``--order``, ``--arch 89`` or ``90`` compile for those targets; tiles of fewer
than 4 warps are mma.sync there too (warpgroup MMA needs 4). ``--dtype``
picks the operands: fp16 (default), bf16, tf32, ieee (FP32 without tensor
cores: the loop is the one holding the most FFMAs), fp8e4nv, fp8e5
(docs/gemm_accuracy.md, "The one-stage loop's prefetch by dtype, session 13").
``--overlap`` (with ``--order``) prints instead, per layout, how many of the
K step's HMMAs issue between each global load and the shared store of its
registers (:func:`load_overlap`): the MMAs under the load's flight.

    python bench/triton_loop_sass.py --arch 90 --order --dtype tf32 --config 32x32x16/s1/w2
    python bench/triton_loop_sass.py --arch 80 --order --overlap --dtype tf32 --config 32x32x16/s1/w2
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
ORDER_KEEP = ("LDG", "LDGSTS", "LDGDEPBAR", "STS", "LDSM", "LDS", "HMMA", "FFMA", "BAR", "DEPBAR")


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


def _op(t: str) -> str:
    return (t.split()[1] if t.startswith("@") else t.split()[0]).split(".")[0]


def load_overlap(body: list[str]) -> list[int]:
    """For each shared store (STS) of the loop body that writes a register a
    global load (LDG) of the body filled, the HMMAs issued between that load and
    the store, following the loop round its back edge where the store comes
    first (the load then belongs to the iteration before): the MMAs that run
    while the load is in flight. A store right behind its load (0) waits the
    whole load latency with nothing of the K step's MMAs under it."""
    ops = [(_op(t), t) for t in body]
    n = len(ops)
    out = []
    for i, (op, t) in enumerate(ops):
        if op != "STS":
            continue
        src = re.search(r",\s*(R\d+)\s*$", t)
        if not src:
            continue
        hmma = 0
        for d in range(1, n + 1):  # back from the store, round the back edge
            op2, t2 = ops[(i - d) % n]
            if op2 == "HMMA":
                hmma += 1
            elif op2 == "LDG":
                dst = re.search(r"LDG\S*\s+(R\d+)", t2)
                if dst and dst.group(1) == src.group(1):
                    out.append(hmma)
                    break
    return out


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
                tns.run(args.k, a_rm, b_rm, bm, bn, bk, w, s, dump=dump, arch=args.arch,
                        dtype=args.dtype)
                body = loop_body(dump.read_text(), "FFMA" if args.dtype == "ieee" else "HMMA")
            lay = f"A:{'row' if a_rm else 'col'} B:{'row' if b_rm else 'col'}"
            if args.arch != 80 or args.dtype != "fp16":
                lay = f"sm_{args.arch} {args.dtype} {lay}"
            if not body:  # a short constant K: the compiler unrolls the whole loop
                print(f"{cfg} {lay} K={args.k}: no loop (no backward branch around HMMAs: unrolled)",
                      flush=True)
                continue
            if args.overlap:
                ov = load_overlap(body)
                kmma = {"tf32": 8, "fp8e4nv": 32, "fp8e5": 32}.get(args.dtype, 16)
                per = bm * bn * bk / (16 * 8 * kmma) / w  # HMMAs per warp and K step
                fr = sorted(v / per for v in ov)
                print(f"{cfg} {lay} K={args.k}: {len(ov)} stores of loaded registers; "
                      f"HMMAs between load and store, over the step's {per:g}: "
                      + (f"mean {sum(fr) / len(fr):.3g}, min {fr[0]:.3g}, median {fr[len(fr) // 2]:.3g}, "
                         f"max {fr[-1]:.3g}"
                         if fr else "no store of a loaded register"), flush=True)
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
    ap.add_argument("--arch", type=int, default=90, choices=[80, 89, 90],
                    help="sm_90a (default: the HGMMA loop in issue order) or sm_80 (instructions by class)")
    ap.add_argument("--order", action="store_true",
                    help="the mma.sync loop's loads, stores, MMAs and barriers in issue order")
    ap.add_argument("--overlap", action="store_true",
                    help="with --order: the HMMAs issued between each global load and its shared store")
    ap.add_argument("--dtype", default="fp16", choices=["fp16", "bf16", "tf32", "ieee", "fp8e4nv", "fp8e5"],
                    help="operand dtype (fp16 default)")
    args = ap.parse_args(argv)
    if args.arch == 89 and not args.order:
        ap.error("--arch 89 needs --order")
    if args.arch == 80 or args.order:
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
