"""Models as data: a Hugging Face ``config.json`` read into the few numbers the step needs.

Supported architectures (``architectures[0]`` of the file):

- dense: ``LlamaForCausalLM``, ``MistralForCausalLM``, ``Qwen2ForCausalLM``,
  ``Qwen3ForCausalLM`` (QK-norm: an RMSNorm over each head of q and k);
- MoE: ``MixtralForCausalLM`` (``num_local_experts``), ``Qwen3MoeForCausalLM``
  (``num_experts``, ``moe_intermediate_size``, ``decoder_sparse_step``,
  ``mlp_only_layers``);
- MLA: ``DeepseekV2ForCausalLM``, ``DeepseekV3ForCausalLM`` (``kv_lora_rank``,
  ``q_lora_rank`` or none, ``qk_nope_head_dim``, ``qk_rope_head_dim``,
  ``v_head_dim``; ``n_routed_experts`` plus ``n_shared_experts`` shared experts;
  the first ``first_k_dense_replace`` layers dense).

The configurations of common open models ship in ``tsbatch/serving/models/``
(``models/SOURCES.md`` says where each came from); :func:`load_model` takes
their Hugging Face id (``meta-llama/Llama-3.1-70B``), a short alias
(``llama-3.1-70b``) or any path to a ``config.json``. A field the architecture
needs that is missing, or of the wrong type, is one :class:`InputError` naming
the field and the file.
"""

from __future__ import annotations

import dataclasses
import json
from functools import lru_cache
from pathlib import Path

from tsbatch.errors import InputError

__all__ = ["ModelConfig", "load_model", "list_models", "models_dir", "ARCHITECTURES"]

#: architecture -> kind (dense, moe, mla)
ARCHITECTURES = {
    "LlamaForCausalLM": "dense",
    "MistralForCausalLM": "dense",
    "Qwen2ForCausalLM": "dense",
    "Qwen3ForCausalLM": "dense",
    "MixtralForCausalLM": "moe",
    "Qwen3MoeForCausalLM": "moe",
    "DeepseekV2ForCausalLM": "mla",
    "DeepseekV3ForCausalLM": "mla",
}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """What one step of a decoder needs to know of a model (per layer shapes)."""

    name: str                 #: Hugging Face id or file stem
    source: str               #: the file it was read from
    architecture: str
    kind: str                 #: dense, moe or mla
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int             #: q/k head dim (MLA: nope + rope)
    v_head_dim: int
    intermediate: int         #: dense FFN width (MLA/MoE models: of the dense layers)
    vocab: int
    qk_norm: bool = False
    sliding_window: int = 0   #: 0: full attention
    attention_bias: bool = False
    experts: int = 0          #: routed experts (0: dense)
    top_k: int = 0
    moe_intermediate: int = 0
    shared_experts: int = 0   #: shared experts (their FFN = shared_experts x moe_intermediate)
    shared_intermediate: int = 0
    dense_layers: int = 0     #: layers with a dense MLP in an MoE model
    q_lora_rank: int = 0      #: MLA: 0 = q projected directly
    kv_lora_rank: int = 0
    qk_nope_dim: int = 0
    qk_rope_dim: int = 0
    tie_embeddings: bool = False
    max_positions: int = 0    #: max_position_embeddings (0: not given)

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers if self.experts else 0

    def params(self) -> int:
        """Parameter count (weights the step reads), embedding and LM head included."""
        h = self.hidden
        if self.kind == "mla":
            q = (h * self.q_lora_rank + self.q_lora_rank * self.heads * self.head_dim
                 if self.q_lora_rank else h * self.heads * self.head_dim)
            attn = (q + h * (self.kv_lora_rank + self.qk_rope_dim)
                    + self.kv_lora_rank * self.heads * (self.qk_nope_dim + self.v_head_dim)
                    + self.heads * self.v_head_dim * h)
        else:
            attn = h * (self.heads + 2 * self.kv_heads) * self.head_dim + \
                self.heads * self.head_dim * h
        dense_mlp = 3 * h * self.intermediate
        moe_mlp = 3 * h * self.moe_intermediate * self.experts + 3 * h * self.shared_intermediate \
            + h * self.experts
        n_dense = self.layers - self.moe_layers
        body = self.layers * attn + n_dense * dense_mlp + self.moe_layers * moe_mlp
        emb = self.vocab * h * (1 if self.tie_embeddings else 2)
        return int(body + emb)


def models_dir() -> Path:
    return Path(__file__).resolve().parent / "models"


def _stem(model_id: str) -> str:
    return model_id.replace("/", "--")


def _aliases() -> dict[str, Path]:
    out = {}
    for p in sorted(models_dir().glob("*.json")):
        hf = p.stem.replace("--", "/")
        for a in (p.stem, hf, hf.split("/")[-1], hf.lower(), hf.split("/")[-1].lower()):
            out.setdefault(a, p)
    return out


def list_models() -> list[str]:
    """Hugging Face ids of the shipped configurations."""
    return [p.stem.replace("--", "/") for p in sorted(models_dir().glob("*.json"))]


def _field(cfg: dict, key: str, path, kind=int, default=dataclasses.MISSING, positive=True):
    if key not in cfg or cfg[key] is None:
        if default is dataclasses.MISSING:
            raise InputError(f"{path}: field '{key}' is missing (needed by "
                             f"{cfg.get('architectures', ['?'])[0]})")
        return default
    v = cfg[key]
    if kind is int:
        if isinstance(v, bool) or not isinstance(v, int) or (positive and v <= 0):
            raise InputError(f"{path}: field '{key}' must be a positive integer, got {v!r}")
    elif kind is bool and not isinstance(v, bool):
        raise InputError(f"{path}: field '{key}' must be true or false, got {v!r}")
    return v


def parse_config(cfg: dict, path: str, name: str | None = None) -> ModelConfig:
    """A :class:`ModelConfig` from the dict of a ``config.json`` (``path`` names it in errors)."""
    if not isinstance(cfg, dict):
        raise InputError(f"{path}: not a JSON object")
    archs = cfg.get("architectures")
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        raise InputError(f"{path}: field 'architectures' is missing (a list naming the model "
                         f"class, e.g. [\"LlamaForCausalLM\"])")
    arch = archs[0]
    if arch not in ARCHITECTURES:
        raise InputError(f"{path}: field 'architectures' names {arch!r}, not supported; "
                         f"supported: {', '.join(ARCHITECTURES)}")
    kind = ARCHITECTURES[arch]
    f = lambda k, **kw: _field(cfg, k, path, **kw)  # noqa: E731
    hidden = f("hidden_size")
    heads = f("num_attention_heads")
    layers = f("num_hidden_layers")
    kv = f("num_key_value_heads", default=heads)
    vocab = f("vocab_size")
    tie = bool(f("tie_word_embeddings", kind=bool, default=False))
    sw = cfg.get("sliding_window")
    use_sw = cfg.get("use_sliding_window", True)
    window = int(sw) if isinstance(sw, int) and not isinstance(sw, bool) and sw > 0 and use_sw \
        else 0
    common = dict(name=name or Path(path).parent.name, source=str(path), architecture=arch,
                  kind=kind, hidden=hidden, layers=layers, heads=heads, vocab=vocab,
                  tie_embeddings=tie, sliding_window=window,
                  max_positions=f("max_position_embeddings", default=0, positive=False))
    if kind == "mla":
        nope = f("qk_nope_head_dim")
        rope = f("qk_rope_head_dim")
        v = f("v_head_dim")
        experts = f("n_routed_experts", default=0, positive=False)
        shared = f("n_shared_experts", default=0, positive=False)
        moe_i = f("moe_intermediate_size") if experts else 0
        freq = f("moe_layer_freq", default=1)
        first = f("first_k_dense_replace", default=0, positive=False)
        if freq != 1:
            raise InputError(f"{path}: field 'moe_layer_freq' is {freq}; only 1 (every layer "
                             f"after first_k_dense_replace is MoE) is supported")
        return ModelConfig(**common, kv_heads=heads, head_dim=nope + rope, v_head_dim=v,
                           intermediate=f("intermediate_size"), experts=experts,
                           top_k=f("num_experts_per_tok") if experts else 0,
                           moe_intermediate=moe_i, shared_experts=shared,
                           shared_intermediate=shared * moe_i,
                           dense_layers=min(first, layers) if experts else layers,
                           q_lora_rank=f("q_lora_rank", default=0, positive=False),
                           kv_lora_rank=f("kv_lora_rank"), qk_nope_dim=nope, qk_rope_dim=rope)
    hd = f("head_dim", default=None)
    if hd is None:
        if hidden % heads:
            raise InputError(f"{path}: field 'head_dim' is missing and hidden_size {hidden} is "
                             f"not a multiple of num_attention_heads {heads}")
        hd = hidden // heads
    qk_norm = arch in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM")
    bias = arch == "Qwen2ForCausalLM" or bool(cfg.get("attention_bias", False))
    base = dict(**common, kv_heads=kv, head_dim=hd, v_head_dim=hd, qk_norm=qk_norm,
                attention_bias=bias)
    if kind == "dense":
        return ModelConfig(**base, intermediate=f("intermediate_size"))
    if arch == "MixtralForCausalLM":
        return ModelConfig(**base, intermediate=f("intermediate_size"),
                           experts=f("num_local_experts"), top_k=f("num_experts_per_tok"),
                           moe_intermediate=f("intermediate_size"))
    # Qwen3-MoE
    step = f("decoder_sparse_step", default=1)
    only = cfg.get("mlp_only_layers") or []
    if step != 1 or only:
        raise InputError(f"{path}: fields 'decoder_sparse_step'/'mlp_only_layers' give dense "
                         f"layers between MoE ones; only every layer MoE is supported")
    return ModelConfig(**base, intermediate=f("intermediate_size", default=0, positive=False),
                       experts=f("num_experts"), top_k=f("num_experts_per_tok"),
                       moe_intermediate=f("moe_intermediate_size"))


@lru_cache(maxsize=256)
def _load_path(path: str, name: str) -> ModelConfig:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise InputError(f"{path}: cannot read the model config ({exc.strerror})") from None
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: not valid JSON ({exc.msg}, line {exc.lineno})") from None
    return parse_config(cfg, path, name)


def load_model(model: "str | Path | ModelConfig") -> ModelConfig:
    """A model by Hugging Face id, alias, or path to a ``config.json`` (or a directory holding one)."""
    if isinstance(model, ModelConfig):
        return model
    s = str(model)
    hit = _aliases().get(s) or _aliases().get(s.lower())
    if hit is not None:
        return _load_path(str(hit), hit.stem.replace("--", "/"))
    p = Path(s)
    if p.is_dir():
        p = p / "config.json"
    if p.suffix == ".json" or p.exists():
        if not p.exists():
            raise InputError(f"{p}: no such model config file")
        return _load_path(str(p), p.parent.name if p.name == "config.json" else p.stem)
    raise InputError(f"unknown model {s!r}; shipped: {', '.join(list_models())} "
                     f"(or a path to a config.json)")
