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

``--tf32`` compiles the TF32 tiles instead (``allow_tf32=True``), each at its
measured ``num_stages``: the A100 rows for sm_80, the H100 rows and the
held-out H200 rows for sm_90 (``--arch`` keeps one). Their table adds
``num_stages``, the ``triton`` release, and the main loop's ``loop_hmma`` /
``loop_hgmma`` (mma.sync / warpgroup MMA), ``loop_ldsm`` and ``loop_ldgsts``
(cp.async) counts: ``tests/test_lowering.py`` holds the model's shared memory
per block and launch outcome to it, and checks the split the model draws
between Triton releases (an M/N-contiguous TF32 operand for warpgroup MMA is
staged through registers, no cp.async, before 3.3).

Needs ``triton`` (not a tsbatch dependency); the compile API of 3.0 to 3.6 is
handled. ``pip install triton==3.0.0`` wrote
``tests/data/triton30_fma_sm80_sm90.csv`` (3.1 gives the same loads; all 640
kernels take about half an hour on 10 cores), 3.1.0
``tests/data/triton31_tf32_sm80_sm90.csv`` and 3.6.0
``tests/data/triton36_tf32_sm90.csv`` (5 and 3 minutes on 2 cores)::

    python bench/triton_fma_footprints.py                  # compare, print a summary
    python bench/triton_fma_footprints.py --write tests/data/triton30_fma_sm80_sm90.csv
    python bench/triton_fma_footprints.py --tf32 --write tests/data/triton31_tf32_sm80_sm90.csv
    python bench/triton_fma_footprints.py --tf32 --arch 90 --write tests/data/triton36_tf32_sm90.csv
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
            BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
            TF32: tl.constexpr):
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
            acc += tl.dot(a, b, allow_tf32=TF32)
            A += BK * sak
            B += BK * sbk
        mask = (rm[:, None] < M) & (rn[None, :] < N)
        tl.store(C + rm[:, None] * N + rn[None, :], acc, mask=mask)


#: SASS opcodes of the dot's multiply: FMA path, mma.sync, warpgroup MMA
_MULTIPLY = ("FFMA", "HMMA", "HGMMA")


def loop_body(sass: str, ops: tuple = _MULTIPLY) -> list[str]:
    """The instructions of the main loop: the backward branch whose body holds
    the most of ``ops`` (by default the multiplies: FFMA, HMMA or HGMMA)."""
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
            nf = sum(any(op in t for op in ops) for t in body)
            if nf > best[0]:
                best = (nf, body)
    return best[1]


def _loop_counts(sass: str) -> dict:
    """Instruction counts of the main loop (:func:`loop_body`)."""
    c = collections.Counter()
    for t in loop_body(sass):
        op = t.split()[1] if t.startswith("@") else t.split()[0]
        c[op] += 1
    pick = lambda pre: sum(v for k, v in c.items() if k.startswith(pre))  # noqa: E731
    return dict(loop_ffma=c.get("FFMA", 0), loop_lds128=c.get("LDS.128", 0),
                loop_lds64=c.get("LDS.64", 0), loop_lds32=c.get("LDS", 0) + c.get("LDS.U", 0),
                loop_ldl=pick("LDL"), loop_stl=pick("STL"), loop_hmma=pick("HMMA"),
                loop_hgmma=pick("HGMMA"), loop_ldsm=pick("LDSM"), loop_ldgsts=pick("LDGSTS"))


def _source(values: list):
    """The kernel's ASTSource with the constexpr ``values`` (arguments 3 on) and
    16-byte-aligned pointers, in the API of the installed Triton: 3.0-3.2 take
    argument-index constants and an ``AttrsDescriptor``, 3.3 on named
    ``constexprs`` and per-argument attributes."""
    from triton.compiler import ASTSource

    names = _mm.arg_names
    try:
        from triton.compiler.compiler import AttrsDescriptor
    except ImportError:  # Triton 3.3 on
        sig = {nm: ("*fp32" if i < 3 else "constexpr") for i, nm in enumerate(names)}
        return ASTSource(_mm, sig, constexprs=dict(zip(names[3:], values)),
                         attrs={(i,): [["tt.divisibility", 16]] for i in range(3)})
    consts = {3 + i: v for i, v in enumerate(values)}
    try:  # Triton 3.0 / 3.1
        return ASTSource(_mm, {0: "*fp32", 1: "*fp32", 2: "*fp32"}, constants=consts,
                         attrs=AttrsDescriptor(divisible_by_16={0, 1, 2}))
    except TypeError:  # Triton 3.2: named signature, attributes from a dict
        sig = {nm: ("*fp32" if i < 3 else "constexpr") for i, nm in enumerate(names)}
        attrs = AttrsDescriptor.from_dict({"arg_properties": {"tt.divisibility": [0, 1, 2]},
                                           "cls": "AttrsDescriptor"})
        return ASTSource(_mm, sig, constants=dict(zip(names[3:], values)), attrs=attrs)


def compile_sass(bm: int, bn: int, bk: int, warps: int, a_rm: bool, b_rm: bool, arch: int,
                 stages: int, tf32: bool = False) -> tuple[str, int, int, int]:
    """Compile one tile and layout for one architecture: its SASS, registers,
    spill-store bytes and shared-memory bytes."""
    from triton.backends.compiler import GPUTarget

    sam, sak = (PROBLEM, 1) if a_rm else (1, PROBLEM)
    sbk, sbn = (PROBLEM, 1) if b_rm else (1, PROBLEM)
    values = [PROBLEM, PROBLEM, PROBLEM, sam, sak, sbk, sbn, bm, bn, bk, 8, tf32]
    src = _source(values)
    k = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                       options={"num_warps": warps, "num_stages": stages})
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
    return (sass, int(re.search(r"Used (\d+) registers", err).group(1)),
            int(spill.group(1)) if spill else 0, int(k.metadata.shared))


def compile_one(job: tuple) -> dict:
    """Compile one tile and layout for one architecture; the compiler's figures."""
    bm, bn, bk, warps, a_rm, b_rm, arch, stages, tf32 = job
    sass, regs, spill, shared = compile_sass(bm, bn, bk, warps, a_rm, b_rm, arch, stages, tf32)
    extra = dict(num_stages=stages, triton=triton.__version__) if tf32 else {}
    return dict(block_m=bm, block_n=bn, block_k=bk, **extra, num_warps=warps, a_row_major=a_rm,
                b_row_major=b_rm, arch=arch, shared=shared, regs=regs, spill_stores=spill,
                **_loop_counts(sass))


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


#: TF32 rows: which file's tiles are compiled for which architecture
TF32_SOURCES = {80: ["gemm/a100_triton_mm.parquet"], 90: ["gemm/h100_triton_mm.parquet"]}
TF32_HELD_OUT = {90: ["bench/measured/h200-2026-11-30/fp32_layouts_tf32/gemm.parquet",
                      "bench/measured/h200-2026-11-30/fp32/gemm.parquet"]}


def tf32_tiles() -> pl.DataFrame:
    """The TF32 Triton tiles (with their ``num_stages``) of the measured sets, per
    architecture: A100 rows for sm_80, H100 and held-out H200 rows for sm_90."""
    shared = Path(os.environ.get("TSBATCH_SHARED_DATA", ROOT.parent / "shared" / "data"))
    frames = []
    for arch in (80, 90):
        paths = [shared / s for s in TF32_SOURCES[arch]] + [ROOT / h for h in TF32_HELD_OUT.get(arch, [])]
        for p in paths:
            if p.exists():
                d = pl.read_parquet(p).filter((pl.col("backend") == "triton")
                                              & (pl.col("dtype") == "float32") & pl.col("tf32"))
                frames.append(d.select("block_m", "block_n", "block_k", "num_stages", "num_warps")
                              .unique().with_columns(arch=pl.lit(arch)))
    if not frames:
        sys.exit("bench/triton_fma_footprints.py: no measured GEMM file found")
    return pl.concat(frames).unique().sort("arch", "block_m", "block_n", "block_k", "num_stages",
                                           "num_warps")


def compiled_table(workers: int, archs=(80, 90), tf32: bool = False) -> pl.DataFrame:
    if tf32:
        jobs = [(r["block_m"], r["block_n"], r["block_k"], r["num_warps"], a, b, r["arch"],
                 r["num_stages"], True)
                for r in tf32_tiles().filter(pl.col("arch").is_in(list(archs))).iter_rows(named=True)
                for a in (False, True) for b in (False, True)]
    else:
        jobs = [(r["block_m"], r["block_n"], r["block_k"], r["num_warps"], a, b, arch, 3, False)
                for r in tiles().iter_rows(named=True) for arch in archs
                for a in (False, True) for b in (False, True)]
    jobs.sort(key=lambda j: -j[0] * j[1] * j[2])  # the slow ones first
    with ProcessPoolExecutor(workers) as pool:
        out = list(pool.map(compile_one, jobs))
    keys = ["arch", "block_m", "block_n", "block_k"] + (["num_stages"] if tf32 else []) \
        + ["num_warps", "a_row_major", "b_row_major"]
    return pl.DataFrame(out).sort(keys)


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


def tf32_summary(table: pl.DataFrame) -> int:
    """The TF32 kernels' shared memory and launch outcome against the model's,
    and their registers and spills."""
    from kernels_catalog import gemm
    from tsbatch.engine.evaluate import get_family
    from tsbatch.hw import get_hw
    from tsbatch.boundary.schema import validate

    print(f"Triton {triton.__version__}: {len(table)} TF32 kernels")
    for arch, gpu in ((80, "a100"), (90, "h100")):
        part = table.filter(pl.col("arch") == arch)
        if part.height == 0:
            continue
        rows = part.select("block_m", "block_n", "block_k", "num_stages", "num_warps",
                           "a_row_major", "b_row_major").with_columns(
            m=pl.lit(PROBLEM), n=pl.lit(PROBLEM), k=pl.lit(PROBLEM), dtype=pl.lit("float32"),
            tf32=pl.lit(True), triton_version=pl.lit(triton.__version__))
        hw = get_hw(gpu)
        cols, _ = validate(rows, get_family("gemm"))
        plan = gemm.lower(cols, hw)
        got, want = plan.smem_block, part["shared"].to_numpy()
        lim = hw.smem_per_block_bytes
        print(f"sm_{arch} ({gpu}): {part.height} kernels, {int((part['spill_stores'] > 0).sum())} "
              f"spill, mean {part['regs'].mean():.0f} registers; model shared memory within "
              f"2 KiB on {(abs(got - want) <= 2048).mean():.3f}, launch outcome agrees on "
              f"{((got <= lim) == (want <= lim)).mean():.3f}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", default=None, help="write the compiled table (CSV) here")
    ap.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    ap.add_argument("--arch", type=int, action="append", choices=(80, 90),
                    help="compile for this architecture only (repeatable; default 80 and 90)")
    ap.add_argument("--tf32", action="store_true",
                    help="the TF32 tiles instead (tensor cores: mma.sync on sm_80, warpgroup "
                         "MMA or mma.sync on sm_90), each at its measured num_stages")
    args = ap.parse_args(argv)
    if triton is None:
        sys.exit("bench/triton_fma_footprints.py needs triton: pip install triton==3.0.0")
    table = compiled_table(args.workers, archs=tuple(args.arch or (80, 90)), tf32=args.tf32)
    if args.write:
        table.write_csv(args.write)
    if args.tf32:
        return tf32_summary(table)
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
