"""The Python API at the top of the package (tsbatch/front/api.py; issue 22).

Every function is checked against what the CLI command writes or prints for
the same rows, and against the existing functions it wraps, for a polars
DataFrame and a pyarrow Table (which comes back as a pyarrow Table); bad
input raises one InputError naming the problem.
"""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest
from polars.testing import assert_frame_equal

import tsbatch
from tsbatch.front.cli import main
from tsbatch.errors import InputError
from tsbatch.engine.evaluate import evaluate
from tsbatch.hw import get_hw, list_hw
from tsbatch.engine.prune import prune
from tsbatch.engine.rank import rank

ROOT = Path(__file__).resolve().parent.parent

GEMM_CONFIG = {"m": 4096, "n": 4096, "k": 4096, "dtype": "float16", "block_m": 128,
               "block_n": 128, "block_k": 64, "num_stages": 4, "num_warps": 8}


def _candidates() -> pl.DataFrame:
    """Three workloads x 24 tiles, one cuBLAS row, infeasible deep pipelines,
    and a text column passed through."""
    rows = []
    workloads = [(4096, 4096, 4096, "float16"), (512, 1024, 8192, "bfloat16"),
                 (16, 6144, 4096, "float16")]
    tiles = itertools.product((64, 128, 256), (64, 256), (32, 128), (3, 7))
    for (m, n, k, dt), (bm, bn, bk, st) in itertools.product(workloads, list(tiles)):
        rows.append({"label": f"{m}x{n}x{k}", "m": m, "n": n, "k": k, "dtype": dt,
                     "block_m": bm, "block_n": bn, "block_k": bk, "num_stages": st,
                     "num_warps": 8 if bm * bn >= 128 * 128 else 4, "backend": "triton"})
    rows.append({**rows[0], "backend": "cublas"})
    return pl.DataFrame(rows)


@pytest.fixture(scope="module")
def cands() -> pl.DataFrame:
    df = _candidates()
    assert df.height == 73
    return df


@pytest.fixture(scope="module")
def cand_file(cands, tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("api") / "cand.parquet"
    cands.write_parquet(p)
    return p


def _cli_table(tmp_path, cand_file, *flags) -> pl.DataFrame:
    out = tmp_path / "out.parquet"
    assert main(["evaluate", str(cand_file), "--hw", "h100", "-o", str(out), "-q", *flags]) == 0
    return pl.read_parquet(out)


def _arrow_strings(df: pl.DataFrame) -> pa.Table:
    """The table as Arrow with plain ``string`` and ``int32`` columns, as
    other Arrow producers write them (polars would give large_string/int64)."""
    t = df.to_arrow()
    return t.cast(pa.schema([f.with_type(pa.string()) if pa.types.is_large_string(f.type)
                             else f.with_type(pa.int32()) if f.name in ("block_m", "num_stages")
                             else f for f in t.schema]))


# --------------------------------------------------------------------------- evaluate_table
def test_evaluate_table_equals_the_cli_and_evaluate(cands, cand_file, tmp_path):
    got = tsbatch.evaluate_table(cands, hw="h100")
    assert isinstance(got, pl.DataFrame)
    assert got.height == cands.height
    assert not got["feasible"].all() and got["feasible"].any()  # both kinds of row present
    assert_frame_equal(got, _cli_table(tmp_path, cand_file))
    assert_frame_equal(got, evaluate(cands, "h100"))


def test_evaluate_table_arrow_in_arrow_out(cands):
    table = _arrow_strings(cands)
    got = tsbatch.evaluate_table(table, hw="h100")
    assert isinstance(got, pa.Table)
    # the caller's columns keep their Arrow types; the values are those of polars
    for f in table.schema:
        assert got.schema.field(f.name).type == f.type, f.name
    assert got.column_names[:len(table.column_names)] == table.column_names
    want = tsbatch.evaluate_table(cands, hw="h100")
    assert_frame_equal(pl.from_arrow(got), want, check_dtypes=False)
    # a RecordBatch comes back as a RecordBatch
    batch = tsbatch.evaluate_table(table.to_batches()[0], hw="h100")
    assert isinstance(batch, pa.RecordBatch) and batch.num_rows == cands.height
    assert batch.schema == got.schema
    assert_frame_equal(pl.from_arrow(batch), pl.from_arrow(got))


def test_evaluate_table_pandas_in_pandas_out(cands):
    pd = pytest.importorskip("pandas")
    got = tsbatch.evaluate_table(cands.to_pandas(), hw="a100")
    assert isinstance(got, pd.DataFrame)
    pd.testing.assert_frame_equal(got, evaluate(cands, "a100").to_pandas())


def test_evaluate_table_sampling_and_family_reach_evaluate(cands):
    few = tsbatch.evaluate_table(cands, hw="h100", wave_samples=2, k_samples=1, family="gemm")
    assert_frame_equal(few, evaluate(cands, "h100", "gemm", wave_samples=2, k_samples=1))
    default = tsbatch.evaluate_table(cands, hw="h100")
    assert not few["latency_us"].equals(default["latency_us"])  # the options were used


def test_evaluate_table_another_family():
    att = pl.DataFrame({"batch": [1, 4], "heads": [32, 64], "seq_len": [4096, 8192],
                        "head_dim": [128, 128], "dtype": ["bfloat16", "float16"]})
    got = tsbatch.evaluate_table(att.to_arrow(), hw="h100", family="attention_fa3")
    assert isinstance(got, pa.Table)
    assert_frame_equal(pl.from_arrow(got), evaluate(att, "h100", "attention_fa3"),
                       check_dtypes=False)


# --------------------------------------------------------------------------- rank_table
@pytest.mark.parametrize("top,flags", [("10%", ["--top", "10%"]), (0.25, ["--top", "0.25"]),
                                       (1.0, ["--rank"])])
def test_rank_table_equals_the_cli_and_rank(cands, cand_file, tmp_path, top, flags):
    got = tsbatch.rank_table(cands, hw="h100", top=top)
    cli = _cli_table(tmp_path, cand_file, *flags)
    assert_frame_equal(got, cli)
    frac = 0.1 if top == "10%" else float(top)
    wl = ["m", "n", "k", "dtype", "a_row_major", "b_row_major", "tf32"]
    assert_frame_equal(got, rank(evaluate(cands, "h100"), wl, frac))
    assert got["rank"].min() == 1 and got["feasible"].all()
    assert got.height < cands.height  # infeasible rows are never kept
    # arrow in, arrow out, same rows
    arrow = tsbatch.rank_table(_arrow_strings(cands), hw="h100", top=top)
    assert isinstance(arrow, pa.Table)
    assert_frame_equal(pl.from_arrow(arrow), got, check_dtypes=False)


# --------------------------------------------------------------------------- prune_configs
def test_prune_configs_wraps_prune(cands):
    wl = {"m": 4096, "n": 4096, "k": 4096, "dtype": "float16"}
    configs = cands.filter((pl.col("label") == "4096x4096x4096") & (pl.col("backend") == "triton")) \
        .select("block_m", "block_n", "block_k", "num_stages", "num_warps")
    want = prune(wl, configs.to_dicts(), hw="h100", top=0.2)
    assert tsbatch.prune_configs(wl, configs.to_dicts(), hw="h100", top=0.2) == want
    assert tsbatch.prune_configs(wl, configs, hw="h100", top=0.2) == want
    assert tsbatch.prune_configs(wl, configs.to_arrow(), hw="h100", top=0.2) == want
    assert len(want) == math.ceil(0.2 * configs.height)
    with pytest.raises(InputError, match="lacks 'num_warps'"):
        tsbatch.prune_configs(wl, [{"block_m": 64, "block_n": 64, "block_k": 32,
                                    "num_stages": 3}])
    with pytest.raises(InputError, match="workload lacks 'dtype'"):
        tsbatch.prune_configs({"m": 1, "n": 1, "k": 1}, configs.to_dicts())


# --------------------------------------------------------------------------- explain_config
def _cli_explain(capsys, *args) -> tuple[dict, str]:
    assert main(["explain", "--hw", "h100", "--json", *args]) == 0
    row = json.loads(capsys.readouterr().out)
    assert main(["explain", "--hw", "h100", *args]) == 0
    return row, capsys.readouterr().out


def _rows_equal(a: dict, b: dict) -> None:
    assert set(a) == set(b)
    for k in a:
        x, y = a[k], b[k]
        if isinstance(x, float) and isinstance(y, float) and math.isnan(x):
            assert math.isnan(y), k
        else:
            assert x == y, k


def test_explain_config_equals_the_cli(capsys):
    flags = ["--m", "4096", "--n", "4096", "--k", "4096", "--block-m", "128", "--block-n", "128",
             "--block-k", "64", "--num-stages", "4", "--num-warps", "8"]
    row, text = _cli_explain(capsys, *flags)
    # the CLI fills raster, tf32 and the layouts; given the same columns, the same row
    cfg = {**GEMM_CONFIG, "raster": "grouped", "tf32": False, "a_row_major": True,
           "b_row_major": True}
    e = tsbatch.explain_config(cfg, hw="h100")
    assert isinstance(e, tsbatch.Explanation)
    _rows_equal(json.loads(json.dumps(e.row, default=str)), row)
    assert str(e) + "\n" == text and e.text == str(e)
    assert e.latency_us == row["latency_us"] and e.bottleneck == row["bottleneck"]
    assert e["l2_hit"] == row["l2_hit"] and e.feasible
    assert repr(e).startswith("<Explanation gemm on NVIDIA H100") and e.bottleneck in repr(e)
    # columns left out take the table defaults: the same prediction
    short = tsbatch.explain_config(GEMM_CONFIG, hw="h100")
    assert short.text == e.text and short.latency_us == e.latency_us
    # one-row tables
    one = pl.DataFrame([GEMM_CONFIG])
    assert tsbatch.explain_config(one, hw="h100").text == e.text
    assert tsbatch.explain_config(one.to_arrow(), hw="h100").text == e.text


def test_explain_config_family_equals_the_cli(capsys):
    words = ["batch=1", "heads=64", "seq_len=8192", "head_dim=128", "dtype=bfloat16"]
    row, text = _cli_explain(capsys, "--family", "attention_fa3", *words)
    e = tsbatch.explain_config({"batch": 1, "heads": 64, "seq_len": 8192, "head_dim": 128,
                                "dtype": "bfloat16"}, hw="h100", family="attention_fa3")
    _rows_equal(json.loads(json.dumps(e.row, default=str)), row)
    assert str(e) + "\n" == text
    assert e.family == "attention_fa3"


def test_explain_config_infeasible():
    e = tsbatch.explain_config({**GEMM_CONFIG, "block_m": 256, "block_n": 256, "block_k": 256,
                                "num_stages": 8, "dtype": "float32"}, hw="a100")
    assert not e.feasible and e.latency_us is None
    assert "INFEASIBLE" in str(e) and "infeasible" in repr(e)


# --------------------------------------------------------------------------- catalogues
def test_list_gpus_equals_the_cli(capsys):
    gpus = tsbatch.list_gpus()
    assert gpus["key"].to_list() == list_hw()
    assert main(["hw"]) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()] == list_hw()
    for r in gpus.iter_rows(named=True):
        s = get_hw(r["key"])
        assert (r["name"], r["sm_count"], r["aliases"]) == (s.name, s.sm_count, list(s.aliases))
        assert r["l2_mib"] == s.l2_bytes / 2**20
    assert tsbatch.get_hw("h100").key in gpus["key"].to_list()


def test_list_families_equals_the_cli(capsys):
    fams = tsbatch.list_families()
    assert main(["families"]) == 0
    out = capsys.readouterr().out
    names = [line.split(":")[0] for line in out.splitlines() if line and not line.startswith(" ")]
    assert fams["name"].to_list() == names
    gemm = fams.row(fams["name"].to_list().index("gemm"), named=True)
    assert {"m", "n", "k", "dtype", "block_m"} <= set(gemm["required"])
    assert f"  required: {', '.join(gemm['required'])}" in out


# --------------------------------------------------------------------------- errors
@pytest.mark.parametrize("call,pattern", [
    (lambda df: tsbatch.evaluate_table(df, hw="h1000"), "h1000"),
    (lambda df: tsbatch.evaluate_table(df.drop("block_k"), hw="h100"), "missing column 'block_k'"),
    (lambda df: tsbatch.evaluate_table(df.with_columns(m=pl.col("m") * 0), hw="h100"),
     "column 'm' must be positive"),
    (lambda df: tsbatch.evaluate_table(df.to_dicts(), hw="h100"), "candidates must be"),
    (lambda df: tsbatch.evaluate_table(None, hw="h100"), "candidates is None"),
    (lambda df: tsbatch.evaluate_table(df, hw="h100", family="gemmm"), "unknown kernel family"),
    (lambda df: tsbatch.evaluate_table(df, hw="h100", wave_samples=1), "wave_samples"),
    (lambda df: tsbatch.evaluate_table(df.select("label"), hw="h100"), "no kernel family matches"),
    (lambda df: tsbatch.rank_table(df, hw="h100", top="0%"), "top must be in"),
    (lambda df: tsbatch.rank_table(df, hw="h100", top="five"), "top must be a percentage"),
    (lambda df: tsbatch.rank_table(df.to_arrow().drop_columns(["dtype"]), hw="h100",
                                   family="gemm"), "missing column 'dtype'"),
    (lambda df: tsbatch.rank_table(df.drop("dtype"), hw="h100"), "no kernel family matches"),
    (lambda df: tsbatch.explain_config(df, hw="h100"), "config has 73 rows"),
    (lambda df: tsbatch.explain_config({**GEMM_CONFIG, "m": [1, 2]}, hw="h100"),
     "not one value"),
    (lambda df: tsbatch.explain_config({}, hw="h100"), "config is empty"),
    (lambda df: tsbatch.explain_config({**GEMM_CONFIG, "dtype": "int8"}, hw="h100"),
     "unknown value 'int8'"),
    (lambda df: tsbatch.prune_configs({"m": 1, "n": 1, "k": 1, "dtype": "float16"}, [],
                                      hw="h100"), "configs is empty"),
])
def test_bad_input_is_one_input_error(cands, call, pattern):
    with pytest.raises(InputError, match=pattern):
        call(cands)


# --------------------------------------------------------------------------- the package
def test_import_is_cheap_and_every_name_resolves():
    code = ("import sys, tsbatch; heavy = sorted({m.split('.')[0] for m in sys.modules} & "
            "{'numba', 'numpy', 'polars', 'pyarrow', 'pandas', 'llvmlite'}); "
            "assert not heavy, heavy; print(len(tsbatch.__all__))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    for name in tsbatch.__all__:
        assert getattr(tsbatch, name) is not None, name
    assert tsbatch.Pruner is __import__("tsbatch.engine.prune", fromlist=["Pruner"]).Pruner
    assert callable(tsbatch.early_config_prune)
    with pytest.raises(AttributeError):
        tsbatch.no_such_name  # noqa: B018


def test_api_names_survive_the_modules_being_imported():
    """``tsbatch.engine.evaluate``, ``.rank``, ``.prune``, ``.explain`` and ``.hw`` are
    modules; the API's functions are not shadowed when they are imported."""
    code = ("import tsbatch, tsbatch.engine.evaluate, tsbatch.engine.rank, tsbatch.engine.prune, tsbatch.front.explain, "
            "tsbatch.hw, tsbatch.engine.screen, tsbatch.front.api, types; "
            "assert isinstance(tsbatch.engine.evaluate, types.ModuleType); "
            "assert all(callable(getattr(tsbatch, n)) and not isinstance(getattr(tsbatch, n), "
            "types.ModuleType) for n in ('evaluate_table', 'rank_table', 'prune_configs', "
            "'explain_config', 'list_gpus', 'list_families')); "
            "ns = {}; exec('from tsbatch import *', ns); "
            "assert set(tsbatch.__all__) <= set(ns) | {'__version__'}")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
