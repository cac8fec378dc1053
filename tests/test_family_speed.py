"""bench/family_speed.py's tables (issue 35: per-family speed in the guard).

Correctness only, never wall time: the tables are distinct, reproducible and
cover every family with a built-in sweep; unknown families are one clear
error; the shifted rows keep the sweep's feasibility; the timing helpers
report a family a version cannot evaluate instead of failing; the guard's
summary line names the families slower than GEMM.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import polars as pl
import pytest

from tsbatch.engine.evaluate import evaluate
from tsbatch.engine.sweep import list_sweeps, load_sweep, sweep_dir
from tsbatch.errors import InputError

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import family_speed as fs  # noqa: E402
from regress import family_summary  # noqa: E402

ROWS = 3000  # more than most sweeps (the fused ones: 9 to 540 rows): those tables are shifted


@pytest.fixture(scope="module")
def sweeps():
    return fs.builtin_sweeps()


@pytest.fixture(scope="module")
def tables(sweeps):
    return {f: fs.family_table(f, ROWS, sweeps) for f in sweeps}


def _sweep_families() -> set[str]:
    """Every family a built-in sweep file names, read here without the bench's code."""
    out = set()
    for name in list_sweeps():
        doc = tomllib.loads((sweep_dir() / f"{name}.toml").read_text())
        out.add(load_sweep(name).family if "sweep" in doc else doc.get("family", "collective"))
    return out


def test_every_family_with_a_sweep_is_covered(sweeps, tables):
    fams = _sweep_families()
    assert set(sweeps) == fams
    assert set(fs.SHIFT) >= fams
    assert list(sweeps)[0] == "gemm"
    assert set(fs.family_tables(200)) == fams
    # the left-out list is exactly the registered families without a sweep
    from kernels_catalog.registry import FAMILIES

    assert set(fs.families_without_sweep(sweeps)) == set(FAMILIES) - fams


def test_tables_are_distinct_and_sized(sweeps, tables):
    for fam, t in tables.items():
        assert t.height == ROWS, fam
        assert t.unique().height == t.height, fam
        # the family's input columns only, as the sweep has them
        base = sweeps[fam][1]
        assert set(t.columns) <= set(base.columns), fam
        # the shifted columns moved and nothing else did
        shifted = [c for c, _ in fs.SHIFT[fam]]
        for c in t.columns:
            if c not in shifted:
                assert set(t[c].unique().to_list()) <= set(base[c].unique().to_list()), (fam, c)
        if base.height < ROWS:
            assert any(t[c].max() > base[c].max() for c in shifted), fam
        else:  # evenly spaced rows of the sweep itself
            assert t.join(base.select(t.columns), on=t.columns, how="anti", nulls_equal=True).height == 0


def test_shift_keeps_sizes_divisible_as_the_sweep(sweeps, tables):
    for fam, t in tables.items():
        for col, step in fs.SHIFT[fam]:
            base = sweeps[fam][1][col]
            assert set((t[col] % step).to_list()) == set((base % step).to_list()), (fam, col)


def test_shifted_rows_as_feasible_as_the_sweep(sweeps, tables):
    """The steps of :data:`SHIFT` are there to keep rows feasible: a table of cheaply
    priced infeasible rows would flatter a family."""
    for fam, t in tables.items():
        base = evaluate(sweeps[fam][1], "h100", family=fam)["feasible"].mean()
        new = evaluate(t, "h100", family=fam)["feasible"].mean()
        assert abs(new - base) <= 0.05, (fam, base, new)


def test_reproducible(sweeps, tables):
    for fam in ("gemm", "rowwise", "moe_ep"):
        again = fs.family_table(fam, ROWS)
        assert again.equals(tables[fam])


def test_fewer_rows_than_the_sweep_are_evenly_spaced(sweeps):
    base = sweeps["gemm"][1]
    t = fs.family_table("gemm", 100, sweeps)
    assert t.height == 100 and t.unique().height == 100
    # every m and every shape of the sweep kept, not just its first workloads
    assert set(t["m"].to_list()) == set(base["m"].to_list())
    assert set(t["n"].to_list()) == set(base["n"].to_list())


def test_copies_that_collide_are_dropped_and_replaced():
    base = pl.DataFrame({"rows": [1, 2, 3], "x": [0, 0, 0]})
    out = fs._shifted(base, (("rows", 1),), 3)  # copies 1 and 2 repeat rows 2, 3
    assert out.height == out.unique().height == 5
    assert sorted(out["rows"].to_list()) == [1, 2, 3, 4, 5]


def test_two_columns_in_mixed_radix():
    base = pl.DataFrame({"a": [0], "b": [0]})
    out = fs._shifted(base, (("a", 10), ("b", 1)), 9)  # radix 3
    assert sorted(zip(out["a"].to_list(), out["b"].to_list())) == [
        (a, b) for a in (0, 10, 20) for b in (0, 1, 2)]


def test_unknown_family_is_one_clear_error(sweeps):
    with pytest.raises(InputError, match="unknown family 'nope'"):
        fs.family_table("nope", 10, sweeps)
    with pytest.raises(InputError, match="'ag_gemm' has no built-in sweep"):
        fs.family_table("ag_gemm", 10, sweeps)
    with pytest.raises(InputError, match="at least 1"):
        fs.family_table("gemm", 0, sweeps)


def test_cli_errors_name_what_is_wrong(capsys):
    assert fs.main(["--families", "gemm,nope", "--rows", "10", "-q"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nope" in err[0]
    assert fs.main(["--hw", "h100,zz9", "--rows", "10", "-q"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "zz9" in err[0]


def test_timing_reports_a_family_it_cannot_evaluate():
    tabs = {"gemm": pl.DataFrame({"m": [1, 2]}), "other": pl.DataFrame({"m": [1]})}

    def fake(frame, hw, family="gemm"):
        if family != "gemm":
            raise InputError(f"unknown kernel family '{family}'")
        return frame.with_columns(pl.lit(True).alias("feasible"))

    warm = fs.warm_up(fake, tabs, "h100")
    assert warm["gemm"]["status"] == "ok"
    assert warm["other"] == {"status": "error", "error": "InputError: unknown kernel family 'other'"}
    res = fs.time_round(fake, tabs, "h100", ["other", "gemm"])
    assert res["gemm"]["status"] == "ok" and res["gemm"]["rows"] == 2 and res["gemm"]["feasible"] == 2
    assert res["other"]["status"] == "error"
    assert len(res["gemm"]["passes"]) == 10  # quick: passes up to 1 s, at most 10
    assert fs.round_order(["a", "b", "c"], 0) == ["a", "b", "c"]
    assert fs.round_order(["a", "b", "c"], 1) == ["c", "b", "a"]


def test_guard_summary_line_names_families_slower_than_gemm():
    speed = [{"name": "full model", "ratio": 1.0},
             {"family": "gemm", "over_gemm": 1.0},
             {"family": "rowwise", "over_gemm": 0.05},
             {"family": "mla_decode", "over_gemm": 2.0},
             {"family": "attention", "over_gemm": 0.8},
             {"family": "ulysses", "over_gemm": None}]
    line = family_summary(speed)
    assert "2 of 3 below 1: rowwise 0.05, attention 0.80" in line
    assert "1 not measured" in line
    assert family_summary([{"name": "full model", "ratio": 1.0}]) is None


def test_guard_summary_line_per_gpu():
    """Families timed on two GPUs: each GPU's families against its own GEMM, in the
    order the GPUs were timed."""
    speed = [{"family": "gemm", "hw": "h100", "over_gemm": 1.0},
             {"family": "rowwise", "hw": "h100", "over_gemm": 1.5},
             {"family": "moe_grouped_gemm", "hw": "h100", "over_gemm": 0.47},
             {"family": "gemm", "hw": "a100", "over_gemm": 1.0},
             {"family": "rowwise", "hw": "a100", "over_gemm": 0.98},
             {"family": "moe_grouped_gemm", "hw": "a100", "over_gemm": 0.56},
             {"family": "ulysses", "hw": "a100", "over_gemm": None}]
    line = family_summary(speed)
    assert line.endswith("h100 1 of 2 below 1: moe_grouped_gemm 0.47; "
                         "a100 2 of 2 below 1: moe_grouped_gemm 0.56, rowwise 0.98; 1 not measured")


def test_guard_summary_leaves_mostly_infeasible_families_aside():
    """A family with under half its rows feasible on a GPU (attention_fa3 on A100: none)
    is named apart, not counted among the families compared with GEMM, whichever side
    of 1 its ratio falls."""
    speed = [{"family": "gemm", "hw": "a100", "over_gemm": 1.0, "feasible_share": 0.91},
             {"family": "attention_fa3", "hw": "a100", "over_gemm": 2.2, "feasible_share": 0.0},
             {"family": "mla_decode", "hw": "a100", "over_gemm": 0.7, "feasible_share": 0.49},
             {"family": "rowwise", "hw": "a100", "over_gemm": 0.98, "feasible_share": 1.0},
             {"family": "moe_grouped_gemm", "hw": "a100", "over_gemm": 0.56, "feasible_share": 0.5},
             {"family": "collective", "hw": "a100", "over_gemm": 2.5, "feasible_share": None}]
    line = family_summary(speed)
    assert line.endswith("a100 2 of 3 below 1: moe_grouped_gemm 0.56, rowwise 0.98; not compared "
                         "(mostly infeasible here): attention_fa3 0 % feasible, mla_decode 49 % feasible")
    assert fs.comparable(None, 10) and fs.comparable(5, 10) and not fs.comparable(4, 10)


def test_table_sets_mostly_infeasible_families_aside():
    """format_table: a family mostly infeasible on the GPU is listed apart, not counted."""
    def fam(over, feasible):
        return {"sweep": "s", "rows": 1000, "median_s": 0.1, "rows_per_s": 1e4, "cpu_median_s": 0.1,
                "cpu_rows_per_s": 1e4, "feasible": feasible, "over_gemm": over, "cpu_over_gemm": over}
    out = {"repeats": 1, "cpus": 2, "load_avg_1min_start": 1.0, "load_avg_1min_end": 1.0,
           "left_out": {}, "hw": {"a100": {"gemm": fam(1.0, 910), "attention_fa3": fam(0.5, 0),
                                           "rowwise": fam(0.9, 1000)}}}
    text = fs.format_table(out)
    assert "a100: 1 of 1 families slower than GEMM per row by wall time: rowwise" in text
    assert "this GPU, their time is the infeasibility check's): attention_fa3 0 %" in text


def test_stage_times_add_up_and_name_the_cache_problems(sweeps):
    """stage_times / format_stages: per tile family evaluate's stages (each at most the
    family's wall time), its cache problems, the cache model's us per problem and the
    ratios to GEMM; a family composing others (gemm_rs) has its total only."""
    tabs = {f: fs.family_table(f, 300, sweeps) for f in ("gemm", "rowwise", "gemm_rs")}
    st = fs.stage_times(evaluate, tabs, "h100", passes=1)
    for f in ("gemm", "rowwise"):
        r = st[f]
        assert all(r[k] is not None and 0 <= r[k] <= r["seconds"] for k in fs.STAGES)
        assert sum(r[k] for k in fs.STAGES) <= r["seconds"] * 1.05 + 1e-3
        assert r["cache_problems"] > 0 and r["cache_problems"] + r["cache_problems_reused"] <= 300
    assert st["gemm_rs"]["seconds"] > 0 and all(st["gemm_rs"][k] is None for k in fs.STAGES)
    text = fs.format_stages("h100", {f: t.height for f, t in tabs.items()}, st)
    lines = text.splitlines()
    assert "us/problem" in lines[2]
    row = {ln.split()[0]: ln.split() for ln in lines[3:]}
    assert row["gemm"][-2:] == ["1.00", "1.00"] and row["gemm_rs"][-1] == "n/a"
    assert float(row["rowwise"][-4]) == st["rowwise"]["cache_problems"]


def test_guard_worker_serves_family_timings(tmp_path, sweeps):
    """bench/regress_worker.py serve-families: ready line, one answer per request, a family
    the version lacks reported as an error (n/a in the guard), never a crash."""
    import json
    import os
    import subprocess

    gemm = tmp_path / "gemm.parquet"
    fs.family_table("gemm", 50, sweeps).write_parquet(gemm)
    nope = tmp_path / "nope.parquet"
    pl.DataFrame({"m": [1]}).write_parquet(nope)
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"hw": "h100", "tables": {"gemm": str(gemm), "nope": str(nope)},
                                "warmup_rows": 10}))
    env = dict(os.environ, PYTHONPATH=str(BENCH.parent))
    r = subprocess.run([sys.executable, str(BENCH / "regress_worker.py"), "serve-families", str(spec), "-"],
                       input='{"family": "gemm"}\n{"family": "nope"}\n', capture_output=True, text=True,
                       env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert len(lines) == 3
    assert lines[0]["ready"] and lines[0]["warm"]["gemm"]["status"] == "ok"
    assert lines[0]["warm"]["nope"]["status"] == "error" and "nope" in lines[0]["warm"]["nope"]["error"]
    assert lines[1]["status"] == "ok" and lines[1]["rows"] == 50 and lines[1]["seconds"] > 0
    assert lines[2]["status"] == "error"


def test_guard_worker_times_each_gpu_asked(tmp_path, sweeps):
    """serve-families with two GPUs: a request names the GPU (default the first); a GPU
    it was not warmed up on is an error, not a crash."""
    import json
    import os
    import subprocess

    gemm = tmp_path / "gemm.parquet"
    fs.family_table("gemm", 40, sweeps).write_parquet(gemm)
    spec = tmp_path / "spec.json"
    own = tmp_path / "gemm_a100.parquet"  # a GPU's own table (gpu_tables) replaces the shared one
    fs.family_table("gemm", 30, sweeps).write_parquet(own)
    spec.write_text(json.dumps({"hw": ["h100", "a100"], "tables": {"gemm": str(gemm)},
                                "gpu_tables": {"a100": {"gemm": str(own)}}, "warmup_rows": 10}))
    env = dict(os.environ, PYTHONPATH=str(BENCH.parent))
    reqs = ['{"family": "gemm", "hw": "a100"}', '{"family": "gemm"}', '{"family": "gemm", "hw": "h200"}']
    r = subprocess.run([sys.executable, str(BENCH / "regress_worker.py"), "serve-families", str(spec), "-"],
                       input="\n".join(reqs) + "\n", capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert len(lines) == 4 and lines[0]["warm"]["gemm"]["status"] == "ok"
    assert lines[1]["status"] == "ok" and lines[2]["status"] == "ok"
    assert lines[1]["rows"] == 30 and lines[2]["rows"] == 40
    assert lines[3]["status"] == "error" and "h200" in lines[3]["error"]


def test_table_gives_the_cpu_ratio_beside_the_wall_one():
    """format_table: a family slower than GEMM by wall time but not by CPU time
    (a moment's load on a shared machine) is named on the wall line only."""
    def fam(sweep, s, cpu, over, cover):
        return {"sweep": sweep, "rows": 1000, "median_s": s, "rows_per_s": 1000 / s,
                "cpu_median_s": cpu, "cpu_rows_per_s": 1000 / cpu, "feasible": 1000,
                "over_gemm": over, "cpu_over_gemm": cover}
    out = {"repeats": 1, "cpus": 2, "load_avg_1min_start": 1.0, "load_avg_1min_end": 1.0,
           "left_out": {}, "hw": {"h100": {"gemm": fam("llama3", 0.1, 0.2, 1.0, 1.0),
                                           "rowwise": fam("norms_llm", 0.2, 0.1, 0.5, 2.0)}}}
    text = fs.format_table(out)
    assert "h100: 1 of 1 families slower than GEMM per row by wall time: rowwise" in text
    assert "h100: 0 of 1 families slower than GEMM per row by CPU time" in text
    row = next(line for line in text.splitlines() if line.strip().startswith("rowwise"))
    assert row.split()[-1] == "2.000" and "<1" in row


def test_fused_families_run_on_each_gpus_system(sweeps, tables):
    """gpu_tables: a fused family's table for a GPU is its sweep moved to that GPU's system
    (the system column changes, and rows the system cannot run are left out: gemm_rs's
    NVLS rows on dgx_a100, whose NVSwitch does not reduce), as many rows as the shared
    table, all feasible as the sweep's are; the other families get no table of their own;
    a GPU no system has keeps the shared tables and says so."""
    from kernels_catalog.fused_comm import FAMILIES as FUSED

    fused = [f for f in tables if f in FUSED]
    assert {"gemm_rs", "moe_ep", "ulysses"} <= set(fused)
    for hw, system in (("a100", "dgx_a100"), ("h100", "dgx_h100")):
        assert fs.system_for_gpu(hw) == system
        own, systems = fs.gpu_tables(list(tables), hw, ROWS, sweeps)
        assert set(own) == set(fused) and systems == {f: system for f in fused}
        for f, t in own.items():
            assert t["system"].unique().to_list() == [system]
            assert t.height == tables[f].height and t.unique().height == t.height
            assert t.columns == tables[f].columns
            assert evaluate(t, hw, family=f)["feasible"].all(), (hw, f)
        algos = set(own["gemm_rs"]["algorithm"].unique())
        assert algos == ({"ring"} if hw == "a100" else {"ring", "nvls"})
    assert fs.system_for_gpu("a40") is None
    own, systems = fs.gpu_tables(list(tables), "a40", ROWS, sweeps)
    assert own == {} and all("no system with a40" in systems[f] for f in fused)


def test_a_system_that_runs_none_of_the_rows_keeps_the_sweeps(sweeps):
    """gpu_tables: a fused sweep none of whose rows the GPU's system can run (gemm_rs with
    only NVLS rows, on dgx_a100) keeps its shared table and says why."""
    name, frame = sweeps["gemm_rs"]
    nvls = {"gemm_rs": (name, frame.filter(pl.col("algorithm") == "nvls"))}
    own, systems = fs.gpu_tables(["gemm", "gemm_rs"], "a100", 100, nvls)
    assert own == {} and systems == {"gemm_rs": "its sweep's (dgx_a100 runs none of its rows)"}
    own, systems = fs.gpu_tables(["gemm_rs"], "h100", 100, nvls)
    assert own["gemm_rs"].height == 100 and systems == {"gemm_rs": "dgx_h100"}


# ---------------------------------------------------------------------------
# the guard's re-timing of a speed figure that reads worse (bench/regress.py)
# ---------------------------------------------------------------------------
def _figure(ref, new, higher_better=False, retime=None):
    from regress import set_runs  # noqa: PLC0415

    f = set_runs({"name": "x", "unit": "s", "higher_better": higher_better}, ref, new)
    if retime is not None:
        f["_retime"] = retime
    return f


def test_set_runs_medians_and_ratios():
    f = _figure([2.0, 4.0, 3.0], [4.0, 6.0, 5.0])  # seconds: ref 3, new 5
    assert (f["ref"], f["new"]) == (3.0, 5.0)
    assert f["ratio"] == pytest.approx(3.0 / 5.0)
    assert f["ratio_best"] == pytest.approx(2.0 / 4.0)
    g = _figure([100.0, 300.0], [150.0, 250.0], higher_better=True)  # rows/s: new over ref
    assert g["ratio"] == pytest.approx(200.0 / 200.0)
    assert g["ratio_best"] == pytest.approx(250.0 / 300.0)
    h = _figure("ref failed", [1.0])
    assert h["ratio"] is None and h["ref_runs"] == "ref failed"


def test_a_figure_that_reads_worse_is_retimed_and_judged_on_all_runs():
    from regress import confirm_figures  # noqa: PLC0415
    from tsbatch.measured.regress_metrics import Tolerance, judge_speed  # noqa: PLC0415

    tol = Tolerance()
    asked = []

    def retime(n):
        asked.append(n)
        return {"ref": [1.0] * n, "new": [1.0] * n}  # the same speed this time

    noisy = _figure([1.0, 1.0, 1.0], [1.2, 1.2, 1.2], retime=retime)  # 0.83: worse
    real = _figure([1.0, 1.0, 1.0], [1.2, 1.2, 1.2],
                   retime=lambda n: {"ref": [1.0] * n, "new": [1.25] * n})
    fine = _figure([1.0, 1.0], [1.0, 1.01], retime=lambda n: pytest.fail("a figure within tolerance re-timed"))
    off = _figure([1.0], [2.0], retime=lambda n: pytest.fail("re-timed with 0 rounds"))
    confirm_figures([noisy, real, fine], 4, tol, lambda msg: None)
    confirm_figures([off], 0, tol, lambda msg: None)
    assert asked == [4]
    # 3 slow runs and 4 equal ones: the median of the new side is 1.0, so the figure is not worse
    assert noisy["confirm"] == {"first": pytest.approx(1 / 1.2), "again": 1.0, "rounds": 4}
    assert len(noisy["new_runs"]) == 7 and judge_speed(noisy["ratio"], tol) == "same"
    assert "first 0.83, re-timed 1.00 over 4 more round(s)" in noisy["note"]
    # a slowdown that repeats stays worse
    assert judge_speed(real["ratio"], tol) == "worse"
    assert real["confirm"]["again"] == pytest.approx(0.8)
    assert "confirm" not in fine and "confirm" not in off
    assert judge_speed(off["ratio"], tol) == "worse"
    assert all("_retime" not in f for f in (noisy, real, fine, off))


def test_a_retiming_that_fails_keeps_the_first_runs():
    from regress import confirm_figures  # noqa: PLC0415
    from tsbatch.measured.regress_metrics import Tolerance  # noqa: PLC0415

    f = _figure([1.0, 1.0], [1.5, 1.5], retime=lambda n: {"ref": [1.0] * n, "new": "worker failed"})
    confirm_figures([f], 2, Tolerance(), lambda msg: None)
    assert f["new_runs"] == [1.5, 1.5] and f["ratio"] == pytest.approx(1 / 1.5)
    assert f["confirm"]["again"] is None and "re-timed n/a" in f["note"]
