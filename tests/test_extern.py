"""Separately linked kernels (tsbatch.kernels._extern): a jitted caller calls the
callee's machine code instead of linking its code, and a cached caller loads
its callee first.

Each check runs new processes sharing one fresh numba cache directory: the
first compiles and stores (and shows the caller's LLVM), the second loads the
caller first, before anything touched the callee in that process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent

CODE = """
import json
import numpy as np
import _extern_fixture as fx
x = np.linspace(-3.0, 5.0, 17)
v, n = fx.outer(x, 0.5)
try:
    fx.caller(x, -1.0)
    err = None
except ValueError as exc:
    err = str(exc)
hits = {k: sum(getattr(fx, k).stats.cache_hits.values()) for k in ("outer", "caller", "scaled_sum")}
ir = None
if hits["caller"] == 0:
    ir = fx.caller.inspect_llvm(fx.caller.signatures[0])
callee = fx.scaled_sum.overloads[fx.scaled_sum.signatures[0]].fndesc.mangled_name
w = fx.calls_internal(3.0)  # compiles (or loads) internal_twice first
try:
    fx.internal_twice(3.0)
    perr = None
except TypeError as exc:
    perr = str(exc)
out = np.zeros(1)
direct = (int(fx.scaled_sum(x, 0.5, out)), float(out[0]))  # its Python wrapper, after a load too
lib = fx.scaled_sum.overloads[fx.scaled_sum.signatures[0]].library
shared = getattr(lib, "_shared_module", None)  # set by a load from the cache
linkable = None if shared is None else len(list(shared.functions))
print(json.dumps({"v": v, "n": int(n), "err": err, "hits": hits, "ir": ir, "callee": callee,
                  "w": w, "perr": perr, "direct": direct, "linkable": linkable}))
"""


def _run(cache: Path) -> dict:
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache), OMP_WAIT_POLICY="passive",
               TSBATCH_PRECOMPILED="0", PYTHONPATH=os.pathsep.join([str(ROOT), str(TESTS)]))
    res = subprocess.run([sys.executable, "-c", CODE], env=env, cwd=TESTS, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def _expected(x, a):
    """``outer``'s result in numpy: the second call's sum (it overwrites out[0]) plus
    one, and the negative entries counted by both calls."""
    return float(np.sum((2.0 * a) * x[::-1])) + 1.0, 2 * int(np.sum(x < 0.0))


def test_separately_linked_call_compiles_loads_and_raises(tmp_path):
    x = np.linspace(-3.0, 5.0, 17)
    ev, en = _expected(x, 0.5)
    cold = _run(tmp_path)
    assert sum(cold["hits"].values()) == 0  # compiled
    assert cold["v"] == pytest.approx(ev, rel=1e-14) and cold["n"] == en
    assert cold["err"] == "negative scale"  # the callee's error status reaches Python
    callee, ir = cold["callee"], cold["ir"]
    assert f'@"tsbatch.extern${callee}"(' in ir  # called by its symbol ...
    assert f'@"{callee}"(' not in ir  # ... its code neither linked in nor called by name
    warm = _run(tmp_path)
    # the caller (and the one above it) loaded from the cache, the callee loaded first
    assert warm["hits"] == {"outer": 1, "caller": 1, "scaled_sum": 1}
    assert (warm["v"], warm["n"], warm["err"]) == (cold["v"], cold["n"], cold["err"])
    # a kernel compiled without a Python wrapper: its jitted caller calls it; a call
    # from Python gets a clear error (not a call of a missing wrapper), compiled or loaded
    for res in (cold, warm):
        assert res["w"] == 8.0
        assert "called from jitted code only" in res["perr"]
    # loaded from the cache as machine code alone (no caller links it: _fastload.code_only),
    # its Python wrapper still found and called
    assert cold["linkable"] != 0 and warm["linkable"] == 0
    assert warm["direct"] == cold["direct"]
    assert cold["direct"][0] == int(np.sum(x < 0.0))
    assert cold["direct"][1] == pytest.approx(float(np.sum(0.5 * x)), rel=1e-14)
