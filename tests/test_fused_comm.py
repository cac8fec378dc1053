"""Fused compute–communication families (issue 20): placement inference and the chunk envelope."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from kernels_catalog.fused_comm import evaluate_fused, infer_remote_accesses
from tsbatch.collectives.model import evaluate as eval_coll
from tsbatch.engine.evaluate import evaluate as eval_compute

GEMM = dict(system="dgx_h100", m=4096, n=4096, k=4096, dtype="float16", block_m=128, block_n=128,
            block_k=64, num_stages=3, num_warps=8)


def test_remote_accesses_follow_placement():
    acc = infer_remote_accesses("m", "n", "n")  # sequence-parallel column-linear
    assert acc[0] == {"collective": "all_gather", "tensor": "A", "when": "before", "elements": ("m", "k")}
    assert acc[-1]["local"] == {"m": False, "n": True, "k": False}
    acc = infer_remote_accesses("k", "k", "m")  # row-linear
    assert acc[0]["collective"] == "reduce_scatter" and acc[0]["when"] == "after"
    assert acc[-1]["local"]["k"]
    assert infer_remote_accesses("k", "k", None)[0]["collective"] == "all_reduce"
    assert len(infer_remote_accesses("m", None, "m")) == 1  # data parallel rows: local only


@pytest.mark.parametrize("family", ["ag_gemm", "gemm_rs"])
def test_one_chunk_is_compute_plus_comm(family):
    tp = 4
    out = evaluate_fused(pl.DataFrame([{**GEMM, "num_gpus": tp, "chunks": 1}]), family, eval_compute).row(0, named=True)
    if family == "ag_gemm":
        shape, coll, nbytes = (4096, 4096 // tp, 4096), "all_gather", 4096 * 4096 * 2
    else:
        shape, coll, nbytes = (4096, 4096, 4096 // tp), "reduce_scatter", 4096 * 4096 * 2
    g = eval_compute(pl.DataFrame([{"m": shape[0], "n": shape[1], "k": shape[2], "dtype": "float16",
                                    "block_m": 128, "block_n": 128, "block_k": 64, "num_stages": 3,
                                    "num_warps": 8}]), "h100_sxm", family="gemm")["latency_us"][0]
    c = eval_coll(pl.DataFrame({"system": ["dgx_h100"], "collective": [coll], "num_gpus": [tp],
                                "bytes": [nbytes]}))["latency_us"][0]
    assert out["compute_us"] == pytest.approx(g)
    assert out["comm_us"] == pytest.approx(c)
    assert out["latency_us"] == pytest.approx(g + c)
    assert out["overlap_pct"] == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize("family", ["ag_gemm", "gemm_rs"])
def test_chunked_envelope_bounds(family):
    df = pl.DataFrame([{**GEMM, "num_gpus": 8, "chunks": c} for c in (2, 4, 8)])
    out = evaluate_fused(df, family, eval_compute)
    assert out["feasible"].all()
    lat, comp, comm = (out[c].to_numpy() for c in ("latency_us", "compute_us", "comm_us"))
    cc, cm = out["chunk_compute_us"].to_numpy(), out["chunk_comm_us"].to_numpy()
    c = out["chunks"].to_numpy()
    # the pipeline can hide at most the shorter side, and never adds to the serial sum
    # beyond the SM contention of the overlapped chunks
    assert np.all(lat >= np.maximum(comp, comm) - 1e-9)
    assert np.all(lat >= cc + cm + (c - 1) * np.maximum(cc, cm) - 1e-9)
    assert np.all(lat <= (comp + comm) * 1.25)


def test_infeasible_partition_is_a_row_not_an_error():
    out = evaluate_fused(pl.DataFrame([{**GEMM, "num_gpus": 3, "chunks": 1},
                                       {**GEMM, "num_gpus": 4, "chunks": 3},
                                       {**GEMM, "system": "hgx_b200", "num_gpus": 16, "chunks": 1}]), "gemm_rs", eval_compute)
    assert not out["feasible"].any()
    r = out["infeasible_reason"].to_list()
    assert "divisible by num_gpus" in r[0] and "chunks" in r[1] and "nodes" in r[2]


def test_ulysses_runs_four_all_to_alls():
    row = dict(system="hgx_b200", batch=1, heads=32, seq_len=8192, head_dim=128, dtype="bfloat16",
               block_m=128, block_n=64, num_stages=2, num_warps=4, num_gpus=8, chunks=1)
    out = evaluate_fused(pl.DataFrame([row]), "ulysses", eval_compute).row(0, named=True)
    assert out["feasible"], out["infeasible_reason"]
    per = 1 * (8192 // 8) * (32 // 8) * 8 * 128 * 2  # a rank's send buffer for its heads
    a2a = eval_coll(pl.DataFrame({"system": ["hgx_b200"], "collective": ["all_to_all"], "num_gpus": [8],
                                  "bytes": [per]}))["latency_us"][0]
    assert out["comm_us"] == pytest.approx(4 * a2a)
    assert out["latency_us"] == pytest.approx(out["compute_us"] + 4 * a2a)


def test_moe_expert_parallel_dispatch_and_combine():
    from kernels_catalog.fused_comm import infer_moe_accesses

    acc = infer_moe_accesses("dp", "ep")
    assert [a["collective"] for a in acc] == ["all_to_all", "all_to_all"]
    assert [a["when"] for a in acc] == ["before", "after"]
    assert infer_moe_accesses("dp", None) == []
    row = dict(system="dgx_h100", tokens=2048, hidden=4096, ffn=1024, experts=32, top_k=4, dtype="bfloat16",
               block_m=64, block_n=128, block_k=64, num_stages=3, num_warps=4, num_gpus=8, chunks=1)
    out = evaluate_fused(pl.DataFrame([row]), "moe_ep", eval_compute).row(0, named=True)
    assert out["feasible"], out["infeasible_reason"]
    per = 2048 * 4 * 4096 * 2  # a rank's routed copies of its tokens
    a2a = eval_coll(pl.DataFrame({"system": ["dgx_h100"], "collective": ["all_to_all"], "num_gpus": [8],
                                  "bytes": [per]}))["latency_us"][0]
    rows = 2048 * 8 * 4 // 32  # uniform routing: rows per expert
    tiles = dict(dtype="bfloat16", block_m=64, block_n=128, block_k=64, num_stages=3, num_warps=4)
    g = eval_compute(pl.DataFrame([{"m": rows, "n": 1024, "k": 4096, **tiles},
                                   {"m": rows, "n": 4096, "k": 1024, **tiles}]), "h100_sxm", family="gemm")
    comp = (32 // 8) * g["latency_us"].sum()
    assert out["compute_us"] == pytest.approx(comp)
    assert out["comm_us"] == pytest.approx(2 * a2a)
    assert out["latency_us"] == pytest.approx(comp + 2 * a2a)
    bad = evaluate_fused(pl.DataFrame([{**row, "experts": 30}]), "moe_ep", eval_compute)
    assert not bad["feasible"][0] and "experts" in bad["infeasible_reason"][0]
