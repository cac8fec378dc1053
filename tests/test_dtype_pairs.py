"""bench/dtype_pairs.py: the bf16 / fp16 pairs it forms, on synthetic rows."""

from __future__ import annotations

import sys
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import dtype_pairs  # noqa: E402


def _row(dtype, t, *, bm=64, backend="triton", group_m=8, n=512):
    return {"m": 256, "n": n, "k": 1024, "dtype": dtype, "a_row_major": True, "b_row_major": False,
            "backend": backend, "block_m": bm if backend == "triton" else None,
            "block_n": 64 if backend == "triton" else None, "block_k": 32 if backend == "triton" else None,
            "num_stages": 3 if backend == "triton" else None, "num_warps": 4 if backend == "triton" else None,
            "group_m": group_m if backend == "triton" else None, "measured_us": t}


def test_pairs_join_the_same_configuration_only():
    rows = [
        _row("float16", 10.0), _row("float16", 12.0),   # two repeats: median 11
        _row("bfloat16", 22.0),                          # the same configuration
        _row("float16", 30.0, bm=128),                   # no bf16 twin: left out
        _row("bfloat16", 40.0, n=1024),                  # another problem: left out
        _row("float16", 5.0, backend="cublas"),          # library rows: null tile columns
        _row("bfloat16", 6.0, backend="cublas"),
    ]
    p = dtype_pairs.pairs(pl.DataFrame(rows)).sort("backend", descending=True)
    assert p.height == 2
    tri = p.filter(pl.col("backend") == "triton").row(0, named=True)
    assert (tri["fp16_us"], tri["bf16_us"], tri["block_m"]) == (11.0, 22.0, 64)
    lib = p.filter(pl.col("backend") == "cublas").row(0, named=True)
    assert (lib["fp16_us"], lib["bf16_us"]) == (5.0, 6.0)


def test_bucket_edges_are_the_guards():
    from tsbatch.measured.regress_metrics import BUCKETS

    times, want = [], []
    for label, lo, hi in BUCKETS:  # each bucket's low edge (inclusive) and just below its high one
        times += [lo, min(hi, 1e9) * (1 - 1e-9)]
        want += [label, label]
    got = pl.DataFrame({"t": times}).select(dtype_pairs.bucket("t").alias("b"))["b"].to_list()
    assert got == want
    assert pl.DataFrame({"t": [19.99, 20.0]}).select(dtype_pairs.bucket("t").alias("b"))["b"].to_list() == \
        ["<20us", "20-100us"]
