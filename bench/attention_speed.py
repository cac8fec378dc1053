"""Warm rows/s of the attention family on the measured A100 FlexAttention file (issue 18).

    OMP_WAIT_POLICY=passive python bench/attention_speed.py [--repeats 3] [--rows N] [--json OUT.json]

Issue 18's speed requirement: the 163k-row A100 FlexAttention file
(``<data>/attention/a100_flexattention.parquet``) evaluated warm, in rows/s,
against a numpy roofline pass over the same columns in the same run; and
attention must not be the slow family: at least as many rows/s as GEMM
(``<data>/gemm/a100_triton_mm.parquet``, 238k rows) on the same machine.
``<data>`` is ``$TSBATCH_SHARED_DATA`` or ``../shared/data`` beside the repo;
the files are read in place.

Both files are read with their time column dropped and every row kept (rows
measured as infinite are predicted like the others). The attention rows get
``seq_len_kv = 128`` (the keys each query block of the measured kernels
visited: ``tsbatch.measured.accuracy.FLEX_DATA_KV_VISITED``, as the accuracy benchmark
sets it). Each family is first evaluated once on an evenly spaced slice (numba
compilation, caches), then the full tables are timed alternately, attention
then GEMM, ``--repeats`` times, and the median is reported. The roofline is
``max(4 b h s kv d / fp16 tensor-core peak, bytes(Q, K, V, O) / DRAM
bandwidth)`` per row in vectorized numpy (columns pulled out of the frame
inside the timing), the floor any evaluator pays to touch the data.

How to read it: ``attention/gemm >= 1`` meets the requirement;
``attention/roofline`` is the fraction of the trivial numpy pass the full
model reaches (small is expected; it says how far from the floor we are).
The machine may be shared and noisy: only the ratios, measured in the same
run and alternated, compare across runs. ``--rows N`` takes N evenly spaced
rows of each file for a quick run; it is not the requirement's figure: GEMM's
rows/s grows with the table (rows share cache problems) while attention's stays
flat, so subsamples flatter attention/gemm.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "passive")

import numpy as np  # noqa: E402
import polars as pl  # noqa: E402

from tsbatch.measured.accuracy import FLEX_DATA_KV_VISITED  # noqa: E402
from tsbatch.engine.evaluate import evaluate  # noqa: E402
from tsbatch.hw import get_hw  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
ELEM_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}


def load(path: Path, rows: int | None) -> pl.DataFrame:
    df = pl.read_parquet(path)
    df = df.drop([c for c in df.columns if c.startswith("time")])
    if rows is not None and rows < df.height:
        df = df[np.linspace(0, df.height - 1, rows).astype(np.int64)]
    return df


def roofline(df: pl.DataFrame, tflops: float, dram_tbps: float) -> np.ndarray:
    """Microseconds per row: max of tensor-core FLOP time and Q, K, V, O DRAM time."""
    b = df["batch"].to_numpy().astype(np.float64)
    h = df["heads"].to_numpy().astype(np.float64)
    s = df["seq_len"].to_numpy().astype(np.float64)
    kv = df["seq_len_kv"].to_numpy().astype(np.float64)
    d = df["head_dim"].to_numpy().astype(np.float64)
    eb = df["dtype"].replace_strict(ELEM_BYTES, return_dtype=pl.Float64).to_numpy()
    flops = 4.0 * b * h * s * kv * d
    byt = eb * b * h * d * (2.0 * s + 2.0 * kv)
    return np.maximum(flops / (tflops * 1e6), byt / (dram_tbps * 1e6))


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = Path(os.environ.get("TSBATCH_SHARED_DATA", REPO.parent / "shared" / "data"))
    ap.add_argument("--data", type=Path, default=default)
    ap.add_argument("--hw", default="a100")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rows", type=int, default=None, help="evenly spaced rows of each file")
    ap.add_argument("--warmup-rows", type=int, default=2000)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    att = load(args.data / "attention" / "a100_flexattention.parquet", args.rows)
    att = att.with_columns(seq_len_kv=pl.lit(FLEX_DATA_KV_VISITED, dtype=pl.Int64))
    gemm = load(args.data / "gemm" / "a100_triton_mm.parquet", args.rows)
    hw = get_hw(args.hw)
    tflops, dram = hw.tc_tflops("float16"), hw.rate("dram_bw_tbps")
    print(f"hw={args.hw}  attention rows={att.height:,}  gemm rows={gemm.height:,}  "
          f"repeats={args.repeats}  cpus={os.cpu_count()}  "
          f"load avg (1 min) at start={os.getloadavg()[0]:.2f}")

    t_warm = {}
    for name, df, fam in (("attention", att, "attention"), ("gemm", gemm, "gemm")):
        step = max(1, df.height // args.warmup_rows)
        t_warm[name] = timed(lambda: evaluate(df.gather_every(step), hw, family=fam))
    roofline(att, tflops, dram)
    print(f"warm-up (compile + caches): attention {t_warm['attention']:.1f} s, "
          f"gemm {t_warm['gemm']:.1f} s")

    ts: dict[str, list[float]] = {"attention": [], "gemm": [], "roofline": []}
    stages = {}
    for r in range(args.repeats):
        stages = {}
        ts["attention"].append(timed(lambda: evaluate(att, hw, family="attention",
                                                      timings=stages)))
        ts["gemm"].append(timed(lambda: evaluate(gemm, hw, family="gemm")))
        ts["roofline"].append(timed(lambda: roofline(att, tflops, dram)))
        print(f"repeat {r + 1}/{args.repeats}: attention {ts['attention'][-1]:.2f} s, "
              f"gemm {ts['gemm'][-1]:.2f} s, roofline {ts['roofline'][-1] * 1e3:.1f} ms",
              flush=True)

    rows = {"attention": att.height, "gemm": gemm.height, "roofline": att.height}
    med = {k: statistics.median(v) for k, v in ts.items()}
    rate = {k: rows[k] / med[k] for k in ts}
    out = {
        "hw": args.hw, "repeats": args.repeats, "cpus": os.cpu_count(), "rows": rows,
        "median_s": med, "all_s": ts, "warmup_s": t_warm,
        "rows_per_s": rate,
        "attention_over_gemm": rate["attention"] / rate["gemm"],
        "attention_over_roofline": rate["attention"] / rate["roofline"],
        "attention_stage_s": {k: v for k, v in stages.items() if k.endswith("_s")},
        "load_avg_1min_end": os.getloadavg()[0],
    }
    print(f"\n{'pass':>10} {'rows':>9} {'median s':>10} {'rows/s':>14}")
    for k in ts:
        print(f"{k:>10} {rows[k]:>9,} {med[k]:>10.4f} {rate[k]:>14,.0f}")
    print(f"\nattention / gemm     = {out['attention_over_gemm']:.3f}  "
          f"(requirement: >= 1 -> {'met' if out['attention_over_gemm'] >= 1 else 'NOT met'})")
    print(f"attention / roofline = {out['attention_over_roofline']:.5f}")
    print("attention stages (last repeat, s): "
          + ", ".join(f"{k[:-2]} {v:.2f}" for k, v in out["attention_stage_s"].items()))
    print(f"load avg (1 min) at end={out['load_avg_1min_end']:.2f}  "
          "(shared machine: compare ratios, not absolute rates)")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
