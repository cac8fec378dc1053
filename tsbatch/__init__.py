"""tsbatch: predict how fast tiled GPU kernels run, for millions of schedules at a time."""

from __future__ import annotations

__version__ = "0.1.0"
MODEL_VERSION = "tilesight-gemm-1"

from tsbatch.errors import InputError
from tsbatch.hw import HwSpec, get_hw, list_hw

__all__ = ["__version__", "MODEL_VERSION", "InputError", "HwSpec", "get_hw", "list_hw"]
