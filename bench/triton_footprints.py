"""What Triton itself allocates for FlexAttention-shaped kernels, against the model.

Compiles a FlashAttention forward kernel shaped like the Triton FlexAttention
template that ``shared/data/attention/a100_flexattention.parquet`` measured (Q
block loaded once, K and V streamed through the software pipeline, QK^T and PV
with ``tl.dot``, online softmax, a score modification, O and LSE stored) for a
GPU target, without a GPU, and reads what the compiler decided:

- ``shared``: the shared memory the kernel allocates (Triton's own figure);
- ``regs`` / ``spill_bytes``: registers per thread and spill stores, from
  ``ptxas -v`` on the kernel's PTX (the ptxas that ships with Triton);
- ``warps_m`` / ``warps_n``: the warp layout of the MMA accumulator;
- ``p_staged``: whether P goes through shared memory on its way to the
  second dot.

and compares the shared memory and the resident blocks per SM with the
``attention`` family's lowering. These are compiler facts (not timings): the
model's footprint rules are checked against them in
``tests/test_families.py`` through the table ``--write`` produces.

Needs ``triton`` (not a tsbatch dependency): ``pip install triton==3.1.0``
(the Triton of the PyTorch that collected the measured file). Run::

    python bench/triton_footprints.py                 # compare, print a summary
    python bench/triton_footprints.py --write tests/data/triton31_attention_sm80.csv
    python bench/triton_footprints.py --gemm          # GEMM tiles' accumulator spills
    python bench/triton_footprints.py --loop-local    # local traffic a loop iteration
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

try:  # Triton is optional: only this script needs it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - reported by main()
    triton = None

# the measured file's tile configurations, plus a few around them
CONFIGS = [(32, 64, 4), (64, 16, 4), (64, 64, 4), (64, 128, 4), (128, 32, 4), (128, 64, 4),
           (128, 64, 8), (128, 128, 4), (32, 32, 4), (16, 64, 4), (64, 32, 8), (256, 64, 8),
           (32, 128, 4)]
HEAD_DIMS = [16, 32, 64, 128, 256]
DTYPES = {"float16": "*fp16", "bfloat16": "*bf16", "float32": "*fp32"}

if triton is not None:
    @triton.jit
    def _flex_fwd(Q, K, V, O, LSE, sm_scale, Q_LEN, KV_LEN,
                  stride_qz, stride_qh, stride_qm, stride_kz, stride_kh, stride_kn, HQ,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr):
        q_start = tl.program_id(0)
        off_z = tl.program_id(1) // HQ
        off_h = tl.program_id(1) % HQ
        Q = Q + off_z * stride_qz + off_h * stride_qh
        K = K + off_z * stride_kz + off_h * stride_kh
        V = V + off_z * stride_kz + off_h * stride_kh
        m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
        offs_m = q_start * BLOCK_M + tl.arange(0, BLOCK_M)
        q_ptr = tl.make_block_ptr(base=Q, shape=(Q_LEN, D), strides=(stride_qm, 1),
                                  offsets=(q_start * BLOCK_M, 0), block_shape=(BLOCK_M, D),
                                  order=(1, 0))
        q = tl.load(q_ptr)
        # K read transposed (D x N), as the template's K block pointer
        k_ptr = tl.make_block_ptr(base=K, shape=(D, KV_LEN), strides=(1, stride_kn),
                                  offsets=(0, 0), block_shape=(D, BLOCK_N), order=(0, 1))
        v_ptr = tl.make_block_ptr(base=V, shape=(KV_LEN, D), strides=(stride_kn, 1),
                                  offsets=(0, 0), block_shape=(BLOCK_N, D), order=(1, 0))
        offs_n = tl.arange(0, BLOCK_N)
        for start_n in range(0, KV_LEN, BLOCK_N):
            k = tl.load(k_ptr)
            qk = tl.dot(q, k) * sm_scale
            # a score modification over the indices (one compare and select)
            qk = tl.where(offs_m[:, None] >= (start_n + offs_n)[None, :], qk, float("-inf"))
            m_ij = tl.maximum(m_i, tl.max(qk, 1))
            p = tl.math.exp2((qk - m_ij[:, None]) * 1.44269504)
            alpha = tl.math.exp2((m_i - m_ij) * 1.44269504)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None]
            v = tl.load(v_ptr)
            acc = tl.dot(p.to(v.dtype), v, acc)
            m_i = m_ij
            k_ptr = tl.advance(k_ptr, (0, BLOCK_N))
            v_ptr = tl.advance(v_ptr, (BLOCK_N, 0))
        acc = acc / l_i[:, None]
        offs_d = tl.arange(0, D)
        O = O + off_z * stride_qz + off_h * stride_qh
        tl.store(O + offs_m[:, None] * stride_qm + offs_d[None, :], acc.to(O.dtype.element_ty),
                 mask=offs_m[:, None] < Q_LEN)
        tl.store(LSE + tl.program_id(1) * Q_LEN + offs_m, m_i + tl.math.log2(l_i),
                 mask=offs_m < Q_LEN)


if triton is not None:
    @triton.jit
    def _gemm(A, B, C, M, N, K, stride_am, stride_bk, stride_cm,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        # a plain Triton GEMM (A row-major, B row-major, fp32 accumulator)
        rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        a_ptr = A + rm[:, None] * stride_am + rk[None, :]
        b_ptr = B + rk[:, None] * stride_bk + rn[None, :]
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for _k in range(0, K, BLOCK_K):
            acc += tl.dot(tl.load(a_ptr), tl.load(b_ptr))
            a_ptr += BLOCK_K
            b_ptr += BLOCK_K * stride_bk
        tl.store(C + rm[:, None] * stride_cm + rn[None, :], acc.to(tl.float16))


#: GEMM tiles whose fp32 accumulator is 256 or 512 registers a thread (--gemm)
GEMM_CONFIGS = [(128, 256, 32, 4), (256, 128, 32, 4), (128, 128, 32, 2), (64, 128, 32, 1),
                (256, 256, 32, 8), (128, 256, 64, 4), (64, 256, 32, 2), (128, 128, 32, 1)]


def _sm(arch: int) -> str:
    """ptxas's target for Triton's PTX: Hopper's wgmma and setmaxnreg need the
    architecture-specific sm_90a (plain sm_90 rejects the PTX)."""
    return f"sm_{arch}a" if arch >= 90 else f"sm_{arch}"


def _ptxas_footprint(k, arch: int) -> tuple[int, int]:
    """Registers per thread and spill-store bytes of a compiled kernel (``ptxas -v``)."""
    ptxas = Path(triton.__file__).parent / "backends/nvidia/bin/ptxas"
    with tempfile.TemporaryDirectory() as tmp:
        ptx = Path(tmp) / "k.ptx"
        ptx.write_text(k.asm["ptx"])
        out = subprocess.run([str(ptxas), f"-arch={_sm(arch)}", "-v", str(ptx), "-o", os.devnull],
                             capture_output=True, text=True, check=True).stderr
    kname = k.metadata.name
    # the line block of this kernel (ptxas reports every entry it compiles)
    block = out[out.find(kname):] if kname in out else out
    regs = int(re.search(r"Used (\d+) registers", block).group(1))
    spill = re.search(r"(\d+) bytes spill stores", block)
    return regs, int(spill.group(1)) if spill else 0


def compile_gemm(bm: int, bn: int, bk: int, warps: int, stages: int = 3, arch: int = 80) -> dict:
    """A float16 Triton GEMM tile's registers and spill stores. ptxas keeps a GEMM
    accumulator of more registers than the cap at the cap and spills the excess,
    where it spills the FlexAttention kernel's whole (the attention program's
    ``spill_whole``)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler.compiler import AttrsDescriptor

    sig = {0: "*fp16", 1: "*fp16", 2: "*fp16", **{i: "i32" for i in range(3, 9)}}
    attrs = AttrsDescriptor(divisible_by_16=set(range(9)))
    src = ASTSource(_gemm, sig, constants={9: bm, 10: bn, 11: bk}, attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                       options={"num_warps": warps, "num_stages": stages})
    regs, spill = _ptxas_footprint(k, arch)
    return dict(block_m=bm, block_n=bn, block_k=bk, num_warps=warps,
                acc_regs=bm * bn // (32 * warps), regs=regs, spill_bytes=spill)


def _loop_local_bytes(k, arch: int) -> tuple[int, int]:
    """Bytes of local-memory loads and stores a thread issues in one iteration of
    the kernel's loop: the ``LDL`` / ``STL`` instructions (by width) between the
    last backward branch and its target in the SASS (``cuobjdump``; the loop body
    is straight-line code, every instruction runs once an iteration)."""
    b = Path(triton.__file__).parent / "backends/nvidia/bin"
    with tempfile.TemporaryDirectory() as tmp:
        ptx, cubin = Path(tmp) / "k.ptx", Path(tmp) / "k.cubin"
        ptx.write_text(k.asm["ptx"])
        subprocess.run([str(b / "ptxas"), f"-arch={_sm(arch)}", str(ptx), "-o", str(cubin)],
                       check=True)
        sass = subprocess.run([str(b / "cuobjdump"), "-sass", str(cubin)], capture_output=True,
                              text=True, check=True).stdout
    ins = []  # (address, instruction)
    for line in sass.splitlines():
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m:
            ins.append((int(m.group(1), 16), m.group(2)))
    loops = []  # (target, branch) of each backward branch
    for a, s in ins:
        t = re.search(r"BRA .*?0x([0-9a-f]+)", s)
        if t and int(t.group(1), 16) < a:
            loops.append((int(t.group(1), 16), a))
    if not loops:
        return 0, 0
    lo, hi = loops[-1]
    out = {"LDL": 0, "STL": 0}
    for a, s in ins:
        m = re.search(r"\b(LDL|STL)((?:\.\w+)*)", s)
        if lo <= a <= hi and m:
            out[m.group(1)] += 16 if ".128" in m.group(2) else 8 if ".64" in m.group(2) else 4
    return out["LDL"], out["STL"]


def compile_one(bm: int, bn: int, d: int, dtype: str, warps: int, stages: int = 3,
                arch: int = 80, loop_local: bool = False) -> dict:
    """Compile one configuration; the compiler's footprint figures (and with
    ``loop_local`` the local-memory bytes a thread moves in one loop iteration)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler.compiler import AttrsDescriptor

    ty = DTYPES[dtype]
    sig = {0: ty, 1: ty, 2: ty, 3: ty, 4: "*fp32", 5: "fp32", **{i: "i32" for i in range(6, 15)}}
    # pointers and sizes 16-divisible, as PyTorch's specialization sees them (without
    # it Triton cannot prove 16-byte alignment and does not pipeline the loads)
    attrs = AttrsDescriptor(divisible_by_16={0, 1, 2, 3, 4, *range(6, 14)})
    src = ASTSource(_flex_fwd, sig, constants={15: bm, 16: bn, 17: d}, attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                       options={"num_warps": warps, "num_stages": stages})
    ttgir = k.asm["ttgir"]
    lay = re.search(r"#mma = .*?warpsPerCTA = \[(\d+), (\d+)\]", ttgir)
    p_staged = bool(re.search(r"local_alloc %\w+ : \(tensor<\d+x\d+x\w+, #mma\d*>", ttgir))
    regs, spill = _ptxas_footprint(k, arch)
    out = dict(shared=int(k.metadata.shared), regs=regs, spill_bytes=spill,
               warps_m=int(lay.group(1)) if lay else 0, warps_n=int(lay.group(2)) if lay else 0,
               p_staged=p_staged)
    if loop_local:
        out["loop_ldl_bytes"], out["loop_stl_bytes"] = _loop_local_bytes(k, arch)
    return out


def compile_guarded(bm: int, bn: int, d: int, dtype: str, warps: int, stages: int = 3,
                    arch: int = 80, loop_local: bool = False) -> dict | None:
    """:func:`compile_one`, or None where Triton cannot compile the configuration.
    For sm_90a Triton 3.1 aborts the whole process on some (an assertion in its
    layout conversion: "mma -> mma layout conversion is only supported on
    Ampere"), so there each configuration compiles in a child process of its own."""
    if arch < 90:
        return compile_one(bm, bn, d, dtype, warps, stages, arch, loop_local)
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        try:
            return pool.submit(compile_one, bm, bn, d, dtype, warps, stages, arch,
                               loop_local).result()
        except BrokenProcessPool:
            return None


def compiled_table(stages: int = 3, arch: int = 80) -> pl.DataFrame:
    rows = []
    total = len(HEAD_DIMS) * len(DTYPES) * len(CONFIGS)
    for d in HEAD_DIMS:
        for dtype in DTYPES:
            for bm, bn, w in CONFIGS:
                r = compile_guarded(bm, bn, d, dtype, w, stages, arch)
                if r is None:  # (Triton aborted: the row keeps its configuration, no figures)
                    r = {}
                rows.append(dict(head_dim=d, dtype=dtype, block_m=bm, block_n=bn, num_warps=w,
                                 num_stages=stages, **r))
                print(f"\r  compiled {len(rows)}/{total}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return pl.DataFrame(rows)


def _candidates(table: pl.DataFrame) -> pl.DataFrame:
    """The table's tile configurations as attention candidates of one shape (the
    footprints do not depend on it)."""
    return table.select("head_dim", "dtype", "block_m", "block_n", "num_warps",
                        "num_stages").with_columns(
        batch=pl.lit(8), heads=pl.lit(8), seq_len=pl.lit(1024), score_mod_nodes=pl.lit(6),
        seq_len_kv=pl.lit(128))


def model_footprints(table: pl.DataFrame, hw_name: str = "a100") -> pl.DataFrame:
    """The attention family's shared memory and resident blocks for the table's rows."""
    from tsbatch.engine.evaluate import FAMILIES, evaluate
    from tsbatch.hw import get_hw
    from tsbatch.boundary.schema import validate

    fam = FAMILIES["attention"]
    hw = get_hw(hw_name)
    cand = _candidates(table)
    cols, _ = validate(cand, fam)
    plan = fam.lower(cols, hw)
    res = evaluate(cand, hw, "attention")
    return table.with_columns(model_smem=pl.Series(plan.smem_block),
                              model_resident=res["resident_tiles"],
                              model_feasible=res["feasible"])


def loop_local_report(table_csv: str, arch: int = 80) -> int:
    """Per configuration ptxas spills on for sm_80 (the table's), compiled for ``arch``:
    ptxas's registers, spill stores and loop local traffic a thread, against the
    model's spilled registers and their shared-memory charge a thread an iteration
    (spill x 4 B x load and store x ``spill_passes``), on A100's model for sm_80 and
    H100's for sm_90a."""
    if triton is None:
        print("triton is not installed: pip install triton==3.1.0", file=sys.stderr)
        return 2
    from tsbatch.engine.evaluate import FAMILIES
    from tsbatch.hw import get_hw
    from tsbatch.boundary.schema import validate

    table = pl.read_csv(table_csv).filter(pl.col("spill_bytes") > 0)
    rows = []
    for i, r in enumerate(table.iter_rows(named=True)):
        c = compile_guarded(r["block_m"], r["block_n"], r["head_dim"], r["dtype"],
                            r["num_warps"], r["num_stages"], arch, loop_local=True) or {}
        rows.append({k: c.get(k) for k in ("regs", "spill_bytes", "loop_ldl_bytes",
                                             "loop_stl_bytes")})
        print(f"\r  compiled {i + 1}/{table.height}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    fam = FAMILIES["attention"]
    cand = _candidates(table)
    cols, _ = validate(cand, fam)
    # the model of the GPU the kernels were compiled for (its register cap, the
    # warpgroup path on Hopper)
    plan = fam.lower(cols, get_hw("h100" if arch >= 90 else "a100"))
    eb = (table["dtype"] == "float32").cast(pl.Int64) * 2 + 2
    passes = ((table["block_n"] * eb + 31) // 32).cast(pl.Float64)  # the program's spill_passes
    spill = pl.Series(plan.extra["register_spill"]).cast(pl.Float64)
    # the compiler's figures for the target compiled (the table's are sm_80's)
    out = table.select("head_dim", "dtype", "block_m", "block_n", "num_warps").with_columns(
        **{k: pl.Series(k, [r[k] for r in rows], dtype=pl.Int64) for k in ("regs", "spill_bytes")},
        model_spill_regs=spill, model_local_bytes=spill * 4 * 2 * passes,
        **{k: pl.Series(k, [r[k] for r in rows], dtype=pl.Int64)
           for k in ("loop_ldl_bytes", "loop_stl_bytes")})
    with pl.Config(tbl_rows=100, tbl_cols=20, tbl_width_chars=200):
        print(out.sort("spill_bytes", descending=True))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", metavar="CSV", help="write the compiler's table to CSV")
    ap.add_argument("--table", metavar="CSV", help="compare a table written before (no Triton needed)")
    ap.add_argument("--arch", type=int, default=80, help="sm_XX target (default 80: A100)")
    ap.add_argument("--gemm", action="store_true",
                    help="instead: ptxas's registers and spills of Triton GEMM tiles whose "
                         "accumulator exceeds the register cap")
    ap.add_argument("--loop-local", action="store_true",
                    help="instead: the local-memory bytes a thread moves in one loop iteration "
                         "(SASS) for the configurations ptxas spills on (from --table, default "
                         "tests/data/triton31_attention_sm80.csv), beside the model's spill")
    args = ap.parse_args(argv)
    if args.loop_local:
        return loop_local_report(args.table or str(ROOT / "tests/data/triton31_attention_sm80.csv"),
                                 args.arch)
    if args.gemm:
        if triton is None:
            print("triton is not installed: pip install triton==3.1.0", file=sys.stderr)
            return 2
        print(f"Triton {triton.__version__}, sm_{args.arch}", file=sys.stderr)
        rows = [compile_gemm(*c, arch=args.arch) for c in GEMM_CONFIGS]
        with pl.Config(tbl_rows=50, tbl_cols=20):
            print(pl.DataFrame(rows))
        return 0
    if args.table:
        table = pl.read_csv(args.table)
    else:
        if triton is None:
            print("triton is not installed: pip install triton==3.1.0 (or pass --table CSV)",
                  file=sys.stderr)
            return 2
        print(f"Triton {triton.__version__}, sm_{args.arch}", file=sys.stderr)
        table = compiled_table(arch=args.arch)
    if args.write:
        Path(args.write).parent.mkdir(parents=True, exist_ok=True)
        table.write_csv(args.write)
        print(f"wrote {args.write} ({table.height} configurations)")
    from tsbatch.hw import get_hw

    hw_name = "h100" if args.arch >= 90 else "a100"  # the model of the compiled-for GPU
    limit = get_hw(hw_name).smem_per_block_bytes  # opt-in shared memory per block
    cmp = model_footprints(table, hw_name)
    cmp = cmp.with_columns(diff=pl.col("model_smem") - pl.col("shared"),
                           launches=pl.col("shared") <= limit)
    print(f"shared memory, model - Triton (bytes): min {cmp['diff'].min()}, max {cmp['diff'].max()}, "
          f"within 1 KiB on {(cmp['diff'].abs() <= 1024).sum()} of {cmp.height}")
    agree = (cmp["launches"] == cmp["model_feasible"]).sum()
    print(f"launch outcome (shared <= {limit} B) predicted on {agree} of {cmp.height}")
    bad = cmp.filter(pl.col("diff").abs() > 1024)
    if bad.height:
        with pl.Config(tbl_rows=50, tbl_cols=20, tbl_width_chars=200):
            print(bad.select("dtype", "head_dim", "block_m", "block_n", "num_warps", "shared",
                             "model_smem", "diff"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
