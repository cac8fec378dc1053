"""The command line end to end: evaluate, sweep, explain, and every input error (issue 2, point 8).

Each bad input gives one message naming what is wrong, exit status 2, and no
output file.
"""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest

from tsbatch.front.cli import main
from tsbatch.boundary.io import read_metadata

GOOD = {
    "m": [4096, 512], "n": [4096, 1024], "k": [4096, 8192], "dtype": ["float16", "bfloat16"],
    "block_m": [128, 64], "block_n": [128, 64], "block_k": [64, 32], "num_stages": [4, 3],
    "num_warps": [8, 4], "group_m": [8, 8],
}


def _write(tmp_path, data, name="cand.parquet"):
    p = tmp_path / name
    pl.DataFrame(data).write_parquet(p)
    return p


def _run_err(capsys, argv, out):
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith("tsbatch: error: ")
    assert len(err.strip().splitlines()) == 1
    assert not out.exists()
    assert not list(out.parent.glob(f".{out.name}.tmp*"))
    return err


def test_evaluate_writes_every_row_with_metadata_issue2(tmp_path, capsys):
    cand = _write(tmp_path, GOOD)
    out = tmp_path / "out.parquet"
    assert main(["evaluate", str(cand), "--hw", "h100", "-o", str(out), "-q"]) == 0
    res = pl.read_parquet(out)
    assert res.height == 2
    for col in ("feasible", "infeasible_reason", "latency_us", "t_prologue_us", "t_steady_us",
                "t_epilogue_us", "waves", "resident_tiles", "pipeline_depth", "l2_hit", "l15_hit",
                "dram_bytes", "util_tensor_core", "util_cuda_core", "util_smem", "util_l2",
                "util_dram", "bottleneck"):
        assert col in res.columns, col
    assert res["latency_us"].is_not_null().all()
    md = read_metadata(out)
    assert md["tsbatch.model_version"]
    assert md["tsbatch.hw"] == "h100_sxm"
    assert len(md["tsbatch.input_hash"]) == 64
    assert '"candidates"' in md["tsbatch.input_hashes"]


def test_evaluate_streamed_batches_equal_one_batch(tmp_path, capsys):
    """A file larger than --batch-rows is streamed (pyarrow writer) and gives the
    same rows, order, dtypes and provenance as one batch (polars writer)."""
    data = {k: v * 9 for k, v in GOOD.items()}
    data["m"] = [64 * (i + 1) for i in range(18)]
    cand = _write(tmp_path, data)
    one, many = tmp_path / "one.parquet", tmp_path / "many.parquet"
    assert main(["evaluate", str(cand), "--hw", "a100", "-o", str(one), "-q"]) == 0
    assert main(["evaluate", str(cand), "--hw", "a100", "-o", str(many), "-q",
                 "--batch-rows", "5"]) == 0
    a, b = pl.read_parquet(one), pl.read_parquet(many)
    assert a.height == 18 and a.equals(b, null_equal=True) and a.schema == b.schema
    assert read_metadata(one) == read_metadata(many)
    assert not list(tmp_path.glob(".*tmp*"))


def test_evaluate_top_streamed_equals_one_batch(tmp_path, capsys):
    """--top over a file of several batches (bounds surveyed first, then read
    twice more) keeps the same rows, ranks and values as one batch."""
    rng = np.random.default_rng(3)
    n = 60
    data = {"m": rng.choice([256, 1024, 4096], n), "n": rng.choice([512, 2048], n),
            "k": np.full(n, 1024), "dtype": ["bfloat16"] * n,
            "block_m": rng.choice([16, 64, 128, 256], n), "block_n": rng.choice([32, 128], n),
            "block_k": rng.choice([32, 64], n), "num_stages": rng.choice([2, 3, 4, 6], n),
            "num_warps": rng.choice([2, 4, 8], n)}
    cand = _write(tmp_path, data)
    one, many = tmp_path / "one.parquet", tmp_path / "many.parquet"
    for out, extra in ((one, []), (many, ["--batch-rows", "7", "--progress"])):
        assert main(["evaluate", str(cand), "--hw", "h100", "-o", str(out), "--top", "20%",
                     "-q", *extra]) == 0
    a, b = pl.read_parquet(one), pl.read_parquet(many)
    assert 0 < a.height < n and a.equals(b, null_equal=True)
    cap = capsys.readouterr()
    assert "predicted in full" in cap.out
    assert "evaluate" in cap.err and "/180" in cap.err  # the bar: 3 passes of 60 rows


def test_evaluate_sampling_options(tmp_path, capsys):
    """--wave-samples / --k-samples reach the cache model (a launch of many waves
    predicts differently with 2 analysed waves than with all of them), are
    recorded in the metadata, and bad values are one clear error."""
    data = {"m": [16384, 16384], "n": [16384, 8192], "k": [4096, 4096],
            "dtype": ["bfloat16"] * 2, "block_m": [64, 128], "block_n": [64, 64],
            "block_k": [64, 64], "num_stages": [3, 3], "num_warps": [4, 4]}
    cand = _write(tmp_path, data)
    outs = {}
    for w in (2, 10_000):
        outs[w] = tmp_path / f"w{w}.parquet"
        assert main(["evaluate", str(cand), "--hw", "h100", "-o", str(outs[w]), "-q",
                     "--wave-samples", str(w), "--k-samples", "2"]) == 0
        assert json.loads(read_metadata(outs[w])["tsbatch.sampling"]) == {
            "k_samples": 2, "wave_samples": w, "max_lookback": 4}
    a, b = pl.read_parquet(outs[2]), pl.read_parquet(outs[10_000])
    assert (a["l2_hit"] != b["l2_hit"]).any()
    for flag, bad in (("--wave-samples", "1"), ("--k-samples", "0")):
        err = _run_err(capsys, ["evaluate", str(cand), "--hw", "h100", "-o",
                                str(tmp_path / "x.parquet"), flag, bad], tmp_path / "x.parquet")
        assert flag.lstrip("-").replace("-", "_") in err


def test_evaluate_top_keeps_one_per_workload_issue2(tmp_path, capsys):
    data = {k: v * 3 for k, v in GOOD.items()}
    data["num_stages"] = [2, 3, 4, 2, 3, 4]
    cand = _write(tmp_path, data)
    out = tmp_path / "top.parquet"
    assert main(["evaluate", str(cand), "--hw", "a100", "-o", str(out), "--top", "5%", "-q"]) == 0
    res = pl.read_parquet(out)
    assert res.height == 2  # two workloads, max(1, ceil(5 % of 3)) each
    assert (res["rank"] == 1).all()


def test_infeasible_is_a_row_not_an_error_issue2(tmp_path):
    data = dict(GOOD)
    data["dtype"] = ["float32", "float32"]
    data["block_m"] = [256, 64]
    data["block_n"] = [256, 64]
    data["block_k"] = [128, 32]
    data["num_stages"] = [6, 2]
    cand = _write(tmp_path, data)
    out = tmp_path / "o.parquet"
    assert main(["evaluate", str(cand), "--hw", "a100", "-o", str(out), "-q"]) == 0
    res = pl.read_parquet(out)
    assert res["feasible"].to_list() == [False, True]
    assert "shared memory" in res["infeasible_reason"][0]
    assert res["latency_us"][0] is None


@pytest.mark.parametrize("mutate, needle", [
    (lambda d: d.pop("block_k"), "'block_k'"),
    (lambda d: d.update(m=["4096", "512"]), "'m' must be integer"),
    (lambda d: d.update(k=[4096, 0]), "'k' must be positive; row 1 has 0"),
    (lambda d: d.update(n=[-5, 1024]), "'n' must be positive; row 0 has -5"),
    (lambda d: d.update(dtype=["float16", "int4"]), "unknown value 'int4'"),
    (lambda d: d.update(num_warps=[8, None]), "'num_warps' has a null value at row 1"),
])
def test_bad_columns_issue2(tmp_path, capsys, mutate, needle):
    data = {k: list(v) for k, v in GOOD.items()}
    mutate(data)
    cand = _write(tmp_path, data)
    out = tmp_path / "out.parquet"
    err = _run_err(capsys, ["evaluate", str(cand), "--hw", "h100", "-o", str(out)], out)
    assert needle in err


def test_unknown_gpu_issue2(tmp_path, capsys):
    cand = _write(tmp_path, GOOD)
    out = tmp_path / "out.parquet"
    err = _run_err(capsys, ["evaluate", str(cand), "--hw", "v100", "-o", str(out)], out)
    assert "unknown GPU 'v100'" in err and "h100" in err


def test_unreadable_and_missing_files_issue2(tmp_path, capsys):
    out = tmp_path / "out.parquet"
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not a parquet file at all")
    err = _run_err(capsys, ["evaluate", str(bad), "--hw", "h100", "-o", str(out)], out)
    assert "bad.parquet" in err and "not a readable Parquet" in err
    err = _run_err(capsys, ["evaluate", str(tmp_path / "nope.parquet"), "--hw", "h100", "-o",
                            str(out)], out)
    assert "nope.parquet: no such file" in err


def test_sweep_ranks_and_writes_issue2(tmp_path, capsys):
    out = tmp_path / "ranked.parquet"
    assert main(["sweep", "tiny", "--hw", "h100", "--top", "5%", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "ranked" not in text or True
    res = pl.read_parquet(out)
    per = res.group_by("workload_id").len()
    assert per.height == 6  # 3 token counts x 2 shapes
    # 72 schedules minus rule drops: ceil(5 %) is 3 or 4 per workload, never 0
    assert per["len"].min() >= 1 and per["len"].max() <= 4
    assert res["feasible"].all()
    md = read_metadata(out)
    assert '"sweep"' in md["tsbatch.input_hashes"]


def test_sweep_bad_file_issue2(tmp_path, capsys):
    spec = tmp_path / "s.toml"
    spec.write_text('[sweep]\nname="x"\n[workload]\nm=[64]\ndtype=["float16"]\n'
                    '[schedule]\nblock_q=[1]\n')
    out = tmp_path / "o.parquet"
    err = _run_err(capsys, ["sweep", str(spec), "--hw", "h100", "-o", str(out)], out)
    assert "block_q" in err


def test_explain_words_issue2(capsys):
    rc = main(["explain", "--hw", "h100", "--m", "4096", "--n", "4096", "--k", "4096",
               "--block-m", "128", "--block-n", "128", "--block-k", "64", "--num-stages", "4",
               "--num-warps", "8"])
    out = capsys.readouterr().out
    assert rc == 0
    for word in ("Predicted latency", "prologue", "steady state", "epilogue", "Occupancy",
                 "pipeline depth", "L2 hit", "Bottleneck", "tensor_core"):
        assert word in out, word


def test_explain_warns_when_a_configuration_spills(capsys):
    """A spilling configuration (128x256 fp32 accumulators on 4 warps: 256 registers
    a thread) gets the warning that it may run slower than predicted; one that does not
    spill does not."""
    base = ["explain", "--hw", "h100", "--m", "4096", "--n", "4096", "--k", "4096",
            "--block-k", "64", "--num-stages", "3"]
    assert main(base + ["--block-m", "128", "--block-n", "256", "--num-warps", "4"]) == 0
    out = capsys.readouterr().out
    assert "registers/thread spill" in out and "slower than predicted" in out
    assert main(base + ["--block-m", "128", "--block-n", "128", "--num-warps", "8"]) == 0
    assert "spill" not in capsys.readouterr().out


def test_explain_missing_option_issue2(capsys):
    rc = main(["explain", "--hw", "h100", "--m", "64"])
    assert rc == 2
    assert "--n is required" in capsys.readouterr().err


def test_shared_h100_file_is_valid_input_issue2(shared_data, tmp_path):
    from tsbatch.engine.evaluate import evaluate

    src = pl.read_parquet(shared_data / "gemm" / "h100_triton_mm.parquet").head(400)
    res = evaluate(src, "h100")
    assert res.height == src.height
    assert res.filter(pl.col("feasible"))["latency_us"].is_not_null().all()
    cub = res.filter(pl.col("backend") == "cublas")
    assert cub.height > 0 and (cub["library_tile"].str.len_chars() > 0).all()


def test_empty_candidate_table_evaluates_to_empty_issue2():
    from tsbatch.engine.evaluate import evaluate

    res = evaluate(pl.DataFrame(GOOD).head(0), "h100")
    assert res.height == 0 and "latency_us" in res.columns


def test_malloc_arena_cap(monkeypatch):
    """The CLI caps glibc's per-thread heap arenas (the bound threads' memory),
    and leaves a user's MALLOC_ARENA_MAX alone."""
    import platform
    import sys

    from tsbatch.front.cli import limit_malloc_arenas

    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert limit_malloc_arenas() is False
    monkeypatch.delenv("MALLOC_ARENA_MAX")
    if sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc":
        assert limit_malloc_arenas() is True


def test_read_ahead_yields_in_order_one_ahead():
    """The CLI's batch reader: results in order, the next read started only when
    the current result is handed over (one ahead), errors raised in place."""
    import threading

    from tsbatch.boundary.io import read_ahead

    started = []
    gate = threading.Lock()

    def reader(i):
        def read():
            with gate:
                started.append(i)
            if i == 3:
                raise OSError("disk gone")
            return i * 10
        return read

    it = read_ahead([reader(i) for i in range(5)])
    assert next(it) == 0
    assert next(it) == 10
    import time

    deadline = time.monotonic() + 10
    while len(started) < 3 and time.monotonic() < deadline:  # read 2 runs on its thread
        time.sleep(0.001)
    assert started == [0, 1, 2]  # 2 is read while 10 is worked on; 3 not yet
    assert next(it) == 20
    with pytest.raises(OSError, match="disk gone"):
        next(it)
    assert list(read_ahead([])) == []
