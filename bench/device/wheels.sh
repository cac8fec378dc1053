#!/usr/bin/env bash
# Fetch, here, the wheels bench/device/measure.sh needs on a lent machine whose image
# lacks them (polars; numpy, pyarrow, numba, torch and triton are in it): the version
# of this environment's polars, for CPython 3.12 on x86-64 (the machines' python3).
#   bash bench/device/wheels.sh            # writes .whl/ (ignored by git here)
# Then every device call names .whl in `carry` and starts with:
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#     --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit;
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
py=${PYTHON:-.venv/bin/python}
ver=$("$py" -c "import polars; print(polars.__version__)")
for pkg in "polars==$ver" "polars-runtime-32==$ver"; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl "$pkg"
done
du -sh .whl
