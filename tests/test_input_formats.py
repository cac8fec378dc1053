"""Candidate tables in Parquet, Arrow IPC/Feather, CSV and NDJSON, chosen by
extension, with the same validation and one-line errors; ``-o`` writes Parquet,
or CSV when the name ends in .csv (issue 22)."""

from __future__ import annotations

import polars as pl
import pytest

from tsbatch.front.cli import main

GOOD = {
    "m": [4096, 512, 1024], "n": [4096, 1024, 1024], "k": [4096, 8192, 64],
    "dtype": ["float16", "bfloat16", "float16"], "block_m": [128, 64, 32],
    "block_n": [128, 64, 32], "block_k": [64, 32, 16], "num_stages": [4, 3, 2],
    "num_warps": [8, 4, 3], "label": ["a", "ñ中", ""],
}
EXTS = (".parquet", ".arrow", ".feather", ".ipc", ".csv", ".ndjson", ".jsonl")


def _write(df: pl.DataFrame, path):
    ext = path.suffix
    if ext == ".parquet":
        df.write_parquet(path)
    elif ext in (".arrow", ".feather", ".ipc"):
        df.write_ipc(path)
    elif ext == ".csv":
        df.write_csv(path)
    else:
        df.write_ndjson(path)
    return path


def _err(capsys, argv, out, *names):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("tsbatch: error: ") and len(err.strip().splitlines()) == 1, err
    for n in names:
        assert n in err, (n, err)
    assert not out.exists() and not list(out.parent.glob(f".{out.name}.tmp*"))
    return err


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    d = tmp_path_factory.mktemp("ref")
    src = _write(pl.DataFrame(GOOD), d / "c.parquet")
    out = d / "o.parquet"
    assert main(["evaluate", str(src), "--hw", "h100", "-o", str(out), "-q"]) == 0
    return pl.read_parquet(out)


@pytest.mark.parametrize("ext", EXTS)
@pytest.mark.parametrize("batch_rows", [None, 2])
def test_every_format_gives_the_parquet_results(tmp_path, reference, ext, batch_rows):
    src = _write(pl.DataFrame(GOOD), tmp_path / f"c{ext}")
    out = tmp_path / "o.parquet"
    argv = ["evaluate", str(src), "--hw", "h100", "-o", str(out), "-q"]
    if batch_rows:
        argv += ["--batch-rows", str(batch_rows)]
    assert main(argv) == 0
    assert pl.read_parquet(out).equals(reference, null_equal=True)


def test_output_csv_when_the_name_says_so(tmp_path, reference):
    src = _write(pl.DataFrame(GOOD), tmp_path / "c.ndjson")
    out = tmp_path / "o.csv"
    assert main(["evaluate", str(src), "--hw", "h100", "-o", str(out)]) == 0
    assert out.read_bytes()[:4] != b"PAR1"
    got = pl.read_csv(out, infer_schema_length=None)
    assert got.columns == reference.columns
    assert got["feasible"].to_list() == reference["feasible"].to_list()
    lat = reference["latency_us"].to_list()
    assert [(a is None and b is None) or abs(a - b) <= 1e-9 * abs(b)
            for a, b in zip(got["latency_us"].to_list(), lat)] == [True] * len(lat)
    assert got["infeasible_reason"].fill_null("").to_list() == \
        reference["infeasible_reason"].fill_null("").to_list()


def test_ranked_output_to_csv(tmp_path):
    src = _write(pl.DataFrame(GOOD), tmp_path / "c.csv")
    out = tmp_path / "o.csv"
    assert main(["evaluate", str(src), "--hw", "h100", "-o", str(out), "--top", "50%",
                 "-q"]) == 0
    assert "rank" in pl.read_csv(out).columns


@pytest.mark.parametrize("ext", EXTS)
def test_same_validation_errors_in_every_format(tmp_path, capsys, ext):
    bad = pl.DataFrame({**GOOD, "m": ["4096", "x", "1"]})
    src = _write(bad, tmp_path / f"c{ext}")
    out = tmp_path / "o.parquet"
    _err(capsys, ["evaluate", str(src), "--hw", "h100", "-o", str(out)], out, src.name, "'m'")
    neg = pl.DataFrame({**GOOD, "k": [4096, -3, 64]})
    src = _write(neg, tmp_path / f"n{ext}")
    _err(capsys, ["evaluate", str(src), "--hw", "h100", "-o", str(out)], out, src.name,
         "'k'", "-3")


@pytest.mark.parametrize("ext,data", [
    (".csv", b'm,n\n1,"unterminated\n'), (".ndjson", b'{"m": 1,\n'),
    (".arrow", b"ARROW1\x00\x00garbage"), (".parquet", b"PAR1garbagePAR1"),
    (".csv", b""), (".jsonl", b"[1, 2]\n"),
])
def test_unreadable_files_are_one_line_errors(tmp_path, capsys, ext, data):
    src = tmp_path / f"c{ext}"
    src.write_bytes(data)
    out = tmp_path / "o.csv"
    _err(capsys, ["evaluate", str(src), "--hw", "h100", "-o", str(out)], out, src.name)


def test_nested_column_cannot_go_to_csv(tmp_path, capsys):
    df = pl.DataFrame(GOOD).with_columns(extra=pl.Series([[1], [2], [3]]))
    src = _write(df, tmp_path / "c.parquet")
    out = tmp_path / "o.csv"
    _err(capsys, ["evaluate", str(src), "--hw", "h100", "-o", str(out)], out, "extra", "CSV")


def test_explain_and_accuracy_read_other_formats(tmp_path, capsys):
    src = _write(pl.DataFrame(GOOD), tmp_path / "c.csv")
    assert main(["explain", "--hw", "h100", "--candidates", str(src), "--row", "1",
                 "--json"]) == 0
    assert '"latency_us"' in capsys.readouterr().out
    meas = pl.DataFrame(GOOD).with_columns(time_ms=pl.Series([0.2, 0.05, 0.01]),
                                           gpu=pl.lit("h100"), group_m=pl.lit(8),
                                           backend=pl.lit("triton"))
    msrc = _write(meas, tmp_path / "h100_meas.ndjson")
    rc = main(["accuracy", str(msrc), "--json", str(tmp_path / "a.json")])
    capsys.readouterr()
    assert rc == 0 and (tmp_path / "a.json").exists()
