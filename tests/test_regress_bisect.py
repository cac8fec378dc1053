"""bench/regress_bisect.py: which commit moved a figure the guard marks worse.

The step rule is checked by hand; one end-to-end run traces a figure through
two commits of a tiny repository made in the test, whose ``tsbatch`` predicts
a fixed formula that the second commit changes, and finds the move at that
commit with the first commit's figure equal to a hand computation.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import polars as pl
import pytest

from tsbatch.measured.regress_metrics import Tolerance

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(os.environ.get("TSBATCH_SHARED_DATA", ROOT.parent / "shared" / "data"))
sys.path.insert(0, str(ROOT / "bench"))

from regress_bisect import steps  # noqa: E402
from test_regress import tiny_h100_fp16  # noqa: E402


def test_steps_by_hand():
    tol = Tolerance()  # bias 0.02, Spearman 0.005: a step counts from half of it
    got = steps([1.00, 1.005, 1.05, 1.02, None, 0.9], ["a", "b", "c", "d", "e", "f"], "bias", tol)
    # a->b moved |bias-1| by 0.005 (< 0.01): no step; b->c +0.045 worse; c->d -0.03 better;
    # d->e and e->f have a missing side
    assert [(s["ref"], s["worse"]) for s in got] == [("c", True), ("d", False)]
    assert got[0]["before"] == 1.005 and got[0]["after"] == 1.05
    # a bias crossing 1 is judged by its distance from 1: 0.99 -> 1.01 is no move
    assert steps([0.99, 1.01], ["a", "b"], "bias", tol) == []
    # higher-is-better figures: Spearman down is worse, up is better
    sp = steps([0.90, 0.80, 0.90, 0.898], ["a", "b", "c", "d"], "spearman", tol)
    assert [(s["ref"], s["worse"]) for s in sp] == [("b", True), ("c", False)]
    # MAPE up is worse; exactly half a tolerance counts
    assert steps([10.0, 10.15], ["a", "b"], "mape_pct", tol) == [
        {"ref": "b", "before": 10.0, "after": 10.15, "worse": True}]


FAKE = '''
import polars as pl

def _gemm(frame, hw):
    lat = pl.col("m").cast(pl.Float64) * pl.col("n") * pl.col("k") / 1e6 + {c}
    return frame.select(latency_us=lat, feasible=pl.lit(True))

PREDICTORS = {{"gemm": _gemm}}
'''


def _commit(repo: Path, c: float, msg: str) -> str:
    (repo / "tsbatch" / "accuracy.py").write_text(textwrap.dedent(FAKE.format(c=c)))
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@t")
    for cmd in (["add", "."], ["commit", "-q", "--allow-empty", "-m", msg]):
        subprocess.run(["git", *cmd], cwd=repo, check=True, env=env, capture_output=True)
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.mark.skipif(not (DATA / "gemm" / "h100_triton_mm.parquet").exists(), reason=f"no shared data at {DATA}")
def test_bisect_finds_the_commit_that_moved_a_figure(tmp_path):
    repo = tmp_path / "fake"
    (repo / "tsbatch").mkdir(parents=True)
    (repo / "tsbatch" / "__init__.py").write_text("")
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    c1 = _commit(repo, 5.0, "formula + 5 us")
    c2 = _commit(repo, 5.0, "no change")
    c3 = _commit(repo, 50.0, "formula + 50 us")
    gemm = tiny_h100_fp16(tmp_path)
    tiny = pl.read_parquet(gemm)
    fig = {"file": str(gemm), "gpu": "h100_sxm", "dtype": "float16", "backend": "triton",
           "slice_kind": "all", "slice": "all", "figure": "mape_pct", "verdict": "worse"}
    guard = tmp_path / "guard.json"
    guard.write_text(json.dumps({"tolerance": Tolerance().__dict__, "accuracy": [fig]}))
    out = tmp_path / "steps.json"
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "regress_bisect.py"), str(guard), c1, c2, c3,
                        "--repo", str(repo), "--files", str(gemm), "--workdir", str(tmp_path / "work"),
                        "--json", str(out)],
                       capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 0, r.stderr
    (traced,) = json.loads(out.read_text())
    # the first commit's MAPE is the formula's, by hand from the raw rows
    cfg = ["m", "n", "k", "dtype", "a_row_major", "b_row_major", "backend", "block_m", "block_n",
           "block_k", "num_stages", "num_warps", "group_m"]
    med = (tiny.filter(pl.col("time_ms").is_finite() & (pl.col("time_ms") > 0) & (pl.col("backend") == "triton"))
           .group_by(cfg).agg(pl.col("time_ms").median() * 1000.0)).rows(named=True)
    hand = 100 * sum(abs(x["m"] * x["n"] * x["k"] / 1e6 + 5.0 - x["time_ms"]) / x["time_ms"] for x in med) / len(med)
    assert traced["values"][c1] == pytest.approx(hand, rel=1e-9)
    assert traced["values"][c2] == traced["values"][c1]
    # the move is at the third commit, and nowhere else
    assert [s["ref"] for s in traced["steps"]] == [c3]
    assert traced["steps"][0]["worse"] == (traced["values"][c3] > traced["values"][c1])
    assert "moved at: " + c3 in r.stdout
    # a second run predicts nothing again: the figures are cached per commit
    assert len(list((tmp_path / "work" / "bisect").glob("*.parquet"))) == 3


def test_unknown_ref_is_one_clear_error(tmp_path):
    guard = tmp_path / "guard.json"
    guard.write_text(json.dumps({"accuracy": [{"file": "f", "gpu": "g", "dtype": "d", "backend": "b",
                                               "slice_kind": "all", "slice": "all", "figure": "bias",
                                               "verdict": "worse"}]}))
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "regress_bisect.py"), str(guard), "no-such-ref-36",
                        "--workdir", str(tmp_path)],
                       capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [f"regress_bisect.py: REF 'no-such-ref-36': not a commit of {ROOT}"]
