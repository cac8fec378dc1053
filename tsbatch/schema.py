"""Validation of candidate tables at the boundary.

Turns a polars DataFrame into a dict of contiguous numpy arrays of declared
dtypes, with defaults filled for optional columns. Every problem raises one
:class:`~tsbatch.errors.InputError` naming the column (and the first bad
row and value); nothing is partially evaluated.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from kernels_catalog.base import Family
from tsbatch.errors import InputError

__all__ = ["to_polars", "read_candidates", "validate"]

_INT = (pl.Int8, pl.Int16, pl.Int32, pl.Int64, pl.UInt8, pl.UInt16, pl.UInt32, pl.UInt64)


def read_candidates(path: str | Path) -> pl.DataFrame:
    """Read a candidate Parquet file; unreadable files raise :class:`InputError`."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such file")
    if path.is_dir():
        raise InputError(f"{path}: is a directory, expected a Parquet file")
    try:
        return pl.read_parquet(path)
    except Exception as exc:  # polars raises several types for corrupt files
        raise InputError(f"{path}: not a readable Parquet file ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else ''})") from exc


def to_polars(candidates) -> pl.DataFrame:
    """Accept a polars DataFrame, a pyarrow Table/RecordBatch, a dict or a path."""
    if isinstance(candidates, pl.DataFrame):
        return candidates
    if type(candidates).__module__.startswith("pyarrow"):  # Table or RecordBatch
        import pyarrow as pa  # only when given Arrow data: keeps start-up light

        if isinstance(candidates, (pa.Table, pa.RecordBatch)):
            return pl.from_arrow(candidates)
    if isinstance(candidates, (str, Path)):
        return read_candidates(candidates)
    if isinstance(candidates, dict):
        return pl.DataFrame(candidates)
    try:
        import pandas as pd  # optional

        if isinstance(candidates, pd.DataFrame):
            return pl.from_pandas(candidates)
    except ImportError:  # pragma: no cover
        pass
    raise InputError(f"candidates must be a polars DataFrame, Arrow table, dict or Parquet path, "
                     f"got {type(candidates).__name__}")


def _first_bad(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def validate(df: pl.DataFrame, family: Family) -> tuple[dict, np.ndarray]:
    """Check ``df`` against ``family.columns``.

    Returns ``(cols, is_library)``: numpy arrays per column (defaults
    filled) and a boolean mask of library rows (``backend == 'cublas'``),
    whose tile columns may be null.
    """
    n = df.height
    cols: dict[str, np.ndarray] = {}
    names = set(df.columns)
    is_lib = np.zeros(n, dtype=bool)
    if "backend" in names:
        b = df.get_column("backend")
        if b.dtype not in (pl.String, pl.Categorical, pl.Enum):
            raise InputError(f"column 'backend' must be text, got {b.dtype}")
        is_lib = (b.cast(pl.String).fill_null("triton") == "cublas").to_numpy()
    tile_cols = ("block_m", "block_n", "block_k", "num_stages", "num_warps")
    missing = [c.name for c in family.columns if c.required and c.name not in names
               and not (c.name in tile_cols and n > 0 and is_lib.all())]
    if missing:
        need = ", ".join(c.name for c in family.columns if c.required)
        raise InputError(f"missing column{'s' if len(missing) > 1 else ''} "
                         f"{', '.join(repr(m) for m in missing)}; {family.name} candidates need: {need}")
    for c in family.columns:
        if c.name not in names:
            if c.name in tile_cols:
                cols[c.name] = np.zeros(n, dtype=np.int64)
                continue
            cols[c.name] = np.full(n, c.default, dtype=object if c.kind == "str" else None)
            continue
        s = df.get_column(c.name)
        nulls = s.is_null().to_numpy()
        may_be_null = (~c.required) or (c.name in tile_cols)
        if c.kind == "int":
            if s.dtype not in _INT and s.dtype != pl.Null:
                raise InputError(f"column '{c.name}' must be integer, got {s.dtype}")
            arr = s.fill_null(0 if c.required else (c.default or 0)).cast(pl.Int64).to_numpy()
        elif c.kind == "bool":
            if s.dtype not in (pl.Boolean, pl.Null):
                raise InputError(f"column '{c.name}' must be boolean, got {s.dtype}")
            arr = s.fill_null(bool(c.default)).to_numpy().astype(bool)
        elif c.kind == "str":
            if s.dtype not in (pl.String, pl.Categorical, pl.Enum, pl.Null):
                raise InputError(f"column '{c.name}' must be text, got {s.dtype}")
            arr = s.cast(pl.String).fill_null(c.default if c.default is not None else "") \
                .to_numpy().astype(object)
        else:
            arr = s.cast(pl.Float64).to_numpy()
        if nulls.any():
            bad = nulls & ~is_lib if c.name in tile_cols else nulls
            if c.required and bad.any():
                i = _first_bad(bad)
                raise InputError(f"column '{c.name}' has a null value at row {i}")
            if not may_be_null and bad.any():  # pragma: no cover - guarded above
                raise InputError(f"column '{c.name}' has a null value at row {_first_bad(bad)}")
        if c.positive:
            check = ~nulls & ~(is_lib if c.name in tile_cols else np.zeros(n, dtype=bool))
            bad = check & (arr <= 0)
            if bad.any():
                i = _first_bad(bad)
                raise InputError(f"column '{c.name}' must be positive; row {i} has {arr[i]}")
        if c.choices:
            uniq = set(np.unique(arr.astype(str)).tolist()) if n else set()
            unknown = sorted(uniq - set(c.choices))
            if unknown:
                i = _first_bad(arr.astype(str) == unknown[0])
                raise InputError(f"column '{c.name}' has unknown value {unknown[0]!r} at row {i}; "
                                 f"known: {', '.join(c.choices)}")
        cols[c.name] = arr
    return cols, is_lib
