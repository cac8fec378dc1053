"""Bad input (issue 22): every output row is feasible with a finite latency or
infeasible with a reason; sizes whose products the model cannot represent and
configurations Triton cannot build are infeasible rows naming the rule."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from tsbatch.front.cli import main
from tsbatch.engine.evaluate import FAMILIES, evaluate

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("fuzz_cli", ROOT / "bench" / "fuzz_cli.py")
fuzz = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fuzz)

BASE = dict(fuzz.BASE["gemm"])


def _contract(res: pl.DataFrame) -> None:
    feas = res["feasible"].to_numpy()
    lat = res["latency_us"].to_numpy().astype(float)
    reason = res["infeasible_reason"].fill_null("").to_list()
    for f, t, r in zip(feas, lat, reason):
        assert (f and math.isfinite(t) and t > 0) or (not f and r.strip()), (f, t, r)


def _one(hw="h100", **change) -> dict:
    res = evaluate(pl.DataFrame([{**BASE, **change}]), hw)
    _contract(res)
    return res.row(0, named=True)


@pytest.mark.parametrize("size", [2 ** 40, 2 ** 62])
def test_sizes_whose_products_overflow_are_infeasible_not_null(size):
    r = _one(m=size, n=size, k=size)
    assert r["feasible"] is False
    assert "sizes too large" in r["infeasible_reason"] and "int64" in r["infeasible_reason"]
    assert r["latency_us"] is None and r["waves"] is None and r["dram_bytes"] is None


@pytest.mark.parametrize("change, rule", [
    ({"num_warps": 3}, "triton: num_warps must be a power of two"),
    ({"block_m": 7}, "triton: block_m must be a power of two"),
    ({"block_n": 96}, "triton: block_n must be a power of two"),
    ({"block_k": 24}, "triton: block_k must be a power of two"),
    ({"block_k": 8}, "triton: tl.dot needs block_k >= 16"),
    ({"block_m": 8}, "triton: tl.dot needs block_m >= 16"),
    ({"block_n": 1}, "triton: tl.dot needs block_n >= 16"),
    ({"block_m": 4096, "block_n": 512}, "TRITON_MAX_TENSOR_NUMEL"),
    ({"num_warps": 2 ** 62}, "threads per block exceed the per-block limit"),
])
def test_what_triton_cannot_build_is_infeasible_with_its_rule(change, rule):
    r = _one(**change)
    assert r["feasible"] is False
    assert rule in r["infeasible_reason"]


def test_library_rows_ignore_triton_tile_rules_but_not_sizes():
    ok = _one(backend="cublas", num_warps=3, block_k=24)  # catalog tiles replace them
    assert ok["feasible"] is True
    big = _one(backend="cublas", m=2 ** 62, n=2 ** 62, k=2 ** 62)
    assert big["feasible"] is False and "sizes too large" in big["infeasible_reason"]


def test_grid_and_cache_model_limits():
    r = _one(m=2 ** 31, n=2 ** 20, k=16, block_m=16, block_n=16, block_k=16)
    assert r["feasible"] is False and "grid too large" in r["infeasible_reason"]
    r = _one(m=16, n=16, k=2 ** 40, split_k=2 ** 30)
    assert r["feasible"] is False and "cache model" in r["infeasible_reason"]
    # a huge group_m orders the tiles as the grid's height does: a normal prediction
    assert _one(group_m=2 ** 62)["latency_us"] == _one(group_m=32)["latency_us"]


def test_valid_rows_are_unchanged_next_to_bad_ones():
    b = {**BASE, "backend": "triton"}
    good = pl.DataFrame([b, {**b, "m": 512, "block_m": 64, "num_warps": 4},
                         {**b, "backend": "cublas"}])
    bad = pl.DataFrame([{**b, "m": 2 ** 62, "n": 2 ** 62, "k": 2 ** 62},
                        {**b, "num_warps": 3}, {**b, "block_k": 8}])
    alone = evaluate(good, "h100")
    mixed = evaluate(pl.concat([bad[:1], good[:2], bad[1:], good[2:]]), "h100")
    mixed = mixed[[1, 2, 5]]
    assert alone.equals(mixed, null_equal=True)
    _contract(alone)


@pytest.mark.parametrize("family", [f for f in fuzz.BASE if f != "gemm"])
@pytest.mark.parametrize("size", [0, 1, 2 ** 31, 2 ** 40, 2 ** 62, 2 ** 63 - 1])
def test_every_family_keeps_the_contract_at_extreme_sizes(family, size):
    base = fuzz.BASE[family]
    fam = FAMILIES[family]
    ints = [c.name for c in fam.columns if c.kind == "int" and c.name in base]
    rows = [base] + [{**base, c: size} for c in ints] + [{**base, **{c: size for c in ints}}]
    df = pl.DataFrame(rows)
    pos = [c.name for c in fam.columns if c.positive and c.name in base]
    if size <= 0 and pos:  # non-positive sizes: one error naming the column
        with pytest.raises(ValueError, match="must be positive"):
            evaluate(df, "h100", family)
        return
    if fam.evaluate is not None:  # its own evaluation: rows, or one clear input error
        try:
            res = evaluate(df, "h100", family)
        except ValueError as exc:  # InputError
            assert str(exc) and "\n" not in str(exc)
            return
        _contract(res)
        return
    _contract(evaluate(df, "h100", family))


def test_program_family_overflow_is_named():
    base = fuzz.BASE["attention"]
    r = evaluate(pl.DataFrame([{**base, "seq_len": 2 ** 62, "batch": 2 ** 40}]), "h100",
                 "attention").row(0, named=True)
    assert r["feasible"] is False and r["latency_us"] is None
    assert "sizes too large" in r["infeasible_reason"] or "grid too large" in r["infeasible_reason"]


@pytest.mark.parametrize("change, rule", [
    ({"m": 2 ** 40, "n": 2 ** 40, "k": 2 ** 40}, "sizes too large"),
    ({"m": 2 ** 62, "n": 2 ** 62, "k": 2 ** 62}, "sizes too large"),
    ({"num_warps": 3}, "triton: num_warps must be a power of two"),
    ({"block_m": 7}, "triton: block_m must be a power of two"),
    ({"block_k": 24}, "triton: block_k must be a power of two"),
])
def test_cli_evaluate_one_row_tables_issue22(tmp_path, change, rule):
    src = tmp_path / "c.parquet"
    pl.DataFrame([{**BASE, **change}]).write_parquet(src)
    out = tmp_path / "o.parquet"
    assert main(["evaluate", str(src), "--hw", "h100", "-o", str(out), "-q"]) == 0
    r = pl.read_parquet(out).row(0, named=True)
    assert r["feasible"] is False and rule in r["infeasible_reason"]
    assert r["latency_us"] is None


def test_non_finite_float_column_is_an_input_error(tmp_path, capsys):
    base = fuzz.BASE["moe_grouped_gemm"]
    src = tmp_path / "c.parquet"
    pl.DataFrame([{**base, "skew": float("nan")}]).write_parquet(src)
    out = tmp_path / "o.parquet"
    assert main(["evaluate", str(src), "--hw", "h100", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "c.parquet" in err and "skew" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_prune_drops_what_triton_cannot_build():
    from tsbatch.engine.prune import prune

    cfgs = [{"block_m": 128, "block_n": 128, "block_k": 64, "num_stages": 4, "num_warps": w}
            for w in (3, 8)]
    kept = prune({"m": 4096, "n": 4096, "k": 4096, "dtype": "float16"}, cfgs, hw="h100", top=1.0)
    assert [c["num_warps"] for c in kept.configs] == [8]
    assert kept.n_feasible == 1 and np.isfinite(kept.latency_us).all()


def test_huge_group_m_of_a_tile_program_does_not_trap():
    """group_m = 2^62 under the persistent order wrapped the order kernel's group
    width to 0 (an integer division trap killed the process; found by the fuzz)."""
    base = fuzz.BASE["moe_grouped_gemm"]
    df = pl.DataFrame([{**base, "group_m": g, "raster": "persistent"} for g in (8, 2 ** 62)])
    res = evaluate(df, "h100", "moe_grouped_gemm")
    _contract(res)
    assert res["feasible"].all()


def test_accuracy_value_beyond_its_column_type_is_an_input_error(tmp_path, capsys):
    """A measured value beyond accuracy's canonical type (Int32) was a polars
    InvalidOperationError traceback (found by the fuzz)."""
    meas = pl.DataFrame([{**BASE, "num_stages": 2 ** 40, "group_m": 8, "backend": "triton",
                          "time_ms": 0.1, "gpu": "h100"}])
    src = tmp_path / "h100_m.parquet"
    meas.write_parquet(src)
    assert main(["accuracy", str(src)]) == 2
    err = capsys.readouterr().err
    assert "num_stages" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("rank", [[], ["--rank"], ["--top", "50%"]])
def test_integers_past_int64_in_ndjson_are_input_errors(tmp_path, capsys, rank):
    """NDJSON numbers past 2^63 read as Int128; a ranked run hashed them before
    validation and raised a polars error (found by the fuzz)."""
    src = tmp_path / "c.ndjson"
    src.write_text('{"m": 4096, "n": 4096, "k": 18446744073709551614, "dtype": "float16", '
                   '"block_m": 128, "block_n": 128, "block_k": 64, "num_stages": 4, '
                   '"num_warps": 8}\n')
    out = tmp_path / "o.parquet"
    assert main(["evaluate", str(src), "--hw", "h100", "-o", str(out), *rank]) == 2
    err = capsys.readouterr().err
    assert "'k'" in err and "int64" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


@pytest.mark.parametrize("values", [[3, 2 ** 63 + 5], [4096, 2 ** 12]])
def test_uint64_columns(tmp_path, capsys, values):
    """UInt64 sizes: within int64 they are sizes like any other; past it an input
    error (the range check once compared them with a negative bound and raised)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    t = pl.DataFrame([BASE, BASE]).to_arrow()
    t = t.set_column(t.column_names.index("k"), "k", pa.array(values, type=pa.uint64()))
    src = tmp_path / "c.parquet"
    pq.write_table(t, src)
    out = tmp_path / "o.csv"
    rc = main(["evaluate", str(src), "--hw", "h100", "-o", str(out), "-q"])
    err = capsys.readouterr().err
    if max(values) > 2 ** 63 - 1:
        assert rc == 2 and "'k'" in err and not out.exists()
    else:
        assert rc == 0 and pl.read_csv(out).height == 2


def test_nul_in_a_column_name_is_an_input_error(tmp_path, capsys):
    """A NUL in a column name made polars panic when a second batch was streamed
    into the output (found by the fuzz)."""
    src = tmp_path / "c.parquet"
    pl.DataFrame([BASE, BASE]).with_columns(pl.lit(1).alias("extra_\x00x")).write_parquet(src)
    out = tmp_path / "o.parquet"
    assert main(["evaluate", str(src), "--hw", "h100", "-o", str(out), "--batch-rows", "1"]) == 2
    assert "NUL" in capsys.readouterr().err and not out.exists()


def test_fused_family_nulls_are_input_errors(tmp_path, capsys):
    """Families that evaluate their frames themselves get the same validation
    (a null num_gpus of ag_gemm was a TypeError; found by the fuzz)."""
    rows = [dict(fuzz.BASE["ag_gemm"]), {**fuzz.BASE["ag_gemm"], "num_gpus": None}]
    src = tmp_path / "c.parquet"
    pl.DataFrame(rows).write_parquet(src)
    assert main(["explain", "--hw", "h100", "--family", "ag_gemm", "--candidates", str(src),
                 "--row", "1"]) == 2
    err = capsys.readouterr().err
    assert "num_gpus" in err and "null" in err


def test_collective_optional_column_of_nulls_takes_its_default():
    """An all-null optional column (type Null, e.g. from NDJSON) reached the
    collective model's own checks and raised NotImplementedError (found by the fuzz)."""
    fam = FAMILIES["ag_gemm"]
    opt = next(c.name for c in fam.columns if not c.required and c.default is not None)
    df = pl.DataFrame([fuzz.BASE["ag_gemm"]]).with_columns(pl.lit(None).alias(opt))
    _contract(evaluate(df, "h100", "ag_gemm"))
    # zero rows, every column of type Null (an empty NDJSON table)
    empty = pl.DataFrame({k: pl.Series([], dtype=pl.Null) for k in fuzz.BASE["collective"]})
    assert evaluate(empty, "h100", "collective").height == 0


def test_a_triton_version_not_of_the_form_major_minor_is_an_input_error(tmp_path, capsys):
    src = tmp_path / "c.parquet"
    pl.DataFrame([{**BASE, "triton_version": "3.1"}, {**BASE, "triton_version": "latest"}]
                 ).write_parquet(src)
    out = tmp_path / "o.parquet"
    assert main(["evaluate", str(src), "--hw", "h100", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "triton_version" in err and "'latest'" in err and "row 1" in err
    assert len(err.strip().splitlines()) == 1
    assert not out.exists()
    # releases with a patch number or a local build tag are accepted
    for v in ("3.6.0", "3.10+gitabc", "3.3-rc1"):
        assert _one(triton_version=v)["feasible"]
