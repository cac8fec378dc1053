"""bench/latency_bound_rows.py: which rows it selects and how it tabulates them, on synthetic rows."""

from __future__ import annotations

import sys
from pathlib import Path

import polars as pl
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import latency_bound_rows as lbr  # noqa: E402


def _row(m, n, k, bk, bottleneck, waves, meas, pred, *, path="mma_sync", l2_hit=0.5, sms=4):
    return {"gpu": "h100", "m": m, "n": n, "k": k, "block_m": 32, "block_n": 64, "block_k": bk,
            "num_warps": 4, "num_stages": 3, "mma_path": path, "bottleneck": bottleneck,
            "waves": waves, "meas": meas, "latency_us": pred, "l2_hit": l2_hit, "sms": sms}


def test_select_keeps_latency_bound_single_wave_long_k_rows_only():
    d = lbr.with_shape(pl.DataFrame([
        _row(32, 128, 1024, 32, "latency", 1, 11.0, 10.0),      # 2 tiles, 32 K steps: kept
        _row(32, 128, 1024, 32, "latency", 2, 11.0, 10.0),      # two waves: not kept
        _row(32, 128, 1024, 32, "tensor_core", 1, 11.0, 10.0),  # not latency-bound
        _row(32, 128, 224, 32, "latency", 1, 11.0, 10.0),       # 7 K steps < 8
        _row(32, 128, 225, 32, "latency", 1, 11.0, 10.0),       # 8 K steps (a partial one)
    ]))
    assert d["tiles"].to_list() == [2] * 5
    assert d["ksteps"].to_list() == [32, 32, 32, 7, 8]
    s = lbr.select(d, 8)
    assert s["k"].to_list() == [1024, 225]
    assert lbr.select(d, 9)["k"].to_list() == [1024]


def test_table_medians_mape_and_problem_counts():
    d = pl.DataFrame([
        _row(32, 128, 1024, 32, "latency", 1, 12.0, 10.0),
        _row(32, 128, 1024, 64, "latency", 1, 9.0, 10.0),
        _row(64, 128, 1024, 32, "latency", 1, 10.0, 10.0, path="wgmma"),
    ])
    t = lbr.table(d, ["gpu", "mma_path"])
    assert t["mma_path"].to_list() == ["mma_sync", "wgmma"]
    assert t["rows"].to_list() == [2, 1]
    assert t["problems"].to_list() == [1, 1]
    assert t["meas_over_pred"].to_list() == pytest.approx([1.05, 1.0])
    # |10/12 - 1| = 16.67 %, |10/9 - 1| = 11.11 %
    assert t["mape"].to_list() == pytest.approx([(100 / 6 + 100 / 9) / 2, 0.0])


def test_hit_table_buckets_latency_bound_rows_by_l2_hit_and_grid():
    d = lbr.with_shape(pl.DataFrame([
        _row(32, 128, 1024, 32, "latency", 1, 11.0, 10.0, l2_hit=0.05),        # 2 tiles <= 4 SMs
        _row(32, 128, 1024, 32, "latency", 1, 13.0, 10.0, l2_hit=0.10),        # edge: <= 0.1
        _row(320, 640, 1024, 32, "latency", 3, 9.0, 10.0, l2_hit=0.95),        # 100 tiles > 4 SMs
        _row(320, 640, 1024, 32, "tensor_core", 3, 9.0, 10.0, l2_hit=0.95),    # not latency-bound
    ]))
    t = lbr.hit_table(d)
    assert t["one_tile_per_sm"].to_list() == [False, True]
    assert t["l2_hit_bucket"].to_list() == ["> 0.9", "<= 0.1"]
    assert t["rows"].to_list() == [1, 2]
    assert t["meas_over_pred"].to_list() == pytest.approx([0.9, 1.2])
