"""The accuracy benchmark (issue 3), scored with a fake predictor.

Every metric is checked against a hand computation written as a plain Python
loop, on a small slice of the shared H100 measurements, so these tests do not
depend on how accurate the model is.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
from pathlib import Path

import polars as pl
import pytest

from tsbatch.measured.accuracy import (
    GROUP_KEYS,
    add_parser,
    check_thresholds,
    detect_family,
    parse_threshold,
    run,
    run_accuracy,
)
from tsbatch.errors import InputError
from tsbatch.measured.metrics import METRICS, accuracy_metrics, keep_count

DATA = Path(os.environ.get("TSBATCH_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
H100 = DATA / "gemm" / "h100_triton_mm.parquet"
ATTENTION = DATA / "attention" / "a100_flexattention.parquet"
COLLECTIVE = DATA / "collectives" / "vidur_a100_dgx_all_reduce.parquet"

needs_data = pytest.mark.skipif(not H100.exists(), reason=f"shared measured data not found at {DATA}")

#: Relative tolerance between the polars metrics and the Python loop: both sum
#: the same float64 values, only in a different order.
REL = 1e-9

# Problems of the slice: a tiny-k fp16 GEMM (one layout), a tf32 GEMM whose
# configurations were measured twice (even median) and five of which failed to
# run (inf), a tf32 GEMM with nine repeats, and a bf16 GEMM.
SLICE_PROBLEMS = [
    dict(m=8, n=76672, k=2, dtype="float16", a_row_major=True, b_row_major=True),
    dict(m=1152, n=1536, k=30464, dtype="float32"),
    dict(m=23424, n=1280, k=7112, dtype="float32"),
    dict(m=32, n=1280, k=1024, dtype="bfloat16", a_row_major=False, b_row_major=False),
]

INF = float("inf")


# ----------------------------------------------------------------------
# fake predictor: a fixed formula, with ties and infeasible configurations
# ----------------------------------------------------------------------

def _assert_same_metrics(got: dict, want: dict) -> None:
    """Equal metric dicts up to summation order (polars' parallel group-by adds
    floats in no fixed order, so the last bit may differ between runs)."""
    assert got.keys() == want.keys()
    for key, value in want.items():
        if value is None:
            assert got[key] is None, key
        else:
            assert got[key] == pytest.approx(value, rel=1e-12, abs=1e-12), key

def fake_one(row: dict) -> float | None:
    """Predicted microseconds of one configuration; ``None`` when infeasible."""
    work_us = 2.0 * row["m"] * row["n"] * row["k"] / 400e12 * 1e6
    if row["backend"] == "cublas":
        return work_us * 1.3 + 4.0
    if row["block_m"] == 128 and row["block_n"] == 128 and row["num_stages"] == 5:
        return None  # "shared memory overflow"
    # depends on the tile shape only: configurations differing in block_k,
    # stages or warps tie
    return work_us * (1.0 + 32.0 / row["block_m"] + 32.0 / row["block_n"]) + 3.0


def fake_predictor(frame: pl.DataFrame, hw: str) -> pl.DataFrame:
    assert hw == "h100_sxm"
    preds = [fake_one(r) for r in frame.to_dicts()]
    return frame.with_columns(
        latency_us=pl.Series([math.nan if p is None else p for p in preds], dtype=pl.Float64),
        feasible=pl.Series([p is not None for p in preds], dtype=pl.Boolean),
        infeasible_reason=pl.Series([None if p is not None else "smem" for p in preds], dtype=pl.String),
    )


FAKE = {"gemm": fake_predictor}


# ----------------------------------------------------------------------
# hand computation
# ----------------------------------------------------------------------
def average_ranks(values: list[float]) -> list[float]:
    """1-based ranks, ties sharing the average of their positions."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for t in range(i, j + 1):
            ranks[order[t]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return ranks


def pearson(x: list[float], y: list[float]) -> float:
    mx = sum(x) / len(x)
    my = sum(y) / len(y)
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y))
    sxx = sum((a - mx) ** 2 for a in x)
    syy = sum((b - my) ** 2 for b in y)
    if sxx == 0 or syy == 0:
        return 0.0
    return sxy / math.sqrt(sxx * syy)


def hand_rows(raw: list[dict]) -> list[dict]:
    """Drop failed runs, take the median of repeats, predict each configuration."""
    config_keys = ("m", "n", "k", "dtype", "a_row_major", "b_row_major", "tf32", "backend",
                   "block_m", "block_n", "block_k", "num_stages", "num_warps", "group_m")
    times: dict[tuple, list[float]] = {}
    first: dict[tuple, dict] = {}
    for r in raw:
        if not math.isfinite(r["time_ms"]):
            continue
        key = tuple(r[c] for c in config_keys)
        times.setdefault(key, []).append(r["time_ms"])
        first.setdefault(key, r)
    rows = []
    for key, ts in times.items():
        r = first[key]
        problem = key[:7]
        dtype = "tf32" if r["dtype"] == "float32" and r["tf32"] else r["dtype"]
        rows.append(dict(
            group=("h100_sxm", "gemm", dtype, r["backend"]),
            problem=problem,
            unit=problem + (r["backend"],),
            meas=statistics.median(ts) * 1000.0,
            pred=fake_one(r),
        ))
    return rows


def hand_metrics(rows: list[dict]) -> dict:
    ok = [r for r in rows if r["pred"] is not None]
    apes = [abs(r["pred"] - r["meas"]) / r["meas"] for r in ok]
    out = {
        "rows": len(rows),
        "problems": len({r["problem"] for r in rows}),
        "infeasible_rows": len(rows) - len(ok),
        "mape_pct": 100.0 * sum(apes) / len(apes),
        "wmape_pct": 100.0 * sum(abs(r["pred"] - r["meas"]) for r in ok) / sum(r["meas"] for r in ok),
        "median_ape_pct": 100.0 * statistics.median(apes),
    }
    units: dict[tuple, list[dict]] = {}
    for r in rows:
        units.setdefault(r["unit"], []).append(r)
    rhos, retentions, regrets = [], [], []
    for members in units.values():
        feasible = [r for r in members if r["pred"] is not None]
        if len(feasible) >= 5:
            rhos.append(pearson(average_ranks([r["pred"] for r in feasible]),
                                average_ranks([r["meas"] for r in feasible])))
        if len(members) >= 2:
            # predicted order; infeasible last; equal predictions: slowest measured first
            order = sorted(members, key=lambda r: (INF if r["pred"] is None else r["pred"], -r["meas"]))
            kept = order[: max(1, math.ceil(len(members) * 5 / 100))]
            best = min(r["meas"] for r in members)
            retentions.append(100.0 * best / min(r["meas"] for r in kept))
            regrets.append(100.0 * (order[0]["meas"] / best - 1.0))
    out["spearman"] = sum(rhos) / len(rhos) if rhos else None
    out["top5_retention_pct"] = sum(retentions) / len(retentions) if retentions else None
    out["top1_regret_pct"] = sum(regrets) / len(regrets) if regrets else None
    return out


def assert_metrics_equal(got: dict, want: dict) -> None:
    for metric in METRICS:
        if want[metric] is None:
            assert got[metric] is None, metric
        elif isinstance(want[metric], int):
            assert got[metric] == want[metric], metric
        else:
            assert got[metric] == pytest.approx(want[metric], rel=REL), metric


# ----------------------------------------------------------------------
# fixtures
# ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def h100_slice(tmp_path_factory) -> Path:
    """The four problems of SLICE_PROBLEMS, all their rows (repeats, inf, cuBLAS)."""
    if not H100.exists():
        pytest.skip(f"shared measured data not found at {DATA}")
    df = pl.read_parquet(H100)
    cond = pl.lit(False)
    for p in SLICE_PROBLEMS:
        cond = cond | pl.all_horizontal([pl.col(c) == v for c, v in p.items()])
    part = df.filter(cond)
    path = tmp_path_factory.mktemp("slice") / "h100_slice.parquet"
    part.write_parquet(path)
    return path


@pytest.fixture(scope="module")
def slice_result(h100_slice):
    return run_accuracy([h100_slice], predictors=FAKE)


def _frame_with(path: Path, tmp_path: Path, name: str, fn) -> Path:
    out = tmp_path / name
    fn(pl.read_parquet(path)).write_parquet(out)
    return out


# ----------------------------------------------------------------------
# metrics against the hand computation
# ----------------------------------------------------------------------
@needs_data
def test_slice_has_what_the_metrics_must_handle_issue3(h100_slice):
    raw = pl.read_parquet(h100_slice)
    assert (~raw["time_ms"].is_finite()).sum() > 0  # failed runs
    reps = raw.group_by(pl.exclude("time_ms", "source")).len()["len"]
    assert set(reps.to_list()) >= {2, 3, 9}  # even and odd repeat counts
    assert set(raw["backend"]) == {"triton", "cublas"}
    assert set(raw["dtype"]) == {"float16", "float32", "bfloat16"}


@needs_data
def test_overall_metrics_match_hand_computation_issue3(h100_slice, slice_result):
    rows = hand_rows(pl.read_parquet(h100_slice).to_dicts())
    want = hand_metrics(rows)
    assert want["infeasible_rows"] > 0
    assert_metrics_equal(slice_result.overall, want)


@needs_data
def test_group_metrics_match_hand_computation_issue3(h100_slice, slice_result):
    rows = hand_rows(pl.read_parquet(h100_slice).to_dicts())
    groups = sorted({r["group"] for r in rows})
    got = slice_result.groups
    assert [tuple(r[k] for k in GROUP_KEYS) for r in got.iter_rows(named=True)] == groups
    for g, row in zip(groups, got.iter_rows(named=True)):
        assert_metrics_equal(row, hand_metrics([r for r in rows if r["group"] == g]))
    cublas = got.filter(pl.col("backend") == "cublas")
    # one library kernel per problem: nothing to rank
    assert cublas["spearman"].is_null().all()
    assert cublas["top5_retention_pct"].is_null().all()


@needs_data
def test_nonfinite_times_dropped_and_counted_issue3(h100_slice, slice_result):
    raw = pl.read_parquet(h100_slice)
    n_inf = int((~raw["time_ms"].is_finite()).sum())
    assert slice_result.skipped["nonfinite_time_rows"] == n_inf
    assert slice_result.scored["measured_us"].is_finite().all()
    assert slice_result.skipped["infeasible_rows"] == slice_result.overall["infeasible_rows"]


def test_spearman_with_ties_issue3():
    # predictions tie on the first two configurations: ranks 1.5, 1.5, 3, 4, 5
    df = pl.DataFrame({
        "_problem": [0] * 5, "_unit": [0] * 5,
        "measured_us": [1.0, 2.0, 3.0, 4.0, 5.0],
        "predicted_us": [1.0, 1.0, 2.0, 3.0, 4.0],
        "feasible": [True] * 5,
    })
    got = accuracy_metrics(df).row(0, named=True)
    # rank deviations (-1.5, -1.5, 0, 1, 2) and (-2, -1, 0, 1, 2): 9.5 / sqrt(9.5 * 10)
    assert got["spearman"] == pytest.approx(9.5 / math.sqrt(95.0), rel=REL)
    assert got["spearman"] == pytest.approx(pearson(average_ranks([1, 1, 2, 3, 4]), [1, 2, 3, 4, 5]))


def test_spearman_constant_prediction_scores_zero_and_small_units_are_left_out():
    df = pl.DataFrame({
        "_problem": [0] * 5 + [1] * 4, "_unit": [0] * 5 + [1] * 4,
        "measured_us": [1.0, 2.0, 3.0, 4.0, 5.0, 1.0, 2.0, 3.0, 4.0],
        "predicted_us": [7.0] * 5 + [4.0, 3.0, 2.0, 1.0],  # unit 1 reversed but has < 5 configs
        "feasible": [True] * 9,
    })
    got = accuracy_metrics(df).row(0, named=True)
    assert got["spearman"] == 0.0
    # ties of the prediction are broken pessimistically: unit 0 keeps its slowest (5.0)
    assert got["top1_regret_pct"] == pytest.approx(((5.0 / 1.0 - 1) + (4.0 / 1.0 - 1)) / 2 * 100)
    assert got["top5_retention_pct"] == pytest.approx((20.0 + 25.0) / 2)


def test_infeasible_rows_are_ranked_last_but_not_scored():
    df = pl.DataFrame({
        "_problem": [0] * 3, "_unit": [0] * 3,
        "measured_us": [1.0, 2.0, 4.0],
        "predicted_us": [math.nan, 2.0, 3.0],
        "feasible": [False, True, True],
    })
    got = accuracy_metrics(df).row(0, named=True)
    assert got["infeasible_rows"] == 1
    assert got["rows"] == 3
    assert got["mape_pct"] == pytest.approx(100 * (0.0 + 0.25) / 2)
    assert got["wmape_pct"] == pytest.approx(100 * 1.0 / 6.0)
    assert got["top5_retention_pct"] == pytest.approx(50.0)  # the fastest was predicted infeasible
    assert got["top1_regret_pct"] == pytest.approx(100.0)
    # a feasible row whose prediction is not finite counts as infeasible too
    df2 = df.with_columns(feasible=pl.lit(True))
    assert accuracy_metrics(df2).row(0, named=True) == got


def test_keep_count_is_an_exact_ceiling():
    assert [keep_count(n) for n in (1, 2, 19, 20, 21, 29, 40, 41, 60, 100)] == [1, 1, 1, 1, 2, 2, 2, 3, 3, 5]


def test_metrics_of_an_empty_selection_are_empty():
    df = pl.DataFrame(schema={"_problem": pl.Int64, "_unit": pl.Int64, "measured_us": pl.Float64,
                              "predicted_us": pl.Float64, "feasible": pl.Boolean, "gpu": pl.String})
    assert accuracy_metrics(df, ["gpu"]).height == 0


# ----------------------------------------------------------------------
# report document
# ----------------------------------------------------------------------
@needs_data
def test_json_schema_keys_issue3(slice_result, tmp_path):
    path = tmp_path / "r.json"
    slice_result.write_json(path)
    doc = json.loads(path.read_text())  # strict JSON: no NaN
    assert set(doc) == {"overall", "groups", "skipped", "diagnostics"}  # issue keys, plus label checks
    assert list(doc["overall"]) == list(METRICS)
    assert doc["groups"]
    for g in doc["groups"]:
        assert list(g) == [*GROUP_KEYS, *METRICS]
        assert {"gpu", "dtype", "backend"} <= set(g)
    assert {"unsupported_family_rows", "nonfinite_time_rows", "infeasible_rows"} <= set(doc["skipped"])
    assert "NaN" not in path.read_text()


@needs_data
def test_unsupported_families_are_reported_as_skipped(h100_slice, tmp_path):
    att = _frame_with(ATTENTION, tmp_path, "a100_att.parquet", lambda d: d.head(11))
    col = _frame_with(COLLECTIVE, tmp_path, "coll.parquet", lambda d: d.head(7))
    res = run_accuracy([h100_slice, att, col], predictors=FAKE)
    assert res.skipped["unsupported_family_rows"] == {"attention": 11, "collective": 7}
    base = run_accuracy([h100_slice], predictors=FAKE)
    _assert_same_metrics(res.overall, base.overall)


def test_family_detection_by_columns():
    assert detect_family(["m", "n", "k", "time_ms"]).name == "gemm"
    assert detect_family(["batch", "heads", "seq_len", "head_dim"]).name == "attention"
    assert detect_family(["collective", "bytes", "time_ms_median"]).name == "collective"
    with pytest.raises(InputError, match="kernel family"):
        detect_family(["foo", "bar"], "x.parquet")


# ----------------------------------------------------------------------
# GPU mapping, selection
# ----------------------------------------------------------------------
@needs_data
def test_gpu_from_file_prefix_and_hw_override(h100_slice, tmp_path):
    no_gpu = _frame_with(h100_slice, tmp_path, "h100_nogpu.parquet", lambda d: d.drop("gpu"))
    res = run_accuracy([no_gpu], predictors=FAKE)
    assert set(res.scored["gpu"]) == {"h100_sxm"}
    anon = _frame_with(h100_slice, tmp_path, "measured.parquet", lambda d: d.drop("gpu"))
    with pytest.raises(InputError, match="--hw"):
        run_accuracy([anon], predictors=FAKE)
    res = run_accuracy([anon], hw="h100", predictors=FAKE)
    _assert_same_metrics(res.overall, run_accuracy([h100_slice], predictors=FAKE).overall)
    with pytest.raises(InputError, match="--hw.*'v100'"):
        run_accuracy([anon], hw="v100", predictors=FAKE)


@needs_data
def test_hw_override_cannot_cover_two_gpus(h100_slice, tmp_path):
    mixed = _frame_with(h100_slice, tmp_path, "mixed.parquet",
                        lambda d: d.with_columns(gpu=pl.when(pl.col("m") == 8).then(pl.lit("a100")).otherwise(pl.col("gpu"))))
    with pytest.raises(InputError, match="several GPUs"):
        run_accuracy([mixed], hw="h100", predictors=FAKE)


@needs_data
def test_limit_and_sample_problems(h100_slice):
    full = run_accuracy([h100_slice], predictors=FAKE)
    assert full.overall["problems"] == 7  # 1 + 4 layouts + 1 + 1
    lim = run_accuracy([h100_slice], predictors=FAKE, limit_problems=2)
    assert lim.overall["problems"] == 2
    assert set(lim.scored["m"]) == {8, 32}  # first problems in sorted order
    a = run_accuracy([h100_slice], predictors=FAKE, sample_problems=3, seed=1)
    b = run_accuracy([h100_slice], predictors=FAKE, sample_problems=3, seed=1)
    _assert_same_metrics(a.overall, b.overall)
    assert a.overall["problems"] == 3
    with pytest.raises(InputError, match="--limit-problems"):
        run_accuracy([h100_slice], predictors=FAKE, limit_problems=0)


@needs_data
def test_library_only_gemm_file_defaults():
    path = DATA / "gemm" / "a100_llmcompass_matmul.parquet"

    def pred(frame, hw):
        assert hw == "a100"
        assert set(frame["backend"]) == {"cublas"} and frame["block_m"].is_null().all()
        assert frame["a_row_major"].all() and frame["b_row_major"].all()
        return frame.with_columns(latency_us=pl.lit(100.0), feasible=pl.lit(True))

    res = run_accuracy([path], predictors={"gemm": pred})
    assert res.overall["rows"] == res.overall["problems"] == 20


# ----------------------------------------------------------------------
# bad input
# ----------------------------------------------------------------------
def test_missing_file_names_the_file(tmp_path):
    missing = tmp_path / "nope_h100.parquet"
    with pytest.raises(InputError, match="nope_h100.parquet"):
        run_accuracy([missing], predictors=FAKE)


def test_not_parquet_names_the_file(tmp_path):
    bad = tmp_path / "h100_bad.parquet"
    bad.write_text("not parquet")
    with pytest.raises(InputError, match="h100_bad.parquet.*Parquet"):
        run_accuracy([bad], predictors=FAKE)


@needs_data
def test_missing_time_column_is_named(h100_slice, tmp_path):
    p = _frame_with(h100_slice, tmp_path, "h100_notime.parquet", lambda d: d.drop("time_ms"))
    with pytest.raises(InputError, match="'time_ms'") as exc:
        run_accuracy([p], predictors=FAKE)
    assert "h100_notime.parquet" in str(exc.value)


@needs_data
def test_missing_config_column_is_named(h100_slice, tmp_path):
    p = _frame_with(h100_slice, tmp_path, "h100_nok.parquet", lambda d: d.drop("block_k"))
    with pytest.raises(InputError, match="'block_k'"):
        run_accuracy([p], predictors=FAKE)


@needs_data
def test_unknown_gpu_is_named(h100_slice, tmp_path):
    p = _frame_with(h100_slice, tmp_path, "v100_x.parquet", lambda d: d.with_columns(gpu=pl.lit("v100")))
    with pytest.raises(InputError, match="'v100'") as exc:
        run_accuracy([p], predictors=FAKE)
    assert "'gpu'" in str(exc.value) and "v100_x.parquet" in str(exc.value)


@needs_data
def test_wrong_column_type_is_named(h100_slice, tmp_path):
    p = _frame_with(h100_slice, tmp_path, "h100_str.parquet", lambda d: d.with_columns(pl.col("m").cast(pl.String)))
    with pytest.raises(InputError, match="column 'm'"):
        run_accuracy([p], predictors=FAKE)


@needs_data
def test_predictor_returning_wrong_height_is_an_error(h100_slice):
    with pytest.raises(RuntimeError, match="rows"):
        run_accuracy([h100_slice], predictors={"gemm": lambda f, hw: f.head(1).with_columns(latency_us=pl.lit(1.0))})


# ----------------------------------------------------------------------
# thresholds and the command line
# ----------------------------------------------------------------------
def test_threshold_parsing():
    t = parse_threshold("mape_pct=15", above=True)
    assert (t.metric, t.value, t.above, t.selector) == ("mape_pct", 15.0, True, ())
    t = parse_threshold("spearman[gpu=h100, backend=triton]=0.85", above=False)
    assert t.selector == (("gpu", "h100_sxm"), ("backend", "triton"))
    t = parse_threshold("mape_pct[gpu=h100|a100,dtype=float16 | bfloat16]=15", above=True)
    assert t.selector == (("gpu", "h100_sxm|a100"), ("dtype", "float16|bfloat16"))
    for bad, what in [("mape=3", "unknown metric"), ("mape_pct", "METRIC=VALUE"),
                      ("mape_pct=abc", "not a number"), ("mape_pct[color=red]=1", "selector key"),
                      ("mape_pct[gpu=v100]=1", "v100"), ("mape_pct[gpu=h100|v100]=1", "v100"),
                      ("mape_pct[dtype=float16|]=1", "empty value")]:
        with pytest.raises(InputError, match=what):
            parse_threshold(bad, above=True)


@needs_data
def test_thresholds_report_which_one_broke(slice_result):
    mape = slice_result.overall["mape_pct"]
    assert check_thresholds(slice_result, [parse_threshold(f"mape_pct={mape * 1.01}", above=True)]) == []
    broken = check_thresholds(slice_result, [parse_threshold(f"mape_pct={mape * 0.99}", above=True)])
    assert len(broken) == 1 and "mape_pct" in broken[0] and "overall" in broken[0]
    # per dtype, Triton only: one check per dtype
    per = check_thresholds(slice_result, [parse_threshold("spearman[dtype=*,backend=triton]=1.01", above=False)])
    n_dtypes = slice_result.groups.filter(pl.col("backend") == "triton")["dtype"].n_unique()
    assert len(per) == n_dtypes and all("backend=triton" in b for b in per)
    # cuBLAS rows have nothing to rank: an undefined metric breaks its threshold
    und = check_thresholds(slice_result, [parse_threshold("spearman[backend=cublas]=0", above=False)])
    assert len(und) == 1 and "undefined" in und[0]
    # a|b pools the listed values: the check sees exactly those rows' metric
    fp = slice_result.scored.filter(pl.col("dtype").is_in(["float16", "bfloat16"]),
                                    pl.col("backend") == "triton")
    pooled = accuracy_metrics(fp)["mape_pct"][0]
    sel = "[dtype=float16|bfloat16,backend=triton]"
    assert check_thresholds(slice_result, [parse_threshold(f"mape_pct{sel}={pooled * 1.001}", above=True)]) == []
    assert len(check_thresholds(slice_result, [parse_threshold(f"mape_pct{sel}={pooled * 0.999}", above=True)])) == 1
    none = check_thresholds(slice_result, [parse_threshold("mape_pct[backend=rocblas]=1", above=True)])
    assert len(none) == 1 and "no measured rows" in none[0]


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tsbatch")
    add_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


@needs_data
def test_cli_writes_json_and_report_and_exits_on_thresholds(h100_slice, tmp_path, capsys):
    out = tmp_path / "r.json"
    rep = tmp_path / "report"
    args = _parse(["accuracy", str(h100_slice), "--json", str(out), "--report", str(rep),
                   "--fail-below", "top5_retention_pct=0"])
    assert args.func is run
    assert run(args, predictors=FAKE) == 0
    doc = json.loads(out.read_text())
    assert doc["overall"]["rows"] > 0
    assert (rep / "README.md").exists() and (rep / "ape_hist.png").exists()
    pngs = sorted(p.name for p in rep.glob("parity_*.png"))
    assert len(pngs) == len(doc["groups"])
    assert "| gpu |" in (rep / "README.md").read_text()
    capsys.readouterr()

    args = _parse(["accuracy", str(h100_slice), "--fail-above", "mape_pct=0.001", "--fail-below", "spearman=-1"])
    assert run(args, predictors=FAKE) == 1
    err = capsys.readouterr().err
    assert "threshold broken" in err and "mape_pct" in err and "spearman" not in err


def test_cli_bad_threshold_is_input_error_before_reading(tmp_path):
    args = _parse(["accuracy", str(tmp_path / "missing.parquet"), "--fail-above", "bogus=1"])
    with pytest.raises(InputError, match="bogus"):
        run(args, predictors=FAKE)


@needs_data
def test_only_unsupported_families_give_an_empty_report(tmp_path):
    att = _frame_with(ATTENTION, tmp_path, "a100_att.parquet", lambda d: d.head(5))
    res = run_accuracy([att], predictors=FAKE)
    assert res.overall["rows"] == 0 and res.overall["mape_pct"] is None
    assert res.groups.height == 0
    res.write_json(tmp_path / "r.json")
    assert json.loads((tmp_path / "r.json").read_text())["skipped"]["unsupported_family_rows"] == {"attention": 5}


def test_tf32_label_audit_counts_against_the_fp32_peak():
    from tsbatch.measured.accuracy import tf32_label_audit

    n = 4096  # 2 n^3 = 1.37e11 FLOPs: audited
    flops = 2.0 * n ** 3
    rows = {
        "gpu": ["a100"] * 5, "dtype": ["tf32"] * 4 + ["float16"], "tf32": [True] * 4 + [False],
        "m": [n, n, n, 64, n], "n": [n, n, n, 64, n], "k": [n, n + 8, n + 8, 64, n],
        "a_row_major": [True] * 5, "b_row_major": [True] * 5,
        # problem 1: best 40 TFLOPS (> 19.5 peak); problem 2: best 15 TFLOPS over two configs;
        # a tiny problem (not audited) and a float16 row (not TF32) that must be ignored
        "measured_us": [flops / 40e6, 2.0 * n * n * (n + 8) / 15e6, 2.0 * n * n * (n + 8) / 9e6, 1.0, 1.0],
    }
    audit = tf32_label_audit(pl.DataFrame(rows))["tf32_label_audit"]["a100"]
    assert audit["problems_audited"] == 2
    assert audit["fp32_cuda_core_peak_tflops"] == 19.5
    assert (audit["tf32_proven"], audit["looks_ieee_fp32"]) == (1, 1)
    assert abs(audit["median_best_over_fp32_peak"] - (40 / 19.5 + 15 / 19.5) / 2) < 1e-9


def test_the_triton_release_of_a_measured_gemm_file(tmp_path):
    """A file's own column wins; else its tsbatch measure metadata; else
    --triton-version; else 3.1 for the AutoHeuristic rows and the family's
    default for the others. What the predictor is handed says which."""
    import pyarrow.parquet as pq

    from kernels_catalog.gemm import TRITON_VERSION_DEFAULT
    from tsbatch.measured.accuracy import AUTOHEURISTIC_TRITON_VERSION

    row = dict(gpu="h100", m=512, n=512, k=512, dtype="float32", tf32=True, backend="triton",
               block_m=64, block_n=64, block_k=32, num_stages=3, num_warps=4, group_m=8,
               time_ms=0.05)
    seen = []

    def pred(frame, hw):
        seen.append(sorted(set(frame["triton_version"].to_list())))
        return frame.with_columns(latency_us=pl.lit(50.0), feasible=pl.lit(True))

    def run_one(frame, meta=None, **kw):
        path = tmp_path / "h100_gemm.parquet"
        table = frame.to_arrow()
        if meta:
            table = table.replace_schema_metadata(meta)
        pq.write_table(table, path)
        seen.clear()
        run_accuracy([path], predictors={"gemm": pred}, **kw)
        return seen[0]

    plain = pl.DataFrame([row, dict(row, m=1024)])
    ah = plain.with_columns(source=pl.lit("autoheuristic/h100_mm"))
    assert run_one(plain) == [TRITON_VERSION_DEFAULT]
    assert run_one(ah) == [AUTOHEURISTIC_TRITON_VERSION]
    assert run_one(ah, triton_version="3.4") == ["3.4"]
    assert run_one(ah, {b"tsbatch.triton_version": b"3.6.0"}, triton_version="3.4") == ["3.6.0"]
    assert run_one(plain.with_columns(triton_version=pl.lit("3.2")), triton_version="3.4") == ["3.2"]
    with pytest.raises(InputError, match="--triton-version"):
        run_one(plain, triton_version="latest")
