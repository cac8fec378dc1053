"""The chip-level floor of Hopper's L1.5 tier (tsbatch.kernels.envelope.l15_chip_floor,
applied by evaluate_plan; its twin and hand test: tests/test_kernels.py):
the grid's requested bytes plus its DRAM fills at the tier's chip rate, after one
latency and the launch (docs/gemm_accuracy.md, "Hopper L1.5 fills as a chip floor,
session 6")."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from kernels_catalog import gemm
from tsbatch.boundary.schema import validate
from tsbatch.engine import evaluate as ev
from tsbatch.hw import get_hw
from tsbatch.kernels.envelope import R_L15

#: an H100 Triton row the floor holds (8192 x 8192 x 4096 on 64 x 128 x 64 / 3
#: stages / 4 warps: 8192 tiles, 62 waves, L1.5-bound with a DRAM share ~0.1)
ROW = dict(m=8192, n=8192, k=4096, block_m=64, block_n=128, block_k=64, num_stages=3,
           num_warps=4, split_k=1, dtype="float16", a_row_major=True, b_row_major=False,
           tf32=False)


def _lower(hw, **row):
    cols, _ = validate(pl.DataFrame([row]), gemm.FAMILY)
    cols = dict(cols)
    cols["backend"] = np.array(["triton"], dtype=object)
    return gemm.lower(cols, get_hw(hw))


def _off(monkeypatch, plan, spec):
    """The model without the floor (evaluate_envelopes without ``l15_avg``)."""
    inner = ev.evaluate_envelopes

    def without(*a, l15_avg=None, **kw):
        return inner(*a, **kw)

    with monkeypatch.context() as mp:
        mp.setattr(ev, "evaluate_envelopes", without)
        return ev.evaluate_plan(plan, spec)


@pytest.mark.parametrize("m", [8192, 8160])
@pytest.mark.parametrize("hw", ["h100", "h200"])
def test_floor_holds_a_long_l15_bound_grid(hw, m, monkeypatch):
    """The row's time is the grid's total L1.5 requests (its average tile's bytes
    a step times the steps and tiles) plus its DRAM bytes at the chip's L1.5 rate,
    plus one latency and the launch, above the envelope without it; the raise
    is in the loop's phase. With a ragged last tile row (m = 8160) the totals are
    still the average tile's, not the whole tiles' the busiest SM is priced with
    (the edge split writes into its work matrix: the floor keeps its own)."""
    spec = get_hw(hw)
    plan = _lower(hw, **dict(ROW, m=m))
    assert (plan.t_crit is not None) == (m % ROW["block_m"] != 0)
    on = ev.evaluate_plan(plan, spec)
    off = _off(monkeypatch, plan, spec)
    tiles = float(plan.g0[0] * plan.g1[0] * plan.g2[0])
    req = float(np.where(plan.t_per_step[0] != 0, plan.t_bytes[0], 0.0).sum())
    l15_tot = tiles * (plan.ksteps[0] * req + plan.work_epi[0, R_L15])
    chip = spec.l15_bw_tbps * 1e6  # B/us
    assert plan.rate[0, R_L15] * spec.sm_count == pytest.approx(chip, rel=1e-12)
    want = plan.launch_us[0] + plan.lat_us[0] + (l15_tot + on["dram_bytes"][0]) / chip
    assert on["latency_us"][0] == pytest.approx(want, rel=1e-9)
    assert on["latency_us"][0] > off["latency_us"][0] * 1.01
    assert on["t_steady_us"][0] - off["t_steady_us"][0] == pytest.approx(
        on["latency_us"][0] - off["latency_us"][0], rel=1e-9)
    assert on["t_prologue_us"][0] == off["t_prologue_us"][0]


def test_no_l15_tier_no_floor(monkeypatch):
    """A100 (no L1.5 tier) is not moved by it."""
    spec = get_hw("a100")
    plan = _lower("a100", **ROW)
    on = ev.evaluate_plan(plan, spec)
    off = _off(monkeypatch, plan, spec)
    assert on["latency_us"][0] == off["latency_us"][0]
