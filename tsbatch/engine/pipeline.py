"""The evaluation pipeline: candidate rows from one source, predicted for one GPU
and one family, in one ranking mode, yielded in output order or written.

Both front doors call it: ``tsbatch evaluate`` (:mod:`tsbatch.front.cli` parses the
arguments, calls :func:`evaluate_file` and prints) and the Python API
(:mod:`tsbatch.front.api` converts tables, calls :func:`evaluate_frame`)::

    source: a table file (streamed by record batches) or a table in memory
      |
      +- every row ............................ evaluate each batch, input order
      +- ranked, a family without a tile plan . evaluate every row, then rank
      |                                         (collectives, fused: nothing to bound)
      +- ranked, top 100 %, several batches ... workload buckets on disk, ranked
      |                                         one bucket at a time (bucket_rank)
      +- ranked, top K per workload ........... screened (screen.TopKScreen): only
                                                rows that can still be kept are
                                                predicted in full; a file of several
                                                batches is surveyed (read 3 times)
      |
    results: :func:`results` yields them; :func:`write` streams them to a Parquet
    (or CSV) file written atomically; :func:`collect` concatenates them

The rows are those of ``rank(evaluate(rows), workload, top)`` (ranked) or
``evaluate(rows)`` (every row) whatever the path (tests/test_screen.py,
tests/test_bucket_rank.py and tests/test_api.py hold this).
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from tsbatch.errors import InputError

__all__ = ["Source", "Stats", "Summary", "NoBar", "open_file", "table_source", "results", "write", "collect",
           "evaluate_file", "evaluate_frame", "output_path", "named", "file_family",
           "resolve_family",
           "RANKED_MEMO_PROBLEMS"]

#: cache problems remembered across the batches of a ranked evaluate (about 200
#: bytes each): bounds the memo, which otherwise grows with the rows predicted
RANKED_MEMO_PROBLEMS = 250_000


# ----------------------------------------------------------------------------- boundary
def output_path(p: str | Path) -> Path:
    """``p`` as an output path; an :class:`InputError` when it cannot be written."""
    path = Path(p)
    if path.exists() and path.is_dir():
        raise InputError(f"{path}: output path is a directory")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise InputError(f"{path}: output directory {parent} does not exist")
    return path


def named(src, exc: InputError) -> InputError:
    """``exc`` with the file ``src`` named first (validation errors name only the column)."""
    text = str(exc)
    return exc if text.startswith(str(src)) else InputError(f"{src}: {text}")


class NoBar:
    """No progress shown: the calls of a tqdm bar, doing nothing."""

    def update(self, n: int) -> None:
        pass

    def set_description(self, desc: str, refresh: bool = True) -> None:
        pass

    def close(self) -> None:
        pass


#: a progress bar factory: ``bar(total_rows, description, show)`` -> an object with
#: tqdm's ``update``, ``set_description`` and ``close``
BarFactory = Callable[[int, str, bool], object]


def _no_bar(total: int, desc: str, show: bool = True) -> NoBar:
    return NoBar()


@dataclass
class Source:
    """Candidate rows: a Parquet file read ``batch_rows`` at a time, or a table in
    memory (``frame``: one batch). ``name`` is what errors name (the user's file)."""

    name: str
    total: int
    names: list[str]
    path: str | None = None
    frame: pl.DataFrame | None = None
    batch_rows: int = 1_000_000

    @property
    def one(self) -> bool:
        """Whether the rows are one batch (read at once)."""
        return self.frame is not None or self.total <= self.batch_rows

    def _read_batch(self, a: int) -> pl.DataFrame:
        from tsbatch.boundary.schema import READ_ERRORS, table_error

        try:
            return pl.scan_parquet(self.path).slice(a, self.batch_rows).collect()
        except READ_ERRORS as exc:  # a file corrupt past its footer
            raise table_error(self.name, exc) from exc

    def stream(self) -> Iterator[pl.DataFrame]:
        """The batches, each read when it is needed (a slice of the scan; polars'
        collect_batches reads ahead of a slow consumer and would end up holding the
        whole file), the next one read on a thread while this one is worked on.
        A new iterator each call: a surveyed ranking reads the stream three times."""
        from tsbatch.boundary.io import read_ahead

        return read_ahead([(lambda a=a: self._read_batch(a))
                           for a in range(0, self.total, self.batch_rows)])

    def batches(self) -> list[pl.DataFrame] | Iterator[pl.DataFrame]:
        if self.frame is not None:
            return [self.frame]
        if self.one:
            from tsbatch.boundary.schema import read_candidates

            return [read_candidates(self.path)]
        return self.stream()

    def workload_source(self, first: pl.DataFrame | None):
        """What :func:`tsbatch.engine.screen.workload_counts` scans: the one batch, or the file."""
        return first if self.one else self.path


def table_source(frame: pl.DataFrame) -> Source:
    """A table in memory as a source of one batch."""
    return Source(name="", total=frame.height, names=list(frame.columns), frame=frame)


def _to_parquet(src, dst: Path) -> str:
    from tsbatch.boundary.schema import READ_ERRORS, scan_table, table_error

    lf = scan_table(src)
    try:
        lf.sink_parquet(dst)
    except READ_ERRORS as exc:  # several types, unreadable files
        raise table_error(src, exc) from exc
    return str(dst)


@contextlib.contextmanager
def parquet_copy(src) -> Iterator[str]:
    """``src`` as a Parquet path: Arrow IPC, CSV and NDJSON are streamed into a
    temporary Parquet file once, which batched reads and workload counts then scan."""
    from tsbatch.boundary.schema import table_format

    with tempfile.TemporaryDirectory(prefix="tsbatch-in-") as tmp:
        if table_format(src) != "parquet":
            yield _to_parquet(src, Path(tmp) / "candidates.parquet")
        else:
            yield str(src)


def open_file(path: str, name, batch_rows: int) -> Source:
    """The source of a Parquet file ``path`` (the user's file ``name``): its row
    count and columns from a scan; integers beyond int64 are an :class:`InputError`."""
    from tsbatch.boundary.schema import READ_ERRORS, check_int_range, scan_table, table_error

    scan = scan_table(path)  # a one-line InputError when unreadable
    try:
        total = scan.select(pl.len()).collect().item()
        names = scan.collect_schema().names()
        check_int_range(scan, name)
    except InputError:
        raise
    except READ_ERRORS as exc:  # several types, corrupt files
        raise table_error(name, exc) from exc
    return Source(name=str(name), total=total, names=names, path=path, batch_rows=batch_rows)


def resolve_family(family, names):
    """The family named (a name, a :class:`Family` or a program file), or the one
    whose columns ``names`` are."""
    from kernels_catalog.registry import detect_family, get_family

    return get_family(detect_family(names) if family is None else family)


def file_family(path):
    """The family whose columns the table file ``path`` has (an error naming the
    file, and the family its columns come closest to, when none has them)."""
    from tsbatch.boundary.schema import scan_table

    try:
        return resolve_family(None, scan_table(path).collect_schema().names())
    except InputError as exc:
        raise named(path, exc) from None


# ----------------------------------------------------------------------------- engine
@dataclass
class Stats:
    """What a run did: rows read, infeasible, kept, predicted in full, and how."""

    how: str = ""  #: "all", "ranked_all" (no tile plan), "buckets" or "screened"
    n_rows: int = 0
    n_infeasible: int = 0
    kept: int = 0
    n_predicted: int | None = None  #: screened: rows predicted in full
    bucket_rows: int = 0
    #: the schema of an empty result (written when no row is kept)
    empty_schema: pl.DataFrame | None = field(default=None, repr=False)


def _evaluated(res: pl.DataFrame, df: pl.DataFrame, stats: Stats) -> pl.DataFrame:
    stats.n_rows += df.height
    stats.n_infeasible += int((~res.get_column("feasible")).sum())
    return res


def results(source: Source, hw, fam, *, ranked: bool = False, top: float = 1.0,
            sampling: dict | None = None, rank_bucket_rows: int = 500_000,
            spill_dir: str | Path | None = None, stats: Stats | None = None,
            progress: BarFactory | None = None, workload: list[str] | None = None,
            timings: dict | None = None) -> Iterator[pl.DataFrame]:
    """Yield the result rows of ``source`` in output order, in parts.

    ``ranked``: per workload ranked and cut to the ``top`` fraction (1.0: every
    feasible row, ranked); else every row, in input order. ``hw`` a loaded spec,
    ``fam`` a :class:`~kernels_catalog.base.Family`, ``sampling`` checked
    (:func:`tsbatch.engine.evaluate.check_sampling`). ``stats`` is filled as the parts
    go; ``progress`` makes the bars of a file of several batches. ``workload``:
    the columns a workload is ranked within (default: the family's that the
    source has); ``timings`` collects the screen's stage times.
    """
    from tsbatch.engine.evaluate import CacheMemo, evaluate

    stats = stats if stats is not None else Stats()
    bar = progress or _no_bar
    sampling = sampling or {}
    one = source.one
    batches = source.batches()
    wl = [c for c in (fam.workload_columns if workload is None else workload)
          if c in source.names]
    if ranked and fam.lower is None:
        # a family that evaluates its frames itself (collectives) has no tile plan
        # to screen or bound: every row is predicted, then ranked
        from tsbatch.engine.rank import rank

        stats.how = "ranked_all"
        parts = [_evaluated(evaluate(df, hw, fam, **sampling), df, stats) for df in batches]
        res = rank(pl.concat(parts, how="vertical") if parts else None, wl, top)
        stats.kept = res.height
        yield res
        return
    # cache problems solved in one batch are reused by the next (none to share
    # when the rows are one batch)
    memo = None if one else CacheMemo(max_problems=RANKED_MEMO_PROBLEMS)
    if ranked and top >= 1.0 and not one:
        # every feasible row is kept, so there is nothing to screen out: the
        # predictions go to workload buckets on disk and are ranked one bucket
        # at a time (tsbatch.engine.bucket_rank), never the whole sweep in memory
        from tsbatch.engine.bucket_rank import BucketRanker
        from tsbatch.engine.rank import rank
        from tsbatch.engine.screen import workload_counts

        stats.how, stats.bucket_rows = "buckets", rank_bucket_rows
        with BucketRanker(wl, workload_counts(source.path, wl), rank_bucket_rows,
                          spill_dir=spill_dir) as br:
            b = bar(source.total, "evaluate", not one)
            for df in batches:
                br.add(_evaluated(evaluate(df, hw, fam, cache_memo=memo, **sampling), df, stats))
                b.update(df.height)
            b.close()
            for part in br.ranked(top):
                stats.kept += part.height
                yield part
            stats.empty_schema = rank(br.template, wl) if br.template is not None else None
    elif ranked:
        # screened ranking (tsbatch.engine.screen): only the rows that can still be among
        # their workload's top K (K from the workload's count over the whole
        # source, one streamed scan of the workload columns) are predicted in
        # full, and only the running top K per workload is held. A file of
        # several batches is read three times: bounds first, so the most
        # promising rows of every workload are predicted first, wherever they are
        from tsbatch.engine.screen import TopKScreen, workload_counts

        stats.how = "screened"
        first = batches[0] if one else None
        counts = workload_counts(source.workload_source(first), wl)
        # a bounded cache memo: the running set is the only state growing with the input
        screen = TopKScreen(hw, fam, wl, top, counts,
                            memo=CacheMemo(max_problems=RANKED_MEMO_PROBLEMS),
                            timings=timings, sampling=sampling)
        if one:
            screen.add(first)
            res = screen.result()
        else:
            b = bar(3 * source.total, "evaluate (3 passes)", True)

            def tick(name: str, rows: int) -> None:
                b.set_description(f"evaluate: {name}", refresh=False)
                b.update(rows)

            try:
                res = screen.rank_stream(source.stream, progress=tick)
            finally:
                b.close()
        stats.n_rows, stats.n_infeasible, stats.kept = (screen.n_rows, screen.n_infeasible,
                                                        res.height)
        stats.n_predicted = screen.n_predicted
        yield res
    else:
        stats.how = "all"
        b = bar(source.total, "evaluate", not one)
        for df in batches:
            res = _evaluated(evaluate(df, hw, fam, cache_memo=memo, **sampling), df, stats)
            b.update(df.height)
            yield res
        b.close()
        stats.kept = stats.n_rows


def write(parts: Iterator[pl.DataFrame], out: str | Path, meta: dict, stats: Stats,
          stream: bool = False) -> None:
    """Stream ``parts`` (of :func:`results`, filling ``stats``) to ``out``, written
    atomically with the provenance ``meta``: nothing is left of a failed run.
    ``stream``: several parts will come, each written on a thread while the next
    is computed (:class:`~tsbatch.boundary.io.ParquetSink`)."""
    from tsbatch.boundary.io import ParquetSink

    with ParquetSink(out, meta, stream=stream) as sink:
        for part in parts:
            sink.write(part)
        sink.commit(empty_schema=stats.empty_schema)


def collect(parts: Iterator[pl.DataFrame]) -> pl.DataFrame:
    """``parts`` (of :func:`results`) as one table."""
    got = list(parts)
    return got[0] if len(got) == 1 else pl.concat(got, how="vertical")


# ----------------------------------------------------------------------------- front doors
@dataclass
class Summary:
    """What :func:`evaluate_file` did, for the command to print."""

    hw: object
    out: Path
    stats: Stats
    seconds: float


def evaluate_file(candidates, output, hw, family=None, *, rank: bool = False, top=None,
                  sampling: dict | None = None, batch_rows: int = 1_000_000,
                  rank_bucket_rows: int = 500_000,
                  progress: BarFactory | None = None) -> Summary:
    """``tsbatch evaluate``: predict the candidate file ``candidates`` (Parquet,
    Arrow IPC, CSV or NDJSON by extension), rank when ``rank`` or ``top`` is
    given, and write ``output`` (Parquet, or CSV for a ``.csv`` name) with
    provenance. Every :class:`InputError` names the candidate file."""
    from tsbatch.engine.evaluate import resolve_hw, sampling_metadata
    from tsbatch.boundary.io import provenance, sha256_file
    from tsbatch.engine.rank import parse_top

    src = candidates
    with parquet_copy(src) as path:
        try:
            for flag, v in (("--batch-rows", batch_rows),
                            ("--rank-bucket-rows", rank_bucket_rows)):
                if v < 1:
                    raise InputError(f"{flag} must be a positive number of rows, got {v}")
            spec = resolve_hw(hw)
            out = output_path(output)
            frac = parse_top(top)
            from tsbatch.engine.evaluate import check_sampling

            sampling = check_sampling(sampling)
            source = open_file(path, src, batch_rows)
            fam = resolve_family(family, source.names)  # a program file is read once
            meta = provenance(spec, fam.name, {"candidates": sha256_file(src)},
                              extra={"top_fraction": str(frac), **sampling_metadata(sampling)})
            stats = Stats()
            ranked = bool(rank or top)
            t0 = time.perf_counter()
            parts = results(source, spec, fam, ranked=ranked, top=frac,
                            sampling=sampling, rank_bucket_rows=rank_bucket_rows,
                            spill_dir=out.parent if str(out.parent) else Path("."),
                            stats=stats, progress=progress)
            # several parts come from a file of several batches, evaluated in input
            # order or bucket-ranked; a screened ranking gives one part (written by
            # polars at the commit, without importing pyarrow)
            several = not source.one and (not ranked or (frac >= 1.0 and fam.lower is not None))
            write(parts, out, meta, stats, stream=several)
            return Summary(hw=spec, out=out, stats=stats, seconds=time.perf_counter() - t0)
        except InputError as exc:
            raise named(src, exc) from None


def evaluate_frame(frame: pl.DataFrame, hw, family=None, *, top=None,
                   sampling: dict | None = None) -> pl.DataFrame:
    """A table in memory through the pipeline: every row (``top`` None) or each
    workload's ranked ``top`` fraction; the rows :func:`evaluate_file` writes."""
    from tsbatch.engine.evaluate import check_sampling, resolve_hw
    from tsbatch.engine.rank import parse_top

    spec = resolve_hw(hw)
    frac = None if top is None else parse_top(top)
    sampling = check_sampling(sampling)
    source = table_source(frame)
    fam = resolve_family(family, source.names)
    return collect(results(source, spec, fam, ranked=frac is not None,
                           top=1.0 if frac is None else frac, sampling=sampling))
