"""SASS facts of PyTorch Inductor's Triton mm template for 5376 x 5376 x 43 fp16 on sm_90a.

Compiles an mm kernel shaped like Inductor's template (constant M, N, K and
strides, ``ram``/``rbn`` hinted contiguous only for the row-/column-major
strides, masked K loads when ``K % BLOCK_K != 0``, fp16 C store) with the
Triton of this environment for ``GPUTarget("cuda", 90, 32)``, without a GPU,
and prints per layout and tile: registers (``cuobjdump -res-usage``), stack
(spill) bytes, shared memory, the static SASS instruction count of the kernel
and its load / store / spill instructions. docs/gemm_accuracy.md, "Unaligned
operands on H100, session 4". Compiler facts, not timings; needs ``triton``.

    python bench/triton_narrow_sass.py
"""
import collections
import re
import subprocess
import tempfile
from pathlib import Path
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

@triton.jit
def _mm(A, B, C, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
        sam: tl.constexpr, sak: tl.constexpr, sbk: tl.constexpr, sbn: tl.constexpr,
        BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr, EVEN_K: tl.constexpr,
        PREC: tl.constexpr):
    pid = tl.program_id(0)
    grid_m = (M + BM - 1) // BM
    grid_n = (N + BN - 1) // BN
    width = GROUP_M * grid_n
    group_id = pid // width
    group_size = min(grid_m - group_id * GROUP_M, GROUP_M)
    pid_m = group_id * GROUP_M + (pid % group_size)
    pid_n = (pid % width) // group_size
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    if (sam == 1 and sak == M) or (sam == K and sak == 1):
        ram = tl.max_contiguous(tl.multiple_of(rm % M, BM), BM)
    else:
        ram = rm % M
    if (sbk == 1 and sbn == K) or (sbk == N and sbn == 1):
        rbn = tl.max_contiguous(tl.multiple_of(rn % N, BN), BN)
    else:
        rbn = rn % N
    rk = tl.arange(0, BK)
    A = A + (ram[:, None] * sam + rk[None, :] * sak)
    B = B + (rk[:, None] * sbk + rbn[None, :] * sbn)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(K, 0, -BK):
        if EVEN_K:
            a = tl.load(A)
            b = tl.load(B)
        else:
            a = tl.load(A, mask=rk[None, :] < k, other=0.)
            b = tl.load(B, mask=rk[:, None] < k, other=0.)
        acc += tl.dot(a, b, input_precision=PREC)
        A += BK * sak
        B += BK * sbk
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    tl.store(C + rm[:, None] * N + rn[None, :], acc.to(tl.float16), mask=mask)

#: operand dtypes of :func:`run`: Triton pointer type and ``tl.dot`` input precision
#: (``tf32`` is Triton's default for every dtype, so fp16 compiles as before)
DTYPES = {"fp16": ("*fp16", "tf32"), "bf16": ("*bf16", "tf32"), "tf32": ("*fp32", "tf32"),
          "ieee": ("*fp32", "ieee"), "fp8e4nv": ("*fp8e4nv", "tf32"), "fp8e5": ("*fp8e5", "tf32")}


def run(k, a_rm, b_rm, bm, bn, bk, warps, stages, dump=None, arch=90, dtype="fp16"):
    M = N = 5376
    ptr, prec = DTYPES[dtype]
    sam, sak = (k, 1) if a_rm else (1, M)
    sbk, sbn = (N, 1) if b_rm else (1, k)
    names = _mm.arg_names
    sig = {nm: ((ptr if i < 2 else "*fp16") if i < 3 else "constexpr") for i, nm in enumerate(names)}
    vals = [M, N, k, sam, sak, sbk, sbn, bm, bn, bk, 8, k % bk == 0, prec]
    src = ASTSource(_mm, sig, constexprs=dict(zip(names[3:], vals)), attrs={(i,): [["tt.divisibility", 16]] for i in range(3)})
    kk = triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": warps, "num_stages": stages})
    bindir = Path(triton.__file__).parent / "backends/nvidia/bin"
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        cubin.write_bytes(kk.asm["cubin"])
        sass = subprocess.run([str(bindir / "cuobjdump"), "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
        res = subprocess.run([str(bindir / "cuobjdump"), "-res-usage", str(cubin)], capture_output=True, text=True).stdout
    global RES
    RES = res
    kk._init_handles = None
    if dump: Path(dump).write_text(sass)
    c = collections.Counter()
    for line in sass.splitlines():
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m:
            t = m.group(2).strip()
            op = t.split()[1] if t.startswith("@") else t.split()[0]
            c[op] += 1
    mm_ = re.search(r"REG:(\d+)", RES); regs = int(mm_.group(1)) if mm_ else None
    mm2 = re.search(r"STACK:(\d+)", RES)
    sp = mm2
    keys = sorted(k2 for k2 in c if k2.startswith(("LDG", "STS", "LDGSTS", "HGMMA", "BAR", "STG", "LDS", "STL", "LDL", "UTMA", "SYNCS", "WARPGROUP", "PRMT", "SEL", "IMAD", "IADD", "LEA", "ISETP")))
    return regs, int(sp.group(1)) if sp else 0, int(kk.metadata.shared), {k2: c[k2] for k2 in keys}, sum(c.values())

if __name__ == "__main__":
    for k in (43, 48):
        for a_rm, b_rm in ((False, True), (True, False), (False, False), (True, True)):
            for (bm, bn, bk, w, s) in [(128, 128, 64, 4, 3), (128, 128, 64, 8, 3), (64, 128, 64, 4, 3), (128, 128, 32, 4, 3), (128, 64, 32, 2, 2), (64, 64, 16, 4, 2)]:
                r = run(k, a_rm, b_rm, bm, bn, bk, w, s)
                print(k, "A" + ("r" if a_rm else "c") + "B" + ("r" if b_rm else "c"), f"{bm}x{bn}x{bk}/{w}/{s}", "regs", r[0], "spill", r[1], "smem", r[2], "total", r[4], {k3: v for k3, v in r[3].items() if k3 in ("LDG.E.U16","STS.U16","LDL","STL","LDG.E.128","LDGSTS.E.BYPASS.128")}, flush=True)
