"""Prune Triton autotune configurations with tsbatch's predictions.

::

    import triton
    from tsbatch.front.triton_adapter import early_config_prune

    @triton.autotune(configs=[triton.Config({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64,
                                             "GROUP_M": 8}, num_stages=3, num_warps=8), ...],
                     key=["M", "N", "K"],
                     prune_configs_by={"early_config_prune": early_config_prune(hw="h100")})
    @triton.jit
    def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, ...): ...

Triton calls the returned function with the configuration list and the
kernel's named arguments (``fn(configs, named_args, **kwargs)``): its
``Autotuner`` passes the arguments given by position, named after the
kernel's parameters, as ``named_args``, and the arguments given by keyword
(with ``grid`` and ``warmup``) as ``kwargs``. It returns the predicted-best
``top`` fraction of the configurations, fastest first, for the problem at
hand. Nothing here imports Triton: configurations are read through their
``kwargs``, ``num_warps``, ``num_stages`` and ``num_ctas`` attributes.
Tested against Triton 3.9.0 (tests/test_triton_real.py: a real
``@triton.jit`` matmul, ``triton.Config`` objects and ``Autotuner.run``).

Problem sizes
    Looked up in ``named_args`` (then in ``kwargs``, for arguments given by
    keyword) under ``key_map``'s
    names when given (``{"m": "M", "n": "N", "k": "K"}``), else under the
    first present of ``M``/``m``/``SIZE_M``/``size_m`` (likewise for N, K).

Element type
    ``dtype=`` when given; else the ``.dtype`` of the argument named
    ``dtype_from``; else of the first argument that has a ``.dtype`` (those
    given by position first, then those given by keyword).
    ``torch.float16``/``fp16``/``half`` -> float16, ``torch.bfloat16``/``bf16``
    -> bfloat16, ``torch.float32``/``fp32``/``float`` -> float32, any
    ``float8*``/``fp8*`` -> float8 (Triton's own ``tl.float16`` is ``fp16``,
    ``tl.float8e4nv`` is ``fp8e4nv``; numpy's ``float16`` is read too).

Configuration keys (in ``Config.kwargs``; ``config_map`` overrides)
    ``block_m``: ``BLOCK_M``, ``BLOCK_SIZE_M``, ``BM``, ``block_m``
    (likewise N and K); ``group_m``: ``GROUP_M``, ``GROUP_SIZE_M``,
    ``group_m`` (default 8); ``split_k``: ``SPLIT_K``, ``split_k``
    (default 1). ``num_warps`` and ``num_stages`` come from the attributes
    (Triton's defaults 4 and 3 when ``None``). Configurations without all
    three tile sizes cannot be judged, nor can those of a thread-block
    cluster (``num_ctas`` above 1: the model predicts one CTA per tile):
    they are kept, after the ranked ones, in their input order. ``maxnreg``
    is not read (the register estimate is the model's own).
"""

from __future__ import annotations

from typing import Callable

from tsbatch.errors import InputError
from tsbatch.hw import HwSpec
from tsbatch.engine.prune import NoFeasibleConfigError, Pruner

__all__ = ["early_config_prune", "config_to_dict", "dtype_name", "CONFIG_NAMES", "SIZE_NAMES"]

#: accepted ``Config.kwargs`` spellings per tsbatch configuration column
CONFIG_NAMES = {
    "block_m": ("BLOCK_M", "BLOCK_SIZE_M", "BM", "block_m"),
    "block_n": ("BLOCK_N", "BLOCK_SIZE_N", "BN", "block_n"),
    "block_k": ("BLOCK_K", "BLOCK_SIZE_K", "BK", "block_k"),
    "group_m": ("GROUP_M", "GROUP_SIZE_M", "group_m"),
    "split_k": ("SPLIT_K", "split_k"),
}
#: argument names tried for the problem sizes when no ``key_map`` is given
SIZE_NAMES = {
    "m": ("M", "m", "SIZE_M", "size_m"),
    "n": ("N", "n", "SIZE_N", "size_n"),
    "k": ("K", "k", "SIZE_K", "size_k"),
}
_TRITON_DEFAULT_WARPS = 4
_TRITON_DEFAULT_STAGES = 3

_DTYPE_ALIASES = {
    "float16": "float16", "half": "float16", "fp16": "float16", "f16": "float16",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "float32": "float32", "float": "float32", "fp32": "float32", "f32": "float32",
    "tf32": "float32",
}


def dtype_name(dtype) -> str:
    """``torch.float16`` (or its text, or a Triton dtype name) -> ``'float16'``."""
    text = str(dtype).strip().lower()
    for prefix in ("torch.", "triton.language.", "tl.", "numpy.", "np."):
        if text.startswith(prefix):
            text = text[len(prefix):]
    if text in _DTYPE_ALIASES:
        return _DTYPE_ALIASES[text]
    if text.startswith(("float8", "fp8")):
        return "float8"
    raise InputError(f"element type {dtype!r} is not supported; use float16, bfloat16, "
                     f"float32 or a float8 type")


def config_to_dict(config, config_map: dict | None = None) -> dict | None:
    """tsbatch columns of one ``triton.Config``; ``None`` if it cannot be judged
    (it lacks a tile size, or runs as a cluster of ``num_ctas`` > 1 CTAs)."""
    kw = getattr(config, "kwargs", None) or {}
    if (getattr(config, "num_ctas", None) or 1) != 1:
        return None
    out = {}
    for col, names in CONFIG_NAMES.items():
        if config_map and col in config_map:
            names = (config_map[col],)
        for name in names:
            if name in kw:
                out[col] = kw[name]
                break
    if not all(c in out for c in ("block_m", "block_n", "block_k")):
        return None
    warps = getattr(config, "num_warps", None)
    stages = getattr(config, "num_stages", None)
    out["num_warps"] = _TRITON_DEFAULT_WARPS if warps is None else warps
    out["num_stages"] = _TRITON_DEFAULT_STAGES if stages is None else stages
    return out


def _size(name: str, named_args: dict, kwargs: dict, key_map: dict | None) -> int:
    tried = (key_map[name],) if key_map and name in key_map else SIZE_NAMES[name]
    for arg in tried:
        for src in (named_args, kwargs):
            if arg in src and src[arg] is not None:
                try:
                    return int(src[arg])
                except (TypeError, ValueError):
                    raise InputError(f"kernel argument {arg!r} (problem size {name}) is not an "
                                     f"integer: {src[arg]!r}") from None
    raise InputError(f"problem size {name} not found among the kernel arguments "
                     f"(tried {', '.join(map(repr, tried))}; arguments: "
                     f"{', '.join(map(repr, named_args))}); pass key_map="
                     f"{{'{name}': '<argument name>'}}")


def _dtype(named_args: dict, kwargs: dict, dtype, dtype_from: str | None) -> str:
    if dtype is not None:
        return dtype_name(dtype)
    if dtype_from is not None:
        src = named_args if dtype_from in named_args else kwargs
        if dtype_from not in src:
            raise InputError(f"dtype_from={dtype_from!r} is not a kernel argument "
                             f"(arguments: {', '.join(map(repr, {**named_args, **kwargs}))})")
        dt = getattr(src[dtype_from], "dtype", None)
        if dt is None:
            raise InputError(f"kernel argument {dtype_from!r} has no .dtype")
        return dtype_name(dt)
    for value in (*named_args.values(), *kwargs.values()):
        dt = getattr(value, "dtype", None)
        if dt is not None:
            return dtype_name(dt)
    raise InputError("no kernel argument has a .dtype; pass dtype='float16' (or "
                     "dtype_from='<tensor argument>') to early_config_prune")


def early_config_prune(hw: str | HwSpec = "h100", top: float = 0.05, dtype_from: str | None = None,
                       *, dtype=None, key_map: dict | None = None,
                       config_map: dict | None = None, workload: dict | None = None,
                       raster: str = "grouped", on_infeasible: str = "raise",
                       pruner: Pruner | None = None) -> Callable:
    """A function for ``triton.autotune(prune_configs_by={"early_config_prune": ...})``.

    Parameters
    ----------
    hw : GPU name or spec the kernel runs on.
    top : fraction of the judged configurations kept (at least one).
    dtype_from : name of the tensor argument whose ``.dtype`` is the input type.
    dtype : explicit input type (wins over ``dtype_from``).
    key_map : ``{'m': 'M', 'n': 'N', 'k': 'K'}``-style argument names of the sizes.
    config_map : ``{'block_m': 'TILE_M', ...}`` overrides of :data:`CONFIG_NAMES`.
    workload : fixed extra workload keys (``tf32``, ``a_row_major``, ``b_row_major``).
    raster : launch order of the kernel (Triton's grouped matmul: ``grouped``).
    on_infeasible : ``'raise'`` (default) an :class:`~tsbatch.errors.InputError`
        when no judged configuration can run on ``hw``, or ``'keep'`` them all.
    pruner : share a :class:`~tsbatch.engine.prune.Pruner` (and its cache).
    """
    if on_infeasible not in ("raise", "keep"):
        raise InputError(f"on_infeasible must be 'raise' or 'keep', got {on_infeasible!r}")
    pr = pruner if pruner is not None else Pruner(hw, top)
    extra = dict(workload or {})
    bad = sorted(set(extra) - {"tf32", "a_row_major", "b_row_major"})
    if bad:
        raise InputError(f"workload= takes tf32, a_row_major, b_row_major; got {', '.join(bad)}")
    if dtype is not None:
        dtype_name(dtype)  # fail early

    def fn(configs, named_args, **kwargs):
        configs = list(configs)
        named = dict(named_args or {})
        wl = {x: _size(x, named, kwargs, key_map) for x in ("m", "n", "k")}
        wl["dtype"] = _dtype(named, kwargs, dtype, dtype_from)
        wl.update(extra)
        judged, rows, unjudged = [], [], []
        for c in configs:
            d = config_to_dict(c, config_map)
            if d is None:
                unjudged.append(c)
            else:
                d["raster"] = raster
                judged.append(c)
                rows.append(d)
        if not rows:
            return configs
        try:
            res = pr.prune(wl, rows, top=top)
        except NoFeasibleConfigError:
            if on_infeasible == "keep":
                return configs
            raise
        return [judged[i] for i in res.indices] + unjudged

    fn.pruner = pr  # type: ignore[attr-defined]
    return fn
