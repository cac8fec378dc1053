"""Screened, streamed top-k % ranking: exactly ``rank(evaluate(rows), workload, top)``.

:func:`tsbatch.engine.rank.rank` keeps, per workload, the first
``K = keep_count(n, top)`` rows by ``(key, position)`` (``key`` = predicted
latency of a feasible row, +inf otherwise; ``n`` = the workload's row count)
and drops the infeasible ones. Almost every row is therefore predicted only
to be thrown away, and the cache model, which dominates a prediction, is
paid for all of them. :class:`TopKScreen` gets the same rows without it:

1. *Bound.* Every row is lowered and its occupancy computed (infeasible rows
   are known here, exactly: ``resident_tiles == 0``); a
   :func:`lower_bound` of the latency is computed for the feasible ones (the
   envelope without its queued-wave term is non-decreasing in every work entry
   and never above the model's, and the bound's L2 and DRAM work is the
   compulsory traffic, below the cache model's, so the bound never exceeds the
   prediction).
   A library row (``backend == 'cublas'``, the best tile of a catalog) is
   bounded by the least bound of its catalog tiles.
2. *Screen.* Per workload, rows are predicted in full (:func:`evaluate`,
   cache model included) in order of their bound, in a few vectorised rounds
   of growing size, until every row not yet predicted has a bound *strictly*
   above the ``K``-th best key known for its workload (a row whose bound
   equals it is still predicted: it could tie and win on position). Such a
   row cannot be among the first ``K``.
3. *Stream.* A workload's rows may span record batches. The screen keeps a
   running set ``R``: per workload, the first ``K`` rows by ``(key,
   position)`` among the rows seen so far (``K`` from the workload's count
   over the *whole* input, given up front). Each batch is screened against
   ``R``'s ``K``-th key as well, and ``R`` is replaced by the first ``K`` of
   ``R`` and the batch's known rows. By induction ``R`` is always the exact
   prefix of the global order over the rows seen, so at the end every row
   ahead of a kept row is in ``R`` and :func:`rank` of ``R`` with the global
   counts gives the same ranks, ties and kept rows as ranking everything
   (the argument of :mod:`tsbatch.front.distributed`, applied incrementally). ``R``
   holds at most ``K`` rows per workload, so memory is bounded by the output
   (about ``top`` times the input) plus one batch, not by the input.
4. *Survey* (:meth:`TopKScreen.rank_stream`, a stream that can be read
   again). A workload spread over many batches would be screened, in its
   first batches, against the few of its rows seen so far. Reading the
   stream three times (bounds only; then each workload's globally most
   promising rows; then the rest) screens nearly every row against a
   threshold close to the final one: on 2M rows in 10 batches, 141k rows
   are predicted in full instead of 437k. It keeps a float32 bound, a
   workload id and a flag per row (7 bytes a row below 65,536 workloads).

Rows enter ``R`` with the exact columns :func:`evaluate` gives them:
``evaluate`` is row-independent (a row's result does not depend on the other
rows of its call; tested), so predicting a subset gives the same values.
Infeasible rows that fall within a workload's first ``K`` (a workload with
fewer than ``K`` feasible rows) are evaluated too, so that positions among
infinite keys rank exactly as in :func:`rank`; they are dropped at the end.

No Python loop runs per row or per workload; the loop is over rounds.
"""

from __future__ import annotations

import dataclasses
import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import polars as pl

from kernels_catalog import gemm as gemm_family
from kernels_catalog.base import TilePlan
from tsbatch.errors import InputError
from tsbatch.engine.evaluate import (WAVE_SAMPLES, CacheMemo, evaluate, get_family, residency,
                                     resolve_hw)
from tsbatch.hw import HwSpec
from tsbatch.kernels.envelope import BOUND_TERMS, R_DRAM, R_L15, R_L2, evaluate_envelopes
from tsbatch.kernels.traffic import NUMPY_PAIRWISE_MIN, compulsory_work
from tsbatch.kernels.groupsort import group_first_k, group_lexorder
from tsbatch.engine.rank import rank
from tsbatch.boundary.schema import to_polars, validate

__all__ = ["lower_bound", "take_plan", "bound_rows", "bound_threads", "workload_counts",
           "TopKScreen", "screened_rank", "COUNT_COL"]

#: column of a counts frame holding each workload's total row count
COUNT_COL = "_wl_n"
_POS = "_pos"
_WID = "_wid"
_ROW = "_r_row"  # a live row's place in the running set (result)


# ----------------------------------------------------------------------------- bound
def take_plan(plan: TilePlan, idx: np.ndarray) -> TilePlan:
    """The rows ``idx`` of a lowered plan."""
    kw = {}
    names = _PLAN_FIELDS.get(type(plan))
    if names is None:  # the field names once per class (dataclasses.fields: ~8 us a call)
        names = _PLAN_FIELDS[type(plan)] = tuple(f.name for f in dataclasses.fields(plan))
    for name in names:
        v = getattr(plan, name)
        if isinstance(v, np.ndarray):
            kw[name] = v[idx]
        elif isinstance(v, dict):
            kw[name] = {k: (a[idx] if isinstance(a, np.ndarray) else a) for k, a in v.items()}
        else:
            kw[name] = v
    return TilePlan(**kw)


_PLAN_FIELDS: dict = {}


#: relative margin under :func:`compulsory_fractions`: the cache model's fast
#: paths agree with its general path to rtol 1e-9, atol 1e-12
#: (tests/test_cache_fast.py), and its sums round
COMPULSORY_MARGIN = 1e-6


def compulsory_fractions(plan: TilePlan, p: np.ndarray, sms: int,
                         wave_samples: int = WAVE_SAMPLES) -> np.ndarray:
    """Per row and tensor ``(n, T)``: a floor of the cache model's DRAM fraction
    and of its L1.5 miss fraction ``1 - h15``.

    ``(1 - COMPULSORY_MARGIN) / share_t - 1e-11`` (at least 0), ``share_t`` the
    product of the grid dimensions tensor ``t`` is reused along, on rows whose
    launch the cache model analyses wave by wave (``W = ceil(tiles / (sms *
    p)) <= wave_samples``); 0 on the other rows.

    Proof (tsbatch/kernels/reuse.py, ``_cache_one``, ``_wave``): a per-step
    tensor's block is identified by the tile's coordinates along the
    dimensions it is *not* reused on, so the ``tiles`` programs touch
    ``tiles / share_t`` distinct blocks, each program once per step. With
    ``W <= max_waves`` every wave is analysed and no interior weight applies,
    and every access adds ``kf`` to ``acc[t]``: ``acc[t] = kf * tiles``. The
    first touch of a block in the launch has no previous touch: its
    within-step distance is infinite (it is first in its L1.5 group's
    subsequence too: L1.5 hit 0) and its cross-wave hit is 0 (``lastwave =
    -1 < valid_from``), so it adds ``kf`` to ``req2`` and to ``req2 - hit2``;
    every other access adds a non-negative amount to both (hit probabilities
    lie in [0, 1]). Hence ``dram[t] = (req2 - hit2) / acc >= 1 / share_t`` and
    ``1 - h15[t] = req2 / acc >= 1 / share_t``. The margin covers the fast
    paths' agreement with that general path and rounding. Tensors not read
    per step get 0 (their requested bytes per step are 0 anyway).
    """
    g = (plan.g0, plan.g1, plan.g2)
    tiles = g[0] * g[1] * g[2]
    share = np.ones(plan.t_mask.shape, dtype=np.float64)
    for d in range(3):
        reused = ((plan.t_mask >> d) & 1).astype(bool)
        share *= np.where(reused, g[d].astype(np.float64)[:, None], 1.0)
    conc = np.int64(sms) * np.maximum(p, 1)
    whole = (tiles > 0) & ((tiles + conc - 1) // conc <= wave_samples)
    frac = np.divide(1.0 - COMPULSORY_MARGIN, share, out=np.zeros_like(share), where=share > 0)
    frac = np.maximum(frac - 1e-11, 0.0)
    return np.where(whole[:, None] & plan.t_per_step.astype(bool), frac, 0.0)


def bound_work_numpy(plan: TilePlan, p: np.ndarray, hw: HwSpec, wave_samples: int,
                     work_iter: np.ndarray) -> np.ndarray:
    """:func:`lower_bound`'s L1.5, L2 and DRAM columns, written into ``work_iter``
    (the numpy form of :func:`tsbatch.kernels.traffic.compulsory_work`: rows of
    eight tensors or more, whose sums numpy takes pairwise)."""
    per_step = plan.t_per_step.astype(bool)
    req = np.where(per_step, plan.t_bytes, 0.0)
    frac = compulsory_fractions(plan, p, hw.sm_count, wave_samples)
    if hw.has_l15:
        work_iter[:, R_L15] = req.sum(axis=1)
        work_iter[:, R_L2] = (req * frac).sum(axis=1)
    else:
        work_iter[:, R_L15] = 0.0
        work_iter[:, R_L2] = req.sum(axis=1)  # h15 is 0 without an L1.5 tier
    dreq = req if plan.t_dram_scale is None else req * plan.t_dram_scale
    work_iter[:, R_DRAM] = (dreq * frac).sum(axis=1)
    return work_iter


def lower_bound(plan: TilePlan, p: np.ndarray, hw: HwSpec, *, own: bool = False,
                wave_samples: int = WAVE_SAMPLES) -> np.ndarray:
    """A lower bound of :func:`evaluate_plan`'s latency.

    ``plan`` and ``p`` (resident tiles per SM) hold feasible rows only;
    ``wave_samples`` is the one the predictions are made with.
    Mirrors the work split of :func:`tsbatch.engine.evaluate.evaluate_plan` with
    each tensor's hit rates at their best: the L1.5 column does not depend on
    the hit rates; the L2 column (L1.5 parts) and the DRAM column take the
    compulsory fractions of :func:`compulsory_fractions` (0 where the launch's
    waves are sampled), below the cache model's fractions, and the DRAM column
    its ``t_dram_scale`` as the model does. The envelope is evaluated without
    its queued-wave term, which only ever adds time and is the one part not
    non-decreasing in the work (its burst share falls when the busiest
    resource's loop work grows), with a floor of the ring's queue in the loop
    and without the busiest resource's floor between waves
    (:data:`tsbatch.kernels.envelope.BOUND_TERMS`: the floor of the ring's
    queue takes 40 % less of the envelope's time than its mean-value analysis
    and predicts 1.2 % more rows in full, none 27 %; the waves' floors change
    no row of the 2M sweep and take 10 %). The envelope is non-decreasing in
    each wave's steady iteration and its terms only add time, so this lies
    below the envelope with the exact queue and the waves' floors, which is
    non-decreasing in every work entry (tests/test_kernels.py,
    ``test_bound_envelope_never_falls_when_work_rises``); every other input is
    the model's, so the bound never exceeds the prediction. ``own=True``: the caller gives up
    ``plan.work_iter``, which is then overwritten instead of copied.
    """
    work_iter = plan.work_iter if own else plan.work_iter.copy()
    if plan.t_bytes.shape[1] < NUMPY_PAIRWISE_MIN and work_iter.flags.c_contiguous \
            and work_iter.dtype == np.float64:
        # one pass (tsbatch.kernels.traffic.compulsory_work), equal to the bit to
        # the numpy below
        compulsory_work(plan.t_bytes, plan.t_per_step, plan.t_mask, plan.g0, plan.g1, plan.g2,
                        p, hw.sm_count, wave_samples, COMPULSORY_MARGIN, hw.has_l15,
                        plan.t_dram_scale, work_iter)
    else:
        bound_work_numpy(plan, p, hw, wave_samples, work_iter)
    # every other envelope input exactly as evaluate_plan passes it (the chain
    # too: it does not depend on the hit rates, and the loop's bookkeeping joins
    # it where there is one, so leaving it out would not give a lower bound);
    # and the turnover between full waves (plan.conv_us: the layout conversion
    # and, with it, the C stores' issue): its increment, max(inc, t - store +
    # the turnover), is non-decreasing in the loop work (t - store is the
    # prologue, loop and last compute step; the epilogue work is the model's),
    # though its excess over inc alone is not; without it the bound fell
    # further below the prediction on many-wave Triton Hopper rows and the
    # prune evaluated more of them
    kw = {"share_eff": plan.share_eff, "sync": plan.sync_us, "chain": plan.chain_us,
          "streams": plan.streams, "conv": plan.conv_us, "expose": plan.expose_us,
          "tc_cap": plan.tc_clock_cap, "smem_cap": plan.smem_clock_cap,
          "cuda_cap": plan.cuda_clock_cap}
    env = evaluate_envelopes(work_iter, plan.work_epi, plan.rate, plan.g0 * plan.g1 * plan.g2,
                             hw.sm_count, p, plan.ksteps, plan.stages, plan.warps,
                             plan.warps_full, plan.lat_us, plan.ovh_iter_us, plan.ovh_tile_us,
                             plan.persistent, plan.launch_us, latency_only=True, terms=BOUND_TERMS,
                             **kw)
    # 1e-12 under: the bound's arithmetic is not the prediction's (other work,
    # another queue term), so where the two agree in exact arithmetic they may
    # differ by rounding, and a bound a few ulps above a prediction equal to a
    # workload's threshold would screen out a row that ties
    return env["latency_us"] * (1.0 - BOUND_RTOL)


#: relative margin of :func:`lower_bound` for rounding (the envelope's
#: monotonicity and the queue terms' order hold to 1e-12 in tests/test_kernels.py)
BOUND_RTOL = 1e-12


#: rows bounded at a time: the columns of a slice stay in the CPU caches and in
#: heap memory that numpy reuses (1M-row slices page-fault every temporary);
#: 64k rows took ``bound_rows`` from 2.6 to 1.4 s per million rows
BOUND_CHUNK = 1 << 16


def bound_rows(df: pl.DataFrame, hw: HwSpec, family: str = "gemm",
               wave_samples: int = WAVE_SAMPLES) -> tuple[np.ndarray, np.ndarray]:
    """``(bound, infeasible)`` per row of a candidate frame.

    ``infeasible[i]``: row ``i`` is infeasible in :func:`evaluate` (known
    exactly from its occupancy). ``bound[i]``: a lower bound of row ``i``'s
    predicted latency, ``-inf`` where none is known (then the row is always
    predicted) and ``+inf`` for infeasible rows. Raises the same
    :class:`~tsbatch.errors.InputError` as :func:`evaluate` on bad input
    (the first bad slice's, in row order).
    Bounds :data:`BOUND_CHUNK` rows at a time, on :func:`bound_threads`
    threads: each slice's numpy, polars and numba work releases the GIL for
    most of its time, so two slices run at once on two cores.
    """
    if df.height <= BOUND_CHUNK:
        return _bound_slice(df, hw, family, 0, wave_samples)
    starts = range(0, df.height, BOUND_CHUNK)
    threads = min(bound_threads(), len(starts))
    one = lambda a: _bound_slice(df.slice(a, BOUND_CHUNK), hw, family, a, wave_samples)  # noqa: E731
    if threads > 1:
        with ThreadPoolExecutor(threads, thread_name_prefix="tsbatch-bound") as ex:
            parts = list(ex.map(one, starts))
    else:
        parts = list(map(one, starts))
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


#: ``TSBATCH_BOUND_THREADS`` overrides :func:`bound_threads` (1: serial)
BOUND_THREADS_ENV = "TSBATCH_BOUND_THREADS"


def bound_threads() -> int:
    """Threads that bound slices at once: ``TSBATCH_BOUND_THREADS`` if set, else
    the usable cores, at most 4. The bound calls no parallel numba kernel
    (their row loops run on :mod:`tsbatch.kernels._threads`), so any numba
    threading layer allows it."""
    env = os.environ.get(BOUND_THREADS_ENV, "").strip()
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            raise InputError(f"{BOUND_THREADS_ENV}={env!r}: expected a whole number of "
                             f"threads") from None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(4, cores or 1))


def _bound_slice(df: pl.DataFrame, hw: HwSpec, family: str, offset: int, wave_samples: int):
    fam = get_family(family)
    cols, is_lib = validate(df, fam, offset)
    n = df.height
    if is_lib.any() and fam.name == "gemm":
        cols, parent = gemm_family.expand_library(cols, is_lib, hw.arch)
    else:
        parent = np.arange(n, dtype=np.int64)
    plan = fam.lower(cols, hw)
    p, _ = residency(plan, hw)
    ok = np.flatnonzero(p > 0)
    # every row is bounded as if one tile were resident (no copy of the plan), and
    # the infeasible rows' values are then dropped
    b = lower_bound(plan, np.maximum(p, 1), hw, own=True, wave_samples=wave_samples) \
        if ok.size else np.zeros(p.shape[0])
    b = np.where(np.isnan(b), -np.inf, b)  # no usable bound: always predict
    lb_x = np.where(p > 0, b, np.inf)
    # a row (library row: its catalog tiles) is infeasible when no tile is feasible;
    # otherwise bounded by its least feasible tile's bound
    any_feas = np.zeros(n, dtype=bool)
    any_feas[parent[ok]] = True
    lb = np.full(n, np.inf)
    np.minimum.at(lb, parent, lb_x)
    lb = np.where(any_feas, lb, np.inf)
    lb = np.where(any_feas & (lb == np.inf), -np.inf, lb)  # an infinite bound: predict anyway
    return lb, ~any_feas


# ----------------------------------------------------------------------------- counts
def _key_frame(df: pl.DataFrame | pl.LazyFrame, workload: list[str]):
    """The workload columns, categoricals as text (so joins need no string cache)."""
    sch = df.collect_schema() if isinstance(df, pl.LazyFrame) else df.schema
    return df.select([pl.col(c).cast(pl.String) if isinstance(sch[c], (pl.Categorical, pl.Enum))
                      else pl.col(c) for c in workload])


def _workload_hash(df: pl.DataFrame, workload: list[str]) -> np.ndarray:
    """A 64-bit hash per row of the workload columns, the same for equal values
    whatever their integer width or text type (nulls hash alike)."""
    sch = df.schema
    cols = []
    for c in workload:
        t = sch[c]
        if isinstance(t, (pl.Categorical, pl.Enum)) or t == pl.String:
            cols.append(pl.col(c).cast(pl.String))
        elif t.is_integer():
            cols.append(pl.col(c).cast(pl.Int64))
        else:
            cols.append(pl.col(c))
    return df.select(pl.struct(cols).hash(seed=0x7453)).to_series().to_numpy()


def workload_counts(source, workload: list[str]) -> pl.DataFrame:
    """Rows per workload: the ``workload`` columns and :data:`COUNT_COL`.

    ``source`` is a frame or a Parquet path; a path is scanned in a stream,
    reading only the workload columns.
    """
    if not workload:
        n = (pl.scan_parquet(source).select(pl.len()).collect().item()
             if not isinstance(source, pl.DataFrame) else source.height)
        return pl.DataFrame({COUNT_COL: [n]}, schema={COUNT_COL: pl.Int64})
    if isinstance(source, pl.DataFrame):
        return (_key_frame(source, workload).group_by(workload, maintain_order=True)
                .agg(pl.len().cast(pl.Int64).alias(COUNT_COL)))
    lf = _key_frame(pl.scan_parquet(source), workload)
    return (lf.group_by(workload).agg(pl.len().cast(pl.Int64).alias(COUNT_COL))
            .collect(engine="streaming"))


# ----------------------------------------------------------------------------- helpers
def _group_starts(g: np.ndarray) -> np.ndarray:
    """For sorted group ids ``g``: each element's offset within its group."""
    if g.size == 0:
        return np.zeros(0, dtype=np.int64)
    brk = np.flatnonzero(g[1:] != g[:-1]) + 1
    starts = np.concatenate([[0], brk])
    lens = np.diff(np.concatenate([starts, [g.size]]))
    return np.arange(g.size, dtype=np.int64) - np.repeat(starts, lens)


def _merge_first_k(r_wid, r_key, r_pos, r_alive, c_wid, c_key, c_pos, k):
    """Merge candidates into a running set holding the first ``k[g]`` rows of
    each group ``g`` by ``(key, pos)`` (its live rows: ``r_alive``).

    Only the groups of the candidates are touched: their live rows and the
    candidates are ranked together, the rest of the set stays as it is.
    Returns ``(ridx, keep_r, keep_c, touched, kth)``: the live rows of the
    touched groups (``ridx``) and which of them stay, which candidates enter,
    the touched groups' mask and their new ``k``-th keys (``kth[touched]``;
    ``+inf`` while a group holds fewer than ``k`` rows).
    """
    touched = np.zeros(k.shape[0], dtype=bool)
    touched[c_wid] = True
    ridx = np.flatnonzero(r_alive & touched[r_wid])
    nr = ridx.shape[0]
    a_wid = np.concatenate([r_wid[ridx], c_wid])
    a_key = np.concatenate([r_key[ridx], c_key])
    keep, kth = group_first_k(a_wid, a_key, np.concatenate([r_pos[ridx], c_pos]), k)
    return ridx, keep[:nr], keep[nr:], touched, kth


def _keys(res: pl.DataFrame) -> np.ndarray:
    """:func:`rank`'s key: latency of feasible rows, +inf otherwise (and for nulls)."""
    lat = res.get_column("latency_us").cast(pl.Float64).to_numpy()
    feas = res.get_column("feasible").fill_null(False).to_numpy()
    return np.where(feas & ~np.isnan(lat), lat, np.inf)


# ----------------------------------------------------------------------------- screen
class TopKScreen:
    """Screened top-``K`` per workload over a stream of candidate batches.

    ``counts`` (from :func:`workload_counts`) gives every workload's row
    count over the whole input; batches are then given in input order with
    :meth:`add`, and :meth:`result` returns exactly
    ``rank(evaluate(all rows), workload, top)``.

    ``screen=False`` predicts every feasible row (same result; for checking).
    ``sampling`` (``k_samples``, ``wave_samples``, ``max_lookback``) goes to
    every :func:`evaluate` call.
    Counters: ``n_rows``, ``n_predicted`` (rows given to :func:`evaluate`),
    ``n_infeasible`` (rows :func:`evaluate` would mark infeasible).
    """

    #: dead rows of the running set are dropped once more than this many (and a quarter)
    COMPACT_MIN = 50_000
    #: surveyed rows below their workload's cut are merged into P once more than this
    #: many (and more than P holds) are pending
    SURVEY_FLUSH_MIN = 100_000

    def __init__(self, hw: str | HwSpec, family: str, workload: list[str] | tuple[str, ...],
                 top: float, counts: pl.DataFrame, *, memo: CacheMemo | None = None,
                 timings: dict | None = None, screen: bool = True, check: bool = True,
                 sampling: dict | None = None):
        self.hw = resolve_hw(hw)
        self.sampling = dict(sampling or {})
        self._wave_samples = int(self.sampling.get("wave_samples", WAVE_SAMPLES))
        self.family = family
        get_family(family)
        self.workload = list(workload)
        self.top = float(top)
        self.memo = memo if memo is not None else CacheMemo()
        self.timings = timings
        self.screen = bool(screen)
        self.check = bool(check)
        self._ids = counts.select(self.workload).with_row_index(_WID) if self.workload else None
        # workload ids by a 64-bit hash of the workload columns, joined to the
        # counts' hashes (one integer column: 20-40 ms per million rows, against
        # ~140 ms for a join on the columns themselves); the column join stays
        # the way when two workloads of the counts share a hash
        self._hash_ids: pl.DataFrame | None = None
        if self.workload:
            h = _workload_hash(counts, self.workload)
            if np.unique(h).shape[0] == h.shape[0]:
                self._hash_ids = pl.DataFrame({"_h": h, _WID: np.arange(h.shape[0])})
        self.n_w = counts.get_column(COUNT_COL).cast(pl.Int64).to_numpy()
        # keep_count(n, top), as rank computes it (same float operations)
        self.k_w = np.maximum(1.0, np.ceil(self.n_w * self.top - 1e-9)).astype(np.int64)
        self.n_rows = 0
        self.n_predicted = 0
        self.n_infeasible = 0
        self.rounds = 0
        self._template: pl.DataFrame | None = None
        self._released = False
        self._empty_running_set()
        self._thr = np.full(self.k_w.shape[0], np.inf)  # K-th key of R per workload

    def _empty_running_set(self) -> None:
        """The running set R: frames of evaluated rows (+ _pos, _wid) and their
        arrays; rows pushed out are only marked dead (a merge touches only the
        workloads of the rows that can enter), and dropped once they are a
        quarter of R."""
        self._r_frames: list[pl.DataFrame] = []
        self._r_wid = np.zeros(0, dtype=np.int64)
        self._r_key = np.zeros(0)
        self._r_pos = np.zeros(0, dtype=np.int64)
        self._r_alive = np.zeros(0, dtype=bool)

    @property
    def _R(self) -> pl.DataFrame | None:
        """The running set as one frame (its dead rows dropped)."""
        self._compact()
        return self._r_frames[0] if self._r_frames else None

    def _compact(self) -> None:
        if not self._r_frames or (len(self._r_frames) == 1 and self._r_alive.all()):
            return
        frame = pl.concat(self._r_frames, how="vertical")
        if not self._r_alive.all():
            frame = frame.filter(pl.Series(self._r_alive))
        self._r_frames = [frame]
        a = self._r_alive
        self._r_wid, self._r_key, self._r_pos = self._r_wid[a], self._r_key[a], self._r_pos[a]
        self._r_alive = np.ones(frame.height, dtype=bool)

    # ------------------------------------------------------------------ internals
    def _tick(self, name: str, t0: float) -> None:
        if self.timings is not None:
            self.timings[name] = self.timings.get(name, 0.0) + (time.perf_counter() - t0)

    def _wid(self, df: pl.DataFrame) -> np.ndarray:
        if self._ids is None:
            return np.zeros(df.height, dtype=np.int64)
        if self._hash_ids is not None:
            j = pl.DataFrame({"_h": _workload_hash(df, self.workload)}).join(
                self._hash_ids, on="_h", how="left", maintain_order="left")
            wid = j.get_column(_WID)
            if wid.null_count():
                raise ValueError("a batch holds a workload missing from the counts")
            return wid.cast(pl.Int64).to_numpy()
        j = _key_frame(df, self.workload).join(self._ids, on=self.workload, how="left",
                                               nulls_equal=True, maintain_order="left")
        wid = j.get_column(_WID)
        if wid.null_count():
            raise ValueError("a batch holds a workload missing from the counts")
        return wid.cast(pl.Int64).to_numpy()

    def _evaluate(self, df: pl.DataFrame, rows: np.ndarray, pos: np.ndarray,
                  wid: np.ndarray) -> pl.DataFrame:
        if rows.shape[0] == df.height:
            sub = df
        elif rows.shape[0] and (rows[1:] > rows[:-1]).all():
            # rows in input order (every caller's): a mask filter gives the same frame
            # as the gather, ~3x faster (65k of 1M rows: 9.7 -> 3.4 ms)
            mask = np.zeros(df.height, dtype=bool)
            mask[rows] = True
            sub = df.filter(pl.Series(mask))
        else:
            sub = df[rows]
        res = evaluate(sub, self.hw, self.family, timings=self.timings, cache_memo=self.memo,
                       **self.sampling)
        self.n_predicted += rows.shape[0]
        return res.with_columns(pl.Series(_POS, pos[rows], dtype=pl.Int64),
                                pl.Series(_WID, wid[rows], dtype=pl.Int64))

    # ------------------------------------------------------------------ API
    def add(self, batch) -> None:
        """Screen the next batch of candidates (input order) into the running set."""
        self._check_open()
        df = to_polars(batch)
        if self._template is None:
            self._template = df.head(0)
        n = df.height
        if n == 0:
            return
        t0 = time.perf_counter()
        pos = np.arange(self.n_rows, self.n_rows + n, dtype=np.int64)
        wid = self._wid(df)
        lb, infeas = bound_rows(df, self.hw, self.family, self._wave_samples)
        self._tick("bound_s", t0)
        self._screen_rows(df, pos, wid, lb, infeas, np.ones(n, dtype=bool), rounds=self.screen)
        self.n_rows += n

    def rank_stream(self, batches, progress=None) -> pl.DataFrame:
        """``rank(evaluate(all rows), ...)`` of a stream that can be read three times.

        ``batches()`` returns a fresh iterator over the same batches, in input
        order, each time it is called. One pass of :meth:`add` must screen
        the first batches of a workload spread over many batches against the
        few of its rows seen so far, so it predicts far more rows than can be
        kept. Here:

        1. *Survey* (bounds only): every row's bound is computed and kept
           (float32, rounded down, so still a lower bound), with its
           workload's id (at most 4 bytes; 2 below 65,536 workloads), and per
           workload the first ``K + K // 2`` feasible rows by
           ``(bound, position)`` over the *whole* input, the set ``P``.
        2. The rows of ``P`` are predicted and merged into the running set,
           whose ``K``-th key per workload is then at most a few rows from
           the final one (the ``K``-th key of a subset is never below the
           ``K``-th key of all rows, so it is still a valid threshold).
        3. The other rows are screened against it as :meth:`add` does.

        The running set is the first ``K`` rows of the rows merged so far at
        every step, and every row never predicted has a bound strictly above
        a threshold that is at least the global ``K``-th key, so the result
        is the same as :meth:`add`'s (the argument in the module docstring).
        ``progress(pass_name, rows)``, if given, is called after each batch of
        each pass. The screen's running set is released once the result is
        made (``result(release=True)``): one stream per screen.
        """
        self._check_open()
        lbs: list[np.ndarray] = []
        wids: list[np.ndarray] = []  # workload ids, kept in the least integer type
        wdt = np.min_scalar_type(max(self.k_w.shape[0] - 1, 0))
        p_wid = np.zeros(0, dtype=np.int64)
        p_lb = np.zeros(0)
        p_pos = np.zeros(0, dtype=np.int64)
        # P: K + K // 2 rows per workload. A wider P costs its own predictions but
        # leaves a threshold closer to the final one for the third pass: rows
        # predicted in full, 2M sweep, K + K // 4 -> K + K // 2 -> K + K: h100 top 1 %
        # 46,157 -> 34,084 -> 34,129, 2 % 77,220 -> 59,778 -> 63,228, 5 % 145,410 ->
        # 129,013 -> 133,038, 10 % 262,816 -> 254,094 -> 260,624; a100 5 % 136,887 ->
        # 130,108 -> 134,501; l40s 5 % 212,929 -> 179,165 -> 174,797; within 0.04 %
        # either way at 20 % (h100, a100) and on b200 at 5 % (docs/gemm_accuracy.md,
        # "Speed, session 4")
        step_w = self.k_w + self.k_w // 2
        cut = np.full(step_w.shape[0], np.inf)  # per workload: P's last bound once full
        pend: list = []  # rows below the cut, merged into P in bulk
        n_pend = 0

        def _flush(p_wid, p_lb, p_pos, pend):
            """P and the pending rows: the first ``step_w`` of each workload."""
            a_wid = np.concatenate([p_wid, *[x[0] for x in pend]])
            a_lb = np.concatenate([p_lb, *[x[1] for x in pend]])
            a_pos = np.concatenate([p_pos, *[x[2] for x in pend]])
            pend.clear()
            keep, kth = group_first_k(a_wid, a_lb, a_pos, step_w)
            return a_wid[keep], a_lb[keep], a_pos[keep], kth

        at = 0
        for batch in batches():  # ---- 1: survey
            df = to_polars(batch)
            if self._template is None:
                self._template = df.head(0)
            t0 = time.perf_counter()
            wid = self._wid(df)
            lb, infeas = bound_rows(df, self.hw, self.family, self._wave_samples)
            lb32 = lb.astype(np.float32)
            lb32 = np.where(lb32.astype(np.float64) > lb,
                            np.nextafter(lb32, np.float32(-np.inf)), lb32)
            lbs.append(np.where(infeas, np.float32(np.inf), lb32))
            wids.append(wid.astype(wdt))
            # a row enters P only below its workload's current cut (a later row
            # loses a tie on position); the cut only filters, so one not yet
            # lowered by the pending rows lets more rows through, never fewer
            ok = np.flatnonzero(~infeas & (lb < cut[wid]))
            pend.append((wid[ok], lb[ok], at + ok))
            n_pend += ok.size
            if n_pend > max(p_wid.shape[0], self.SURVEY_FLUSH_MIN):
                p_wid, p_lb, p_pos, cut = _flush(p_wid, p_lb, p_pos, pend)
                n_pend = 0
            at += df.height
            self._tick("bound_s", t0)
            if progress is not None:
                progress("bounds", df.height)
        p_wid, p_lb, p_pos, cut = _flush(p_wid, p_lb, p_pos, pend)
        in_p_all = np.zeros(at, dtype=bool)  # 1 byte a row: is the row in P
        in_p_all[p_pos] = True
        del p_wid, p_lb, p_pos
        for phase in (0, 1):  # ---- 2: the rows of P; 3: the others, screened
            at = 0
            for i, batch in enumerate(batches()):
                df = to_polars(batch)
                n = df.height
                if i >= len(lbs) or lbs[i].shape[0] != n:
                    raise RuntimeError("rank_stream: the batches changed between passes")
                if n == 0:
                    continue
                pos = np.arange(at, at + n, dtype=np.int64)
                in_p = in_p_all[at:at + n]
                lb = lbs[i].astype(np.float64)
                infeas = lb == np.inf
                wid = wids[i].astype(np.int64)
                if phase == 0:
                    # P's rows alone (~7 % of a batch), as a batch of their own: the
                    # others are left out anyway, and the screen's arrays are then
                    # P-sized, not batch-sized (its own work: ~0.05 -> ~0.01 s a 1M batch)
                    sel = np.flatnonzero(in_p)
                    if sel.size:
                        self._screen_rows(df.filter(pl.Series(in_p)), pos[sel], wid[sel],
                                          lb[sel], infeas[sel], np.ones(sel.size, dtype=bool),
                                          rounds=self.screen)
                else:
                    self._screen_rows(df, pos, wid, lb, infeas, ~in_p, rounds=self.screen)
                at += n
                if progress is not None:
                    progress("best rows" if phase == 0 else "screen", n)
            if at != sum(x.shape[0] for x in lbs):
                raise RuntimeError("rank_stream: the batches changed between passes")
        self.n_rows += at
        # the survey's arrays (~7 bytes a row of the input) are not needed to rank,
        # and ranking is the run's peak: free them first
        del lbs, wids, in_p_all
        return self.result(release=True)

    def _screen_rows(self, df: pl.DataFrame, pos: np.ndarray, wid: np.ndarray, lb: np.ndarray,
                     infeas: np.ndarray, cand: np.ndarray, rounds: bool) -> None:
        """Screen the rows ``cand`` of a batch into the running set (the others are
        left out, as if not in the batch); ``rounds=False`` predicts every
        feasible one of them."""
        n = df.height
        infeas = infeas & cand
        if not rounds:
            lb = np.where(infeas, np.inf, -np.inf)
        k = self.k_w[wid]
        step = np.full(n, n, dtype=np.int64) if not rounds else k + k // 4
        key = np.full(n, np.inf)
        done = np.zeros(n, dtype=bool)
        parts: list[pl.DataFrame] = []
        part_rows: list[np.ndarray] = []
        rnd = 0
        while True:
            t0 = time.perf_counter()
            # an upper estimate of the K-th key of (R + rows known so far): the least of
            # R's and the batch's own (the K-th of a union is at most either's)
            ev = np.flatnonzero(done)
            thr = np.minimum(self._thr, group_first_k(wid[ev], key[ev], pos[ev], self.k_w)[1])
            need = np.flatnonzero(cand & ~infeas & ~done & (lb <= thr[wid]))
            if need.size == 0:
                self._tick("screen_s", t0)
                break
            o = group_lexorder(wid[need], lb[need], pos[need])
            need = need[o]
            take = np.sort(need[_group_starts(wid[need]) < (step[need] << min(rnd, 30))])
            self._tick("screen_s", t0)
            res = self._evaluate(df, take, pos, wid)
            kk = _keys(res)
            if self.check:
                self._check(res, take, lb, kk)
            key[take] = kk
            done[take] = True
            parts.append(res)
            part_rows.append(take)
            rnd += 1
        self.rounds += rnd

        # ---- merge: the first K by (key, pos) of R and this batch's known rows. A
        # known row whose key is above its workload's threshold (R holds K rows at
        # or below it) cannot enter; the others are merged with R's live rows of
        # their workloads only, the rest of R staying as it is
        t0 = time.perf_counter()
        known = np.flatnonzero(done | infeas)
        cand = known[key[known] <= self._thr[wid[known]]]
        ridx, keep_r, keep_c, touched, kth = _merge_first_k(
            self._r_wid, self._r_key, self._r_pos, self._r_alive, wid[cand], key[cand],
            pos[cand], self.k_w)
        keep_b = np.zeros(n, dtype=bool)
        keep_b[cand[keep_c]] = True
        extra = np.flatnonzero(keep_b & ~done)  # infeasible rows within the first K
        self._tick("screen_s", t0)
        if extra.size:
            res = self._evaluate(df, extra, pos, wid)
            if self.check and res.get_column("feasible").any():
                raise RuntimeError("screen: a row judged infeasible by its occupancy is "
                                   "feasible in evaluate()")
            parts.append(res)
            part_rows.append(extra)
        t0 = time.perf_counter()
        self.n_infeasible += int(infeas.sum())
        for res in parts[:rnd]:  # feasibility of library rows is known only once predicted
            self.n_infeasible += int((~res.get_column("feasible")).sum())
        self._r_alive[ridx[~keep_r]] = False
        if parts:
            rows = np.concatenate(part_rows)
            sel = keep_b[rows]
            rows = rows[sel]
            if rows.size:
                self._r_frames.append(pl.concat(parts, how="vertical").filter(pl.Series(sel)))
                self._r_wid = np.concatenate([self._r_wid, wid[rows]])
                self._r_key = np.concatenate([self._r_key, key[rows]])
                self._r_pos = np.concatenate([self._r_pos, pos[rows]])
                self._r_alive = np.concatenate([self._r_alive, np.ones(rows.size, dtype=bool)])
        self._thr[touched] = kth[touched]  # the K-th key of the touched workloads
        n_dead = self._r_alive.shape[0] - int(self._r_alive.sum())
        if n_dead > self.COMPACT_MIN and 4 * n_dead > self._r_alive.shape[0]:
            self._compact()
        self._tick("screen_s", t0)

    def _check(self, res: pl.DataFrame, rows: np.ndarray, lb: np.ndarray, key: np.ndarray) -> None:
        """The screen's two assumptions, checked on every row it predicts."""
        if (key < lb[rows]).any():
            i = int(np.flatnonzero(key < lb[rows])[0])
            raise RuntimeError(f"screen: the perfect-caching bound {lb[rows][i]!r} exceeds the "
                               f"prediction {key[i]!r}; the bound is no longer valid")
        if (~res.get_column("feasible").to_numpy() & np.isfinite(lb[rows])).any():
            raise RuntimeError("screen: a row judged feasible by its occupancy is infeasible "
                               "in evaluate()")

    def result(self, release: bool = False) -> pl.DataFrame:
        """``rank(evaluate(all rows added), workload, top)``, row for row.

        ``release=True`` (the end of :meth:`rank_stream`) then frees the running
        set and the cache memo, so that writing the result does not hold them
        too; the screen takes no more batches after that."""
        self._check_open()
        t0 = time.perf_counter()
        if not self._r_frames:  # nothing predicted: no rows at all
            if self._template is None:
                raise ValueError("no batch was added")
            out = rank(evaluate(self._template, self.hw, self.family, **self.sampling),
                       self.workload, self.top)
        else:
            # rank a narrow frame (the columns rank() reads, the workload's count and
            # each live row's place in the running set), then gather the kept rows'
            # full columns once: the wide rows are copied once, not filtered and
            # sorted (the running set at the end is the run's largest object)
            wide = (pl.concat(self._r_frames, how="vertical") if len(self._r_frames) > 1
                    else self._r_frames[0])
            live = np.flatnonzero(self._r_alive)
            wl = [c for c in self.workload if c in wide.columns]
            narrow = wide.select(list(dict.fromkeys([*wl, "feasible", "latency_us", _POS])))[live]
            narrow = narrow.with_columns(
                pl.Series(COUNT_COL, self.n_w[self._r_wid[live]], dtype=pl.Int64),
                pl.Series(_ROW, live, dtype=pl.Int64))
            kept = rank(narrow, wl, self.top, order_col=_POS, count_col=COUNT_COL)
            del narrow
            out = (wide.drop(_WID, _POS)[kept.get_column(_ROW).to_numpy()]
                   .with_columns(kept.get_column("rank")))
            del wide
        self._tick("rank_s", t0)
        if release:
            self._released = True
            self._empty_running_set()
            self.memo = CacheMemo(self.memo.max_problems)
        return out

    def _check_open(self) -> None:
        if self._released:
            raise RuntimeError("this TopKScreen's running set was released by rank_stream; "
                               "use a new screen")


def screened_rank(candidates, hw: str | HwSpec, workload: list[str] | tuple[str, ...],
                  top: float = 1.0, family: str = "gemm", *, batch_rows: int | None = None,
                  memo: CacheMemo | None = None, timings: dict | None = None,
                  screen: bool = True, survey: bool = True, sampling: dict | None = None,
                  stats: dict | None = None) -> pl.DataFrame:
    """``rank(evaluate(candidates, hw, family), workload, top)`` computed by screening.

    ``batch_rows`` feeds the rows in batches of that size (as a stream would),
    surveyed first (:meth:`TopKScreen.rank_stream`) or, with ``survey=False``,
    in one pass of :meth:`TopKScreen.add`; ``stats``, if given, is filled
    with the screen's counters.
    """
    df = to_polars(candidates)
    wl = [c for c in workload if c in df.columns]
    scr = TopKScreen(hw, family, wl, top, workload_counts(df, wl), memo=memo, timings=timings,
                     screen=screen, sampling=sampling)
    step = batch_rows if batch_rows and batch_rows > 0 else max(df.height, 1)

    def batches():
        return (df.slice(a, step) for a in range(0, max(df.height, 1), step))

    if survey and step < df.height:
        out = scr.rank_stream(batches)
    else:
        for b in batches():
            scr.add(b)
        out = scr.result()
    if stats is not None:
        stats.update(rows=scr.n_rows, predicted=scr.n_predicted, infeasible=scr.n_infeasible,
                     rounds=scr.rounds)
    return out
