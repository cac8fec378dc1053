"""The Ray engine gives exactly the local engine's result, row for row.

A real two-node Ray cluster (``ray.cluster_utils.Cluster``: a head node and
one added worker node, one CPU each, all on this machine) runs the sweeps;
the tests skip only when Ray cannot be imported. The sweeps are sharded so
that workloads span Parquet shards and evaluation batches, which is where a
per-shard top-k would go wrong.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import polars as pl
import pyarrow.parquet as pq
import pytest
from polars.testing import assert_frame_equal

from tsbatch.errors import InputError
from tsbatch.boundary.io import read_metadata
from tsbatch.engine.sweep import candidate_chunks, load_sweep, run_sweep

# Ray itself raises deprecation warnings on its own internals (e.g. every new
# DataContext sets the deprecated ``use_push_based_shuffle``); the project
# turns warnings into errors, so let Ray's own through
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.*")

# a sweep with uneven workloads (the rule drops large tiles for small m),
# infeasible candidates (deep pipelines of big tiles overflow shared memory)
# and many latency ties (num_warps / group_m barely matter)
SPAN_SWEEP = """
[sweep]
name = "span"
family = "gemm"
description = "workloads of uneven size that span shards"

[workload]
m = [16, 256, 2048]
dtype = ["float16", "bfloat16"]

[[workload.shape]]
label = "qkv"
n = 6144
k = 4096

[[workload.shape]]
label = "down"
n = 4096
k = 14336

[schedule]
block_m = [16, 64, 128, 256]
block_n = [64, 256]
block_k = [32, 128]
num_stages = [2, 4, 7]
num_warps = [4, 8]

[rules]
valid = ["block_m <= 4 * m"]
"""


def _summary_core(s: dict) -> dict:
    return {k: v for k, v in s.items() if k not in ("seconds", "out")}


def _assert_same(local_path, ray_path) -> None:
    a = pl.read_parquet(local_path)
    b = pl.read_parquet(ray_path)
    assert a.columns == b.columns
    assert_frame_equal(a, b, check_exact=True)  # same values, same order, same dtypes
    sa, sb = pq.read_schema(local_path), pq.read_schema(ray_path)
    assert sa.equals(sb, check_metadata=False)  # same Arrow types
    # same provenance in the file's key-value metadata (a one-batch file is
    # written by polars, a streamed one by pyarrow; both carry it there)
    ma, mb = read_metadata(local_path), read_metadata(ray_path)
    assert ma == mb and "tsbatch.model_version" in ma, (ma, mb)


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'tsbatch[ray]')")
    pytest.importorskip("ray.data", reason="Ray Data is not installed "
                                           "(pip install 'tsbatch[ray]')")
    from ray.cluster_utils import Cluster

    if ray.is_initialized():  # pragma: no cover - a stray connection from elsewhere
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "object_store_memory": 150 * 1024**2, "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=1, object_store_memory=150 * 1024**2)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
        alive = [n for n in ray.nodes() if n["Alive"]]
        assert len(alive) == 2 and sum(n["Resources"].get("CPU", 0) for n in alive) == 2
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture(scope="module")
def span_sweep(tmp_path_factory):
    path = tmp_path_factory.mktemp("sweeps") / "span.toml"
    path.write_text(SPAN_SWEEP)
    return load_sweep(path)


def _both(spec, tmp_path, top, cluster, sampling=None, **kw):
    from tsbatch.front.distributed import run_sweep_ray

    loc = run_sweep(spec, "h100", tmp_path / "local.parquet", top, progress=False,
                    sampling=sampling)
    dis = run_sweep_ray(spec, "h100", tmp_path / "ray.parquet", top,
                        address=cluster.address, sampling=sampling, **kw)
    assert _summary_core(dis) == _summary_core(loc)
    assert dis["out"] == str(tmp_path / "ray.parquet")
    _assert_same(tmp_path / "local.parquet", tmp_path / "ray.parquet")
    return loc


@pytest.mark.parametrize("top", [0.05, 1.0])
def test_tiny_matches_local(ray_cluster, tmp_path, top):
    # 72 candidates per workload, 50-row shards, 37-row batches: every
    # workload is split across shards and batches
    s = _both(load_sweep("tiny"), tmp_path, top, ray_cluster, shard_rows=50, batch_rows=37)
    assert s["kept"] > 0


def test_sampling_reaches_both_engines(ray_cluster, tmp_path):
    """Non-default cache-model sampling gives the same rows and metadata on both
    engines, and the metadata records it."""
    _both(load_sweep("tiny"), tmp_path, 0.05, ray_cluster,
          sampling={"wave_samples": 2, "k_samples": 1}, shard_rows=50, batch_rows=37)
    md = read_metadata(tmp_path / "ray.parquet")
    assert json.loads(md["tsbatch.sampling"])["wave_samples"] == 2


@pytest.mark.parametrize("top", [0.03, 0.3])
def test_span_sweep_matches_local(ray_cluster, tmp_path, span_sweep, top):
    s = _both(span_sweep, tmp_path, top, ray_cluster, shard_rows=23, batch_rows=11,
              shard_dir=tmp_path / "shards")
    assert s["infeasible"] > 0  # the infeasible rows are counted and never kept
    assert not (tmp_path / "shards").exists() or not any((tmp_path / "shards").iterdir())


def test_span_sweep_shards_split_workloads(span_sweep, tmp_path):
    """The shard writer keeps the local generation order and splits workloads."""
    from tsbatch.front.distributed import write_shards

    info = write_shards(span_sweep, tmp_path, shard_rows=23)
    parts = [pl.read_parquet(p).with_columns(shard=pl.lit(i))
             for i, p in enumerate(info["paths"])]
    df = pl.concat(parts)
    local = pl.concat(list(candidate_chunks(span_sweep)))
    assert info["candidates"] == local.height == df.height
    assert df["candidate_id"].to_list() == list(range(local.height))
    assert_frame_equal(df.select(local.columns), local)
    per = df.group_by("workload_id").agg(pl.col("shard").n_unique().alias("shards"),
                                         pl.len().alias("rows"), pl.col("_wl_n").first())
    assert (per["shards"] > 1).all()  # every workload spans shards here
    assert (per["rows"] == per["_wl_n"]).all()
    assert per["rows"].n_unique() > 1  # uneven workloads


def test_cli_engine_ray(ray_cluster, tmp_path, capsys):
    from tsbatch.front.cli import main

    args = ["sweep", "tiny", "--hw", "h100", "--top", "10%", "-q"]
    assert main([*args, "-o", str(tmp_path / "local.parquet")]) == 0
    assert main([*args, "-o", str(tmp_path / "ray.parquet"), "--engine", "ray",
                 "--address", ray_cluster.address]) == 0
    _assert_same(tmp_path / "local.parquet", tmp_path / "ray.parquet")
    out = capsys.readouterr().out
    assert out.count("432 candidates") == 2


def test_package_imports_without_ray():
    code = textwrap.dedent("""
        import sys
        sys.modules["ray"] = None  # any `import ray` now fails
        import tsbatch.front.distributed, tsbatch.front.cli, tsbatch.engine.sweep
        from tsbatch.errors import InputError
        try:
            tsbatch.front.distributed.run_sweep_ray("tiny", "h100", "unused.parquet", 0.05)
        except InputError as exc:
            assert "pip install 'tsbatch[ray]'" in str(exc), exc
        else:
            raise SystemExit("no InputError")
    """)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_missing_ray_is_an_input_error(monkeypatch, tmp_path):
    from tsbatch.front import distributed

    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(InputError, match=r"pip install 'tsbatch\[ray\]'"):
        distributed.run_sweep_ray("tiny", "h100", tmp_path / "x.parquet", 0.05)
    assert not (tmp_path / "x.parquet").exists()


def test_ray_usage_and_metrics_reporting_are_off(ray_cluster, tmp_path):
    """Issue 37: with Ray's usage statistics on, Ray Data starts a thread polling a
    Prometheus server on localhost:9090, whose failures print "Logging error"
    tracebacks after pytest's summary. tsbatch switches them off before Ray starts."""
    import threading

    from ray.data._internal.usage.collector import usage_collection_disabled

    from tsbatch.front.distributed import run_sweep_ray

    run_sweep_ray("tiny", "h100", tmp_path / "r.parquet", 0.05)
    assert usage_collection_disabled()
    polling = [t.name for t in threading.enumerate() if "usage" in t.name or "poller" in t.name]
    assert not polling, polling
