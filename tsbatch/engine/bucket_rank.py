"""Full ranking of a sweep larger than memory: workload buckets on disk.

``tsbatch evaluate --rank`` without ``--top`` keeps every feasible row, so
the screen of :mod:`tsbatch.engine.screen` has nothing to leave out and its
running set would grow to the whole sweep. Instead the workloads, sorted as
the output is, are cut into contiguous buckets of at most ``max_rows``
candidates (a workload is never split; one larger than ``max_rows`` is a
bucket of its own). Each evaluated record batch is split by bucket and
appended to that bucket's spill files with every row's input position;
then each bucket in turn is read back, ranked with :func:`tsbatch.engine.rank.rank`
(ties by input position) and streamed to the output. Memory is one record
batch while evaluating and one bucket while ranking; the result equals
``rank(evaluate(all rows), workload, top)`` row for row, because a
workload's rows all sit in one bucket and the buckets follow the output's
workload order.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np
import polars as pl

from tsbatch.engine.rank import rank
from tsbatch.engine.screen import COUNT_COL, _key_frame

__all__ = ["BucketRanker", "bucket_map"]

BUCKET_COL = "_bucket"
POS_COL = "_pos"


def bucket_map(counts: pl.DataFrame, workload: list[str], max_rows: int) -> pl.DataFrame:
    """Workload columns and :data:`BUCKET_COL`: contiguous runs of the sorted
    workloads holding at most ``max_rows`` rows (a larger workload alone)."""
    if max_rows < 1:
        raise ValueError(f"max_rows must be positive, got {max_rows}")
    c = counts.sort(workload) if workload else counts
    n = c.get_column(COUNT_COL).to_numpy()
    bucket = np.empty(n.shape[0], dtype=np.int64)
    b, filled = 0, 0
    for i, rows in enumerate(n):  # one step per workload, not per candidate row
        if filled > 0 and filled + rows > max_rows:
            b, filled = b + 1, 0
        bucket[i] = b
        filled += int(rows)
    return c.select(workload).with_columns(pl.Series(BUCKET_COL, bucket))


class BucketRanker:
    """Collect evaluated batches in workload buckets on disk, then rank each.

    ``counts`` is :func:`tsbatch.engine.screen.workload_counts` of the whole input;
    ``spill_dir`` (default: a new temporary folder next to nothing in
    particular, see :func:`tempfile.mkdtemp`) holds the spill files and is
    removed by :meth:`close`.
    """

    def __init__(self, workload: list[str], counts: pl.DataFrame, max_rows: int = 1_000_000,
                 spill_dir: str | Path | None = None):
        self.workload = list(workload)
        self.map = bucket_map(counts, self.workload, max_rows) if self.workload else None
        self.n_buckets = int(self.map[BUCKET_COL].max()) + 1 if self.map is not None and self.map.height else 1
        self.dir = Path(tempfile.mkdtemp(prefix="tsbatch-rank-", dir=spill_dir))
        self.parts = 0
        self.rows = 0
        self.template: pl.DataFrame | None = None

    def add(self, results: pl.DataFrame) -> None:
        """Spill one batch of :func:`tsbatch.engine.evaluate.evaluate` results (in input order)."""
        if self.template is None:
            self.template = results.head(0)
        pos = pl.int_range(self.rows, self.rows + results.height, dtype=pl.Int64, eager=True)
        df = results.with_columns(pos.alias(POS_COL))
        self.rows += results.height
        if self.map is None:
            buckets = np.zeros(df.height, dtype=np.int64)
        else:
            got = _key_frame(df, self.workload).join(self.map, on=self.workload, how="left",
                                                     maintain_order="left", nulls_equal=True)
            b = got.get_column(BUCKET_COL)
            if b.null_count():
                raise ValueError("a batch holds a workload that the workload counts did not see")
            buckets = b.to_numpy()
        for bk in np.unique(buckets):
            part = df.filter(pl.Series(buckets == bk))
            part.write_parquet(self.dir / f"b{int(bk):06d}-{self.parts:06d}.parquet")
            self.parts += 1

    def ranked(self, top: float = 1.0):
        """Yield each bucket's ranked rows, in output order."""
        for bk in range(self.n_buckets):
            files = sorted(self.dir.glob(f"b{bk:06d}-*.parquet"))
            if not files:
                continue
            df = pl.concat([pl.read_parquet(f) for f in files], how="vertical_relaxed")
            yield rank(df, self.workload, top, order_col=POS_COL)
            for f in files:
                f.unlink()

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
