"""α–β stage cost of routed collectives (TileSight §3.6, Eq. 11), batched over rows.

A collective is planned once per distinct configuration (system, collective,
GPU count, GPUs per node, algorithm, protocol, channels) by
:mod:`tsbatch.collectives.plan` into *variants* (one algorithm–protocol pair
each), a variant into ordered *stages*, and a stage into its per-link *loads*:
the bytes that the stage's logical exchanges route through each link, per byte
of message. A row is one message size on one plan. For each row and each of its
plan's variants the kernel evaluates Eq. 11 stage by stage,

``T_k = alpha_k + max_l beta_l(v) * B_{l,k}``,  ``T = base(v) + sum_k reps_k * T_k``

with ``B_{l,k} = load_frac * bytes`` and the link's inverse bandwidth under the
variant's protocol, ``beta_l(v) = 1 / min(bw_l * proto_eff(v), cap(v))``
(``cap`` is the protocol's per-link ceiling from NCCL's tuning model). Which
variant runs is NCCL's decision, made by NCCL's own tuning model
(``latency + bytes / bandwidth`` per algorithm and protocol, with the bus
bandwidth taken from the routed topology): the kernel picks the variant that
model ranks first for the row's size, unless the row forces one, and costs
that variant by Eq. 11. ``reps_k`` counts identical stages (ring steps), which the paper evaluates
once and multiplies. Stages of a pipelined algorithm (tree, in-switch
reduction, point-to-point) run concurrently in chunks: the planner merges
their loads into one stage whose ``alpha`` is the sum of theirs.

A stage's bottleneck serialization is linear in the message size, so the
kernel evaluates Eq. 11 stage by stage once per variant (``T(S) = a + b S``,
with each stage's bottleneck link) and then runs over the rows.

Everything here is arrays in, arrays out; no polars, no files.
"""

from __future__ import annotations

import math

import numpy as np

from tsbatch.kernels._config import jit_serial
from tsbatch.kernels._threads import even_bounds, run_shares

__all__ = ["stage_times", "evaluate_rows", "MIN_SHARE_ROWS"]

#: rows per thread share below which one thread does all the work
MIN_SHARE_ROWS = 1 << 16


@jit_serial
def _variant_lines(line_base_us, line_stage_ptr, line_proto_eff, line_cap_gbps, stage_alpha_us,
                   stage_reps, stage_load_ptr, load_link, load_frac, link_bw_gbps,
                   out_a, out_b, out_link):
    """Eq. 11 stage by stage, once per cost line: ``T(S) = a + b S``.

    A stage's bottleneck serialization ``max_l beta_l B_{l,k}`` is linear in
    the message size (every ``B_{l,k}`` is ``load_frac * S``), so its
    bottleneck link and its per-byte cost are found once per stage for all
    rows: ``a = base + sum_k reps_k alpha_k`` and ``b = sum_k reps_k max_l
    frac_l / bw_l``. ``out_link`` is the bottleneck link of the stage with the
    largest serialization. A variant has one line per active channel count
    (and per side of the network buffer window); a row picks its line by size.
    """
    for v in range(line_base_us.shape[0]):
        a = line_base_us[v]
        b = 0.0
        eff = line_proto_eff[v]
        cap = line_cap_gbps[v]
        best_link = -1
        best_term = -1.0
        for k in range(line_stage_ptr[v], line_stage_ptr[v + 1]):
            worst = 0.0
            worst_link = -1
            for j in range(stage_load_ptr[k], stage_load_ptr[k + 1]):
                lk = load_link[j]
                bw = link_bw_gbps[lk] * eff
                if bw > cap:
                    bw = cap
                # bytes / (GB/s * 1e3) = microseconds
                term = load_frac[j] / (bw * 1e3)
                if term > worst:
                    worst = term
                    worst_link = lk
            if stage_reps[k] * worst > best_term:
                best_term = stage_reps[k] * worst
                best_link = worst_link
            a += stage_reps[k] * stage_alpha_us[k]
            b += stage_reps[k] * worst
        out_a[v] = a
        out_b[v] = b
        out_link[v] = best_link


@jit_serial
def _rows(row_plan, row_var, nbytes, plan_var_ptr, var_line_ptr, var_chan_unit, var_n_chan,
          var_window_bytes, line_a, line_b, line_link, var_sel_lat_us,
          var_sel_inv_bw, var_sel_tree, var_sel_max_bytes, tree_corr, out_us, out_var, out_link,
          out_bw_us, lo, hi):
    for i in range(lo, hi):
        p = row_plan[i]
        if p < 0:
            out_us[i] = np.nan
            out_var[i] = -1
            out_link[i] = -1
            out_bw_us[i] = np.nan
            continue
        best_v = row_var[i]
        if best_v < 0:
            # the variant NCCL's tuning model predicts fastest: latency + bytes / bandwidth,
            # its tree bandwidth corrected by NCCL's factor for log2i(bytes >> 6)
            best_s = np.inf
            x = nbytes[i]
            lg = math.frexp(x / 64.0)[1] - 1 if x >= 64.0 else 0
            for v in range(plan_var_ptr[p], plan_var_ptr[p + 1]):
                if x > var_sel_max_bytes[v]:
                    continue
                inv = var_sel_inv_bw[v]
                tp = var_sel_tree[v]
                if tp >= 0 and lg < tree_corr.shape[1]:
                    inv = inv / tree_corr[tp, lg]
                ts = var_sel_lat_us[v] + x * inv
                if ts < best_s:
                    best_s = ts
                    best_v = v
            if best_v < 0 and plan_var_ptr[p + 1] > plan_var_ptr[p]:
                best_v = plan_var_ptr[p]  # none eligible by NCCL's rules: the first
        if best_v < 0:
            out_us[i] = np.nan
            out_var[i] = -1
            out_link[i] = -1
            out_bw_us[i] = np.nan
            continue
        # the line of the channels NCCL runs at this size (enqueue.cc: nc = clamp(nBytes /
        # (nt * threadThreshold), 1, nChannels)) and of the network buffer window
        x = nbytes[i]
        nch = var_n_chan[best_v]
        k = 1
        if nch > 1:
            q = x / var_chan_unit[best_v]
            k = nch if q >= nch else (int(q) if q >= 1.0 else 1)
        ln = var_line_ptr[best_v] + k - 1
        if x < var_window_bytes[best_v]:
            ln += nch
        bw = line_b[ln] * x
        out_us[i] = line_a[ln] + bw
        out_var[i] = best_v
        out_link[i] = line_link[ln]
        out_bw_us[i] = bw


def stage_times(nbytes: float, stage_alpha_us: np.ndarray, stage_reps: np.ndarray,
                stage_load_ptr: np.ndarray, load_link: np.ndarray, load_frac: np.ndarray,
                link_bw_gbps: np.ndarray, proto_eff: float = 1.0,
                cap_gbps: float = np.inf) -> np.ndarray:
    """Per-stage Eq. 11 times (us, one repetition each) of one variant: for ``explain``."""
    out = np.empty(stage_alpha_us.shape[0], dtype=np.float64)
    for k in range(out.shape[0]):
        worst = 0.0
        for j in range(stage_load_ptr[k], stage_load_ptr[k + 1]):
            bw = min(link_bw_gbps[load_link[j]] * proto_eff, cap_gbps)
            worst = max(worst, load_frac[j] * nbytes / (bw * 1e3))
        out[k] = stage_alpha_us[k] + worst
    return out


def evaluate_rows(row_plan, row_var, nbytes, plan_var_ptr, var_line_ptr, var_chan_unit, var_n_chan,
                  var_window_bytes, line_base_us, line_stage_ptr, line_proto_eff, line_cap_gbps,
                  stage_alpha_us, stage_reps, stage_load_ptr, load_link, load_frac, link_bw_gbps,
                  var_sel_lat_us, var_sel_inv_bw, var_sel_tree, var_sel_max_bytes, tree_corr, *,
                  threads: int | None = None):
    """Predict every row: the variant NCCL's tuner picks (or the forced one), costed by Eq. 11.

    Parameters
    ----------
    row_plan : int64 (n,)
        Plan index of each row; ``-1`` marks an infeasible row (NaN out).
    row_var : int64 (n,)
        Global variant index a row forces, ``-1`` for the plan's automatic
        choice: the variant with the least *selection* time
        ``sel_lat + bytes * sel_inv_bw`` (NCCL's tuning model, with its tree
        correction factor ``tree_corr[protocol, log2(bytes / 64)]`` where
        ``sel_tree >= 0``), among those with ``bytes <= sel_max_bytes``.
    nbytes : float64 (n,)
        Message size in bytes.
    plan_var_ptr, var_line_ptr, line_stage_ptr, stage_load_ptr : int64
        CSR offsets: plan -> variants, variant -> cost lines, line -> stages,
        stage -> link loads.
    var_chan_unit : float64, var_n_chan : int64, var_window_bytes : float64 (n_var,)
        Per variant: message bytes per NCCL channel step (NCCL runs ``clamp(floor(bytes /
        unit), 1, n_chan)`` channels; line ``k - 1``), the number of channel lines, and the
        network buffer window (messages under it take the ``n_chan`` lines after those;
        0: none).
    line_base_us, line_proto_eff, line_cap_gbps : float64 (n_line,)
        Per line: fixed cost (software base latency and launch), protocol
        bandwidth efficiency and per-link bandwidth ceiling in GB/s (the
        protocol's per-channel cap times the line's channels).
    stage_alpha_us, stage_reps : float64 (n_stage,)
        Per stage: routed hop latency and how many identical stages it stands for.
    load_link : int64, load_frac : float64 (n_load,)
        Link id and bytes routed through it per message byte.
    link_bw_gbps : float64 (n_link,)
        Achieved one-direction bandwidth of every link.
    var_sel_lat_us, var_sel_inv_bw, var_sel_max_bytes : float64, var_sel_tree : int64 (n_var,)
        NCCL's predicted latency (us), inverse bandwidth (us per byte),
        largest eligible size, and tree-correction protocol row (-1: none).
    tree_corr : float64 (3, m)
        NCCL's tree correction factors by protocol and power-of-two size.

    Returns
    -------
    latency_us, variant, bottleneck_link, bandwidth_us : ndarray
        Time, chosen global variant, the link whose serialization dominates
        the slowest stage, and the summed serialization (bandwidth) term.

    Notes
    -----
    Eq. 11 of TileSight: a stage costs its routed hop latency plus the
    serialization of its bottleneck link; a collective is the ordered sum of
    its stages. The bottleneck term is linear in the message size, so each
    line's stage bottlenecks are found once (``_variant_lines``) and a row costs
    its chosen variant's line ``a + b * bytes``, the line found in O(1) from the
    size. Time never falls when a link's bandwidth falls: every stage term is
    non-increasing in ``link_bw_gbps``, and neither the choice of variant (NCCL's
    model, fixed per plan) nor the choice of line (by size) reads it.
    """
    n = int(nbytes.shape[0])
    i64 = lambda a: np.ascontiguousarray(a, dtype=np.int64)  # noqa: E731
    f64 = lambda a: np.ascontiguousarray(a, dtype=np.float64)  # noqa: E731
    row_plan, row_var, nbytes = i64(row_plan), i64(row_var), f64(nbytes)
    plan_var_ptr, var_line_ptr = i64(plan_var_ptr), i64(var_line_ptr)
    var_chan_unit, var_n_chan, var_window_bytes = f64(var_chan_unit), i64(var_n_chan), f64(var_window_bytes)
    line_args = (f64(line_base_us), i64(line_stage_ptr), f64(line_proto_eff), f64(line_cap_gbps),
                 f64(stage_alpha_us), f64(stage_reps), i64(stage_load_ptr), i64(load_link),
                 f64(load_frac), f64(link_bw_gbps))
    sel = (f64(var_sel_lat_us), f64(var_sel_inv_bw), i64(var_sel_tree), f64(var_sel_max_bytes), f64(tree_corr))
    out_us = np.empty(n, dtype=np.float64)
    out_var = np.empty(n, dtype=np.int64)
    out_link = np.empty(n, dtype=np.int64)
    out_bw = np.empty(n, dtype=np.float64)
    if n == 0:
        return out_us, out_var, out_link, out_bw
    nl = int(line_args[0].shape[0])
    line_a = np.empty(nl, dtype=np.float64)
    line_b = np.empty(nl, dtype=np.float64)
    line_link = np.empty(nl, dtype=np.int64)
    _variant_lines(*line_args, line_a, line_b, line_link)
    bounds = [0, n] if threads == 1 else even_bounds(n, MIN_SHARE_ROWS)
    run_shares(_rows, (row_plan, row_var, nbytes, plan_var_ptr, var_line_ptr, var_chan_unit, var_n_chan,
                       var_window_bytes, line_a, line_b, line_link, *sel, out_us, out_var, out_link,
                       out_bw), bounds)
    return out_us, out_var, out_link, out_bw
