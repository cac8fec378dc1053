"""Does the GEMM model ever predict less time for more work?

Two sweeps the guard (``bench/regress.py``) does not look at, because the
measured files hold no such series:

* **grid**: one Triton configuration, ``m`` growing one tile row at a time from
  just below one wave (at one resident tile an SM) to past three waves; the
  prediction must not fall when a tile is added;
* **K**: a library (cuBLAS) call growing in ``k``; a call whose K
  is a multiple of 8 (16-byte rows in fp16) must not be predicted slower than
  the call one element longer (misaligned rows, one more element of work) or
  than the next multiple of 8 (more work, the same alignment);
* **m / n** (reported; counted with ``--gate-mn``): a library call grown in m,
  then in n, the other sizes fixed (steps of 16 to 1024, of 256 to 8192:
  decode GEMMs growing in batch), and one Triton configuration grown the same
  way in steps of 16 (a ragged last tile row or column); the prediction must not
  fall. Left out of the gate while the falls of grids gaining a tile row (its
  L2 reuse lowers the DRAM bytes per tile) remain: docs/gemm_accuracy.md,
  "Library calls grown in m and n, session 5".

Falls smaller than ``--tol`` (relative; default 0.1 %) are left out (the cache
model's hit rates move by parts per million with the problem size). Prints
every fall found, and exits 1 when there is one, so it can gate a model
change::

    python bench/monotone.py                # a100, h100, h200
    python bench/monotone.py --hw h100 --tol 0.005
    python bench/monotone.py --gate-mn      # the m / n sweeps' falls count too
"""

from __future__ import annotations

import argparse
import itertools
import sys

import polars as pl

from tsbatch.front.api import evaluate_table
from tsbatch.hw import get_hw

CONFIG_KEYS = ["block_m", "block_n", "block_k", "num_stages", "num_warps"]
SHAPES_K = [(2432, 7552), (6656, 1664), (512, 512), (8192, 8192), (10496, 1024)]
#: library calls grown in m (n and k fixed) and in n (m and k fixed), in steps of
#: 16 up to 1024 and of 256 beyond (a decode GEMM growing in batch): (the fixed
#: one of m / n, k), split-K shapes, skinny and square ones
SHAPES_MN = [(1024, 4096), (128, 3840), (4096, 4096), (1024, 1024), (8192, 512), (64, 13824)]
MN_STEPS = [*range(16, 1025, 16), *range(1280, 8193, 256)]
#: one Triton configuration (block_m, block_n, block_k, stages, warps) grown in m
#: and in n in steps of 16 to 2048 (the last tile row or column ragged), on
#: (the fixed one of m / n, k)
MN_TRITON = [(64, 64, 32, 3, 4), (128, 128, 32, 4, 4), (128, 64, 64, 3, 8), (64, 128, 64, 4, 4)]
SHAPES_MN_TRITON = [(1024, 4096), (4096, 1024)]


def grid_rows(sms: int) -> pl.DataFrame:
    rows = []
    for bm, bn, bk, st, w in itertools.product([64, 128], [64, 128], [32, 64], [2, 3, 4], [4, 8]):
        for t in range(sms - 3, 3 * sms + 4):
            rows.append(dict(m=bm * t, n=bn, k=4096, block_m=bm, block_n=bn, block_k=bk,
                             num_stages=st, num_warps=w, split_k=1, dtype="float16",
                             a_row_major=True, b_row_major=False, tf32=False))
    return pl.DataFrame(rows)


def grid_falls(hw: str, sms: int, tol: float) -> pl.DataFrame:
    df = grid_rows(sms)
    out = evaluate_table(df, hw).with_columns(df["m"].alias("_m"))
    out = out.sort([*CONFIG_KEYS, "_m"]).with_columns(
        pl.col("latency_us").shift(-1).over(CONFIG_KEYS).alias("next_us"),
        pl.col("_m").shift(-1).over(CONFIG_KEYS).alias("next_m"))
    return (out.filter(pl.col("next_us") < pl.col("latency_us") * (1 - tol))
            .select([*CONFIG_KEYS, pl.col("_m").alias("m"), "latency_us", "next_m", "next_us"]))


def k_falls(hw: str, tol: float) -> pl.DataFrame:
    t = pl.DataFrame([dict(m=m, n=n, k=k, dtype="float16", a_row_major=True, b_row_major=False,
                           tf32=False, backend="cublas")
                      for m, n in SHAPES_K for k in range(8, 208)])
    t = t.with_columns(evaluate_table(t, hw).select("latency_us").to_series())
    falls = []
    for step in (1, 8):
        nxt = t.with_columns((pl.col("k") - step).alias("k")).rename({"latency_us": "next_us"})
        j = (t.filter(pl.col("k") % 8 == 0)
             .join(nxt.select(["m", "n", "k", "next_us"]), on=["m", "n", "k"])
             .filter(pl.col("next_us") < pl.col("latency_us") * (1 - tol))
             .with_columns(pl.lit(step).alias("plus_k")))
        falls.append(j.select(["m", "n", "k", "plus_k", "latency_us", "next_us"]))
    return pl.concat(falls)


def _falls(t: pl.DataFrame, keys: list, axis: str, tol: float) -> pl.DataFrame:
    """Rows whose next row along ``axis`` (same ``keys``) is predicted faster
    (``next_size``: that row's ``axis``)."""
    t = t.sort([*keys, axis]).with_columns(
        pl.col("latency_us").shift(-1).over(keys).alias("next_us"),
        pl.col(axis).shift(-1).over(keys).alias("next_size"))
    return t.filter(pl.col("next_us") < pl.col("latency_us") * (1 - tol))


def _mn_rows(shapes, steps, axis: str, **fixed) -> list:
    rows = []
    for a, b in shapes:
        for x in steps:
            m, n = (x, a) if axis == "m" else (a, x)
            rows.append(dict(m=m, n=n, k=b, dtype="float16", a_row_major=True,
                             b_row_major=False, tf32=False, axis=axis, **fixed))
    return rows


def library_mn_falls(hw: str, tol: float, shapes=SHAPES_MN) -> pl.DataFrame:
    """A library (cuBLAS) call grown in m, then in n, the other sizes fixed: its
    prediction (the best catalog tile's) must not fall from one size to the next."""
    t = pl.DataFrame([r for ax in ("m", "n")
                      for r in _mn_rows(shapes, MN_STEPS, ax, backend="cublas")])
    out = evaluate_table(t.drop("axis"), hw)
    t = t.with_columns(out["latency_us"], out["library_tile"])
    return pl.concat([_falls(t.filter(pl.col("axis") == ax), ["m" if ax == "n" else "n", "k"],
                             ax, tol).select(["axis", "m", "n", "k", "library_tile",
                                              "latency_us", "next_size", "next_us"])
                      for ax in ("m", "n")])


def triton_mn_falls(hw: str, tol: float, shapes=SHAPES_MN_TRITON,
                    configs=MN_TRITON) -> pl.DataFrame:
    """One Triton configuration's problem grown in m, then in n, in steps of 16
    (the last tile row or column ragged): its prediction must not fall."""
    rows = []
    for bm, bn, bk, st, w in configs:
        for ax in ("m", "n"):
            rows += _mn_rows(shapes, range(16, 2049, 16), ax, block_m=bm, block_n=bn,
                             block_k=bk, num_stages=st, num_warps=w, split_k=1)
    t = pl.DataFrame(rows)
    t = t.with_columns(evaluate_table(t.drop("axis"), hw)["latency_us"])
    return pl.concat([_falls(t.filter(pl.col("axis") == ax),
                             [*CONFIG_KEYS, "m" if ax == "n" else "n", "k"], ax, tol)
                      .select(["axis", *CONFIG_KEYS, "m", "n", "k", "latency_us", "next_size",
                               "next_us"])
                      for ax in ("m", "n")])


def _report(line: str, *frames) -> int:
    """Print a sweep's summary line and the frames of its falls; their count."""
    print(line)
    for frame in frames:
        if len(frame):
            print(frame)
    return sum(len(f) for f in frames)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hw", default="a100,h100,h200", help="GPUs, comma-separated")
    ap.add_argument("--tol", type=float, default=1e-3, help="relative fall left out")
    ap.add_argument("--gate-mn", action="store_true",
                    help="count the m / n sweeps' falls in the exit status too")
    args = ap.parse_args(argv)
    found = 0
    mn_found = 0
    with pl.Config(tbl_rows=12, tbl_cols=-1, tbl_width_chars=160):
        for hw in args.hw.split(","):
            sms = get_hw(hw).sm_count
            g = grid_falls(hw, sms, args.tol)
            k = k_falls(hw, args.tol)
            found += _report(f"{hw}: grid sweep {len(g)} fall(s); library K sweep {len(k)} fall(s) "
                             "(aligned k against k + 1 and k + 8)", g, k)
            lib = library_mn_falls(hw, args.tol)
            tri = triton_mn_falls(hw, args.tol)
            mn_found += _report(f"{hw}: library m / n sweep {len(lib)} fall(s); Triton m / n sweep "
                                f"{len(tri)} fall(s) (one configuration, steps of 16)", lib, tri)
    if args.gate_mn:
        found += mn_found
    elif mn_found:
        print(f"(m / n sweeps: {mn_found} fall(s), not counted: a grid that gains a tile row "
              "and with it L2 reuse; docs/gemm_accuracy.md, 'Library calls grown in m and n, "
              "session 5'; --gate-mn counts them)")
    print("monotone" if found == 0 else f"{found} fall(s) beyond {args.tol:g}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
