"""More work never takes less time (bench/monotone.py): a Triton configuration's
grid grown one tile row at a time across the first three waves, and a library
call's K grown past an aligned K, on A100, H100 and H200. Two model changes of
session 4 broke this while the measured-data guard improved (a serial term for
one partial wave only; a per-tile library epilogue on single-step tiles). And
the m / n sweeps' series that hold (library and Triton calls grown in m or n)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("monotone_bench", ROOT / "bench" / "monotone.py")
monotone = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(monotone)


@pytest.mark.parametrize("hw", ["a100", "h100", "h200"])
def test_adding_a_tile_never_shortens_the_grid(hw):
    from tsbatch.hw import get_hw

    falls = monotone.grid_falls(hw, get_hw(hw).sm_count, 1e-3)
    assert len(falls) == 0, falls


@pytest.mark.parametrize("hw", ["a100", "h100", "h200"])
def test_an_aligned_library_call_is_not_slower_than_a_longer_one(hw):
    falls = monotone.k_falls(hw, 1e-3)
    assert len(falls) == 0, falls


def test_the_checks_see_a_fall(monkeypatch):
    """Not blind: a model that prices aligned K above the next K, or a grid's
    last tile below the one before, is reported."""
    import polars as pl

    def aligned_dearer(df, hw):
        k = df["k"].cast(pl.Float64)
        return pl.DataFrame({"latency_us": k + 100.0 * (df["k"] % 8 == 0).cast(pl.Float64)})

    monkeypatch.setattr(monotone, "evaluate_table", aligned_dearer)
    assert len(monotone.k_falls("a100", 1e-3)) > 0

    def last_row_cheaper(df, hw):
        m = df["m"].cast(pl.Float64)
        return df.with_columns(pl.when(df["m"] == df["block_m"] * 150).then(1.0).otherwise(m)
                               .alias("latency_us"))

    monkeypatch.setattr(monotone, "evaluate_table", last_row_cheaper)
    assert len(monotone.grid_falls("a100", 108, 1e-3)) > 0


#: the m / n series the model keeps monotone on all three GPUs (bench/monotone.py
#: reports the others: grids gaining a tile row whose L2 reuse lowers the DRAM
#: bytes per tile, docs/gemm_accuracy.md "Library calls grown in m and n, session 5")
LIBRARY_MN_MONOTONE = [(1024, 1024), (4096, 4096)]
TRITON_MN_MONOTONE = [(1024, 4096)]


@pytest.mark.parametrize("hw", ["a100", "h100", "h200"])
def test_a_library_call_grown_in_m_or_n_is_not_faster(hw):
    """A library call grown in m or n by 16 (up to 1024, then by 256): the
    picked tile's edge tiles once lowered the grid's average tile and the
    prediction with it (these series fell at 8 sizes on A100, 23 on H100 and H200)."""
    falls = monotone.library_mn_falls(hw, 1e-3, shapes=LIBRARY_MN_MONOTONE)
    assert len(falls) == 0, falls


@pytest.mark.parametrize("hw", ["a100", "h100", "h200"])
def test_a_ragged_tile_row_never_shortens_a_triton_grid(hw):
    """One Triton configuration's problem grown in m or n by 16: a ragged last
    tile row or column adds work to the busiest SM (a whole tile), never less
    (these series fell at 86 sizes on A100, 144 on H100 and H200)."""
    falls = monotone.triton_mn_falls(hw, 1e-3, shapes=TRITON_MN_MONOTONE)
    assert len(falls) == 0, falls


def test_the_mn_checks_see_a_fall(monkeypatch):
    """Not blind: a model predicting a call 1 us faster once m passes 512, or a
    Triton grid faster where n is 528, is reported."""
    import polars as pl

    def step_down(df, hw):
        x = (df["m"] + df["n"]).cast(pl.Float64)
        return df.with_columns((x - 600.0 * (df["m"] > 512).cast(pl.Float64)).alias("latency_us"),
                               pl.lit("t").alias("library_tile"))

    monkeypatch.setattr(monotone, "evaluate_table", step_down)
    lib = monotone.library_mn_falls("a100", 1e-3, shapes=[(1024, 1024)])
    assert len(lib) > 0 and set(lib["axis"]) == {"m"}

    def dip(df, hw):
        x = (df["m"] + df["n"]).cast(pl.Float64)
        return df.with_columns((x - 100.0 * (df["n"] == 528).cast(pl.Float64)).alias("latency_us"))

    monkeypatch.setattr(monotone, "evaluate_table", dip)
    tri = monotone.triton_mn_falls("a100", 1e-3, shapes=[(1024, 4096)])
    assert len(tri) > 0 and set(tri["axis"]) == {"n"}
