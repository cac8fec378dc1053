"""Calibrate a system file's few collective constants on measured NCCL times.

    .venv/bin/python bench/collectives_calibrate.py dgx_a100 ../shared/data/collectives/*.parquet

Reads the measured files whose ``system`` column resolves to the named system
and searches, one constant at a time (coordinate descent over a fixed grid,
three sweeps), the values that minimise the mean per-file WMAPE:

- ``launch_overhead_us``, ``rank_skew_us`` on rows under 64 KiB (the latency regime);
- ``nvlink_efficiency``, ``pcie_efficiency``, ``net_efficiency`` and
  (``--node-cap``) ``net_node_bw_gbps`` on rows of at least 1 MiB.

Nothing is fitted per message size, per GPU count or per file: one value per
constant for the system. It prints the values to copy into
``hw/systems/<system>.toml`` with the rows and files they were fitted on; it
writes nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import numpy as np
import polars as pl

from tsbatch.collectives import plan as plan_mod
from tsbatch.collectives.model import evaluate
from tsbatch.collectives.systems import get_system

GRIDS = {
    "launch_overhead_us": np.arange(0.0, 60.1, 1.0),
    "rank_skew_us": np.arange(0.0, 30.1, 0.5),
    "nvlink_efficiency": np.arange(0.40, 1.201, 0.01),
    "pcie_efficiency": np.arange(0.30, 1.001, 0.01),
    "net_efficiency": np.arange(0.05, 1.001, 0.01),
    "net_node_bw_gbps": np.arange(5.0, 200.1, 1.0),
    "nccl_channels": np.arange(2, 33, 1),
    "duplex_factor": np.arange(1.0, 2.001, 0.02),
    "net_duplex_factor": np.arange(1.0, 2.001, 0.02),
    "net_burst_efficiency": np.arange(0.05, 1.001, 0.01),
    "nvlink_alpha_us": np.arange(0.2, 3.01, 0.1),
    "net_staging_bw_gbps": np.arange(2.0, 30.01, 0.25),
    "shm_bw_gbps": np.arange(2.0, 40.01, 0.25),
}


def _load(paths, key):
    parts = []
    for p in paths:
        d = pl.read_parquet(p)
        d = d.filter(pl.col("system").map_elements(lambda s: get_system(s).key == key, return_dtype=pl.Boolean))
        if d.height:
            d = (d.group_by(["system", "collective", "num_gpus", "gpus_per_node", "bytes"])
                 .agg(pl.col("time_ms_median").median()).with_columns(file=pl.lit(str(p))))
            parts.append(d)
    return pl.concat(parts) if parts else None


def _score(frame, system, cal):
    cal = dict(cal)
    alpha = cal.pop("nvlink_alpha_us", None)
    sys_ = dataclasses.replace(system, calibration={**system.calibration, **cal})
    if alpha is not None and sys_.nvlink is not None:
        sys_ = dataclasses.replace(sys_, nvlink=dataclasses.replace(sys_.nvlink, alpha_us=float(alpha)))
    plan_mod.build_plan.cache_clear()
    orig = plan_mod.get_system
    plan_mod.get_system = lambda name: sys_ if name == system.key else orig(name)
    try:
        out = evaluate(frame)
    finally:
        plan_mod.get_system = orig
        plan_mod.build_plan.cache_clear()
    meas = out["time_ms_median"].to_numpy() * 1e3
    pred = out["latency_us"].to_numpy()
    files = out["file"].to_numpy()
    w = []
    for f in np.unique(files):
        m = files == f
        w.append(np.abs(pred[m] - meas[m]).sum() / meas[m].sum())
    return float(np.mean(w)) * 100


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("system")
    ap.add_argument("measured", nargs="+")
    ap.add_argument("--node-cap", action="store_true", help="also fit net_node_bw_gbps")
    ap.add_argument("--channels", action="store_true", help="also fit nccl_channels")
    ap.add_argument("--duplex", action="store_true", help="also fit duplex_factor")
    ap.add_argument("--net-duplex", action="store_true", help="also fit net_duplex_factor (a NIC's own)")
    ap.add_argument("--burst", action="store_true",
                    help="also fit net_burst_efficiency (point-to-point messages within NCCL_BUFFSIZE)")
    ap.add_argument("--staging", action="store_true",
                    help="also fit net_staging_bw_gbps (network traffic staged through host memory "
                         "over the GPUs' PCIe switch uplinks: GPUDirect RDMA off)")
    ap.add_argument("--shm", action="store_true",
                    help="also fit shm_bw_gbps (PCIe traffic staged through host memory where "
                         "peer-to-peer is off: links.pcie.p2p_level)")
    ap.add_argument("--only", default="", help="comma-separated constants to fit (default: all named)")
    ap.add_argument("--alpha", action="store_true",
                    help="also fit the NVLink hop latency (links.nvlink.alpha_us, NCCL's 0.6 us)")
    args = ap.parse_args(argv)
    system = get_system(args.system)
    frame = _load(args.measured, system.key)
    if frame is None:
        print(f"no measured rows for {system.key}", file=sys.stderr)
        return 2
    small = frame.filter(pl.col("bytes") < 65536)
    large = frame.filter(pl.col("bytes") >= 1 << 20)
    cal = dict(system.calibration)
    keys_large = ["nvlink_efficiency", "pcie_efficiency", "net_efficiency"]
    if args.node_cap:
        keys_large.append("net_node_bw_gbps")
        cal.setdefault("net_node_bw_gbps", 100.0)
    if args.duplex:
        keys_large.append("duplex_factor")
        cal.setdefault("duplex_factor", 1.6)
    if args.net_duplex:
        keys_large.append("net_duplex_factor")
        cal.setdefault("net_duplex_factor", cal.get("duplex_factor", 1.6))
    if args.burst:
        keys_large.append("net_burst_efficiency")
        cal.setdefault("net_burst_efficiency", cal.get("net_efficiency", 0.3))
    if args.staging:
        keys_large.append("net_staging_bw_gbps")
        cal.setdefault("net_staging_bw_gbps", 8.0)
    if args.shm:
        keys_large.append("shm_bw_gbps")
        cal.setdefault("shm_bw_gbps", 12.0)
    if args.channels:
        keys_large.append("nccl_channels")
        cal.setdefault("nccl_channels", 12)
    if args.alpha and system.nvlink is not None:
        keys_large.append("nvlink_alpha_us")
        cal.setdefault("nvlink_alpha_us", system.nvlink.alpha_us)
    used = {"nvlink": system.nvlink is not None, "pcie": system.pcie is not None, "net": system.net is not None}
    keys_large = [k for k in keys_large if used.get(k.split("_")[0], True)]
    if system.nvlink is None or system.nvlink.topology == "switched":
        keys_large = [k for k in keys_large if k != "pcie_efficiency"]  # no PCIe path in collectives
    only = [k for k in args.only.split(",") if k]
    if only:
        keys_large = [k for k in keys_large if k in only]
    for _ in range(3):
        for k in keys_large:
            scores = [(_score(large, system, {**cal, k: v}), v) for v in GRIDS[k]]
            cal[k] = float(min(scores)[1])
        for k in [k for k in ("launch_overhead_us", "rank_skew_us") if not only or k in only]:
            scores = [(_score(small, system, {**cal, k: v}), v) for v in GRIDS[k]]
            cal[k] = float(min(scores)[1])
    print(f"{system.key}: fitted on {frame['file'].n_unique()} file(s), {small.height} rows < 64 KiB, "
          f"{large.height} rows >= 1 MiB")
    for k, v in cal.items():
        print(f"  {k} = {v:g}")
    print(f"  mean per-file WMAPE: >=1 MiB {_score(large, system, cal):.2f} %, "
          f"<64 KiB {_score(small, system, cal):.2f} %, all {_score(frame, system, cal):.2f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
