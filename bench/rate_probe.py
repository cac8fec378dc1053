"""Does a slower GPU ever make a GEMM faster? One rate at a time, on random rows.

A few thousand random GEMM rows (Triton and library, fp16 / bf16 / fp32 with
and without TF32) are evaluated on each GPU at its shipped file and again with
one rate made 10 % worse (``--factor``): a bandwidth, a peak, the clock, a
capacity, a calibrated efficiency (all x 0.9), or the load latency (/ 0.9).
A row whose prediction falls by more than ``--tol`` (relative) is a fall: the
model priced less time on a slower machine. Prints the counts per GPU and rate
and the first falls of each, and exits 1 when there is one (``--gate``)::

    python bench/rate_probe.py                    # a100, h100, h200; 10,000 rows
    python bench/rate_probe.py --rows 6000 --hw a100 --show 5

The rates (``RATES``): each spec key is scaled in the spec and in ``[measured]``
(``HwSpec.rate`` prefers the measured value). ``clock``: the SM clock with its
maximum (``max_clock_mhz``), the clock ``fp32_tflops`` is stated at, and the
rates stated per clock (``fp32_tflops``, ``sfu_tops``, ``alu_tops``), i.e. the
whole chip clocked 10 % lower; ``clock_alone``: ``clock_mhz`` alone (shared
memory and the per-cycle overheads; the CUDA cores' ceiling stays, session 11).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import numpy as np
import polars as pl

from tsbatch.engine.evaluate import evaluate
from tsbatch.hw import HwSpec, get_hw

#: name -> (spec keys scaled by the factor, calibration keys scaled by it,
#: calibration keys divided by it)
RATES: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {
    "dram_bw": (("dram_bw_tbps",), (), ()),
    "l2_bw": (("l2_bw_tbps",), (), ()),
    "l15_bw": (("l15_bw_tbps",), (), ()),
    "smem_bytes_per_clk": (("smem_bytes_per_clk",), (), ()),
    "tc_fp16": (("tc_fp16_tflops",), (), ()),
    "tc_bf16": (("tc_bf16_tflops",), (), ()),
    "tc_tf32": (("tc_tf32_tflops",), (), ()),
    "fp32_tflops": (("fp32_tflops",), (), ()),
    "sfu_alu": (("sfu_tops", "alu_tops"), (), ()),
    "clock": (("clock_mhz", "max_clock_mhz", "fp32_clock_mhz", "fp32_tflops", "sfu_tops",
               "alu_tops"), (), ()),
    "clock_alone": (("clock_mhz",), (), ()),
    "l2_bytes": (("l2_bytes",), (), ()),
    "tc_efficiency": ((), ("tc_efficiency",), ()),
    "l2_efficiency": ((), ("l2_efficiency",), ()),
    "dram_efficiency": ((), ("dram_efficiency",), ()),
    "mem_latency": ((), (), ("mem_latency_us",)),
}
INT_KEYS = {"l2_bytes"}


def slower(hw: HwSpec, rate: str, factor: float) -> HwSpec:
    """``hw`` with ``rate`` (a key of :data:`RATES`) made worse by ``factor`` < 1."""
    spec, cal_mul, cal_div = RATES[rate]
    measured = dict(hw.measured)
    changed = {}
    for k in spec:
        v = getattr(hw, k)
        if k in measured:
            measured[k] *= factor
        changed[k] = int(v * factor) if k in INT_KEYS else v * factor
    cal = dict(hw.calibration)
    for k in cal_mul:
        cal[k] = hw.cal(k) * factor
    for k in cal_div:
        cal[k] = hw.cal(k) / factor
    return dataclasses.replace(hw, **changed, measured=measured, calibration=cal)


def probe_rows(n: int, seed: int = 0) -> pl.DataFrame:
    """``n`` random GEMM rows: 40 % library, the rest Triton; sizes from decode
    to large, tiles 16-256, stages 1-5, warps 1-8."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        lib = rng.random() < 0.4
        dt = str(rng.choice(["float16", "bfloat16", "float32"]))
        bm = int(rng.choice([16, 32, 64, 128, 256]))
        bn = int(rng.choice([16, 32, 64, 128, 256]))
        rows.append(dict(
            m=int(rng.choice([1, 8, 16, 64, 128, 512, 2048, 8192]) * rng.integers(1, 4)),
            n=int(rng.choice([64, 1024, 4096, 6976, 12288])),
            k=int(rng.choice([16, 64, 512, 1024, 4096])),
            dtype=dt, a_row_major=bool(rng.random() < .5), b_row_major=bool(rng.random() < .5),
            tf32=bool(dt == "float32" and rng.random() < .5),
            backend="cublas" if lib else "triton",
            block_m=None if lib else bm, block_n=None if lib else bn,
            block_k=None if lib else int(rng.choice([16, 32, 64, 128])),
            num_stages=None if lib else int(rng.integers(1, 6)),
            num_warps=None if lib else int(rng.choice([1, 2, 4, 8])),
            group_m=8, raster="grouped", split_k=1))
    # the known fall (session 11): A100 TF32 Triton, store-bound
    for m in (16384, 8192):
        rows.append(dict(m=m, n=4096, k=64, dtype="float32", a_row_major=True, b_row_major=False,
                         tf32=True, backend="triton", block_m=128, block_n=64, block_k=16,
                         num_stages=2, num_warps=8, group_m=8, raster="grouped", split_k=1))
    return pl.DataFrame(rows)


def falls(df: pl.DataFrame, gpu: str, rate: str, factor: float, tol: float,
          base: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Row indices whose prediction falls by more than ``tol`` with ``rate``
    worse by ``factor``, and both predictions."""
    hw = get_hw(gpu)
    a = evaluate(df, hw)["latency_us"].to_numpy() if base is None else base
    b = evaluate(df, slower(hw, rate, factor))["latency_us"].to_numpy()
    bad = np.flatnonzero(~np.isnan(a) & (b < a * (1.0 - tol)))
    return bad, a, b


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hw", nargs="*", default=["a100", "h100", "h200"])
    ap.add_argument("--rates", nargs="*", default=list(RATES))
    ap.add_argument("--rows", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--factor", type=float, default=0.9)
    ap.add_argument("--tol", type=float, default=1e-6)
    ap.add_argument("--show", type=int, default=2, help="falls listed per GPU and rate")
    ap.add_argument("--gate", action="store_true", help="exit 1 on any fall")
    args = ap.parse_args(argv)
    df = probe_rows(args.rows, args.seed)
    cols = ["m", "n", "k", "dtype", "tf32", "backend", "block_m", "block_n", "block_k",
            "num_stages", "num_warps"]
    counts = {}
    for gpu in args.hw:
        base = evaluate(df, get_hw(gpu))["latency_us"].to_numpy()
        for rate in args.rates:
            bad, a, b = falls(df, gpu, rate, args.factor, args.tol, base)
            counts[(gpu, rate)] = bad.size
            order = bad[np.argsort(b[bad] / a[bad])]
            for i in order[:args.show]:
                r = df.row(int(i), named=True)
                print(f"  {gpu} {rate}: " + " ".join(f"{c}={r[c]}" for c in cols)
                      + f"  {a[i]:.4f} -> {b[i]:.4f} us ({b[i] / a[i] - 1:+.3%})")
    print(f"\nfalls > {args.tol:g} relative, each rate x {args.factor:g} "
          f"({df.height} rows, seed {args.seed}):")
    print("rate".ljust(20) + "".join(g.rjust(8) for g in args.hw))
    for rate in args.rates:
        print(rate.ljust(20) + "".join(str(counts[(g, rate)]).rjust(8) for g in args.hw))
    tot = sum(counts.values())
    print("total".ljust(20) + "".join(str(sum(counts[(g, r)] for r in args.rates)).rjust(8)
                                      for g in args.hw))
    return 1 if args.gate and tot else 0


if __name__ == "__main__":
    sys.exit(main())
