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

    python bench/triton_loop_sass.py [--k 4096] [--config 64x128x64/s3/w4 ...]
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


def loop_body(sass: str) -> list[str]:
    """The instructions (opcode and operands) of the loop whose backward branch
    encloses the most HGMMAs, in order."""
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
        n = sum("HGMMA" in t for t in seg)
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--config", nargs="*", default=DEFAULT, help="BMxBNxBK/sS/wW")
    args = ap.parse_args(argv)
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
