"""tsbatch.kernels.traffic against its plain-Python twins (tests/naive.py) and
against the numpy it replaced in evaluate_plan (equal to the bit)."""

from __future__ import annotations

import math

import naive
import numpy as np
import pytest

from tsbatch.kernels import traffic
from tsbatch.kernels.envelope import N_RES, R_DRAM, R_L15, R_L2


def _problems(rng, rows, T, u):
    t_bytes = rng.uniform(0, 1e6, (rows, T)) * (rng.random((rows, T)) < 0.9)
    per_step = rng.integers(0, 2, (rows, T))
    h15u = rng.random((u, T)) * (rng.random((u, T)) < 0.7)
    h2u = rng.random((u, T))
    dramu = rng.random((u, T))
    inv = rng.integers(0, u, rows)
    work_iter = rng.uniform(0, 1e5, (rows, N_RES))
    work_epi = rng.uniform(0, 1e5, (rows, N_RES))
    tiles = rng.integers(1, 10**6, rows)
    ksteps = rng.integers(1, 5000, rows)
    return t_bytes, per_step, h15u, h2u, dramu, inv, work_iter, work_epi, tiles, ksteps


@pytest.fixture(autouse=True)
def _kernels_for_every_size(monkeypatch):
    """The kernels run whatever the row count (small calls would take numpy)."""
    monkeypatch.setattr(traffic, "KERNEL_MIN_ROWS", 0)


@pytest.mark.parametrize("T", [0, 1, 3, 5, 7, 8, 11])
@pytest.mark.parametrize("has_l15", [False, True])
@pytest.mark.parametrize("scaled", [False, True])
def test_split_traffic_matches_numpy_and_twin(T, has_l15, scaled):
    rng = np.random.default_rng(T + 10 * has_l15 + 100 * scaled)
    rows, u = 3000, 400
    (t_bytes, per_step, h15u, h2u, dramu, inv, work_iter, work_epi, tiles,
     ksteps) = _problems(rng, rows, T, u)
    # short DRAM runs: some tensors' DRAM bytes cost up to twice their time
    scale = np.where(rng.random((rows, T)) < 0.5, 1.0, rng.uniform(1.0, 2.0, (rows, T))) \
        if scaled else None
    got = traffic.split_traffic(t_bytes, per_step, h15u, h2u, dramu, inv, has_l15, work_iter,
                                work_epi, tiles, ksteps, scale)
    want = traffic._split_numpy(t_bytes, per_step, h15u, h2u, dramu, inv, has_l15, work_iter,
                                work_epi, tiles, ksteps, scale)
    if scaled and T:  # the scale reaches the DRAM column and bytes, nothing else
        plain = traffic._split_numpy(t_bytes, per_step, h15u, h2u, dramu, inv, has_l15,
                                     work_iter, work_epi, tiles, ksteps)
        assert np.array_equal(plain[1], want[1]) and np.array_equal(plain[4], want[4])
        assert (want[3] >= plain[3]).all() and (want[3] > plain[3]).any()
    for g, w in zip(got, want):  # numpy's own results, to the bit
        assert g.shape == w.shape
        assert np.array_equal(g.view(np.int64), w.view(np.int64))
    assert not np.shares_memory(got[0], work_iter)
    if T >= traffic.NUMPY_PAIRWISE_MIN:
        return  # numpy's pairwise sum: the twin's left-to-right sum is not it
    for i in range(0, rows, 37):
        u_i = inv[i]
        wi, l15, l2, db, lb = naive.split_traffic_one(
            t_bytes[i], per_step[i], h15u[u_i], h2u[u_i], dramu[u_i], has_l15, work_iter[i],
            work_epi[i], int(tiles[i]), int(ksteps[i]), R_L15, R_L2, R_DRAM,
            None if scale is None else scale[i])
        assert got[0][i].tolist() == wi
        assert (got[1][i], got[2][i], got[3][i], got[4][i]) == (l15, l2, db, lb)


def test_split_traffic_zero_requests_give_zero_hit_fractions():
    rows, T = 4, 3
    z = np.zeros((rows, T))
    out = traffic.split_traffic(z, np.ones((rows, T), dtype=np.int64), np.ones((1, T)),
                                np.ones((1, T)), np.zeros((1, T)), np.zeros(rows, dtype=np.int64),
                                True, np.ones((rows, N_RES)), np.ones((rows, N_RES)),
                                np.full(rows, 3), np.full(rows, 2))
    assert (out[1] == 0).all() and (out[2] == 0).all()
    assert (out[3] == 3.0).all()  # the epilogue's DRAM bytes only: 3 x (2 x 0 + 1)


def test_small_calls_take_numpy_and_agree(monkeypatch):
    """Below KERNEL_MIN_ROWS the numpy forms run; they give the kernels' results."""
    rng = np.random.default_rng(5)
    args = _problems(rng, 500, 3, 50)
    t_bytes, per_step, h15u, h2u, dramu, inv, work_iter, work_epi, tiles, ksteps = args
    util = rng.random((500, N_RES))
    lat = rng.uniform(1, 10, 500)
    monkeypatch.setattr(traffic, "KERNEL_MIN_ROWS", 501)
    calls = []
    monkeypatch.setattr(traffic, "run_shares", lambda *a: calls.append(a))
    small = traffic.split_traffic(t_bytes, per_step, h15u, h2u, dramu, inv, True, work_iter,
                                  work_epi, tiles, ksteps)
    small_b = traffic.bottleneck_codes(util, lat, lat * 0.1, 0.6)
    assert calls == []  # no kernel ran
    monkeypatch.undo()
    monkeypatch.setattr(traffic, "KERNEL_MIN_ROWS", 0)
    big = traffic.split_traffic(t_bytes, per_step, h15u, h2u, dramu, inv, True, work_iter,
                                work_epi, tiles, ksteps)
    for g, w in zip(big, small):
        assert np.array_equal(g.view(np.int64), w.view(np.int64))
    assert np.array_equal(traffic.bottleneck_codes(util, lat, lat * 0.1, 0.6), small_b)


@pytest.mark.parametrize("scaled", [False, True])
def test_work_only_split_gives_the_same_work_matrix(scaled):
    """A latency-only call's small split (numpy) makes the work matrix alone, to the bit."""
    rng = np.random.default_rng(11 + scaled)
    t_bytes, per_step, h15u, h2u, dramu, inv, work_iter, work_epi, tiles, ksteps = \
        _problems(rng, 300, 3, 40)
    scale = rng.uniform(1.0, 2.0, (300, 3)) if scaled else None
    full = traffic._split_numpy(t_bytes, per_step, h15u, h2u, dramu, inv, True, work_iter,
                                work_epi, tiles, ksteps, scale)
    got = traffic._split_numpy(t_bytes, per_step, h15u, h2u, dramu, inv, True, work_iter,
                               work_epi, tiles, ksteps, scale, work_only=True)
    assert np.array_equal(got[0].view(np.int64), full[0].view(np.int64))
    assert got[1:] == (None, None, None, None)


def test_bottleneck_codes_match_numpy_and_twin():
    rng = np.random.default_rng(3)
    rows = 5000
    util = rng.random((rows, N_RES))
    util[rng.random((rows, N_RES)) < 0.1] = np.nan
    util[rng.random((rows, N_RES)) < 0.05] = 0.7  # ties: the first wins
    util[rng.random((rows, N_RES)) < 0.01] = np.inf
    util[rng.random(rows) < 0.05] = np.nan  # infeasible rows: all NaN
    util[rng.random(rows) < 0.2] *= 0.3  # rows under the threshold
    lat = rng.uniform(1, 100, rows)
    lat[rng.random(rows) < 0.05] = np.nan
    lat[rng.random(rows) < 0.02] = np.inf
    launch = rng.uniform(0, 100, rows)
    got = traffic.bottleneck_codes(util, lat, launch, 0.6)
    assert np.array_equal(got, traffic._bottleneck_numpy(util, lat, launch, 0.6))
    for i in range(0, rows, 7):
        assert got[i] == naive.bottleneck_one(util[i].tolist(), float(lat[i]), float(launch[i]),
                                              0.6, N_RES)
    assert set(got.tolist()) >= {0, N_RES, N_RES + 1, N_RES + 2}
    assert not math.isnan(float(got.sum()))


@pytest.mark.parametrize("T", [0, 1, 2, 3, 7])
@pytest.mark.parametrize("has_l15", [False, True])
@pytest.mark.parametrize("scaled", [False, True])
def test_compulsory_work_matches_numpy_and_twin(T, has_l15, scaled):
    """The screen's bound's L1.5 / L2 / DRAM columns in one pass: equal to the bit
    to the numpy form (tsbatch.engine.screen.bound_work_numpy, from
    compulsory_fractions) and to the twin; only those three columns change;
    a launch of more waves than ``wave_samples`` gets no L2 / DRAM floor."""
    from types import SimpleNamespace

    from tsbatch.engine.screen import COMPULSORY_MARGIN, bound_work_numpy

    rng = np.random.default_rng(T + 10 * has_l15 + 100 * scaled)
    rows, sms, ws = 4000, 132, 8
    g = [rng.integers(1, 60, rows) for _ in range(3)]
    g[2] = np.where(rng.random(rows) < 0.7, 1, g[2])  # split-K or batch on most rows: 1
    plan = SimpleNamespace(
        t_bytes=rng.uniform(0, 1e6, (rows, T)) * (rng.random((rows, T)) < 0.9),
        t_per_step=rng.integers(0, 2, (rows, T)), t_mask=rng.integers(0, 8, (rows, T)),
        g0=g[0], g1=g[1], g2=g[2],
        t_dram_scale=rng.uniform(1.0, 2.0, (rows, T)) if scaled else None)
    p = rng.integers(0, 9, rows)
    hw = SimpleNamespace(sm_count=sms, has_l15=has_l15)
    work = rng.uniform(0, 1e5, (rows, N_RES))
    got = traffic.compulsory_work(plan.t_bytes, plan.t_per_step, plan.t_mask, *g, p, sms, ws,
                                  COMPULSORY_MARGIN, has_l15, plan.t_dram_scale, work.copy())
    want = bound_work_numpy(plan, p, hw, ws, work.copy())
    assert np.array_equal(got.view(np.int64), want.view(np.int64))
    others = [r for r in range(N_RES) if r not in (R_L15, R_L2, R_DRAM)]
    assert np.array_equal(got[:, others], work[:, others])
    waves = -(-(g[0] * g[1] * g[2]) // (sms * np.maximum(p, 1)))
    if T:
        assert (got[waves > ws, R_DRAM] == 0).all()
        assert (got[waves <= ws, R_DRAM] > 0).any()
    for i in range(0, rows, 37):
        twin = naive.compulsory_work_one(
            plan.t_bytes[i], plan.t_per_step[i], plan.t_mask[i], (g[0][i], g[1][i], g[2][i]),
            int(p[i]), sms, ws, COMPULSORY_MARGIN, has_l15,
            None if plan.t_dram_scale is None else plan.t_dram_scale[i], work[i], R_L15, R_L2,
            R_DRAM)
        assert twin == got[i].tolist()


@pytest.mark.parametrize("kernel", [False, True])
@pytest.mark.parametrize("T", [1, 3, 7])
@pytest.mark.parametrize("scaled", [False, True])
def test_split_edge_rows_gives_split_traffics_rows(monkeypatch, kernel, T, scaled):
    """evaluate_plan's second split (the envelope's whole tiles) on the rows whose
    bytes differ, written in place: every row equals, to the bit, a whole
    split_traffic call on the second byte matrix (kernel and numpy forms) and
    the twin; the rows whose bytes are the same and the other columns are not
    written."""
    monkeypatch.setattr(traffic, "KERNEL_MIN_ROWS", 0 if kernel else 10**9)
    rng = np.random.default_rng(21 + T + 7 * scaled + 50 * kernel)
    rows, u = 2000, 300
    (t_bytes, per_step, h15u, h2u, dramu, inv, work_iter, work_epi, tiles,
     ksteps) = _problems(rng, rows, T, u)
    t_crit = t_bytes * np.where(rng.random((rows, T)) < 0.4, rng.uniform(1.0, 3.0, (rows, T)), 1.0)
    t_crit[::50, 0] = np.nan  # a NaN differs from itself: that row is split again
    zero = np.flatnonzero((t_crit == t_bytes).all(axis=1))[:20]
    t_bytes[zero] = 0.0  # zeros against their negatives: split again (the sign)
    t_crit[zero] = -0.0
    per_step[zero] = 1
    scale = rng.uniform(1.0, 2.0, (rows, T)) if scaled else None
    first = traffic.split_traffic(t_bytes, per_step, h15u, h2u, dramu, inv, True, work_iter,
                                  work_epi, tiles, ksteps, scale)[0]
    whole = traffic.split_traffic(t_crit, per_step, h15u, h2u, dramu, inv, True, work_iter,
                                  work_epi, tiles, ksteps, scale)[0]
    edge = ((t_crit != t_bytes) | (np.signbit(t_crit) != np.signbit(t_bytes))).any(axis=1)
    assert edge[zero].all() and not (t_crit[zero] != t_bytes[zero]).any(axis=1).any()
    assert 0 < edge.sum() < rows
    before = first.copy()
    # the rows not split again are marked: a write to any of them would show
    first[~edge] = -1.0
    marked = first.copy()
    got = traffic.split_edge_rows(t_crit, t_bytes, per_step, h15u, h2u, dramu, inv, True, scale,
                                  first)
    assert got is first  # in place
    assert np.array_equal(got[~edge].view(np.int64), marked[~edge].view(np.int64))
    got[~edge] = before[~edge]
    assert np.array_equal(got.view(np.int64), whole.view(np.int64))
    cols = [c for c in range(N_RES) if c not in (R_L15, R_L2, R_DRAM)]
    assert np.array_equal(got[:, cols].view(np.int64), before[:, cols].view(np.int64))
    for i in np.flatnonzero(edge)[::29]:
        wi = naive.split_traffic_one(t_crit[i], per_step[i], h15u[inv[i]], h2u[inv[i]],
                                     dramu[inv[i]], True, work_iter[i], work_epi[i], int(tiles[i]),
                                     int(ksteps[i]), R_L15, R_L2, R_DRAM,
                                     None if scale is None else scale[i])[0]
        assert np.array_equal(np.array(got[i].tolist()), np.array(wi), equal_nan=True)
    # without an L1.5 tier its column is 0 on the rows split again
    again = traffic.split_edge_rows(t_crit, t_bytes, per_step, h15u, h2u, dramu, inv, False, scale,
                                    before.copy())
    assert (again[edge, R_L15] == 0.0).all()


def test_split_edge_rows_refuses_wide_rows_and_other_shapes():
    z = np.zeros((4, traffic.NUMPY_PAIRWISE_MIN))
    with pytest.raises(ValueError, match="tensors"):
        traffic.split_edge_rows(z, z, z, z, z, z, np.zeros(4, dtype=np.int64), True, None,
                                np.zeros((4, N_RES)))
    z = np.zeros((4, 3))
    with pytest.raises(ValueError, match="work_iter"):
        traffic.split_edge_rows(z, z, z, z, z, z, np.zeros(4, dtype=np.int64), True, None,
                                np.zeros((5, N_RES)))
