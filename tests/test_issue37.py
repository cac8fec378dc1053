"""Issue 37: the rough edges a new user meets (missing columns named, quiet Ray,
honest wheel tags, tl.dot minimums, per-shard sizes of the fused families)."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import polars as pl
import pytest

import tsbatch
from tsbatch.front.cli import main
from tsbatch.errors import InputError

ROOT = Path(__file__).resolve().parent.parent

# the columns of the measured H100 GEMM file (../shared/data/gemm/h100_triton_mm.parquet)
H100_ROW = dict(source="autoheuristic", gpu="h100", m=4096, n=4096, k=4096, dtype="float16",
                a_row_major=True, b_row_major=True, tf32=False, backend="triton", block_m=128,
                block_n=128, block_k=64, num_stages=4, num_warps=8, group_m=8, time_ms=0.2)


# ----------------------------------------------------------------------------- 1. missing column
def _no_k(tmp_path) -> Path:
    src = tmp_path / "no_k.parquet"
    pl.DataFrame([H100_ROW]).drop("k").write_parquet(src)
    return src


def _says_k_missing(err: str) -> None:
    assert "closest is gemm" in err and "lacks column 'k'" in err, err


def test_evaluate_names_the_missing_column(tmp_path, capsys):
    out = tmp_path / "o.parquet"
    assert main(["evaluate", str(_no_k(tmp_path)), "--hw", "h100", "-o", str(out)]) == 2
    _says_k_missing(capsys.readouterr().err)
    assert not out.exists()


def test_evaluate_of_the_measured_file_without_k_names_k(tmp_path, capsys, shared_data):
    src = tmp_path / "h100_no_k.parquet"
    pl.read_parquet(shared_data / "gemm" / "h100_triton_mm.parquet").drop("k").head(100) \
        .write_parquet(src)
    assert main(["evaluate", str(src), "--hw", "h100", "-o", str(tmp_path / "o.parquet")]) == 2
    _says_k_missing(capsys.readouterr().err)


def test_explain_of_a_file_names_the_missing_column(tmp_path, capsys):
    assert main(["explain", "--hw", "h100", "--candidates", str(_no_k(tmp_path))]) == 2
    err = capsys.readouterr().err
    _says_k_missing(err)
    assert "no_k.parquet" in err


def test_sweep_names_the_missing_column(tmp_path, capsys):
    sweep = tmp_path / "s.toml"
    sweep.write_text('[sweep]\nname = "s"\nfamily = "gemm"\n[workload]\nm = [64]\nn = [64]\n'
                     'dtype = ["float16"]\n[schedule]\nblock_m = [64]\nblock_n = [64]\n'
                     'block_k = [32]\nnum_stages = [2]\nnum_warps = [4]\n')
    assert main(["sweep", str(sweep), "--hw", "h100", "-o", str(tmp_path / "o.parquet")]) == 2
    assert "['k']" in capsys.readouterr().err


@pytest.mark.parametrize("drop, family, missing", [
    (("k",), "gemm", "'k'"),
    (("m", "dtype"), "gemm", "'m', 'dtype'"),
])
def test_api_names_the_closest_family_and_its_missing_columns(drop, family, missing):
    df = pl.DataFrame([H100_ROW]).drop(*drop)
    for call in (tsbatch.evaluate_table, tsbatch.rank_table):
        with pytest.raises(InputError, match="no kernel family matches") as exc:
            call(df, hw="h100")
        assert f"closest is {family}" in str(exc.value)
        assert missing in str(exc.value)


def test_attention_columns_without_head_dim_point_at_attention():
    from tsbatch.engine.evaluate import detect_family

    with pytest.raises(InputError) as exc:
        detect_family(["batch", "heads", "seq_len", "dtype", "block_m", "block_n", "num_stages",
                       "num_warps"])
    assert "closest is attention" in str(exc.value) and "'head_dim'" in str(exc.value)


def test_columns_of_no_family_list_the_families():
    from tsbatch.engine.evaluate import detect_family

    with pytest.raises(InputError, match="no kernel family matches") as exc:
        detect_family(["label", "time_ms"])
    assert "closest" not in str(exc.value) and "gemm" in str(exc.value)


# ----------------------------------------------------------------------------- 2. quiet install
def test_every_importable_folder_of_the_packages_is_declared():
    """setuptools prints a 40-line "Package would be ignored" box for every folder
    that Python can import (any folder, with or without ``.py`` files) but that
    the ``packages`` list of pyproject.toml leaves out: declare them all."""
    try:
        import tomllib
    except ModuleNotFoundError:  # pragma: no cover
        import tomli as tomllib
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    declared = set(conf["packages"])
    mapped = {v.rstrip("/") for v in conf.get("package-dir", {}).values()}
    undeclared = []
    for top in ("tsbatch", "kernels_catalog"):
        for d in sorted((ROOT / top).rglob("*")):
            rel = d.relative_to(ROOT)
            if not d.is_dir() or any(p in ("__pycache__", "_nbcache") or p.startswith(".")
                                     or not p.isidentifier() for p in rel.parts):
                continue
            if str(rel) in mapped:
                continue
            if ".".join(rel.parts) not in declared:
                undeclared.append(".".join(rel.parts))
    # the data packages mapped from other folders (hw/, sweeps/): their subfolders too
    for pkg, folder in conf.get("package-dir", {}).items():
        for d in sorted((ROOT / folder).rglob("*")):
            rel = d.relative_to(ROOT / folder)
            if not d.is_dir() or any(p in ("__pycache__", "_nbcache") or p.startswith(".")
                                     or not p.isidentifier() for p in rel.parts):
                continue
            name = ".".join((pkg, *rel.parts))
            if name not in declared:
                undeclared.append(name)
    assert not undeclared, f"importable but not in pyproject's packages: {undeclared}"
    data = conf["package-data"]
    for pkg in declared:
        src = ROOT / Path(*pkg.split(".")) if not pkg.startswith("tsbatch._") else None
        if src is not None and any(src.glob("*.toml")):
            assert "*.toml" in data.get(pkg, ()), f"{pkg}'s TOML files are not package data"


# ----------------------------------------------------------------------------- 3. quiet Ray
def test_tsbatch_switches_ray_reporting_off_before_ray_starts():
    """In a process whose environment does not mention them (the tests' own
    conftest sets them), tsbatch's Ray engine turns Ray's usage statistics and
    metrics collection off before importing Ray, and leaves a user's setting alone."""
    import os
    import subprocess
    import sys

    pytest.importorskip("ray", reason="Ray is not installed")
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_USAGE_STATS_ENABLED", "RAY_enable_metrics_collection")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    code = ("import os\nfrom tsbatch.front.distributed import _import_ray\n_import_ray()\n"
            "from ray._common.usage.usage_lib import usage_stats_enabled\n"
            "print(usage_stats_enabled(), os.environ['RAY_enable_metrics_collection'])\n")
    got = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    assert got == ["False", "0"], got
    env["RAY_USAGE_STATS_ENABLED"] = "1"
    got = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    assert got == ["True", "0"], got


# ----------------------------------------------------------------------------- 5. tl.dot minimums
GEMM_ROW = dict(m=4096, n=4096, k=4096, dtype="float16", block_m=128, block_n=128, block_k=64,
                num_stages=3, num_warps=8)


def _row(**change) -> dict:
    from tsbatch.engine.evaluate import evaluate

    return evaluate(pl.DataFrame([{**GEMM_ROW, **change}]), "h100").row(0, named=True)


def test_float8_dot_needs_block_k_32_and_16_bit_types_keep_16():
    bad = _row(dtype="float8", block_k=16)
    assert bad["feasible"] is False
    assert bad["infeasible_reason"] == "triton: tl.dot needs block_k >= 32 for 8-bit (float8) operands"
    assert bad["latency_us"] is None
    assert _row(dtype="float8", block_k=32)["feasible"] is True
    for dt in ("float16", "bfloat16"):
        assert _row(dtype=dt, block_k=16)["feasible"] is True
        assert "block_k >= 16" in _row(dtype=dt, block_k=8)["infeasible_reason"]
    # a library row's catalog tiles are not Triton's
    assert _row(dtype="float8", block_k=16, backend="cublas")["feasible"] is True


def test_dot_minimums_agree_with_the_installed_triton():
    """The model's K minimum per operand width is Triton's NVIDIA ``min_dot_size``
    (8-bit: 32, 16-bit: 16), and its M/N minimum is never below Triton's."""
    pytest.importorskip("triton", reason="Triton is not installed (pip install 'tsbatch[triton]')")
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import min_dot_size

    from kernels_catalog import gemm

    need = min_dot_size(GPUTarget("cuda", 90, 32))
    for dtype, tl_types in (("float16", (tl.float16,)), ("bfloat16", (tl.bfloat16,)),
                            ("float8", (tl.float8e4nv, tl.float8e5))):
        model_k = gemm.TRITON_MIN_DOT_K_8BIT if gemm.DTYPES[dtype][0] == 1 else gemm.TRITON_MIN_DOT
        for t in tl_types:
            m, n, k = need(t, t)
            assert model_k == k, (dtype, t, k)
            assert gemm.TRITON_MIN_DOT >= max(m, n)
            # and the model applies it: K one step below is infeasible, K itself is not
            assert _row(dtype=dtype, block_k=k)["feasible"] is True
            assert _row(dtype=dtype, block_k=k // 2)["feasible"] is False


# ----------------------------------------------------------------------------- 6. per-shard sizes
FUSED = dict(system="dgx_h100", num_gpus=8, gpus_per_node=8, m=4096, n=4096, k=4096,
             dtype="bfloat16", block_m=128, block_n=128, block_k=64, num_stages=3, num_warps=8)


@pytest.mark.parametrize("family, column", [("ag_gemm", "n"), ("gemm_rs", "k")])
def test_a_dimension_below_the_tp_degree_is_named_not_called_non_positive(family, column):
    """ag_gemm shards n over the TP group, gemm_rs k: 4 of them over 8 GPUs leave
    0 per GPU. Was: InputError "column 'n' must be positive; row 0 has 0" (a value
    the user never wrote); now an infeasible row naming the column and num_gpus,
    its neighbours unchanged."""
    from tsbatch.engine.evaluate import evaluate

    rows = pl.DataFrame([FUSED, {**FUSED, column: 4}, {**FUSED, column: 16}])
    res = evaluate(rows, "h100", family)
    r = res.row(1, named=True)
    assert r["feasible"] is False
    assert "num_gpus" in r["infeasible_reason"] and f"{column} = 0 per GPU" in r["infeasible_reason"]
    assert res["feasible"].to_list() == [True, False, True]
    alone = evaluate(rows.slice(0, 1), "h100", family)
    assert res.row(0) == alone.row(0)


def test_cli_evaluate_of_a_shard_left_empty_writes_the_row(tmp_path, capsys):
    src = tmp_path / "ag.parquet"
    pl.DataFrame([{**FUSED, "n": 4}]).write_parquet(src)
    out = tmp_path / "o.parquet"
    assert main(["evaluate", str(src), "--hw", "h100", "--family", "ag_gemm", "-o", str(out),
                 "-q"]) == 0
    r = pl.read_parquet(out).row(0, named=True)
    assert r["feasible"] is False and "num_gpus" in r["infeasible_reason"]


# ----------------------------------------------------------------------------- 7. one registry
def _imports(path: Path) -> set[str]:
    import ast

    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_no_family_imports_the_engine_and_only_the_registry_knows_every_family():
    """kernels_catalog/fused_comm.py and tsbatch/engine/evaluate.py imported each other;
    now the families import no engine module (a composite family is handed the
    engine's evaluator) and only kernels_catalog/registry.py imports the modules
    of every family."""
    engine = ("tsbatch.engine.evaluate", "tsbatch.engine.screen", "tsbatch.engine.pipeline", "tsbatch.front.api",
              "tsbatch.front.cli", "tsbatch.engine.rank")
    for path in sorted((ROOT / "kernels_catalog").glob("*.py")):
        bad = {m for m in _imports(path) if m.startswith(engine)}
        assert not bad, f"{path.name} imports the engine: {sorted(bad)}"
    family_modules = ("kernels_catalog.fused_comm", "kernels_catalog.collectives")
    for path in sorted((ROOT / "tsbatch").rglob("*.py")):
        bad = {m for m in _imports(path) if m.startswith(family_modules)}
        assert not bad, f"{path.relative_to(ROOT)} imports a family module: {sorted(bad)}"


def test_importing_the_registry_does_not_import_the_engine():
    import subprocess
    import sys

    code = ("import sys, kernels_catalog.registry as r\n"
            "assert {'gemm', 'attention', 'collective', 'ag_gemm', 'moe_ep'} <= set(r.FAMILIES)\n"
            "print(sorted(m for m in sys.modules if m in ('tsbatch.engine.evaluate', 'tsbatch.engine.screen')))")
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout.strip()
    assert out == "[]"


# ----------------------------------------------------------------------------- 7. one pipeline
def test_the_front_doors_only_call_the_pipeline():
    """Streaming, screening and bucket ranking live in tsbatch/engine/pipeline.py: neither
    front door imports them (the CLI parses and prints, the API converts tables)."""
    engine = ("tsbatch.engine.screen", "tsbatch.engine.bucket_rank", "tsbatch.engine.rank.rank",
              "tsbatch.boundary.io.ParquetSink", "tsbatch.boundary.io.read_ahead", "tsbatch.engine.evaluate.CacheMemo")
    for name in ("cli.py", "api.py"):
        got = {m for m in _imports(ROOT / "tsbatch" / "front" / name) if m.startswith(engine)}
        assert not got, f"tsbatch/front/{name} imports {sorted(got)}"
        assert "tsbatch.engine.pipeline" in _imports(ROOT / "tsbatch" / "front" / name)


@pytest.mark.parametrize("top", [None, 1.0, 0.05])
def test_a_file_and_a_table_through_the_pipeline_give_the_same_rows(tmp_path, top):
    from polars.testing import assert_frame_equal

    from tsbatch.engine.pipeline import evaluate_file, evaluate_frame

    rows = pl.DataFrame([{**GEMM_ROW, "m": m, "block_m": bm, "block_n": bn, "num_stages": s}
                         for m in (512, 4096) for bm in (32, 64, 128) for bn in (64, 256)
                         for s in (2, 4, 8)])
    src = tmp_path / "c.parquet"
    rows.write_parquet(src)
    table = evaluate_frame(rows, "h100", top=top)
    for batch_rows in (1_000, 10):  # one batch; several (streamed, surveyed, bucketed)
        out = tmp_path / f"o{batch_rows}.parquet"
        done = evaluate_file(src, out, "h100", rank=top is not None, top=top,
                             batch_rows=batch_rows)
        assert_frame_equal(pl.read_parquet(out), table, check_exact=True)
        assert done.stats.n_rows == rows.height and done.stats.kept == table.height


def test_rank_table_of_a_family_without_a_tile_plan():
    """The API ranks collectives as ``tsbatch evaluate --top`` does (evaluate every
    row, then rank): the pipeline's path for a family with nothing to bound."""
    from tsbatch.engine.evaluate import evaluate
    from tsbatch.engine.rank import rank

    rows = pl.DataFrame({"system": ["dgx_h100"] * 6, "collective": ["all_reduce"] * 6,
                         "num_gpus": [8] * 6, "bytes": [1 << 20] * 3 + [1 << 26] * 3,
                         "algorithm": ["ring", "tree", "nvls"] * 2})
    got = tsbatch.rank_table(rows, hw="h100", top="50%")
    fam_wl = ["system", "collective", "num_gpus", "bytes"]
    assert got.equals(rank(evaluate(rows, None, "collective"), fam_wl, 0.5))


def test_closed_pipe_ends_quietly():
    """``tsbatch sweep ... | head -1`` stops without a BrokenPipeError traceback:
    here the reader goes away before the command prints anything, so its first
    write (or the flush of its buffered output) meets the closed pipe."""
    import subprocess

    code = ("import sys; from tsbatch.front.cli import main; "
            "sys.exit(main(sys.argv[1:]))")
    proc = subprocess.Popen([sys.executable, "-c", code, "sweep", "tiny", "--hw", "h100",
                             "-o", str(Path(tempfile.mkdtemp()) / "x.parquet")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader goes away before the first line
    err = proc.stderr.read().decode()
    proc.stderr.close()
    proc.wait(timeout=300)
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    assert proc.returncode == 0
