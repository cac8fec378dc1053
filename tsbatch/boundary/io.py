"""Parquet output with provenance metadata, written atomically.

Every file tsbatch writes carries in its schema metadata the model version,
the hardware spec used (as JSON) and a hash over every input that shaped the
result (candidate or sweep file, hardware file, family catalog source). A
file is written to a temporary sibling and renamed into place only when
complete, so a failed run leaves no partial output.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import polars as pl

import tsbatch
from tsbatch.errors import InputError
from tsbatch.hw import HwSpec

__all__ = ["provenance", "ParquetSink", "write_parquet", "read_output", "is_csv", "sha256_file",
           "sha256_bytes"]


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _catalog_hash(family: str) -> str:
    """A hash of what defines a family: its tile program file (and the engine's
    lowering), or its catalog module."""
    import importlib
    import importlib.util

    from kernels_catalog.registry import get_family  # noqa: PLC0415 (not needed at import)

    fam = get_family(family)
    prog = getattr(fam, "program", None)
    if prog is not None and Path(prog.source).is_file():
        # the lowering's file, found without running the module (GEMM's evaluate never imports it)
        low = importlib.util.find_spec("kernels_catalog.lowering").origin
        return sha256_bytes((sha256_file(prog.source) + sha256_file(low)).encode())
    try:
        mod = importlib.import_module(f"kernels_catalog.{family}")
    except ImportError:  # a family defined in a module of another name (collectives)
        fn = fam.evaluate if fam.evaluate is not None else fam.lower
        mod = importlib.import_module(fn.__module__)
    return sha256_file(mod.__file__)


def provenance(hw: HwSpec, family: str, inputs: dict[str, str], extra: dict | None = None) -> dict:
    """Metadata dict (str -> str) for a result file."""
    parts = {"hw_file": hw.file_sha256, "catalog": _catalog_hash(family), **inputs}
    combined = sha256_bytes(json.dumps(parts, sort_keys=True).encode())
    meta = {
        "tsbatch.version": tsbatch.__version__,
        "tsbatch.model_version": tsbatch.MODEL_VERSION,
        "tsbatch.family": family,
        "tsbatch.hw": hw.key,
        "tsbatch.hw_spec": json.dumps(hw.to_dict(), sort_keys=True, default=str),
        "tsbatch.input_hashes": json.dumps(parts, sort_keys=True),
        "tsbatch.input_hash": combined,
    }
    if extra:
        meta.update({f"tsbatch.{k}": (v if isinstance(v, str) else json.dumps(v))
                     for k, v in extra.items()})
    return meta


def is_csv(path: str | Path) -> bool:
    """Whether an output path names a CSV file (else Parquet is written)."""
    return Path(path).suffix.lower() == ".csv"


def read_output(path: str | Path, n_rows: int | None = None) -> pl.DataFrame:
    """Read back an output file written by :class:`ParquetSink` (Parquet or CSV)."""
    if is_csv(path):
        return pl.read_csv(path, n_rows=n_rows, infer_schema_length=None)
    return pl.read_parquet(path, n_rows=n_rows)


class ParquetSink:
    """Append record batches to a Parquet file; commit renames it into place.

    The first batch is held back: a file of one batch (the common small run,
    e.g. an autotuner's) is written by polars alone, and pyarrow, whose import
    costs a quarter of a second, is loaded only when a second batch arrives
    and batches must be streamed into one file.

    ``stream=True`` (the caller knows several batches will come): nothing is
    held back, and each batch is encoded on a writer thread while the caller
    computes the next (pyarrow releases the GIL while it encodes); at most one
    batch is being written at a time, and its error is raised by the next
    :meth:`write` or by :meth:`commit`. The file is the same either way.

    Float columns are written without dictionary encoding: their values are
    nearly all distinct, so the dictionary is built and then dropped for plain
    encoding, 40 % of the encoding time, and the plain pages compress smaller
    (27 against 35 MB for 21 float columns of 1M result rows).

    A path ending in ``.csv`` is written as CSV instead (a header, then every
    batch's rows; no metadata: CSV has no place for it). Columns CSV cannot
    hold (lists, structs) raise :class:`InputError` and nothing is written.
    """

    def __init__(self, path: str | Path, metadata: dict[str, str], stream: bool = False):
        self.path = Path(path)
        parent = self.path.parent if str(self.path.parent) else Path(".")
        if not parent.exists():
            raise InputError(f"{self.path}: output directory {parent} does not exist")
        if self.path.is_dir():
            raise InputError(f"{self.path}: output path is a directory")
        self.tmp = parent / f".{self.path.name}.tmp-{os.getpid()}"
        self.metadata = dict(metadata)
        self.pending: pl.DataFrame | None = None
        self.writer = None  # pyarrow.parquet.ParquetWriter once streaming
        self.rows = 0
        self.csv = is_csv(self.path)
        self._csv_started = False
        self.stream = bool(stream)
        self._job: threading.Thread | None = None  # the batch being written (stream)
        self._job_error: BaseException | None = None

    def _write_csv(self, df: pl.DataFrame) -> None:
        for name, dtype in df.schema.items():
            if dtype.is_nested() or dtype == pl.Object:
                raise InputError(f"{self.path}: column {name!r} of type {dtype} cannot be "
                                 f"written to CSV (write Parquet instead)")
        with open(self.tmp, "ab" if self._csv_started else "wb") as fh:
            df.write_csv(fh, include_header=not self._csv_started)
        self._csv_started = True

    def _append(self, df: pl.DataFrame) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = df.to_arrow()
        if self.writer is None:
            md = {k.encode(): v.encode() for k, v in self.metadata.items()}
            dict_cols = [f.name for f in table.schema if not pa.types.is_floating(f.type)]
            self.writer = pq.ParquetWriter(self.tmp, table.schema.with_metadata(md),
                                           compression="zstd", use_dictionary=dict_cols)
        table = table.cast(self.writer.schema)
        if not self.stream:
            self.writer.write_table(table)
            return
        self._wait()

        def run():
            try:
                self.writer.write_table(table)
            except BaseException as exc:  # raised by the next write or the commit
                self._job_error = exc

        self._job = threading.Thread(target=run, name="tsbatch-parquet-write", daemon=True)
        self._job.start()

    def _wait(self) -> None:
        """Wait for the batch being written; raise its error."""
        if self._job is not None:
            self._job.join()
            self._job = None
        if self._job_error is not None:
            exc, self._job_error = self._job_error, None
            raise exc

    def write(self, df: pl.DataFrame) -> None:
        if self.csv:
            self._write_csv(df)
            self.rows += df.height
            return
        if self.writer is None and self.pending is None and not self.stream:
            self.pending = df
        else:
            if self.pending is not None:
                self._append(self.pending)
                self.pending = None
            self._append(df)
        self.rows += df.height

    def commit(self, empty_schema: pl.DataFrame | None = None) -> None:
        if self.csv:
            if not self._csv_started:
                self._write_csv((empty_schema if empty_schema is not None
                                 else pl.DataFrame()).head(0))
            os.replace(self.tmp, self.path)
            return
        if self.writer is None:
            df = self.pending
            if df is None:
                df = (empty_schema if empty_schema is not None else pl.DataFrame()).head(0)
            df.write_parquet(self.tmp, compression="zstd", metadata=self.metadata)
            self.pending = None
        else:
            self._wait()
            self.writer.close()
        os.replace(self.tmp, self.path)

    def abort(self) -> None:
        self.pending = None
        try:
            self._wait()
        except BaseException:  # the run failed already; its own error is the one raised
            pass
        if self.writer is not None:
            try:
                self.writer.close()
            except Exception:  # pragma: no cover
                pass
        if self.tmp.exists():
            self.tmp.unlink()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self.abort()
        return False


def write_parquet(df: pl.DataFrame, path: str | Path, metadata: dict[str, str]) -> None:
    with ParquetSink(path, metadata) as sink:
        sink.write(df)
        sink.commit()


def read_metadata(path: str | Path) -> dict[str, str]:
    """The ``tsbatch.*`` provenance entries of a Parquet file's metadata."""
    md = pl.read_parquet_metadata(path)
    return {k: v for k, v in md.items() if k.startswith("tsbatch.")}


def read_ahead(reads: list[Callable[[], object]]) -> Iterator:
    """Yield ``read()`` of each of ``reads`` in order, the next one running on a
    thread while the consumer works on the current one (one read ahead, so at
    most two results are held). A read's exception is raised where its result
    would have been yielded. Parquet decoding releases the GIL, so the read of
    batch ``i + 1`` overlaps the work on batch ``i``."""
    box: list = [None]

    def start(fn):
        def run():
            try:
                box[0] = (True, fn())
            except BaseException as exc:  # handed to the consumer
                box[0] = (False, exc)

        t = threading.Thread(target=run, name="tsbatch-read-ahead", daemon=True)
        t.start()
        return t

    if not reads:
        return
    t = start(reads[0])
    for i in range(len(reads)):
        t.join()
        ok, val = box[0]
        box[0] = None
        if not ok:
            raise val
        if i + 1 < len(reads):
            t = start(reads[i + 1])
        yield val
