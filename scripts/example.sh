#!/usr/bin/env bash
# Set everything up in .venv and run the main job on the built-in example sweep.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
# -qq: errors only (a machine's pip configuration may name package indexes that are
# missing, and pip warns of each one on every install)
.venv/bin/python -m pip install -qq --upgrade pip
.venv/bin/python -m pip install -qq .
.venv/bin/tsbatch sweep llama3 --hw h100 --top 5% -o ranked.parquet "$@"
