"""End-to-end LLM inference from the kernel families (issue 34; docs/serving.md).

    from tsbatch.serving import predict, explain_deployment, sweep_deployments
    res = predict({"model": ["meta-llama/Llama-3.1-8B"], "system": ["h100"], "batch": [8],
                   "prompt_len": [1024], "output_len": [128]})

Model graph -> ops (``ops.py``) -> family rows evaluated once per family (``predict.py``)
-> composed step times with the engine profile's constants (``engines.toml``). Nothing
here is imported until used.
"""

from __future__ import annotations

__all__ = ["predict", "explain_deployment", "sweep_deployments", "rank_deployments",
           "load_sweep", "load_model", "list_models", "engine_profiles"]

_WHERE = {"predict": "tsbatch.serving.predict", "explain_deployment": "tsbatch.serving.api",
          "sweep_deployments": "tsbatch.serving.api", "rank_deployments": "tsbatch.serving.api",
          "load_sweep": "tsbatch.serving.api", "load_model": "tsbatch.serving.models",
          "list_models": "tsbatch.serving.models", "engine_profiles": "tsbatch.serving.deploy"}


def __getattr__(name):
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'tsbatch.serving' has no attribute {name!r}")
