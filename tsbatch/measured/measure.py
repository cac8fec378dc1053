"""``tsbatch measure`` and ``tsbatch calibrate``: GPU microbenchmarks and the hw files they calibrate.

``tsbatch measure --out DIR`` runs on a CUDA machine with torch and triton
(TileSight §5, "calibrated once per architecture with small microbenchmarks:
bandwidth sweeps over working-set sizes, as in Figure 2, and short
matrix-multiply probes") and writes three Parquet files:

``bandwidth.parquet``
    Read bandwidth versus working-set size (geometric, 1 MiB .. 4x L2): a
    looped read kernel re-reads the working set until about 1 GiB has been
    read, timed with CUDA events. Columns ``bytes, gbps, gbps_min,
    gbps_max, time_ms, passes, repeats, kernel``. The plateaus and cliffs of
    this curve are TileSight Fig. 2.
``matmul.parquet``
    Large square ``torch.matmul`` probes per dtype: ``dtype, tf32, m, n, k,
    time_ms, tflops, repeats``.
``gemm.parquet``
    A standard Triton grouped-launch matmul timed over an explicit grid of
    tile configurations, ``group_m`` and launch orders (``raster``) and
    problem shapes, plus ``torch.matmul`` (``backend == 'cublas'``) for each
    problem, in exactly the measured schema of ``../shared/data/gemm``
    (:func:`gemm_schema`) plus a ``raster`` column. Configurations that do
    not run (out of shared memory or registers) have ``time_ms = inf``.

Each file carries provenance metadata (``tsbatch.device_name``,
``tsbatch.gpu``, ``tsbatch.driver``, ``tsbatch.torch_version``,
``tsbatch.triton_version``, ``tsbatch.date``, ...; read it with
:func:`tsbatch.boundary.io.read_metadata`).

``tsbatch calibrate DIR --hw NAME`` (pure data shaping, no GPU; see
:mod:`tsbatch.measured.calibrate`) turns those files into the ``[measured]`` and
``[calibration]`` values of ``hw/NAME.toml``.

Everything that shapes data (grids, working-set sizes, row builders, device
name mapping, metadata) is a pure function tested on the CPU; only
:func:`run_measure` and the helpers it calls need the GPU.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import importlib.util
import itertools
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from tsbatch.errors import InputError

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

__all__ = [
    "add_parser",
    "gemm_schema",
    "GEMM_COLUMNS",
    "RASTERS",
    "DTYPES",
    "GemmConfig",
    "GemmGrid",
    "default_grid",
    "load_grid",
    "parse_dtypes",
    "working_set_sizes",
    "gpu_key",
    "gemm_rows",
    "Problem",
    "grid_problems",
    "gemm_record",
    "kernel_tile_order",
    "bandwidth_frame",
    "matmul_frame",
    "measurement_metadata",
    "require_gpu",
    "run_measure",
    "warm_jobs",
    "warm_compile",
    "kernel_resources",
    "default_compile_workers",
    "KERNEL_SOURCE",
    "SOURCE",
]

#: ``source`` column of every row ``tsbatch measure`` writes
SOURCE = "tsbatch measure"

#: launch orders the Triton kernel implements (``RASTER`` constexpr 0, 1, 2);
#: names as in :mod:`tsbatch.kernels.order` / the ``raster`` candidate column
RASTERS = ("grouped", "row", "col")

#: input dtypes of the probes; float32 runs on tensor cores as TF32
DTYPES = ("float16", "bfloat16", "float32")

MIB = 1 << 20


def gemm_schema() -> dict:
    """The measured GEMM schema of ``../shared/data/gemm/*_triton_mm.parquet``
    (column order and polars dtypes) followed by ``raster`` and the compiled
    Triton kernel's registers per thread, register spills and shared memory
    (``num_regs, num_spills, shared_bytes``; null for library rows and kernels
    that did not build): the columns of ``gemm.parquet``. A function so that importing this module (the CLI does,
    always) does not import polars."""
    import polars as pl

    return {
        "source": pl.String, "gpu": pl.String,
        "m": pl.Int64, "n": pl.Int64, "k": pl.Int64,
        "dtype": pl.String, "a_row_major": pl.Boolean, "b_row_major": pl.Boolean,
        "tf32": pl.Boolean, "backend": pl.String,
        "block_m": pl.Int32, "block_n": pl.Int32, "block_k": pl.Int32,
        "num_stages": pl.Int32, "num_warps": pl.Int32, "group_m": pl.Int32,
        "time_ms": pl.Float64,
        "raster": pl.String,
        "num_regs": pl.Int32, "num_spills": pl.Int32, "shared_bytes": pl.Int64,
    }


#: column names of :func:`gemm_schema`, in order
GEMM_COLUMNS: tuple[str, ...] = (
    "source", "gpu", "m", "n", "k", "dtype", "a_row_major", "b_row_major", "tf32", "backend",
    "block_m", "block_n", "block_k", "num_stages", "num_warps", "group_m", "time_ms", "raster",
    "num_regs", "num_spills", "shared_bytes",
)


# ============================================================================ grids
@dataclass(frozen=True)
class GemmConfig:
    """One Triton launch configuration: tile, pipeline and launch order."""

    block_m: int
    block_n: int
    block_k: int
    num_stages: int
    num_warps: int
    group_m: int = 8
    raster: str = "grouped"

    def smem_bytes(self, elem_bytes: int) -> int:
        """Shared memory of the A and B ring buffers (Triton's dominant allocation)."""
        return self.num_stages * (self.block_m + self.block_n) * self.block_k * elem_bytes


@dataclass(frozen=True)
class GemmGrid:
    """Problems and configurations ``tsbatch measure`` times."""

    shapes: tuple[tuple[int, int, int], ...]
    configs: tuple[GemmConfig, ...]
    layouts: tuple[tuple[bool, bool], ...] = ((True, True),)   # (a_row_major, b_row_major)
    dtypes: tuple[str, ...] | None = None                    # None: the --dtypes default
    name: str = "default"


#: Tile configurations of PyTorch Inductor's mm template (the development
#: data were autotuned over these) plus the large Hopper tiles.
_DEFAULT_TILES = (
    (32, 32, 16, 1, 2), (32, 32, 128, 2, 4), (32, 64, 32, 5, 8), (64, 32, 32, 5, 8),
    (64, 32, 128, 5, 4), (64, 64, 16, 2, 4), (64, 64, 32, 2, 4), (64, 64, 64, 3, 8),
    (64, 64, 128, 5, 4), (64, 128, 32, 3, 4), (64, 128, 32, 4, 8), (64, 128, 64, 3, 4),
    (64, 128, 128, 4, 4), (128, 64, 32, 3, 4), (128, 64, 32, 4, 8), (128, 128, 32, 2, 8),
    (128, 128, 32, 3, 4), (128, 128, 64, 3, 4), (128, 128, 64, 5, 8), (128, 128, 64, 4, 8),
    (128, 256, 64, 3, 8), (256, 128, 64, 3, 8),
)
_QUICK_TILES = (
    (64, 64, 32, 2, 4), (64, 128, 64, 3, 4), (128, 64, 32, 4, 8), (128, 128, 32, 3, 4),
    (128, 128, 64, 4, 8), (128, 256, 64, 3, 8),
)
_DEFAULT_SHAPES = (
    (64, 64, 64), (128, 4096, 4096), (1024, 1024, 1024), (2048, 2048, 2048),
    (4096, 4096, 4096), (8192, 8192, 8192), (4096, 14336, 4096), (16384, 4096, 1024),
    (1024, 8192, 28672),
)
_QUICK_SHAPES = ((64, 64, 64), (512, 4096, 4096), (4096, 4096, 4096), (8192, 8192, 1024))


def _configs(tiles, orders) -> tuple[GemmConfig, ...]:
    return tuple(GemmConfig(bm, bn, bk, ns, nw, g, r)
                 for (bm, bn, bk, ns, nw) in tiles for (r, g) in orders)


def default_grid(quick: bool = False) -> GemmGrid:
    """The built-in grid: Inductor's tiles, grouped (``group_m`` 8) and row launch order."""
    orders = (("grouped", 8), ("row", 1))
    if quick:
        return GemmGrid(_QUICK_SHAPES, _configs(_QUICK_TILES, orders), name="quick")
    return GemmGrid(_DEFAULT_SHAPES, _configs(_DEFAULT_TILES, orders), name="default")


_GRID_KEYS = {"shapes", "dtypes", "block_m", "block_n", "block_k", "num_stages", "num_warps",
              "group_m", "raster", "configs", "a_row_major", "b_row_major"}
_TILE_KEYS = ("block_m", "block_n", "block_k", "num_stages", "num_warps")


def _pos_int(path, what, v) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise InputError(f"{path}: {what} must be a positive integer, got {v!r}")
    return v


def _int_list(path, doc, key, default=None) -> list[int]:
    v = doc.get(key, default)
    if v is None:
        raise InputError(f"{path}: '{key}' is required (a list of positive integers)")
    if not isinstance(v, list) or not v:
        raise InputError(f"{path}: '{key}' must be a non-empty list, got {v!r}")
    return [_pos_int(path, f"'{key}' entry", x) for x in v]


def _bool_list(path, doc, key, default=(True,)) -> list[bool]:
    v = doc.get(key, list(default))
    if not isinstance(v, list) or not v or not all(isinstance(x, bool) for x in v):
        raise InputError(f"{path}: '{key}' must be a non-empty list of true/false, got {v!r}")
    return v


def _raster(path, what, r) -> str:
    if r not in RASTERS:
        raise InputError(f"{path}: {what} {r!r} is not a launch order this kernel has; "
                         f"use one of {', '.join(RASTERS)}")
    return r


def _read_toml(path: Path, what: str, keys) -> dict:
    """The TOML document at ``path``, with only ``keys`` at its top level."""
    try:
        doc = tomllib.loads(path.read_text())
    except OSError as exc:
        raise InputError(f"{path}: cannot read {what} ({exc.strerror})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: invalid TOML ({exc})") from None
    extra = sorted(set(doc) - set(keys))
    if extra:
        raise InputError(f"{path}: unknown keys {extra}; known: {sorted(keys)}")
    return doc


def _problems_of(path: Path, doc: dict, b_row_major=(True,)):
    """A grid file's ``shapes``, optional ``dtypes`` and layouts (``a_row_major`` x
    ``b_row_major``; ``b_row_major`` defaults to ``b_row_major``)."""
    shapes = doc.get("shapes")
    if not isinstance(shapes, list) or not shapes:
        raise InputError(f"{path}: 'shapes' must be a non-empty list of [m, n, k]")
    shp = []
    for s in shapes:
        if not isinstance(s, list) or len(s) != 3:
            raise InputError(f"{path}: each shape must be [m, n, k], got {s!r}")
        shp.append(tuple(_pos_int(path, "shape size", x) for x in s))

    dtypes = doc.get("dtypes")
    if dtypes is not None:
        if not isinstance(dtypes, list) or not dtypes:
            raise InputError(f"{path}: 'dtypes' must be a non-empty list of names")
        dtypes = tuple(_dtype(str(d), str(path)) for d in dtypes)

    layouts = tuple(itertools.product(_bool_list(path, doc, "a_row_major"),
                                      _bool_list(path, doc, "b_row_major", list(b_row_major))))
    return tuple(shp), dtypes, layouts


def load_grid(path: str | Path) -> GemmGrid:
    """Read a GEMM grid TOML file (see ``docs/measure.md``).

    ::

        shapes = [[4096, 4096, 4096], [512, 8192, 4096]]   # [m, n, k], required
        dtypes = ["float16"]                    # optional (--dtypes overrides)
        block_m = [64, 128]                     # the tile grid: every combination
        block_n = [64, 128, 256]
        block_k = [32, 64]
        num_stages = [3, 4]
        num_warps = [4, 8]
        group_m = [8]                           # optional, default [8]
        raster = ["grouped", "row"]             # optional, default both
        a_row_major = [true]                    # optional layouts, default [true]
        b_row_major = [true, false]
        # or an explicit list instead of the tile grid:
        # configs = [{block_m = 128, block_n = 128, block_k = 64, num_stages = 3,
        #             num_warps = 8, group_m = 8, raster = "grouped"}]

    ``group_m`` applies to the grouped order; row and column orders are
    recorded with ``group_m = 1`` (grouped with one row per group is the row
    order).
    """
    path = Path(path)
    doc = _read_toml(path, "GEMM grid", _GRID_KEYS)

    shp, dtypes, layouts = _problems_of(path, doc)

    if "configs" in doc:
        present = sorted(k for k in (*_TILE_KEYS, "group_m", "raster") if k in doc)
        if present:
            raise InputError(f"{path}: give either 'configs' or the tile grid keys, not both "
                             f"(found {present})")
        cfgs = doc["configs"]
        if not isinstance(cfgs, list) or not cfgs:
            raise InputError(f"{path}: 'configs' must be a non-empty list of tables")
        out = []
        for i, c in enumerate(cfgs):
            if not isinstance(c, dict):
                raise InputError(f"{path}: configs[{i}] must be a table")
            bad = sorted(set(c) - {*_TILE_KEYS, "group_m", "raster"})
            if bad:
                raise InputError(f"{path}: configs[{i}] has unknown keys {bad}")
            for k in _TILE_KEYS:
                if k not in c:
                    raise InputError(f"{path}: configs[{i}] lacks '{k}'")
            r = _raster(path, f"configs[{i}] raster", c.get("raster", "grouped"))
            g = _pos_int(path, f"configs[{i}] group_m", c.get("group_m", 8))
            out.append(GemmConfig(*(_pos_int(path, f"configs[{i}] {k}", c[k]) for k in _TILE_KEYS),
                                  group_m=g if r == "grouped" else 1, raster=r))
        configs = tuple(out)
    else:
        lists = [_int_list(path, doc, k) for k in _TILE_KEYS]
        groups = _int_list(path, doc, "group_m", [8])
        rasters = doc.get("raster", ["grouped", "row"])
        if not isinstance(rasters, list) or not rasters:
            raise InputError(f"{path}: 'raster' must be a non-empty list")
        orders: list[tuple[str, int]] = []
        for r in rasters:
            r = _raster(path, "raster", r)
            for g in (groups if r == "grouped" else [1]):
                if (r, g) not in orders:
                    orders.append((r, g))
        configs = _configs(itertools.product(*lists), orders)
    for c in configs:
        for k in ("block_m", "block_n", "block_k"):
            v = getattr(c, k)
            if v & (v - 1) or v < 16:
                raise InputError(f"{path}: {k} = {v}: Triton tiles must be powers of two >= 16")
        if c.num_warps & (c.num_warps - 1):
            raise InputError(f"{path}: num_warps = {c.num_warps} must be a power of two")
    return GemmGrid(tuple(shp), configs, layouts, dtypes, name=str(path))


#: The library part's default problems (``x @ W.T``: A row-major, B = W.T
#: column-major): the decode GEMMs of M <= 64 rows of Llama-3 8B (q/k/v, o,
#: gate/up, down) and of Llama-3 70B at tensor parallel 8, then the library
#: calls of the development data that the model prices worst
#: (docs/gemm_accuracy.md, "The library's small calls, session 10" and "The
#: library's skinny calls, session 11"; 8 x 129792 x 4096 is H100's TF32 stream).
_LIB_ROWS = (1, 2, 4, 8, 16, 32, 64)
_LIB_WEIGHTS = ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336),
                (1280, 8192), (8192, 1024), (7168, 8192), (8192, 3584))
_LIB_DEV = ((2, 10240, 1664), (8, 3968, 3840), (32, 4096, 11264), (64, 1024, 41088),
            (16, 14720, 1408), (1920, 2, 7552), (32, 1280, 1024), (8, 76672, 2),
            (8, 129792, 4096), (15488, 16, 64), (10368, 7, 2048), (10112, 32, 6272),
            (2048, 1280, 3968), (512, 2432, 4096), (1408, 1536, 20), (30592, 256, 8))
_LIB_KEYS = {"shapes", "dtypes", "a_row_major", "b_row_major"}


def default_library_grid(quick: bool = False) -> GemmGrid:
    """The library part's built-in problems (no Triton configurations)."""
    rows = (1, 8, 64) if quick else _LIB_ROWS
    weights = _LIB_WEIGHTS[:4] if quick else _LIB_WEIGHTS
    shapes = tuple((m, n, k) for (n, k) in weights for m in rows) + (() if quick else _LIB_DEV)
    return GemmGrid(shapes, (), ((True, False),), None,
                    name="library-quick" if quick else "library")


def load_library_grid(path: str | Path) -> GemmGrid:
    """Read the library part's problems from a TOML file::

        shapes = [[16, 4096, 4096], [1, 28672, 4096]]   # [m, n, k], required
        dtypes = ["float16", "float32"]                 # optional (--dtypes overrides)
        a_row_major = [true]                            # optional, default [true]
        b_row_major = [false]                           # optional, default [false]: x @ W.T
    """
    path = Path(path)
    doc = _read_toml(path, "library grid", _LIB_KEYS)
    shp, dtypes, layouts = _problems_of(path, doc, b_row_major=(False,))
    return GemmGrid(shp, (), layouts, dtypes, name=str(path))


def library_grid(spec: str | None, quick: bool) -> GemmGrid:
    """``--library-grid``: ``default``, ``quick`` or a TOML file."""
    if spec in (None, "default"):
        return default_library_grid(quick)
    if spec == "quick":
        return default_library_grid(True)
    return load_library_grid(spec)


def _dtype(name: str, where: str = "--dtypes") -> str:
    aliases = {"fp16": "float16", "half": "float16", "bf16": "bfloat16", "fp32": "float32",
               "tf32": "float32", "float": "float32"}
    d = aliases.get(name.strip().lower(), name.strip().lower())
    if d not in DTYPES:
        raise InputError(f"{where}: unknown dtype {name!r}; use {', '.join(DTYPES)}")
    return d


def parse_dtypes(text: str | None, default: Sequence[str] = ("float16", "bfloat16")) -> tuple[str, ...]:
    """``'float16,bf16'`` -> ``('float16', 'bfloat16')``; ``None`` -> the default."""
    if text is None:
        return tuple(default)
    names = [t for t in (s.strip() for s in text.split(",")) if t]
    if not names:
        raise InputError("--dtypes: give at least one dtype (float16, bfloat16, float32)")
    out: list[str] = []
    for n in names:
        d = _dtype(n)
        if d not in out:
            out.append(d)
    return tuple(out)


_PARTS = ("bandwidth", "matmul", "gemm", "library", "layer")
#: the parts a run without ``--only`` measures (``layer``, a model's ops rather than
#: the GPU's, runs when named)
_DEFAULT_PARTS = ("bandwidth", "matmul", "gemm", "library")


def parse_parts(text: str | None) -> tuple[str, ...]:
    if text is None:
        return _DEFAULT_PARTS
    parts = tuple(p.strip() for p in text.split(",") if p.strip())
    bad = [p for p in parts if p not in _PARTS]
    if bad or not parts:
        raise InputError(f"--only: unknown part(s) {bad or [text]}; use {', '.join(_PARTS)}")
    return parts


# ============================================================================ pure helpers
def working_set_sizes(lo_bytes: int, hi_bytes: int, per_octave: int = 4,
                      align: int = 64 * 1024) -> list[int]:
    """Geometric working-set sizes from ``lo`` to at least ``hi``, ``per_octave``
    points per doubling, each rounded to a multiple of ``align`` bytes (the
    read kernel's chunk), strictly increasing."""
    if lo_bytes <= 0 or hi_bytes < lo_bytes or per_octave <= 0 or align <= 0:
        raise InputError(f"working-set range {lo_bytes}..{hi_bytes} ({per_octave}/octave) is empty")
    n = int(math.ceil(per_octave * math.log2(hi_bytes / lo_bytes) - 1e-9))
    out: list[int] = []
    for i in range(n + 1):
        b = lo_bytes * 2.0 ** (i / per_octave)
        b = max(align, int(round(b / align)) * align)
        if not out or b > out[-1]:
            out.append(b)
    return out


#: device-name patterns -> hw keys (first match wins; checked on the lowered name)
_GPU_PATTERNS = (
    (r"h200", "h200"),
    (r"h100.*(pcie|nvl)", None),          # not the SXM part: keep the device's own name
    (r"h100|h800", "h100_sxm"),
    (r"a100|a800", "a100"),
    (r"b200", "b200"),
    (r"rtx pro 6000", "rtx_pro_6000"),
    (r"mi210", "mi210"),
)


def gpu_key(device_name: str) -> str:
    """Map ``torch.cuda.get_device_name()`` to a ``hw/`` key (``'NVIDIA H200'`` -> ``'h200'``).

    Unknown devices (and H100 PCIe/NVL, which ``hw/h100_sxm.toml`` does not
    describe) get their name lowered with non-alphanumerics as ``_``.
    """
    low = device_name.strip().lower()
    for pat, key in _GPU_PATTERNS:
        if re.search(pat, low):
            if key is None:
                break
            return key
    low = re.sub(r"^(nvidia|amd)\s+", "", low)
    return re.sub(r"[^a-z0-9]+", "_", low).strip("_") or "unknown_gpu"


@dataclass(frozen=True)
class Problem:
    """One GEMM problem of a grid: C[m, n] = A[m, k] @ B[k, n] with layouts and dtype."""

    m: int
    n: int
    k: int
    a_row_major: bool
    b_row_major: bool
    dtype: str


def grid_problems(grid: GemmGrid, dtypes: Sequence[str]) -> list[Problem]:
    """Every (shape, layout, dtype) of the grid, in measuring order."""
    return [Problem(m, n, k, a, b, d)
            for (m, n, k), (a, b), d in itertools.product(grid.shapes, grid.layouts, dtypes)]


def gemm_record(p: Problem, cfg: GemmConfig | None, time_ms: float, fp32: str = "tf32",
                resources: dict | None = None) -> dict:
    """The record of one timing: a Triton configuration, or the library (``cfg=None``).
    ``fp32``: how float32 inputs ran, ``'tf32'`` (tensor cores) or ``'ieee'``;
    ``resources``: the compiled kernel's ``num_regs, num_spills, shared_bytes``."""
    rec = {"m": p.m, "n": p.n, "k": p.k, "dtype": p.dtype, "a_row_major": p.a_row_major,
           "b_row_major": p.b_row_major, "tf32": p.dtype == "float32" and fp32 == "tf32",
           "time_ms": time_ms, **(resources or {})}
    if cfg is None:
        return {**rec, "backend": "cublas"}
    return {**rec, "backend": "triton", **dataclasses.asdict(cfg)}


def kernel_tile_order(raster: str, num_pid_m: int, num_pid_n: int, group_m: int) -> list[tuple[int, int]]:
    """``(pid_m, pid_n)`` of each program id, as :data:`KERNEL_SOURCE`'s ``matmul_kernel``
    computes them (the same integer arithmetic, kept in step with the kernel)."""
    out = []
    for pid in range(num_pid_m * num_pid_n):
        if raster == "grouped":
            num_pid_in_group = group_m * num_pid_n
            group_id = pid // num_pid_in_group
            first_pid_m = group_id * group_m
            group_size_m = min(num_pid_m - first_pid_m, group_m)
            pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
            pid_n = (pid % num_pid_in_group) // group_size_m
        elif raster == "row":
            pid_m, pid_n = pid // num_pid_n, pid % num_pid_n
        elif raster == "col":
            pid_m, pid_n = pid % num_pid_m, pid // num_pid_m
        else:
            raise ValueError(f"raster {raster!r} is not one of {RASTERS}")
        out.append((pid_m, pid_n))
    return out


def gemm_rows(records: Iterable[dict], gpu: str, source: str = SOURCE):
    """Rows of ``gemm.parquet``: exactly :func:`gemm_schema` (measured schema + ``raster``).

    Each record has ``m, n, k, dtype, backend, time_ms`` and, for Triton rows,
    ``block_m, block_n, block_k, num_stages, num_warps, group_m, raster``;
    optional ``a_row_major``/``b_row_major`` (default true) and ``tf32``
    (default: ``dtype == 'float32'``, as both the Triton kernel and the
    cuBLAS probe run float32 on tensor cores). Library rows have null tile
    columns, ``group_m`` and ``raster``. Unrunnable configurations carry
    ``time_ms = inf``.
    """
    import polars as pl

    schema = gemm_schema()
    cols: dict[str, list] = {c: [] for c in GEMM_COLUMNS}
    for i, r in enumerate(records):
        backend = r.get("backend", "triton")
        if backend not in ("triton", "cublas"):
            raise ValueError(f"record {i}: backend {backend!r} is not triton or cublas")
        dtype = r["dtype"]
        if dtype not in DTYPES:
            raise ValueError(f"record {i}: dtype {dtype!r} is not one of {DTYPES}")
        t = float(r["time_ms"])
        if not (t > 0):
            raise ValueError(f"record {i}: time_ms must be positive or inf, got {t!r}")
        cols["source"].append(source)
        cols["gpu"].append(gpu)
        for c in ("m", "n", "k"):
            cols[c].append(int(r[c]))
        cols["dtype"].append(dtype)
        cols["a_row_major"].append(bool(r.get("a_row_major", True)))
        cols["b_row_major"].append(bool(r.get("b_row_major", True)))
        cols["tf32"].append(bool(r.get("tf32", dtype == "float32")))
        cols["backend"].append(backend)
        for c in _TILE_KEYS + ("group_m",):
            cols[c].append(None if backend == "cublas" else int(r[c]))
        cols["time_ms"].append(t)
        raster = None if backend == "cublas" else r.get("raster", "grouped")
        if raster is not None and raster not in RASTERS:
            raise ValueError(f"record {i}: raster {raster!r} is not one of {RASTERS}")
        cols["raster"].append(raster)
        for c in ("num_regs", "num_spills", "shared_bytes"):
            v = r.get(c)
            cols[c].append(None if v is None or backend == "cublas" else int(v))
    return pl.DataFrame(cols, schema=schema)


#: the library part's columns after :func:`gemm_schema`'s
LIBRARY_EXTRA = {"time_ms_clean": "Float64", "time_ms_warm": "Float64",
                 "kernels_per_call": "Float64", "kernel_ms": "Float64", "kernel_names": "String"}


def kernel_summary(events: Sequence[tuple[str, float]], calls: int) -> dict:
    """What ran on the device per call: ``events`` are the ``(name, duration_us)`` of
    every kernel a profiler saw over ``calls`` calls. Returns ``kernels_per_call``,
    ``kernel_ms`` (their summed duration a call, ms) and ``kernel_names`` (the
    distinct names, sorted, ``;``-joined)."""
    if calls < 1:
        raise ValueError(f"calls must be >= 1, got {calls}")
    names = sorted({n for n, _ in events})
    return {"kernels_per_call": len(events) / calls,
            "kernel_ms": sum(t for _, t in events) / calls / 1000.0,
            "kernel_names": ";".join(names)}


def library_rows(records: Iterable[dict], gpu: str, source: str = SOURCE):
    """Rows of ``library.parquet``: :func:`gemm_rows`' library rows (``time_ms``: the
    call timed cold, L2 flushed by a write before each call, as the development
    data's harness does) and :data:`LIBRARY_EXTRA`: ``time_ms_clean`` (cold, flushed
    by a read), ``time_ms_warm`` (back-to-back calls, operands left in L2),
    ``kernels_per_call``, ``kernel_ms`` and ``kernel_names`` (what the profiler saw
    run; null where it could not run)."""
    import polars as pl

    records = list(records)
    for i, r in enumerate(records):
        if r.get("backend", "cublas") != "cublas":
            raise ValueError(f"record {i}: the library part records backend cublas only")
    df = gemm_rows([{**r, "backend": "cublas"} for r in records], gpu, source)
    extra = {c: [r.get(c) for r in records] for c in LIBRARY_EXTRA}
    return df.with_columns(pl.Series(c, v, dtype=getattr(pl, LIBRARY_EXTRA[c]))
                           for c, v in extra.items())


def bandwidth_frame(records: Iterable[dict]):
    """``bandwidth.parquet`` rows from per-size records ``{bytes, times_ms, passes, kernel}``:
    one row per working set with the median rate (``gbps`` = 1e9 B/s) and its spread."""
    import numpy as np
    import polars as pl

    out: dict[str, list] = {k: [] for k in ("bytes", "gbps", "gbps_min", "gbps_max", "time_ms",
                                            "passes", "repeats", "kernel")}
    for r in records:
        times = np.asarray(r["times_ms"], dtype=np.float64)
        if times.size == 0 or not np.all(times > 0):
            raise ValueError(f"working set {r['bytes']}: times must be positive")
        read = float(r["bytes"]) * float(r["passes"])
        rates = read / (times * 1e-3) / 1e9
        out["bytes"].append(int(r["bytes"]))
        out["gbps"].append(float(np.median(rates)))
        out["gbps_min"].append(float(rates.min()))
        out["gbps_max"].append(float(rates.max()))
        out["time_ms"].append(float(np.median(times)))
        out["passes"].append(int(r["passes"]))
        out["repeats"].append(int(times.size))
        out["kernel"].append(str(r.get("kernel", "triton_read")))
    return pl.DataFrame(out, schema={"bytes": pl.Int64, "gbps": pl.Float64,
                                     "gbps_min": pl.Float64, "gbps_max": pl.Float64,
                                     "time_ms": pl.Float64, "passes": pl.Int64,
                                     "repeats": pl.Int32, "kernel": pl.String}).sort("bytes")


def matmul_frame(records: Iterable[dict]):
    """``matmul.parquet`` rows from ``{dtype, m, n, k, times_ms}`` records (median time)."""
    import numpy as np
    import polars as pl

    out: dict[str, list] = {k: [] for k in ("dtype", "tf32", "m", "n", "k", "time_ms", "tflops",
                                            "repeats")}
    for r in records:
        times = np.asarray(r["times_ms"], dtype=np.float64)
        if times.size == 0 or not np.all(times > 0):
            raise ValueError(f"matmul {r['dtype']} {r['m']}: times must be positive")
        t = float(np.median(times))
        out["dtype"].append(r["dtype"])
        out["tf32"].append(bool(r.get("tf32", r["dtype"] == "float32")))
        for c in ("m", "n", "k"):
            out[c].append(int(r[c]))
        out["time_ms"].append(t)
        out["tflops"].append(2.0 * r["m"] * r["n"] * r["k"] / (t * 1e-3) / 1e12)
        out["repeats"].append(int(times.size))
    return pl.DataFrame(out, schema={"dtype": pl.String, "tf32": pl.Boolean, "m": pl.Int64,
                                     "n": pl.Int64, "k": pl.Int64, "time_ms": pl.Float64,
                                     "tflops": pl.Float64, "repeats": pl.Int32})


def measurement_metadata(env: dict, kind: str, extra: dict | None = None) -> dict[str, str]:
    """Provenance of one measurement file (``tsbatch.*`` keys, all strings).

    ``env`` holds ``device_name``, ``gpu``, ``driver``, ``cuda``, ``torch``,
    ``triton``, ``date`` (ISO 8601 UTC) and optionally ``sm_count``,
    ``l2_bytes``.
    """
    import json

    import tsbatch

    meta = {
        "tsbatch.version": tsbatch.__version__,
        "tsbatch.measure_kind": kind,
        "tsbatch.source": SOURCE,
        "tsbatch.device_name": str(env.get("device_name", "unknown")),
        "tsbatch.gpu": str(env.get("gpu", "unknown")),
        "tsbatch.driver": str(env.get("driver", "unknown")),
        "tsbatch.cuda_version": str(env.get("cuda", "unknown")),
        "tsbatch.torch_version": str(env.get("torch", "unknown")),
        "tsbatch.triton_version": str(env.get("triton", "unknown")),
        "tsbatch.date": str(env.get("date", "unknown")),
    }
    for k in ("sm_count", "l2_bytes", "capability", "hostname"):
        if k in env:
            meta[f"tsbatch.{k}"] = str(env[k])
    for k, v in (extra or {}).items():
        meta[f"tsbatch.{k}"] = v if isinstance(v, str) else json.dumps(v)
    return meta


# ============================================================================ GPU access
_NEED = "tsbatch measure needs a CUDA GPU with torch and triton installed"


def require_gpu():
    """Import torch and triton; return ``(torch, triton)`` or raise InputError naming what is missing."""
    found: list[str] = []
    torch = triton = None
    try:
        import torch  # type: ignore[no-redef]
    except Exception as exc:  # ImportError, or a broken install
        found.append(f"torch not importable: {type(exc).__name__}: {exc}".rstrip(": "))
    try:
        import triton  # type: ignore[no-redef]
    except Exception as exc:
        found.append(f"triton not importable: {type(exc).__name__}: {exc}".rstrip(": "))
    if torch is not None:
        ver = getattr(torch, "__version__", "?")
        try:
            ok = bool(torch.cuda.is_available())
        except Exception:  # pragma: no cover - odd builds
            ok = False
        found.insert(0, f"torch {ver}" + ("" if ok else " with no CUDA device available"))
        if not ok:
            torch = None
    if triton is not None:
        found.append(f"triton {getattr(triton, '__version__', '?')}")
    if torch is None or triton is None:
        raise InputError(f"{_NEED} (found: {'; '.join(found)})")
    return torch, triton


def _driver_version() -> str:
    exe = shutil.which("nvidia-smi")
    if exe:
        try:
            out = subprocess.run([exe, "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20)
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip().splitlines()[0].strip()
        except (OSError, subprocess.SubprocessError):  # pragma: no cover
            pass
    return "unknown"


def _environment(torch, triton) -> dict:
    dev = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(dev)
    name = torch.cuda.get_device_name(dev)
    env = {
        "device_name": name,
        "gpu": gpu_key(name),
        "driver": _driver_version(),
        "cuda": str(torch.version.cuda or getattr(torch.version, "hip", None) or "unknown"),
        "torch": torch.__version__,
        "triton": getattr(triton, "__version__", "unknown"),
        "date": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        "sm_count": int(props.multi_processor_count),
        "capability": f"{props.major}.{props.minor}",
    }
    l2 = int(getattr(props, "L2_cache_size", 0) or 0)     # what the driver reports
    try:
        from tsbatch.hw import get_hw

        l2 = max(l2, int(get_hw(env["gpu"]).l2_bytes))
    except Exception:
        pass
    env["l2_bytes"] = l2 if l2 > 0 else 64 * MIB
    return env


# ---------------------------------------------------------------------------- Triton kernels
#: Source of the two Triton kernels. It is written to a private module file
#: and imported, because Triton's ``@jit`` reads a kernel's source from its
#: file and resolves ``tl`` in that module's globals (this module must not
#: import triton at import time).
KERNEL_SOURCE = '''\
import triton
import triton.language as tl


@triton.jit
def read_kernel(x_ptr, out_ptr, n_chunks, total, CHUNK: tl.constexpr):
    """Read work items pid, pid + P, ... of a virtual range of `passes` copies of
    the working set; item i reads chunk i % n_chunks. Loads bypass L1 (.cg), so
    the rate is that of the cache level holding the working set."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    lanes = tl.arange(0, CHUNK)
    acc = tl.zeros([CHUNK], dtype=tl.float32)
    for i in range(pid, total, nprog):
        base = (i % n_chunks).to(tl.int64) * CHUNK
        acc += tl.load(x_ptr + base + lanes, cache_modifier=".cg")
    tl.store(out_ptr + pid, tl.sum(acc, axis=0))


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                  stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  GROUP_M: tl.constexpr, RASTER: tl.constexpr, IEEE: tl.constexpr = False):
    """C = A @ B, one BLOCK_M x BLOCK_N tile per program. RASTER 0: grouped
    launch order (GROUP_M rows of tiles per super-group, column-major inside),
    1: row order (along N), 2: column order (along M). IEEE: float32 inputs
    multiply as IEEE FP32 instead of Triton's default TF32."""
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    if RASTER == 0:
        num_pid_in_group = GROUP_M * num_pid_n
        group_id = pid // num_pid_in_group
        first_pid_m = group_id * GROUP_M
        group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
        pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
        pid_n = (pid % num_pid_in_group) // group_size_m
    elif RASTER == 1:
        pid_m = pid // num_pid_n
        pid_n = pid % num_pid_n
    else:
        pid_m = pid % num_pid_m
        pid_n = pid // num_pid_m
    offs_am = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_bn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + (offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak)
    b_ptrs = b_ptr + (offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kk in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptrs, mask=offs_k[None, :] < K - kk * BLOCK_K, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < K - kk * BLOCK_K, other=0.0)
        if IEEE:
            acc += tl.dot(a, b, input_precision="ieee")
        else:
            acc += tl.dot(a, b)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c = acc.to(c_ptr.dtype.element_ty)
    offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptrs = c_ptr + stride_cm * offs_cm[:, None] + stride_cn * offs_cn[None, :]
    c_mask = (offs_cm[:, None] < M) & (offs_cn[None, :] < N)
    tl.store(c_ptrs, c, mask=c_mask)
'''


def _load_kernels(workdir: Path):
    digest = hashlib.sha256(KERNEL_SOURCE.encode()).hexdigest()[:12]
    name = f"_tsbatch_measure_kernels_{digest}"
    path = workdir / f"{name}.py"
    path.write_text(KERNEL_SOURCE)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


# ---------------------------------------------------------------------------- timing
def _bench(torch, fn, *, flush=None, target_ms: float = 25.0, min_rep: int = 3,
           max_rep: int = 100) -> list[float]:
    """Per-call times (ms) of ``fn`` with CUDA events, after a warm-up; the
    count of calls fills about ``target_ms``. ``flush`` (a byte tensor larger
    than L2) is zeroed before each call so that every call starts cold, as
    Triton's ``do_bench`` and Inductor's autotuner (the development data) do;
    or, a callable, is called instead (:meth:`_Timer.clean`: a read of it)."""
    fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(3):
        fn()
    e.record()
    torch.cuda.synchronize()
    est = max(s.elapsed_time(e) / 3.0, 1e-3)
    n = int(min(max_rep, max(min_rep, round(target_ms / est))))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for i in range(n):
        if callable(flush):
            flush()
        elif flush is not None:
            flush.zero_()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return [a.elapsed_time(b) for a, b in zip(starts, ends)]


def _log(msg: str, quiet: bool) -> None:
    if not quiet:
        print(msg, file=sys.stderr, flush=True)


def _torch_dtype(torch, name: str):
    return {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}[name]


# ---------------------------------------------------------------------------- the three parts
def run_bandwidth(torch, kernels, env: dict, *, quick: bool, kernel: str = "triton",
                  quiet: bool = False) -> list[dict]:
    """Read bandwidth per working-set size, 1 MiB .. 4x L2 or 1 GiB, whichever is larger
    (the top octave, where calibrate reads the DRAM plateau, then holds no L2 hits)."""
    chunk = 4096                                    # float32 elements = 16 KiB per load
    sizes = working_set_sizes(MIB, max(4 * int(env["l2_bytes"]), 1 << 30),
                              per_octave=4 if quick else 6,
                              align=chunk * 4)
    target = (1 if quick else 2) << 30              # bytes read per timed call
    programs = int(env["sm_count"]) * 8
    out_buf = torch.empty(programs, device="cuda", dtype=torch.float32)
    records = []
    for b in sizes:
        n = b // 4
        x = torch.rand(n, device="cuda", dtype=torch.float32)
        n_chunks = n // chunk
        passes = max(2, int(math.ceil(target / b)))
        if kernel == "triton":
            total = n_chunks * passes

            def fn(x=x, n_chunks=n_chunks, total=total):
                kernels.read_kernel[(programs,)](x, out_buf, n_chunks, total, CHUNK=chunk,
                                                 num_warps=8)
        else:
            passes = 1

            def fn(x=x):
                x.sum()
        times = _bench(torch, fn, target_ms=20.0 if quick else 50.0, min_rep=3,
                       max_rep=10 if quick else 30)
        records.append({"bytes": b, "times_ms": times, "passes": passes,
                        "kernel": "triton_read" if kernel == "triton" else "torch_sum"})
        gbps = b * passes / (sorted(times)[len(times) // 2] * 1e-3) / 1e9
        _log(f"  working set {b / MIB:9.2f} MiB: {gbps:8.0f} GB/s", quiet)
        del x
    torch.cuda.empty_cache()
    return records


def _probe_sizes(quick: bool) -> tuple[int, ...]:
    return (8192,) if quick else (4096, 8192, 16384)


def run_matmul(torch, env: dict, dtypes: Sequence[str], *, quick: bool,
               quiet: bool = False, fp32: str = "tf32") -> list[dict]:
    """Large square torch.matmul per dtype (float32 as TF32, or IEEE with ``fp32='ieee'``)."""
    torch.backends.cuda.matmul.allow_tf32 = fp32 == "tf32"
    records = []
    for d in dtypes:
        for s in _probe_sizes(quick):
            a = torch.randn(s, s, device="cuda", dtype=_torch_dtype(torch, d))
            b = torch.randn(s, s, device="cuda", dtype=_torch_dtype(torch, d))
            c = torch.empty(s, s, device="cuda", dtype=_torch_dtype(torch, d))
            times = _bench(torch, lambda: torch.matmul(a, b, out=c),
                           target_ms=100.0 if quick else 300.0, min_rep=5, max_rep=50)
            t = sorted(times)[len(times) // 2]
            _log(f"  matmul {d:9s} {s}^3: {2 * s ** 3 / (t * 1e-3) / 1e12:7.1f} TFLOPS", quiet)
            records.append({"dtype": d, "m": s, "n": s, "k": s, "times_ms": times,
                            "tf32": d == "float32" and fp32 == "tf32"})
            del a, b, c
    torch.cuda.empty_cache()
    return records


class _Timer:
    """Per-call times (ms) of a timing loop's calls: ``cold`` with the L2 flushed
    before each call (a buffer twice the L2, at least 256 MiB, zeroed: the L2 is
    then full of dirty lines, as after Triton's ``do_bench`` flush), ``clean``
    flushed by reading that buffer instead (the L2 full of clean lines), ``warm``
    back to back; about ``target_ms`` of calls each (:func:`_bench`)."""

    def __init__(self, torch, env: dict, quick: bool):
        self.torch = torch
        self.flush = torch.empty(max(256 * MIB, 2 * int(env["l2_bytes"])), dtype=torch.int8,
                                 device="cuda")
        self.target = 10.0 if quick else 25.0

    def cold(self, fn) -> list[float]:
        return _bench(self.torch, fn, flush=self.flush, target_ms=self.target)

    def clean(self, fn) -> list[float]:
        flush = self.flush
        return _bench(self.torch, fn, flush=lambda: flush.sum(), target_ms=self.target)

    def warm(self, fn) -> list[float]:
        return _bench(self.torch, fn, target_ms=self.target)

    def close(self) -> None:
        self.flush = None
        self.torch.cuda.empty_cache()


def _timed_problems(torch, env: dict, grid: GemmGrid, dtypes: Sequence[str], *, quick: bool,
                    quiet: bool, budget_s: float | None, stats: dict, fp32: str):
    """The problems of a timing loop (:func:`run_gemm`, :func:`run_library`):
    ``(i, problem, planned, timer)`` until they or ``budget_s`` run out, float32
    set to run as ``fp32`` says; ``stats`` gets ``problems_planned`` and
    ``problems_done`` (those whose loop body has run)."""
    torch.backends.cuda.matmul.allow_tf32 = fp32 == "tf32"
    timer = _Timer(torch, env, quick)
    problems = grid_problems(grid, dtypes)
    stats.update(problems_planned=len(problems), problems_done=0)
    t0 = time.perf_counter()
    try:
        for i, p in enumerate(problems, 1):
            if budget_s is not None and time.perf_counter() - t0 > budget_s:
                _log(f"  time budget of {budget_s:.0f} s spent: stopped after {i - 1} of "
                     f"{len(problems)} problems", quiet)
                break
            yield i, p, len(problems), timer
            stats["problems_done"] = i
    finally:
        timer.close()


def _operands(torch, p: Problem):
    """Random A and B of problem ``p`` in its layouts (a transposed view of a
    contiguous tensor for a column-major operand), scaled so that C's entries are
    about unit size."""
    td = _torch_dtype(torch, p.dtype)
    m, n, k = p.m, p.n, p.k
    a = torch.randn(m, k, device="cuda", dtype=td) if p.a_row_major else \
        torch.randn(k, m, device="cuda", dtype=td).t()
    b = torch.randn(k, n, device="cuda", dtype=td) if p.b_row_major else \
        torch.randn(n, k, device="cuda", dtype=td).t()
    a.mul_(k ** -0.25)
    b.mul_(k ** -0.25)
    return a, b


def device_events(torch, fn, calls: int, cuda: bool = True) -> list[tuple[str, float]]:
    """``(name, duration_us)`` of every device activity (kernels, memsets, copies) that
    ``calls`` calls of ``fn`` run under torch.profiler, after one call outside it
    (``cuda=False``: the profiler's CPU activity only, so none; the tests' CPU run)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    if cuda:
        torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            fn()
        if cuda:
            torch.cuda.synchronize()
    dev = torch.autograd.DeviceType.CUDA
    return [(ev.name, float(ev.time_range.elapsed_us())) for ev in prof.events()
            if getattr(ev, "device_type", None) == dev]


def _profile_kernels(torch, fn, calls: int = 5) -> dict | None:
    """:func:`kernel_summary` of ``calls`` calls of ``fn`` (:func:`device_events`), or
    None where the profiler cannot run (no CUPTI)."""
    try:
        events = device_events(torch, fn, calls)
        return kernel_summary(events, calls) if events else None
    except Exception as exc:  # profiler unavailable or changed: keep the timings
        _log(f"  (profiler: {type(exc).__name__}: {exc}; kernel columns left empty)", False)
        return None


def run_library(torch, env: dict, grid: GemmGrid, dtypes: Sequence[str], *, quick: bool,
                quiet: bool = False, budget_s: float | None = None, on_problem=None,
                stats: dict | None = None, fp32: str = "tf32") -> list[dict]:
    """Time the library (``torch.matmul``, cuBLAS) on every problem of ``grid``, four ways.

    ``time_ms``: cold, L2 flushed by a write before each call (the development data's
    harness: Triton's ``do_bench``, Inductor's autotuner), so the call's own
    allocations evict dirty lines; ``time_ms_clean``: cold, flushed by a read (clean
    lines: ``time_ms - time_ms_clean`` is what writing those back costs the call);
    ``time_ms_warm``: back-to-back calls with the operands left in L2 (a decode
    step's GEMM after the layer before it); and what the profiler sees run per
    call (kernels, their summed
    time, names: a split-K reduction or a memset shows as a second kernel, and
    ``time_ms - kernel_ms`` is the per-call time that is no kernel's). Medians of
    the repeats. ``budget_s``, ``on_problem``, ``stats``, ``fp32``: as :func:`run_gemm`.
    """
    records: list[dict] = []
    stats = {} if stats is None else stats
    t0 = time.perf_counter()
    for i_prob, p, n_prob, timer in _timed_problems(
            torch, env, grid, dtypes, quick=quick, quiet=quiet, budget_s=budget_s,
            stats=stats, fp32=fp32):
        a, b = _operands(torch, p)
        c = torch.matmul(a, b)

        def fn():
            torch.matmul(a, b, out=c)

        cold = timer.cold(fn)
        clean = timer.clean(fn)
        warm = timer.warm(fn)
        rec = gemm_record(p, None, sorted(cold)[len(cold) // 2], fp32)
        rec["time_ms_clean"] = sorted(clean)[len(clean) // 2]
        rec["time_ms_warm"] = sorted(warm)[len(warm) // 2]
        kern = _profile_kernels(torch, fn)
        rec.update(kern or {})
        records.append(rec)
        kinfo = "" if kern is None else \
            f", {kern['kernels_per_call']:.0f} kernel(s) {kern['kernel_ms'] * 1e3:.1f} us"
        _log(f"  [{i_prob}/{n_prob}] {p.m}x{p.n}x{p.k} {p.dtype} "
             f"a{'R' if p.a_row_major else 'C'}b{'R' if p.b_row_major else 'C'}: cold "
             f"{rec['time_ms'] * 1e3:8.1f} us, clean {rec['time_ms_clean'] * 1e3:8.1f} us, warm "
             f"{rec['time_ms_warm'] * 1e3:8.1f} us{kinfo} "
             f"[{time.perf_counter() - t0:.0f} s]", quiet)
        del a, b, c
        if on_problem is not None:
            on_problem(records, i_prob, n_prob)
    return records


def _check(torch, c, ref, dtype: str) -> bool:
    tol = {"float16": 2e-2, "bfloat16": 5e-2, "float32": 2e-2}[dtype]
    err = (c.float() - ref.float()).abs().max().item()
    scale = ref.float().abs().max().item() or 1.0
    return err <= tol * scale


def warm_jobs(grid: GemmGrid, dtypes: Sequence[str]) -> list[tuple]:
    """The distinct Triton compilations of a grid: ``(dtype, a_row_major, b_row_major,
    config)`` once each (the kernel is specialised on these, not on the problem size,
    as long as every size is a multiple of 16 -- see :func:`_warm_shape_ok`)."""
    layouts = list(dict.fromkeys(grid.layouts))
    return [(d, a, b, c) for d in dtypes for (a, b) in layouts for c in grid.configs]


def _warm_shape_ok(grid: GemmGrid) -> bool:
    """True when every problem size is a multiple of 16: Triton then specialises the
    kernel exactly as for the 64x64x64 warm-up problem, so the compilations made in
    the warm-up processes are the ones the timing loop loads from Triton's cache."""
    return all(x % 16 == 0 for shape in grid.shapes for x in shape)


def _launch_matmul(kernels, a, b, c, m: int, n: int, k: int, cfg: GemmConfig, ieee: bool,
                   grid: tuple[int]) -> None:
    """Launch :data:`KERNEL_SOURCE`'s ``matmul_kernel`` for ``cfg`` (C = A @ B, any strides);
    returns what Triton's launch returns (the compiled kernel)."""
    return kernels.matmul_kernel[grid](
        a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
        c.stride(0), c.stride(1), BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m, RASTER=RASTERS.index(cfg.raster),
        IEEE=ieee, num_warps=cfg.num_warps, num_stages=cfg.num_stages)


def _warm_worker(args) -> tuple[int, int]:
    """Compile (and run once, on a 64x64x64 problem) a batch of configurations in a
    separate process, filling Triton's on-disk cache. Returns (compiled, failed)."""
    kernel_path, jobs, ieee = args
    import importlib.util as iu

    import torch

    name = Path(kernel_path).stem
    mod = sys.modules.get(name)
    if mod is None:
        spec = iu.spec_from_file_location(name, kernel_path)
        mod = iu.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    s = 64
    ok = bad = 0
    for d, a_rm, b_rm, c in jobs:
        try:
            td = _torch_dtype(torch, d)
            a = torch.zeros(s, s, device="cuda", dtype=td) if a_rm else \
                torch.zeros(s, s, device="cuda", dtype=td).t()
            b = torch.zeros(s, s, device="cuda", dtype=td) if b_rm else \
                torch.zeros(s, s, device="cuda", dtype=td).t()
            out = torch.empty(s, s, device="cuda", dtype=td)
            _launch_matmul(mod, a, b, out, s, s, s, c, ieee and d == "float32", (1,))
            torch.cuda.synchronize()
            ok += 1
        except Exception:  # out of resources: the timing loop records it as not runnable
            bad += 1
    return ok, bad


def kernel_resources(compiled) -> dict | None:
    """Registers per thread, spilled registers and shared memory (bytes) of a
    compiled Triton kernel (what its launch returns), or None if it says nothing."""
    if compiled is None:
        return None
    out = {}
    for key, nm in (("num_regs", "n_regs"), ("num_spills", "n_spills")):
        v = getattr(compiled, nm, None)
        if isinstance(v, (int, float)) and v >= 0:
            out[key] = int(v)
    meta = getattr(compiled, "metadata", None)
    sh = getattr(meta, "shared", None) if meta is not None else None
    if sh is None:
        sh = getattr(compiled, "shared", None)
    if isinstance(sh, (int, float)) and sh >= 0:
        out["shared_bytes"] = int(sh)
    return out or None


def warm_compile(kernel_path: Path, jobs: Sequence[tuple], workers: int, timeout_s: float,
                 quiet: bool = False, fp32: str = "tf32") -> dict:
    """Compile ``jobs`` (see :func:`warm_jobs`) in ``workers`` spawned processes, so that
    the timing loop finds every kernel in Triton's on-disk cache instead of compiling
    them one after another (about a second each). Best effort: on a timeout or any
    failure the rest compile in the timing loop as before."""
    import multiprocessing as mp

    t0 = time.perf_counter()
    if workers <= 0 or not jobs:
        return {"compiled": 0, "failed": 0, "seconds": 0.0}
    per = max(1, min(4, len(jobs) // (2 * workers) or 1))
    batches = [(str(kernel_path), list(jobs[i:i + per]), fp32 == "ieee")
               for i in range(0, len(jobs), per)]
    ok = bad = 0
    ctx = mp.get_context("spawn")
    pool = ctx.Pool(workers)
    try:
        it = pool.imap_unordered(_warm_worker, batches)
        for i in range(len(batches)):
            left = timeout_s - (time.perf_counter() - t0)
            if left <= 0:
                raise TimeoutError
            o, b = it.next(timeout=left)
            ok, bad = ok + o, bad + b
        pool.close()
    except Exception as exc:  # TimeoutError, a worker's crash: fall back to compiling in turn
        _log(f"  warm-up compile stopped ({type(exc).__name__}: {exc}); the rest compile "
             "in the timing loop", quiet)
        pool.terminate()
    finally:
        pool.join()
    dt = time.perf_counter() - t0
    _log(f"  compiled {ok} kernels in {workers} processes in {dt:.0f} s ({bad} did not build "
         "or run)", quiet)
    return {"compiled": ok, "failed": bad, "seconds": dt}


def run_gemm(torch, kernels, env: dict, grid: GemmGrid, dtypes: Sequence[str], *,
             quick: bool, quiet: bool = False, budget_s: float | None = None,
             on_problem=None, stats: dict | None = None, fp32: str = "tf32") -> list[dict]:
    """Time the Triton kernel over ``grid`` (and torch.matmul per problem).

    ``budget_s``: start no new problem after this many seconds (the problems
    done are kept). ``on_problem(records, done, planned)`` is called after each
    problem (``run_measure`` writes the file so far, so a stopped run keeps its
    data). A configuration whose result disagrees with cuBLAS is reported and
    recorded as not runnable (``time_ms = inf``); ``stats['wrong_results']``
    counts them. ``fp32``: float32 inputs run as ``'tf32'`` (Triton's default,
    torch's ``allow_tf32``) or ``'ieee'``; the ``tf32`` column says which.
    """
    records: list[dict] = []
    stats = {} if stats is None else stats
    stats["wrong_results"] = 0
    t0 = time.perf_counter()
    for i_prob, p, n_prob, timer in _timed_problems(
            torch, env, grid, dtypes, quick=quick, quiet=quiet, budget_s=budget_s,
            stats=stats, fp32=fp32):
        m, n, k, a_rm, b_rm, d = p.m, p.n, p.k, p.a_row_major, p.b_row_major, p.dtype
        td = _torch_dtype(torch, d)
        a, b = _operands(torch, p)
        ref = torch.matmul(a, b)
        t = timer.cold(lambda: torch.matmul(a, b, out=ref))
        t_lib = sorted(t)[len(t) // 2]
        records.append(gemm_record(p, None, t_lib, fp32))
        ref = torch.matmul(a, b)
        c = torch.empty(m, n, device="cuda", dtype=td)
        best = math.inf
        n_fail = 0
        for cfg in grid.configs:
            def fn(cfg=cfg):
                g = (triton_cdiv(m, cfg.block_m) * triton_cdiv(n, cfg.block_n),)
                return _launch_matmul(kernels, a, b, c, m, n, k, cfg,
                                      fp32 == "ieee" and d == "float32", g)
            res = None
            try:
                c.zero_()
                res = kernel_resources(fn())
                torch.cuda.synchronize()
            except Exception as exc:  # out of shared memory / registers: not runnable here
                if "CUDA error" in str(exc) or "illegal" in str(exc).lower():
                    raise
                t_ms = math.inf
                n_fail += 1
            else:
                if not _check(torch, c, ref, d):
                    _log(f"  WRONG RESULT: Triton GEMM {m}x{n}x{k} {d} {cfg} disagrees with "
                         "cuBLAS; recorded as not runnable (a bug in tsbatch measure's kernel, "
                         "please report it)", False)
                    stats["wrong_results"] += 1
                    t_ms = math.inf
                    n_fail += 1
                else:
                    t = timer.cold(fn)
                    t_ms = sorted(t)[len(t) // 2]
                    best = min(best, t_ms)
            records.append(gemm_record(p, cfg, t_ms, fp32, res))
        _log(f"  [{i_prob}/{n_prob}] {m}x{n}x{k} {d} a{'R' if a_rm else 'C'}b{'R' if b_rm else 'C'}: "
             f"cublas {t_lib * 1e3:9.1f} us, best triton "
             f"{best * 1e3:9.1f} us ({n_fail} configs did not run) "
             f"[{time.perf_counter() - t0:.0f} s]", quiet)
        del a, b, c, ref
        if on_problem is not None:
            on_problem(records, i_prob, n_prob)
    return records


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def default_compile_workers() -> int:
    """Processes for the warm-up compilation: one per core but one, at most 16."""
    return max(0, min(16, (os.cpu_count() or 1) - 1))


def run_measure(out: Path, *, quick: bool, grid: GemmGrid, dtypes: Sequence[str],
                parts: Sequence[str] = _DEFAULT_PARTS, bw_kernel: str = "triton",
                quiet: bool = False, compile_workers: int = 0,
                gemm_budget_s: float | None = None, fp32: str = "tf32",
                lib_grid: GemmGrid | None = None, lib_dtypes: Sequence[str] | None = None,
                lib_budget_s: float | None = None, layer_spec=None) -> dict:
    """Run the microbenchmarks on the current CUDA device; write the Parquet files into ``out``.

    ``gemm.parquet`` is rewritten after every problem, so a run stopped by
    ``gemm_budget_s`` (seconds for the GEMM part, warm-up compilation
    included) or interrupted keeps the problems it finished; its metadata
    says how many (``tsbatch.problems_done`` of ``tsbatch.problems_planned``,
    ``tsbatch.complete``). ``library.parquet`` (:func:`run_library` over
    ``lib_grid``, default :func:`default_library_grid`, in ``lib_dtypes``,
    default ``dtypes``) likewise, within ``lib_budget_s``; ``layer.parquet``
    (:func:`tsbatch.measured.layer.run_layer_part` with ``layer_spec``, default
    :func:`tsbatch.measured.layer.default_spec`) after the other parts.
    """
    torch, triton = require_gpu()
    from tsbatch.boundary.io import write_parquet

    out.mkdir(parents=True, exist_ok=True)
    env = _environment(torch, triton)
    _log(f"tsbatch measure on {env['device_name']} (hw key '{env['gpu']}', driver "
         f"{env['driver']}, torch {env['torch']}, triton {env['triton']})", quiet)
    workdir = Path(tempfile.mkdtemp(prefix="tsbatch-measure-"))
    written: dict[str, int] = {}
    t0 = time.perf_counter()
    try:
        kernels = _load_kernels(workdir)
        args = {"quick": quick, "grid": grid.name, "dtypes": list(dtypes), "fp32": fp32}
        if "bandwidth" in parts:
            _log("bandwidth versus working-set size:", quiet)
            df = bandwidth_frame(run_bandwidth(torch, kernels, env, quick=quick,
                                               kernel=bw_kernel, quiet=quiet))
            write_parquet(df, out / "bandwidth.parquet",
                          measurement_metadata(env, "bandwidth", {"args": args}))
            written["bandwidth.parquet"] = df.height
        if "matmul" in parts:
            _log("matmul probes:", quiet)
            df = matmul_frame(run_matmul(torch, env, dtypes, quick=quick, quiet=quiet, fp32=fp32))
            write_parquet(df, out / "matmul.parquet",
                          measurement_metadata(env, "matmul", {"args": args}))
            written["matmul.parquet"] = df.height
        if "library" in parts:
            lg = lib_grid or default_library_grid(quick)
            ld = tuple(lib_dtypes or dtypes)
            _log(f"library (torch.matmul) grid '{lg.name}': {len(lg.shapes)} shapes x "
                 f"{len(lg.layouts)} layouts x {len(ld)} dtypes, cold, warm and profiled:", quiet)
            lstats: dict = {}

            def save_lib(records, done, planned):
                meta = {"args": {**args, "library_grid": lg.name, "library_dtypes": list(ld)},
                        "problems_done": done, "problems_planned": planned,
                        "complete": done == planned,
                        "timing": "time_ms: L2 flushed by a write before each call (median); "
                                  "time_ms_clean: flushed by a read; time_ms_warm: back-to-back "
                                  "calls (median); kernel_*: torch.profiler"}
                write_parquet(library_rows(records, env["gpu"]), out / "library.parquet",
                              measurement_metadata(env, "library", meta))

            records = run_library(torch, env, lg, ld, quick=quick, quiet=quiet,
                                  budget_s=lib_budget_s, on_problem=save_lib, stats=lstats,
                                  fp32=fp32)
            save_lib(records, lstats["problems_done"], lstats["problems_planned"])
            written["library.parquet"] = len(records)
        if "gemm" in parts:
            _log(f"Triton GEMM grid '{grid.name}': {len(grid.shapes)} shapes x "
                 f"{len(grid.layouts)} layouts x {len(grid.configs)} configurations x "
                 f"{len(dtypes)} dtypes:", quiet)
            tg = time.perf_counter()
            if compile_workers > 0:
                if _warm_shape_ok(grid):
                    limit = 0.6 * gemm_budget_s if gemm_budget_s else 1800.0
                    warm_compile(Path(kernels.__file__), warm_jobs(grid, dtypes),
                                 compile_workers, limit, quiet, fp32)
                else:
                    _log("  some sizes are not multiples of 16: kernels compile in turn", quiet)
            stats: dict = {}

            def save(records, done, planned):
                meta = {"args": args, "problems_done": done, "problems_planned": planned,
                        "complete": done == planned,
                        "wrong_results": stats.get("wrong_results", 0)}
                write_parquet(gemm_rows(records, env["gpu"]), out / "gemm.parquet",
                              measurement_metadata(env, "gemm", meta))

            left = None if gemm_budget_s is None else \
                max(0.0, gemm_budget_s - (time.perf_counter() - tg))
            records = run_gemm(torch, kernels, env, grid, dtypes, quick=quick, quiet=quiet,
                               budget_s=left, on_problem=save, stats=stats, fp32=fp32)
            save(records, stats["problems_done"], stats["problems_planned"])
            written["gemm.parquet"] = len(records)
            if stats["wrong_results"]:
                _log(f"  {stats['wrong_results']} configurations gave wrong results (recorded "
                     "as not runnable)", False)
        if "layer" in parts:
            from tsbatch.measured.layer import run_layer_part

            written["layer.parquet"] = run_layer_part(out, layer_spec, quiet)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return {"env": env, "written": written, "seconds": time.perf_counter() - t0}


# ============================================================================ CLI
def cmd_measure(args) -> int:
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise InputError(f"{out}: --out must be a directory")
    dtypes_given = args.dtypes
    if args.gemm_grid in (None, "default"):
        grid = default_grid(args.quick)
    elif args.gemm_grid == "quick":
        grid = default_grid(True)
    else:
        grid = load_grid(args.gemm_grid)
    dtypes = parse_dtypes(dtypes_given, grid.dtypes or ("float16", "bfloat16"))
    parts = parse_parts(args.only)
    lib_grid = library_grid(args.library_grid, args.quick)
    lib_dtypes = parse_dtypes(dtypes_given, lib_grid.dtypes or dtypes)
    if args.library_budget_s is not None and not args.library_budget_s > 0:
        raise InputError(f"--library-budget-s {args.library_budget_s}: must be positive")
    layer_spec = None
    if "layer" in parts:
        from tsbatch.measured.layer import default_spec, load_layer_spec

        layer_spec = default_spec() if args.layer_spec in (None, "default") else \
            load_layer_spec(args.layer_spec)
    workers = default_compile_workers() if args.compile_workers is None else args.compile_workers
    if workers < 0:
        raise InputError(f"--compile-workers {workers}: must be 0 or more")
    if args.time_budget_s is not None and not args.time_budget_s > 0:
        raise InputError(f"--time-budget-s {args.time_budget_s}: must be positive")
    res = run_measure(out, quick=args.quick, grid=grid, dtypes=dtypes, parts=parts,
                      bw_kernel=args.bw_kernel, quiet=args.quiet, compile_workers=workers,
                      gemm_budget_s=args.time_budget_s, fp32=args.fp32,
                      lib_grid=lib_grid, lib_dtypes=lib_dtypes,
                      lib_budget_s=args.library_budget_s, layer_spec=layer_spec)
    env = res["env"]
    for name, rows in res["written"].items():
        print(f"wrote {rows:,} rows to {out / name}")
    print(f"measured {env['device_name']} (hw key '{env['gpu']}') in {res['seconds']:.0f} s; "
          f"next: tsbatch calibrate {out} --hw {env['gpu']}")
    return 0


def cmd_calibrate(args) -> int:
    from tsbatch.measured.calibrate import run_calibrate_cli

    return run_calibrate_cli(args)


def add_parser(subparsers) -> None:
    """Register ``measure`` and ``calibrate`` on the ``tsbatch`` subparsers."""
    p = subparsers.add_parser(
        "measure",
        help="run GPU microbenchmarks (bandwidth sweep, matmul probes, Triton GEMM grid, "
             "library calls)",
        description="Measure read bandwidth versus working-set size, large matmul throughput "
                    "per dtype, a Triton GEMM over a tile-configuration grid, and the "
                    "library's (torch.matmul) small and skinny calls cold, warm and profiled, "
                    "on the local CUDA GPU; write bandwidth.parquet, matmul.parquet, "
                    "gemm.parquet and library.parquet (the measured schema) into --out; with "
                    "--only layer, one transformer layer's ops timed one by one into "
                    "layer.parquet. Needs torch and triton with a CUDA device.")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory (created)")
    p.add_argument("--quick", action="store_true",
                   help="fewer sizes, shapes and configurations (about 2 minutes on an H200)")
    p.add_argument("--gemm-grid", default="default", metavar="default|quick|FILE.toml",
                   help="GEMM grid: built-in (default, or quick with --quick) or a TOML file")
    p.add_argument("--dtypes", default=None, metavar="LIST",
                   help="comma-separated input dtypes (default float16,bfloat16)")
    p.add_argument("--only", default=None, metavar="PARTS",
                   help="comma-separated parts among bandwidth,matmul,gemm,library,layer "
                        "(default: all but layer)")
    p.add_argument("--layer-spec", default="default", metavar="default|FILE.toml",
                   help="the layer part's model and points: built-in (a Llama-3-8B layer in "
                        "bf16, prefill 1x2048 and 8x512 tokens, decode batch 1-128 at ctx 1024 "
                        "and 4096: bench/device/layer.toml) or a TOML file")
    p.add_argument("--library-grid", default="default", metavar="default|quick|FILE.toml",
                   help="the library part's problems: built-in (default: decode GEMMs of "
                        "M <= 64 rows of Llama-3 8B and 70B/TP8 as x @ W.T, and the development "
                        "data's worst library calls; quick with --quick) or a TOML file "
                        "(shapes, dtypes, a_row_major, b_row_major)")
    p.add_argument("--library-budget-s", type=float, default=None, metavar="S",
                   help="seconds for the library part: no new problem starts after that "
                        "(default: no limit)")
    p.add_argument("--bw-kernel", choices=("triton", "torch"), default="triton",
                   help="bandwidth kernel: looped Triton read (default) or torch.sum (coarse: "
                        "launch time dominates small working sets)")
    p.add_argument("--compile-workers", type=int, default=None, metavar="N",
                   help="processes that compile the grid's Triton kernels before the timing "
                        "loop (default: one per core but one, at most 16; 0 compiles each "
                        "kernel in turn in the loop)")
    p.add_argument("--time-budget-s", type=float, default=None, metavar="S",
                   help="seconds for the GEMM part, compilation included: no new problem "
                        "starts after that; the problems done are written (default: no limit)")
    p.add_argument("--fp32", choices=("tf32", "ieee"), default="tf32",
                   help="how float32 inputs multiply: on tensor cores as TF32 (default: "
                        "Triton's tl.dot default, torch allow_tf32) or as IEEE FP32 "
                        "(input_precision='ieee', allow_tf32 off); the tf32 column says which")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=cmd_measure)

    c = subparsers.add_parser(
        "calibrate",
        help="turn tsbatch measure results into the calibrated values of a hw file",
        description="Find the DRAM and L2 (and L1.5) bandwidth plateaus and the L2 cliff in "
                    "bandwidth.parquet, the tensor-core ceilings in matmul.parquet and the "
                    "launch floor in gemm.parquet; write a copy of the GPU's hw TOML with "
                    "[measured] and [calibration] updated, each value with its source.")
    c.add_argument("dir", metavar="DIR", help="directory written by tsbatch measure")
    c.add_argument("--hw", required=True, help="GPU name (see 'tsbatch hw') or a hw TOML file")
    c.add_argument("-o", "--output", default=None, metavar="FILE.toml",
                   help="output TOML (default: overwrite the GPU's own hw/NAME.toml)")
    c.add_argument("--force", action="store_true",
                   help="calibrate even if the measurements name a different GPU")
    c.add_argument("--keep", default=None, metavar="KEYS",
                   help="comma-separated keys to leave as they are, e.g. tc_fp16_tflops when the "
                        "file's value is a true tensor-core probe (tc_efficiency is then taken "
                        "against it)")
    c.add_argument("--keep-higher", action="store_true",
                   help="leave a [measured] rate of the file that is higher than the new "
                        "probe's (a probe bounds a peak from below; e.g. a dedicated L2 "
                        "microbenchmark against tsbatch measure's read kernel)")
    c.add_argument("--dry-run", action="store_true", help="print the summary, write nothing")
    c.set_defaults(func=cmd_calibrate)
