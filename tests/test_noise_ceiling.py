"""The measured data scored against themselves (bench/noise_ceiling.py) and the
repeat halves of ``load_measured(repeats=...)`` it is built on."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import polars as pl
import pytest

from tsbatch.errors import InputError
from tsbatch.measured.accuracy import load_measured

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import noise_ceiling as nc  # noqa: E402


def _gemm_file(path: Path, times: dict) -> Path:
    """A Triton GEMM file: ``times`` maps (m, block_m) to the repeats' times (ms), in
    file order; each problem (m) with two tile configurations (block_m 64, 128)."""
    rows = []
    for (m, bm), ts in times.items():
        for t in ts:
            rows.append(dict(m=m, n=1024, k=1024, dtype="float16", a_row_major=True, b_row_major=False,
                             tf32=False, backend="triton", block_m=bm, block_n=64, block_k=32,
                             num_stages=3, num_warps=4, group_m=8, time_ms=t))
    # interleave the configurations' repeats, as a collection that loops over repeats would
    frame = pl.DataFrame(rows).with_row_index("_i")
    frame = frame.with_columns(_r=pl.int_range(pl.len()).over("m", "block_m")).sort("_r", "_i").drop("_r", "_i")
    frame.write_parquet(path)
    return path


def test_repeat_halves_split_the_repeats_in_file_order(tmp_path):
    f = _gemm_file(tmp_path / "a100_x.parquet",
                   {(512, 64): [1.0, 5.0, 3.0], (512, 128): [2.0, 2.0], (640, 64): [4.0]})

    def got(rep):
        fr = pl.concat(load_measured([f], repeats=rep).frames["gemm"])
        return {(r["m"], r["block_m"]): r["measured_us"] for r in fr.to_dicts()}

    assert got("even") == {(512, 64): 2000.0, (512, 128): 2000.0, (640, 64): 4000.0}  # 1st and 3rd
    assert got("odd") == {(512, 64): 5000.0, (512, 128): 2000.0}  # 2nd; measured once: no odd half
    assert got(None) == {(512, 64): 3000.0, (512, 128): 2000.0, (640, 64): 4000.0}
    with pytest.raises(InputError, match="repeats must be"):
        load_measured([f], repeats="first")


def test_identical_halves_score_perfectly_and_noisy_ones_do_not(tmp_path):
    """Five configurations per problem (the metrics rank units of five or more)."""
    bms, scale = (16, 32, 64, 128, 256), (2.0, 1.0, 1.5, 1.2, 3.0)
    problems = ((512, 1.0), (640, 2.0), (768, 3.0))
    same = _gemm_file(tmp_path / "a100_same.parquet",
                      {(m, bm): [base * f, base * f] for m, base in problems for bm, f in zip(bms, scale)})
    fig = nc.figures(nc.halves(same), min_problems=3)
    whole = fig.filter(pl.col("slice") == "all").to_dicts()[0]
    assert whole["problems"] == 3 and whole["rows"] == 15
    assert whole["mape_pct"] == 0.0 and whole["bias"] == 1.0 and whole["spearman"] == 1.0
    assert whole["top5_retention_pct"] == 100.0
    assert nc.ceiling(1.0) == 1.0 and nc.ceiling(None) is None and nc.ceiling(-0.2) is None
    assert math.isclose(nc.ceiling(0.5), math.sqrt(2 / 3))
    # the second repeat ranks each problem's configurations the other way round
    flip = _gemm_file(tmp_path / "a100_flip.parquet",
                      {(m, bm): [base * f, base * (4.0 - f)] for m, base in problems
                       for bm, f in zip(bms, scale)})
    w = nc.figures(nc.halves(flip), min_problems=3).filter(pl.col("slice") == "all").to_dicts()[0]
    assert w["spearman"] == -1.0 and w["mape_pct"] > 20 and w["top5_retention_pct"] < 100


def test_a_file_without_repeats_has_nothing_to_split(tmp_path, capsys):
    once = _gemm_file(tmp_path / "a100_once.parquet", {(512, 64): [1.0], (512, 128): [2.0]})
    assert nc.halves(once) is None
    assert nc.main([str(once)]) == 0
    assert "no configuration measured twice" in capsys.readouterr().out


def test_bad_input_is_one_clear_error(tmp_path, capsys):
    assert nc.main([str(tmp_path / "missing.parquet")]) == 2
    assert "missing.parquet: no such file" in capsys.readouterr().err
    f = _gemm_file(tmp_path / "a100_y.parquet", {(512, 64): [1.0, 1.1], (512, 128): [2.0, 2.1]})
    bad = tmp_path / "scored.parquet"
    pl.DataFrame({"x": [1]}).write_parquet(bad)
    assert nc.main([str(f), "--scored", str(bad)]) == 2
    assert "not a scored file" in capsys.readouterr().err


@pytest.mark.skipif(not (nc.data_root() / nc.DEFAULT_FILES[0]).exists(), reason="needs ../shared/data")
def test_the_shared_files_split_into_halves():
    """The AutoHeuristic files hold repeats: each half scores the other within a few
    per cent, ranks within 0.9 on the kernels of 20 us and more."""
    fig = nc.figures(nc.halves(nc.data_root() / nc.DEFAULT_FILES[1]), min_problems=3)
    tri = fig.filter((pl.col("backend") == "triton") & (pl.col("slice") == "all"))
    assert tri.height >= 3
    assert (tri["mape_pct"] < 5).all() and (tri["spearman"] > 0.9).all()
