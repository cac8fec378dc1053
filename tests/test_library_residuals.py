"""bench/library_residuals.py: its per-bucket summary, on synthetic pairs."""

from __future__ import annotations

import sys
from pathlib import Path

import polars as pl
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import library_residuals as L  # noqa: E402


def _pair(best, lib_meas, lib_pred, tri_meas, tri_pred, m=64, dtype="float16"):
    return {"file": "f", "_hw": "a100", "m": m, "n": 512, "k": 256, "dtype": dtype,
            "a_row_major": True, "b_row_major": False, "_best": best,
            "lib_meas": lib_meas, "lib_pred": lib_pred, "tri_meas": tri_meas, "tri_pred": tri_pred}


def _frame(rows):
    j = pl.DataFrame(rows)
    return j.with_columns(
        bucket=L.bucket_expr("_best"),
        lib_res=pl.col("lib_meas") - pl.col("lib_pred"),
        tri_res=pl.col("tri_meas") - pl.col("tri_pred"),
        raw=pl.col("lib_meas") - pl.col("tri_meas"),
    ).with_columns(lib_only=pl.col("lib_res") - pl.col("tri_res"))


def test_library_only_excess_is_net_of_the_triton_error():
    # library 3 us slow, the best Triton kernel 1 us slow: 2 us are the library's own
    j = _frame([_pair(10.0, 13.0, 10.0, 11.0, 10.0, m=64),
                _pair(12.0, 16.0, 12.0, 13.0, 12.0, m=65),   # 4 - 1 = 3
                _pair(500.0, 520.0, 500.0, 500.0, 500.0, m=66)])
    s = L.summary(j, ["file", "_hw", "bucket"])
    assert s["bucket"].to_list() == ["<20us", "0.1-1ms"]   # time order, empty buckets absent
    small = s.row(0, named=True)
    assert (small["rows"], small["problems"]) == (2, 2)
    assert small["lib_only"] == pytest.approx(2.5)
    assert small["lib_res"] == pytest.approx(3.5)
    assert small["raw"] == pytest.approx(2.5)
    big = s.row(1, named=True)
    assert (big["lib_only"], big["tri_res"]) == (20.0, 0.0)


def test_buckets_sort_in_time_order_not_by_name():
    j = _frame([_pair(t, t, t, t, t, m=i) for i, t in enumerate((2000.0, 50.0, 500.0, 5.0))])
    assert L.summary(j, ["bucket"])["bucket"].to_list() == ["<20us", "20-100us", "0.1-1ms", ">1ms"]
