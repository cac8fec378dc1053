"""One-stage loops and BK 16 tiles across the measured files: which term sets them.

    python bench/stage_bk_rows.py [FILE ...] [--dtypes float16,bfloat16] [--min-waves 8]

Issue 35 (docs/gemm_accuracy.md, "One-stage loops and BK 16, session 13").
Every Triton row of each measured GEMM file (the defaults of
``bench/latency_bound_rows.py``: the A100 and H100 files of ``../shared/data/gemm``
and this tree's H200 ``gemm.parquet`` files), medians of repeats, is predicted
with :func:`tsbatch.engine.evaluate.evaluate` on the file's GPU; the inputs the
evaluator hands to the envelope are captured, and each row's full-wave steady
iteration is taken apart (:func:`steady_terms`, the terms of
``tsbatch.kernels.envelope.envelope_one``): the busiest compute resource ``c0``,
the compute bound ``comp`` (``c0`` plus the loop's bookkeeping ``ovh_iter``, at
least ``(comp + sync) / p``), the memory time ``mem``, the latency bound ``lb``
(``(L + mem) / (p (stages - 1))``, or ``(L + mem + comp) / p`` without prefetch)
and which of them is largest (``setter``; on the FMA path, whose rows carry an
iteration chain, the bookkeeping is a segment of that chain instead). Tables: median measured / predicted
and MAPE by GPU, one stage or more, BK 16 or more; and for the rows of at least
``--min-waves`` waves (a steady loop), per GPU, configuration and setter, the
measured time of one iteration on the busiest SM (``(measured - launch) /
(tiles / SMs x K steps)``) against the model's, and the bookkeeping and latency
that measured iteration implies (``(measured - c0) / ovh_iter``; ``p x
measured - mem``).

Nothing is fitted or written; it prints.
"""

from __future__ import annotations

import argparse
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import polars as pl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from latency_bound_rows import CONFIG, load_rows, measured_triton, with_shape  # noqa: E402


def steady_terms(work_iter, rate, p, sms, stages, warps, warps_full, lat, ovh, sync,
                 share_eff=1.0, chain=0.0, streams=1.0):
    """Per row, the full-wave steady iteration's terms of ``envelope_one`` (all SMs
    active, no L1.5 share, no exposed copy): ``(c0, comp, mem, lb)`` as arrays.
    Where a row has a ``chain`` (the FMA path's iteration chain) the bookkeeping is
    a segment of it, ``(chain + ovh) / (p streams)``, not work on ``c0``."""
    from tsbatch.kernels.envelope import COMPUTE, SHARED, R_TC

    p = np.asarray(p, dtype=np.float64)
    f = p * np.asarray(warps, dtype=np.float64) / np.asarray(warps_full, dtype=np.float64)
    shared_units = f > 1.0
    f = np.minimum(f, 1.0)
    rr = np.where(SHARED[None, :] == 1, rate / sms, rate)
    rr = rr * np.where(COMPUTE[None, :] == 1, f[:, None], 1.0)
    rr[:, R_TC] *= np.where(shared_units, share_eff, 1.0)
    return _terms(work_iter, rr, p, stages, lat, ovh, sync, COMPUTE, chain, streams)


def _terms(work_iter, rr, p, stages, lat, ovh, sync, compute, chain, streams):
    t = np.where(rr > 0.0, work_iter / np.where(rr > 0.0, rr, 1.0), 0.0)
    is_c = compute[None, :] == 1
    c0 = np.where(is_c, t, 0.0).max(axis=1)
    mem = np.where(is_c, 0.0, t).max(axis=1)
    comp = np.where(chain > 0.0, c0, c0 + ovh)
    with np.errstate(divide="ignore", invalid="ignore"):
        comp = np.where(sync > 0.0, np.maximum(comp, (comp + sync) / np.maximum(p, 1.0)), comp)
        comp = np.where(chain > 0.0,
                        np.maximum(comp, (chain + ovh) / np.maximum(p * streams, 1e-300)), comp)
        d = p * (np.asarray(stages, dtype=np.float64) - 1.0)
        lb = np.where(d > 0, (lat + mem) / np.where(d > 0, d, 1.0),
                      (lat + mem + comp) / np.maximum(p, 1.0))
    return c0, comp, mem, lb


def _or(v, default):
    return default if v is None else v


@contextmanager
def _captured():
    """The envelope inputs of the next :func:`evaluate` calls (positional, keywords)."""
    import tsbatch.engine.evaluate as ev

    calls = []
    orig = ev.evaluate_envelopes

    def hook(*a, **k):
        calls.append((a, k))
        return orig(*a, **k)

    ev.evaluate_envelopes = hook
    try:
        yield calls
    finally:
        ev.evaluate_envelopes = orig


def predicted_terms(path: Path, dtypes: tuple[str, ...]) -> pl.DataFrame:
    """The file's Triton rows of ``dtypes`` (``meas``: median of repeats, us), with
    ``evaluate``'s columns, ``gpu``, ``sms``, ``tiles``, ``ksteps`` and the steady
    terms ``c0``, ``comp``, ``mem``, ``lb``, ``ovh``, ``lat`` and ``setter``."""
    from tsbatch.engine.evaluate import evaluate, resolve_hw

    gpu, d = measured_triton(path, dtypes)
    if d.is_empty():
        return pl.DataFrame()
    spec = resolve_hw(gpu)
    with _captured() as calls:
        r = evaluate(d.select(list(CONFIG)), spec, chunk_rows=0)
    (a, k), = calls
    work_iter, rate, sms, p, stages, warps, wf, lat, ovh = (
        a[0], a[2], a[4], a[5], a[7], a[8], a[9], a[10], a[11])
    chain = _or(k.get("chain"), 0.0)
    c0, comp, mem, lb = steady_terms(work_iter, rate, p, sms, stages, warps, wf, lat, ovh,
                                     _or(k.get("sync"), 0.0), _or(k.get("share_eff"), 1.0),
                                     chain, _or(k.get("streams"), 1.0))
    r = r.with_columns(meas=d["meas"], gpu=pl.lit(gpu), sms=pl.lit(spec.sm_count),
                       c0=c0, comp=comp, mem=mem, lb=lb, ovh=ovh, lat=lat,
                       chain=np.broadcast_to(chain, c0.shape))
    r = r.with_columns(setter=pl.when(pl.col("lb") >= pl.max_horizontal("comp", "mem"))
                       .then(pl.lit("latency bound"))
                       .when((pl.col("comp") >= pl.col("mem")) & (pl.col("chain") > 0.0))
                       .then(pl.lit("compute (chain)"))
                       .when(pl.col("comp") >= pl.col("mem")).then(pl.lit("compute + ovh"))
                       .otherwise(pl.lit("memory")))
    return with_shape(r.filter(pl.col("feasible")))


def shape_table(d: pl.DataFrame) -> pl.DataFrame:
    """By GPU, one stage or more, BK 16 or more: rows, problems, median measured /
    predicted, MAPE (%)."""
    return d.with_columns(one_stage=pl.col("num_stages") == 1, bk16=pl.col("block_k") == 16).group_by(
        ["gpu", "one_stage", "bk16"]).agg(
        rows=pl.len(), problems=pl.struct("m", "n", "k").n_unique(),
        meas_over_pred=(pl.col("meas") / pl.col("latency_us")).median(),
        mape=((pl.col("latency_us") / pl.col("meas") - 1.0).abs().mean() * 100.0),
    ).sort(["gpu", "one_stage", "bk16"])


def steady_table(d: pl.DataFrame, min_waves: float, min_rows: int = 8) -> pl.DataFrame:
    """BK 16 rows of at least ``min_waves`` waves, per GPU, configuration and setter:
    median measured / predicted, the iteration (us, busiest SM) measured and
    predicted, its terms, and the bookkeeping (in units of ``ovh_iter``) and
    latency (us) the measured iteration implies."""
    it = pl.col("tiles") / pl.col("sms") * pl.col("ksteps")
    e = d.filter((pl.col("block_k") == 16) & (pl.col("waves") >= min_waves)).with_columns(
        cfg=pl.format("{}x{}x{}/{}/{}", "block_m", "block_n", "block_k", "num_stages", "num_warps"),
        meas_it=(pl.col("meas") - pl.col("t_launch_us")) / it)
    return e.group_by(["gpu", "cfg", "setter"]).agg(
        rows=pl.len(), problems=pl.struct("m", "n", "k").n_unique(),
        p=pl.col("resident_tiles").median(),
        meas_over_pred=(pl.col("meas") / pl.col("latency_us")).median(),
        it_meas=pl.col("meas_it").median(), it_model=pl.col("t_steady_iter_us").median(),
        c0=pl.col("c0").median(), comp=pl.col("comp").median(), lb=pl.col("lb").median(),
        ovh_implied=((pl.col("meas_it") - pl.col("c0")) / pl.col("ovh")).median(),
        lat_implied=(pl.col("meas_it") * pl.col("resident_tiles") - pl.col("mem")).median(),
        l2_hit=pl.col("l2_hit").median(),
    ).filter(pl.col("rows") >= min_rows).sort(["gpu", "cfg", "setter"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="*", type=Path)
    ap.add_argument("--dtypes", default="float16,bfloat16")
    ap.add_argument("--min-waves", type=float, default=8.0)
    args = ap.parse_args(argv)
    dtypes = tuple(args.dtypes.split(","))
    rows = load_rows(predicted_terms, args.files, dtypes)
    if rows is None:
        print("no rows")
        return 0
    with pl.Config(tbl_rows=300, tbl_cols=30, tbl_width_chars=250, float_precision=3):
        print(f"every Triton row ({', '.join(dtypes)})")
        print(shape_table(rows))
        print(f"BK 16, >= {args.min_waves:g} waves: the steady iteration's terms")
        print(steady_table(rows, args.min_waves))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
