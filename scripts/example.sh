#!/usr/bin/env bash
# Set everything up in .venv and run the main job on the built-in example sweep.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q .
.venv/bin/tsbatch sweep llama3 --hw h100 --top 5% -o ranked.parquet "$@"
