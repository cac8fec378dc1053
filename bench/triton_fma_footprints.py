"""What Triton's compiler decides for IEEE FP32 (FMA-dot) GEMM tiles, against the model.

Compiles PyTorch Inductor's Triton matmul template (grouped launch, operands
loaded whole per BK step, ``tl.dot(..., allow_tf32=False)``, strides baked in
as constants the way Inductor specializes them) for a GPU target, without a
GPU, for every (block_m, block_n, block_k, num_warps) of the IEEE FP32 Triton
rows of the measured sets and all four operand layouts, and reads:

- ``regs`` / ``spill_stores``: registers per thread and spill-store bytes
  (``ptxas -v`` on the kernel's PTX, the ptxas that ships with Triton);
- from the SASS of the main loop (``cuobjdump -sass``; the backward branch
  whose body holds the most FFMAs): ``loop_ffma``, ``loop_lds128`` /
  ``loop_lds64`` / ``loop_lds32`` (shared loads by width) and ``loop_ldl`` /
  ``loop_stl`` (local loads and stores), per thread and iteration.

These are compiler facts, not timings. ``tests/test_lowering.py`` holds the
model's FMA-dot layout (``kernels_catalog.gemm._fma_layout``: which rows and
columns a thread reads, as vectors of which width) to the LDS and FFMA counts,
and its register estimate to ``regs`` and the spill / no-spill split, through
the table ``--write`` produces.

Needs ``triton`` (not a tsbatch dependency): ``pip install triton==3.0.0``
(what wrote ``tests/data/triton30_fma_sm80_sm90.csv``; 3.1 gives the same
loads). Compiling all 640 kernels takes about half an hour on 10 cores::

    python bench/triton_fma_footprints.py                  # compare, print a summary
    python bench/triton_fma_footprints.py --write tests/data/triton30_fma_sm80_sm90.csv
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

try:  # Triton is optional: only this script needs it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - reported by main()
    triton = None

SOURCES = ["gemm/a100_triton_mm.parquet", "gemm/h100_triton_mm.parquet"]
HELD_OUT = ["bench/measured/h200-2026-11-30/fp32_layouts_ieee/gemm.parquet",
            "bench/measured/h200-2026-11-30/fp32/gemm.parquet"]
PROBLEM = 4096  # M = N = K of the compiled kernels (their code does not depend on it)

if triton is not None:
    @triton.jit
    def _mm(A, B, C, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
            sam: tl.constexpr, sak: tl.constexpr, sbk: tl.constexpr, sbn: tl.constexpr,
            BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr):
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
        ram = tl.max_contiguous(tl.multiple_of(rm % M, BM), BM)
        rbn = tl.max_contiguous(tl.multiple_of(rn % N, BN), BN)
        rk = tl.arange(0, BK)
        A = A + (ram[:, None] * sam + rk[None, :] * sak)
        B = B + (rk[:, None] * sbk + rbn[None, :] * sbn)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for _k in range(K, 0, -BK):
            a = tl.load(A)
            b = tl.load(B)
            acc += tl.dot(a, b, allow_tf32=False)
            A += BK * sak
            B += BK * sbk
        mask = (rm[:, None] < M) & (rn[None, :] < N)
        tl.store(C + rm[:, None] * N + rn[None, :], acc, mask=mask)


def _loop_counts(sass: str) -> dict:
    """Instruction counts of the main loop: the backward branch whose body
    holds the most FFMAs."""
    ins = []
    for line in sass.splitlines():
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m:
            ins.append((int(m.group(1), 16), m.group(2).strip()))
    best = (0, [])
    for addr, txt in ins:
        b = re.search(r"BRA\s+(?:`\()?[^0x]*0x([0-9a-f]+)", txt)
        if b and int(b.group(1), 16) < addr:
            body = [t for a, t in ins if int(b.group(1), 16) <= a <= addr]
            nf = sum("FFMA" in t for t in body)
            if nf > best[0]:
                best = (nf, body)
    c = collections.Counter()
    for t in best[1]:
        op = t.split()[1] if t.startswith("@") else t.split()[0]
        c[op] += 1
    pick = lambda pre: sum(v for k, v in c.items() if k.startswith(pre))  # noqa: E731
    return dict(loop_ffma=c.get("FFMA", 0), loop_lds128=c.get("LDS.128", 0),
                loop_lds64=c.get("LDS.64", 0), loop_lds32=c.get("LDS", 0) + c.get("LDS.U", 0),
                loop_ldl=pick("LDL"), loop_stl=pick("STL"))


def compile_one(job: tuple) -> dict:
    """Compile one tile and layout for one architecture; the compiler's figures."""
    bm, bn, bk, warps, a_rm, b_rm, arch = job
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler.compiler import AttrsDescriptor

    sam, sak = (PROBLEM, 1) if a_rm else (1, PROBLEM)
    sbk, sbn = (PROBLEM, 1) if b_rm else (1, PROBLEM)
    consts = {3: PROBLEM, 4: PROBLEM, 5: PROBLEM, 6: sam, 7: sak, 8: sbk, 9: sbn, 10: bm, 11: bn,
              12: bk, 13: 8}
    src = ASTSource(_mm, {0: "*fp32", 1: "*fp32", 2: "*fp32"}, constants=consts,
                    attrs=AttrsDescriptor(divisible_by_16={0, 1, 2}))
    k = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                       options={"num_warps": warps, "num_stages": 3})
    bindir = Path(triton.__file__).parent / "backends/nvidia/bin"
    with tempfile.TemporaryDirectory() as tmp:
        ptx, cubin = Path(tmp) / "k.ptx", Path(tmp) / "k.cubin"
        ptx.write_text(k.asm["ptx"])
        # Triton emits sm_90a PTX for Hopper (warpgroup and TMA features)
        target = f"sm_{arch}a" if arch == 90 else f"sm_{arch}"
        err = subprocess.run([str(bindir / "ptxas"), f"-arch={target}", "-v", str(ptx), "-o",
                              str(cubin)], capture_output=True, text=True, check=True).stderr
        sass = subprocess.run([str(bindir / "cuobjdump"), "-sass", str(cubin)],
                              capture_output=True, text=True, check=True).stdout
    spill = re.search(r"(\d+) bytes spill stores", err)
    return dict(block_m=bm, block_n=bn, block_k=bk, num_warps=warps, a_row_major=a_rm,
                b_row_major=b_rm, arch=arch, shared=int(k.metadata.shared),
                regs=int(re.search(r"Used (\d+) registers", err).group(1)),
                spill_stores=int(spill.group(1)) if spill else 0, **_loop_counts(sass))


def tiles() -> pl.DataFrame:
    """The IEEE FP32 Triton tiles of the measured sets (development and held out)."""
    shared = Path(os.environ.get("TSBATCH_SHARED_DATA", ROOT.parent / "shared" / "data"))
    frames = []
    for p in [shared / s for s in SOURCES] + [ROOT / h for h in HELD_OUT]:
        if p.exists():
            d = pl.read_parquet(p).filter((pl.col("backend") == "triton")
                                          & (pl.col("dtype") == "float32") & ~pl.col("tf32"))
            frames.append(d.select("block_m", "block_n", "block_k", "num_warps").unique())
    if not frames:
        sys.exit("bench/triton_fma_footprints.py: no measured GEMM file found")
    return pl.concat(frames).unique().sort("block_m", "block_n", "block_k", "num_warps")


def compiled_table(workers: int, archs=(80, 90)) -> pl.DataFrame:
    jobs = [(r["block_m"], r["block_n"], r["block_k"], r["num_warps"], a, b, arch)
            for r in tiles().iter_rows(named=True) for arch in archs
            for a in (False, True) for b in (False, True)]
    jobs.sort(key=lambda j: -j[0] * j[1] * j[2])  # the slow ones first
    with ProcessPoolExecutor(workers) as pool:
        out = list(pool.map(compile_one, jobs))
    return pl.DataFrame(out).sort("arch", "block_m", "block_n", "block_k", "num_warps",
                                  "a_row_major", "b_row_major")


def model_counts(table: pl.DataFrame) -> pl.DataFrame:
    """The model's per-thread loads per iteration, FFMAs and register estimate."""
    from kernels_catalog import gemm
    out = []
    for r in table.iter_rows(named=True):
        c = gemm.fma_loads(r["block_m"], r["block_n"], r["block_k"], r["num_warps"],
                           r["a_row_major"], r["b_row_major"])
        out.append(dict(model_ffma=c["ffma"], model_lds128=c[4], model_lds64=c[2],
                        model_lds32=c[1],
                        model_regs=gemm.fma_registers(r["block_m"], r["block_n"],
                                                      r["block_k"], r["num_warps"])))
    return pl.concat([table, pl.DataFrame(out)], how="horizontal")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", default=None, help="write the compiled table (CSV) here")
    ap.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    args = ap.parse_args(argv)
    if triton is None:
        sys.exit("bench/triton_fma_footprints.py needs triton: pip install triton==3.0.0")
    table = compiled_table(args.workers)
    if args.write:
        table.write_csv(args.write)
    t = model_counts(table)
    loads = all((t[f"model_{c}"] == t[f"loop_{c}"]).all() for c in ("ffma", "lds128", "lds64"))
    cap = (65536 // (32 * t["num_warps"]) // 8 * 8).clip(upper_bound=255)  # the lowering's
    agree = ((t["model_regs"] > cap) == (t["spill_stores"] > 0)).mean()
    quiet = t.filter(pl.col("spill_stores") == 0)
    print(f"Triton {triton.__version__}: {len(t)} kernels; FFMA and LDS.128/.64 counts per "
          f"iteration match the model's layout on every kernel: {loads}")
    print(f"spills: model and ptxas agree on {agree:.3f} of kernels; registers of the "
          f"non-spilling ones within {(quiet['model_regs'] - quiet['regs']).abs().mean():.1f} "
          f"on average (model - ptxas {(quiet['model_regs'] - quiet['regs']).mean():+.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
