"""One engine step lowered to its ops, for every deployment of a table at once.

A deployment's phases become *points*: prefill chunks (``m`` tokens, run ``count``
times), the prefill attention over the whole prompts, the prefill's LM head and
sampler, and ``decode_points`` decode steps at growing contexts. Every op of a layer
(and the embedding, final norm, LM head and sampler) is a polars expression over the
points: one frame per op kind, never a Python loop over deployments. Each op row
names its kernel family and carries that family's columns (the key the family is
evaluated on), how often it runs per step (``mult``: layers x ...), and the FLOPs and
bytes of one run (for the breakdown and the tests' hand counts).

Proxies, said where they are used: RoPE is a rowwise pass of the same bytes
(``silu_mul`` of width 2/3 of q+k, which reads 2 and writes 1 of that width: the 2x
q+k in-place read and write); the embedding lookup and the KV-cache write are a
rowwise ``rmsnorm`` pass of their bytes (read and write one row each); MLA's absorbed
per-head products (q_nope x W_UK, o x W_UV) are one GEMM of the same FLOPs and weight
bytes (heads x latent columns).
"""

from __future__ import annotations

import polars as pl

__all__ = ["points", "lower_ops", "FAMILY_KEYS"]

c = pl.col

#: per family: the columns an op row carries (the family's input; the evaluation key)
FAMILY_KEYS = {
    "gemm": ("gpu", "m", "n", "k", "dtype", "impl"),
    "attention": ("gpu", "batch", "heads", "kv_heads", "seq_len", "head_dim", "dtype", "causal",
                  "variant", "window"),
    "attention_fa3": ("gpu", "batch", "heads", "kv_heads", "seq_len", "head_dim", "dtype",
                      "causal", "variant", "window"),
    "flash_decoding": ("gpu", "batch", "heads", "kv_heads", "seq_len_kv", "head_dim", "dtype"),
    "mla_decode": ("gpu", "batch", "heads", "seq_len_kv", "dtype", "kv_lora_rank", "rope_dim"),
    "moe_grouped_gemm": ("gpu", "tokens", "experts", "top_k", "hidden", "ffn", "proj", "dtype"),
    "rowwise": ("gpu", "op", "rows", "hidden", "dtype", "residual"),
    "collective": ("comm_system", "collective", "num_gpus", "gpus_per_node", "bytes"),
    # the engine's own all-reduce over NVLink P2P (vLLM's custom all-reduce); ``eager``: the
    # input is first copied into the registered buffer (outside a captured graph)
    "custom_ar": ("gpu", "comm_system", "num_gpus", "gpus_per_node", "bytes", "eager"),
}


def points(dep: pl.DataFrame) -> pl.DataFrame:
    """The step points of every feasible deployment.

    Columns: ``dep, phase, point, kind`` (``tokens``: the per-token ops of a step of
    ``m`` tokens; ``attn``: prefill attention over the prompts; ``tail``: LM head and
    sampler of the prefill; ``decode``: a whole decode step), ``m``, ``reqs``,
    ``seq``, ``ctx``, ``count`` (runs of this point in the phase), ``weight``
    (decode: the point's share of the decode steps).
    """
    d = dep.filter(c("feasible"))
    T = c("batch") * c("prompt_len")
    B = c("chunk_tokens")
    base = ["dep"]
    full = d.select(*base, pl.lit("prefill").alias("phase"), pl.lit(0).alias("point"),
                    pl.lit("tokens").alias("kind"), pl.min_horizontal(B, T).alias("m"),
                    c("batch").alias("reqs"), c("prompt_len").alias("seq"),
                    pl.lit(0).alias("ctx"), pl.max_horizontal(T // B, 1).alias("count"),
                    pl.lit(1.0).alias("weight"))
    rest = d.filter(T > B).select(*base, pl.lit("prefill").alias("phase"),
                                  pl.lit(1).alias("point"), pl.lit("tokens").alias("kind"),
                                  (T % B).alias("m"), c("batch").alias("reqs"),
                                  c("prompt_len").alias("seq"), pl.lit(0).alias("ctx"),
                                  pl.lit(1).alias("count"), pl.lit(1.0).alias("weight"))
    rest = rest.filter(c("m") > 0)
    # prefill attention over prompts of unequal lengths (prompt_len_rms > 0): the equal-length
    # batch with the same tokens and the same sum of squared lengths (causal work), n / s
    # requests of prompt_len x s tokens, s = (rms / mean)^2
    spread = pl.when(c("prompt_len_rms") > 0).then(
        (c("prompt_len_rms").cast(pl.Float64) / c("prompt_len")) ** 2).otherwise(1.0)
    attn = d.select(*base, pl.lit("prefill").alias("phase"), pl.lit(2).alias("point"),
                    pl.lit("attn").alias("kind"), (T).alias("m"),
                    pl.max_horizontal((c("batch") / spread).round(0), pl.lit(1.0))
                    .cast(pl.Int64).alias("reqs"),
                    (c("prompt_len") * spread).round(0).cast(pl.Int64).alias("seq"),
                    pl.lit(0).alias("ctx"), pl.lit(1).alias("count"), pl.lit(1.0).alias("weight"))
    tail = d.select(*base, pl.lit("prefill").alias("phase"), pl.lit(3).alias("point"),
                    pl.lit("tail").alias("kind"), c("batch").alias("m"), c("batch").alias("reqs"),
                    c("prompt_len").alias("seq"), pl.lit(0).alias("ctx"), pl.lit(1).alias("count"),
                    pl.lit(1.0).alias("weight"))
    K = c("decode_points")
    kk = d.select(*base, K.alias("K"), "prompt_len", "output_len", "batch").with_columns(
        pl.int_ranges(0, c("K")).alias("point")).explode("point")
    dec = kk.select(*base, pl.lit("decode").alias("phase"), c("point").cast(pl.Int32),
                    pl.lit(["decode", "decode_attn"]).alias("kind"), c("batch").alias("m"),
                    c("batch").alias("reqs"), c("prompt_len").alias("seq"),
                    (c("prompt_len") + (c("output_len") * (c("point") + 0.5) / c("K")).round(0)
                     .cast(pl.Int64)).alias("ctx"),
                    pl.lit(1).alias("count"), (1.0 / c("K")).alias("weight")).explode("kind")
    parts = [p.with_columns(c("point").cast(pl.Int32), c("m").cast(pl.Int64),
                            c("reqs").cast(pl.Int64), c("seq").cast(pl.Int64),
                            c("ctx").cast(pl.Int64), c("count").cast(pl.Int64))
             for p in (full, rest, attn, tail, dec)]
    return pl.concat(parts, how="vertical")


# ---------------------------------------------------------------- shorthands over the joined points
def _cdiv(a, b):
    return (a + b - 1) // b


hq = c("heads") // c("tp")
hkv = pl.max_horizontal(pl.lit(1), c("kv_heads") // c("tp"))
hd = c("head_dim")
h = c("hidden")
m = c("m")
wdt = pl.when(c("weights") == "fp8").then(pl.lit("float8")).otherwise(pl.lit("bfloat16"))
wb = pl.when(c("weights") == "fp8").then(1.0).otherwise(2.0)
is_moe = c("experts") > 0
n_dense = pl.when(is_moe).then(c("dense_layers")).otherwise(c("layers"))
n_moe = pl.when(is_moe).then(c("layers") - c("dense_layers")).otherwise(0)
n_all = c("layers")
tok_kinds = ("tokens", "decode")


def _gemm(name, n, k, *, when=None, mult=n_all, kinds=tok_kinds, mm=None, part="layer",
          bf16=False):
    """A projection; ``bf16``: kept in bf16 whatever the weights' dtype (vLLM leaves the
    LM head and the MoE router unquantized)."""
    mm = m if mm is None else mm
    dt, b = (pl.lit("bfloat16"), 2.0) if bf16 else (wdt, wb)
    return dict(name=name, family="gemm", kinds=kinds, when=when, mult=mult, part=part,
                cols={"m": mm, "n": n, "k": k, "dtype": dt, "impl": c("gemm")},
                flops=2.0 * mm * n * k,
                bytes=(mm * k * 2.0 + k * n * b + mm * n * 2.0),
                quant_in=None if bf16 else (mm, k))


def _fp8_quant(od: dict) -> list[dict]:
    """The activation quantization before an FP8 GEMM (vLLM's Fp8LinearMethod with
    dynamic per-tensor activation scales: ``scaled_fp8_quant(x, None)`` runs two kernels,
    a max-abs reduction over the whole bf16 input, then the scaled conversion to FP8).
    Rowwise passes of the same bytes (proxies, like RoPE's): the reduction reads 2 bytes
    an element (``silu_mul`` of width k/3: reads 2 x, writes 1 x of that width, 6 bytes),
    the conversion reads 2 and writes 1 (width k/2). Counted unfused: vLLM's compile pass
    fuses a quantization into the RMSNorm before it only for static scales."""
    rows, k = od["quant_in"]
    fp8 = c("weights") == "fp8"
    when = fp8 if od["when"] is None else (od["when"] & fp8)
    out = []
    for suffix, width, per in (("absmax", _cdiv(k, 3), 2.0), ("quant", _cdiv(k, 2), 3.0)):
        r = _row(f"{od['name']}_{suffix}", "silu_mul", rows, width, when=when, mult=od["mult"],
                 kinds=od["kinds"], part=od["part"])
        r["flops"] = 2.0 * rows * k
        r["bytes"] = per * rows * k
        out.append(r)
    return out


def _row(name, op, rows, hidden, *, residual=False, when=None, mult=n_all, kinds=tok_kinds,
         dtype="bfloat16", part="layer"):
    eb = 4.0 if dtype == "float32" else 2.0
    per = {"rmsnorm": 4.0 if residual else 2.0, "silu_mul": 3.0, "softmax": 2.0}[op]
    return dict(name=name, family="rowwise", kinds=kinds, when=when, mult=mult, part=part,
                cols={"op": pl.lit(op), "rows": rows, "hidden": hidden, "dtype": pl.lit(dtype),
                      "residual": pl.lit(residual)},
                flops=4.0 * rows * hidden, bytes=per * eb * rows * hidden)


def _comm(name, coll, nbytes, ngpus, *, when, mult=n_all, kinds=tok_kinds, gpn=None, part="layer"):
    gpn = pl.min_horizontal(ngpus, c("gpus_per_node")) if gpn is None else gpn
    return dict(name=name, family="collective", kinds=kinds, when=when, mult=mult, part=part,
                cols={"collective": pl.lit(coll), "num_gpus": ngpus, "gpus_per_node": gpn,
                      "bytes": nbytes},
                flops=pl.lit(0.0), bytes=nbytes.cast(pl.Float64))


def _custom_ar_ok(nbytes, ngpus) -> pl.Expr:
    """vLLM's rule for its own all-reduce (CustomAllreduce.should_custom_ar): 2, 4, 6 or 8
    GPUs of one node, every pair joined by the direct link (any two GPUs of a switch or a
    mesh; a bridged pair for 2), a message under the engine's ``custom_ar_max_bytes`` and a
    multiple of 16 bytes."""
    link = c("p2p_link")
    return ((c("custom_ar_max_bytes") > nbytes) & (nbytes % 16 == 0)
            & ngpus.is_in([2, 4, 6, 8]) & (ngpus <= c("gpus_per_node"))
            & ((link == 1) | (link == 2) | ((link == 3) & (ngpus == 2))))


def _all_reduce(name, nbytes, ngpus, *, when, mult=n_all, kinds=tok_kinds, part="layer"):
    """A TP all-reduce: the engine's own NVLink kernel where its rule admits the message
    (:func:`_custom_ar_ok`), NCCL otherwise. Two op kinds; one of them runs."""
    ok = _custom_ar_ok(nbytes, ngpus)
    nccl = _comm(name, "all_reduce", nbytes, ngpus, when=when & ~ok, mult=mult, kinds=kinds,
                 part=part)
    own = dict(name=name, family="custom_ar", kinds=kinds, when=when & ok, mult=mult,
               part=part, cols={"num_gpus": ngpus, "gpus_per_node": c("gpus_per_node"),
                                "bytes": nbytes, "eager": c("phase") == "prefill"},
               flops=pl.lit(0.0), bytes=nbytes.cast(pl.Float64))
    return [nccl, own]


def op_defs() -> list[dict]:
    """Every op kind of a step, in the order one layer runs them."""
    tp = c("tp")
    mla = c("model_kind") == "mla"
    std = ~mla
    qdim = (hq + 2 * hkv) * hd
    inter_l = _cdiv(c("intermediate"), tp)
    shared_l = _cdiv(c("shared_intermediate"), tp)
    ep = c("ep")
    e_l = c("experts") // ep
    k_l = pl.min_horizontal(c("top_k"), e_l)
    moe_tok = pl.when(ep > 1).then(_cdiv(_cdiv(m * c("top_k"), ep), k_l)).otherwise(m)
    moe_ffn = pl.when(ep > 1).then(c("moe_intermediate")).otherwise(
        _cdiv(c("moe_intermediate"), tp))
    act = m * h * 2
    win = c("sliding_window")
    ops = [
        # ---- head of the step
        _row("embedding", "rmsnorm", m, h, mult=pl.lit(1), part="head"),
        *_all_reduce("embedding_all_reduce", act, tp, when=tp > 1, mult=pl.lit(1),
                     part="head"),
        # ---- attention block
        _row("input_norm", "rmsnorm", m, h, residual=True),
        _gemm("qkv_proj", qdim, h, when=std),
        _row("qk_norm", "rmsnorm", m * (hq + hkv), hd, when=std & c("qk_norm")),
        _row("rope", "silu_mul", m, _cdiv(2 * (hq + hkv) * hd, 3), when=std),
        _row("kv_cache_write", "rmsnorm", m, 2 * hkv * hd, when=std),
        # MLA projections (DeepSeek-V2/V3): q_a and kv_a fused, their norms, q_b
        _gemm("q_a_kv_a_proj", c("q_lora_rank") + c("kv_lora_rank") + c("qk_rope_dim"), h,
              when=mla),
        _row("q_a_norm", "rmsnorm", m, c("q_lora_rank"), when=mla & (c("q_lora_rank") > 0)),
        _row("kv_a_norm", "rmsnorm", m, c("kv_lora_rank"), when=mla),
        _gemm("q_b_proj", hq * hd, pl.when(c("q_lora_rank") > 0).then(c("q_lora_rank"))
              .otherwise(h), when=mla),
        _row("rope", "silu_mul", m, _cdiv(2 * (hq + 1) * c("qk_rope_dim"), 3), when=mla),
        _row("kv_cache_write", "rmsnorm", m, c("kv_lora_rank") + c("qk_rope_dim"), when=mla),
        _gemm("kv_b_proj", hq * (c("qk_nope_dim") + c("v_head_dim")), c("kv_lora_rank"),
              when=mla, kinds=("tokens",)),
        _gemm("q_absorb", hq * c("kv_lora_rank"), c("qk_nope_dim"), when=mla,
              kinds=("decode",)),
    ]
    # prefill attention: the family is chosen per GPU (FA-3 on Hopper, FA-2 style elsewhere)
    for fam, gate in (("attention_fa3", c("hopper")), ("attention", ~c("hopper"))):
        sw = (win > 0) & (win < c("seq"))
        ops.append(dict(
            name="attention", family=fam, kinds=("attn",), when=gate, mult=n_all, part="layer",
            cols={"batch": c("reqs"), "heads": hq,
                  "kv_heads": pl.when(mla).then(hq).otherwise(hkv), "seq_len": c("seq"),
                  "head_dim": hd, "dtype": pl.lit("bfloat16"), "causal": pl.lit(True),
                  "variant": pl.when(sw).then(pl.lit("sliding_window"))
                  .otherwise(pl.lit("full")),
                  "window": pl.when(sw).then(win).otherwise(0)},
            flops=2.0 * c("reqs") * hq * hd * c("seq") * (c("seq") + 1)
            * (hd + c("v_head_dim")) / (2 * hd),
            bytes=2.0 * c("reqs") * c("seq") * (hq * hd * 2 + hkv * 2 * hd)))
    ctx_eff = pl.when(win > 0).then(pl.min_horizontal(c("ctx"), win)).otherwise(c("ctx"))
    ops += [
        dict(name="attention", family="flash_decoding", kinds=("decode_attn",), when=std,
             mult=n_all,
             part="layer",
             cols={"batch": c("reqs"), "heads": hq, "kv_heads": hkv, "seq_len_kv": ctx_eff,
                   "head_dim": hd, "dtype": pl.lit("bfloat16")},
             flops=4.0 * c("reqs") * hq * ctx_eff * hd,
             bytes=2.0 * c("reqs") * (ctx_eff * 2 * hkv * hd + 2 * hq * hd)),
        dict(name="attention", family="mla_decode", kinds=("decode_attn",), when=mla,
             mult=n_all,
             part="layer",
             cols={"batch": c("reqs"), "heads": hq, "seq_len_kv": c("ctx"),
                   "dtype": pl.lit("bfloat16"), "kv_lora_rank": c("kv_lora_rank"),
                   "rope_dim": c("qk_rope_dim")},
             flops=2.0 * c("reqs") * hq * c("ctx") * (2 * c("kv_lora_rank") + c("qk_rope_dim")),
             bytes=2.0 * c("reqs") * c("ctx") * (c("kv_lora_rank") + c("qk_rope_dim"))),
        _gemm("v_absorb", hq * c("v_head_dim"), c("kv_lora_rank"), when=mla,
              kinds=("decode",)),
        _gemm("o_proj", h, hq * c("v_head_dim")),
        *_all_reduce("attn_all_reduce", act, tp, when=tp > 1),
        _row("post_attn_norm", "rmsnorm", m, h, residual=True),
        # ---- dense MLP
        _gemm("gate_up_proj", 2 * inter_l, h, mult=n_dense, when=n_dense > 0),
        _row("silu_mul", "silu_mul", m, inter_l, mult=n_dense, when=n_dense > 0),
        _gemm("down_proj", h, inter_l, mult=n_dense, when=n_dense > 0),
        *_all_reduce("mlp_all_reduce", act, tp, mult=n_dense, when=(tp > 1) & (n_dense > 0)),
        # ---- MoE: router, experts (grouped GEMM), shared experts, communication
        _gemm("router", c("experts"), h, mult=n_moe, when=n_moe > 0, bf16=True),
        _row("topk_softmax", "softmax", m, c("experts"), mult=n_moe, when=n_moe > 0,
             dtype="float32"),
        _comm("moe_dispatch_all_to_all", "all_to_all", m * c("top_k") * h * 2, ep, mult=n_moe,
              when=(n_moe > 0) & (ep > 1)),
    ]
    for proj, n_, k_ in (("gate_up", 2 * moe_ffn, h), ("down", h, moe_ffn)):
        ops.append(dict(
            name=f"moe_{proj}", family="moe_grouped_gemm", kinds=tok_kinds, when=n_moe > 0,
            mult=n_moe, part="layer",
            cols={"tokens": moe_tok, "experts": e_l, "top_k": k_l, "hidden": h, "ffn": moe_ffn,
                  "proj": pl.lit(proj), "dtype": wdt},
            flops=2.0 * moe_tok * k_l * n_ * k_,
            bytes=e_l * n_ * k_ * wb + moe_tok * k_l * (n_ + k_) * 2.0,
            # fused_moe quantizes its input (a1: the tokens) and the intermediate (a2)
            quant_in=(moe_tok, h) if proj == "gate_up" else (moe_tok * k_l, moe_ffn)))
        if proj == "gate_up":
            ops.append(_row("moe_silu_mul", "silu_mul", moe_tok * k_l, moe_ffn, mult=n_moe,
                            when=n_moe > 0))
    ops += [
        _gemm("shared_gate_up_proj", 2 * shared_l, h, mult=n_moe,
              when=(n_moe > 0) & (c("shared_intermediate") > 0)),
        _row("shared_silu_mul", "silu_mul", m, shared_l, mult=n_moe,
             when=(n_moe > 0) & (c("shared_intermediate") > 0)),
        _gemm("shared_down_proj", h, shared_l, mult=n_moe,
              when=(n_moe > 0) & (c("shared_intermediate") > 0)),
        _comm("moe_combine_all_to_all", "all_to_all", m * c("top_k") * h * 2, ep, mult=n_moe,
              when=(n_moe > 0) & (ep > 1)),
        # TP-sharded experts (ep 1) or TP-sharded shared experts reduce over TP; routed
        # experts under EP are combined by the all-to-all
        *_all_reduce("moe_all_reduce", act, tp, mult=n_moe,
                     when=(n_moe > 0) & (tp > 1) & ((ep == 1) | (c("shared_intermediate") > 0))),
        # ---- pipeline stages
        _comm("pp_send_recv", "send_recv", act, pl.lit(2), mult=c("pp") - 1, when=c("pp") > 1,
              gpn=pl.when(c("tp") * c("pp") > c("gpus_per_node")).then(1).otherwise(2),
              part="head"),
        # ---- tail: final norm, LM head, logits gather, sampler
        _row("final_norm", "rmsnorm", c("reqs"), h, residual=True, mult=pl.lit(1),
             kinds=("tail", "decode"), part="tail"),
        _gemm("lm_head", _cdiv(c("vocab"), tp), h, mult=pl.lit(1), kinds=("tail", "decode"),
              mm=c("reqs"), part="tail", bf16=True),
        _comm("logits_gather", "all_gather", c("reqs") * c("vocab") * 2, tp, when=tp > 1,
              mult=pl.lit(1), kinds=("tail", "decode"), part="tail"),
        _row("sampler", "softmax", c("reqs"), c("vocab"), mult=pl.lit(1),
             kinds=("tail", "decode"), dtype="float32", part="tail"),
    ]
    # FP8 weights: each FP8 GEMM's (and fused-MoE projection's) bf16 input is quantized first
    out = []
    for od in ops:
        if od["name"] in ("q_absorb", "v_absorb"):  # MLA's absorbed products: bf16 BMMs
            od = {**od, "quant_in": None}
        if od.get("quant_in") is not None:
            out += _fp8_quant(od)
        out.append(od)
    return out


#: deployment columns the ops read (with the phase): a point's op rows depend on these and
#: on its kind's own columns (:data:`KIND_SIG`) only
BASE_SIG = ("phase", "model_kind", "hidden", "layers", "heads", "kv_heads", "head_dim",
            "v_head_dim", "intermediate", "vocab", "qk_norm", "sliding_window", "experts", "top_k",
            "moe_intermediate", "shared_intermediate", "dense_layers", "q_lora_rank",
            "kv_lora_rank", "qk_nope_dim", "qk_rope_dim", "tp", "pp", "ep", "weights", "gemm",
            "gpu", "comm_system", "gpus_per_node", "hopper", "gap_prefill_us", "gap_decode_us",
            "comm_launch_us", "p2p_link", "custom_ar_max_bytes")
KIND_SIG = {"tokens": ("m",), "tail": ("m", "reqs"), "decode": ("m", "reqs"),
            "attn": ("reqs", "seq"), "decode_attn": ("reqs", "ctx")}


def signatures(dep: pl.DataFrame, pts: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Distinct op-relevant point signatures and the map from points to them.

    Returns ``(sigs, pmap)``: ``sigs`` has a ``sig`` id, ``kind`` and the signature
    columns; ``pmap`` has ``dep, phase, point, kind, count, weight, sig``. Points of
    different deployments that run the same ops (the same model, machine, layout and
    tokens; a decode step's non-attention ops at any context) share one signature, so
    the op rows are made and summed once per signature, not per deployment.
    """
    j = pts.join(dep.select("dep", *[k for k in BASE_SIG if k != "phase"]), on="dep",
                 how="left")
    sigs, maps, base = [], [], 0
    for kind, extra in KIND_SIG.items():
        sub = j.filter(c("kind") == kind)
        if sub.height == 0:
            continue
        cols = ["kind", *BASE_SIG, *extra]
        u = sub.select(cols).unique(maintain_order=True)
        u = u.with_columns((pl.int_range(0, u.height, dtype=pl.Int64) + base).alias("sig"))
        base += u.height
        maps.append(sub.join(u, on=cols, how="left", nulls_equal=True)
                    .select("dep", "phase", "point", "kind", "count", "weight", "sig"))
        sigs.append(u)
    if not sigs:
        return (pl.DataFrame(schema={"sig": pl.Int64, "kind": pl.String, "phase": pl.String}),
                pl.DataFrame(schema={"dep": pl.Int64, "phase": pl.String, "point": pl.Int32,
                                     "kind": pl.String, "count": pl.Int64,
                                     "weight": pl.Float64, "sig": pl.Int64}))
    return pl.concat(sigs, how="diagonal_relaxed"), pl.concat(maps, how="vertical")


def lower_sigs(sigs: pl.DataFrame) -> dict[str, pl.DataFrame]:
    """Op rows of every signature, one frame per family: ``sig, phase, op_name, part,
    order, mult, gap_us, comm_launch_us``, the family's columns (:data:`FAMILY_KEYS`),
    ``op_flops, op_bytes``. ``mult``: runs per step."""
    out: dict[str, list] = {}
    if sigs.height == 0:
        return {}
    gap = pl.when(c("phase") == "prefill").then(c("gap_prefill_us")) \
        .otherwise(c("gap_decode_us")).alias("gap_us")
    for order, od in enumerate(op_defs()):
        sel = sigs.filter(c("kind").is_in(list(od["kinds"])))
        if od["when"] is not None:
            sel = sel.filter(od["when"])
        if sel.height == 0:
            continue
        keys = FAMILY_KEYS[od["family"]]
        fam_cols = [od["cols"][k].alias(k) for k in keys
                    if k not in ("gpu", "comm_system", "impl")]
        extra = [c(k) for k in keys if k in ("gpu", "comm_system")]
        if "impl" in keys:
            extra.append(od["cols"]["impl"].alias("impl"))
        f = sel.select("sig", "phase", pl.lit(od["name"]).alias("op_name"),
                       pl.lit(od["part"]).alias("part"), pl.lit(order).alias("order"),
                       od["mult"].cast(pl.Int64).alias("mult"), gap, "comm_launch_us",
                       *extra, *fam_cols,
                       od["flops"].cast(pl.Float64).alias("op_flops"),
                       od["bytes"].cast(pl.Float64).alias("op_bytes"))
        f = f.filter(c("mult") > 0)
        out.setdefault(od["family"], []).append(f)
    return {fam: pl.concat(fs, how="vertical_relaxed") for fam, fs in out.items()}


def lower_ops(dep: pl.DataFrame, pts: pl.DataFrame | None = None) -> dict[str, pl.DataFrame]:
    """Op rows of every point of every deployment, one frame per family (for
    explanations and tests; predictions go through :func:`signatures`).

    Every frame has ``dep, phase, point`` and :func:`lower_sigs`' columns.
    """
    pts = points(dep) if pts is None else pts
    sigs, pmap = signatures(dep, pts)
    return {fam: pmap.select("dep", "phase", "point", "sig").join(
        f.drop("phase"), on="sig", how="inner").drop("sig")
        for fam, f in lower_sigs(sigs).items()}
