"""bench/dram_streams.py: the tables it reads off a GEMM file, on synthetic rows."""

from __future__ import annotations

import sys
from pathlib import Path

import polars as pl
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import dram_streams  # noqa: E402


def _rows(rate_meas: float, rate_pred: float, c_meas: float, c_pred: float) -> pl.DataFrame:
    """Three skinny fp16 problems, DRAM-bound in the model, whose times are a line in their MB,
    plus a compute-bound problem that the marginal-rate line must leave out."""
    probs = [(8, 65536, 4096), (16, 131072, 4096), (8, 262144, 8192), (4096, 4096, 4096)]
    out = []
    for m, n, k in probs:
        mb = (m * k + k * n + m * n) * 2 / 1e6
        dram = m != 4096
        out.append({"m": m, "n": n, "k": k, "dtype": "float16", "tf32": False, "backend": "triton",
                    "feasible": True, "bottleneck": "dram" if dram else "tensor_core",
                    "util_dram": 0.95 if dram else 0.1, "dram_bytes": mb * 1e6, "t_launch_us": 4.0,
                    "measured_us": c_meas + mb / rate_meas, "latency_us": c_pred + mb / rate_pred})
    r = pl.DataFrame(out)
    return r.with_columns(
        pl.lit("float16").alias("label"),
        (pl.col("measured_us") / pl.col("latency_us")).alias("ratio"),
        (pl.col("dram_bytes") / (pl.col("measured_us") - pl.col("t_launch_us")) / 1e6).alias("meas_tbps"),
        (pl.col("dram_bytes") / (pl.col("latency_us") - pl.col("t_launch_us")) / 1e6).alias("pred_tbps"),
        (pl.col("dram_bytes") / 1e6).alias("mb"),
        pl.col("dram_bytes").log10().floor().cast(pl.Int64).alias("log10_bytes"))


def test_marginal_rate_is_the_slope_not_the_constant():
    t = dram_streams.tables(_rows(2.3, 2.7, 20.0, 8.0), min_mb=1.0)
    line = t["t = c + MB / rate through those rows"]["triton"]
    assert line["problems"] == 3  # the tensor-core-bound problem is not a stream
    assert line["measured"]["rate_tbps"] == pytest.approx(2.3, rel=1e-9)
    assert line["predicted"]["rate_tbps"] == pytest.approx(2.7, rel=1e-9)
    assert line["measured"]["c_us"] == pytest.approx(20.0, abs=1e-6)
    assert line["predicted"]["c_us"] == pytest.approx(8.0, abs=1e-6)


def test_by_size_counts_only_dram_rows():
    t = dram_streams.tables(_rows(2.3, 2.7, 20.0, 8.0), min_mb=1.0)
    by = t["by backend, dtype, decade of DRAM bytes (model bottleneck dram)"]
    assert by["rows"].sum() == 3
    best = t["fastest row per problem where DRAM-bound (rates over A + B + C once, time net of launch)"]
    assert best.height == 3 and (best["ratio"] > 1).all()


def test_too_few_problems_give_no_line():
    t = dram_streams.tables(_rows(2.3, 2.7, 20.0, 8.0), min_mb=1e4)
    assert t["t = c + MB / rate through those rows"] == {}


def test_in_flight_counts_running_tiles_stages_and_in_bounds_rows():
    # m = 8 on a 16-row tile: 8 in-bounds rows; n = 4096 / 64 = 64 tiles, all running on 132 SMs;
    # 3 stages ahead of 8 + 64 rows x 128 x 2 bytes = 64 x 3 x 18,432 B = 3.54 MB in flight
    base = {"k": 4096, "dtype": "float16", "label": "float16", "backend": "triton", "bottleneck": "dram",
            "block_m": 16, "block_n": 64, "block_k": 128, "num_stages": 4, "resident_tiles": 1, "sms": 132,
            "ratio": 1.2, "meas_tbps": 2.0}
    rows = [dict(base, m=8, n=4096, mb=10.0),
            # 2048 tiles on 132 SMs x 2 resident: 264 running, the larger stream class
            dict(base, m=8, n=131072, mb=500.0, resident_tiles=2, ratio=1.0),
            # not skinny, and not DRAM-bound: left out
            dict(base, m=4096, n=4096, mb=100.0),
            dict(base, m=8, n=4096, mb=10.0, bottleneck="tensor_core")]
    t = dram_streams.in_flight(pl.DataFrame(rows), skinny=64)
    assert t["rows"].sum() == 2
    small = t.filter(pl.col("stream") == "< 200 MB")
    assert small["in_flight"].item() == "[2, 4)"  # 3.54 MB
    large = t.filter(pl.col("stream") == ">= 200 MB")
    assert large["in_flight"].item() == "[8, 16)"  # 264 x 3 x 18,432 B = 14.6 MB
    assert large["meas/pred"].item() == pytest.approx(1.0)


def test_in_flight_without_tile_columns_is_empty():
    assert dram_streams.in_flight(_rows(2.3, 2.7, 20.0, 8.0), skinny=64).is_empty()
