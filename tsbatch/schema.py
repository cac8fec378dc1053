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

__all__ = ["to_polars", "read_candidates", "validate", "text_full"]

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


def text_full(n: int, value) -> np.ndarray:
    """An object array of ``n`` references to ``value`` (``np.full`` with
    ``dtype=object`` converts a string through a text array, ~40x slower)."""
    out = np.empty(n, dtype=object)
    out.fill(value)
    return out


def _first_bad(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def _text(s: pl.Series, fill: str) -> tuple[np.ndarray, list[str]]:
    """A text column as an object array of ``str`` and its distinct values.

    Built from the distinct values and their codes, so each distinct string
    is one Python object (a per-row conversion costs ~0.3 us a row)."""
    x = s.cast(pl.String).fill_null(fill)
    uniq = x.unique(maintain_order=True)
    codes = x.cast(pl.Enum(uniq)).to_physical().to_numpy()
    values = uniq.to_list()
    return np.array(values, dtype=object)[codes], values


def validate(df: pl.DataFrame, family: Family, offset: int = 0) -> tuple[dict, np.ndarray]:
    """Check ``df`` against ``family.columns``.

    Returns ``(cols, is_library)``: numpy arrays per column (defaults
    filled) and a boolean mask of library rows (``backend == 'cublas'``),
    whose tile columns may be null. Errors name rows counted from
    ``offset`` (the first row of ``df`` in a larger table).
    """
    n = df.height
    cols: dict[str, np.ndarray] = {}
    names = set(df.columns)
    is_lib = np.zeros(n, dtype=bool)
    if "backend" in names and any(c.name == "backend" for c in family.columns):
        b = df.get_column("backend")
        if b.dtype not in (pl.String, pl.Categorical, pl.Enum):
            raise InputError(f"column 'backend' must be text, got {b.dtype}")
        is_lib = (b.cast(pl.String).fill_null("triton") == "cublas").to_numpy()
    any_lib = bool(is_lib.any())
    # library rows (GEMM's backend == 'cublas') carry no tile columns
    tile_cols = (("block_m", "block_n", "block_k", "num_stages", "num_warps")
                 if any(c.name == "backend" for c in family.columns) else ())
    missing = [c.name for c in family.columns if c.required and c.name not in names
               and not (c.name in tile_cols and n > 0 and is_lib.all())]
    if missing:
        need = ", ".join(c.name for c in family.columns if c.required)
        raise InputError(f"missing column{'s' if len(missing) > 1 else ''} "
                         f"{', '.join(repr(m) for m in missing)}; {family.name} candidates need: {need}")
    for c in family.columns:
        if c.name not in names:
            if c.name in tile_cols and c.required:
                cols[c.name] = np.zeros(n, dtype=np.int64)
                continue
            cols[c.name] = (text_full(n, c.default) if c.kind == "str"
                           else np.full(n, c.default))
            continue
        s = df.get_column(c.name)
        has_null = s.null_count() > 0
        nulls = s.is_null().to_numpy() if has_null else None
        uniq = None
        if c.kind == "int":
            if s.dtype not in _INT and s.dtype != pl.Null:
                raise InputError(f"column '{c.name}' must be integer, got {s.dtype}")
            if has_null:
                s = s.fill_null(0 if c.required else (c.default or 0))
            arr = (s if s.dtype == pl.Int64 else s.cast(pl.Int64)).to_numpy()
        elif c.kind == "bool":
            if s.dtype not in (pl.Boolean, pl.Null):
                raise InputError(f"column '{c.name}' must be boolean, got {s.dtype}")
            if has_null:
                s = s.fill_null(bool(c.default))
            arr = s.to_numpy().astype(bool, copy=False)
        elif c.kind == "str":
            if s.dtype not in (pl.String, pl.Categorical, pl.Enum, pl.Null):
                raise InputError(f"column '{c.name}' must be text, got {s.dtype}")
            arr, uniq = _text(s, c.default if c.default is not None else "")
        else:
            arr = s.cast(pl.Float64).to_numpy()
        if has_null:
            bad = nulls & ~is_lib if c.name in tile_cols else nulls
            if c.required and bad.any():
                i = _first_bad(bad)
                raise InputError(f"column '{c.name}' has a null value at row {offset + i}")
        if c.positive and n and arr.min() <= 0:
            check = np.ones(n, dtype=bool) if nulls is None else ~nulls
            if c.name in tile_cols and any_lib:
                check &= ~is_lib
            bad = check & (arr <= 0)
            if bad.any():
                i = _first_bad(bad)
                raise InputError(f"column '{c.name}' must be positive; row {offset + i} "
                                 f"has {arr[i]}")
        if c.choices:
            unknown = sorted(set(uniq if uniq is not None else np.unique(arr.astype(str)).tolist())
                             - set(c.choices))
            if unknown:
                i = _first_bad(arr.astype(str) == unknown[0])
                raise InputError(f"column '{c.name}' has unknown value {unknown[0]!r} at row "
                                 f"{offset + i}; known: {', '.join(c.choices)}")
        cols[c.name] = arr
    return cols, is_lib
