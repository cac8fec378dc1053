"""The CLI fuzz's fast profile (issue 22): generated tables and arguments through
evaluate, sweep, explain and accuracy, in-process. No crash (an exception other
than SystemExit, an exit status other than 0 and 2, a traceback), no output left
behind on exit 2, every output row feasible with a finite latency or infeasible
with a reason. The on-demand profile: python bench/fuzz_cli.py --cases 100000."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, settings

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("fuzz_cli", ROOT / "bench" / "fuzz_cli.py")
fuzz = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fuzz)

TALLY = fuzz.Tally()


@settings(max_examples=300, deadline=None, database=None,
          phases=[Phase.explicit, Phase.generate, Phase.shrink],
          suppress_health_check=list(HealthCheck))
@given(fuzz.cases())
def test_cli_fuzz_fast_profile(case):
    res = fuzz.run_case(case)
    TALLY.add(case, res)
    assert not res["crash"], res["err"]
    assert not res["half"], res["err"]
    assert not res["breaks"], res["err"]


def test_fuzz_checks_can_fail():
    """The checks see what they look for: a row breaking the contract, a crash."""
    import polars as pl

    bad = pl.DataFrame({"feasible": [True, False, True], "latency_us": [1.0, None, None],
                        "infeasible_reason": ["", "", ""]})
    assert fuzz.contract_breaks(bad) == 2
    ok = pl.DataFrame({"feasible": [True, False], "latency_us": [3.5, None],
                       "infeasible_reason": ["", "triton: block_m must be a power of two"]})
    assert fuzz.contract_breaks(ok) == 0
    t = fuzz.Tally()
    assert t.add({"cmd": "evaluate"}, {"rc": None, "crash": True, "half": False, "breaks": 0,
                                       "err": "x"})
    assert t.counts["crashes"] == 1
