"""The evaluation driver: candidates in, one result row per candidate out.

Algorithm 1 of TileSight over a whole batch::

    validate  ->  expand library rows  ->  lower (family, numpy)
      -> resident tiles per SM (numba)           §3.4
      -> cache model on unique cache problems    §3.5  (shared by rows)
      -> envelope and waves (numba)              §3.4, Algorithm 2
      -> result columns (+ best library tile per library row)

No Python loop runs per candidate row.
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np
import polars as pl

from kernels_catalog import gemm as gemm_family
from kernels_catalog.base import MMA_PATHS, Family, TilePlan
from kernels_catalog.registry import FAMILIES, detect_family, get_family, no_family_message
from tsbatch.errors import InputError
from tsbatch.hw import HwSpec, UnknownHardwareError, get_hw
from tsbatch.kernels._heap import keep_freed_heap
from tsbatch.kernels.envelope import (
    N_RES, R_DRAM, R_L2, R_NAMES, evaluate_envelopes,
)
from tsbatch.kernels.occupancy import REASON_TEXT, resident_tiles
from tsbatch.kernels.reuse import cache_hit_rates
from tsbatch.kernels.rowhash import RowIndex, dedup_rows, grown
from tsbatch.kernels.traffic import (
    NUMPY_PAIRWISE_MIN, bottleneck_codes, split_edge_rows, split_traffic,
)
from tsbatch.boundary.schema import to_polars, validate

__all__ = ["FAMILIES", "RESULT_COLUMNS", "CacheMemo", "evaluate", "evaluate_plan", "resolve_hw",
           "get_family", "detect_family", "no_family_message", "residency"]

#: result columns and their meaning (units in the names)
RESULT_COLUMNS = {
    "feasible": "the configuration can run on this GPU",
    "infeasible_reason": "why not (empty when feasible)",
    "latency_us": "predicted kernel time, microseconds (null when infeasible)",
    "t_prologue_us": "pipeline fill time summed over waves",
    "t_steady_us": "steady-state time summed over waves",
    "t_epilogue_us": "drain and store time summed over waves",
    "t_launch_us": "fixed launch overhead",
    "t_steady_iter_us": "steady-state time of one reduction iteration on one SM",
    "waves": "tile waves (the last may be a partial tail)",
    "tail_tiles": "tiles in the partial tail wave (0: none)",
    "resident_tiles": "tile-blocks resident per SM",
    "pipeline_depth": "loads in flight d = resident x (stages - 1)",
    "l15_hit": "fraction of global loads hitting the L1.5 tier",
    "l2_hit": "fraction of L2 requests hitting L2",
    "dram_bytes": "bytes moved to and from DRAM",
    "l2_bytes": "bytes requested from L2",
    "achieved_tflops": "useful FLOPs / latency",
    "mma_path": "tensor-core instruction path (wgmma, mma_sync, fma)",
    "register_spill": "estimated registers per thread spilled",
    **{f"util_{r}": f"fraction of the kernel time the {r} resource is busy" for r in R_NAMES},
    "bottleneck": "the resource with the highest utilization ('latency' when none "
                  "exceeds 60 %: fill/latency bound; 'launch' when launch dominates)",
    "library_tile": "for library rows, the catalog tile that won (BMxBNxBK/stages/warps/split); "
                    "'+stream-K floor' where the row is priced at the split-K kernel of the "
                    "stream-K rule instead (its excess in t_epilogue_us)",
    "steady_order": "the legal issue order of the loop body that won (its synchronous actions, "
                    "Eq. 5)",
    "t_chain_us": "that order's chain: one iteration of one issue stream at full rates (us)",
}

_BOTTLENECK_MIN_UTIL = 0.6


#: the cache model's sampling defaults (keyword arguments of :func:`evaluate`)
DEFAULT_SAMPLING = {"k_samples": 4, "wave_samples": 8, "max_lookback": 4}


def check_sampling(sampling: dict | None) -> dict:
    """``sampling`` with defaults filled; raises :class:`InputError` on a bad value."""
    out = dict(DEFAULT_SAMPLING)
    for k, v in (sampling or {}).items():
        if k not in out:
            raise InputError(f"unknown sampling option {k!r}; known: {', '.join(out)}")
        if v is None:
            continue
        least = 2 if k == "wave_samples" else 1
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < least:
            raise InputError(f"{k} must be an integer of at least {least}, got {v!r}")
        out[k] = int(v)
    return out


def sampling_metadata(sampling: dict | None) -> dict:
    """The provenance entry recording the sampling a result was computed with."""
    return {"sampling": check_sampling(sampling)}


def resolve_hw(hw: str | HwSpec) -> HwSpec:
    try:
        return get_hw(hw)
    except UnknownHardwareError as exc:
        raise InputError(str(exc)) from None


def residency(plan: TilePlan, hw: HwSpec) -> tuple[np.ndarray, np.ndarray]:
    """Resident tiles per SM and reason codes, with the program's rules applied:
    a row breaking rule ``k`` gets ``p = 0`` and code ``len(REASON_TEXT) + k - 1``."""
    p, reason = resident_tiles(plan.smem_block, plan.regs_thread, plan.threads, hw)
    if plan.blocked is not None and plan.blocked.any():
        b = plan.blocked > 0
        p = np.where(b, 0, p)
        reason = np.where(b, len(REASON_TEXT) + plan.blocked - 1, reason)
    return p, reason


def reason_names(plan: TilePlan) -> list[str]:
    """The text of every reason code :func:`residency` gives for ``plan``."""
    return [REASON_TEXT[r] for r in range(len(REASON_TEXT))] + list(plan.rules)


def order_names(plan: TilePlan, fam: Family) -> tuple[list[str], np.ndarray]:
    """The winning legal order of each row as ``(names, codes)``."""
    prog = fam.program
    if prog is None:
        return [""], np.zeros(len(plan), dtype=np.int64)
    codes = plan.order_idx if plan.order_idx is not None else np.zeros(len(plan), dtype=np.int64)
    return prog.order_texts(), codes


class CacheMemo:
    """Results of solved cache problems, by key, shared by the chunks of a batch.

    A cache problem's results depend only on its key (every input of
    ``cache_hit_rates`` that varies by row) and on the GPU and sampling, which
    are fixed per memo; so a problem met again in a later chunk takes the
    stored results, bit for bit. Keys are found by exact value in a hash
    index (:class:`~tsbatch.kernels.rowhash.RowIndex`).
    At most ``max_problems`` are kept (later ones are solved, not stored).
    The first call binds the memo to its GPU and sampling; a call with
    another raises ``ValueError`` instead of mixing results.
    """

    def __init__(self, max_problems: int = 2_000_000):
        self.max_problems = max_problems
        self._index: RowIndex | None = None
        self._res: list[np.ndarray] = []  # h15, h2, dram: (capacity, T), first len(index) rows used
        self.bound_to: tuple | None = None

    def bind(self, hw: HwSpec, k_samples: int, wave_samples: int, max_lookback: int) -> None:
        """Bind to (or check against) the GPU and sampling of the results held."""
        caches = (hw.l2_bytes * hw.cal("l2_capacity_fraction"), hw.l2_assoc, hw.sm_count,
                  hw.l15_group_sms if hw.has_l15 else 0, hw.l15_bytes, hw.l15_assoc)
        sig = (hw.key, int(k_samples), int(wave_samples), int(max_lookback), caches)
        if self.bound_to is None:
            self.bound_to = sig
        elif self.bound_to != sig:
            raise ValueError(f"this CacheMemo holds results for (hw, k_samples, wave_samples, "
                             f"max_lookback) = {self.bound_to[:4]}, not {sig[:4]} (or the "
                             f"same GPU with other cache sizes); use one memo per GPU and sampling")

    def __len__(self) -> int:
        return 0 if self._index is None else len(self._index)

    def lookup(self, keys: np.ndarray, out: tuple) -> np.ndarray:
        """Fill ``out`` (arrays ``(u, T)``) where known; return the unknown rows."""
        u = keys.shape[0]
        if len(self) == 0 or u == 0:
            return np.arange(u, dtype=np.int64)
        at = self._index.find(keys)
        hit = np.flatnonzero(at >= 0)
        for dst, src in zip(out, self._res):
            dst[hit] = src[at[hit]]
        return np.flatnonzero(at < 0)

    def store(self, keys: np.ndarray, results: tuple) -> None:
        """Keep the results of problems not held yet (``keys`` distinct and new)."""
        m = keys.shape[0]
        n = len(self)
        if m == 0 or n + m > self.max_problems:
            return
        if self._index is None:
            self._index = RowIndex(keys.shape[1], max_rows=self.max_problems)
            self._res = [np.empty((0, r.shape[1])) for r in results]
        self._res = [grown(r, n, n + m, self.max_problems) for r in self._res]
        self._index.add(keys)
        for dst, src in zip(self._res, results):
            dst[n:n + m] = src


#: the cache model analyses every wave of a launch of at most this many waves
#: (the default ``wave_samples``; longer launches are sampled)
WAVE_SAMPLES = 8

#: plans of fewer rows are grouped on every key column (checking each column for a
#: single value costs more than it saves there: ~50 us a call, a prune makes several)
VARYING_MIN_ROWS = 1 << 16


def _varying_columns(parts: list[np.ndarray], rows: int) -> np.ndarray:
    """The columns of ``parts`` (1-D arrays and 2-D blocks of ``rows`` rows) that
    hold more than one value, as one int64 matrix (``(rows, 0)``: none); every
    column below :data:`VARYING_MIN_ROWS` rows."""
    if rows < VARYING_MIN_ROWS:
        return np.column_stack(parts).astype(np.int64, copy=False)
    cols = []
    for a in parts:
        for c in (a.T if a.ndim == 2 else (a,)):
            if rows and not (c == c[0]).all():
                cols.append(c)
    if not cols:
        return np.zeros((rows, 0), dtype=np.int64)
    return np.column_stack(cols).astype(np.int64, copy=False)


def evaluate_plan(plan: TilePlan, hw: HwSpec, k_samples: int = 4,
                  wave_samples: int = WAVE_SAMPLES,
                  max_lookback: int = 4,
                  timings: dict | None = None, memo: "CacheMemo | None" = None, *,
                  resident: tuple | None = None, latency_only: bool = False) -> dict:
    """Run the generic kernels on a lowered plan; returns result arrays.

    ``memo`` (a :class:`CacheMemo` made for the same ``hw`` and sampling)
    supplies the cache problems solved by earlier calls and keeps the new ones.
    ``resident``: ``residency(plan, hw)`` where the caller has it already.
    ``latency_only=True`` returns ``{"latency_us": ...}`` alone (the same
    values; the other outputs and the utilisation are not made: a small
    call, as a prune round's, spends most of its time outside the kernels).
    """
    keep_freed_heap()  # once per process: the next call reuses this one's temporaries
    t0 = time.perf_counter()
    p, reason = residency(plan, hw) if resident is None else resident
    rows = len(plan)
    sms = hw.sm_count
    t1 = time.perf_counter()

    # ---- cache model, once per distinct cache problem
    conc = sms * np.maximum(p, 1)
    # the key holds every input of a cache problem (block bytes by their exact
    # bits), so rows sharing a key get exactly the results they would alone
    foot = plan.t_bytes if plan.t_foot is None else plan.t_foot
    tb = np.ascontiguousarray(foot, dtype=np.float64).view(np.int64)
    parts = [plan.g0, plan.g1, plan.g2, plan.order, plan.group, conc, plan.ksteps, tb,
             plan.t_mask, plan.t_per_step]
    # rows are grouped on the key columns that vary in this plan (a column of one
    # value tells no rows apart: the groups, in order of first appearance, are
    # the same); the memo keeps and finds whole keys, made for the groups only
    inv, rep = dedup_rows(_varying_columns(parts, rows))
    keys_rep = np.column_stack([a[rep] for a in parts]) if rows else \
        np.zeros((0, 7 + 3 * plan.t_mask.shape[1]), dtype=np.int64)
    cap2 = hw.l2_bytes * hw.cal("l2_capacity_fraction")
    g15 = hw.l15_group_sms if hw.has_l15 else 0
    u = rep.shape[0]
    T = plan.t_mask.shape[1]
    h15u = np.empty((u, T))
    h2u = np.empty((u, T))
    dramu = np.empty((u, T))
    todo = np.arange(u, dtype=np.int64)
    if memo is not None:
        memo.bind(hw, k_samples, wave_samples, max_lookback)
        todo = memo.lookup(keys_rep, (h15u, h2u, dramu))
    sub = rep[todo]
    v = sub.shape[0]
    got = cache_hit_rates(
        plan.g0[sub], plan.g1[sub], plan.g2[sub], plan.order[sub], plan.group[sub], conc[sub],
        plan.ksteps[sub], plan.t_mask[sub], plan.t_per_step[sub], foot[sub],
        np.full(v, cap2), np.full(v, float(hw.l2_assoc)), np.full(v, sms),
        np.full(v, g15), np.full(v, float(hw.l15_bytes)), np.full(v, float(hw.l15_assoc)),
        k_samples=k_samples, max_waves=wave_samples, max_lookback=max_lookback)
    for dst, src in zip((h15u, h2u, dramu), got):
        dst[todo] = src
    if memo is not None:
        memo.store(keys_rep[todo], got)
    t2 = time.perf_counter()

    # ---- split requested bytes into L1.5 / L2 / DRAM (per step tensors), each
    # row reading its problem's hit rates (one pass: tsbatch.kernels.traffic)
    tiles = plan.g0 * plan.g1 * plan.g2
    work_iter, l15_hit, l2_hit, dram_bytes, l2_bytes = split_traffic(
        plan.t_bytes, plan.t_per_step, h15u, h2u, dramu, inv, hw.has_l15, plan.work_iter,
        plan.work_epi, tiles, plan.ksteps, plan.t_dram_scale, work_only=latency_only)
    work_avg = work_iter  # the grid's average tile (the L1.5 chip floor's totals)
    # the envelope's tiles: where a GEMM grid has edge tiles, the busiest SM runs
    # whole ones (plan.t_crit: their bytes split by the same hit rates, their C
    # stores in epi_crit), while the totals above are the grid's (its average tile).
    # Only the rows whose whole tile differs from their average one (an edge tile)
    # are split again, into the work matrix just made (a new array): the others'
    # work rows would come out the same. The L1.5 chip floor keeps the average
    # tile's matrix (work_avg), so on a GPU with the tier the split writes into a copy
    work_epi = plan.work_epi
    if plan.t_crit is not None:
        if plan.t_crit.shape[1] < NUMPY_PAIRWISE_MIN:
            into = work_iter.copy() if hw.has_l15 else work_iter
            work_iter = split_edge_rows(plan.t_crit, plan.t_bytes, plan.t_per_step, h15u, h2u,
                                        dramu, inv, hw.has_l15, plan.t_dram_scale, into)
        else:
            work_iter = split_traffic(
                plan.t_crit, plan.t_per_step, h15u, h2u, dramu, inv, hw.has_l15,
                plan.work_iter, plan.work_epi, tiles, plan.ksteps, plan.t_dram_scale,
                work_only=True)[0]
        work_epi = work_epi.copy()
        work_epi[:, R_L2] += plan.epi_crit[:, 0]
        work_epi[:, R_DRAM] += plan.epi_crit[:, 1]
    if plan.local_l2 is not None:
        # spilled registers streamed between L1 and L2 each iteration (TilePlan.local_l2),
        # into the split's work matrices (arrays of their own, the plan's untouched)
        work_iter[:, R_L2] += plan.local_l2
        if work_avg is not work_iter:
            work_avg[:, R_L2] += plan.local_l2
        if l2_bytes is not None:
            l2_bytes += (tiles * plan.ksteps) * plan.local_l2
    env = evaluate_envelopes(work_iter, work_epi, plan.rate, tiles,
                             sms, p, plan.ksteps, plan.stages, plan.warps, plan.warps_full,
                             plan.lat_us, plan.ovh_iter_us, plan.ovh_tile_us, plan.persistent,
                             plan.launch_us, share_eff=plan.share_eff, sync=plan.sync_us,
                             chain=plan.chain_us, streams=plan.streams, conv=plan.conv_us,
                             expose=plan.expose_us, tc_cap=plan.tc_clock_cap,
                             smem_cap=plan.smem_clock_cap, cuda_cap=plan.cuda_clock_cap,
                             latency_only=latency_only,
                             l15_avg=(work_avg, plan.work_epi) if hw.has_l15 else None)
    serial = plan.extra.get("serial_us")
    if serial is not None:
        env = _serial_bound(env, serial, plan, work_iter, work_epi, tiles, sms, p)
    t3 = time.perf_counter()
    # a wait before the first load (a library TMA kernel's descriptor fetch) and a
    # second kernel after the tiles (a library split-K's reduction)
    for key, phase in (("pre_us", "t_prologue_us"), ("post_us", "t_epilogue_us")):
        extra = plan.extra.get(key)
        if extra is not None:
            env = {**env, "latency_us": env["latency_us"] + extra, phase: env[phase] + extra}
    if latency_only:
        if timings is not None:
            _tick_plan(timings, t0, t1, t2, t3, u, v)
        return {"latency_us": env["latency_us"]}

    feasible = p > 0
    lat = env["latency_us"]
    out = {
        "feasible": feasible,
        "reason_code": reason,
        "latency_us": lat,
        "t_prologue_us": env["t_prologue_us"],
        "t_steady_us": env["t_steady_us"],
        "t_epilogue_us": env["t_epilogue_us"],
        "t_launch_us": np.where(feasible, plan.launch_us, np.nan),
        "t_steady_iter_us": env["t_steady_iter_us"],
        "waves": env["waves"],
        "tail_tiles": env["tail_tiles"],
        "resident_tiles": p,
        "pipeline_depth": np.where(feasible, np.maximum(p * (plan.stages - 1), 0), 0),
        "l15_hit": l15_hit,
        "l2_hit": l2_hit,
        "dram_bytes": dram_bytes,
        "l2_bytes": l2_bytes,
        "achieved_tflops": np.divide(plan.useful_flops, lat * 1e6, out=np.full(rows, np.nan),
                                     where=np.isfinite(lat) & (lat > 0)),
        "util": env["util"],
    }
    keep = ("mma_path", "mma_path_code", "register_spill") + tuple(plan.extra.get("outputs", ()))
    out.update({k: v for k, v in plan.extra.items() if k in keep})
    if timings is not None:
        _tick_plan(timings, t0, t1, t2, t3, u, v)
    return out


def _serial_bound(env: dict, serial: np.ndarray, plan: TilePlan, work_iter: np.ndarray,
                  work_epi: np.ndarray, tiles: np.ndarray, sms: int, p: np.ndarray) -> dict:
    """The envelope's latency raised, where a row's tiles end in a serial chain
    (``serial_us``: a library split-K call reducing in place, whose splits of
    one output tile add to C one after another), to one wave of its grid plus
    the chain: the last tile of the first wave cannot finish before its
    splits' loops and then the chain's links. Later waves run under the chain
    (their tiles' predecessors finished a wave earlier), so a grid of many
    waves is not raised; the bound is non-decreasing in the work as the
    envelope is (one wave's tiles, ``min(tiles, sms x p)``, grow with the grid).
    The raise is part of the epilogue."""
    idx = np.flatnonzero((serial > 0.0) & (p > 0))
    if idx.size == 0:
        return env
    one = np.minimum(tiles[idx], sms * p[idx])
    take = lambda a: None if a is None else a[idx]  # noqa: E731
    wave = evaluate_envelopes(work_iter[idx], work_epi[idx], plan.rate[idx], one, sms,
                              p[idx], plan.ksteps[idx], plan.stages[idx], plan.warps[idx],
                              plan.warps_full, plan.lat_us[idx], plan.ovh_iter_us[idx],
                              plan.ovh_tile_us[idx], plan.persistent[idx], plan.launch_us[idx],
                              share_eff=take(plan.share_eff), sync=take(plan.sync_us),
                              chain=take(plan.chain_us), streams=take(plan.streams),
                              conv=take(plan.conv_us), expose=take(plan.expose_us),
                              tc_cap=take(plan.tc_clock_cap), smem_cap=take(plan.smem_clock_cap),
                              cuda_cap=take(plan.cuda_clock_cap), latency_only=True)
    lat = env["latency_us"]
    add = np.maximum(wave["latency_us"] + serial[idx] - lat[idx], 0.0)
    lat = lat.copy()
    epi = env["t_epilogue_us"].copy()
    lat[idx] += add
    epi[idx] += add
    return {**env, "latency_us": lat, "t_epilogue_us": epi}


def _tick_plan(timings: dict, t0, t1, t2, t3, u: int, v: int) -> None:
    timings["occupancy_s"] = timings.get("occupancy_s", 0.0) + (t1 - t0)
    timings["cache_s"] = timings.get("cache_s", 0.0) + (t2 - t1)
    timings["envelope_s"] = timings.get("envelope_s", 0.0) + (t3 - t2)
    timings["cache_problems"] = timings.get("cache_problems", 0) + v
    timings["cache_problems_reused"] = timings.get("cache_problems_reused", 0) + (u - v)


#: the reason of a row whose occupancy allows it but whose predicted latency is not
#: a finite number (every output row is feasible with a finite latency, or
#: infeasible with a reason)
NOT_FINITE_REASON = "sizes too large: the predicted latency is not a finite number"
#: result columns kept for a row not lowered (the others are null)
_KEPT_WHEN_UNLOWERED = ("feasible", "infeasible_reason", "bottleneck", "library_tile",
                        "steady_order")

#: the bottleneck names, indexed by :func:`_bottleneck`'s codes
_BOTTLENECK_NAMES = R_NAMES + ("latency", "launch", "")


def _text(names, codes: np.ndarray) -> pl.Series:
    """``names[codes]`` as a String series (a gather: no Python string per row)."""
    return pl.Series(list(names), dtype=pl.String).gather(np.asarray(codes, dtype=np.int64))


def _bottleneck(util: np.ndarray, lat: np.ndarray, launch: np.ndarray) -> np.ndarray:
    """Per row: the code of its bottleneck in :data:`_BOTTLENECK_NAMES` (one pass:
    :func:`tsbatch.kernels.traffic.bottleneck_codes`)."""
    return bottleneck_codes(util, lat, launch, _BOTTLENECK_MIN_UTIL)


def _library_stream_k_floor(cols: dict, is_lib: np.ndarray, spec: HwSpec, k_samples: int,
                            wave_samples: int, max_lookback: int, timings, memo):
    """Per input row: the stream-K floor of a library row (the largest time, over the
    smaller problems the library splits, of their fastest split kernel under the
    stream-K rule; ``gemm_family.library_stream_k_points``), -inf where none; None
    when no row has one. The points are priced once per distinct problem."""
    parent, pts = gemm_family.library_stream_k_points(cols, is_lib, spec.arch, spec.sm_count)
    if parent.size == 0:
        return None
    key = np.stack([np.asarray(pts[c]).astype(np.int64) if c != "dtype" else
                    gemm_family.map_codes(np.asarray(pts[c], dtype=object),
                                          gemm_family._DTYPE_CODE).astype(np.int64)
                    for c in gemm_family.FAMILY.workload_columns], axis=1)
    if "triton_version" in pts:
        key = np.concatenate([key, gemm_family.triton_release(pts["triton_version"])
                              .astype(np.int64)[:, None]], axis=1)
    _, first, inv = np.unique(key, axis=0, return_index=True, return_inverse=True)
    inv = inv.reshape(-1)
    upts = {c: np.asarray(v)[first] for c, v in pts.items()}
    xcols, xparent = gemm_family.expand_library(upts, np.ones(first.size, dtype=np.bool_),
                                                spec.arch, stream_k_sms=spec.sm_count)
    ok = np.flatnonzero(gemm_family.library_stream_k_valid(
        xcols["m"], xcols["n"], xcols["k"], xcols["block_m"], xcols["block_n"],
        xcols["block_k"], xcols["split_k"], spec.sm_count))
    split_us = np.full(first.size, np.inf)
    if ok.size:  # only the split kernels the rule allows are priced
        xcols = {c: np.asarray(v)[ok] for c, v in xcols.items()}
        plan = get_family("gemm").lower(xcols, spec)
        resident = residency(plan, spec)
        res = evaluate_plan(plan, spec, k_samples=k_samples, wave_samples=wave_samples,
                            max_lookback=max_lookback, timings=timings, memo=memo,
                            resident=resident, latency_only=True)
        lat = np.asarray(res["latency_us"], dtype=np.float64)
        lat = np.where(np.isfinite(lat) & (resident[0] > 0), lat, np.inf)
        np.minimum.at(split_us, xparent[ok], lat)
    split_us = np.where(np.isfinite(split_us), split_us, -np.inf)
    floor_us = np.full(is_lib.shape[0], -np.inf)
    np.maximum.at(floor_us, parent, split_us[inv])
    return floor_us


def evaluate(candidates, hw: str | HwSpec, family: str = "gemm", *, k_samples: int = 4,
             wave_samples: int = WAVE_SAMPLES, max_lookback: int = 4,
             timings: dict | None = None,
             lower_hook: Callable[[dict], dict] | None = None,
             chunk_rows: int = 250_000,
             cache_memo: CacheMemo | None = None) -> pl.DataFrame:
    """Predict every candidate row.

    Parameters
    ----------
    candidates : polars.DataFrame, pyarrow.Table, dict or path
        One row per (workload, schedule) with the family's columns; other
        columns pass through unchanged.
    hw : str or HwSpec
        GPU name (``h100``, ``a100``, ...) or a loaded spec.
    family : str
        Kernel family (``gemm``).
    k_samples : int
        Reduction-axis samples of the cross-wave reuse distance (§3.5.2).
    wave_samples : int
        Waves whose hit rates are evaluated (all when fewer): the first, the
        last and evenly spaced interior ones, each interior one weighted for
        its share of the interior waves (bench/wave_sampling.py measures the
        error against analysing every wave).
    max_lookback : int
        Waves looked back for a block's previous touch; older touches count as
        misses. With the defaults (8, 4) the L2 hit rate moved by 0.002 on
        average (0.07 at most) and latency by at most 0.6 % against exhaustive
        evaluation on a random 8,000-row sample of bench/throughput.py's
        sweep on H100, for a 2.7x faster cache model (measured before the
        interior weights, which lower the error further).
    timings : dict, optional
        Filled with the seconds spent per stage.
    chunk_rows : int
        Tables longer than this are evaluated in chunks of this many rows
        (bounding the working memory to the chunk), the chunks sharing their
        solved cache problems (a :class:`CacheMemo`); results are the same
        as in one piece. Not with ``lower_hook``, which sees the whole table.
        The default keeps a chunk's work arrays (the per-resource ones: 72
        bytes a row) under glibc's 32 MiB mmap threshold, so that each
        chunk reuses the heap the last one freed (:mod:`tsbatch.kernels._heap`)
        instead of mapping and faulting in fresh pages: a 1M-row table took
        1.16x the CPU in one piece (session 17, alternated in one process).
    cache_memo : CacheMemo, optional
        Solved cache problems to reuse and extend, e.g. across the record
        batches of a stream; it must only be shared between calls with the
        same ``hw``, ``k_samples``, ``wave_samples`` and ``max_lookback``.

    Returns
    -------
    polars.DataFrame
        The input columns followed by :data:`RESULT_COLUMNS`, row order kept.
    """
    keep_freed_heap()  # once per process: the next call reuses this one's temporaries
    t0 = time.perf_counter()
    fam = get_family(family)
    df = to_polars(candidates)
    if fam.evaluate is not None:  # not a tile grid on one GPU (collectives)
        validate(df, fam)  # the same type, null, sign and choice checks as every family
        # a column of nulls only has no type (NDJSON, zero rows): an optional one takes
        # its default, as validate fills it, a required one (zero rows) its declared type
        kinds = {"int": pl.Int64, "float": pl.Float64, "bool": pl.Boolean, "str": pl.String}
        fill = [(pl.lit(c.default) if not c.required and c.default is not None
                 else pl.col(c.name).cast(kinds[c.kind])).alias(c.name)
                for c in fam.columns if c.name in df.columns and df.schema[c.name] == pl.Null]
        # a family composing others (fused GEMM + collective) runs them through this engine
        return fam.evaluate(df.with_columns(fill) if fill else df, hw, evaluate)
    spec = resolve_hw(hw)
    if lower_hook is None and chunk_rows > 0 and df.height > chunk_rows:
        memo = cache_memo if cache_memo is not None else CacheMemo()
        parts = [evaluate(df.slice(a, chunk_rows), spec, family, k_samples=k_samples,
                          wave_samples=wave_samples, max_lookback=max_lookback,
                          timings=timings, chunk_rows=chunk_rows, cache_memo=memo)
                 for a in range(0, df.height, chunk_rows)]
        t = time.perf_counter()
        out = pl.concat(parts, how="vertical")
        if timings is not None:
            timings["assemble_s"] = timings.get("assemble_s", 0.0) + time.perf_counter() - t
        return out
    cols, is_lib = validate(df, fam)
    if lower_hook is not None:
        cols = lower_hook(cols)
    n = df.height
    cols_in = cols
    if is_lib.any() and fam.name == "gemm":
        cols, parent = gemm_family.expand_library(cols, is_lib, spec.arch)
    else:
        parent = np.arange(n, dtype=np.int64)
    t1 = time.perf_counter()
    plan = fam.lower(cols, spec)
    t2 = time.perf_counter()
    res = evaluate_plan(plan, spec, k_samples=k_samples, wave_samples=wave_samples,
                        max_lookback=max_lookback, timings=timings, memo=cache_memo)
    t3 = time.perf_counter()

    # ---- library rows: keep the fastest catalog tile per input row
    lat = res["latency_us"]
    m = lat.shape[0]
    if m != n:
        key = np.where(np.isfinite(lat), lat, np.inf)
        order = np.lexsort((key, parent))
        first = np.ones(m, dtype=bool)
        first[1:] = parent[order][1:] != parent[order][:-1]
        pick = np.empty(n, dtype=np.int64)
        pick[parent[order][first]] = order[first]
        take = lambda a: a[pick]  # noqa: E731
    else:  # a row per input row: the arrays as they are (a gather by arange is a copy)
        pick = None
        take = lambda a: a  # noqa: E731

    # library rows: the stream-K floor (a row is priced at least the split kernel of
    # every smaller problem the library splits; gemm_family.library_stream_k_points)
    sk_excess = None
    if m != n and fam.name == "gemm":
        floor_us = _library_stream_k_floor(cols_in, is_lib, spec, k_samples, wave_samples,
                                           max_lookback, timings, cache_memo)
        if floor_us is not None:
            main_us = lat[pick]
            sk_excess = np.where(np.isfinite(main_us) & (floor_us > main_us),
                                 floor_us - main_us, 0.0)
            if not sk_excess.any():
                sk_excess = None

    reason = take(res["reason_code"])
    reason_text = _text(reason_names(plan), reason)
    util = take(res["util"])
    latp = take(lat)
    if sk_excess is not None:
        latp = latp + sk_excess
    feasible = take(res["feasible"])
    lost = feasible & ~np.isfinite(latp)
    if lost.any():  # the contract: a feasible row has a finite latency
        feasible = feasible & ~lost
        reason_text = pl.select(pl.when(pl.Series(lost)).then(pl.lit(NOT_FINITE_REASON))
                                .otherwise(reason_text)).to_series()
    data = {
        "feasible": feasible,
        "infeasible_reason": reason_text,
    }
    data["latency_us"] = latp
    for name in ("t_prologue_us", "t_steady_us", "t_epilogue_us", "t_launch_us",
                 "t_steady_iter_us", "waves", "tail_tiles", "resident_tiles", "pipeline_depth",
                 "l15_hit", "l2_hit", "dram_bytes", "l2_bytes", "achieved_tflops", "mma_path",
                 "register_spill"):
        if name == "mma_path" and "mma_path_code" in res:  # the names gathered by code
            data[name] = _text(MMA_PATHS, take(res["mma_path_code"]))
        else:
            data[name] = take(res[name])
    # each resource's column contiguous (one transposed copy; polars would copy
    # every strided column of the row-major matrix on its own)
    util_t = np.ascontiguousarray(util.T)
    for j, r in enumerate(R_NAMES):
        data[f"util_{r}"] = util_t[j]
    data["bottleneck"] = _text(_BOTTLENECK_NAMES, _bottleneck(util, latp, data["t_launch_us"]))
    if sk_excess is not None:  # the floor's excess over the picked tile: its epilogue's
        data["t_epilogue_us"] = data["t_epilogue_us"] + sk_excess
        data["achieved_tflops"] = data["achieved_tflops"] * np.where(
            sk_excess > 0, (latp - sk_excess) / np.where(sk_excess > 0, latp, 1.0), 1.0)
    onames, ocodes = order_names(plan, fam)
    data["steady_order"] = _text(onames, take(ocodes))
    data["t_chain_us"] = (take(plan.chain_us) if plan.chain_us is not None
                          else np.zeros(n))
    for name in plan.extra.get("outputs", ()):  # a program's [output] values
        data[name] = take(res[name])
    if m != n:  # the winning catalog tile of each library row, as text (vectorized)
        parts = {c: np.asarray(cols[c])[pick] for c in
                 ("block_m", "block_n", "block_k", "num_stages", "num_warps", "split_k")}
        tile = pl.DataFrame(parts).select(pl.format(
            "{}x{}x{}/s{}/w{}/k{}", *[pl.col(c) for c in parts])).to_series()
        tile = tile.to_numpy().astype(object)
        if sk_excess is not None:  # the row is priced at the stream-K floor, not at this tile
            tile = np.where(sk_excess > 0, tile + " +stream-K floor", tile)
        data["library_tile"] = np.where(is_lib, tile, "").astype(object)
    else:
        data["library_tile"] = pl.repeat("", n, dtype=pl.String, eager=True)
    out = pl.DataFrame({k: v for k, v in data.items()})
    out = out.with_columns(
        pl.col("latency_us").fill_nan(None),
        pl.col("mma_path").cast(pl.String),
        pl.col("bottleneck").cast(pl.String),
        pl.col("infeasible_reason").cast(pl.String),
        pl.col("library_tile").cast(pl.String),
        pl.col("steady_order").cast(pl.String),
    )
    if plan.unlowered is not None and take(plan.unlowered).any():
        # rows not lowered (a rule checked before lowering): no model numbers
        mask = pl.Series(take(plan.unlowered))
        out = out.with_columns([pl.when(mask).then(None).otherwise(pl.col(c)).alias(c)
                                for c in out.columns if c not in _KEPT_WHEN_UNLOWERED])
    drop = [c for c in out.columns if c in df.columns]
    result = pl.concat([df.drop(drop), out], how="horizontal")
    t4 = time.perf_counter()
    if timings is not None:
        timings["validate_s"] = timings.get("validate_s", 0.0) + (t1 - t0)
        timings["lowering_s"] = timings.get("lowering_s", 0.0) + (t2 - t1)
        timings["assemble_s"] = timings.get("assemble_s", 0.0) + (t4 - t3)
    return result
