"""Validation of candidate tables at the boundary.

Turns a polars DataFrame into a dict of contiguous numpy arrays of declared
dtypes, with defaults filled for optional columns. Every problem raises one
:class:`~tsbatch.errors.InputError` naming the column (and the first bad
row and value); nothing is partially evaluated.
"""

from __future__ import annotations

import re

from pathlib import Path

import numpy as np
import polars as pl

from kernels_catalog.base import Family
from tsbatch.errors import InputError

__all__ = ["to_polars", "read_candidates", "read_table", "scan_table", "table_format", "FORMATS",
           "READ_ERRORS", "validate", "text_full"]

_INT = (pl.Int8, pl.Int16, pl.Int32, pl.Int64, pl.UInt8, pl.UInt16, pl.UInt32, pl.UInt64)


#: candidate table formats, by file extension (anything else is read as Parquet)
FORMATS = {
    ".parquet": "parquet", ".pq": "parquet",
    ".arrow": "ipc", ".feather": "ipc", ".ipc": "ipc",
    ".csv": "csv",
    ".ndjson": "ndjson", ".jsonl": "ndjson",
}
_FORMAT_NAMES = {"parquet": "Parquet", "ipc": "Arrow IPC (Feather)", "csv": "CSV",
                 "ndjson": "NDJSON"}


def table_format(path: str | Path) -> str:
    """``parquet``, ``ipc``, ``csv`` or ``ndjson``, from the file's extension."""
    return FORMATS.get(Path(path).suffix.lower(), "parquet")


def _first_line(exc: Exception, limit: int = 200) -> str:
    text = str(exc).strip()
    line = text.splitlines()[0] if text else ""
    return line if len(line) <= limit else line[:limit] + "..."


def _check_file(path: Path, what: str) -> str:
    if not path.exists():
        raise InputError(f"{path}: no such file")
    if path.is_dir():
        raise InputError(f"{path}: is a directory, expected a {what} file")
    return table_format(path)


def table_error(path: str | Path, exc: Exception) -> InputError:
    """The one-line :class:`InputError` of a table that cannot be read."""
    fmt = _FORMAT_NAMES[table_format(path)]
    return InputError(f"{path}: not a readable {fmt} file ({type(exc).__name__}: "
                      f"{_first_line(exc)})")


def _check_columns(path: Path, names) -> None:
    seen = set()
    for c in names:
        if "\x00" in c:
            raise InputError(f"{path}: column name {c!r} holds a NUL character")
        if c in seen:
            raise InputError(f"{path}: column {c!r} appears more than once")
        seen.add(c)


#: what a reader may raise on a malformed file (polars panics are BaseExceptions)
READ_ERRORS = (Exception, pl.exceptions.PanicException)


def _read_ipc(path: Path) -> pl.DataFrame:
    """An Arrow IPC (Feather) file, through pyarrow (whose reader checks the file's
    buffers; polars' may panic on a malformed one)."""
    import pyarrow.feather as feather

    table = feather.read_table(path, memory_map=False)
    _check_columns(path, table.column_names)
    return pl.from_arrow(table) if table.num_columns else pl.DataFrame()


#: per format (as _check_file names it): a lazy scan and an eager read
_READERS = {
    "ipc": (lambda p: _read_ipc(p).lazy(), _read_ipc),
    "csv": (pl.scan_csv, pl.read_csv),
    "ndjson": (pl.scan_ndjson, pl.read_ndjson),
    "parquet": (pl.scan_parquet, pl.read_parquet),
}


def scan_table(path: str | Path) -> pl.LazyFrame:
    """A lazy scan of a table file in the format its extension names (Arrow IPC
    is read at once, see :func:`_read_ipc`)."""
    path = Path(path)
    fmt = _check_file(path, "table")
    try:
        lf = _READERS[fmt][0](path)
        _check_columns(path, lf.collect_schema().names())
    except InputError:
        raise
    except READ_ERRORS as exc:  # polars raises several types for unreadable files
        raise table_error(path, exc) from exc
    return lf


def read_table(path: str | Path, what: str = "candidate") -> pl.DataFrame:
    """Read a table file (Parquet, Arrow IPC/Feather, CSV or NDJSON by extension);
    an unreadable one raises a one-line :class:`InputError` naming the file."""
    path = Path(path)
    fmt = _check_file(path, what)
    try:
        df = _READERS[fmt][1](path)
    except InputError:
        raise
    except READ_ERRORS as exc:  # polars raises several types for corrupt files
        raise table_error(path, exc) from exc
    _check_columns(path, df.columns)
    return df


def read_candidates(path: str | Path) -> pl.DataFrame:
    """Read a candidate table (Parquet, Arrow IPC/Feather, CSV or NDJSON, by
    extension); unreadable files raise :class:`InputError`."""
    return read_table(path, "candidate")


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


_WIDE_INT = tuple(t for t in (pl.UInt64, getattr(pl, "Int128", None), getattr(pl, "UInt128", None))
                  if t is not None)
_I64_MAX, _I64_MIN = int(np.iinfo(np.int64).max), int(np.iinfo(np.int64).min)


def _beyond_i64(x, dtype):
    """Where ``x`` (a Series or an expression of integer type ``dtype``) leaves int64."""
    return (x > _I64_MAX) | (x < _I64_MIN) if dtype.is_signed_integer() else (x > _I64_MAX)


def check_int_range(frame: "pl.DataFrame | pl.LazyFrame", source) -> None:
    """Raise :class:`InputError` when an integer column wider than int64 (UInt64,
    Int128: NDJSON or CSV numbers past 2^63) holds a value beyond int64; the
    model's integer columns are int64."""
    sch = frame.collect_schema() if isinstance(frame, pl.LazyFrame) else frame.schema
    wide = [c for c, t in sch.items() if t in _WIDE_INT]
    if not wide:
        return
    lf = frame.lazy()
    got = lf.select([_beyond_i64(pl.col(c), sch[c]).any().alias(c) for c in wide]).collect()
    for c in wide:
        if got[c][0]:
            raise InputError(f"{source}: column {c!r} has a value beyond int64")


def _first_bad(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def _text(s: pl.Series, fill: str) -> tuple[np.ndarray, list[str]]:
    """A text column as an object array of ``str`` and its distinct values.

    Built from the distinct values and their codes, so each distinct string
    is one Python object (a per-row conversion costs ~0.3 us a row). A column
    of one value (a sweep's dtype in a 64k-row bound slice) is one comparison
    and references to its first value, the same array without hashing every
    row twice (1.57 -> 0.18 ms per 64k rows)."""
    x = s.cast(pl.String).fill_null(fill)
    if x.len():
        first = x[0]
        if (x == first).all():
            return text_full(x.len(), first), [first]
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
            if s.dtype in _WIDE_INT and s.len():
                big = _beyond_i64(s, s.dtype).fill_null(False).to_numpy()
                if big.any():
                    i = _first_bad(big)
                    raise InputError(f"column '{c.name}' has {s[i]} at row {offset + i}, beyond "
                                     f"int64")
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
            if not (s.dtype.is_numeric() or s.dtype == pl.Null):
                raise InputError(f"column '{c.name}' must be a number, got {s.dtype}")
            if has_null:
                s = s.fill_null(float(c.default) if c.default is not None else 0.0)
            arr = s.cast(pl.Float64).to_numpy()
            if n and not np.isfinite(arr).all():
                i = _first_bad(~np.isfinite(arr))
                raise InputError(f"column '{c.name}' must be a finite number; row {offset + i} "
                                 f"has {arr[i]}")
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
            fillv = c.default if c.default is not None else ""
            if (unknown and has_null and not c.required and fillv in unknown
                    and not (arr[~nulls] == fillv).any()):
                # a null of an optional column reads as its default (the family's
                # own "chosen"), not as a value to check
                unknown.remove(fillv)
            if unknown:
                i = _first_bad(arr.astype(str) == unknown[0])
                raise InputError(f"column '{c.name}' has unknown value {unknown[0]!r} at row "
                                 f"{offset + i}; known: {', '.join(c.choices)}")
        if c.pattern and c.kind == "str":
            vals = uniq if uniq is not None else np.unique(arr.astype(str)).tolist()
            rx = re.compile(c.pattern)
            bad_vals = sorted(v for v in vals if rx.fullmatch(str(v)) is None)
            if bad_vals:
                i = _first_bad(arr.astype(str) == bad_vals[0])
                raise InputError(f"column '{c.name}' has {bad_vals[0]!r} at row {offset + i}; "
                                 f"expected {c.pattern_doc or 'text matching ' + repr(c.pattern)}")
        cols[c.name] = arr
    return cols, is_lib
