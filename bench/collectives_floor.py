"""How low a size-smooth model's WMAPE can go on measured collective files (the noise floor).

    .venv/bin/python bench/collectives_floor.py ../shared/data/collectives/*.parquet

For every file, job shape (system, collective, num_gpus, gpus_per_node) and size band
(powers of two: [2^k, 2^(k+1)) bytes), the least-absolute-error line ``a + b * bytes``
over that band's rows (``b`` exactly by a weighted median for each ``a`` of a fixed grid),
then the file's WMAPE of those per-band lines. No model linear in the size within a band
(the analytical model is: a line per variant, channel count and buffer window) can do
better, since each band gets its own best line here; what is left is the scatter of the
measurements from size to size. An oracle for judging targets, not a model: nothing
here is used for prediction, and it writes nothing.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import polars as pl

SHAPE = ["system", "collective", "num_gpus", "gpus_per_node"]


def best_line_l1(size: np.ndarray, meas: np.ndarray, n_grid: int = 81) -> float:
    """Least sum of |a + b size - meas| over a grid of intercepts ``a`` (b exact per a)."""
    if size.size <= 2:
        return 0.0
    lo = -float(meas.min())
    hi = float(meas.min())
    best = np.inf
    for a in np.linspace(lo, hi, n_grid):
        k = (meas - a) / size  # b = weighted median of (meas - a) / size, weights size
        order = np.argsort(k)
        w = np.cumsum(size[order])
        b = k[order][np.searchsorted(w, w[-1] / 2.0)]
        best = min(best, float(np.abs(a + b * size - meas).sum()))
    return best


def floor_of(frame: pl.DataFrame) -> tuple[float, dict]:
    frame = frame.with_columns(band=pl.col("bytes").log(2).floor().cast(pl.Int64),
                               meas=pl.col("time_ms_median") * 1e3)
    err = 0.0
    per_shape: dict = {}
    for key, g in frame.group_by(SHAPE + ["band"], maintain_order=True):
        e = best_line_l1(g["bytes"].to_numpy().astype(np.float64), g["meas"].to_numpy())
        err += e
        k = tuple(key[:4])
        per_shape.setdefault(k, [0.0, 0.0])
        per_shape[k][0] += e
        per_shape[k][1] += float(g["meas"].sum())
    return 100.0 * err / float(frame["meas"].sum()), per_shape


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("measured", nargs="+")
    ap.add_argument("--shapes", action="store_true", help="also print the floor per job shape")
    args = ap.parse_args(argv)
    for path in args.measured:
        d = pl.read_parquet(path)
        d = d.filter(pl.col("time_ms_median") > 0)
        if "gpus_per_node" not in d.columns:
            d = d.with_columns(gpus_per_node=pl.col("num_gpus"))
        f, per = floor_of(d)
        print(f"{path}: {d.height} rows, WMAPE floor {f:.2f} %")
        if args.shapes:
            for k, (e, m) in sorted(per.items()):
                print(f"    {k}: {100 * e / m:.2f} % of its time, {100 * m / d['time_ms_median'].sum() / 1e3:.1f} % share")
    return 0


if __name__ == "__main__":
    sys.exit(main())
