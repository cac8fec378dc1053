"""tsbatch: predict how fast tiled GPU kernels run, for millions of schedules at a time.

From Python, one import (tables in memory; see :mod:`tsbatch.front.api`)::

    import tsbatch

    res = tsbatch.evaluate_table(candidates, hw="h100")      # polars or pyarrow in, same out
    best = tsbatch.rank_table(candidates, hw="h100", top="5%")
    kept = tsbatch.prune_configs(workload, configs, hw="h100", top=0.05)
    print(tsbatch.explain_config(config, hw="h100"))
    tsbatch.list_gpus(); tsbatch.list_families()

Importing the package is cheap: numba, numpy and polars are imported by the
first call that needs them. The API's functions (:mod:`tsbatch.front.api`),
:class:`Pruner`, :class:`PruneResult`, :class:`NoFeasibleConfigError` and
:func:`early_config_prune` (the Triton adapter) are loaded when first used (the
command line and the engine's modules import the package, not the API).
"""

from __future__ import annotations

__version__ = "0.1.0"
MODEL_VERSION = "tilesight-gemm-1"

from tsbatch.errors import InputError  # noqa: E402
from tsbatch.hw import HwSpec, get_hw, list_hw  # noqa: E402

#: names loaded on first use (the engine's import numba): name -> module
_LAZY = {
    **dict.fromkeys(("Explanation", "evaluate_table", "explain_config", "list_families",
                     "list_gpus", "prune_configs", "rank_table"), "tsbatch.front.api"),
    "Pruner": "tsbatch.engine.prune",
    "PruneResult": "tsbatch.engine.prune",
    "NoFeasibleConfigError": "tsbatch.engine.prune",
    "early_config_prune": "tsbatch.front.triton_adapter",
}

__all__ = [
    "__version__", "MODEL_VERSION",
    # tables
    "evaluate_table", "rank_table",
    # one workload's configurations, one configuration
    "prune_configs", "Pruner", "PruneResult", "NoFeasibleConfigError", "early_config_prune",
    "explain_config", "Explanation",
    # catalogues
    "list_gpus", "list_families", "get_hw", "list_hw", "HwSpec",
    "InputError",
]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'tsbatch' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
