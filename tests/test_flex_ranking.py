"""bench/flex_ranking.py: its residuals, its bins, and its K/V bound program, on synthetic rows."""

from __future__ import annotations

import sys
from pathlib import Path

import polars as pl
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import flex_ranking as fr  # noqa: E402


def _row(problem, block_m, meas, pred, *, seq_len=4096, head_dim=128, dtype="float16",
         waves=3.0, feasible=True):
    return {"_problem": problem, "block_m": block_m, "block_n": 64, "num_warps": 4,
            "seq_len": seq_len, "head_dim": head_dim, "dtype": dtype, "waves": waves,
            "measured_us": meas, "predicted_us": pred, "feasible": feasible}


def test_residual_is_the_ratio_over_the_problems_median_ratio():
    d = fr.with_residual(pl.DataFrame([
        _row(0, 32, 8.0, 10.0),    # ratio 0.8
        _row(0, 64, 10.0, 10.0),   # 1.0 (the median)
        _row(0, 128, 12.0, 10.0),  # 1.2
        _row(0, 16, 5.0, float("inf"), feasible=False),  # left out
        _row(1, 32, 20.0, 10.0),   # a problem of its own: residual 1
    ])).sort("_problem", "block_m")
    assert d.height == 4
    assert d["residual"].to_list() == pytest.approx([0.8, 1.0, 1.2, 1.0])
    assert d["ratio"].to_list() == pytest.approx([0.8, 1.0, 1.2, 2.0])


def test_head_share_bins_by_query_tiles_over_the_sms_and_by_waves():
    rows = [
        _row(0, 32, 8.0, 10.0, seq_len=4096),                # 128 tiles / 128 SMs: bin 0
        _row(0, 128, 10.0, 10.0, seq_len=4096),              # 32 / 128: bin -2
        _row(1, 32, 9.0, 10.0, seq_len=1024, waves=1.0),     # 32 / 128, one wave: bin -2
        _row(1, 64, 10.0, 10.0, seq_len=1024, waves=1.0),
        _row(2, 32, 9.0, 10.0, head_dim=32),                 # head_dim < 64: left out
        _row(3, 32, 9.0, 10.0, dtype="float32"),             # 32-bit: left out
    ]
    t = fr.by_head_share(pl.DataFrame(rows), sms=128)
    got = {(r["block_m"], r["launch"], r["share_log2"]): r["rows"] for r in t.iter_rows(named=True)}
    assert got == {(32, "more", 0): 1, (128, "more", -2): 1, (32, "one wave", -2): 1,
                   (64, "one wave", -3): 1}


def test_kv_bound_program_scales_only_k_and_v(tmp_path):
    # the bound's program differs from the shipped one in K's and V's bytes alone,
    # and loads; a change of those expressions in attention.toml stops the bench
    from kernels_catalog.catalog import PROGRAM_DIR

    fam = fr.kv_bound_family(tmp_path)
    assert fam is not None
    src = (Path(PROGRAM_DIR) / "attention.toml").read_text()
    out = (tmp_path / "attention_kv_bound.toml").read_text()
    assert src.count(fr.KV_BYTES) == 2 and out.count(fr.KV_BOUND) == 2
    assert out.replace(fr.KV_BOUND, fr.KV_BYTES) == src


def test_score_mod_table_is_the_median_ratio_per_node_count_over_the_fewest():
    rows = []
    for nodes, ratios in ((6, (1.0, 1.2, 1.1)), (9, (0.9, 1.0, 0.95))):
        for i, r in enumerate(ratios):
            rows.append({**_row(10 * nodes + i, 64, r * 10.0, 10.0), "score_mod_nodes": nodes,
                         "bucket": "<20us"})
    rows.append({**_row(99, 64, 20.0, 10.0), "score_mod_nodes": 8, "bucket": ">1ms"})
    t = fr.by_score_mod(pl.DataFrame(rows))
    got = {(r["bucket"], r["score_mod_nodes"]): (r["rows"], r["meas_pred"], r["vs_fewest"])
           for r in t.iter_rows(named=True)}
    assert got[("<20us", 6)] == (3, pytest.approx(1.1), pytest.approx(1.0))
    assert got[("<20us", 9)] == (3, pytest.approx(0.95), pytest.approx(0.95 / 1.1))
    # a bucket with one node count is its own baseline
    assert got[(">1ms", 8)] == (1, pytest.approx(2.0), pytest.approx(1.0))
