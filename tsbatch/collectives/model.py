"""Evaluate a frame of collective candidates: validate, plan once per configuration, run the kernel.

Candidate columns follow ``../shared/data/collectives``: ``system`` (a
``hw/systems`` file stem or alias), ``collective`` (:data:`COLLECTIVES`),
``num_gpus``, ``gpus_per_node`` (optional: as many as the system has, up to
``num_gpus``), ``bytes`` (nccl-tests' size: the per-rank buffer of an
all-reduce, the full gathered / scattered buffer of an all-gather /
reduce-scatter, a rank's whole send buffer of an all-to-all, the message of a
send/recv), and optional ``algorithm``, ``protocol``, ``channels`` forcing
NCCL's choices (null or ``auto``: choose as NCCL does).
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl

from tsbatch.collectives.nccl import PROTOCOLS, TREE_CORRECTION
from tsbatch.collectives.plan import COLLECTIVES, VALID_ALGORITHMS, Plan, build_plan, bus_factor
from tsbatch.collectives.systems import get_system
from tsbatch.errors import InputError
from tsbatch.kernels.alphabeta import evaluate_rows

__all__ = ["RESULT_COLUMNS", "validate", "evaluate", "plans_to_arrays"]

RESULT_COLUMNS = ("latency_us", "feasible", "infeasible_reason", "algorithm_used", "protocol_used",
                  "stages", "bottleneck_link", "alg_bw_gbps", "bus_bw_gbps")

_ALL_ALGOS = sorted({a for v in VALID_ALGORITHMS.values() for a in v})


def _require(df: pl.DataFrame, col: str, kind: str, where: str) -> None:
    if col not in df.columns:
        raise InputError(f"{where}: missing column '{col}' (collective candidates need "
                         "system, collective, num_gpus, bytes)")
    t = df.schema[col]
    ok = (t.is_integer() if kind == "int" else t in (pl.String, pl.Categorical, pl.Enum))
    if kind == "int" and t.is_float():
        vals = df[col].drop_nulls()
        ok = bool((vals == vals.round(0)).all())
    if not ok:
        raise InputError(f"{where}: column '{col}' has type {t}, expected {'an integer' if kind == 'int' else 'a string'}")
    if df[col].null_count():
        raise InputError(f"{where}: column '{col}' has null values")


def validate(frame: pl.DataFrame, where: str = "candidates") -> pl.DataFrame:
    """Check and normalise the candidate columns; raise :class:`InputError` naming the problem."""
    for c in ("system", "collective"):
        _require(frame, c, "str", where)
    for c in ("num_gpus", "bytes"):
        _require(frame, c, "int", where)
    df = frame
    systems = {s: get_system(s) for s in df["system"].cast(pl.String).unique().to_list()}
    bad = sorted(set(df["collective"].cast(pl.String).unique().to_list()) - set(COLLECTIVES))
    if bad:
        raise InputError(f"{where}: column 'collective' has unknown value(s) {bad}; known: {', '.join(COLLECTIVES)}")
    for c in ("num_gpus", "bytes"):
        if (df[c] <= 0).any():
            raise InputError(f"{where}: column '{c}' must be positive (found {df[c].min()})")
    if "gpus_per_node" in df.columns:
        _require(df, "gpus_per_node", "int", where)
        if (df["gpus_per_node"] <= 0).any():
            raise InputError(f"{where}: column 'gpus_per_node' must be positive")
        # more GPUs per node than the job has: the job fits in one node
        gpn = pl.min_horizontal(pl.col("gpus_per_node").cast(pl.Int64), pl.col("num_gpus").cast(pl.Int64))
    else:
        per = {k: s.gpus_per_node for k, s in systems.items()}
        gpn = pl.min_horizontal(pl.col("system").cast(pl.String).replace_strict(per, return_dtype=pl.Int64),
                                pl.col("num_gpus").cast(pl.Int64))
    cols = [pl.col("system").cast(pl.String).replace_strict({k: s.key for k, s in systems.items()},
                                                            return_dtype=pl.String).alias("_system"),
            gpn.alias("_gpn")]
    for c, choices in (("algorithm", _ALL_ALGOS), ("protocol", PROTOCOLS)):
        if c in df.columns:
            if df.schema[c] not in (pl.String, pl.Categorical, pl.Enum, pl.Null):
                raise InputError(f"{where}: column '{c}' has type {df.schema[c]}, expected a string")
            vals = pl.col(c).cast(pl.String).str.to_lowercase()
            vals = pl.when(vals == "auto").then(None).otherwise(vals)
            got = set(df.select(vals.alias("v"))["v"].drop_nulls().unique().to_list())
            if got - set(choices):
                raise InputError(f"{where}: column '{c}' has unknown value(s) {sorted(got - set(choices))}; "
                                 f"known: {', '.join(choices)} (or auto)")
            cols.append(vals.alias(f"_{c}"))
        else:
            cols.append(pl.lit(None, dtype=pl.String).alias(f"_{c}"))
    if "channels" in df.columns:
        if not (df.schema["channels"].is_integer() or df.schema["channels"] == pl.Null):
            raise InputError(f"{where}: column 'channels' has type {df.schema['channels']}, expected an integer")
        if (df["channels"].drop_nulls() <= 0).any():
            raise InputError(f"{where}: column 'channels' must be positive")
        cols.append(pl.col("channels").cast(pl.Int64).alias("_channels"))
    else:
        cols.append(pl.lit(None, dtype=pl.Int64).alias("_channels"))
    return df.with_columns(cols)


_KEY = ["_system", "collective", "num_gpus", "_gpn", "_algorithm", "_protocol", "_channels"]


def _plan_index(df: pl.DataFrame) -> tuple[np.ndarray, pl.DataFrame]:
    """Group the rows of ``df`` by their :data:`_KEY` columns: ``(inv, keys)``, ``inv[i]``
    row ``i``'s group in order of first appearance, ``keys`` the :data:`_KEY` columns of
    each group (a row per group, in that order). A column equal in every row is left
    out of the key; when only integer columns are left (the fused families: one
    system and collective, num_gpus varying), the
    rows are grouped by :func:`tsbatch.kernels.rowhash.dedup_rows` over them (null as
    -1: every value is positive); otherwise by ``unique(maintain_order=True)`` and a
    left join (coding text columns first costs more than the join saves)."""
    from tsbatch.kernels.rowhash import dedup_rows

    n = df.height
    parts = []
    for c in _KEY:
        s = df.get_column(c)
        nulls = s.null_count()
        if nulls == n or (nulls == 0 and (s == s[0]).all()):
            continue  # one value (or null) in every row
        if not s.dtype.is_integer():
            keys = df.select(_KEY).unique(maintain_order=True).with_row_index("_plan")
            inv = df.join(keys, on=_KEY, how="left", nulls_equal=True,
                          maintain_order="left")["_plan"].to_numpy().astype(np.int64)
            return inv, keys.select(_KEY)
        parts.append(s.cast(pl.Int64).fill_null(-1).to_numpy())
    if not parts:
        return np.zeros(n, dtype=np.int64), df.head(1).select(_KEY)
    inv, rep = dedup_rows(np.column_stack(parts))
    return inv, df[rep].select(_KEY)


def plans_to_arrays(plans: list[Plan]) -> dict:
    """Concatenate plans into the kernel's CSR arrays (link ids offset per plan).

    Plan -> variants (``plan_var_ptr``) -> cost lines (``var_line_ptr``: one per active
    channel count, and per side of the network buffer window) -> stages -> link loads.
    """
    plan_var_ptr = [0]
    var_line_ptr, var_unit, var_nch, var_win = [0], [], [], []
    line_base, line_eff, line_cap, line_stage_ptr = [], [], [], [0]
    sel_lat, sel_inv, sel_tree, sel_max = [], [], [], []
    st_alpha, st_reps, st_load_ptr = [], [], [0]
    ld_link, ld_frac, link_bw = [], [], []
    var_index = []  # (plan, variant)
    for pi, plan in enumerate(plans):
        off = len(link_bw)
        if plan.topology is not None:
            link_bw.extend(plan.topology.bw)
        for vi, v in enumerate(plan.variants):
            sel_lat.append(v.sel_lat_us)
            sel_inv.append(v.sel_inv_bw)
            sel_tree.append(v.sel_tree)
            sel_max.append(v.sel_max_bytes)
            var_unit.append(v.chan_unit if v.lines else math.inf)
            var_nch.append(v.n_chan if v.lines else 1)
            var_win.append(v.window_bytes if v.lines else 0.0)
            var_index.append((pi, vi))
            for line in v.kernel_lines():
                line_base.append(v.base_us)
                line_eff.append(line.proto_eff)
                line_cap.append(line.cap_gbps)
                for alpha, reps, loads in v.kernel_stages(line.stages):
                    st_alpha.append(alpha)
                    st_reps.append(reps)
                    for lk, f in loads.items():
                        ld_link.append(off + lk)
                        ld_frac.append(f)
                    st_load_ptr.append(len(ld_link))
                line_stage_ptr.append(len(st_alpha))
            var_line_ptr.append(len(line_base))
        plan_var_ptr.append(len(sel_lat))
    i64 = lambda x: np.asarray(x, dtype=np.int64)  # noqa: E731
    f64 = lambda x: np.asarray(x, dtype=np.float64)  # noqa: E731
    return dict(plan_var_ptr=i64(plan_var_ptr), var_line_ptr=i64(var_line_ptr), var_chan_unit=f64(var_unit),
                var_n_chan=i64(var_nch), var_window_bytes=f64(var_win),
                line_base_us=f64(line_base), line_stage_ptr=i64(line_stage_ptr),
                line_proto_eff=f64(line_eff), line_cap_gbps=f64(line_cap), stage_alpha_us=f64(st_alpha),
                stage_reps=f64(st_reps), stage_load_ptr=i64(st_load_ptr), load_link=i64(ld_link),
                load_frac=f64(ld_frac), link_bw_gbps=f64(link_bw), var_sel_lat_us=f64(sel_lat),
                var_sel_inv_bw=f64(sel_inv), var_sel_tree=i64(sel_tree), var_sel_max_bytes=f64(sel_max),
                tree_corr=f64(TREE_CORRECTION), var_index=var_index)


def evaluate(frame: pl.DataFrame, hw=None, *, where: str = "candidates") -> pl.DataFrame:
    """Predict every row; input columns first, then :data:`RESULT_COLUMNS`.

    ``hw`` is ignored (a collective names its system per row); it is accepted
    so the family fits :class:`kernels_catalog.base.Family`'s ``evaluate``.
    """
    if frame.height == 0:
        for c in ("system", "collective", "num_gpus", "bytes"):
            if c not in frame.columns:
                raise InputError(f"{where}: missing column '{c}'")
        return frame.with_columns(
            pl.lit(None, dtype=pl.Float64).alias("latency_us"), pl.lit(None, dtype=pl.Boolean).alias("feasible"),
            *(pl.lit(None, dtype=pl.String).alias(c) for c in ("infeasible_reason", "algorithm_used",
                                                               "protocol_used")),
            pl.lit(None, dtype=pl.Int64).alias("stages"), pl.lit(None, dtype=pl.String).alias("bottleneck_link"),
            pl.lit(None, dtype=pl.Float64).alias("alg_bw_gbps"), pl.lit(None, dtype=pl.Float64).alias("bus_bw_gbps"))
    df = validate(frame, where)
    plan_idx, keys = _plan_index(df)
    plans = [build_plan(r[0], r[1], int(r[2]), int(r[3]), r[4], r[5], None if r[6] is None else int(r[6]))
             for r in keys.iter_rows()]
    arrays = plans_to_arrays(plans)
    feasible_plan = np.array([p.feasible for p in plans], dtype=bool)
    row_plan = np.where(feasible_plan[plan_idx], plan_idx, -1)
    nbytes = df["bytes"].to_numpy().astype(np.float64)
    var_index = arrays.pop("var_index")
    lat, var, link, _bw = evaluate_rows(row_plan, np.full(len(row_plan), -1, dtype=np.int64), nbytes, **arrays)
    # per-variant and per-link labels, gathered by index (no per-row Python)
    n_var = len(var_index)
    v_algo = pl.Series([plans[p].variants[v].algorithm for p, v in var_index] + [None], dtype=pl.String)
    v_proto = pl.Series([plans[p].variants[v].protocol for p, v in var_index] + [None], dtype=pl.String)
    v_stages = pl.Series([plans[p].variants[v].n_stages for p, v in var_index] + [0], dtype=pl.Int64)
    l_cls = []
    for p in plans:
        if p.topology is not None:
            l_cls.extend(p.topology.cls)
    n_link = len(l_cls)
    l_cls = pl.Series(l_cls + [None], dtype=pl.String)
    reasons = pl.Series([p.reason or None for p in plans], dtype=pl.String)
    feasible = row_plan >= 0
    vi = pl.Series(np.where(var >= 0, var, n_var))
    li = pl.Series(np.where(link >= 0, link, n_link))
    n = df["num_gpus"].to_numpy().astype(np.float64)
    coll = df["collective"].cast(pl.String)
    factor = np.where((coll == "all_reduce").to_numpy(), 2.0 * (n - 1) / n,
                      np.where(coll.is_in(["all_gather", "reduce_scatter", "all_to_all"]).to_numpy(),
                               (n - 1) / n, 1.0))
    alg_bw = np.where(feasible, nbytes / np.where(feasible, lat, 1.0) / 1e3, np.nan)
    out = frame.with_columns(
        pl.Series("latency_us", np.where(feasible, lat, np.nan)),
        pl.Series("feasible", feasible),
        reasons.gather(pl.Series(plan_idx)).alias("infeasible_reason"),
        v_algo.gather(vi).alias("algorithm_used"),
        v_proto.gather(vi).alias("protocol_used"),
        v_stages.gather(vi).alias("stages"),
        l_cls.gather(li).alias("bottleneck_link"),
        pl.Series("alg_bw_gbps", alg_bw),
        pl.Series("bus_bw_gbps", alg_bw * factor),
    ).with_columns(pl.when(pl.col("feasible")).then(None).otherwise(pl.col("infeasible_reason"))
                   .alias("infeasible_reason"))
    return out
