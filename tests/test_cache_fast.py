"""The fast path of ``reuse.cache_hit_rates`` against its general path.

``cache_hit_rates`` runs ``reuse._hits_fast`` for the hit rates of an
analysed wave; ``general=True`` runs the original per-access code
(``reuse._wave``'s own branch), which tests/test_kernels.py checks against
the plain-Python twin (``naive.cache_hit_rates_one``). The fast path claims
the same arithmetic, done once where the general path repeats it:

* SDCM probabilities of within-step distances are memoized per problem on
  the exact distance (``_memo_hits``): a hit returns the result of the very
  same call;
* an L1.5 SM group's access sequence is read off its slot runs, and groups
  whose sequences are equal up to a renaming of the blocks (compared element
  by element on their first-touch ranks) share one set of LRU distances,
  so one set of probabilities: LRU stack distances depend only on which
  accesses repeat which and on the weights, which follow the position
  (tensor ``q`` of the tile) in every group of the same length;
* when the step footprint surely hits, re-touches take ``h = 1`` (the
  general path sets their distance to 0, whose probability is exactly 1);
* cross-wave hits (a block's first touch in a step, previous touch in an
  earlier wave) are memoized per wave on the exact (previous wave,
  ``tail_b + head``): the rest of the distance depends on the two waves alone;
* an L1.5 group whose whole footprint hits with probability exactly 1 gives
  every re-touch exactly 1 (the SDCM is non-increasing in the distance);
* waves that are only book-kept for the lookback (panel orders, integer block
  sizes) are book-kept per distinct block: each tensor's candidate last
  touches, merged by access position, give ``tail_b`` in the per-access
  order; ``ustep``/``newcum`` sum the same integers in another order;
* analysed waves whose step footprint surely hits in L2 (panel orders,
  integer block sizes) go per distinct block too: every re-touch hits, so a
  tensor's sums need its access count, its first touches (the mirror of the
  last touches above, heads from candidate counts), their cross-wave hits
  and, with an L1.5 tier, the sum of its L1.5 hit probabilities (a block's
  first touch in the step misses L1.5);
* an L1.5 group whose runs of programs sit in the launch order's panels as
  an earlier group's did (same relative panel, row offset, panel rows,
  relative column and plane, length per run) is a translation of it, so
  takes its probabilities (and per-position sums) without labelling;
* per-tensor sums are added once per wave, scaled by ``ksteps`` (the only
  change of rounding: sums reassociate, ~1e-16 relative).

So the two must agree to rounding: checked here to ``FAST_RTOL`` on random
problems (GEMM masks and arbitrary masks / cadences, with and without an
L1.5 tier, sampled and unsampled, H100-sized waves), on problems built to
overflow the memo tables, and on the whole batch vs one problem at a time
(the batch is processed in a cost-balanced order).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.testing import assert_allclose
from strategies import cache_args, cache_problems

from tsbatch.kernels import reuse
from tsbatch.kernels.order import ORDER_NAMES, launch_order_array
from tsbatch.kernels.sdcm import hit_prob_gauss_array

#: fast vs general path: the same values up to reassociated sums
FAST_RTOL = 1e-9
FAST_ATOL = 1e-12

SAMPLINGS = (
    dict(k_samples=4, max_waves=8, max_lookback=4),  # evaluate's defaults
    dict(k_samples=3, max_waves=16),
    dict(k_samples=64, max_waves=1 << 30),  # unsampled
    # two analysed waves, everything between them only book-kept (the fast
    # path's per-block book-keeping) and looked back on
    dict(k_samples=4, max_waves=2, max_lookback=1 << 30),
)


def _both(args, **kw):
    fast = reuse.cache_hit_rates(*args, **kw)
    gen = reuse.cache_hit_rates(*args, general=True, **kw)
    return fast, gen


def _assert_same(args, **kw):
    fast, gen = _both(args, **kw)
    for a, b in zip(fast, gen):
        assert_allclose(a, b, rtol=FAST_RTOL, atol=FAST_ATOL)
    return fast


@st.composite
def h100_like(draw) -> dict:
    """A GEMM cache problem with H100-sized waves (132 SMs x 1-4 resident,
    8-SM L1.5 groups) on grids up to 48 x 48, tile bytes of real kernels and an
    L2 from a few blocks (within-step distances matter) to 50 MB."""
    res = draw(st.integers(1, 4))
    bm, bn, bk = (draw(st.sampled_from([16, 32, 64, 128, 256])) for _ in range(3))
    eb = draw(st.sampled_from([1, 2, 4]))
    a, b = float(bm * bk * eb), float(bk * bn * eb)
    unit = (a + b) / 2
    return dict(g0=draw(st.integers(1, 48)), g1=draw(st.integers(1, 48)),
                g2=draw(st.sampled_from([1, 1, 2, 3])),
                order=draw(st.sampled_from(sorted(ORDER_NAMES.values()))),
                group=draw(st.sampled_from([1, 2, 4, 8, 16])), conc=132 * res,
                ksteps=draw(st.integers(1, 300)), tbytes=(a, b, float(bm * bn * 2)),
                cap2=draw(st.sampled_from([20.0 * unit, 300.0 * unit, 5e7])),
                assoc2=16.0, nsm=132, g15=8, cap15=draw(st.sampled_from([184320.0, 12 * unit])),
                assoc15=8.0)


@settings(max_examples=150, deadline=None)
@given(st.lists(cache_problems(max_grid=9, max_g2=3, max_k=6), min_size=1, max_size=4),
       st.sampled_from(SAMPLINGS))
def test_fast_equals_general_small(problems, sampling):
    _assert_same(cache_args(problems), **sampling)


@settings(max_examples=40, deadline=None)
@given(st.lists(h100_like(), min_size=1, max_size=3),
       st.sampled_from(SAMPLINGS[:2] + SAMPLINGS[3:]))
def test_fast_equals_general_h100_like(problems, sampling):
    _assert_same(cache_args(problems), **sampling)


@st.composite
def masked_problem(draw) -> tuple:
    """Arbitrary tensors: 1-4 of them, any reuse mask, any cadence."""
    T = draw(st.integers(1, 4))
    mask = [draw(st.integers(0, 7)) for _ in range(T)]
    per_step = [draw(st.integers(0, 1)) for _ in range(T)]
    tb = [float(draw(st.sampled_from([64, 128, 512, 2048]))) for _ in range(T)]
    g0, g1, g2 = draw(st.integers(1, 8)), draw(st.integers(1, 8)), draw(st.integers(1, 3))
    nsm = draw(st.integers(1, 12))
    conc = nsm * draw(st.integers(1, 3))
    unit = max(tb)
    row = ([g0], [g1], [g2], [draw(st.sampled_from(sorted(ORDER_NAMES.values())))],
           [draw(st.sampled_from([1, 2, 3, 8]))], [conc], [draw(st.integers(1, 5))],
           [mask], [per_step], [tb], [draw(st.floats(2.0, 200.0)) * unit],
           [float(draw(st.sampled_from([1, 2, 4, 16])))], [nsm],
           [draw(st.sampled_from([0, 1, 2, 3, 4]))], [draw(st.floats(1.0, 30.0)) * unit],
           [float(draw(st.sampled_from([2, 4, 8])))])
    return row


@settings(max_examples=150, deadline=None)
@given(masked_problem(), st.sampled_from(SAMPLINGS))
def test_fast_equals_general_any_mask(args, sampling):
    _assert_same(args, **sampling)


def _problem(**kw):
    p = dict(g0=64, g1=64, g2=1, order=ORDER_NAMES["zorder"], group=8, conc=528, ksteps=64,
             tbytes=(8192.0, 16384.0, 32768.0), cap2=4e7, assoc2=16.0, nsm=132, g15=8,
             cap15=184320.0, assoc15=8.0)
    p.update(kw)
    return p


def _group_patterns(p: dict) -> tuple[int, int]:
    """Distinct L1.5 group sequences (up to renaming) of all waves, and their
    total length: the entries the fast path's pattern table would hold."""
    x0, x1, _ = launch_order_array(p["order"], p["g0"], p["g1"], p["g2"], p["group"])
    tiles = x0.shape[0]
    pats = {}
    for start in range(0, tiles, p["conc"]):
        for gi in range(-(-p["nsm"] // p["g15"])):
            seq = []
            for base in range(0, p["conc"], p["nsm"]):
                lo = base + p["g15"] * gi
                for s in range(lo, min(lo + p["g15"], base + p["nsm"], p["conc"])):
                    if start + s < tiles:
                        seq += [("a", x0[start + s]), ("b", x1[start + s])]
            rank: dict = {}
            key = tuple(rank.setdefault(k, len(rank)) for k in seq)
            if key:
                pats[key] = len(key)
    return len(pats), sum(pats.values())


def test_fast_equals_general_when_the_tables_overflow():
    """More L1.5 group patterns than ``PAT_SLOTS`` (z-order on a 95 x 120
    grid, 5-SM groups) and more pattern entries than ``PAT_POOL`` (column
    order, 16-SM groups of 29 SMs x 16 resident); an L2 of 40 blocks (the
    within-step tree, many distinct distances); a tiny L1.5 (the SDCM's
    single-set edge case)."""
    slots = _problem(g0=95, g1=120, order=ORDER_NAMES["zorder"], group=1, g15=5, conc=2112,
                     ksteps=7)
    pool = _problem(g0=101, g1=113, order=ORDER_NAMES["col"], group=3, nsm=29, g15=16, conc=464,
                    ksteps=5)
    assert _group_patterns(slots)[0] > reuse.PAT_SLOTS
    assert _group_patterns(pool)[1] > reuse.PAT_POOL
    probs = [slots, pool, _problem(cap2=40 * 12288.0), _problem(cap15=6 * 12288.0),
             _problem(g0=128, g1=100, order=ORDER_NAMES["row"], conc=1056)]
    _assert_same(cache_args(probs), k_samples=4, max_waves=1 << 30)
    _assert_same(cache_args(probs), **SAMPLINGS[0])


@pytest.mark.parametrize("threads", [1, 3])
def test_batch_order_does_not_change_results(monkeypatch, threads):
    """The batch runs in a cost-balanced order, in shares on ``threads``
    threads; each problem's results are those it gets alone."""
    monkeypatch.setattr(reuse, "num_threads", lambda: threads)
    rng = np.random.default_rng(3)
    probs = [_problem(g0=int(rng.integers(1, 40)), g1=int(rng.integers(1, 40)),
                      order=int(rng.integers(0, 5)), conc=132 * int(rng.integers(1, 4)),
                      ksteps=int(rng.integers(1, 100))) for _ in range(12)]
    batch = reuse.cache_hit_rates(*cache_args(probs), k_samples=4, max_waves=8, max_lookback=4)
    for i, p in enumerate(probs):
        one = reuse.cache_hit_rates(*cache_args([p]), k_samples=4, max_waves=8, max_lookback=4)
        for a, b in zip(batch, one):
            assert_allclose(a[i], b[0], rtol=0, atol=0)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_balanced_order_is_a_permutation(monkeypatch, threads):
    """Every problem is in exactly one share; one share per thread (one for
    a batch of fewer than two problems a thread)."""
    monkeypatch.setattr(reuse, "num_threads", lambda: threads)
    for n in (0, 1, 3, 17, 1000):
        tiles = np.arange(n, dtype=np.int64)[::-1] * 7 % 101 + 1
        perm, bounds = reuse._balanced_order(tiles, np.full(n, 132), np.full(n, 8))
        assert sorted(perm.tolist()) == list(range(n))
        assert bounds[0] == 0 and bounds[-1] == n and bounds == sorted(bounds)
        assert len(bounds) - 1 == (threads if n >= 2 * threads else 1)


def _random_batch(rng, tbytes_choices=(64.0, 512.0, 2048.0, 8192.0)) -> tuple:
    """Three arbitrary problems of one tensor count: any masks and cadences,
    every order (group sizes 0, above the row count, not dividing it), split
    planes, odd wave sizes, optional L1.5 groups."""
    T = int(rng.integers(1, 5))
    probs = []
    for _ in range(3):
        nsm = int(rng.integers(1, 40))
        probs.append(dict(
            g0=int(rng.integers(1, 30)), g1=int(rng.integers(1, 30)), g2=int(rng.integers(1, 4)),
            order=int(rng.integers(0, 5)), group=int(rng.choice([0, 1, 2, 3, 8, 40])),
            conc=nsm * int(rng.integers(1, 4)), ksteps=int(rng.integers(1, 50)),
            tbytes=tuple(float(rng.choice(tbytes_choices)) for _ in range(T)),
            mask=tuple(int(rng.integers(0, 8)) for _ in range(T)),
            per_step=tuple(1 if t == 0 else int(rng.integers(0, 2)) for t in range(T)),
            cap2=float(rng.uniform(3, 300)) * 2048, assoc2=16.0, nsm=nsm,
            g15=int(rng.choice([0, 2, 4, 8])), cap15=float(rng.uniform(2, 30)) * 2048,
            assoc15=8.0))
    return tuple(np.array([p[k] for p in probs]) for k in (
        "g0", "g1", "g2", "order", "group", "conc", "ksteps", "mask", "per_step", "tbytes",
        "cap2", "assoc2", "nsm", "g15", "cap15", "assoc15"))


@pytest.mark.parametrize("seed", range(4))
def test_fast_equals_general_book_kept_waves(seed):
    """Most waves only book-kept (per distinct block on the fast path) and
    looked back on by the analysed ones: arbitrary masks, orders and planes;
    block sizes that are not integers take the per-access book-keeping."""
    rng = np.random.default_rng(seed)
    for i in range(60):
        args = _random_batch(rng, (64.0, 512.0, 2048.0, 8192.0) if i % 4 else (64.5, 1000.25))
        for kw in (dict(k_samples=4, max_waves=2, max_lookback=1 << 30), SAMPLINGS[0],
                   dict(k_samples=3, max_waves=3, max_lookback=2)):
            _assert_same(args, **kw)


def test_l15_footprint_that_surely_hits():
    """Small blocks in a large L1.5: whole SM groups' footprints hit with
    probability exactly 1, the fast path then takes 1 for every re-touch
    without distances; it rests on the SDCM being non-increasing in the
    distance, so exactly 1 below such a footprint (checked on a scan)."""
    probs = [_problem(tbytes=(512.0, 512.0, 1024.0), cap15=184320.0, order=o, group=g,
                      g0=40, g1=33, conc=c)
             for o in range(5) for g, c in ((1, 132), (8, 396), (16, 528))]
    for kw in SAMPLINGS:
        _assert_same(cache_args(probs), **kw)
    for assoc, blocks in ((8.0, 360.0), (8.0, 15.0), (16.0, 20.5), (4.0, 1e4)):
        d = np.linspace(0.0, blocks, 20001)
        h = hit_prob_gauss_array(d, assoc, blocks)
        ones = np.flatnonzero(h == 1.0)
        if ones.size:  # every distance below the largest sure hit surely hits
            assert np.all(h[: ones.max() + 1] == 1.0)


def _block_batch(rng, big_l2: bool) -> tuple:
    """Three problems without an L1.5 tier (``g15 = 0`` or ``cap15 = 0``) and
    integer block sizes: any masks and cadences, every order (group sizes 0,
    above the row count, not dividing it), ragged grids, split planes
    (``g2 > 1``), waves from one tile to more than the grid. ``big_l2``: the
    step footprint surely hits in L2, so analysed waves take the per-block
    path (:func:`reuse._hits_blocks`); else it gives back to the per-access
    path after stamping its first touches."""
    T = int(rng.integers(1, 5))
    probs = []
    for _ in range(3):
        nsm = int(rng.integers(1, 40))
        no15 = bool(rng.integers(0, 2))
        probs.append(dict(
            g0=int(rng.integers(1, 40)), g1=int(rng.integers(1, 40)), g2=int(rng.integers(1, 4)),
            order=int(rng.integers(0, 5)), group=int(rng.choice([0, 1, 2, 3, 5, 8, 16, 64])),
            conc=int(rng.choice([1, nsm, nsm * int(rng.integers(1, 5)), 5000])),
            ksteps=int(rng.integers(1, 80)),
            tbytes=tuple(float(rng.choice([64, 512, 2048, 8192, 65536])) for _ in range(T)),
            mask=tuple(int(rng.integers(0, 8)) for _ in range(T)),
            per_step=tuple(1 if t == 0 else int(rng.integers(0, 2)) for t in range(T)),
            cap2=1e12 if big_l2 else float(rng.uniform(3, 300)) * 2048, assoc2=16.0, nsm=nsm,
            g15=0 if no15 else int(rng.choice([2, 4, 8])),
            cap15=float(rng.uniform(2, 30)) * 2048 if no15 else 0.0, assoc15=8.0))
    return tuple(np.array([p[k] for p in probs]) for k in (
        "g0", "g1", "g2", "order", "group", "conc", "ksteps", "mask", "per_step", "tbytes",
        "cap2", "assoc2", "nsm", "g15", "cap15", "assoc15"))


@pytest.mark.parametrize("seed", range(4))
def test_fast_equals_general_block_analysed_waves(seed):
    """Analysed waves per distinct block (no L1.5 tier, panel orders, integer
    block sizes, step footprint surely hitting in L2): first touches from the
    panel structure, heads from candidate counts, sums from counts and the
    cross-wave hits; and the give-back to the per-access path when the
    footprint may miss."""
    rng = np.random.default_rng(100 + seed)
    for i in range(50):
        args = _block_batch(rng, big_l2=i % 5 != 0)
        for kw in (SAMPLINGS[0], SAMPLINGS[3], dict(k_samples=3, max_waves=3, max_lookback=2),
                   dict(k_samples=64, max_waves=1 << 30)):
            _assert_same(args, **kw)


@pytest.mark.parametrize("order", sorted(ORDER_NAMES.values()))
def test_fast_equals_general_block_analysed_waves_grids(order):
    """The per-block analysed waves on tiny and large grids (GEMM masks, A100-
    like waves, no L1.5): one tile, a grid smaller than a wave, ragged panels
    of every group size, split-K planes, a 300 x 200 x 2 grid."""
    probs = [_problem(g0=g0, g1=g1, g2=g2, order=order, group=grp, conc=conc, nsm=108, g15=0,
                      cap15=0.0, cap2=4e7, ksteps=ks)
             for g0, g1, g2, grp, conc, ks in ((1, 1, 1, 8, 108, 1), (3, 5, 1, 8, 216, 7),
                                               (37, 29, 1, 4, 216, 64), (37, 29, 3, 16, 324, 9),
                                               (64, 48, 2, 1, 432, 33), (100, 7, 1, 8, 108, 12),
                                               (300, 200, 2, 8, 648, 5), (45, 61, 1, 0, 972, 2))]
    for kw in (SAMPLINGS[0], SAMPLINGS[3], dict(k_samples=4, max_waves=40, max_lookback=6)):
        _assert_same(cache_args(probs), **kw)


def _window_start_brute(g0, g1, g2, order, group, conc, mask, per_step, w, ws):
    """The earliest program at or after wave ``ws``'s first that is the last
    touch before wave ``w`` of a block wave ``w`` touches (wave ``w``'s first
    program if none): the launch order walked access by access."""
    x = launch_order_array(order, g0, g1, g2, group)
    P = g0 * g1 * g2
    start, end = w * conc, min(P, (w + 1) * conc)
    best = start
    for t, m in enumerate(mask):
        if not per_step[t]:
            continue
        key = [tuple(x[d][p] for d in range(3) if not (m >> d) & 1) for p in range(P)]
        last = {}
        for p in range(start):
            last[key[p]] = p
        for p in range(start, end):
            q = last.get(key[p], -1)
            if q >= ws * conc:
                best = min(best, q)
    return best


@settings(max_examples=1500, deadline=None)
@given(g0=st.integers(1, 13), g1=st.integers(1, 13), g2=st.integers(1, 3),
       order=st.sampled_from([o for o in sorted(ORDER_NAMES.values())
                              if o != ORDER_NAMES["zorder"]]),
       group=st.sampled_from([0, 1, 2, 3, 5, 8, 20]),
       conc=st.one_of(st.integers(1, 8), st.integers(1, 60)),
       mask=st.lists(st.integers(0, 7), min_size=1, max_size=4), data=st.data())
def test_window_start_is_the_earliest_previous_touch(g0, g1, g2, order, group, conc, mask,
                                                     data):
    """The lookback window's start (the earliest previous touch of the analysed
    wave's blocks at or after the window's first program), in closed form per
    key and panel segment, equals the launch order walked access by access: every key (row, column,
    plane, tile, none), every panel order, ragged panels, planes smaller or
    larger than a wave."""
    T = len(mask)
    per_step = [1] + [data.draw(st.integers(0, 1)) for _ in range(T - 1)]
    P = g0 * g1 * g2
    W = -(-P // conc)
    w = data.draw(st.integers(0, W - 1))
    ws = data.draw(st.one_of(st.integers(max(0, w - 3), w), st.integers(0, w)))
    gdim = (g0, g1, g2)
    kstr = np.zeros((T, 3), dtype=np.int64)
    for t, m in enumerate(mask):
        stride = 1
        for d in range(3):
            if not (m >> d) & 1:
                kstr[t, d] = stride
                stride *= gdim[d]
    gm = group if group > 0 else 1
    if order == ORDER_NAMES["row"]:
        gm = 1
    elif order == ORDER_NAMES["col"]:
        gm = g0
    got = reuse._window_start(w, ws, P, conc, T, np.array(per_step, dtype=np.int64), kstr,
                              g0, g1, gm)
    assert got == _window_start_brute(g0, g1, g2, order, group, conc, mask, per_step, w, ws)


@settings(max_examples=300, deadline=None)
@given(g0=st.integers(1, 30), g1=st.integers(1, 30), g2=st.integers(1, 3),
       order=st.sampled_from([o for o in sorted(ORDER_NAMES.values())
                              if o != ORDER_NAMES["zorder"]]),
       group=st.sampled_from([0, 1, 2, 3, 8, 40]), nsm=st.integers(1, 40),
       g15=st.integers(1, 9), res=st.integers(1, 3), data=st.data())
def test_run_starts_step_along_the_order(g0, g1, g2, order, group, nsm, g15, res, data):
    """The first programs of a wave's L1.5 group runs, stepped along the panel
    order without divisions, are the launch order's coordinates (and their
    panel's first row and rows)."""
    from tsbatch.kernels.order import tile_coords

    conc = nsm * res
    P = g0 * g1 * g2
    w = data.draw(st.integers(0, -(-P // conc) - 1))
    start, nw = w * conc, min(conc, P - w * conc)
    ngroups = -(-nsm // g15)
    gm = g0 if order == ORDER_NAMES["col"] else 1 if order == ORDER_NAMES["row"] else max(group, 1)
    rsc = np.full((5, res * ngroups), -1, dtype=np.int64)
    reuse._run_starts(start, nw, nsm, g15, ngroups, order, g0, g1, g2, group, gm, rsc)
    for r in range(res):
        for gi in range(ngroups):
            pos = r * nsm + gi * g15
            if pos >= nw:
                continue
            row, col, z = tile_coords(order, g0, g1, g2, group, start + pos)
            first = row // gm * gm
            assert tuple(rsc[:, r * ngroups + gi]) == (row, col, z, first, min(gm, g0 - first))
