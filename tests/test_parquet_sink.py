"""tsbatch.boundary.io.ParquetSink: a streamed sink (each batch written on a thread)
writes the file a held-back sink writes, and a failed write leaves no file."""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest
from polars.testing import assert_frame_equal

from tsbatch.boundary.io import ParquetSink, read_metadata


def _batches(k: int, rows: int) -> list[pl.DataFrame]:
    rng = np.random.default_rng(k)
    return [pl.DataFrame({"i": np.arange(rows) + j * rows, "x": rng.random(rows),
                          "s": rng.choice(["a", "bb", ""], rows), "b": rng.random(rows) < 0.5,
                          "f": np.where(rng.random(rows) < 0.1, np.nan, rng.random(rows))})
            for j in range(k)]


@pytest.mark.parametrize("k", [1, 2, 5])
def test_streamed_sink_writes_the_same_file(tmp_path, k):
    meta = {"tsbatch.model_version": "x", "tsbatch.hw": "h100"}
    parts = _batches(k, 1000)
    for stream in (False, True):
        with ParquetSink(tmp_path / f"{stream}.parquet", meta, stream=stream) as sink:
            for p in parts:
                sink.write(p)
            sink.commit()
    a = pl.read_parquet(tmp_path / "False.parquet")
    b = pl.read_parquet(tmp_path / "True.parquet")
    assert_frame_equal(a, b)
    assert_frame_equal(b, pl.concat(parts))
    assert read_metadata(tmp_path / "True.parquet") == meta
    if k > 1:  # pyarrow's writer: float columns plainly encoded, the others by dictionary
        md = pq.ParquetFile(tmp_path / "True.parquet").metadata.row_group(0)
        enc = {md.column(j).path_in_schema: md.column(j).encodings for j in range(md.num_columns)}
        assert not any("DICTIONARY" in e or "RLE_DICTIONARY" in e for e in enc["x"])
        assert any("DICTIONARY" in e for e in enc["s"])
    assert list(tmp_path.glob(".*tmp*")) == []


def test_a_failed_streamed_write_raises_and_leaves_no_file(tmp_path):
    out = tmp_path / "o.parquet"
    a, b = _batches(2, 100)
    with pytest.raises(Exception):
        with ParquetSink(out, {}, stream=True) as sink:
            sink.write(a)
            # a batch whose column cannot take the file's type: the writer fails
            sink.write(b.with_columns(pl.lit("not a number").alias("x")))
            sink.commit()
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


def test_an_error_on_the_writer_thread_is_raised_by_the_next_call(tmp_path):
    out = tmp_path / "o.parquet"
    a, b, c = _batches(3, 100)
    with pytest.raises(OSError, match="disk full"):
        with ParquetSink(out, {}, stream=True) as sink:
            sink.write(a)
            sink._wait()

            def fail(table):
                raise OSError("disk full")

            sink.writer.write_table = fail
            sink.write(b)  # fails on the thread
            sink.write(c)  # raises the error of b
            sink.commit()
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []
