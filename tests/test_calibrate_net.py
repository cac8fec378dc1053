"""bench/calibrate_constants.py --tc-net: tc_efficiency net of the model's own step costs.

The reference-row rule is checked on a hand-made frame; the solver is checked
against the model itself: a row predicted at a chosen tc_efficiency, handed
back with that prediction as its "measured" time, must give the chosen value
back (the bisection inverts the model), and a time no value in (0, 1]
reaches gives None.
"""

from __future__ import annotations

import sys
from pathlib import Path

import polars as pl
import pytest

from tsbatch.engine.evaluate import evaluate
from tsbatch.hw import get_hw

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from calibrate_constants import net_tc_efficiency, reference_row, with_calibration  # noqa: E402


def _library_row(m: int, n: int, k: int, dtype: str = "bfloat16") -> pl.DataFrame:
    return pl.DataFrame({
        "m": [m], "n": [n], "k": [k], "dtype": [dtype], "a_row_major": [True], "b_row_major": [False],
        "tf32": [False], "backend": ["cublas"], "block_m": [None], "block_n": [None], "block_k": [None],
        "num_stages": [None], "num_warps": [None], "group_m": [None],
    }, schema_overrides={c: pl.Int32 for c in ("block_m", "block_n", "block_k", "num_stages",
                                               "num_warps", "group_m")})


def test_reference_row_is_the_fastest_in_tflops_among_the_dtypes():
    f = pl.DataFrame({
        "m": [4096, 1024, 8192, 8192], "n": [4096, 1024, 8192, 8192], "k": [4096, 1024, 8192, 8192],
        "dtype": ["float16", "bfloat16", "float32", "bfloat16"],
        # TFLOPS computed below: the float32 row is the fastest and not eligible
        "measured_us": [200.0, 2.0, 100.0, 1600.0],
    })
    tf = 2.0 * f["m"] * f["n"] * f["k"] / f["measured_us"] / 1e6
    r = reference_row(f, ("float16", "bfloat16"))
    eligible = [i for i in range(f.height) if f["dtype"][i] != "float32"]
    best = max(eligible, key=lambda i: tf[i])
    assert r.height == 1 and r["measured_us"][0] == f["measured_us"][best]
    assert r["tflops"][0] == pytest.approx(tf[best])
    assert tf.arg_max() == 2  # the ineligible float32 row is the fastest of all
    with pytest.raises(ValueError, match="float8"):
        reference_row(f, ("float8",))


@pytest.mark.parametrize("gpu,eff", [("h100", 0.7), ("h200", 0.9)])
def test_net_value_inverts_the_models_prediction(gpu, eff):
    hw0 = get_hw(gpu)
    row = _library_row(8192, 8192, 8192)
    t = float(evaluate(row, with_calibration(hw0, tc_efficiency=eff))["latency_us"][0])
    got = net_tc_efficiency(row, hw0, t)
    assert got == pytest.approx(eff, abs=1e-3)
    # a slower measurement needs a lower value, a faster one a higher value
    assert net_tc_efficiency(row, hw0, t * 1.05) < got < net_tc_efficiency(row, hw0, t * 0.97)


def test_no_value_when_the_model_is_too_slow_at_one():
    hw0 = get_hw("h100")
    row = _library_row(8192, 8192, 8192)
    t1 = float(evaluate(row, with_calibration(hw0, tc_efficiency=1.0))["latency_us"][0])
    assert net_tc_efficiency(row, hw0, 0.95 * t1) is None


def test_spread_takes_each_problems_fastest_configuration(tmp_path, monkeypatch):
    """A file whose "measured" times are the model's own at 0.7 gives 0.7 for
    every problem: a library problem measured three times (t, t, 1.3 t: the
    median of repeats counts) and a Triton problem in two configurations, the
    second timed slower than either prediction (the fastest counts)."""
    import calibrate_constants as cc

    hw0 = get_hw("h100")
    lib = pl.concat([_library_row(8192, 8192, 8192)] * 3)
    tri = pl.concat([_library_row(4096, 14336, 4096, "float16")] * 2).with_columns(
        pl.lit("triton").alias("backend"), pl.Series("block_m", [128, 64], dtype=pl.Int32),
        pl.Series("block_n", [128, 128], dtype=pl.Int32), pl.Series("block_k", [64, 64], dtype=pl.Int32),
        pl.Series("num_stages", [4, 3], dtype=pl.Int32), pl.Series("num_warps", [4, 4], dtype=pl.Int32),
        pl.Series("group_m", [8, 8], dtype=pl.Int32))
    hw7 = with_calibration(hw0, tc_efficiency=0.7)
    t_lib = float(evaluate(lib.head(1), hw7)["latency_us"][0])
    t_tri = evaluate(tri, hw7)["latency_us"].to_numpy()
    times = [t_lib, 1.3 * t_lib, t_lib, t_tri[0], 1.5 * t_tri.max()]
    f = pl.concat([lib, tri]).with_columns(pl.Series("time_ms", [t / 1e3 for t in times]),
                                           pl.lit("h100").alias("gpu"))
    path = tmp_path / "h100_tiny.parquet"
    f.write_parquet(path)
    monkeypatch.setitem(cc.TC_FILES, "h100", (str(path), ("float16", "bfloat16")))
    got = cc.net_spread("h100", min_us=1.0, tol=1e-4)
    assert sorted(got) == ["cublas", "triton"]
    assert got["cublas"].shape == (1,) and got["triton"].shape == (1,)
    assert got["cublas"][0] == pytest.approx(0.7, abs=1e-3)
    assert got["triton"][0] == pytest.approx(0.7, abs=1e-3)
    # a floor above both problems leaves none
    assert all(v.size == 0 for v in cc.net_spread("h100", min_us=2.0 * t_lib + 2.0 * t_tri.max()).values())
