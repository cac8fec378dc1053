#!/usr/bin/env bash
# Set everything up in .venv (non-editable install, so the packaged hw/ and
# sweeps/ data are what the tests see) and run the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q '.[test,ray]'
cd tests && ../.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
