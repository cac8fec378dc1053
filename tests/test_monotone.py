"""More work never takes less time (bench/monotone.py): a Triton configuration's
grid grown one tile row at a time across the first three waves, and a library
call's K grown past an aligned K, on A100, H100 and H200. Two model changes of
session 4 broke this while the measured-data guard improved (a serial term for
one partial wave only; a per-tile library epilogue on single-step tiles)."""

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
