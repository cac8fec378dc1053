"""One transformer layer's prefill and decode ops, each timed on its own on a CUDA GPU.

The end-to-end model (:mod:`tsbatch.serving`: ``tsbatch serve``, ``ops.py``'s op list,
``bench/e2e_accuracy.py``) is checked against whole vLLM steps only. This part of
``tsbatch measure`` times the ops of ONE layer of a dense (non-MLA, non-MoE) model with
random weights, one op at a time, at a few prefill and decode points, so that the
serving model can be checked op by op (``bench/layer_ops.py LAYER.parquet``).

The ops are :mod:`tsbatch.serving.ops`' layer ops of a dense model, by the same names
and shapes (:func:`layer_ops`; ``tests/test_layer_measure.py`` checks them against
``ops.lower_ops`` for the same model and points), run as a vLLM-like engine runs them:

===============  ================================================================
op               what runs (one GPU's shard at ``tp``; no all-reduce)
===============  ================================================================
input_norm       fused add + RMSNorm, in place (Triton, one kernel: vLLM's
                 ``fused_add_rms_norm``)
qkv_proj         ``torch.nn.functional.linear`` (cuBLAS; ``x @ W.T``, W ``(n, k)``)
qk_norm          (QK-norm models) RMSNorm over each q and k head (Triton, one kernel)
rope             NeoX rotary embedding in place on the q and k heads (Triton, one
                 kernel: vLLM's ``rotary_embedding``)
kv_cache_write   each token's k and v into its cache slot (Triton, one kernel: vLLM's
                 ``reshape_and_cache_flash``)
attention        prefill: causal ``scaled_dot_product_attention`` over each prompt
                 (flash backend; PyTorch's FlashAttention-2, also on Hopper, where
                 the serving model predicts FA-3); decode: one query token per
                 sequence over a contiguous KV cache of ``ctx`` tokens (flash backend,
                 split-KV as PyTorch's flash API picks it; vLLM reads a paged cache)
o_proj           ``linear``
post_attn_norm   fused add + RMSNorm (as input_norm)
gate_up_proj     ``linear``
silu_mul         SiLU-and-mul (Triton, one kernel: vLLM's ``silu_and_mul``)
down_proj        ``linear``
===============  ================================================================

What each row records: the CUDA-event time per call (``time_ms``: the median of the
timed calls, queued behind a GPU sleep so that the host runs ahead and the time is the
device's, launch gaps between back-to-back calls included) and, from
``torch.profiler``, the device activities one call runs (``kernels``, their names
``kernel_names`` and summed device time ``kernel_ms``), so that an op that is not one
kernel says so. Plus, per point, the whole layer run back to back (``op = 'layer'``)
and replayed from a CUDA graph (``op = 'layer_graph'``, as vLLM's decode runs).

The L2 is NOT flushed between calls: in a real step the activations an op reads were
just written by the op before it and are hot. The state that is per layer in a real
model and so cold when a layer runs (the weights, the KV cache) is read cold: where one
copy is smaller than twice the L2, the timed calls cycle through enough copies of it
(``ceil(2 L2 / bytes)``, at most 32) that each call reads its copy from DRAM. Most
weights are larger than the L2 anyway (one copy).

Everything but :func:`run_layer` / :func:`run_layer_part` is pure (no torch): the spec
(:class:`LayerSpec`, :func:`load_layer_spec`, :func:`default_spec`), the op list and
shapes (:func:`layer_ops`), the frame (:func:`layer_frame`, :data:`LAYER_SCHEMA`) and
the predictions for a measured frame (:func:`predict_layer`).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

from tsbatch.errors import InputError

__all__ = ["LayerSpec", "default_spec", "load_layer_spec", "spec_points", "layer_ops",
           "LAYER_OPS", "LAYER_SCHEMA", "layer_frame", "lowering_points", "lowered_layer",
           "predict_layer", "run_layer", "run_layer_part", "reference_ops", "DEFAULT_MODEL"]

DEFAULT_MODEL = "meta-llama/Meta-Llama-3-8B"
DTYPES = ("bfloat16", "float16")
#: at most this many copies of a weight / KV cache are cycled through (see the module doc)
MAX_COPIES = 32
#: the ops of one dense layer, in the order :mod:`tsbatch.serving.ops` lists them
LAYER_OPS = ("input_norm", "qkv_proj", "qk_norm", "rope", "kv_cache_write", "attention",
             "o_proj", "post_attn_norm", "gate_up_proj", "silu_mul", "down_proj")


# ============================================================================ the spec
@dataclasses.dataclass(frozen=True)
class LayerSpec:
    """What to measure: one layer of ``model`` at ``tp`` (one GPU's shard), in ``dtype``,
    at prefill points ``(sequences, prompt_len)`` (one step of ``sequences x prompt_len``
    tokens, whole prompts) and decode points ``(batch, ctx)`` (one new token per sequence
    over ``ctx`` cached tokens)."""

    model: str = DEFAULT_MODEL
    dtype: str = "bfloat16"
    tp: int = 1
    prefill: tuple[tuple[int, int], ...] = ((1, 2048), (8, 512))
    decode: tuple[tuple[int, int], ...] = tuple(
        (b, c) for c in (1024, 4096) for b in (1, 8, 32, 128))
    target_ms: float = 20.0      #: device time the timed calls of one op fill
    max_repeats: int = 100       #: timed calls of one op at most
    profile: bool = True         #: count each op's kernels with torch.profiler
    graph: bool = True           #: time the layer replayed from a CUDA graph too
    time_budget_s: float = 150.0  #: no new point starts after this many seconds (0: no limit)
    name: str = "default"

    @property
    def config(self):
        from tsbatch.serving.models import load_model

        return load_model(self.model)


def default_spec() -> LayerSpec:
    """The built-in spec (that of ``bench/device/layer.toml``): a Llama-3-8B layer in bf16,
    prefill 1 x 2048 and 8 x 512 tokens, decode batch 1, 8, 32, 128 at ctx 1024 and 4096."""
    spec = LayerSpec()
    _check_model(spec, "default spec")
    return spec


_SPEC_KEYS = {"model", "dtype", "tp", "prefill", "decode", "target_ms", "max_repeats",
              "profile", "graph", "time_budget_s"}


def _pos_int(where, what, v) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise InputError(f"{where}: {what} must be a positive integer, got {v!r}")
    return v


def _pairs(where, doc, key, names) -> tuple[tuple[int, int], ...]:
    v = doc.get(key, [])
    if not isinstance(v, list):
        raise InputError(f"{where}: '{key}' must be a list of [{names[0]}, {names[1]}] pairs, "
                         f"got {v!r}")
    out = []
    for i, p in enumerate(v):
        if not isinstance(p, list) or len(p) != 2:
            raise InputError(f"{where}: {key}[{i}] must be [{names[0]}, {names[1]}], got {p!r}")
        out.append((_pos_int(where, f"{key}[{i}] {names[0]}", p[0]),
                    _pos_int(where, f"{key}[{i}] {names[1]}", p[1])))
    return tuple(out)


def _check_model(spec: LayerSpec, where: str) -> None:
    try:
        cfg = spec.config
    except InputError as exc:
        raise InputError(f"{where}: model = {spec.model!r}: {exc}") from None
    if cfg.kind != "dense" or cfg.experts:
        raise InputError(f"{where}: model = {spec.model!r} is a {cfg.kind} model; the layer "
                         f"part measures dense (non-MoE, non-MLA) layers only")
    if cfg.heads % spec.tp:
        raise InputError(f"{where}: tp = {spec.tp}: the {cfg.heads} attention heads of "
                         f"{spec.model} are not divisible by it")
    longest = max([s for _, s in spec.prefill] + [c for _, c in spec.decode] + [0])
    if cfg.sliding_window and cfg.sliding_window < longest:
        raise InputError(f"{where}: model = {spec.model!r} attends over a sliding window of "
                         f"{cfg.sliding_window} tokens, shorter than a point's {longest}; "
                         f"the layer part times full attention only")


def load_layer_spec(path: str | Path) -> LayerSpec:
    """Read a layer spec TOML file (``bench/device/layer.toml``)::

        model = "meta-llama/Meta-Llama-3-8B"  # a name load_model takes (or a config.json)
        dtype = "bfloat16"                    # or "float16"; default bfloat16
        tp = 1                                # one GPU's shard of a TP layer; default 1
        prefill = [[1, 2048], [8, 512]]       # [sequences, prompt_len]
        decode = [[1, 1024], [32, 4096]]      # [batch, ctx]
        target_ms = 20.0                      # optional timing knobs
        max_repeats = 100
        profile = true
        graph = true
        time_budget_s = 150                   # 0: no limit; default 150

    At least one prefill or decode point. Every problem is one :class:`InputError`
    naming the file, the key and the value.
    """
    from tsbatch.measured.measure import _read_toml

    path = Path(path)
    where = str(path)
    doc = _read_toml(path, "the layer spec", _SPEC_KEYS)
    kw: dict = {"name": where}
    model = doc.get("model", DEFAULT_MODEL)
    if not isinstance(model, str) or not model:
        raise InputError(f"{where}: model must be a model name or a config.json path, "
                         f"got {model!r}")
    kw["model"] = model
    dtype = doc.get("dtype", "bfloat16")
    aliases = {"bf16": "bfloat16", "fp16": "float16", "half": "float16"}
    dtype = aliases.get(str(dtype).lower(), str(dtype).lower()) if isinstance(dtype, str) \
        else dtype
    if dtype not in DTYPES:
        raise InputError(f"{where}: dtype = {doc.get('dtype')!r}: use one of {', '.join(DTYPES)}")
    kw["dtype"] = dtype
    kw["tp"] = _pos_int(where, "tp", doc.get("tp", 1))
    kw["prefill"] = _pairs(where, doc, "prefill", ("sequences", "prompt_len"))
    kw["decode"] = _pairs(where, doc, "decode", ("batch", "ctx"))
    if not kw["prefill"] and not kw["decode"]:
        raise InputError(f"{where}: give at least one point: prefill = [[sequences, "
                         f"prompt_len], ...] or decode = [[batch, ctx], ...]")
    for key in ("target_ms", "time_budget_s"):
        if key in doc:
            v = doc[key]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 \
                    or (key == "target_ms" and v == 0) or not math.isfinite(v):
                raise InputError(f"{where}: {key} must be a positive number"
                                 f"{' or 0' if key == 'time_budget_s' else ''}, got {v!r}")
            kw[key] = float(v)
    if "max_repeats" in doc:
        kw["max_repeats"] = _pos_int(where, "max_repeats", doc["max_repeats"])
    for key in ("profile", "graph"):
        if key in doc:
            if not isinstance(doc[key], bool):
                raise InputError(f"{where}: {key} must be true or false, got {doc[key]!r}")
            kw[key] = doc[key]
    spec = LayerSpec(**kw)
    _check_model(spec, where)
    return spec


def spec_points(spec: LayerSpec) -> list[dict]:
    """The points of a spec: ``phase, point`` (index within the phase), ``m`` (tokens of
    the step: sequences x prompt_len, or the decode batch), ``reqs`` (sequences),
    ``seq`` (prompt length; 0 in decode), ``ctx`` (cached tokens; 0 in prefill)."""
    pts = [{"phase": "prefill", "point": i, "m": n * s, "reqs": n, "seq": s, "ctx": 0}
           for i, (n, s) in enumerate(spec.prefill)]
    pts += [{"phase": "decode", "point": i, "m": b, "reqs": b, "seq": 0, "ctx": c}
            for i, (b, c) in enumerate(spec.decode)]
    return pts


# ============================================================================ ops and shapes
def _dims(cfg, tp: int) -> dict:
    """One GPU's shard (as ops.py: heads / tp, kv heads / tp at least 1, FFN ceil(/ tp))."""
    return {"h": cfg.hidden, "hq": cfg.heads // tp, "hkv": max(1, cfg.kv_heads // tp),
            "hd": cfg.head_dim, "inter": -(-cfg.intermediate // tp)}


def layer_ops(cfg, pt: dict, tp: int = 1, hopper: bool = False) -> list[dict]:
    """The ops of one dense layer at point ``pt`` (:func:`spec_points`), in order: ``op``,
    ``family`` (as :mod:`tsbatch.serving.ops` names it; prefill attention is
    ``attention_fa3`` on Hopper, ``attention`` elsewhere), ``impl`` (what this part runs)
    and the family's shape columns: GEMMs ``n, k`` (their ``m`` is the point's ``m``);
    rowwise ``row_op, rows, hidden, residual``; attention ``batch, heads, kv_heads,
    head_dim`` and ``seq_len, causal`` (prefill) or ``seq_len_kv`` (decode)."""
    d = _dims(cfg, tp)
    h, hq, hkv, hd, inter = d["h"], d["hq"], d["hkv"], d["hd"], d["inter"]
    m = pt["m"]

    def gemm(op, n, k):
        return {"op": op, "family": "gemm", "impl": "torch linear (cuBLAS)", "n": n, "k": k}

    def row(op, kind, rows, hidden, residual=False, impl=""):
        return {"op": op, "family": "rowwise", "impl": impl, "row_op": kind, "rows": rows,
                "hidden": hidden, "residual": residual}

    ops = [row("input_norm", "rmsnorm", m, h, True, "triton fused add + rmsnorm"),
           gemm("qkv_proj", (hq + 2 * hkv) * hd, h)]
    if cfg.qk_norm:
        ops.append(row("qk_norm", "rmsnorm", m * (hq + hkv), hd, False, "triton rmsnorm"))
    ops += [row("rope", "silu_mul", m, -(-(2 * (hq + hkv) * hd) // 3), False,
                "triton rope (neox, in place)"),
            row("kv_cache_write", "rmsnorm", m, 2 * hkv * hd, False, "triton kv cache write")]
    if pt["phase"] == "prefill":
        ops.append({"op": "attention", "family": "attention_fa3" if hopper else "attention",
                    "impl": "torch sdpa causal", "batch": pt["reqs"], "heads": hq,
                    "kv_heads": hkv, "seq_len": pt["seq"], "head_dim": hd, "causal": True})
    else:
        ops.append({"op": "attention", "family": "flash_decoding", "impl": "torch sdpa decode",
                    "batch": pt["reqs"], "heads": hq, "kv_heads": hkv, "seq_len_kv": pt["ctx"],
                    "head_dim": hd})
    ops += [gemm("o_proj", h, hq * cfg.v_head_dim),
            row("post_attn_norm", "rmsnorm", m, h, True, "triton fused add + rmsnorm"),
            gemm("gate_up_proj", 2 * inter, h),
            row("silu_mul", "silu_mul", m, inter, False, "triton silu_and_mul"),
            gemm("down_proj", h, inter)]
    return ops


# ============================================================================ the frame
#: column -> (polars type name, meaning) of layer.parquet
LAYER_SCHEMA = {
    "gpu": ("String", "hw key of the device (tsbatch.measured.measure.gpu_key)"),
    "model": ("String", "the spec's model name"),
    "dtype": ("String", "activations and weights: bfloat16 or float16"),
    "tp": ("Int64", "the TP degree whose one-GPU shard was run (no all-reduce)"),
    "phase": ("String", "prefill or decode"),
    "point": ("Int64", "index of the point within its phase (the spec's order)"),
    "m": ("Int64", "tokens of the step (sequences x prompt_len; the decode batch); every "
                   "GEMM's m"),
    "reqs": ("Int64", "sequences of the step"),
    "seq": ("Int64", "prompt length (prefill; 0 in decode)"),
    "ctx": ("Int64", "cached tokens each sequence attends over (decode; 0 in prefill)"),
    "op": ("String", "op name as tsbatch/serving/ops.py names it; 'layer' (all ops back to "
                     "back) and 'layer_graph' (replayed from a CUDA graph) per point"),
    "family": ("String", "kernel family as ops.py lowers the op; 'layer' for the layer rows"),
    "impl": ("String", "what ran (torch linear, a Triton kernel, sdpa and its backend)"),
    "n": ("Int64", "GEMM n (W is (n, k))"),
    "k": ("Int64", "GEMM k"),
    "row_op": ("String", "rowwise family op the row stands for (rmsnorm, silu_mul)"),
    "rows": ("Int64", "rowwise rows"),
    "hidden": ("Int64", "rowwise row width (elements)"),
    "residual": ("Boolean", "rowwise: with a residual add"),
    "batch": ("Int64", "attention sequences"),
    "heads": ("Int64", "attention query heads (this GPU's)"),
    "kv_heads": ("Int64", "attention KV heads (this GPU's)"),
    "seq_len": ("Int64", "prefill attention: tokens per sequence"),
    "seq_len_kv": ("Int64", "decode attention: cached tokens per sequence"),
    "head_dim": ("Int64", "attention head dim"),
    "causal": ("Boolean", "prefill attention: causal"),
    "time_ms": ("Float64", "median CUDA-event time of one call (device time, back to back)"),
    "time_ms_min": ("Float64", "fastest timed call"),
    "repeats": ("Int64", "timed calls"),
    "copies": ("Int64", "copies of the weights / KV cache the timed calls cycle through"),
    "kernels": ("Int64", "device activities (kernels, memsets, copies) one call runs "
                         "(torch.profiler; null when not profiled)"),
    "kernel_names": ("String", "their names in launch order, ' | '-separated"),
    "kernel_ms": ("Float64", "their summed device time per call (profiler)"),
}


def _pl_type(pl, name: str):
    return getattr(pl, name)


def layer_frame(records: Sequence[dict]):
    """``layer.parquet``'s rows (:data:`LAYER_SCHEMA`, in that column order) from
    :func:`run_layer`'s records; a key a record lacks is null."""
    import polars as pl

    schema = {k: _pl_type(pl, t) for k, (t, _) in LAYER_SCHEMA.items()}
    for i, r in enumerate(records):
        bad = sorted(set(r) - set(schema))
        if bad:
            raise ValueError(f"record {i}: unknown keys {bad}")
        t = r.get("time_ms")
        if t is not None and not (t > 0 and math.isfinite(t)):
            raise ValueError(f"record {i} ({r.get('op')}): time_ms must be positive, got {t!r}")
    cols = {k: [r.get(k) for r in records] for k in schema}
    return pl.DataFrame(cols, schema=schema)


# ============================================================================ predictions
def lowering_points(points: Sequence[dict]):
    """:mod:`tsbatch.serving.ops` points (``dep`` 0) for the layer points: a prefill point
    is a ``tokens`` point of ``m`` tokens and an ``attn`` point over ``reqs`` prompts of
    ``seq``; a decode point is a ``decode`` and a ``decode_attn`` point at ``ctx``."""
    import polars as pl

    rows = []
    for p in points:
        kinds = ("tokens", "attn") if p["phase"] == "prefill" else ("decode", "decode_attn")
        for kind in kinds:
            rows.append({"dep": 0, "phase": p["phase"], "point": p["point"], "kind": kind,
                         "m": p["m"], "reqs": p["reqs"], "seq": p["seq"], "ctx": p["ctx"],
                         "count": 1, "weight": 1.0})
    return pl.DataFrame(rows, schema={"dep": pl.Int64, "phase": pl.String, "point": pl.Int32,
                                      "kind": pl.String, "m": pl.Int64, "reqs": pl.Int64,
                                      "seq": pl.Int64, "ctx": pl.Int64, "count": pl.Int64,
                                      "weight": pl.Float64})


def _layer_dep(model: str, gpu: str, tp: int, engine: str):
    import polars as pl

    from tsbatch.serving.deploy import resolve

    dep = resolve(pl.DataFrame({"model": [model], "system": [gpu], "tp": [tp], "batch": [1],
                                "prompt_len": [1], "output_len": [1], "engine": [engine]}))
    # one layer on one GPU: the whole model's memory, the GPU count of a TP group and the
    # model's context limit do not apply
    return dep.with_columns(pl.lit(True).alias("feasible"), pl.lit("").alias("infeasible_reason"))


def lowered_layer(model: str, gpu: str, points: Sequence[dict], tp: int = 1,
                  engine: str = "vllm") -> dict:
    """``ops.lower_ops`` for the layer points (:func:`spec_points`): per family, the op rows
    of one layer (``part == 'layer'``; no collectives: one GPU's shard)."""
    import polars as pl

    from tsbatch.serving.ops import lower_ops

    fams = lower_ops(_layer_dep(model, gpu, tp, engine), lowering_points(points))
    return {fam: f.filter(pl.col("part") == "layer") for fam, f in fams.items()
            if fam not in ("collective", "custom_ar")}


def predict_layer(frame, hw: str | None = None, engine: str = "vllm"):
    """The measured frame (:func:`layer_frame`) with tsbatch's predictions beside it.

    For each model and ``tp`` of the frame, its points are lowered by
    :mod:`tsbatch.serving.ops` for the GPU (``hw``, else the frame's ``gpu``) and each
    op's family evaluated as ``tsbatch serve`` does (the engine profile's GEMM choice).
    Added columns: ``pred_family``, ``pred_us`` (the family's kernel time,
    ``t_kernel_us``: what an op timed on its own compares with), ``pred_step_us`` (the op
    as a step composes it: the body without the kernel's launch overhead plus the
    engine's gap of the phase), ``pred_config``, ``pred_alt_us`` (prefill attention on
    Hopper: the FA-2 family ``attention`` beside FA-3, since PyTorch's flash backend is
    FA-2), ``ratio`` (``time_ms`` x 1000 / ``pred_us``) and ``kernel_ratio``
    (``kernel_ms`` x 1000 / ``pred_us``). The ``layer`` and ``layer_graph`` rows get the
    sums over their point's ops. A measured op with no lowered op gets nulls.
    """
    import polars as pl

    from tsbatch.serving.ops import FAMILY_KEYS
    from tsbatch.serving.predict import _evaluate_family

    c = pl.col
    if frame.height == 0:
        raise InputError("the layer frame has no rows")
    gpus = frame["gpu"].unique().to_list()
    if hw is None and len(gpus) != 1:
        raise InputError(f"the layer frame holds several GPUs {sorted(gpus)}; name one with "
                         f"--hw")
    gpu = hw or gpus[0]
    preds = []
    for (model, tp), sub in frame.group_by(["model", "tp"], maintain_order=True):
        pts = sub.select("phase", "point", "m", "reqs", "seq", "ctx").unique() \
            .sort("phase", "point").to_dicts()
        per_fam = []
        for fam, f in lowered_layer(model, gpu, pts, int(tp), engine).items():
            kcols = [k for k in FAMILY_KEYS[fam] if k in f.columns]
            best = _evaluate_family(fam, f.select(kcols).unique(), None)
            j = f.join(best, on=kcols, how="left", nulls_equal=True)
            alt = pl.lit(None, pl.Float64)
            if fam == "attention_fa3":
                fa2 = _evaluate_family("attention", f.select(kcols).unique(), None)
                j = j.join(fa2.select(*kcols, c("t_kernel_us").alias("_alt")), on=kcols,
                           how="left", nulls_equal=True)
                alt = c("_alt")
            per_fam.append(j.select(
                "phase", c("point").cast(pl.Int64), c("op_name").alias("op"),
                pl.lit(fam).alias("pred_family"), c("t_kernel_us").alias("pred_us"),
                (pl.max_horizontal(c("t_kernel_us") - c("t_launch_us"), pl.lit(0.0))
                 + c("gap_us")).alias("pred_step_us"),
                c("config").alias("pred_config"), alt.cast(pl.Float64).alias("pred_alt_us"),
                pl.lit(model).alias("model"), pl.lit(int(tp)).cast(pl.Int64).alias("tp")))
        p = pl.concat(per_fam, how="vertical_relaxed")
        tot = p.group_by("model", "tp", "phase", "point").agg(
            c("pred_us").sum(), c("pred_step_us").sum()).with_columns(
            pl.lit("layer").alias("pred_family"),
            pl.lit("sum of the layer's ops").alias("pred_config"),
            pl.lit(None, pl.Float64).alias("pred_alt_us"))
        tot = pl.concat([tot.with_columns(pl.lit(o).alias("op")) for o in ("layer", "layer_graph")])
        preds.append(pl.concat([p, tot.select(p.columns)], how="vertical_relaxed"))
    pred = pl.concat(preds, how="vertical_relaxed")
    out = frame.join(pred, on=["model", "tp", "phase", "point", "op"], how="left")
    return out.with_columns((c("time_ms") * 1e3 / c("pred_us")).alias("ratio"),
                            (c("kernel_ms") * 1e3 / c("pred_us")).alias("kernel_ratio"))


# ============================================================================ running (torch)
def _log(msg: str, quiet: bool) -> None:
    if not quiet:
        print(msg, file=sys.stderr, flush=True)


def _copies(nbytes: int, l2_bytes: int) -> int:
    """Copies to cycle through so that each call reads its copy from DRAM."""
    if nbytes <= 0:
        return 1
    return int(max(1, min(MAX_COPIES, math.ceil(2 * l2_bytes / nbytes))))


def reference_ops(torch):
    """Plain-torch twins of :mod:`tsbatch.measured.layer_kernels` (same signatures, same
    in-place effects; eager, several kernels each): the tests' reference."""

    def add_rmsnorm(x, weight, residual=None, eps=1e-5):
        xf = x.float()
        if residual is not None:
            xf = xf + residual.float()
            residual.copy_(xf.to(residual.dtype))
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
        x.copy_(y.to(x.dtype))

    def silu_mul(x, out):
        d = out.shape[1]
        a, b = x[:, :d].float(), x[:, d:].float()
        out.copy_((torch.nn.functional.silu(a) * b).to(out.dtype))

    def rope(qkv, positions, cos_sin, n_heads, head_dim):
        half = head_dim // 2
        t = qkv.shape[0]
        v = qkv[:, :n_heads * head_dim].view(t, n_heads, head_dim)
        cs = cos_sin[positions.long()].float()
        cos, sin = cs[:, None, :half], cs[:, None, half:]
        x1, x2 = v[..., :half].float(), v[..., half:].float()
        o1, o2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
        v[..., :half] = o1.to(qkv.dtype)
        v[..., half:] = o2.to(qkv.dtype)

    def kv_write(qkv, slots, k_cache, v_cache, q_width, kv_width):
        s = slots.long()
        k_cache[s] = qkv[:, q_width:q_width + kv_width]
        v_cache[s] = qkv[:, q_width + kv_width:q_width + 2 * kv_width]

    import types

    return types.SimpleNamespace(add_rmsnorm=add_rmsnorm, silu_mul=silu_mul, rope=rope,
                                 kv_write=kv_write)


def _rope_cache(torch, positions: int, head_dim: int, device, theta: float = 500000.0):
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device)
                           / head_dim))
    f = torch.outer(torch.arange(positions, dtype=torch.float32, device=device), inv)
    return torch.cat([f.cos(), f.sin()], dim=-1).contiguous()


def _sdpa(torch, q, k, v, causal: bool) -> tuple[Callable, str]:
    """``scaled_dot_product_attention`` with the flash backend (GQA without expanding K/V);
    if that does not run, PyTorch's own choice, then K/V expanded; returns the callable
    and what it runs."""
    F = torch.nn.functional
    gqa = q.shape[1] != k.shape[1]
    kw = {"enable_gqa": True} if gqa else {}
    tries = []
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def flash():
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, **kw)

        tries.append((flash, "flash backend"))
    except ImportError:  # pragma: no cover - old torch
        pass
    tries.append((lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, **kw),
                  "default backend"))
    if gqa:
        rep = q.shape[1] // k.shape[1]
        ke, ve = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        tries.append((lambda: F.scaled_dot_product_attention(q, ke, ve, is_causal=causal),
                      "default backend, K/V expanded to every head"))
    why = []
    for fn, what in tries:
        try:
            fn()
            return fn, f"torch sdpa, {what}" + (f" ({'; '.join(why)})" if why else "")
        except Exception as exc:  # RuntimeError: no backend for these inputs
            why.append(f"{what}: {type(exc).__name__}")
    raise RuntimeError(f"scaled_dot_product_attention does not run: {'; '.join(why)}")


def _build_point(torch, K, cfg, spec: LayerSpec, pt: dict, device, hopper: bool,
                 l2_bytes: int) -> list[tuple[dict, Callable, int]]:
    """The op callables of one point over preallocated random tensors: ``(shape row,
    callable, copies)`` per op, in :func:`layer_ops`' order."""
    F = torch.nn.functional
    dt = {"bfloat16": torch.bfloat16, "float16": torch.float16}[spec.dtype]
    esz = 2
    d = _dims(cfg, spec.tp)
    h, hq, hkv, hd, inter = d["h"], d["hq"], d["hkv"], d["hd"], d["inter"]
    m, reqs = pt["m"], pt["reqs"]
    qw, kvw = hq * hd, hkv * hd
    ow = hq * cfg.v_head_dim

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, device=device, dtype=torch.float32) * scale).to(dt)

    def linear(x, n, k):
        ws = [rnd(n, k, scale=k ** -0.5) for _ in range(_copies(n * k * esz, l2_bytes))]
        it = itertools.cycle(ws)
        return (lambda: F.linear(x, next(it))), len(ws)

    x1, x2 = rnd(m, h), rnd(m, h)
    residual = rnd(m, h)
    w_in, w_post = 1.0 + rnd(h, scale=0.1), 1.0 + rnd(h, scale=0.1)
    qkv = rnd(m, qw + 2 * kvw)
    attn_out = rnd(m, ow)
    gu = rnd(m, 2 * inter)
    act = rnd(m, inter)
    fns: dict[str, tuple[Callable, int]] = {}
    fns["input_norm"] = (lambda: K.add_rmsnorm(x1, w_in, residual), 1)
    fns["qkv_proj"] = linear(x1, qw + 2 * kvw, h)
    if cfg.qk_norm:
        qk = rnd(m * (hq + hkv), hd)
        w_qk = 1.0 + rnd(hd, scale=0.1)
        fns["qk_norm"] = (lambda: K.add_rmsnorm(qk, w_qk), 1)
    if pt["phase"] == "prefill":
        pos = torch.arange(pt["seq"], device=device, dtype=torch.int64).repeat(reqs)
        cache_pos = pt["seq"]
    else:
        pos = torch.full((m,), pt["ctx"] - 1, device=device, dtype=torch.int64)
        cache_pos = pt["ctx"]
    cos_sin = _rope_cache(torch, cache_pos, hd, device)
    fns["rope"] = (lambda: K.rope(qkv, pos, cos_sin, hq + hkv, hd), 1)
    if pt["phase"] == "prefill":
        k_cache, v_cache = rnd(m, kvw), rnd(m, kvw)
        slots = torch.arange(m, device=device, dtype=torch.int64)
        q = qkv[:, :qw].view(reqs, pt["seq"], hq, hd).transpose(1, 2)
        k = qkv[:, qw:qw + kvw].view(reqs, pt["seq"], hkv, hd).transpose(1, 2)
        v = qkv[:, qw + kvw:].view(reqs, pt["seq"], hkv, hd).transpose(1, 2)
        attn, what = _sdpa(torch, q, k, v, True)
        fns["attention"] = (attn, 1)
    else:
        ctx = pt["ctx"]
        n = _copies(2 * reqs * ctx * kvw * esz, l2_bytes)
        caches = [(rnd(reqs * ctx, kvw), rnd(reqs * ctx, kvw)) for _ in range(n)]
        k_cache, v_cache = caches[0]
        slots = torch.arange(reqs, device=device, dtype=torch.int64) * ctx + (ctx - 1)
        q = qkv[:, :qw].view(reqs, 1, hq, hd).transpose(1, 2)
        calls = []
        for kc, vc in caches:
            kk = kc.view(reqs, ctx, hkv, hd).transpose(1, 2)
            vv = vc.view(reqs, ctx, hkv, hd).transpose(1, 2)
            calls.append(_sdpa(torch, q, kk, vv, False))
        what = calls[0][1]
        it = itertools.cycle([fn for fn, _ in calls])
        fns["attention"] = ((lambda: next(it)()), n)
    fns["kv_cache_write"] = (lambda: K.kv_write(qkv, slots, k_cache, v_cache, qw, kvw), 1)
    fns["o_proj"] = linear(attn_out, h, ow)
    fns["post_attn_norm"] = (lambda: K.add_rmsnorm(x2, w_post, residual), 1)
    fns["gate_up_proj"] = linear(x2, 2 * inter, h)
    fns["silu_mul"] = (lambda: K.silu_mul(gu, act), 1)
    fns["down_proj"] = linear(act, h, inter)
    out = []
    for row in layer_ops(cfg, pt, spec.tp, hopper):
        if row["op"] == "attention":
            row = {**row, "impl": f"{row['impl']}: {what}"}
        fn, copies = fns[row["op"]]
        out.append((row, fn, copies))
    return out


def _gpu_sleep(torch, seconds: float) -> None:
    """Keep the GPU busy for about ``seconds`` (at most 2 GHz: at a lower clock it lasts
    longer, which only costs time) so that the host queues the timed calls ahead of it."""
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is not None and seconds > 0:
        sleep(int(seconds * 2.0e9))


def _time_calls(torch, fn: Callable, *, target_ms: float, max_rep: int, min_rep: int = 5,
                cuda: bool = True) -> list[float]:
    """Per-call times (ms) after a warm-up: CUDA events around each call, the calls queued
    behind a GPU sleep (device time, back to back; no cache flush). On the CPU (the tests'
    smoke run) wall-clock times of synchronous calls."""
    if not cuda:
        fn()
        out = []
        for _ in range(min_rep):
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e3)
        return out
    fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    s.record()
    for _ in range(3):
        fn()
        e.record()
    host = (time.perf_counter() - t0) / 3.0
    torch.cuda.synchronize()
    est = max(s.elapsed_time(e) / 3.0, 1e-3)
    n = int(min(max_rep, max(min_rep, round(target_ms / est))))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    _gpu_sleep(torch, min(0.2, 2.0 * n * host + 1e-3))
    for i in range(n):
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return [a.elapsed_time(b) for a, b in zip(starts, ends)]


def _profile_kernels(torch, fn: Callable, calls: int = 3, cuda: bool = True) -> dict:
    """The device activities of one call of ``fn`` (:func:`tsbatch.measured.measure.device_events`
    over ``calls`` calls): ``kernels`` per call, their distinct ``kernel_names`` in launch
    order and their summed device time per call ``kernel_ms``."""
    from tsbatch.measured.measure import device_events

    events = device_events(torch, fn, calls, cuda)
    names: dict[str, int] = {}
    for name, _ in events:
        names[name] = names.get(name, 0) + 1
    per = []
    for name, cnt in names.items():
        k = cnt / calls
        per.append(name if k == 1 else f"{name} x{k:g}")
    return {"kernels": int(round(len(events) / calls)), "kernel_names": " | ".join(per),
            "kernel_ms": sum(t for _, t in events) / calls / 1e3}


def _graph_layer(torch, fns: Sequence[Callable]):
    """The layer's ops captured in one CUDA graph; returns its replay callable."""
    def layer():
        for f in fns:
            f()

    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        layer()
        layer()
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        layer()
    torch.cuda.synchronize()
    return g.replay, g


def _hopper(env: dict) -> bool:
    try:
        from tsbatch.hw import get_hw

        return get_hw(env["gpu"]).arch == "hopper"
    except Exception:
        return str(env.get("capability", "")).startswith("9.")


def _run_point(torch, K, cfg, spec: LayerSpec, pt: dict, device, hopper: bool, l2: int,
               base: dict, records: list, line: list, stats: dict, graph_ok: bool,
               quiet: bool) -> bool:
    """One point of :func:`run_layer`: its op rows, the layer rows, appended to
    ``records`` as they are measured; returns whether CUDA graphs still capture."""
    cuda = device != "cpu"
    ops = _build_point(torch, K, cfg, spec, pt, device, hopper, l2)
    keys = {k: pt[k] for k in ("phase", "point", "m", "reqs", "seq", "ctx")}
    for row, fn, copies in ops:
        times = _time_calls(torch, fn, target_ms=spec.target_ms, max_rep=spec.max_repeats,
                            cuda=cuda)
        rec = {**base, **keys, **row, "time_ms": float(sorted(times)[len(times) // 2]),
               "time_ms_min": float(min(times)), "repeats": len(times), "copies": copies}
        if spec.profile:
            try:
                rec.update(_profile_kernels(torch, fn, cuda=cuda))
            except Exception as exc:  # the profiler is not essential to the row
                stats["profile_errors"] += 1
                if stats["profile_errors"] == 1:
                    _log(f"  torch.profiler failed ({type(exc).__name__}: {exc}); "
                         "kernels not counted", quiet)
        records.append(rec)
        line.append(f"{row['op']} {rec['time_ms'] * 1e3:.1f}")
    fns = [fn for _, fn, _ in ops]

    def layer():
        for f in fns:
            f()

    times = _time_calls(torch, layer, target_ms=spec.target_ms,
                        max_rep=min(spec.max_repeats, 20), min_rep=3, cuda=cuda)
    lrow = {**base, **keys, "op": "layer", "family": "layer",
            "impl": "every op in order, back to back"}
    records.append({**lrow, "time_ms": float(sorted(times)[len(times) // 2]),
                    "time_ms_min": float(min(times)), "repeats": len(times), "copies": 1})
    line.append(f"layer {records[-1]['time_ms'] * 1e3:.1f}")
    if graph_ok:
        try:
            replay, _g = _graph_layer(torch, fns)
            times = _time_calls(torch, replay, target_ms=spec.target_ms,
                                max_rep=min(spec.max_repeats, 20), min_rep=3, cuda=cuda)
            records.append({**lrow, "op": "layer_graph",
                            "impl": "every op in order, replayed from one CUDA graph",
                            "time_ms": float(sorted(times)[len(times) // 2]),
                            "time_ms_min": float(min(times)), "repeats": len(times),
                            "copies": 1})
            line.append(f"graph {records[-1]['time_ms'] * 1e3:.1f}")
        except Exception as exc:
            stats["graph_errors"] += 1
            graph_ok = False
            _log(f"  CUDA graph capture failed ({type(exc).__name__}: {exc}); no "
                 "layer_graph rows from here on", quiet)
    return graph_ok


def run_layer(torch, env: dict, spec: LayerSpec, quiet: bool = False, *,
              device: str = "cuda", on_point: Callable[[list[dict], int, int], None] | None = None,
              stats: dict | None = None) -> list[dict]:
    """Time each op of one layer on its own, and the layer back to back, at every point of
    ``spec``; return one record per op and point (:data:`LAYER_SCHEMA`'s keys).

    Each op: a warm-up, then about ``spec.target_ms`` of calls (5 to ``spec.max_repeats``)
    each between two CUDA events, queued behind a GPU sleep (device time, launch gaps of
    back-to-back calls included); ``time_ms`` is their median. The L2 is NOT flushed
    between calls: in a real step the activations are hot (the op before just wrote
    them); the weights and the KV cache, per layer in a real model and cold when it runs,
    are cycled through copies where one is under twice the L2 (the module doc). With
    ``spec.profile`` each op's device activities are counted with torch.profiler.
    Per point, ``op = 'layer'``: every op in order, timed the same way (3 to 20 calls, so
    that the queued launches stay within CUDA's launch queue and the host never holds the
    GPU back); ``layer_graph``: the same replayed from a CUDA graph (``spec.graph``).

    ``device='cpu'`` is the tests' smoke run (wall clock, the Triton kernels under
    ``TRITON_INTERPRET=1``): it checks the plumbing, never a time. ``on_point(records,
    done, planned)`` is called after each point (run_layer_part writes the file then);
    no new point starts after ``spec.time_budget_s`` (0: no limit).
    """
    from tsbatch.measured import layer_kernels as K

    cuda = device != "cpu"
    cfg = spec.config
    hopper = _hopper(env)
    l2 = int(env.get("l2_bytes", 0) or 64 << 20)
    pts = spec_points(spec)
    base = {"gpu": env.get("gpu", "unknown"), "model": spec.model, "dtype": spec.dtype,
            "tp": spec.tp}
    records: list[dict] = []
    stats = {} if stats is None else stats
    stats.update(points_planned=len(pts), points_done=0, profile_errors=0, graph_errors=0,
                 point_errors=0)
    graph_ok = spec.graph and cuda
    t_start = time.perf_counter()
    for i, pt in enumerate(pts):
        if spec.time_budget_s and time.perf_counter() - t_start > spec.time_budget_s:
            _log(f"  time budget {spec.time_budget_s:.0f} s spent: {i} of {len(pts)} points "
                 "done", quiet)
            break
        label = (f"prefill {pt['reqs']} x {pt['seq']}" if pt["phase"] == "prefill"
                 else f"decode batch {pt['reqs']} ctx {pt['ctx']}")
        line: list[str] = []
        try:
            graph_ok = _run_point(torch, K, cfg, spec, pt, device, hopper, l2, base, records,
                                  line, stats, graph_ok, quiet)
        except Exception as exc:  # a point that fails (memory, a backend) does not end the run
            stats["point_errors"] += 1
            line.append(f"FAILED ({type(exc).__name__}: {exc})")
        if cuda:
            try:
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
            except Exception:  # pragma: no cover - a poisoned context; the next point says so
                pass
        stats["points_done"] = i + 1
        _log(f"  {label}: " + ", ".join(line) + " us", quiet)
        if on_point is not None:
            on_point(records, i + 1, len(pts))
    return records


def run_layer_part(out_dir: Path, spec: LayerSpec | None = None, quiet: bool = False) -> int:
    """``tsbatch measure --only layer``: run :func:`run_layer` on the current CUDA device and
    write ``out_dir/layer.parquet`` (rewritten after every point, so a run stopped early
    keeps the points it finished; metadata ``tsbatch.points_done`` of
    ``tsbatch.points_planned``, ``tsbatch.complete``, the spec). Returns the rows written."""
    from tsbatch.boundary.io import write_parquet
    from tsbatch.measured.measure import _environment, measurement_metadata, require_gpu

    spec = default_spec() if spec is None else spec
    torch, triton = require_gpu()
    env = _environment(torch, triton)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    _log(f"one {spec.model} layer ({spec.dtype}, tp {spec.tp}): {len(spec.prefill)} prefill and "
         f"{len(spec.decode)} decode points on {env['device_name']}", quiet)
    stats: dict = {}
    spec_meta = {k: (list(map(list, v)) if isinstance(v, tuple) else v)
                 for k, v in dataclasses.asdict(spec).items()}

    def save(records, done, planned):
        meta = {"spec": spec_meta, "points_done": done, "points_planned": planned,
                "complete": done == planned, "profile_errors": stats.get("profile_errors", 0),
                "graph_errors": stats.get("graph_errors", 0),
                "point_errors": stats.get("point_errors", 0)}
        write_parquet(layer_frame(records), out_dir / "layer.parquet",
                      measurement_metadata(env, "layer", meta))

    records = run_layer(torch, env, spec, quiet, on_point=save, stats=stats)
    save(records, stats["points_done"], stats["points_planned"])
    return len(records)
