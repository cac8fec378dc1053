"""One layer's ops measured on a GPU against tsbatch's predictions of the same ops.

    python bench/layer_ops.py LAYER.parquet [--hw NAME] [--engine vllm|tuned] [--csv OUT.csv]
    python bench/layer_ops.py --spec bench/device/layer.toml --hw h100_sxm   # predictions alone

LAYER.parquet is what ``tsbatch measure --only layer`` writes
(:func:`tsbatch.measured.layer.run_layer_part`; schema
:data:`tsbatch.measured.layer.LAYER_SCHEMA`). Each point's ops are lowered by
``tsbatch/serving/ops.py`` for the file's GPU (or ``--hw``) and model, and each op's
family evaluated as ``tsbatch serve`` does (:func:`tsbatch.measured.layer.predict_layer`).

Prints, per phase and point: each op's measured time (median CUDA-event time per call),
its kernels' device time and count (torch.profiler), the predicted kernel time
(``t_kernel_us``: what an op timed on its own compares with), measured / predicted, the
op as the serving model composes it into a step (body + the engine's per-op gap), and
the layer: the sum of the ops, the layer back to back and replayed from a CUDA graph
against the sums of the predictions. Then the median measured / predicted per op and
per family, per phase. Prefill attention on Hopper: the serving model predicts FA-3
(``attention_fa3``) where PyTorch's flash backend runs FA-2; the FA-2 family's
prediction is printed beside it (``fa2_us``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tsbatch.errors import InputError  # noqa: E402
from tsbatch.measured.layer import (LAYER_OPS, LayerSpec, layer_frame, layer_ops,  # noqa: E402
                                    load_layer_spec, predict_layer, spec_points)

c = pl.col


def _f(v, fmt="{:.1f}", none="-"):
    return none if v is None else fmt.format(v)


def _point_label(r: dict) -> str:
    if r["phase"] == "prefill":
        return f"prefill {r['point']}: {r['reqs']} x {r['seq']} tokens (m {r['m']})"
    return f"decode {r['point']}: batch {r['reqs']}, ctx {r['ctx']}"


def report(pred: pl.DataFrame) -> str:
    """The text report of :func:`predict_layer`'s frame."""
    out = []
    order = {o: i for i, o in enumerate((*LAYER_OPS, "layer", "layer_graph"))}
    pred = pred.with_columns(c("op").replace_strict(order, default=len(order)).alias("_o"))
    for (gpu, model, dtype, tp), sub in pred.group_by(["gpu", "model", "dtype", "tp"],
                                                      maintain_order=True):
        out.append(f"{model}, one layer, {dtype}, tp {tp} (one GPU's shard), on {gpu}")
        for phase in ("prefill", "decode"):
            ph = sub.filter(c("phase") == phase)
            for (point,), pt in ph.group_by(["point"], maintain_order=True):
                pt = pt.sort("_o")
                first = pt.row(0, named=True)
                out.append("")
                out.append(_point_label(first))
                out.append(f"  {'op':16s} {'family':15s} {'meas_us':>9s} {'kern_us':>9s} "
                           f"{'kernels':>7s} {'pred_us':>9s} {'meas/pred':>9s} "
                           f"{'step_us':>9s} {'fa2_us':>8s}  config")
                ops = pt.filter(~c("op").is_in(["layer", "layer_graph"]))
                for r in ops.iter_rows(named=True):
                    out.append(
                        f"  {r['op']:16s} {(r['pred_family'] or r['family'] or '-'):15s} "
                        f"{_f(None if r['time_ms'] is None else r['time_ms'] * 1e3):>9s} "
                        f"{_f(None if r['kernel_ms'] is None else r['kernel_ms'] * 1e3):>9s} "
                        f"{_f(r['kernels'], '{:d}'):>7s} {_f(r['pred_us']):>9s} "
                        f"{_f(r['ratio'], '{:.3f}'):>9s} {_f(r['pred_step_us']):>9s} "
                        f"{_f(r['pred_alt_us']):>8s}  {r['pred_config'] or ''}")
                s_meas = ops["time_ms"].sum() * 1e3 if ops["time_ms"].null_count() == 0 else None
                s_pred = ops["pred_us"].sum()
                s_step = ops["pred_step_us"].sum()
                out.append(f"  {'sum of the ops':32s} {_f(s_meas):>9s} {'':>9s} {'':>7s} "
                           f"{s_pred:9.1f} "
                           f"{_f(s_meas / s_pred if s_pred and s_meas else None, '{:.3f}'):>9s}"
                           f" {s_step:9.1f}")
                for r in pt.filter(c("op").is_in(["layer", "layer_graph"])).iter_rows(named=True):
                    what = "layer, back to back" if r["op"] == "layer" else "layer, CUDA graph"
                    t = None if r["time_ms"] is None else r["time_ms"] * 1e3
                    out.append(f"  {what:32s} {_f(t):>9s} {'':>9s} {'':>7s} "
                               f"{_f(r['pred_us']):>9s} {_f(r['ratio'], '{:.3f}'):>9s} "
                               f"{_f(r['pred_step_us']):>9s}")
        ops = sub.filter(~c("op").is_in(["layer", "layer_graph"]) & c("ratio").is_not_null())
        out.append("")
        if ops.height == 0:
            out.append("(no measured times: the predictions alone)")
            out.append("")
            continue
        out.append("median measured / predicted (meas_us / pred_us), over the points:")
        out.append(f"  {'':16s} {'prefill':>8s} {'decode':>8s} {'all':>8s}  points")
        for key, label in (("op", "per op"), ("pred_family", "per family")):
            out.append(f" {label}:")
            rows = ops.group_by(key).agg(
                c("ratio").filter(c("phase") == "prefill").median().alias("prefill"),
                c("ratio").filter(c("phase") == "decode").median().alias("decode"),
                c("ratio").median().alias("all"), pl.len().alias("n"),
                c("_o").min().alias("_o")).sort("_o", key)
            for r in rows.iter_rows(named=True):
                out.append(f"  {r[key]:16s} {_f(r['prefill'], '{:.3f}'):>8s} "
                           f"{_f(r['decode'], '{:.3f}'):>8s} {_f(r['all'], '{:.3f}'):>8s}  "
                           f"{r['n']}")
        lay = sub.filter(c("op").is_in(["layer", "layer_graph"]) & c("ratio").is_not_null())
        if lay.height:
            out.append(" the layer (measured / the sum of the predicted ops):")
        for op in ("layer", "layer_graph"):
            x = lay.filter(c("op") == op)
            if x.height:
                out.append(f"  {op:16s} "
                           + " ".join(f"{_f(x.filter(c('phase') == p)['ratio'].median(), '{:.3f}'):>8s}"
                                      for p in ("prefill", "decode"))
                           + f" {_f(x['ratio'].median(), '{:.3f}'):>8s}  {x.height}")
        out.append("")
    return "\n".join(out)


def spec_frame(spec: LayerSpec, gpu: str) -> pl.DataFrame:
    """A layer frame of the spec's ops with no measured times (``--spec``: the
    predictions alone, before a device run)."""
    from tsbatch.hw import UnknownHardwareError, get_hw

    try:
        hopper = get_hw(gpu).arch == "hopper"
    except UnknownHardwareError as exc:
        raise InputError(f"--hw: {exc.args[0]}") from None
    recs = []
    base = {"gpu": gpu, "model": spec.model, "dtype": spec.dtype, "tp": spec.tp}
    for pt in spec_points(spec):
        recs += [{**base, **pt, **row} for row in layer_ops(spec.config, pt, spec.tp, hopper)]
        recs += [{**base, **pt, "op": op, "family": "layer"} for op in ("layer", "layer_graph")]
    return layer_frame(recs)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("layer", nargs="?", default=None,
                    help="layer.parquet written by tsbatch measure --only layer")
    ap.add_argument("--hw", default=None,
                    help="GPU to predict for (default: the file's gpu column)")
    ap.add_argument("--spec", default=None, metavar="LAYER.toml",
                    help="instead of a measured file: the predictions alone for a layer spec "
                         "(bench/device/layer.toml) on --hw")
    ap.add_argument("--engine", default="vllm", help="engine profile (vllm: library GEMMs)")
    ap.add_argument("--csv", default=None, help="also write the joined rows to this CSV")
    args = ap.parse_args(argv)
    if (args.layer is None) == (args.spec is None):
        print("error: give a measured LAYER.parquet or --spec LAYER.toml (one of them)",
              file=sys.stderr)
        return 2
    try:
        if args.spec is not None:
            if args.hw is None:
                raise InputError("--spec needs --hw NAME (the GPU to predict for)")
            frame = spec_frame(load_layer_spec(args.spec), args.hw)
        else:
            try:
                frame = pl.read_parquet(args.layer)
            except (OSError, pl.exceptions.PolarsError) as exc:
                raise InputError(f"{args.layer}: cannot read ({exc})") from None
        pred = predict_layer(frame, args.hw, args.engine)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(report(pred))
    if args.csv:
        pred.drop("kernel_names").write_csv(args.csv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
