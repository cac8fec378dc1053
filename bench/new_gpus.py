"""The GPUs of issue 36 checked as far as data allows (no measurement of any of them exists here).

    PYTHONPATH=. .venv/bin/python bench/new_gpus.py [--problems 30] [--seed 1]

1. Peak-achieving GEMM and attention predictions on each new GPU (best configuration of a
   small tile grid: what an autotuner would keep) beside the published measurement where one
   was found; ``-`` where none was (said plainly in the ``published`` column).
2. Ranking transfer: for problems of the closest measured GPU (A100 for GA102/AD102, whose
   mma.sync + cp.async kernels are the same; H100 for GH200, the same die), the Spearman
   correlation between the *new* GPU's predicted ordering of the tile configurations and the
   *measured* ordering on the measured GPU, beside the measured GPU's own predicted-vs-measured
   Spearman. Where architectures share the kernel's instruction path the orderings should
   mostly agree; the gap says how much the new part's smaller shared memory, narrower L2 or
   GDDR6 reorders them. It is not an accuracy figure for the new GPU (nothing is).

Everything printed is computed in this run; the published figures are constants with their
sources, never tuned against.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import numpy as np
import polars as pl

import tsbatch
from tsbatch.hw import get_hw

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"

NEW_GPUS = ["a40", "rtx_a6000", "l40", "l40s", "l20", "rtx_6000_ada", "gh200", "gh200_144g",
            "mi250x", "mi300x"]

#: Published measured figures, by (gpu, kernel). Only what could be named; every other cell
#: prints "none found". (value TFLOPS, source)
PUBLISHED = {
    ("gh200", "attention_fa3"): (740.0, "FlashAttention-3 paper (Shah et al. 2024, arXiv:2407.08608): FP16 forward up to 740 TFLOPS on H100 SXM5 at head dim 256, 16k tokens (same GH100 SM; no GH200-specific figure found)"),
    ("gh200_144g", "attention_fa3"): (740.0, "as gh200 (FlashAttention-3 paper, H100 SXM5, head dim 256)"),
}
#: the FA3 paper's benchmark shape for its headline figure: 16k tokens, hidden 2048, head dim 256
FA3_SHAPE = dict(batch=1, heads=8, seq_len=16384, head_dim=256, dtype="float16", causal=False,
                 block_m=128, block_n=80)  # FA3's own head-dim-256 tile (hopper/tile_size.h: 128 x 80)

GEMM_SHAPE = dict(m=8192, n=8192, k=8192, dtype="bfloat16")
ATTN_SHAPE = dict(batch=4, heads=32, seq_len=8192, head_dim=128, dtype="bfloat16", causal=False)


def _gemm_grid() -> pl.DataFrame:
    rows = []
    for bm, bn, bk, st, w in itertools.product((64, 128, 256), (64, 128, 256), (32, 64), (2, 3, 4, 5), (4, 8)):
        rows.append({**GEMM_SHAPE, "block_m": bm, "block_n": bn, "block_k": bk, "num_stages": st, "num_warps": w})
    return pl.DataFrame(rows)


def _attn_grid() -> pl.DataFrame:
    rows = []
    for bm, bn, st, w in itertools.product((64, 128), (32, 64, 128), (1, 2, 3), (4, 8)):
        rows.append({**ATTN_SHAPE, "block_m": bm, "block_n": bn, "num_stages": st, "num_warps": w})
    return pl.DataFrame(rows)


def _best_tflops(frame: pl.DataFrame, hw: str, family: str, flop: float) -> tuple[float, float]:
    res = tsbatch.evaluate_table(frame, hw=hw, family=family)
    lat = res.filter(pl.col("feasible"))["latency_us"]
    if lat.len() == 0:
        return float("nan"), float("nan")
    best = float(lat.min())
    return flop / (best * 1e-6) / 1e12, best


def peaks() -> None:
    g = GEMM_SHAPE
    gemm_flop = 2.0 * g["m"] * g["n"] * g["k"]
    a = ATTN_SHAPE
    attn_flop = 4.0 * a["batch"] * a["heads"] * a["seq_len"] ** 2 * a["head_dim"]
    print("1. best predicted configuration per GPU (TFLOPS useful) and published measurements")
    print(f"   GEMM {g['m']}x{g['n']}x{g['k']} {g['dtype']}; attention b{a['batch']} h{a['heads']} "
          f"s{a['seq_len']} d{a['head_dim']} {a['dtype']} non-causal (FlexAttention template; "
          "FA3 on Hopper)")
    print(f"   {'gpu':14s} {'spec fp16':>9s} {'GEMM':>8s} {'of spec':>7s} {'attn':>8s} {'of spec':>7s}  published")
    gg, ag = _gemm_grid(), _attn_grid()
    for hw in NEW_GPUS:
        spec = get_hw(hw).tc_fp16_tflops
        gt, _ = _best_tflops(gg, hw, "gemm", gemm_flop)
        at, _ = _best_tflops(ag, hw, "attention", attn_flop)
        line = f"   {hw:14s} {spec:9.1f} {gt:8.1f} {gt / spec:7.2f} {at:8.1f} {at / spec:7.2f}"
        pubs = [f"{k}: {v[0]:g} TFLOPS ({v[1]})" for (h, k), v in PUBLISHED.items() if h == hw]
        if get_hw(hw).mma == "wgmma":
            f = FA3_SHAPE
            fa3_flop = 4.0 * f["batch"] * f["heads"] * f["seq_len"] ** 2 * f["head_dim"]
            ft, _ = _best_tflops(pl.DataFrame([{**FA3_SHAPE}]), hw, "attention_fa3", fa3_flop)
            line += f"  [FA3 fp16 d256 s16k predicted {ft:.1f}]"
        print(line + "  " + ("; ".join(pubs) if pubs else "none found (no public GEMM/attention measurement of this part was found)"))


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    ok = np.isfinite(a) & np.isfinite(b)
    if ok.sum() < 3:
        return float("nan")
    ra = np.argsort(np.argsort(a[ok])).astype(float)
    rb = np.argsort(np.argsort(b[ok])).astype(float)
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def _ranking(measured: pl.DataFrame, keys: list[str], cfg: list[str], family: str, base_hw: str,
             targets: list[str], problems: int, seed: int) -> None:
    probs = measured.select(keys).unique().sort(keys).sample(n=problems, seed=seed)
    sub = measured.join(probs, on=keys).group_by(keys + cfg).agg(pl.col("time_ms").median())
    sub = sub.filter(pl.col("time_ms").is_finite()).sort(keys + cfg)
    pid = sub.select(keys).hash_rows().to_numpy()
    meas = sub["time_ms"].to_numpy()
    cand = sub.drop("time_ms")
    preds = {}
    for hw in [base_hw] + targets:
        r = tsbatch.evaluate_table(cand, hw=hw, family=family)
        lat = r["latency_us"].to_numpy().astype(float)
        lat[~r["feasible"].to_numpy()] = np.nan
        preds[hw] = lat
    print(f"   {'gpu':14s} {'mean Spearman':>13s} {'problems':>8s} {'feasible cfgs':>13s}")
    for hw, lat in preds.items():
        rhos = []
        for p in np.unique(pid):
            m = pid == p
            rhos.append(_spearman(lat[m], meas[m]))
        rhos = np.array(rhos)
        tag = " (measured GPU's own prediction)" if hw == base_hw else ""
        print(f"   {hw:14s} {np.nanmean(rhos):13.3f} {np.isfinite(rhos).sum():8d} "
              f"{np.isfinite(lat).mean() * 100:12.1f}%{tag}")


def ranking(problems: int, seed: int) -> None:
    print(f"\n2. ranking of tile configurations against the measured ordering of the closest "
          f"measured GPU ({problems} random problems, seed {seed})")
    mm_cols = ["m", "n", "k", "dtype", "a_row_major", "b_row_major", "tf32"]
    cfg = ["block_m", "block_n", "block_k", "num_stages", "num_warps"]
    a100 = pl.read_parquet(SHARED / "gemm" / "a100_triton_mm.parquet").filter(
        (pl.col("backend") == "triton") & pl.col("dtype").is_in(["float16", "bfloat16"]))
    print("   GEMM (Triton), measured on A100; GA102/AD102 share its mma.sync + cp.async path")
    _ranking(a100.select(mm_cols + cfg + ["time_ms"]), mm_cols, cfg, "gemm", "a100",
             ["a40", "rtx_a6000", "l40", "l40s", "l20", "rtx_6000_ada"], problems, seed)
    h100 = pl.read_parquet(SHARED / "gemm" / "h100_triton_mm.parquet").filter(
        (pl.col("backend") == "triton") & pl.col("dtype").is_in(["float16", "bfloat16"]))
    print("   GEMM (Triton), measured on H100; GH200 is the same die")
    _ranking(h100.select(mm_cols + cfg + ["time_ms"]), mm_cols, cfg, "gemm", "h100_sxm",
             ["gh200", "gh200_144g"], problems, seed)
    fa = pl.read_parquet(SHARED / "attention" / "a100_flexattention.parquet")
    keys = ["batch", "heads", "seq_len", "head_dim", "dtype", "score_mod_nodes"]
    print("   FlexAttention, measured on A100")
    _ranking(fa.select(keys + ["block_m", "block_n", "num_stages", "num_warps", "time_ms"]), keys,
             ["block_m", "block_n", "num_stages", "num_warps"], "attention", "a100",
             ["a40", "rtx_a6000", "l40s", "rtx_6000_ada"], problems, seed)
    print("   MI250X/MI300X: no measured AMD kernel exists here (MI210 has only microbenchmarks), "
          "so no ranking check")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--problems", type=int, default=30)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    peaks()
    ranking(args.problems, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
