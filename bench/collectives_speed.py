"""Throughput of the batched α–β stage kernel: message sizes per second, against numpy.

    .venv/bin/python bench/collectives_speed.py [--rows 2000000] [--repeat 3]

Builds a candidate table of ``--rows`` message sizes (2 KiB to 1 GiB, log-uniform)
over every system, collective and a range of GPU counts, plans it once
(:func:`tsbatch.collectives.plan.build_plan` per configuration), then times

- the numba kernel (:func:`tsbatch.kernels.alphabeta.evaluate_rows`) alone;
- ``tsbatch.collectives.model.evaluate`` end to end (validation, planning, kernel,
  result columns);
- a numpy baseline computing the same Eq. 11 selection and cost with whole-array
  operations per plan, variant and stage;

checks that the kernel and the baseline agree, and prints rows per second.
Figures are medians of ``--repeat`` runs after a warm-up run.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import polars as pl

from tsbatch.collectives.model import _KEY, evaluate, plans_to_arrays, validate
from tsbatch.collectives.plan import build_plan
from tsbatch.collectives.systems import get_system, list_systems
from tsbatch.kernels.alphabeta import evaluate_rows


def candidates(rows: int, seed: int = 0) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    configs = []
    for key in list_systems():
        s = get_system(key)
        for coll in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"):
            for n in ((2,) if coll == "send_recv" else (2, 4, 8, 16, 32)):
                if n > s.max_gpus:
                    continue
                configs.append((key, coll, n, min(n, s.gpus_per_node)))
    pick = rng.integers(0, len(configs), rows)
    cfg = [configs[i] for i in range(len(configs))]
    sys_ = np.array([c[0] for c in cfg])[pick]
    coll = np.array([c[1] for c in cfg])[pick]
    n = np.array([c[2] for c in cfg])[pick]
    gpn = np.array([c[3] for c in cfg])[pick]
    nbytes = np.exp(rng.uniform(np.log(2048), np.log(1 << 30), rows)).astype(np.int64)
    return pl.DataFrame({"system": sys_, "collective": coll, "num_gpus": n, "gpus_per_node": gpn,
                         "bytes": nbytes})


def numpy_baseline(row_plan, nbytes, plans, a):
    """Same selection and Eq. 11 cost with numpy array operations (no numba)."""
    from tsbatch.collectives.nccl import TREE_CORRECTION

    out = np.full(nbytes.shape[0], np.nan)
    corr = np.asarray(TREE_CORRECTION)
    lg = np.floor(np.log2(np.maximum(nbytes / 64.0, 1.0))).astype(np.int64)
    order = np.argsort(row_plan, kind="stable")
    bounds = np.searchsorted(row_plan[order], np.arange(len(plans) + 1))
    for p in range(len(plans)):
        idx = order[bounds[p]:bounds[p + 1]]
        if idx.size == 0:
            continue
        S = nbytes[idx]
        lgp = lg[idx]
        v0, v1 = a["plan_var_ptr"][p], a["plan_var_ptr"][p + 1]
        sel = np.full((v1 - v0, idx.size), np.inf)
        cost = np.zeros((v1 - v0, idx.size))
        for j, v in enumerate(range(v0, v1)):
            inv = np.full(idx.size, a["var_sel_inv_bw"][v])
            if a["var_sel_tree"][v] >= 0:
                ok = lgp < corr.shape[1]
                inv[ok] = inv[ok] / corr[a["var_sel_tree"][v], lgp[ok]]
            s = a["var_sel_lat_us"][v] + S * inv
            s[S > a["var_sel_max_bytes"][v]] = np.inf
            sel[j] = s
            # the line of the channels NCCL runs at each size, and of the network buffer window
            nch = a["var_n_chan"][v]
            k = np.clip(np.floor(S / a["var_chan_unit"][v]), 1, nch).astype(np.int64) if nch > 1 else 1
            ln = a["var_line_ptr"][v] + k - 1 + np.where(S < a["var_window_bytes"][v], nch, 0)
            t = np.zeros(idx.size)
            for line in np.unique(ln):
                m = ln == line
                tl = np.full(int(m.sum()), a["line_base_us"][line])
                for kk in range(a["line_stage_ptr"][line], a["line_stage_ptr"][line + 1]):
                    l0, l1 = a["stage_load_ptr"][kk], a["stage_load_ptr"][kk + 1]
                    bw = np.minimum(a["link_bw_gbps"][a["load_link"][l0:l1]] * a["line_proto_eff"][line],
                                    a["line_cap_gbps"][line])
                    worst = (a["load_frac"][l0:l1] / (bw * 1e3)).max()
                    tl += a["stage_reps"][kk] * (a["stage_alpha_us"][kk] + S[m] * worst)
                t[m] = tl
            cost[j] = t
        best = np.argmin(sel, axis=0)
        best[~np.isfinite(sel.min(axis=0))] = 0
        out[idx] = cost[best, np.arange(idx.size)]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    df = candidates(args.rows)
    v = validate(df)
    keys = v.select(_KEY).unique(maintain_order=True).with_row_index("_plan")
    plans = [build_plan(r[0], r[1], int(r[2]), int(r[3]), r[4], r[5], None)
             for r in keys.select(_KEY).iter_rows()]
    a = plans_to_arrays(plans)
    a.pop("var_index")
    row_plan = v.join(keys, on=_KEY, how="left", nulls_equal=True, maintain_order="left")["_plan"].to_numpy()
    feas = np.array([p.feasible for p in plans])
    row_plan = np.where(feas[row_plan], row_plan, -1).astype(np.int64)
    nbytes = v["bytes"].to_numpy().astype(np.float64)
    none = np.full(row_plan.shape[0], -1, dtype=np.int64)

    def timed(fn):
        fn()  # warm-up (compilation / cache load)
        ts = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            r = fn()
            ts.append(time.perf_counter() - t0)
        return float(np.median(ts)), r

    t_kernel, (lat, *_rest) = timed(lambda: evaluate_rows(row_plan, none, nbytes, **a))
    t_kernel1, _ = timed(lambda: evaluate_rows(row_plan, none, nbytes, **a, threads=1))
    t_np, lat_np = timed(lambda: numpy_baseline(row_plan, nbytes, plans, a))
    t_e2e, _ = timed(lambda: evaluate(df))
    ok = ~np.isnan(lat)
    agree = np.allclose(lat[ok], lat_np[ok], rtol=1e-9)
    n = args.rows
    print(f"{n} message sizes, {len(plans)} configurations ({int(feas.sum())} feasible), "
          f"{len(a['var_sel_lat_us'])} variants, {len(a['line_base_us'])} cost lines, "
          f"{len(a['stage_alpha_us'])} stages")
    print(f"numba kernel, all threads : {t_kernel * 1e3:9.1f} ms  {n / t_kernel / 1e6:7.2f} M sizes/s")
    print(f"numba kernel, one thread  : {t_kernel1 * 1e3:9.1f} ms  {n / t_kernel1 / 1e6:7.2f} M sizes/s")
    print(f"numpy baseline            : {t_np * 1e3:9.1f} ms  {n / t_np / 1e6:7.2f} M sizes/s")
    print(f"evaluate() end to end     : {t_e2e * 1e3:9.1f} ms  {n / t_e2e / 1e6:7.2f} M sizes/s")
    print(f"kernel / numpy speed-up   : {t_np / t_kernel:.1f}x; results agree: {agree}")


if __name__ == "__main__":
    main()
