"""Cached kernels load without numba's registry refresh (tsbatch.kernels._fastload),
and without importing numba's modules for the environments they carry.

Each check is a new process sharing one fresh numba cache directory: the first
compiles and stores two small kernels (one parallel, one serial), the next
ones load them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CODE = """
import json, sys
import numpy as np
from numba import njit
from numba.core.registry import cpu_target
from tsbatch.hw import get_hw
from tsbatch.kernels.occupancy import _resident_batch, resident_tiles
from tsbatch.kernels.order import launch_order, launch_order_array

r, why = resident_tiles(np.array([32768, 10**6, 4096]), np.array([128, 128, 255]),
                        np.array([256, 256, 1024]), get_hw("h100"))
x0, x1, x2 = launch_order_array(2, 3, 4, 2, 2)
refreshed = bool(cpu_target.target_context._registries)
hits = sum(_resident_batch.stats.cache_hits.values()) + sum(launch_order.stats.cache_hits.values())
# compiling something new in the same process still works (it refreshes first)
inc = njit(lambda v: v + 1)(np.arange(3)).tolist()
print(json.dumps({"r": r.tolist(), "why": why.tolist(), "order": [x0.tolist(), x1.tolist(),
                  x2.tolist()], "refreshed": refreshed, "hits": hits, "inc": inc}))
"""


def _run(cache: Path, **env) -> dict:
    full = {k: v for k, v in os.environ.items() if k != "TSBATCH_NUMBA_FASTLOAD"}
    # TSBATCH_PRECOMPILED=0: an installed wheel's shipped kernels (test_shipped.py) would
    # make the "cold" run load instead of compiling
    full.update(NUMBA_CACHE_DIR=str(cache), OMP_WAIT_POLICY="passive", TSBATCH_PRECOMPILED="0",
                **env)
    res = subprocess.run([sys.executable, "-c", CODE], env=full, cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_cached_kernels_load_without_refresh(tmp_path):
    cold = _run(tmp_path)
    assert cold["hits"] == 0 and cold["refreshed"]  # compiled: the compiler refreshed
    warm = _run(tmp_path)
    assert warm["hits"] == 2  # both loaded from the cache ...
    assert not warm["refreshed"]  # ... without the registry refresh
    plain = _run(tmp_path, TSBATCH_NUMBA_FASTLOAD="0")  # numba's own loading
    assert plain["hits"] == 2 and plain["refreshed"]
    for res in (warm, plain):
        assert {k: res[k] for k in ("r", "why", "order", "inc")} == \
               {k: cold[k] for k in ("r", "why", "order", "inc")}
    assert cold["r"][1] == 0 and cold["inc"] == [1, 2, 3]


ENV_CODE = """
import json, sys
import numpy as np
from numba import njit
import _fastload_fixture as fx
s, a = fx.filled(5, 2.5)
hits = sum(fx.filled.stats.cache_hits.values())
imported = "numba.np.arrayobj" in sys.modules
# compiling numba's np.full anew in the same process still works ...
b = njit(lambda n: np.full(n, 1.5))(4).tolist()
# ... and so does the loaded kernel after that
s2, a2 = fx.filled(3, -1.0)
# a new jitted caller links the loaded kernel's code (its module for linking, parsed on
# demand): the caller's module holds no bare declaration of it (a cached caller would need
# the callee loaded first, which numba does not arrange for a linked callee)
g = njit(lambda n: fx.filled(n, 2.0)[0] + 1.0)
c = g(4)
callee = fx.filled.overloads[fx.filled.signatures[0]].fndesc.mangled_name
declared = [l for l in g.inspect_llvm(g.signatures[0]).splitlines()
            if l.startswith("declare") and callee in l]
from numba.core.runtime import rtsys
# numba's runtime library: machine code loaded from the cache has no LLVM functions left
nrt_loaded = not list(rtsys.library._final_module.functions)
print(json.dumps({"s": s, "a": a.tolist(), "s2": s2, "a2": a2.tolist(), "b": b, "c": c,
                  "declared": declared, "hits": hits, "imported": imported, "nrt_loaded": nrt_loaded}))
"""


def _run_env(cache: Path, **env) -> dict:
    full = {k: v for k, v in os.environ.items() if k != "TSBATCH_NUMBA_FASTLOAD"}
    full.update(NUMBA_CACHE_DIR=str(cache), OMP_WAIT_POLICY="passive", TSBATCH_PRECOMPILED="0",
                PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]), **env)
    res = subprocess.run([sys.executable, "-c", ENV_CODE], env=full, cwd=ROOT / "tests",
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_cached_environments_do_not_import_numbas_modules(tmp_path):
    """A loaded kernel holding ``np.full``'s code gets that implementation's environment
    without ``numba.np.arrayobj`` being imported (numba's own loading imports it); the
    results are the same, compiling ``np.full`` afterwards in that process works, and so
    does compiling a caller that links the loaded kernel (loaded as machine code alone).
    numba's runtime library is compiled by the first process and loaded by the next."""
    cold = _run_env(tmp_path)
    assert cold["hits"] == 0 and cold["imported"]  # compiled: the compiler imported it
    stored = list(tmp_path.rglob("tsbatch-nrt-*.nbo"))  # numba's runtime library, compiled once
    assert len(stored) == 1 and not cold["nrt_loaded"]
    warm = _run_env(tmp_path)
    assert warm["hits"] == 1 and not warm["imported"] and warm["nrt_loaded"]
    plain = _run_env(tmp_path, TSBATCH_NUMBA_FASTLOAD="0")
    assert plain["hits"] == 1 and plain["imported"] and not plain["nrt_loaded"]
    stored[0].write_bytes(b"not a pickle")  # an unreadable runtime file: compiled again, rewritten
    again = _run_env(tmp_path)
    assert not again["nrt_loaded"] and _run_env(tmp_path)["nrt_loaded"]
    keys = ("s", "a", "s2", "a2", "b", "c")
    for res in (warm, plain, again):
        assert {k: res[k] for k in keys} == {k: cold[k] for k in keys}
    assert cold["a"] == [-2.5, 2.5, 2.5, 2.5, 2.5] and cold["s"] == 7.5
    assert cold["a2"] == [1.0, -1.0, -1.0] and cold["b"] == [1.5] * 4 and cold["c"] == 5.0
    for res in (cold, warm, plain):
        assert res["declared"] == []


def test_cached_jit_checks_a_cache_directory_once(tmp_path, monkeypatch):
    """``cached_jit`` kernels keep numba's cache files (same directory, index and key
    as ``njit(cache=True)``), and numba's check that the directory is writable (a
    temporary file) runs once for the kernels of one directory, not once per kernel."""
    import importlib
    import tempfile

    from numba.core.caching import FunctionCache

    from tsbatch.kernels import _fastload

    (tmp_path / "fl_two_kernels.py").write_text(
        "from tsbatch.kernels._fastload import cached_jit\n"
        "jit = cached_jit(nogil=True)\n"
        "@jit\n"
        "def one(x):\n    return x + 1\n"
        "@jit\n"
        "def two(x):\n    return x * 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    made = []
    real = tempfile.TemporaryFile

    def counting(*args, **kws):
        made.append(kws.get("dir"))
        return real(*args, **kws)

    monkeypatch.setattr(tempfile, "TemporaryFile", counting)
    mod = importlib.import_module("fl_two_kernels")
    assert len(made) == 1  # one check for the module's directory, not one per kernel
    for disp in (mod.one, mod.two):
        ours, numbas = disp._cache, FunctionCache(disp.py_func)
        assert type(ours) is _fastload._TsbatchCache
        assert ours.cache_path == numbas.cache_path
        assert ours._cache_file._index_path == numbas._cache_file._index_path
        assert ours._cache_file._source_stamp == numbas._cache_file._source_stamp
    assert mod.one(2) == 3 and mod.two(2) == 4
