"""Shared test configuration: hypothesis profiles and the shared data path.

Profiles: ``ci`` (default; fast) and ``thorough`` (``HYPOTHESIS_PROFILE=thorough``).
Property tests always run; only their example counts differ.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("ci", max_examples=25, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("thorough", max_examples=500, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# Ray's usage statistics and metrics reporting off in every test and in the Ray
# processes the tests start (they inherit this environment): with them on, Ray
# Data polls a Prometheus server on localhost:9090 from a thread that outlives
# the session and prints "Logging error" tracebacks after pytest's summary
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
os.environ["RAY_enable_metrics_collection"] = "0"

ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = Path(os.environ.get("TSBATCH_SHARED_DATA", ROOT.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"measured data not found at {SHARED_DATA} (set TSBATCH_SHARED_DATA)")
    return SHARED_DATA
