"""The distributed sweep engine: Ray Data over Parquet shards, Arrow blocks end to end.

``tsbatch sweep ... --engine ray`` runs the same sweep as the local engine
(:func:`tsbatch.engine.sweep.run_sweep`) on a Ray cluster and writes a byte-for-byte
equivalent result: same rows, same columns, same order, same provenance
metadata. The pipeline::

    driver   candidate_chunks(spec)  ->  + candidate_id, _wl_n  ->  Parquet shards
             (shards are cut every ``shard_rows`` rows, ignoring workload
             boundaries, so a workload's candidates may span shards)
    cluster  read_parquet(shards)
             -> map_batches(evaluate + block-local top-K, batch_format="pyarrow")
             -> groupby(workload_id).map_groups(exact global rank + keep)
             -> sort(workload_id, rank)
    driver   iter_batches -> ParquetSink (atomic, provenance metadata)

Exactness. ``tsbatch.engine.rank.rank`` ranks *all* candidates of a workload
(feasible or not) by ``(key, position)`` with ``key`` = latency for
feasible rows and +inf otherwise, keeps ``K = max(1, ceil(top * n))`` where
``n`` counts every candidate of the workload, and drops infeasible rows.
Here ``candidate_id`` is the candidate's position in the local engine's
generation order and ``_wl_n`` the workload's total candidate count (both
computed on the driver, where whole workloads are generated). Phase 1 keeps,
per block and workload, the rows of block-local rank <= K over *all* rows;
every row ahead of a globally top-K row is itself globally top-K, so the
union of the block-local top-K sets contains the global top-K and the rank
of each of its rows inside the union equals its global rank. Phase 2 ranks
that union per workload and keeps ``rank <= K and feasible`` -- exactly what
the local engine keeps, with identical ranks and tie breaks.

Ray is optional: it is imported only inside the functions here, and a
missing Ray raises :class:`~tsbatch.errors.InputError` with the install
command.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import polars as pl

from tsbatch.errors import InputError

__all__ = ["run_sweep_ray", "write_shards", "DEFAULT_SHARD_ROWS"]

#: rows per Parquet shard (deliberately unrelated to workload sizes)
DEFAULT_SHARD_ROWS = 250_000
#: rows per evaluation batch inside a Ray task
DEFAULT_BATCH_ROWS = 250_000

#: helper columns carried through the pipeline and dropped from the output
_CID = "candidate_id"
_WLN = "_wl_n"
_PINF = "_pinf"
_HELPERS = (_CID, _WLN, _PINF, "_key", "_r")

_INSTALL_HINT = "pip install 'tsbatch[ray]'"


#: Ray's telemetry, off wherever tsbatch starts Ray: its usage statistics (with them,
#: Ray Data polls a Prometheus server on localhost:9090 from a background thread,
#: whose failures end a run, or a test session, in "Logging error" tracebacks)
#: and its metrics collection. Set only where the user has not set them.
RAY_QUIET_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_enable_metrics_collection": "0"}


def quiet_ray_env(environ=None) -> dict:
    """Switch Ray's usage and metrics reporting off in ``environ`` (default:
    ``os.environ``, before Ray starts: the processes ``ray.init`` starts inherit
    it) unless the user set them; returns what was set."""
    env = os.environ if environ is None else environ
    done = {k: v for k, v in RAY_QUIET_ENV.items() if k not in env}
    env.update(done)
    return done


def _import_ray():
    quiet_ray_env()
    try:
        import ray  # noqa: F401
        import ray.data  # noqa: F401
    except ImportError as exc:
        raise InputError(f"--engine ray needs Ray Data, which is not installed ({exc}); "
                         f"install it with: {_INSTALL_HINT}") from None
    return ray


# ----------------------------------------------------------------------------- ranking kernels
def _key_expr() -> pl.Expr:
    # identical to tsbatch.engine.rank.rank
    key = pl.when(pl.col("feasible")).then(pl.col("latency_us")).otherwise(float("inf"))
    return key.fill_null(float("inf"))


def _keep_expr(top: float) -> pl.Expr:
    # identical to tsbatch.engine.rank.rank: (n * top - 1e-9).ceil().clip(lower_bound=1)
    return (pl.col(_WLN) * top - 1e-9).ceil().clip(lower_bound=1)


def _limit_threads() -> None:
    """Give numba's parallel kernels only the CPUs Ray assigned to this task."""
    try:
        import numba
        import ray

        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU")
        if cpus:
            numba.set_num_threads(max(1, min(int(cpus), numba.config.NUMBA_NUM_THREADS)))
    except Exception:  # pragma: no cover - outside a task, or an older numba/ray
        pass


def _evaluate_block(table, hw, family: str, top: float, model_version: str,
                    sampling: dict | None = None):
    """Phase 1 (one Arrow block): evaluate, then keep each workload's block-local top K.

    Every kept row of a (workload, block) piece carries 0 in ``_pinf`` except
    the piece's rank-1 row, which carries the piece's infeasible count (so the
    sum of ``_pinf`` over the output is the sweep's infeasible count).
    """
    import tsbatch
    from tsbatch.engine.evaluate import evaluate

    if tsbatch.MODEL_VERSION != model_version:
        raise RuntimeError(f"tsbatch model version on this Ray worker ({tsbatch.MODEL_VERSION}) "
                           f"differs from the driver's ({model_version}); install the same "
                           f"tsbatch on every node")
    _limit_threads()
    df = pl.from_arrow(table)
    res = evaluate(df, hw, family, **(sampling or {}))
    res = res.with_columns(_key=_key_expr())
    res = res.with_columns(
        _r=pl.struct("_key", _CID).rank("ordinal").over("workload_id"),
        _pinf=(~pl.col("feasible")).sum().over("workload_id").cast(pl.Int64),
    )
    res = res.filter(pl.col("_r") <= _keep_expr(top))
    res = res.with_columns(
        _pinf=pl.when(pl.col("_r") == 1).then(pl.col(_PINF)).otherwise(0)
    ).drop("_key", "_r")
    return res.to_arrow()


def _rank_group(table, top: float):
    """Phase 2 (all phase-1 survivors of one workload): exact rank, keep top K feasible."""
    df = pl.from_arrow(table)
    df = df.with_columns(_key=_key_expr())
    df = df.with_columns(rank=pl.struct("_key", _CID).rank("ordinal").cast(pl.Int64))
    df = df.filter((pl.col("rank") <= _keep_expr(top)) & pl.col("feasible"))
    return df.sort("rank").drop("_key", _PINF).to_arrow()


# ----------------------------------------------------------------------------- shards
def _open_dir(shard_dir: str | os.PathLike):
    """(pyarrow filesystem or None, base path) for a local path or a URI (s3://, gs://...)."""
    text = str(shard_dir)
    if "://" in text and not text.startswith("file://"):
        import pyarrow.fs as pafs

        fs, base = pafs.FileSystem.from_uri(text)
        return fs, base.rstrip("/")
    if text.startswith("file://"):
        text = text[len("file://"):]
    return None, str(Path(text).resolve())


def write_shards(spec, shard_dir: str | os.PathLike, shard_rows: int = DEFAULT_SHARD_ROWS,
                 chunk_rows: int = 1_000_000, filesystem=None) -> dict:
    """Write a sweep's candidates as Parquet shards of ``shard_rows`` rows.

    Candidates come from :func:`tsbatch.engine.sweep.candidate_chunks` in the local
    engine's order; each gets ``candidate_id`` (its position in that order)
    and ``_wl_n`` (its workload's candidate count). Shards are cut purely by
    row count, so workloads may span shards. Returns ``{"paths": [...],
    "candidates": n, "first": <one-row candidate frame or None>}``.
    """
    import pyarrow.parquet as pq

    from tsbatch.engine.sweep import candidate_chunks

    if shard_rows < 1:
        raise InputError(f"shard_rows must be positive, got {shard_rows}")
    base = str(shard_dir).rstrip("/")
    if filesystem is None:
        Path(base).mkdir(parents=True, exist_ok=True)
    else:
        filesystem.create_dir(base, recursive=True)
    paths: list[str] = []
    pending: list[pl.DataFrame] = []
    n_pending = 0
    n_cand = 0
    first = None

    def flush(frame: pl.DataFrame) -> None:
        path = f"{base}/part-{len(paths):06d}.parquet"
        pq.write_table(frame.to_arrow(), path, filesystem=filesystem, compression="zstd")
        paths.append(path)

    for chunk in candidate_chunks(spec, chunk_rows):
        if chunk.height == 0:
            continue
        if first is None:
            first = chunk.head(1)
        chunk = chunk.with_columns(
            pl.int_range(n_cand, n_cand + chunk.height, dtype=pl.Int64).alias(_CID),
            pl.len().over("workload_id").cast(pl.Int64).alias(_WLN),
        )
        n_cand += chunk.height
        pending.append(chunk)
        n_pending += chunk.height
        while n_pending >= shard_rows:
            buf = pl.concat(pending, how="vertical") if len(pending) > 1 else pending[0]
            flush(buf.slice(0, shard_rows))
            rest = buf.slice(shard_rows)
            pending = [rest] if rest.height else []
            n_pending = rest.height
    if n_pending:
        flush(pl.concat(pending, how="vertical") if len(pending) > 1 else pending[0])
    return {"paths": paths, "candidates": n_cand, "first": first}


def _remove_dir(fs, base: str) -> None:
    try:
        if fs is None:
            shutil.rmtree(base, ignore_errors=True)
        else:
            fs.delete_dir(base)
    except Exception:  # pragma: no cover - best effort cleanup
        pass


# ----------------------------------------------------------------------------- engine
def run_sweep_ray(spec, hw: str, out: str | Path, top: float = 1.0, *,
                  address: str | None = None, shard_dir: str | os.PathLike | None = None,
                  shard_rows: int = DEFAULT_SHARD_ROWS, batch_rows: int = DEFAULT_BATCH_ROWS,
                  chunk_rows: int = 1_000_000, keep_shards: bool = False,
                  task_cpus: float = 1.0, runtime_env: dict | None = None,
                  progress: bool = False,
                  timings: dict | None = None, sampling: dict | None = None) -> dict:
    """Evaluate and rank a sweep on a Ray cluster; same output and summary as ``run_sweep``.

    Parameters
    ----------
    address : str, optional
        Ray cluster to use: ``None`` starts (or reuses) a local Ray instance
        -- or joins the cluster named by ``RAY_ADDRESS`` --, ``"auto"`` joins
        the cluster this node belongs to, ``"ray://host:10001"`` connects
        through Ray Client, ``"host:6379"`` joins as a driver. When Ray is
        already initialized in this process, that connection is used as is.
    shard_dir : path or URI, optional
        Where the candidate shards go (a fresh subdirectory is created and
        removed afterwards unless ``keep_shards``). It must be readable by
        every node: a shared filesystem path or an object-store URI
        (``s3://bucket/prefix``). Default: a local temporary directory,
        which only works when all Ray workers run on this machine.
    shard_rows : int
        Rows per Parquet shard (workloads are split across shards freely).
    batch_rows : int
        Rows per ``map_batches`` evaluation batch.
    task_cpus : float
        CPUs reserved per evaluation task (numba's threads are capped to it).
    runtime_env : dict, optional
        Ray runtime environment for this job (e.g. ``{"pip": [...]}``).
    sampling : dict, optional
        The cache model's sampling (``k_samples``, ``wave_samples``,
        ``max_lookback``), as for ``run_sweep``.
    """
    from tsbatch.engine.evaluate import check_sampling, get_family, resolve_hw, sampling_metadata
    from tsbatch.boundary.io import provenance
    from tsbatch.engine.rank import rank
    from tsbatch.engine.sweep import SweepSpec, load_sweep

    ray = _import_ray()

    t0 = time.perf_counter()
    sp = spec if isinstance(spec, SweepSpec) else load_sweep(spec)
    hwspec = resolve_hw(hw)
    fam = get_family(sp.family)
    if batch_rows < 1:
        raise InputError(f"batch_rows must be positive, got {batch_rows}")
    sampling = check_sampling(sampling)
    meta = provenance(hwspec, sp.family, {"sweep": sp.sha256},
                      extra={"sweep": sp.name, "top_fraction": str(top),
                             **sampling_metadata(sampling)})
    workload_cols = ["workload_id", *[c for c in fam.workload_columns]]
    out = Path(out)
    out_parent = out.parent if str(out.parent) else Path(".")
    if not out_parent.exists():
        raise InputError(f"{out}: output directory {out_parent} does not exist")
    tm = timings if timings is not None else {}

    # ---- 1. the cluster
    started = False
    if not ray.is_initialized():
        kwargs: dict = {"logging_level": logging.WARNING, "log_to_driver": True}
        if address is None and not os.environ.get("RAY_ADDRESS"):
            kwargs["include_dashboard"] = False
        if runtime_env is not None:
            kwargs["runtime_env"] = runtime_env
        try:
            ray.init(address=address, **kwargs)
        except ConnectionError as exc:
            raise InputError(f"cannot connect to the Ray cluster at {address!r} ({exc})") \
                from None
        started = True
    base = None
    fs = None
    try:
        if shard_dir is None:
            hosts = {n.get("NodeManagerAddress") for n in ray.nodes() if n.get("Alive")}
            if len(hosts) > 1:
                raise InputError(f"the Ray cluster spans {len(hosts)} hosts: pass a shard "
                                 f"directory every node can read (--shard-dir on a shared "
                                 f"filesystem, or an s3:// / gs:// URI)")
        # ---- 2. candidate shards
        run_id = f"tsbatch-{sp.name}-{uuid.uuid4().hex[:12]}"
        if shard_dir is None:
            base = tempfile.mkdtemp(prefix=f"{run_id}-")
        else:
            fs, root = _open_dir(shard_dir)
            base = f"{root}/{run_id}"
        t_s = time.perf_counter()
        shards = write_shards(sp, base, shard_rows=shard_rows, chunk_rows=chunk_rows,
                              filesystem=fs)
        tm["shard_s"] = tm.get("shard_s", 0.0) + (time.perf_counter() - t_s)
        n_cand = shards["candidates"]
        if n_cand == 0:
            raise InputError(f"{sp.path}: the sweep's rules reject every candidate")
        # the exact output schema of the local engine (column order and dtypes)
        template = rank(_evaluate_local(shards["first"], hwspec, sp.family, sampling),
                        workload_cols, top).head(0)
        # ---- 3. evaluate, rank, write
        n_kept, n_infeasible = _run_pipeline(
            ray, base, fs, hwspec, sp.family, top, batch_rows, task_cpus, template,
            out, meta, progress, tm, sampling)
    finally:
        if base is not None and not keep_shards:
            _remove_dir(fs, base)
        if started:
            ray.shutdown()
    return {"sweep": sp.name, "hw": hwspec.key, "workloads": sp.n_workloads,
            "candidates": n_cand, "infeasible": n_infeasible, "kept": n_kept,
            "seconds": time.perf_counter() - t0, "out": str(out)}


def _evaluate_local(first: pl.DataFrame, hwspec, family: str, sampling: dict) -> pl.DataFrame:
    from tsbatch.engine.evaluate import evaluate

    return evaluate(first, hwspec, family, **sampling)


def _run_pipeline(ray, base, fs, hwspec, family, top, batch_rows, task_cpus, template, out,
                  meta, progress, tm, sampling) -> tuple[int, int]:
    import tsbatch
    from ray.data import DataContext

    from tsbatch.boundary.io import ParquetSink

    try:
        from ray.data.context import ShuffleStrategy
        pull_sort = ShuffleStrategy.SORT_SHUFFLE_PULL_BASED
    except (ImportError, AttributeError):  # pragma: no cover - Ray < 2.4x
        pull_sort = None

    ctx = DataContext.get_current()
    # Ray Data logs every execution plan at INFO; keep the CLI quiet unless
    # progress was asked for
    data_log = logging.getLogger("ray.data")
    saved_level = data_log.level
    if not progress:
        data_log.setLevel(logging.WARNING)
    saved = (ctx.enable_progress_bars, ctx.execution_options.preserve_order,
             getattr(ctx, "shuffle_strategy", None), getattr(ctx, "use_datasource_v2", None))
    ctx.enable_progress_bars = bool(progress)
    # ordered iteration of the sorted result
    ctx.execution_options.preserve_order = True
    # task-based sort shuffle: no long-lived aggregator actors pinning CPUs,
    # so it runs on clusters of any size (even one CPU per node)
    if pull_sort is not None and saved[2] is not None:
        ctx.shuffle_strategy = pull_sort
    # the classic Parquet reader: the V2 reader (Ray >= 2.5x) provisions dozens
    # of footer-reader actors per read, which costs more than the whole sweep
    # on small clusters
    if saved[3] is not None:
        ctx.use_datasource_v2 = False
    try:
        t_e = time.perf_counter()
        read_kw = {"filesystem": fs} if fs is not None else {}
        ds = ray.data.read_parquet(base, **read_kw)
        survivors = ds.map_batches(
            _evaluate_block, batch_format="pyarrow", batch_size=batch_rows, num_cpus=task_cpus,
            fn_kwargs={"hw": hwspec, "family": family, "top": top,
                       "model_version": tsbatch.MODEL_VERSION, "sampling": sampling},
        ).materialize()
        n_infeasible = int(survivors.sum(_PINF) or 0) if survivors.count() else 0
        tm["evaluate_s"] = tm.get("evaluate_s", 0.0) + (time.perf_counter() - t_e)

        t_r = time.perf_counter()
        ranked = survivors.groupby("workload_id").map_groups(
            _rank_group, batch_format="pyarrow", fn_kwargs={"top": top},
        ).sort(["workload_id", "rank"])
        cols = template.columns
        n_kept = 0
        last = None
        with ParquetSink(out, meta) as sink:
            for batch in ranked.iter_batches(batch_format="pyarrow", batch_size=None):
                if batch.num_rows == 0:
                    continue
                frame = pl.from_arrow(batch)
                frame = frame.select(cols).cast(template.schema)
                keys = frame.select("workload_id", "rank")
                head = tuple(keys.row(0))
                if (last is not None and head <= last) or not keys.equals(
                        keys.sort("workload_id", "rank")):
                    raise RuntimeError("Ray returned the ranked rows out of order")
                last = tuple(keys.row(-1))
                sink.write(frame)
                n_kept += frame.height
            sink.commit(empty_schema=template)
        tm["rank_s"] = tm.get("rank_s", 0.0) + (time.perf_counter() - t_r)
    finally:
        ctx.enable_progress_bars, ctx.execution_options.preserve_order = saved[:2]
        if pull_sort is not None and saved[2] is not None:
            ctx.shuffle_strategy = saved[2]
        if saved[3] is not None:
            ctx.use_datasource_v2 = saved[3]
        data_log.setLevel(saved_level)
    return n_kept, n_infeasible
