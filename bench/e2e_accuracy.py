"""End-to-end accuracy on the dev file, dev fit and leave-one-GPU-out, beside the peers.

    python bench/e2e_accuracy.py [--data ../shared/data/e2e/pipeweave_vllm_dev.parquet] [--fit]

Prints MAPE of prefill, decode step and total time per GPU for: the shipped engine
constants (tsbatch/serving/engines.toml), the four constants fitted on all dev rows
(--fit prints them: the values engines.toml records), fitted on A100 rows only and
scored on H100, fitted on H100 only and scored on A100, and the constants at zero (the
kernels alone). The peers' figures are those the issue quotes from the collector's
e2e/*_comparison.csv (PipeWeave is learned per GPU from kernel measurements of these
GPUs).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tsbatch.serving.accuracy import fit_engine, load_e2e, predict_rows, score  # noqa: E402
from tsbatch.serving.deploy import engine_profile  # noqa: E402

PEERS = {  # prefill MAPE / decode MAPE on these configurations (issue 34)
    "PipeWeave (learned per GPU)": (4.1, 9.3),
    "NeuSight": (73.0, 24.0),
    "Habitat": (82.0, 11.0),
    "roofline": (50.0, None),
}
KEYS = ("gap_prefill_us", "step_prefill_us", "gap_decode_us", "step_decode_us")


def main() -> int:
    ap = argparse.ArgumentParser()
    shared = os.environ.get("TSBATCH_SHARED_DATA", str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--data", default=str(Path(shared) / "e2e" / "pipeweave_vllm_dev.parquet"))
    ap.add_argument("--fit", action="store_true", help="print the fitted constants")
    args = ap.parse_args()
    rows = load_e2e(args.data)
    print(f"{args.data}: {rows.height} rows; systems: "
          f"{', '.join(sorted(set(rows['system'])))}")
    shipped = {k: float(engine_profile("vllm")[k]) for k in KEYS}
    runs = [("shipped engines.toml", shipped, None)]
    fits = {"dev (all rows)": fit_engine(rows)}
    for g in sorted(rows["gpu"].unique()):
        fits[f"fit {g} only"] = fit_engine(rows.filter(pl.col("gpu") == g))
    runs += [(k, v, None) for k, v in fits.items()]
    runs.append(("constants at zero", {k: 0.0 for k in KEYS}, None))
    table = []
    for name, const, _ in runs:
        s = score(rows, predict_rows(rows, const))
        for r in s.iter_rows(named=True):
            table.append({"constants": name, **r})
        if args.fit:
            print(f"{name:24s} " + "  ".join(f"{k} {v:.1f}" for k, v in const.items()))
    t = pl.DataFrame(table)
    with pl.Config(tbl_rows=60, tbl_cols=12, tbl_width_chars=220, float_precision=2):
        print(t.select("constants", "gpu", "rows", "prefill_mape", "decode_step_mape",
                       "total_mape", "prefill_wmape", "decode_step_wmape", "total_wmape"))
    print("\nleave one GPU out (constants fitted on the other GPU's rows):")
    gpus = sorted(rows["gpu"].unique())
    for g in gpus:
        other = [o for o in gpus if o != g]
        if not other:
            continue
        r = t.filter((pl.col("constants") == f"fit {other[0]} only") & (pl.col("gpu") == g))
        r = r.row(0, named=True)
        print(f"  scored on {g}, fitted on {other[0]}: prefill MAPE {r['prefill_mape']:.2f}, "
              f"decode step MAPE {r['decode_step_mape']:.2f}, total MAPE {r['total_mape']:.2f}")
    print("\npeers on these configurations (prefill / decode MAPE, %):")
    for k, (a, b) in PEERS.items():
        print(f"  {k:28s} {a:5.1f} / {'-' if b is None else f'{b:.1f}'}")
    ship = t.filter(pl.col("constants") == "shipped engines.toml")
    print("\ntargets (prefill and decode-step MAPE <= 10 on each GPU):")
    ok = True
    for r in ship.filter(pl.col("gpu") != "all").iter_rows(named=True):
        hold = r["prefill_mape"] <= 10 and r["decode_step_mape"] <= 10
        ok &= hold
        print(f"  {r['gpu']}: prefill {r['prefill_mape']:.2f}, decode {r['decode_step_mape']:.2f}"
              f" -> {'hold' if hold else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
