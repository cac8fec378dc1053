"""Pruning: keep the predicted-best fraction of a workload's candidate configurations.

::

    from tsbatch.engine.prune import prune, Pruner

    res = prune({"m": 4096, "n": 4096, "k": 4096, "dtype": "float16"},
                [{"block_m": 128, "block_n": 128, "block_k": 64,
                  "num_stages": 3, "num_warps": 8}, ...],
                hw="h100", top=0.05)
    res.configs      # kept configurations, fastest first
    res.latency_us   # their predicted times
    res.indices      # their positions in the input

The result is exactly the top of a full :func:`tsbatch.engine.evaluate.evaluate`
ranking of the same candidates (:func:`tsbatch.engine.rank.rank`: the first
``keep_count(n, top)`` rows by predicted latency, ties by input position,
infeasible rows never kept), but it is computed without evaluating the
expensive part of the model for most candidates:

1. the candidates are lowered once (numpy, no polars validation) and their
   occupancy is computed (infeasible rows drop out here);
2. a *lower bound* of every latency is computed with the cache model
   replaced by perfect caching (no L2 or DRAM traffic beyond what the
   L1.5/L2 tier must serve): the envelope of :mod:`tsbatch.kernels.envelope`
   is non-decreasing in every work entry, and the cache model only ever
   adds L2 and DRAM work, so the bound never exceeds the full prediction;
3. candidates are predicted in full (cache model included) in order of
   their bound: first a few more than ``keep``, then, round after round,
   half of the candidates whose bound is not above the ``keep``-th best
   prediction so far, until there are none. The ``keep``-th best only
   falls as predictions are added, so every candidate left out has a
   bound, and so a prediction, strictly above the final one: none can
   enter the kept set.

The cache model (§3.5) dominates the cost of a prediction; the bound is
tight for the fast candidates, so typically only a few more than ``keep``
candidates are predicted in full.

:class:`Pruner` holds a resolved GPU spec and memoizes results by
(workload, configurations, fraction), so repeated calls (an autotuner
asking again for the same problem) cost a dictionary lookup.
"""

from __future__ import annotations

import dataclasses
import itertools
import operator
import struct
from collections import OrderedDict
from typing import Iterator, NamedTuple, Sequence

import numpy as np
import polars as pl

from kernels_catalog import gemm as gemm_family
from tsbatch.errors import InputError
from tsbatch.engine.evaluate import evaluate_plan, reason_names, residency, resolve_hw
from tsbatch.hw import HwSpec
from tsbatch.kernels.occupancy import REASON_TEXT
from tsbatch.kernels.order import ORDER_NAMES
from tsbatch.engine.rank import keep_count
from tsbatch.boundary.schema import text_full
from tsbatch.engine.screen import lower_bound, take_plan

__all__ = ["WORKLOAD_KEYS", "CONFIG_KEYS", "NoFeasibleConfigError", "Pruned", "PruneResult",
           "Pruner", "prune"]


class NoFeasibleConfigError(InputError):
    """No configuration can run on the GPU (an :class:`InputError`)."""

#: workload keys: name -> default (None: required)
WORKLOAD_KEYS = {
    "m": None,
    "n": None,
    "k": None,
    "dtype": None,
    "a_row_major": True,
    "b_row_major": True,
    "tf32": False,
}
#: per-configuration keys: name -> default (None: required)
CONFIG_KEYS = {
    "block_m": None,
    "block_n": None,
    "block_k": None,
    "num_stages": None,
    "num_warps": None,
    "group_m": 8,
    "raster": "grouped",
    "split_k": 1,
}
_INT_CONFIG = ("block_m", "block_n", "block_k", "num_stages", "num_warps", "group_m", "split_k")


class Pruned(NamedTuple):
    """One kept configuration."""

    index: int          #: position in the input
    config: dict        #: the configuration (all :data:`CONFIG_KEYS`, defaults filled)
    latency_us: float   #: predicted kernel time, microseconds


@dataclasses.dataclass(frozen=True)
class PruneResult:
    """Kept configurations, fastest predicted first.

    Iterating yields :class:`Pruned` tuples; ``len()`` is the number kept.
    """

    indices: tuple[int, ...]
    configs: tuple[dict, ...]
    latency_us: tuple[float, ...]
    n_candidates: int    #: configurations given
    n_feasible: int      #: of which can run on the GPU
    n_predicted: int     #: of which were predicted in full (cache model included)

    def __len__(self) -> int:
        return len(self.indices)

    def __iter__(self) -> Iterator[Pruned]:
        for i, c, t in zip(self.indices, self.configs, self.latency_us):
            yield Pruned(i, c, t)

    def __getitem__(self, j: int) -> Pruned:
        return Pruned(self.indices[j], self.configs[j], self.latency_us[j])


# --------------------------------------------------------------------------- input


def _as_int(value, what: str) -> int:
    if isinstance(value, (bool, np.bool_)) or value is None:
        raise InputError(f"{what} must be a positive integer, got {value!r}")
    try:
        iv = int(value)
    except (TypeError, ValueError):
        raise InputError(f"{what} must be a positive integer, got {value!r}") from None
    if iv != value and not (isinstance(value, float) and float(iv) == value):
        raise InputError(f"{what} must be a positive integer, got {value!r}")
    if iv <= 0:
        raise InputError(f"{what} must be a positive integer, got {value!r}")
    return iv


def _workload_tuple(workload: dict) -> tuple:
    if not isinstance(workload, dict):
        raise InputError(f"workload must be a dict with keys m, n, k, dtype; "
                         f"got {type(workload).__name__}")
    unknown = sorted(set(workload) - set(WORKLOAD_KEYS))
    if unknown:
        raise InputError(f"workload has unknown key{'s' if len(unknown) > 1 else ''} "
                         f"{', '.join(map(repr, unknown))}; known: {', '.join(WORKLOAD_KEYS)}")
    missing = [k for k, d in WORKLOAD_KEYS.items() if d is None and k not in workload]
    if missing:
        raise InputError(f"workload lacks {', '.join(map(repr, missing))}; "
                         f"it needs m, n, k and dtype")
    m, n, k = (_as_int(workload[x], f"workload '{x}'") for x in ("m", "n", "k"))
    dtype = workload["dtype"]
    if dtype not in gemm_family.DTYPES:
        raise InputError(f"workload 'dtype' {dtype!r} is not one of "
                         f"{', '.join(gemm_family.DTYPES)}")
    flags = tuple(bool(workload.get(x, WORKLOAD_KEYS[x]))
                  for x in ("a_row_major", "b_row_major", "tf32"))
    return (m, n, k, str(dtype)) + flags


def _config_arrays(configs) -> dict[str, np.ndarray]:
    """Validated per-configuration columns (numpy), defaults filled."""
    if isinstance(configs, pl.DataFrame):
        missing = [k for k, d in CONFIG_KEYS.items() if d is None and k not in configs.columns]
        if missing:
            raise InputError(f"configs lack column{'s' if len(missing) > 1 else ''} "
                             f"{', '.join(map(repr, missing))}; needed: "
                             f"{', '.join(k for k, d in CONFIG_KEYS.items() if d is None)}")
        n = configs.height
        out = {}
        for name, default in CONFIG_KEYS.items():
            if name in configs.columns:
                s = configs.get_column(name)
                if s.null_count():
                    i = int(np.flatnonzero(s.is_null().to_numpy())[0])
                    raise InputError(f"configs column '{name}' has a null value at row {i}")
                if name == "raster":
                    out[name] = s.cast(pl.String).to_numpy().astype(object)
                else:
                    if not s.dtype.is_integer():
                        raise InputError(f"configs column '{name}' must be integer, got {s.dtype}")
                    out[name] = s.cast(pl.Int64).to_numpy()
            else:
                out[name] = (text_full(n, default) if name == "raster"
                             else np.full(n, default, dtype=np.int64))
    else:
        if isinstance(configs, dict) or not isinstance(configs, Sequence):
            raise InputError(f"configs must be a list of dicts or a polars DataFrame, "
                             f"got {type(configs).__name__}")
        n = len(configs)
        if n == 0:
            raise InputError("configs is empty; nothing to prune")
        out = _dict_columns_fast(configs, n)
        if out is None:
            out = _dict_columns(configs, n)
    if n == 0:
        raise InputError("configs is empty; nothing to prune")
    for name in _INT_CONFIG:
        bad = out[name] <= 0
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise InputError(f"configs[{i}]['{name}'] must be a positive integer, "
                             f"got {out[name][i]}")
    uniq = set(out["raster"].tolist())
    unknown = sorted(map(str, uniq - set(ORDER_NAMES)))
    if unknown:
        i = int(np.flatnonzero(out["raster"].astype(str) == unknown[0])[0])
        raise InputError(f"configs[{i}]['raster'] {unknown[0]!r} is not one of "
                         f"{', '.join(ORDER_NAMES)}")
    return out


def _dict_columns_fast(configs, n: int) -> dict[str, np.ndarray] | None:
    """:func:`_dict_columns` for the common input, without a Python loop per row.

    Plain dicts with known keys only, every required key present, and
    integer values that numpy reads as int64 (as the row loop does). ``None``
    for anything else: the row loop then names the problem (or converts
    integral floats) as before.
    """
    if set(map(type, configs)) != {dict}:
        return None
    keys = set().union(*configs)
    if not keys.issubset(CONFIG_KEYS):
        return None
    uniform = set(map(len, configs)) == {len(keys)}  # every dict holds every key
    optional = [x for x in _INT_CONFIG[5:] if x in keys]
    names = _INT_CONFIG[:5] + (tuple(optional) if uniform else ())
    try:
        vals = list(itertools.chain.from_iterable(map(operator.itemgetter(*names), configs)))
        if vals and isinstance(vals[0], bool):
            return None  # all bools: the row loop's error (mixed with ints: ints, as numpy)
        # an int64 buffer takes integers (and what has __index__) only, without
        # numpy's look at every value for a common type (~50 us of 1,000 configs);
        # struct packs them in one call (7,000 values: 45 us, array.array 100 us)
        arr = np.frombuffer(struct.pack(f"{len(vals)}q", *vals), dtype=np.int64)
        cols = {} if uniform else {x: np.array([c.get(x, CONFIG_KEYS[x]) for c in configs])
                                   for x in optional}
    except (KeyError, TypeError, ValueError, OverflowError, struct.error):
        return None
    if arr.dtype != np.int64 or arr.shape != (n * len(names),) or any(
            v.dtype != np.int64 or v.shape != (n,) for v in cols.values()):
        return None
    arr = arr.reshape(n, len(names))
    out = {x: arr[:, j].copy() for j, x in enumerate(names)}
    out.update(cols)
    for x in _INT_CONFIG[5:]:
        if x not in out:
            out[x] = np.full(n, CONFIG_KEYS[x], dtype=np.int64)
    if "raster" in keys:
        out["raster"] = np.fromiter((c.get("raster", "grouped") for c in configs),
                                    dtype=object, count=n)
    else:
        out["raster"] = text_full(n, CONFIG_KEYS["raster"])
    return out


def _dict_columns(configs, n: int) -> dict[str, np.ndarray]:
    """Validated columns of a list of ``n`` config dicts, one row at a time."""
    rows = []
    raster = np.empty(n, dtype=object)
    known = set(CONFIG_KEYS)
    required = _INT_CONFIG[:5]
    optional = _INT_CONFIG[5:]
    get_req = operator.itemgetter(*required)
    opt_default = tuple(CONFIG_KEYS[x] for x in optional)
    for i, c in enumerate(configs):
        if not isinstance(c, dict):
            raise InputError(f"configs[{i}] must be a dict, got {type(c).__name__}")
        if not known.issuperset(c):
            bad = sorted(set(c) - known)
            raise InputError(f"configs[{i}] has unknown key{'s' if len(bad) > 1 else ''} "
                             f"{', '.join(map(repr, bad))}; known: {', '.join(CONFIG_KEYS)}")
        try:
            row = get_req(c)
            if len(c) > 5 or "raster" in c:
                row = row + tuple(c.get(x, CONFIG_KEYS[x]) for x in optional)
            else:
                row = row + opt_default
            rows.append(row)
        except KeyError:
            miss = [x for x in required if x not in c]
            raise InputError(f"configs[{i}] lacks {', '.join(map(repr, miss))}") from None
        raster[i] = c.get("raster", "grouped")
    try:
        arr = np.array(rows)
    except (TypeError, ValueError, OverflowError):
        arr = np.array(rows, dtype=object)
    if arr.dtype.kind not in "iu":
        arr = np.array([[_as_int(v, f"configs[{i}]['{x}']") for x, v in zip(_INT_CONFIG, r)]
                        for i, r in enumerate(rows)], dtype=np.int64).reshape(n, -1)
    ints = arr.astype(np.int64).reshape(n, len(_INT_CONFIG))
    out = {x: ints[:, j].copy() for j, x in enumerate(_INT_CONFIG)}
    out["raster"] = raster
    return out


def _cols(wl: tuple, cfg: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    n = cfg["block_m"].shape[0]
    m, nn, k, dtype, a_rm, b_rm, tf32 = wl
    cols = dict(cfg)
    cols.update(
        m=np.full(n, m, dtype=np.int64), n=np.full(n, nn, dtype=np.int64),
        k=np.full(n, k, dtype=np.int64), dtype=text_full(n, dtype),
        a_row_major=np.full(n, a_rm, dtype=bool), b_row_major=np.full(n, b_rm, dtype=bool),
        tf32=np.full(n, tf32, dtype=bool), backend=text_full(n, "triton"),
    )
    return cols


# --------------------------------------------------------------------------- model


def _infeasible_message(wl: tuple, reason: np.ndarray, hw: HwSpec, names=None) -> str:
    codes, counts = np.unique(reason, return_counts=True)
    text = dict(enumerate(names)) if names is not None else REASON_TEXT
    why = "; ".join(f"{int(c)} x {text.get(int(code), 'infeasible')}"
                    for code, c in zip(codes, counts))
    return (f"none of the {reason.shape[0]} configurations can run on {hw.name} for "
            f"m={wl[0]}, n={wl[1]}, k={wl[2]}, dtype={wl[3]} ({why})")


def _select(wl: tuple, cfg: dict[str, np.ndarray], hw: HwSpec, top: float,
            screen: bool) -> tuple[np.ndarray, np.ndarray, int, int]:
    """(kept indices in predicted order, their latencies, n_feasible, n_predicted)."""
    cols = _cols(wl, cfg)
    n = cols["m"].shape[0]
    keep = keep_count(n, top)
    plan = gemm_family.lower(cols, hw)
    p, reason = residency(plan, hw)  # with the rules checked before lowering (Triton's)
    feas = np.flatnonzero(p > 0)
    if feas.size == 0:
        raise NoFeasibleConfigError(_infeasible_message(wl, reason, hw, reason_names(plan)))
    keep = min(keep, feas.size)
    if not screen:
        lat = evaluate_plan(take_plan(plan, feas), hw)["latency_us"]
        order = np.lexsort((feas, np.where(np.isfinite(lat), lat, np.inf)))[:keep]
        return feas[order], lat[order], int(feas.size), int(feas.size)

    # every row bounded as if one tile were resident, the infeasible ones dropped:
    # cheaper than a copy of the plan's feasible rows (the bound is row by row)
    lb = lower_bound(plan, np.maximum(p, 1), hw)[feas]
    lb = np.where(np.isfinite(lb), lb, np.inf)
    by_lb = np.lexsort((feas, lb))  # positions into feas, smallest bound first
    lb_sorted = lb[by_lb]
    # round 1: the smallest bounds, a few more than are kept
    done = min(keep + max(2, keep // 16), by_lb.size)
    got = feas[by_lb[:done]]
    lat = _predict(plan, got, hw, p, reason)
    while True:
        # only rows whose bound is not above the keep-th best prediction so far
        # can still be among the first ``keep`` (strictly above: a tie could
        # still win on position); the keep-th best only falls as rows are added
        kth = np.partition(lat, keep - 1)[keep - 1] if lat.size >= keep else np.inf
        cand = int(np.searchsorted(lb_sorted, kth, side="right")) - done
        if cand <= 0:
            break
        # the half of them with the smaller bounds first (the keep-th best
        # falls with them, often below the others' bounds)
        step = cand if cand <= _ROUND_MIN else (cand + 1) // 2
        rows = feas[by_lb[done:done + step]]
        done += step
        got = np.concatenate([got, rows])
        lat = np.concatenate([lat, _predict(plan, rows, hw, p, reason)])
    order = np.lexsort((got, lat))[:keep]
    return got[order], lat[order], int(feas.size), int(got.size)


#: up to this many candidates a round predicts them all, not the better half: a
#: round costs 0.5-0.9 ms besides its rows (~20 us each on 2 cores), so a few
#: more rows in one round beat two more rounds (bench/prune_latency.py,
#: 16x4096x4096: 166 rows in 4 rounds 10.4 ms, 174 rows in 2 rounds 8.8 ms)
_ROUND_MIN = 128


def _predict(plan, rows: np.ndarray, hw: HwSpec, p: np.ndarray, reason: np.ndarray) -> np.ndarray:
    """Full predictions of ``rows`` of ``plan`` (+inf where not finite); ``p``,
    ``reason``: the residency of every row of ``plan``."""
    lat = evaluate_plan(take_plan(plan, rows), hw, resident=(p[rows], reason[rows]),
                        latency_only=True)["latency_us"]
    return np.where(np.isfinite(lat), lat, np.inf)


def _check_top(top) -> float:
    try:
        frac = float(top)
    except (TypeError, ValueError):
        raise InputError(f"top must be a fraction in (0, 1], got {top!r}") from None
    if not (0.0 < frac <= 1.0):
        raise InputError(f"top must be a fraction in (0, 1], got {top!r}")
    return frac


def _raw_key(workload, configs, frac: float):
    """A cheap cache key of the raw input (``None`` when not hashable as given).

    Only a shortcut: equal keys mean equal input; unequal keys fall back to
    the key of the validated columns.
    """
    if not isinstance(workload, dict) or not isinstance(configs, (list, tuple)):
        return None
    try:
        key = ("raw", tuple(workload.items()), frac,
               tuple([tuple(c.items()) for c in configs]))
        hash(key)
    except (TypeError, AttributeError):
        return None
    return key


def _config_dicts(cfg: dict[str, np.ndarray], idx: np.ndarray) -> tuple[dict, ...]:
    names = list(CONFIG_KEYS)
    cols = [cfg[x][idx].tolist() for x in names]
    return tuple(dict(zip(names, vals)) for vals in zip(*cols))


# --------------------------------------------------------------------------- API


class Pruner:
    """Prune with one GPU spec, memoizing results.

    Results are cached by (workload, configurations, fraction) in a
    least-recently-used table of ``cache_size`` entries; a repeated call
    returns the identical :class:`PruneResult` object.
    """

    def __init__(self, hw: str | HwSpec = "h100", top: float = 0.05, *,
                 cache_size: int = 1024, screen: bool = True):
        self.hw = resolve_hw(hw)
        self.top = _check_top(top)
        self.screen = bool(screen)
        self.cache_size = int(cache_size)
        self._cache: OrderedDict = OrderedDict()
        self.hits = 0
        self.misses = 0

    def cache_clear(self) -> None:
        self._cache.clear()
        self.hits = self.misses = 0

    def prune(self, workload: dict, configs, top: float | None = None) -> PruneResult:
        """Keep the predicted-best ``top`` fraction of ``configs`` for ``workload``.

        ``workload``: dict with ``m``, ``n``, ``k``, ``dtype`` and optionally
        ``a_row_major``, ``b_row_major``, ``tf32``. ``configs``: a list of
        dicts or a polars DataFrame with ``block_m``, ``block_n``,
        ``block_k``, ``num_stages``, ``num_warps`` and optionally
        ``group_m`` (8), ``raster`` ('grouped'), ``split_k`` (1).

        Keeps ``max(1, ceil(top * len(configs)))`` configurations (fewer
        when fewer are feasible), fastest predicted first; ties keep input
        order. Raises :class:`~tsbatch.errors.InputError` on bad input or
        when no configuration can run on the GPU.
        """
        frac = self.top if top is None else _check_top(top)
        raw = _raw_key(workload, configs, frac) if self.cache_size > 0 else None
        if raw is not None:
            hit = self._cache.get(raw)
            if hit is not None:
                self._cache.move_to_end(raw)
                self.hits += 1
                return hit
        wl = _workload_tuple(workload)
        cfg = _config_arrays(configs)
        key = (wl, frac, tuple(cfg[x].tobytes() for x in _INT_CONFIG),
               tuple(cfg["raster"].tolist()))
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            self.hits += 1
            if raw is not None:
                self._store(raw, hit)
            return hit
        self.misses += 1
        idx, lat, nfeas, npred = _select(wl, cfg, self.hw, frac, self.screen)
        res = PruneResult(
            indices=tuple(int(i) for i in idx), configs=_config_dicts(cfg, idx),
            latency_us=tuple(float(t) for t in lat), n_candidates=int(cfg["block_m"].shape[0]),
            n_feasible=nfeas, n_predicted=npred,
        )
        self._store(key, res)
        if raw is not None:
            self._store(raw, res)
        return res

    def _store(self, key, res: PruneResult) -> None:
        if self.cache_size <= 0:
            return
        self._cache[key] = res
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)

    __call__ = prune


def prune(workload: dict, configs, hw: str | HwSpec = "h100", top: float = 0.05, *,
          screen: bool = True, family: str = "gemm") -> PruneResult:
    """Keep the predicted-best ``top`` fraction of ``configs`` (see :meth:`Pruner.prune`).

    ``screen=False`` predicts every feasible configuration in full instead
    of bounding first (same result, slower; for checking). ``family`` names
    another kernel family (``attention``, ``attention_fa3``, ...; see
    ``tsbatch families``) or a tile program file: ``workload`` then holds
    that family's workload columns and ``configs`` its schedule columns,
    and every configuration is predicted (no screening).
    """
    if family != "gemm":
        return _prune_family(workload, configs, hw, _check_top(top), family)
    return Pruner(hw, top, cache_size=0, screen=screen).prune(workload, configs)


def _prune_family(workload: dict, configs, hw, frac: float, family: str) -> PruneResult:
    """:func:`prune` for a tile-program family: predict every configuration
    crossed with the workload and keep the first ``keep_count`` by latency
    (ties by input position; infeasible ones never)."""
    from tsbatch.engine.evaluate import evaluate, get_family  # noqa: PLC0415

    fam = get_family(family)
    cfg = configs if isinstance(configs, pl.DataFrame) else pl.DataFrame(list(configs))
    n = cfg.height
    if n == 0:
        raise InputError("no configurations given")
    if not isinstance(workload, dict):
        raise InputError(f"workload must be a dict of {fam.name} columns, got "
                         f"{type(workload).__name__}")
    clash = sorted(set(workload) & set(cfg.columns))
    if clash:
        raise InputError(f"column {clash[0]!r} is given in both the workload and the configurations")
    frame = cfg.with_columns([pl.lit(v).alias(k) for k, v in workload.items()])
    res = evaluate(frame, hw, fam)
    lat = res["latency_us"].to_numpy()
    feas = res["feasible"].to_numpy() & np.isfinite(lat)
    nfeas = int(feas.sum())
    if nfeas == 0:
        reasons = sorted(set(res.filter(~pl.col("feasible"))["infeasible_reason"].to_list()))
        raise NoFeasibleConfigError(f"no configuration of {fam.name} {workload} can run on "
                                    f"{resolve_hw(hw).name}: {'; '.join(reasons)}")
    keep = min(keep_count(n, frac), nfeas)
    key = np.where(feas, lat, np.inf)
    order = np.lexsort((np.arange(n), key))[:keep]
    rows = cfg.to_dicts()
    return PruneResult(indices=tuple(int(i) for i in order),
                       configs=tuple(rows[i] for i in order),
                       latency_us=tuple(float(lat[i]) for i in order), n_candidates=n,
                       n_feasible=nfeas, n_predicted=nfeas)
