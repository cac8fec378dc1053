"""bench/calibrate_constants.py --shared: every family that shares a GPU's constants, split as cross_validate.

Checked on a hand-made data folder (a GEMM file of two GPUs and an attention
file, synthetic times): only the chosen GPU's rows are loaded, problem ids are
unique over the files, float32 rows with ``tf32`` are labelled apart; the split
puts every row of a problem in one half and caps the searched problems per
stratum; the scored groups are file x dtype x backend and the objective is
their mean MAPE, which moves when a shared constant does.
"""

from __future__ import annotations

import sys
from pathlib import Path

import polars as pl
import pytest

from tsbatch.hw import get_hw

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from calibrate_constants import (  # noqa: E402
    SHARED_KEYS, load_shared, score_shared, shared_objective, split_shared, with_calibration)


def _gemm(gpu: str, shapes, dtype: str, tf32: bool = False) -> pl.DataFrame:
    rows = []
    for m, n, k in shapes:
        for bm, bn, w in ((64, 64, 4), (128, 64, 4), (64, 128, 4), (128, 128, 8), (32, 64, 2)):
            rows.append({"gpu": gpu, "m": m, "n": n, "k": k, "dtype": dtype, "a_row_major": True,
                         "b_row_major": True, "tf32": tf32, "backend": "triton", "block_m": bm, "block_n": bn,
                         "block_k": 32, "num_stages": 3, "num_warps": w, "group_m": 8,
                         "time_ms": 1e-9 * m * n * k * (1.0 + 0.01 * w)})
        rows.append({"gpu": gpu, "m": m, "n": n, "k": k, "dtype": dtype, "a_row_major": True,
                     "b_row_major": True, "tf32": tf32, "backend": "cublas", "block_m": None, "block_n": None,
                     "block_k": None, "num_stages": None, "num_warps": None, "group_m": None,
                     "time_ms": 0.9e-9 * m * n * k})
    return pl.DataFrame(rows, schema_overrides={c: pl.Int32 for c in ("block_m", "block_n", "block_k",
                                                                      "num_stages", "num_warps", "group_m")})


def _attention(gpu: str) -> pl.DataFrame:
    rows = []
    for b, s in ((1, 512), (2, 1024), (4, 512), (1, 2048)):
        for bm, bn in ((64, 64), (128, 64), (64, 32), (32, 32), (128, 32)):
            rows.append({"gpu": gpu, "batch": b, "heads": 8, "seq_len": s, "head_dim": 64, "dtype": "float16",
                         "score_mod_nodes": 0, "block_m": bm, "block_n": bn, "num_stages": 3, "num_warps": 4,
                         "time_ms": 1e-6 * b * s * s / 64 + 0.01})
    return pl.DataFrame(rows, schema_overrides={c: pl.Int32 for c in ("block_m", "block_n", "num_stages",
                                                                      "num_warps", "score_mod_nodes")})


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    r = tmp_path_factory.mktemp("shared")
    (r / "gemm").mkdir()
    (r / "attention").mkdir()
    shapes = [(512 * i, 1024, 256 * j) for i in (1, 2, 3) for j in (1, 2)]
    pl.concat([_gemm("a100", shapes, "float16"), _gemm("a100", shapes[:4], "float32", tf32=True),
               _gemm("h100", shapes, "float16")]).write_parquet(r / "gemm" / "x_triton_mm.parquet")
    _gemm("a100", shapes[:2], "bfloat16").write_parquet(r / "gemm" / "y_mm.parquet")
    _attention("a100").write_parquet(r / "attention" / "z_flex.parquet")
    return r


def test_load_keeps_one_gpu_and_makes_problems_unique(root):
    d = load_shared("a100", str(root))
    assert set(d["_hw"].unique()) == {get_hw("a100").key}
    per_set = d.group_by("set", "label").agg(pl.col("_problem").n_unique()).sort("set", "label")
    assert per_set.rows() == [("x_triton_mm", "float16", 6), ("x_triton_mm", "tf32", 4),
                              ("y_mm", "bfloat16", 2), ("z_flex", "float16", 4)]
    # one problem never spans two files or two dtype labels
    assert d.group_by("_problem").agg(pl.col("set").n_unique(), pl.col("label").n_unique()) \
        .select(pl.col("set").max(), pl.col("label").max()).row(0) == (1, 1)
    assert set(d.filter(pl.col("set") == "z_flex")["backend"]) == {"attention"}


def test_split_keeps_problems_whole_and_caps_the_search(root):
    d = split_shared(load_shared("a100", str(root)), seed=0, problems=1)
    assert d.group_by("_problem").agg(pl.col("half").n_unique())["half"].max() == 1
    counts = d.group_by("set", "label").agg(
        (pl.col("_problem").filter(pl.col("half") == "fit").n_unique()).alias("fit"),
        (pl.col("_problem").filter(pl.col("half") == "held").n_unique()).alias("held"),
        (pl.col("_problem").filter(pl.col("searched")).n_unique()).alias("searched"))
    for r in counts.iter_rows(named=True):
        assert r["fit"] <= r["held"] <= r["fit"] + 1
        assert r["searched"] == min(1, r["fit"])
    assert d.filter(pl.col("searched"))["half"].unique().to_list() == ["fit"]
    again = split_shared(load_shared("a100", str(root)), seed=0, problems=1)
    assert again.sort("_problem", "measured_us")["half"].equals(d.sort("_problem", "measured_us")["half"])


def test_score_groups_and_objective(root):
    d = load_shared("a100", str(root))
    hw = get_hw("a100")
    m = score_shared(d, hw)
    keys = set(map(tuple, m.select(SHARED_KEYS).rows()))
    assert keys == {("x_triton_mm", "float16", "triton"), ("x_triton_mm", "float16", "cublas"),
                    ("x_triton_mm", "tf32", "triton"), ("x_triton_mm", "tf32", "cublas"),
                    ("y_mm", "bfloat16", "triton"), ("y_mm", "bfloat16", "cublas"),
                    ("z_flex", "float16", "attention")}
    assert shared_objective(m) == pytest.approx(float(m["mape_pct"].mean()))
    assert (m["bias"] > 0).all()
    # a shared loop constant moves the attention family and the GEMMs alike
    far = score_shared(d, with_calibration(hw, mem_latency_us=5.0))
    both = m.join(far, on=SHARED_KEYS, suffix="_far")
    moved = both.filter((pl.col("mape_pct") - pl.col("mape_pct_far")).abs() > 1e-6)
    assert {"attention", "triton"} <= set(moved["backend"])


def test_bucket_objective_counts_slices_of_three_problems_or_more(root):
    from calibrate_constants import MIN_SLICE_PROBLEMS

    d = load_shared("a100", str(root))
    m = score_shared(d, get_hw("a100"), by_bucket=True)
    assert "bucket" in m.columns and m["bucket"].null_count() == 0
    # every problem sits in one bucket: the slices' problems add up to the groups'
    whole = score_shared(d, get_hw("a100"))
    per = m.group_by(SHARED_KEYS).agg(pl.col("problems").sum())
    assert per.join(whole.select(*SHARED_KEYS, "problems"), on=SHARED_KEYS, suffix="_g") \
        .select((pl.col("problems") == pl.col("problems_g")).all()).item()
    kept = m.filter(pl.col("problems") >= MIN_SLICE_PROBLEMS)
    assert 0 < kept.height < m.height  # the hand-made data has slices on both sides of the floor
    assert shared_objective(m) == pytest.approx(float(kept["mape_pct"].mean()))
