"""bench/unit_retention.py: its per-unit retention against tsbatch.measured.metrics, on synthetic rows."""

from __future__ import annotations

import sys
from pathlib import Path

import polars as pl
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import unit_retention  # noqa: E402

from tsbatch.measured.metrics import accuracy_metrics  # noqa: E402


def _unit(uid, measured, pred_ref, pred_new, feasible_new=None):
    n = len(measured)
    return pl.DataFrame({
        "_unit": [uid] * n, "_problem": [uid] * n,
        "gpu": ["h100_sxm"] * n, "dtype": ["bfloat16"] * n, "backend": ["triton"] * n,
        "file": ["f.parquet"] * n, "bucket": ["20-100us"] * n, "layout": ["A:col B:row"] * n,
        "m": [128] * n, "n": [256] * n, "k": [512] * n,
        "block_m": list(range(16, 16 * (n + 1), 16)), "block_n": [64] * n, "block_k": [32] * n,
        "num_stages": [3] * n, "num_warps": [4] * n, "group_m": [8] * n,
        "measured_us": [float(x) for x in measured],
        "pred_ref": [float(x) for x in pred_ref], "pred_new": [float(x) for x in pred_new],
        "feasible_ref": [True] * n,
        "feasible_new": feasible_new if feasible_new is not None else [True] * n,
    })


def _metric(frame, side):
    scored = frame.rename({f"pred_{side}": "predicted_us", f"feasible_{side}": "feasible"})
    return accuracy_metrics(scored)["top5_retention_pct"][0]


def test_tie_broken_by_the_larger_measured_time_as_the_metric_does():
    # 21 configurations keep 2; the new side ties the three fastest predictions
    measured = [10.0, 12.0, 15.0] + [30.0 + i for i in range(18)]
    ref = [1.0, 2.0, 3.0] + [50.0 + i for i in range(18)]
    new = [1.0, 1.0, 1.0] + [50.0 + i for i in range(18)]
    u = _unit(1, measured, ref, new)
    assert unit_retention.retention(u, "pred_ref", "feasible_ref") == pytest.approx(100.0)
    # pessimistic: 15 and 12 kept -> 10 / 12
    got = unit_retention.retention(u, "pred_new", "feasible_new")
    assert got == pytest.approx(100.0 * 10.0 / 12.0)
    assert got == pytest.approx(_metric(u, "new"))
    # the opposite rule keeps 10 and 12
    assert unit_retention.retention(u, "pred_new", "feasible_new", pessimistic=False) == \
        pytest.approx(100.0)


def test_infeasible_rows_rank_last_and_units_average_like_the_metric():
    u1 = _unit(1, [10.0, 20.0, 30.0], [3.0, 2.0, 1.0], [1.0, 2.0, 3.0],
               feasible_new=[False, True, True])
    u2 = _unit(2, [5.0, 6.0], [1.0, 2.0], [2.0, 1.0])
    both = pl.concat([u1, u2])
    # u1 new: the measured-best row is infeasible (+inf): kept 20 -> 50 %
    assert unit_retention.retention(u1, "pred_new", "feasible_new") == pytest.approx(50.0)
    for side in ("ref", "new"):
        mean = sum(unit_retention.retention(u, f"pred_{side}", f"feasible_{side}")
                   for u in (u1, u2)) / 2
        assert mean == pytest.approx(_metric(both, side))


def test_main_prints_the_moved_unit_and_checks_itself(tmp_path, capsys):
    measured = [10.0, 12.0, 15.0] + [30.0 + i for i in range(18)]
    u = _unit(7, measured, [1.0, 2.0, 3.0] + [50.0 + i for i in range(18)],
              [9.0, 1.0, 2.0] + [50.0 + i for i in range(18)])
    base = u.drop("pred_ref", "pred_new", "feasible_ref", "feasible_new")
    base.with_columns(predicted_us=u["pred_ref"], feasible=u["feasible_ref"]).write_parquet(
        tmp_path / "scored_ref.parquet")
    base.with_columns(predicted_us=u["pred_new"], feasible=u["feasible_new"]).write_parquet(
        tmp_path / "scored_new.parquet")
    assert unit_retention.main([str(tmp_path), "--gpu", "h100_sxm", "--dtype", "bfloat16"]) == 0
    out = capsys.readouterr().out
    assert "ref 100.00 -> new 83.33" in out
    assert "unit 7:" in out and "keeps 2: 100.00 -> 83.33" in out
