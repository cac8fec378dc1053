"""bench/stage_bk_rows.py: the steady iteration's terms it reports are the envelope's."""

import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from stage_bk_rows import shape_table, steady_terms  # noqa: E402
from tsbatch.kernels.envelope import COMPUTE, R_NAMES, SHARED, envelope_one  # noqa: E402

SMS = 100


def _row(rng):
    n = len(R_NAMES)
    work = rng.uniform(0.0, 5000.0, n)
    rate = rng.uniform(1e4, 1e6, n)
    rate[SHARED == 1] *= SMS
    rate[rng.random(n) < 0.2] = 0.0  # absent resources
    return work, rate


@pytest.mark.parametrize("stages", [1, 2, 4])
@pytest.mark.parametrize("seed", range(6))
def test_terms_are_the_envelopes_steady_iteration(stages, seed):
    """With the ring's queue left out (and none for one stage), no exposed copy, all
    SMs active, with and without a chain: envelope_one's steady iteration is
    max(comp, mem, lb)."""
    rng = np.random.default_rng(seed)
    work, rate = _row(rng)
    p = int(rng.integers(1, 13))
    warps = float(rng.choice([1, 2, 4, 8]))
    lat, ovh, sync, share = 0.6, rng.uniform(0.0, 0.1), rng.uniform(0.0, 0.2), 0.95
    ring = int(rng.integers(0, 2)) if stages == 1 else 0
    chain = rng.uniform(0.0, 0.5) if seed % 2 else 0.0  # the FMA path's chain
    streams = float(rng.choice([1, 2]))
    out = envelope_one(work, np.zeros_like(work), rate, SHARED, COMPUTE, p, SMS, 64, stages,
                       warps, 4.0, lat, ovh, 0.0, 0, share, sync, chain, streams, ring, 0.0,
                       1.0)
    c0, comp, mem, lb = steady_terms(work[None, :], rate[None, :], np.array([p]), SMS,
                                     np.array([stages]), np.array([warps]), 4.0, lat, ovh,
                                     sync, share, np.array([chain]), np.array([streams]))
    assert out[4] == pytest.approx(max(comp[0], mem[0], lb[0]), rel=1e-12)
    assert comp[0] >= c0[0]


def test_shape_table_groups_and_medians():
    d = pl.DataFrame({
        "gpu": ["a", "a", "a", "b"], "m": [1, 2, 3, 1], "n": [1, 1, 1, 1], "k": [1, 1, 1, 1],
        "num_stages": [1, 1, 2, 1], "block_k": [16, 16, 32, 16],
        "meas": [1.0, 2.0, 3.0, 4.0], "latency_us": [2.0, 2.0, 3.0, 2.0]})
    t = shape_table(d)
    one = t.filter((pl.col("gpu") == "a") & pl.col("one_stage") & pl.col("bk16"))
    assert one["rows"][0] == 2 and one["problems"][0] == 2
    assert one["meas_over_pred"][0] == pytest.approx(0.75)
    assert one["mape"][0] == pytest.approx(50.0)  # |2/1 - 1| and |2/2 - 1|
    assert t.height == 3
