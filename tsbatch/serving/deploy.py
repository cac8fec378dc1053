"""Deployments: a table of (model, GPU or system, parallel layout, batch, lengths) rows,
checked and resolved into the per-row numbers the op lowering needs.

Columns (``DEPLOYMENT_COLUMNS``): ``model`` (Hugging Face id, alias or config.json path),
``system`` (a ``hw/systems`` stem or alias, or a GPU of ``hw/`` for one GPU), ``tp``,
``pp``, ``ep``, ``dp`` (default 1), ``weights`` (``bf16`` or ``fp8``, default ``bf16``),
``engine`` (``vllm`` or ``tuned``, default ``vllm``), ``batch`` (requests of one DP
replica's static batch), ``prompt_len`` (mean prompt tokens per request), ``output_len``
(tokens generated per request), ``chunk_tokens`` (prefill token budget; default the
engine's). Bad input is one :class:`InputError` naming the column; a deployment that
cannot run (too many GPUs for the system, heads not divisible by TP, weights and KV cache
over the GPU's memory) is a row with ``feasible = false`` and its reason.
"""

from __future__ import annotations

import tomllib
from functools import lru_cache
from pathlib import Path

import polars as pl

from tsbatch.errors import InputError
from tsbatch.serving.models import load_model

__all__ = ["DEPLOYMENT_COLUMNS", "engine_profile", "engine_profiles", "resolve"]

#: column -> (polars type, default or None when required, doc)
DEPLOYMENT_COLUMNS = {
    "model": (pl.String, None, "Hugging Face id, alias, or path to a config.json"),
    "system": (pl.String, None, "hw/systems stem or alias, or a GPU of hw/ (one GPU)"),
    "tp": (pl.Int64, 1, "tensor parallel degree"),
    "pp": (pl.Int64, 1, "pipeline stages"),
    "ep": (pl.Int64, 1, "expert parallel degree (MoE; divides the routed experts)"),
    "dp": (pl.Int64, 1, "data-parallel replicas"),
    "weights": (pl.String, "bf16", "weights dtype: bf16 or fp8"),
    "engine": (pl.String, "vllm", "engine profile: vllm or tuned"),
    "batch": (pl.Int64, None, "requests of one replica's static batch"),
    "prompt_len": (pl.Int64, None, "mean prompt tokens per request"),
    "output_len": (pl.Int64, None, "tokens generated per request"),
    "chunk_tokens": (pl.Int64, 0, "prefill token budget per step (0: the engine's)"),
    "prompt_len_rms": (pl.Int64, 0, "root mean square of the prompt lengths when they differ "
                       "(prefill attention's causal work grows with the sum of their squares); "
                       "0: every prompt is prompt_len long"),
}
_POSITIVE = ("tp", "pp", "ep", "dp", "batch", "prompt_len", "output_len")
WEIGHTS = {"bf16": "bfloat16", "fp8": "float8"}

#: fraction of a GPU's memory the engine may fill (vLLM gpu_memory_utilization default)
MEMORY_FRACTION = 0.9


def _engines_file() -> Path:
    return Path(__file__).resolve().parent / "engines.toml"


@lru_cache(maxsize=8)
def _load_engines(path: str) -> dict:
    try:
        raw = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise InputError(f"{path}: cannot read the engine profiles ({exc})") from None
    out = {}
    for name, sec in raw.items():
        prof = {}
        for k, v in sec.items():
            if isinstance(v, dict):
                if "value" not in v or "source" not in v:
                    raise InputError(f"{path}: [{name}] {k} needs value and source")
                prof[k] = v["value"]
            else:
                prof[k] = v
        out[name] = prof
    return out


def engine_profiles(path: str | Path | None = None) -> dict:
    """Every engine profile of ``engines.toml`` (or ``path``): name -> constants."""
    return _load_engines(str(path or _engines_file()))


def engine_profile(name: str, overrides: dict | None = None) -> dict:
    profs = engine_profiles()
    if name not in profs:
        raise InputError(f"unknown engine profile {name!r}; known: {', '.join(profs)}")
    out = dict(profs[name])
    out.update(overrides or {})
    return out


#: how a system's GPUs reach each other over their direct link class (``p2p_link``):
#: 0 not at all (PCIe only, or one GPU), 1 a switch (NVSwitch: every pair at the GPU's whole
#: link bandwidth), 2 a full mesh (each pair its share of the links), 3 bridged pairs
#: (only the two GPUs of a bridge)
P2P_LINKS = {"switched": 1, "mesh": 2, "bridged": 3}


@lru_cache(maxsize=256)
def _target(name: str) -> dict:
    """A system or GPU name -> gpu key, collective system, GPUs per node, GPUs at most."""
    from tsbatch.collectives.systems import get_system
    from tsbatch.hw import UnknownHardwareError, get_hw

    try:
        s = get_system(name)
        hw = get_hw(s.gpu)
        return {"gpu": hw.key, "comm_system": s.key, "gpus_per_node": s.gpus_per_node,
                "max_gpus": s.max_gpus,
                "comm_launch_us": float(s.calibration.get("launch_overhead_us", 0.0)),
                "p2p_link": P2P_LINKS.get(s.nvlink.topology, 0) if s.nvlink is not None else 0}
    except InputError:
        pass
    try:
        hw = get_hw(name)
    except UnknownHardwareError:
        from tsbatch.collectives.systems import list_systems
        from tsbatch.hw import list_hw

        raise InputError(f"column 'system': unknown system or GPU {name!r}; systems: "
                         f"{', '.join(list_systems())}; GPUs: {', '.join(list_hw())}") from None
    return {"gpu": hw.key, "comm_system": "", "gpus_per_node": 1, "max_gpus": 1,
            "comm_launch_us": 0.0, "p2p_link": 0}


#: model fields carried as columns
MODEL_FIELDS = ("kind", "hidden", "layers", "heads", "kv_heads", "head_dim", "v_head_dim",
                "intermediate", "vocab", "qk_norm", "sliding_window", "experts", "top_k",
                "moe_intermediate", "shared_intermediate", "dense_layers", "q_lora_rank",
                "kv_lora_rank", "qk_nope_dim", "qk_rope_dim", "max_positions")


def check_table(df) -> pl.DataFrame:
    """The deployment table with defaults filled and types checked (InputError otherwise)."""
    from tsbatch.boundary.schema import to_polars

    if isinstance(df, dict):
        df = pl.DataFrame(df)
    df = to_polars(df)
    if df.height == 0:
        raise InputError("the deployment table has no rows")
    fill = []
    for c, (typ, default, _doc) in DEPLOYMENT_COLUMNS.items():
        if c not in df.columns:
            if default is None:
                raise InputError(f"column {c!r} is missing ({_doc}); deployment columns: "
                                 f"{', '.join(DEPLOYMENT_COLUMNS)}")
            fill.append(pl.lit(default, dtype=typ).alias(c))
            continue
        got = df.schema[c]
        if typ == pl.Int64 and not got.is_integer():
            raise InputError(f"column {c!r} must be integers, got {got}")
        if typ == pl.String and got != pl.String:
            raise InputError(f"column {c!r} must be strings, got {got}")
        if df[c].null_count():
            if default is None:
                raise InputError(f"column {c!r} has a null (row {df[c].is_null().arg_max()})")
            fill.append(pl.col(c).fill_null(default).cast(typ))
        else:
            fill.append(pl.col(c).cast(typ))
    df = df.with_columns(fill)
    for c in _POSITIVE:
        bad = df[c] <= 0
        if bad.any():
            i = int(bad.arg_max())
            raise InputError(f"column {c!r} must be positive, got {df[c][i]} (row {i})")
    if (df["chunk_tokens"] < 0).any():
        raise InputError("column 'chunk_tokens' must be 0 (the engine's) or positive")
    rms = df["prompt_len_rms"]
    # a root mean square is at least the mean, and at most the mean x sqrt(batch) (one
    # request holding every token)
    bad = (rms != 0) & ((rms < df["prompt_len"])
                        | (rms.cast(pl.Float64) > df["prompt_len"] * df["batch"].sqrt() + 1))
    if bad.any():
        i = int(bad.arg_max())
        raise InputError(f"column 'prompt_len_rms' must be 0 or between prompt_len and "
                         f"prompt_len x sqrt(batch), got {rms[i]} (row {i}: prompt_len "
                         f"{df['prompt_len'][i]}, batch {df['batch'][i]})")
    for c, ok in (("weights", WEIGHTS), ("engine", engine_profiles())):
        bad = ~df[c].is_in(list(ok))
        if bad.any():
            raise InputError(f"column {c!r}: unknown value {df[c][int(bad.arg_max())]!r}; "
                             f"known: {', '.join(ok)}")
    return df


def resolve(df) -> pl.DataFrame:
    """Deployments checked and joined with their model's and machine's numbers.

    Adds a ``dep`` index, the model fields, ``gpu``, ``comm_system``, ``gpus``,
    the engine constants (``gap_prefill_us`` ...), ``feasible`` and ``infeasible_reason``.
    Python work is per distinct model, system and engine (a few), not per row.
    """
    df = check_table(df).with_row_index("dep").with_columns(pl.col("dep").cast(pl.Int64))
    models = {m: load_model(m) for m in df["model"].unique().to_list()}
    mt = pl.DataFrame([{"model": m, **{("model_kind" if f == "kind" else f): getattr(c, f)
                                       for f in MODEL_FIELDS},
                        "model_params": c.params()} for m, c in models.items()])
    st = pl.DataFrame([{"system": s, **_target(s)} for s in df["system"].unique().to_list()])
    from tsbatch.hw import get_hw

    gpus = st["gpu"].unique().to_list()
    gt = pl.DataFrame({"gpu": gpus,
                       "gpu_mem": [float(get_hw(g).dram_bytes) for g in gpus],
                       "hopper": [get_hw(g).arch == "hopper" for g in gpus],
                       # vLLM's larger default token budget: >= 70 GiB and not an A100
                       "big_budget": [get_hw(g).dram_bytes >= 70 * 2**30
                                      and not g.startswith("a100") for g in gpus],
                       "kernel_launch_us": [get_hw(g).launch_us for g in gpus]})
    engs = df["engine"].unique().to_list()
    keys = ("gemm", "gap_prefill_us", "gap_decode_us", "step_prefill_us", "step_decode_us",
            "chunk_tokens", "chunk_tokens_small", "decode_points", "custom_ar_max_bytes")
    et = pl.DataFrame([{"engine": e, **{("engine_chunk" if k == "chunk_tokens" else k):
                                        engine_profile(e).get(k, 0) for k in keys}}
                       for e in engs])
    df = (df.join(mt, on="model", how="left").join(st, on="system", how="left")
          .join(gt, on="gpu", how="left").join(et, on="engine", how="left"))
    df = df.with_columns(
        pl.when(pl.col("chunk_tokens") > 0).then(pl.col("chunk_tokens"))
        .when(pl.col("big_budget") | (pl.col("chunk_tokens_small") <= 0))
        .then(pl.col("engine_chunk"))
        .otherwise(pl.col("chunk_tokens_small")).alias("chunk_tokens"),
        (pl.col("tp") * pl.col("pp")).alias("gpus_per_replica"),
        (pl.col("tp") * pl.col("pp") * pl.col("dp")).alias("gpus"),
    ).drop("engine_chunk", "chunk_tokens_small", "big_budget")
    return df.with_columns(_feasibility(df)).sort("dep")


def _feasibility(df: pl.DataFrame) -> list[pl.Expr]:
    c = pl.col
    kv_local = pl.max_horizontal(pl.lit(1), c("kv_heads") // c("tp"))
    kv_token_layer = (pl.when(c("model_kind") == "mla").then(c("kv_lora_rank") + c("qk_rope_dim"))
                      .otherwise(2 * kv_local * c("head_dim")) * 2)
    wbytes = pl.when(c("weights") == "fp8").then(1.0).otherwise(2.0)
    weights_gpu = c("model_params").cast(pl.Float64) * wbytes / (c("tp") * c("pp"))
    kv_gpu = (c("batch") * (c("prompt_len") + c("output_len")) * kv_token_layer
              * (c("layers") / c("pp")).ceil()).cast(pl.Float64)
    need = weights_gpu + kv_gpu
    reasons = [
        (c("gpus") > c("max_gpus"),
         pl.format("{} GPUs (tp x pp x dp) but {} holds at most {}", c("gpus"), c("system"),
                   c("max_gpus"))),
        (c("heads") % c("tp") != 0,
         pl.format("{} attention heads are not divisible by tp {}", c("heads"), c("tp"))),
        ((c("experts") == 0) & (c("ep") > 1), pl.lit("ep > 1 on a model without experts")),
        ((c("experts") > 0) & (c("experts") % c("ep") != 0),
         pl.format("{} experts are not divisible by ep {}", c("experts"), c("ep"))),
        ((c("ep") > 1) & (c("ep") != c("tp") * c("dp")),
         pl.format("ep {} is neither 1 nor tp x dp = {} (vLLM's expert parallelism spans the "
                   "tensor- and data-parallel ranks)", c("ep"), c("tp") * c("dp"))),
        (c("pp") > c("layers"), pl.lit("more pipeline stages than layers")),
        ((c("max_positions") > 0) & (c("prompt_len") + c("output_len") > c("max_positions")),
         pl.format("prompt + output = {} tokens, over the model's max_position_embeddings {}",
                   c("prompt_len") + c("output_len"), c("max_positions"))),
        (need > MEMORY_FRACTION * c("gpu_mem"),
         pl.format("weights + KV cache need {} GiB per GPU, over {} of {} GiB",
                   (need / 2**30).round(1), pl.lit(MEMORY_FRACTION),
                   (c("gpu_mem") / 2**30).round(0))),
    ]
    reason = pl.lit("")
    for cond, text in reversed(reasons):
        reason = pl.when(cond).then(text).otherwise(reason)
    return [(reason == "").alias("feasible"), reason.alias("infeasible_reason"),
            (need / 2**30).alias("mem_gib_per_gpu")]
