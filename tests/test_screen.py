"""Screened, streamed ranking (tsbatch.engine.screen) equals ``rank(evaluate(all rows))`` row for row.

Every comparison is exact (``DataFrame.equals``: same rows, order, columns,
dtypes and values, nulls equal), over workloads that span batches, ties
(duplicate configurations), infeasible rows, library rows, one-row
workloads, ``top`` = 1 and tiny fractions.
"""

from __future__ import annotations

import os

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strategies import frame, gemm_frames, gemm_row, infeasible_gemm_row
from tsbatch.front.cli import main
from tsbatch.errors import InputError
from tsbatch.engine.evaluate import CacheMemo, evaluate, resolve_hw
from tsbatch.engine.rank import keep_count, rank
from tsbatch.engine.screen import TopKScreen, bound_rows, screened_rank, workload_counts
from tsbatch.engine.sweep import candidate_chunks, load_sweep, run_sweep

WL = ["m", "n", "k", "dtype", "a_row_major", "b_row_major", "tf32"]
WORKLOAD_KEYS = ("m", "n", "k", "dtype", "a_row_major", "b_row_major", "tf32")
TOPS = [1.0, 0.5, 0.2, 0.05, 0.001]


def _same(a: pl.DataFrame, b: pl.DataFrame) -> None:
    assert a.columns == b.columns
    assert a.schema == b.schema
    assert a.height == b.height
    assert a.equals(b, null_equal=True)


@st.composite
def workload(draw, max_size: int = 2048) -> dict:
    row = draw(gemm_row(max_size=max_size, library=False))
    return {k: row[k] for k in WORKLOAD_KEYS}


@st.composite
def ranked_inputs(draw, max_workloads: int = 3, max_configs: int = 14):
    """Candidate rows of a few workloads, shuffled: ties (duplicate rows),
    infeasible rows (shared memory), library rows, one-row workloads."""
    wls = draw(st.lists(workload(), min_size=1, max_size=max_workloads))
    rows = []
    for w in wls:
        cfgs = draw(st.lists(gemm_row(max_size=2048), min_size=1, max_size=max_configs))
        cfgs += draw(st.lists(infeasible_gemm_row(), max_size=2))
        if len(cfgs) > 1:  # duplicates: identical predictions, tie broken by position
            dup = draw(st.lists(st.integers(0, len(cfgs) - 1), max_size=4))
            cfgs += [cfgs[i] for i in dup]
        for c in cfgs:
            rows.append({**c, **w})
    rows = draw(st.permutations(rows))
    return frame(list(rows))


# ----------------------------------------------------------------------------- evaluate
@given(df=gemm_frames(min_rows=2, max_rows=10, max_size=2048), data=st.data())
def test_evaluate_is_row_independent(df, data):
    """A row's result does not depend on the other rows of the call (nor on a
    cache memo filled by earlier calls): predicting a subset gives the rows
    the whole batch gives them. The screen relies on this."""
    full = evaluate(df, "h100")
    idx = data.draw(st.lists(st.integers(0, df.height - 1), min_size=1, max_size=df.height,
                             unique=True))
    memo = CacheMemo()
    evaluate(df[np.array(idx[::-1])], "h100", cache_memo=memo)  # fills the memo
    for m in (None, memo):
        sub = evaluate(df[np.array(idx)], "h100", cache_memo=m)
        _same(sub, full[np.array(idx)])


@settings(max_examples=40, deadline=None)
@given(df=ranked_inputs(), hw=st.sampled_from(["h100", "a100", "h20"]), data=st.data())
def test_evaluate_plan_latency_only_and_given_residency_are_the_same(df, hw, data):
    """``evaluate_plan(..., resident=, latency_only=True)`` (a prune round) gives the
    latencies of the full call to the bit, on rows taken from a lowered plan
    (library tiles too: their extra kernel times), with the residency of the
    whole plan taken at the rows."""
    from kernels_catalog import gemm as gemm_family
    from tsbatch.boundary.schema import validate
    from tsbatch.engine.evaluate import evaluate_plan, get_family, residency
    from tsbatch.engine.screen import take_plan

    spec = resolve_hw(hw)
    cols, is_lib = validate(df, get_family("gemm"), 0)
    if is_lib.any():
        cols, _ = gemm_family.expand_library(cols, is_lib, spec.arch)
    plan = gemm_family.lower(cols, spec)
    p, reason = residency(plan, spec)
    n = len(plan)
    rows = np.array(data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n)))
    sub = take_plan(plan, rows)
    full = evaluate_plan(sub, spec)["latency_us"]
    got = evaluate_plan(take_plan(plan, rows), spec, resident=(p[rows], reason[rows]),
                        latency_only=True)
    assert set(got) == {"latency_us"}
    assert got["latency_us"].tobytes() == full.tobytes()


@given(df=ranked_inputs(), hw=st.sampled_from(["h100", "a100"]))
def test_bound_below_prediction_and_feasibility_exact(df, hw):
    spec = resolve_hw(hw)
    lb, infeasible = bound_rows(df, spec)
    res = evaluate(df, spec)
    feas = res["feasible"].to_numpy()
    assert (infeasible == ~feas).all()
    lat = res["latency_us"].fill_null(np.inf).to_numpy()
    assert (lb[feas] <= lat[feas]).all()
    assert np.isinf(lb[~feas]).all()


@settings(max_examples=40, deadline=None)
@given(df=ranked_inputs(), hw=st.sampled_from(["h100", "a100", "h20"]),
       ws=st.sampled_from([1, 2, 3, 8]))
def test_bound_below_prediction_at_any_wave_sampling(df, hw, ws):
    """The compulsory L2/DRAM work of the bound stays below the prediction made
    with the same ``wave_samples`` (the floor applies only to launches whose
    waves are all analysed: few samples switch it off on more rows)."""
    spec = resolve_hw(hw)
    lb, infeasible = bound_rows(df, spec, wave_samples=ws)
    res = evaluate(df, spec, wave_samples=ws)
    feas = res["feasible"].to_numpy()
    assert (infeasible == ~feas).all()
    lat = res["latency_us"].fill_null(np.inf).to_numpy()
    assert (lb[feas] <= lat[feas]).all()


@settings(max_examples=40, deadline=None)
@given(df=gemm_frames(min_rows=1, max_rows=8, max_size=4096, library=False),
       hw=st.sampled_from(["h100", "a100"]), ws=st.sampled_from([1, 2, 8]))
def test_compulsory_traffic_below_cache_model(df, hw, ws):
    """The cache model's DRAM bytes (and L2 bytes on an L1.5 part) are never
    below the compulsory floor of :func:`compulsory_fractions` (checked on the
    byte totals, not through the envelope, where another resource could hide
    a violation)."""
    from tsbatch.boundary.schema import validate
    from tsbatch.engine.evaluate import evaluate_plan, get_family, residency
    from tsbatch.engine.screen import compulsory_fractions
    from tsbatch.kernels.envelope import R_DRAM, R_L2

    spec = resolve_hw(hw)
    fam = get_family("gemm")
    cols, _ = validate(df, fam, 0)
    plan = fam.lower(cols, spec)
    p, _ = residency(plan, spec)
    out = evaluate_plan(plan, spec, wave_samples=ws)
    frac = compulsory_fractions(plan, p, spec.sm_count, ws)
    req = np.where(plan.t_per_step.astype(bool), plan.t_bytes, 0.0)
    scale = 1.0 if plan.t_dram_scale is None else plan.t_dram_scale
    tiles = (plan.g0 * plan.g1 * plan.g2).astype(float)
    dram = tiles * (plan.ksteps * (req * scale * frac).sum(1) + plan.work_epi[:, R_DRAM])
    ok = p > 0
    assert (out["dram_bytes"][ok] >= dram[ok]).all()
    if spec.has_l15:
        l2 = tiles * (plan.ksteps * (req * frac).sum(1) + plan.work_epi[:, R_L2])
        assert (out["l2_bytes"][ok] >= l2[ok]).all()


def test_compulsory_fractions_by_hand():
    """1024 x 1024 x 512 fp16 in 128 x 128 tiles: an 8 x 8 grid; A's block is
    reused along the 8 column tiles, B's along the 8 row tiles: each read
    from DRAM at least 1/8 per access. On 132 SMs the 64 tiles are one wave;
    with the waves sampled (``wave_samples`` below the wave count) no floor."""
    from tsbatch.boundary.schema import validate
    from tsbatch.engine.evaluate import get_family
    from tsbatch.engine.screen import COMPULSORY_MARGIN, compulsory_fractions

    df = frame([{"m": 1024, "n": 1024, "k": 512, "dtype": "float16", "a_row_major": True,
                 "b_row_major": True, "tf32": False, "backend": "triton", "block_m": 128,
                 "block_n": 128, "block_k": 64, "num_stages": 3, "num_warps": 4,
                 "group_m": 8}])
    fam = get_family("gemm")
    spec = resolve_hw("h100")
    cols, _ = validate(df, fam, 0)
    plan = fam.lower(cols, spec)
    frac = compulsory_fractions(plan, np.array([1]), 132, 8)[0]
    step = plan.t_per_step[0].astype(bool)
    assert step.sum() == 2
    assert np.allclose(frac[step], (1 - COMPULSORY_MARGIN) / 8 - 1e-11, rtol=0, atol=1e-15)
    assert (frac[~step] == 0).all()
    # 64 tiles on 2 SMs' worth of slots: 32 waves, more than 8 are sampled
    assert (compulsory_fractions(plan, np.array([1]), 2, 8) == 0).all()
    assert (compulsory_fractions(plan, np.array([1]), 2, 32)[0][step] > 0).all()


@settings(max_examples=20, deadline=None)
@given(df=ranked_inputs(), chunk=st.integers(1, 9))
def test_bound_in_slices_equals_one_slice(df, chunk):
    """Bounding in slices (library rows expand within their slice) gives the
    bounds of one slice, value for value."""
    import tsbatch.engine.screen as screen

    spec = resolve_hw("h100")
    whole = bound_rows(df, spec)
    keep = screen.BOUND_CHUNK
    screen.BOUND_CHUNK = chunk
    try:
        parts = bound_rows(df, spec)
    finally:
        screen.BOUND_CHUNK = keep
    assert np.array_equal(parts[0], whole[0]) and np.array_equal(parts[1], whole[1])


@settings(max_examples=15, deadline=None)
@given(df=ranked_inputs(), chunk=st.integers(1, 5))
def test_bound_on_threads_equals_serial(df, chunk):
    """Slices bounded on several threads give the serial bounds, value for value."""
    import tsbatch.engine.screen as screen

    spec = resolve_hw("h100")
    keep = screen.BOUND_CHUNK, os.environ.get(screen.BOUND_THREADS_ENV)
    screen.BOUND_CHUNK = chunk
    try:
        os.environ[screen.BOUND_THREADS_ENV] = "1"
        serial = bound_rows(df, spec)
        os.environ[screen.BOUND_THREADS_ENV] = "3"
        threaded = bound_rows(df, spec)
    finally:
        screen.BOUND_CHUNK = keep[0]
        if keep[1] is None:
            os.environ.pop(screen.BOUND_THREADS_ENV, None)
        else:
            os.environ[screen.BOUND_THREADS_ENV] = keep[1]
    assert np.array_equal(threaded[0], serial[0]) and np.array_equal(threaded[1], serial[1])


def test_bound_threads_setting(monkeypatch):
    import tsbatch.engine.screen as screen

    monkeypatch.setenv(screen.BOUND_THREADS_ENV, "2")
    assert screen.bound_threads() == 2
    monkeypatch.setenv(screen.BOUND_THREADS_ENV, "0")
    assert screen.bound_threads() == 1
    monkeypatch.setenv(screen.BOUND_THREADS_ENV, "two")
    with pytest.raises(InputError, match="TSBATCH_BOUND_THREADS='two'"):
        screen.bound_threads()
    monkeypatch.delenv(screen.BOUND_THREADS_ENV)
    monkeypatch.setattr(screen.os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    assert screen.bound_threads() == 4  # the usable cores, at most 4
    monkeypatch.setattr(screen.os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert screen.bound_threads() == 1


def test_bound_errors_name_the_row_of_the_whole_frame(monkeypatch):
    import tsbatch.engine.screen as screen

    monkeypatch.setattr(screen, "BOUND_CHUNK", 4)
    monkeypatch.setenv(screen.BOUND_THREADS_ENV, "2")  # the first bad slice's error, on threads
    rows = [dict(m=512, n=512, k=512, dtype="float16", block_m=64, block_n=64, block_k=32,
                 num_stages=3, num_warps=4)] * 11
    df = pl.DataFrame(rows).with_columns(
        m=pl.when(pl.int_range(pl.len()) == 9).then(-5).otherwise(pl.col("m")))
    with pytest.raises(InputError, match=r"'m' must be positive; row 9 has -5"):
        bound_rows(df, resolve_hw("h100"))
    df = pl.DataFrame(rows).with_columns(
        dtype=pl.when(pl.int_range(pl.len()) == 6).then(pl.lit("fp7")).otherwise("dtype"))
    with pytest.raises(InputError, match=r"unknown value 'fp7' at row 6"):
        bound_rows(df, resolve_hw("h100"))
    df = df.with_columns(m=pl.when(pl.int_range(pl.len()) == 9).then(-5).otherwise(pl.col("m")))
    with pytest.raises(InputError, match=r"unknown value 'fp7' at row 6"):  # slice 4-7 first
        bound_rows(df, resolve_hw("h100"))


# ----------------------------------------------------------------------------- ranking
@given(df=ranked_inputs(), top=st.sampled_from(TOPS), batch=st.integers(1, 40),
       hw=st.sampled_from(["h100", "a100"]))
def test_screened_streamed_rank_equals_rank_of_all(df, top, batch, hw):
    ref = rank(evaluate(df, hw), WL, top)
    n_inf = int((~evaluate(df, hw)["feasible"]).sum())
    for survey in (True, False):  # three passes (bounds surveyed first) or one
        stats: dict = {}
        got = screened_rank(df, hw, WL, top, batch_rows=batch, survey=survey, stats=stats)
        _same(got, ref)
        assert stats["rows"] == df.height
        assert stats["infeasible"] == n_inf
    _same(screened_rank(df, hw, WL, top), ref)  # one batch


@given(df=ranked_inputs(), top=st.sampled_from(TOPS), batch=st.integers(1, 12),
       survey=st.booleans())
def test_running_set_compacted_at_every_merge_is_exact(df, top, batch, survey):
    """Rows pushed out of the running set are marked dead and dropped later, and
    surveyed rows are merged into P in bulk; dropping them and merging at every
    batch gives the same result."""
    ref = rank(evaluate(df, "h100"), WL, top)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(TopKScreen, "COMPACT_MIN", -1)
        mp.setattr(TopKScreen, "SURVEY_FLUSH_MIN", -1)
        _same(screened_rank(df, "h100", WL, top, batch_rows=batch, survey=survey), ref)


@given(df=ranked_inputs(max_workloads=2), top=st.sampled_from(TOPS), batch=st.integers(1, 9),
       survey=st.booleans())
def test_unscreened_stream_equals_rank(df, top, batch, survey):
    """The streamed running set alone (every feasible row predicted) is exact too."""
    _same(screened_rank(df, "h100", WL, top, batch_rows=batch, screen=False, survey=survey),
          rank(evaluate(df, "h100"), WL, top))


def _check_with_bounds(df: pl.DataFrame, frac, top: float, batch: int | None,
                       survey: bool = True) -> None:
    """Screen with the bound ``frac * prediction`` per row (0: nothing known; 1:
    tight), any valid lower bound, and compare with ranking every prediction."""
    import tsbatch.engine.screen as screen

    df = df.with_row_index("_rid")
    res = evaluate(df, "h100")
    feas = res["feasible"].to_numpy()
    key = np.where(feas, res["latency_us"].fill_null(np.inf).to_numpy(), np.inf)
    frac = np.asarray(frac, dtype=np.float64)
    real = screen.bound_rows

    def bound(batch_df, hw, family="gemm", wave_samples=screen.WAVE_SAMPLES):
        lb, infeasible = real(batch_df, hw, family, wave_samples)
        rid = batch_df["_rid"].to_numpy()
        with np.errstate(invalid="ignore"):  # inf * 0
            lb = np.where(frac[rid] == 0, 0.0, key[rid] * frac[rid])
        return np.where(infeasible, np.inf, lb), infeasible

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(screen, "bound_rows", bound)
        _same(screened_rank(df, "h100", WL, top, batch_rows=batch, survey=survey),
              rank(res, WL, top))


@given(df=ranked_inputs(max_workloads=2), top=st.sampled_from(TOPS), batch=st.integers(1, 12),
       survey=st.booleans(), data=st.data())
def test_exact_for_any_valid_bound(df, top, batch, survey, data):
    """Exact for any lower bound, not only a tight one: bounds equal to the
    prediction (a tie with the threshold must still be predicted), a half of
    it, or nothing known (0), mixed at random over duplicated rows."""
    frac = data.draw(st.lists(st.sampled_from([1.0, 1.0, 0.5, 0.0]), min_size=df.height,
                              max_size=df.height))
    _check_with_bounds(df, frac, top, batch, survey)


@pytest.mark.parametrize("survey", [True, False])
@pytest.mark.parametrize("batch", [None, 3, 1])
def test_bound_equal_to_threshold_is_still_predicted(batch, survey):
    """Two identical rows, K = 1: the later one has a loose bound and is predicted
    first, setting the threshold; the earlier one's bound equals it exactly and
    it wins the tie on position, so it must be predicted, not screened out."""
    row = {"m": 512, "n": 1024, "k": 2048, "dtype": "float16", "block_m": 64,
           "block_n": 128, "block_k": 64, "num_stages": 3, "num_warps": 4}
    other = {**row, "block_m": 16, "block_n": 32, "block_k": 32, "num_stages": 2}
    df = pl.DataFrame([other, row, row])
    lat = evaluate(df, "h100")["latency_us"].to_list()
    assert lat[0] > lat[1] == lat[2]
    _check_with_bounds(df, [1.0, 1.0, 0.5], 0.05, batch, survey)


def _many(n_cfg: int = 300, seed: int = 0) -> pl.DataFrame:
    """Two workloads x ``n_cfg`` random configurations, interleaved, with duplicates."""
    rng = np.random.default_rng(seed)
    tiles = dict(block_m=[16, 32, 64, 128, 256], block_n=[32, 64, 128, 256],
                 block_k=[32, 64, 128], num_stages=[2, 3, 4, 5, 6], num_warps=[2, 4, 8],
                 group_m=[1, 8])
    cfg = {k: rng.choice(v, n_cfg) for k, v in tiles.items()}
    d = min(20, n_cfg // 2)
    for k in tiles:  # rows 0..d-1 duplicate rows d..2d-1: ties
        cfg[k][:d] = cfg[k][d:2 * d]
    parts = []
    for m, n, k in ((4096, 4096, 4096), (128, 8192, 2048)):
        parts.append(pl.DataFrame({**{c: v.astype(np.int64) for c, v in cfg.items()},
                                   "m": m, "n": n, "k": k, "dtype": "bfloat16"}))
    return pl.concat(parts).sample(fraction=1.0, shuffle=True, seed=seed)


@pytest.mark.parametrize("top", [0.05, 0.01])
def test_screen_predicts_few_rows_and_holds_k_per_workload(top):
    df = _many()
    ref = rank(evaluate(df, "h100"), WL, top)
    wl = [c for c in WL if c in df.columns]
    scr = TopKScreen("h100", "gemm", wl, top, workload_counts(df, wl))
    k = keep_count(df.height // 2, top)
    for a in range(0, df.height, 97):
        scr.add(df.slice(a, 97))
        assert scr._R.height <= 2 * k  # the running set: at most K rows per workload
    _same(scr.result(), ref)
    assert scr.n_predicted < 0.5 * df.height  # the bound screens most rows out


@pytest.mark.parametrize("top", [0.05, 0.01])
def test_surveyed_stream_predicts_fewer_rows(top):
    """Workloads spread over many batches: one pass must screen the first
    batches against the few rows of each workload seen so far; surveying the
    bounds first predicts the globally most promising rows first and then
    screens everything against a threshold near the final one."""
    df = _many(1200, seed=2)
    ref = rank(evaluate(df, "h100"), WL, top)
    n = {}
    for survey in (False, True):
        stats: dict = {}
        _same(screened_rank(df, "h100", WL, top, batch_rows=150, survey=survey, stats=stats), ref)
        n[survey] = stats["predicted"]
    assert n[True] < 0.7 * n[False], n


def test_rank_stream_rejects_changed_batches():
    df = _many(40)
    wl = [c for c in WL if c in df.columns]
    scr = TopKScreen("h100", "gemm", wl, 0.05, workload_counts(df, wl))
    calls = []

    def batches():
        calls.append(1)
        step = 30 if len(calls) == 1 else 31  # the second read is cut differently
        return (df.slice(a, step) for a in range(0, df.height, step))

    with pytest.raises(RuntimeError, match="changed between passes"):
        scr.rank_stream(batches)


@settings(max_examples=300, deadline=None)
@given(data=st.data(), n=st.integers(0, 300), groups=st.integers(1, 40), with_pos=st.booleans())
def test_group_lexorder_is_lexsort(data, n, groups, with_pos):
    """The screen's sort (counting sort by group, then each group by key and
    position) is the permutation of ``np.lexsort`` (its plain twin), with tied
    keys, infinities, NaN and positions in any order."""
    from tsbatch.kernels.groupsort import group_lexorder

    gid = np.array(data.draw(st.lists(st.integers(0, groups - 1), min_size=n, max_size=n)),
                   dtype=np.int64)
    vals = st.sampled_from([0.5, 1.0, 1.0, 2.0, -np.inf, np.inf, np.nan, 3.25, -1.0])
    key = np.array(data.draw(st.lists(vals, min_size=n, max_size=n)), dtype=np.float64)
    pos = _positions(data, n)
    if with_pos:
        assert np.array_equal(group_lexorder(gid, key, pos), np.lexsort((pos, key, gid)))
    else:
        assert np.array_equal(group_lexorder(gid, key), np.lexsort((key, gid)))


def _positions(data, n):
    """Tie-break positions: in any order, or rising with the index (input order)."""
    if data.draw(st.booleans()):
        return np.array(data.draw(st.permutations(list(range(n)))), dtype=np.int64) * 3 + 7
    return np.cumsum(np.array(data.draw(st.lists(st.integers(1, 4), min_size=n, max_size=n)),
                              dtype=np.int64))


@settings(max_examples=300, deadline=None)
@given(data=st.data(), n=st.integers(0, 300), groups=st.integers(1, 40))
def test_group_first_k_is_the_lexsort_prefix(data, n, groups):
    """``group_first_k`` keeps, per group, the first ``k[g]`` rows of the
    ``np.lexsort((pos, key, gid))`` order (its plain twin) and gives the key of
    the ``k[g]``-th (``+inf`` with fewer rows), whole groups kept unsorted."""
    from tsbatch.kernels.groupsort import group_first_k

    gid = np.array(data.draw(st.lists(st.integers(0, groups - 1), min_size=n, max_size=n)),
                   dtype=np.int64)
    vals = st.sampled_from([0.5, 1.0, 1.0, 2.0, -np.inf, np.inf, np.nan, 3.25, -1.0])
    key = np.array(data.draw(st.lists(vals, min_size=n, max_size=n)), dtype=np.float64)
    pos = _positions(data, n)
    k = np.array(data.draw(st.lists(st.integers(0, 40), min_size=groups, max_size=groups)),
                 dtype=np.int64)
    keep, kth = group_first_k(gid, key, pos, k)
    o = np.lexsort((pos, key, gid))
    want = np.zeros(n, dtype=bool)
    want_kth = np.full(groups, np.inf)
    for g in range(groups):
        rows = o[gid[o] == g]
        want[rows[:k[g]]] = True
        if k[g] and rows.size >= k[g]:
            want_kth[g] = key[rows[k[g] - 1]]
    assert np.array_equal(keep, want)
    assert np.array_equal(kth, want_kth, equal_nan=True)


def test_workload_ids_by_hash_equal_the_join():
    """Workload ids come from a hash of the workload columns looked up in the
    counts: the same ids as joining the columns, whatever the integer width or
    text type of a batch, nulls included; a workload missing from the counts raises."""
    import polars as pl

    counts = pl.DataFrame({"m": [1, 2, 2, None], "d": ["a", "b", "a", "b"],
                           "f": [True, False, True, None], "_wl_n": [3, 1, 2, 1]})
    scr = TopKScreen("h100", "gemm", ["m", "d", "f"], 0.05, counts)
    assert scr._hash_ids is not None
    batch = pl.DataFrame({"m": [2, None, 1, 2, 1], "d": ["a", "b", "a", "b", "a"],
                          "f": [True, None, True, False, True]},
                         schema={"m": pl.Int32, "d": pl.Categorical, "f": pl.Boolean})
    assert scr._wid(batch).tolist() == [2, 3, 0, 1, 0]
    scr._hash_ids = None                              # the column join gives the same
    assert scr._wid(batch).tolist() == [2, 3, 0, 1, 0]
    scr = TopKScreen("h100", "gemm", ["m", "d", "f"], 0.05, counts)
    with pytest.raises(ValueError, match="missing from the counts"):
        scr._wid(batch.with_columns(pl.lit(9, dtype=pl.Int32).alias("m")))


def test_rank_count_col_uses_given_workload_size():
    df = pl.DataFrame({"w": [1, 1, 2], "feasible": [True] * 3, "latency_us": [2.0, 1.0, 3.0],
                       "_n": [40, 40, 1]})
    out = rank(df, ["w"], 0.05, count_col="_n")  # K = 2 for w=1 (of 40), 1 for w=2
    assert out["latency_us"].to_list() == [1.0, 2.0, 3.0] and "_n" not in out.columns
    assert rank(df.drop("_n"), ["w"], 0.05)["latency_us"].to_list() == [1.0, 3.0]


def test_empty_input_gives_empty_ranking():
    df = _many(4).head(0)
    _same(screened_rank(df, "h100", WL, 0.05), rank(evaluate(df, "h100"), WL, 0.05))


# ----------------------------------------------------------------------------- CLI
@pytest.mark.parametrize("flags", [["--top", "5%"], ["--top", "30%"], ["--rank"]])
def test_cli_ranked_batches_equal_one_batch(tmp_path, capsys, flags):
    df = _many(60, seed=3)
    inf = pl.DataFrame({"block_m": [256], "block_n": [256], "block_k": [128], "num_stages": [6],
                        "num_warps": [8], "group_m": [8], "m": [4096], "n": [4096],
                        "k": [4096], "dtype": ["bfloat16"]})  # shared memory overflow
    inf = inf.select(df.columns).cast(df.schema)
    df = pl.concat([inf, df, inf], how="vertical")
    src = tmp_path / "c.parquet"
    df.write_parquet(src)
    outs = []
    for rows in ([], ["--batch-rows", "7"], ["--batch-rows", "50"]):
        out = tmp_path / f"o{len(outs)}.parquet"
        assert main(["evaluate", str(src), "--hw", "h100", "-o", str(out), "-q", *flags,
                     *rows]) == 0
        outs.append(pl.read_parquet(out))
    assert "predicted in full" in capsys.readouterr().out
    top = 1.0 if flags == ["--rank"] else float(flags[1][:-1]) / 100
    ref = rank(evaluate(pl.read_parquet(src), "h100"), WL, top)
    for o in outs:
        _same(o, ref)
    assert not list(tmp_path.glob(".*tmp*")) and not list(tmp_path.glob(".*unranked*"))


SWEEP = """
[sweep]
name = "screen-test"
[workload]
m = [64, 2048]
dtype = ["float16"]
[[workload.shape]]
label = "a"
n = 4096
k = 4096
[[workload.shape]]
label = "b"
n = 1024
k = 8192
[schedule]
block_m = [32, 64, 128, 256]
block_n = [64, 128, 256]
block_k = [32, 64, 128]
num_stages = [2, 4, 6]
num_warps = [4, 8]
"""


@pytest.mark.parametrize("top", [0.05, 1.0])
def test_sweep_equals_rank_of_every_chunk(tmp_path, top):
    path = tmp_path / "s.toml"
    path.write_text(SWEEP)
    spec = load_sweep(path)
    tm: dict = {}
    summary = run_sweep(spec, "h100", tmp_path / "r.parquet", top, chunk_rows=300,
                        progress=False, timings=tm)
    got = pl.read_parquet(tmp_path / "r.parquet")
    wl = ["workload_id", *WL]
    ref = pl.concat([rank(evaluate(c, "h100"), wl, top) for c in candidate_chunks(spec, 300)])
    _same(got, ref)
    assert summary["kept"] == ref.height
    if top < 1.0:
        assert tm["rows_predicted"] < summary["candidates"]


def test_rank_stream_releases_the_screen():
    """rank_stream frees its running set once the result is made; the screen then
    refuses more work instead of giving a wrong result."""
    df = _many(40)
    wl = [c for c in WL if c in df.columns]
    scr = TopKScreen("h100", "gemm", wl, 0.05, workload_counts(df, wl))
    out = scr.rank_stream(lambda: (df.slice(a, 30) for a in range(0, df.height, 30)))
    assert out.equals(rank(evaluate(df, "h100"), wl, 0.05), null_equal=True)
    assert scr._r_frames == [] and len(scr.memo) == 0
    for call in (lambda: scr.add(df), scr.result):
        with pytest.raises(RuntimeError, match="released by rank_stream"):
            call()
