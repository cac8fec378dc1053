"""bench/coresident_pairs.py: which configurations it pairs, on synthetic predicted rows."""

from __future__ import annotations

import sys
from pathlib import Path

import polars as pl
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import coresident_pairs  # noqa: E402


def _row(m, stages, p, meas, pred, *, warps=4, sms=4):
    # 128 x 128 tiles over n = 256: two tile columns, m / 128 tile rows
    return {"m": m, "n": 256, "k": 8192, "dtype": "float16", "a_row_major": True,
            "b_row_major": False, "block_m": 128, "block_n": 128, "block_k": 64,
            "num_warps": warps, "group_m": 8, "num_stages": stages, "p": p,
            "meas": meas, "pred": pred, "sms": sms}


def test_pairs_match_one_wave_coresident_with_sequential_waves_only():
    rows = [
        # 6 tiles on 4 SMs: T = 2; p = 2 holds both at once, p = 1 runs two waves
        _row(384, 3, 2, 80.0, 110.0), _row(384, 5, 1, 100.0, 100.0),
        # 12 tiles: T = 3 > p = 2 for the 3-stage row: not co-resident, no pair
        _row(768, 3, 2, 150.0, 160.0), _row(768, 5, 1, 160.0, 150.0),
        # 4 tiles: T = 1, one tile an SM either way: no pair
        _row(256, 3, 2, 50.0, 60.0), _row(256, 5, 1, 40.0, 45.0),
        # the same problem at 8 warps: its own pair
        _row(384, 3, 2, 90.0, 120.0, warps=8), _row(384, 4, 1, 95.0, 100.0, warps=8),
    ]
    p = coresident_pairs.pairs(pl.DataFrame(rows)).sort("num_warps")
    assert p.height == 2
    assert p["T"].to_list() == [2, 2]
    assert p["tiles"].to_list() == [6, 6]
    assert p["stages_co"].to_list() == [3, 3] and p["stages_seq"].to_list() == [5, 4]
    assert p["meas_ratio"].to_list() == pytest.approx([0.8, 90.0 / 95.0])
    assert p["pred_ratio"].to_list() == pytest.approx([1.1, 1.2])
    s = coresident_pairs.summary(p.with_columns(gpu=pl.lit("h100")))
    assert s["pairs"].to_list() == [2] and s["problems"].to_list() == [1]
    assert s["same_order"].to_list() == [0.0]


def _step_row(m, stages, p, meas, pred, *, group_m=8, warps=4, sms=4, k=8192):
    r = _row(m, stages, p, meas, pred, warps=warps, sms=sms)
    r.update(k=k, group_m=group_m, tf32=False, backend="triton")
    return r


def test_steps_bins_tiles_per_sm_and_takes_the_fastest_group_m():
    # 128 x 128 tiles over n = 256 on 4 SMs; k = 8192: 128 K steps of 64
    rows = [
        # 4 tiles: one per SM (sub-wave bin "<= 1"), one round
        _step_row(256, 5, 1, 2.0 + 128 * 1.0, 0.0 + 2.0 + 128 * 2.0),
        # 6 tiles: 1.5 per SM ("1-2"), two rounds; the slower group_m is dropped
        _step_row(384, 3, 2, 2.0 + 2 * 128 * 0.5, 2.0 + 2 * 128 * 0.25),
        _step_row(384, 3, 2, 2.0 + 2 * 128 * 0.9, 2.0 + 2 * 128 * 0.1, group_m=1),
        # 12 tiles: 3 per SM ("2-4"), three rounds
        _step_row(768, 3, 2, 2.0 + 3 * 128 * 0.75, 2.0 + 3 * 128 * 1.5),
        # 40 tiles: 10 per SM ("> 4"), ten rounds
        _step_row(2560, 3, 2, 2.0 + 10 * 128 * 2.0, 2.0 + 10 * 128 * 1.0),
    ]
    s = coresident_pairs.steps(pl.DataFrame(rows), launch_us=2.0)
    three = s.filter(pl.col("num_stages") == 3)
    assert three["tiles_per_sm"].to_list() == ["1-2", "2-4", "> 4"]
    assert three["step"].to_list() == pytest.approx([0.5, 0.75, 2.0])
    assert three["pred_step"].to_list() == pytest.approx([0.25, 1.5, 1.0])
    assert three["problems"].to_list() == [1, 1, 1]
    one = s.filter(pl.col("num_stages") == 5)
    assert one["tiles_per_sm"].to_list() == ["<= 1"]
    assert one["step"].to_list() == pytest.approx([1.0])
    assert one["bias"].to_list() == pytest.approx([130.0 / 258.0])


def test_steps_all_tiles_per_shape_over_the_peak_step_with_the_model_columns():
    # two tile shapes on A100 (108 SMs); the model's iteration and bottleneck ride along
    from tsbatch.engine.evaluate import resolve_hw

    spec = resolve_hw("a100")
    rows = []
    for bk, meas, it, bneck in ((64, 100.0, 0.9, "tensor_core"), (32, 60.0, 0.5, "l2")):
        for j, b in enumerate((bneck, bneck, "latency")):
            r = _step_row(256, 3, 2, meas + j, meas, sms=spec.sm_count)
            r.update(block_k=bk, m=256 + 128 * j, t_iter=it + j, bottleneck=b)
            rows.append(r)
    out, peak, eff = coresident_pairs.step_table("a100", pl.DataFrame(rows), "all")
    assert peak != peak and eff != eff  # no single shape's peak step
    assert sorted(out["tile"].to_list()) == ["128x128x32", "128x128x64"]
    for bk in (32, 64):
        row = out.filter(pl.col("tile") == f"128x128x{bk}")
        pk = 2.0 * 128 * 128 * bk / (spec.tc_tflops("float16") * 1e12 / spec.sm_count) * 1e6
        assert row["step_pk"][0] == pytest.approx(row["step"][0] / pk)
        assert row["pred_pk"][0] == pytest.approx(row["pred_step"][0] / pk)
        assert row["problems"][0] == 3
    # the median of the model's iteration and the most common bottleneck
    assert out.filter(pl.col("tile") == "128x128x64")["model_iter"][0] == pytest.approx(1.9)
    assert out.filter(pl.col("tile") == "128x128x64")["bottleneck"][0] == "tensor_core"
    assert out.filter(pl.col("tile") == "128x128x32")["bottleneck"][0] == "l2"
    # one shape alone keeps its peak step and step at tc_efficiency
    one, pk1, eff1 = coresident_pairs.step_table("a100", pl.DataFrame(rows), "128x128x64")
    assert "model_iter" in one.columns and eff1 == pytest.approx(pk1 / spec.cal("tc_efficiency"))
