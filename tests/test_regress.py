"""The regression guard (issue 35): tsbatch.measured.regress_metrics and bench/regress.py.

The comparison, bucketing and marking logic is checked on small synthetic
tables against hand computations (plain Python loops). One test runs the
whole reference-install path of bench/regress.py on a tiny reference (a git
repository made in the test, whose ``tsbatch`` predicts a fixed formula) and
a few measured problems; it needs the working tree's GEMM kernels compiled
(numba, a minute or two on a fresh checkout, seconds once cached).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

import polars as pl
import pytest

from tsbatch.measured.metrics import accuracy_metrics
from tsbatch.measured.regress_metrics import (
    BUCKETS,
    FIGURES,
    Tolerance,
    accuracy_figures,
    add_slices,
    compare_figures,
    format_comparison,
    judge,
    judge_speed,
    judged_rows,
    summary_lines,
)

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(os.environ.get("TSBATCH_SHARED_DATA", ROOT.parent / "shared" / "data"))
INF = float("inf")


def _scored(rows: list[tuple]) -> pl.DataFrame:
    """rows: (gpu, problem, unit, measured, predicted, feasible, a_row, b_row)."""
    cols = ["gpu", "_problem", "_unit", "measured_us", "predicted_us", "feasible", "a_row_major", "b_row_major"]
    return pl.DataFrame(rows, schema=cols, orient="row").with_columns(
        pl.lit("f.parquet").alias("file"), pl.lit("float16").alias("dtype"), pl.lit("triton").alias("backend"))


# problem 0: best 15 us (bucket <20us) although two of its configs take longer;
# problem 1: best exactly 20 us (20-100us); problem 2: best 100 us (0.1-1ms);
# problem 3: best 1000 us (>1ms); problem 4: another <20us problem, B column-major.
ROWS = [
    ("h100", 0, 0, 15.0, 12.0, True, True, True),
    ("h100", 0, 0, 30.0, 33.0, True, True, True),
    ("h100", 0, 0, 45.0, INF, False, True, True),
    ("h100", 0, 0, 25.0, 20.0, True, True, True),
    ("h100", 0, 0, 60.0, 50.0, True, True, True),
    ("h100", 1, 1, 20.0, 22.0, True, True, True),
    ("h100", 1, 1, 40.0, 38.0, True, True, True),
    ("h100", 2, 2, 100.0, 90.0, True, True, True),
    ("h100", 2, 2, 150.0, 160.0, True, True, True),
    ("h100", 3, 3, 1000.0, 1100.0, True, True, True),
    ("h100", 4, 4, 10.0, 8.0, True, True, False),
    ("h100", 4, 4, 12.0, 12.0, True, True, False),
]


def test_buckets_follow_the_problems_best_time_and_boundaries():
    s = add_slices(_scored(ROWS))
    by_problem = {p: set(s.filter(pl.col("_problem") == p)["bucket"].to_list()) for p in range(5)}
    assert by_problem == {0: {"<20us"}, 1: {"20-100us"}, 2: {"0.1-1ms"}, 3: {">1ms"}, 4: {"<20us"}}
    assert [b[0] for b in BUCKETS] == ["<20us", "20-100us", "0.1-1ms", ">1ms"]
    assert set(s["layout"].to_list()) == {"A:row B:row", "A:row B:col"}
    no_layout = add_slices(_scored(ROWS).drop("a_row_major", "b_row_major"))
    assert no_layout["layout"].null_count() == no_layout.height


def _hand(rows, keep) -> dict:
    """MAPE and median measured/predicted of the rows ``keep`` selects, by hand."""
    ok = [r for r in rows if keep(r) and r[5] and math.isfinite(r[4])]
    return {"mape_pct": 100 * sum(abs(r[4] - r[3]) / r[3] for r in ok) / len(ok),
            "bias": statistics.median(r[3] / r[4] for r in ok),
            "rows": sum(1 for r in rows if keep(r)),
            "problems": len({r[1] for r in rows if keep(r)})}


def test_figures_per_slice_match_hand_computation():
    figs = accuracy_figures(add_slices(_scored(ROWS)), ["file", "gpu", "dtype", "backend"])
    best = {p: min(r[3] for r in ROWS if r[1] == p) for p in range(5)}
    slices = {
        ("all", "all"): lambda r: True,
        ("bucket", "<20us"): lambda r: best[r[1]] < 20,
        ("bucket", "20-100us"): lambda r: 20 <= best[r[1]] < 100,
        ("bucket", "0.1-1ms"): lambda r: 100 <= best[r[1]] < 1000,
        ("bucket", ">1ms"): lambda r: best[r[1]] >= 1000,
        ("layout", "A:row B:row"): lambda r: r[7],
        ("layout", "A:row B:col"): lambda r: not r[7],
    }
    assert figs.height == len(slices)
    for (kind, sl), keep in slices.items():
        got = figs.filter((pl.col("slice_kind") == kind) & (pl.col("slice") == sl)).row(0, named=True)
        want = _hand(ROWS, keep)
        for k in ("rows", "problems"):
            assert got[k] == want[k], (kind, sl, k)
        for k in ("mape_pct", "bias"):
            assert got[k] == pytest.approx(want[k], rel=1e-12), (kind, sl, k)
    # the ranking figures are tsbatch.measured.metrics' own, on the slice's rows
    sub = add_slices(_scored(ROWS)).filter(pl.col("bucket") == "<20us")
    want = accuracy_metrics(sub, ()).row(0, named=True)
    got = figs.filter(pl.col("slice") == "<20us").row(0, named=True)
    assert got["spearman"] == pytest.approx(want["spearman"])
    assert got["top5_retention_pct"] == pytest.approx(want["top5_retention_pct"])
    # problem 0's five configurations: Spearman over its 4 feasible ones is undefined
    # below 5 (SPEARMAN_MIN_CONFIGS), so the <20us slice has none
    assert got["spearman"] is None
    # retention: problem 0 keeps its predicted-fastest (12 us pred -> measured 15 = best): 100;
    # problem 4 keeps pred 8 -> measured 10 = best: 100
    assert got["top5_retention_pct"] == pytest.approx(100.0)


def test_judge_directions_and_tolerances():
    tol = Tolerance()
    assert judge("mape_pct", 10.0, 10.29, tol) == "same"
    assert judge("mape_pct", 10.0, 10.31, tol) == "worse"
    assert judge("mape_pct", 10.0, 9.69, tol) == "better"
    assert judge("spearman", 0.90, 0.894, tol) == "worse"
    assert judge("spearman", 0.90, 0.896, tol) == "same"
    assert judge("spearman", 0.90, 0.91, tol) == "better"
    assert judge("top5_retention_pct", 99.0, 98.6, tol) == "worse"
    assert judge("top5_retention_pct", 99.0, 99.4, tol) == "better"
    # bias is judged by its distance from 1: 0.97 -> 1.03 is no worse, 1.00 -> 1.05 is
    assert judge("bias", 0.97, 1.03, tol) == "same"
    assert judge("bias", 1.00, 1.05, tol) == "worse"
    assert judge("bias", 1.12, 1.03, tol) == "better"
    assert judge("bias", 0.90, 1.12, tol) == "same"  # |-0.10| -> |0.12|: 0.02, not beyond
    assert judge("bias", 0.90, 1.13, tol) == "worse"
    # missing sides and thin slices
    assert judge("mape_pct", None, 10.0, tol) == "n/a"
    assert judge("spearman", 0.9, float("nan"), tol) == "n/a"
    assert judge("mape_pct", 10.0, 20.0, tol, problems=2) == "small"
    assert judge("mape_pct", 10.0, 20.0, Tolerance(min_problems=2), problems=2) == "worse"
    assert judge("mape_pct", 10.0, 10.5, Tolerance(mape_pct=1.0)) == "same"


def test_judge_speed():
    tol = Tolerance()
    assert judge_speed(0.94, tol) == "worse"
    assert judge_speed(0.96, tol) == "same"
    assert judge_speed(1.06, tol) == "better"
    assert judge_speed(None, tol) == "n/a"
    assert judge_speed(0.5, Tolerance(speed_ratio=0.4)) == "same"


def _two_versions():
    group = ["file", "gpu", "dtype", "backend"]
    ref = accuracy_figures(add_slices(_scored(ROWS)), group)
    # the new version predicts the <20us problems 30 % too fast, everything else the same
    new_rows = [r[:4] + ((r[4] / 1.3 if r[1] in (0, 4) else r[4]),) + r[5:] for r in ROWS]
    new = accuracy_figures(add_slices(_scored(new_rows)), group)
    return group, ref, new


def test_compare_marks_what_got_worse():
    group, ref, new = _two_versions()
    cmp = compare_figures(ref, new, group)
    assert cmp.height == ref.height
    tol = Tolerance(min_problems=1)
    judged = judged_rows(cmp, group, tol)
    v = {(j["slice"], j["figure"]): j["verdict"] for j in judged}
    assert v[("<20us", "mape_pct")] == "worse"
    assert v[("<20us", "bias")] == "worse"
    assert v[("20-100us", "mape_pct")] == "same"
    assert v[(">1ms", "bias")] == "same"
    # ranking within a problem is unchanged by a uniform factor
    assert v[("<20us", "top5_retention_pct")] == "same"
    text = format_comparison(cmp, group, tol)
    line = next(ln for ln in text.splitlines() if "<20us" in ln)
    assert line.count("!!") == 2
    assert "!!" not in next(ln for ln in text.splitlines() if ">1ms" in ln)
    # the summary names the worst first and says REGRESSED
    lines = summary_lines(judged, [{"name": "full model", "ratio": 1.0, "verdict": "same"}], group,
                          "ref", "new", tol)
    assert "REGRESSED" in lines[-1]
    worst = lines[lines.index(next(ln for ln in lines if ln.startswith("worst"))) + 1]
    ex = sorted((j for j in judged if j["verdict"] == "worse"), key=lambda j: -j["excess"])[0]
    assert FIGURES[ex["figure"]][1] in worst and ex["slice"] in worst
    n_worse = sum(j["verdict"] == "worse" for j in judged)
    assert lines[0].split(": accuracy figures ")[1].startswith(f"{n_worse} worse")


def test_identical_versions_and_missing_reference():
    group, ref, _ = _two_versions()
    tol = Tolerance(min_problems=1)
    same = judged_rows(compare_figures(ref, ref, group), group, tol)
    assert {j["verdict"] for j in same} <= {"same", "n/a"}
    assert any(j["verdict"] == "same" for j in same)
    assert "no regression" in summary_lines(same, [], group, "a", "b", tol)[-1]
    # no reference at all (the older version cannot predict the family): every figure n/a
    none = judged_rows(compare_figures(None, ref, group), group, tol)
    assert {j["verdict"] for j in none} == {"n/a"}
    # a slice only the reference has stays in the table, n/a
    cmp = compare_figures(ref, ref.filter(pl.col("slice") != ">1ms"), group)
    row = cmp.filter(pl.col("slice") == ">1ms").row(0, named=True)
    assert row["new_mape_pct"] is None and row["ref_mape_pct"] is not None
    # a speed figure alone can fail the run
    lines = summary_lines(same, [{"name": "full model", "ratio": 0.2, "verdict": "worse"}], group,
                          "a", "b", tol)
    assert "REGRESSED" in lines[-1] and "0.20 !!" in "\n".join(lines)


# ----------------------------------------------------------------------
# the reference-install path, end to end, on a tiny reference
# ----------------------------------------------------------------------
FAKE_ACCURACY = '''
import polars as pl

def _gemm(frame, hw):
    # a fixed formula: 1 us per 1e6 multiply-adds plus 5 us; fp32 rows infeasible
    lat = (pl.col("m").cast(pl.Float64) * pl.col("n") * pl.col("k") / 1e6 + 5.0)
    out = frame.select(latency_us=lat, feasible=pl.col("dtype") != "float32")
    return out

PREDICTORS = {"gemm": _gemm}
'''


def _make_fake_repo(path: Path) -> None:
    (path / "tsbatch").mkdir(parents=True)
    (path / "tsbatch" / "__init__.py").write_text("")
    (path / "tsbatch" / "accuracy.py").write_text(textwrap.dedent(FAKE_ACCURACY))
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@t")
    for cmd in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "fake reference"], ["tag", "fake"]):
        subprocess.run(["git", *cmd], cwd=path, check=True, env=env, capture_output=True)


def tiny_h100_fp16(tmp_path: Path, problems: int = 3) -> Path:
    """The rows of the first ``problems`` fp16 problems of the measured H100 GEMM
    file, written to ``tmp_path/h100_tiny.parquet`` (a small measured file for
    end-to-end runs of the guard and of its bisect)."""
    raw = pl.read_parquet(DATA / "gemm" / "h100_triton_mm.parquet")
    keys = ["m", "n", "k", "dtype", "a_row_major", "b_row_major"]
    probs = raw.select(keys).unique().sort(keys).filter(pl.col("dtype") == "float16").head(problems)
    gemm = tmp_path / "h100_tiny.parquet"
    raw.join(probs, on=keys, how="semi").write_parquet(gemm)
    return gemm


@pytest.mark.skipif(not (DATA / "gemm" / "h100_triton_mm.parquet").exists(), reason=f"no shared data at {DATA}")
def test_reference_install_path_end_to_end(tmp_path):
    repo = tmp_path / "fake"
    _make_fake_repo(repo)
    gemm = tiny_h100_fp16(tmp_path)
    tiny = pl.read_parquet(gemm)
    coll = tmp_path / "vidur_tiny.parquet"
    pl.read_parquet(DATA / "collectives" / "vidur_a100_dgx_all_reduce.parquet").head(40).write_parquet(coll)
    out = tmp_path / "r.json"
    cmd = [sys.executable, str(ROOT / "bench" / "regress.py"), "fake", "--repo", str(repo),
           "--skip-speed", "--files", str(gemm), str(coll), "--json", str(out),
           "--workdir", str(tmp_path / "work"), "--min-problems", "1"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode in (0, 1), r.stderr
    rep = json.loads(out.read_text())
    assert (tmp_path / "work" / "trees" / rep["ref_sha"] / "tsbatch" / "accuracy.py").exists()
    jobs = {j["family"]: j for j in rep["prediction_jobs"]["ref"]}
    assert jobs["gemm"]["status"] == "ok"
    assert jobs["collective"]["status"] == "unsupported"   # the fake has no collectives: n/a
    acc = rep["accuracy"]
    coll_figs = [j for j in acc if j["file"] == str(coll)]
    assert coll_figs and all(j["verdict"] == "n/a" and j["ref"] is None for j in coll_figs)
    assert any(j["new"] is not None for j in coll_figs)
    # the reference's MAPE is the fake formula's, computed here by hand from the raw rows
    cfg = ["m", "n", "k", "dtype", "a_row_major", "b_row_major", "backend", "block_m", "block_n",
           "block_k", "num_stages", "num_warps", "group_m"]
    med = (tiny.filter(pl.col("time_ms").is_finite() & (pl.col("time_ms") > 0))
           .group_by(cfg).agg(pl.col("time_ms").median() * 1000.0))
    for backend in ("triton", "cublas"):
        sub = med.filter(pl.col("backend") == backend).rows(named=True)
        apes = [abs(r["m"] * r["n"] * r["k"] / 1e6 + 5.0 - r["time_ms"]) / r["time_ms"] for r in sub]
        got = next(j for j in acc if j["file"] == str(gemm) and j["backend"] == backend
                   and j["slice"] == "all" and j["figure"] == "mape_pct")
        assert got["ref"] == pytest.approx(100 * sum(apes) / len(apes), rel=1e-9)
        assert got["new"] is not None
    # the exit status is 1 exactly when some figure is marked worse
    worse = any(j["verdict"] == "worse" for j in acc + rep["cross_validated"])
    assert r.returncode == (1 if worse else 0)
    assert "---- summary ----" in r.stdout


def test_unknown_ref_is_one_clear_error(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "regress.py"), "no-such-ref-35",
                        "--skip-speed", "--workdir", str(tmp_path)],
                       capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [f"regress.py: REF 'no-such-ref-35': not a commit of {ROOT}"]
    assert not (tmp_path / "trees").exists()


def test_the_summary_reports_the_small_kernel_buckets_on_their_own():
    """The < 20 us and 20-100 us buckets get their own count in the summary, and every
    one whose MAPE or bias moved is listed with both figures."""
    from tsbatch.measured.regress_metrics import small_kernel_lines

    group, ref, new = _two_versions()
    tol = Tolerance(min_problems=1)
    judged = judged_rows(compare_figures(ref, new, group), group, tol)
    lines = summary_lines(judged, [], group, "ref", "new", tol)
    block = small_kernel_lines(judged, group)
    assert block and all(b in lines for b in block)
    small = {(j["slice"], j["figure"]): j["verdict"] for j in judged
             if j["slice"] in ("<20us", "20-100us") and j["figure"] in ("mape_pct", "bias")}
    n_cells = len({s for s, _ in small})
    n_moved = len({s for (s, f), v in small.items() if v in ("worse", "better")})
    assert block[0].startswith("small kernels (<20us and 20-100us buckets")
    assert f"{n_cells} judged" in block[0] and len(block) == 1 + n_moved
    assert any("<20us" in b and "!!" in b for b in block[1:])   # the slowed bucket, listed
    # the same versions: nothing moved, nothing listed
    same = judged_rows(compare_figures(ref, ref, group), group, tol)
    quiet = small_kernel_lines(same, group)
    assert len(quiet) == 1 and quiet[0].endswith(f"0 worse, 0 better, {n_cells} within tolerance")
