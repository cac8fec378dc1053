"""Compiled kernels that ship with the package (tsbatch.kernels._fastload, setup.py).

The mechanism is checked on a module of its own in a temporary directory, each
step a new process: ``TSBATCH_PRECOMPILE=1`` writes the compiled code to
``_nbcache/`` beside the module; a process with an empty numba cache then loads
it instead of compiling; ``TSBATCH_PRECOMPILED=0``, an edited source and a
damaged file each fall back to compiling, with the same result.

The install is checked too: where the installed tsbatch carries shipped code
(a wheel built by setup.py; ``scripts/test.sh`` installs one and sets
``TSBATCH_REQUIRE_SHIPPED=1`` so that its absence fails), the README's first
calls compile nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tsbatch

MODULE = '''
import numpy as np
from numba import njit
from tsbatch.kernels._fastload import fast_loading

@fast_loading(njit(cache=True, nogil=True))
def weighted(x, w):
    s = 0.0
    for i in range(x.shape[0]):
        s += x[i] * w
    return s
'''

CALL = '''
import json
import numpy as np
import shipmod
v = shipmod.weighted(np.arange(10.0), 0.5)
print(json.dumps({"v": v, "hits": sum(shipmod.weighted.stats.cache_hits.values())}))
'''


def _call(mod_dir: Path, cache: Path, **env) -> dict:
    full = {k: v for k, v in os.environ.items()
            if k not in ("TSBATCH_PRECOMPILE", "TSBATCH_PRECOMPILED", "NUMBA_CACHE_DIR")}
    full.update(NUMBA_CACHE_DIR=str(cache), PYTHONPATH=os.pathsep.join(
        [str(mod_dir)] + [p for p in [os.environ.get("PYTHONPATH")] if p]), **env)
    res = subprocess.run([sys.executable, "-c", CALL], env=full, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    out["stored"] = sorted(p.name for p in cache.rglob("*.nb[ic]")) if cache.exists() else []
    return out


def test_shipped_code_loads_and_falls_back(tmp_path):
    mod = tmp_path / "mod"
    mod.mkdir()
    (mod / "shipmod.py").write_text(MODULE)
    expect = sum(i * 0.5 for i in range(10))

    built = _call(mod, tmp_path / "c0", TSBATCH_PRECOMPILE="1")
    assert built["v"] == expect and built["hits"] == 0  # compiled ...
    shipped = sorted(p.name for p in (mod / "_nbcache").iterdir())
    assert any(n.endswith(".nbi") for n in shipped) and any(n.endswith(".nbc") for n in shipped)
    assert built["stored"] == []  # ... into _nbcache, not the usual cache

    loaded = _call(mod, tmp_path / "c1")
    assert loaded["v"] == expect and loaded["hits"] == 1  # loaded from _nbcache
    assert loaded["stored"] == []  # nothing compiled, nothing stored

    ignored = _call(mod, tmp_path / "c2", TSBATCH_PRECOMPILED="0")
    assert ignored["v"] == expect and ignored["hits"] == 0
    assert any(n.endswith(".nbc") for n in ignored["stored"])  # compiled and cached as usual

    # another source than the one the code was built from: the shipped index is stale
    (mod / "shipmod.py").write_text(MODULE + "\n# edited\n")
    edited = _call(mod, tmp_path / "c3")
    assert edited["v"] == expect and edited["hits"] == 0 and edited["stored"]
    (mod / "shipmod.py").write_text(MODULE)
    assert _call(mod, tmp_path / "c4")["hits"] == 1  # the same source again: it loads

    # damaged code: numba's own loading is retried, the kernel compiles
    for f in (mod / "_nbcache").glob("*.nbc"):
        f.write_bytes(f.read_bytes()[:40])
    damaged = _call(mod, tmp_path / "c5")
    assert damaged["v"] == expect and damaged["hits"] == 0 and damaged["stored"]


def _installed_shipped() -> list[Path]:
    roots = [Path(tsbatch.__file__).parent]
    import kernels_catalog

    roots.append(Path(kernels_catalog.__file__).parent)
    return [p for r in roots for p in r.rglob("_nbcache") if any(p.glob("*.nbi"))]


FIRST_CALLS = {
    "explain": ["-m", "tsbatch.front.cli", "explain", "--hw", "h100", "--m", "4096", "--n", "4096",
                "--k", "4096", "--block-m", "128", "--block-n", "128", "--block-k", "64",
                "--num-stages", "4", "--num-warps", "8"],
    "sweep": ["-m", "tsbatch.front.cli", "sweep", "llama3", "--hw", "h100", "--top", "5%", "-o",
              "{out}", "-q"],
    "prune": ["-c", "from tsbatch._precompile import _prune; _prune()"],
}


@pytest.mark.parametrize("name", sorted(FIRST_CALLS))
def test_installed_first_calls_compile_nothing(name, tmp_path):
    if not _installed_shipped():
        if os.environ.get("TSBATCH_REQUIRE_SHIPPED") == "1":
            pytest.fail("TSBATCH_REQUIRE_SHIPPED=1 but the installed tsbatch has no _nbcache/ "
                        f"code ({Path(tsbatch.__file__).parent})")
        pytest.skip("this tsbatch was not installed from a wheel with compiled kernels")
    argv = [a.replace("{out}", str(tmp_path / "o.parquet")) for a in FIRST_CALLS[name]]
    env = {k: v for k, v in os.environ.items()
           if k not in ("TSBATCH_PRECOMPILE", "TSBATCH_PRECOMPILED")}
    env.update(NUMBA_CACHE_DIR=str(tmp_path / "cache"), NUMBA_DEBUG_CACHE="1")
    res = subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True,
                         timeout=600, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    log = res.stdout.splitlines() + res.stderr.splitlines()
    saved = [ln for ln in log if "[cache] data saved" in ln]
    loaded = [ln for ln in log if "[cache] data loaded" in ln and "_nbcache" in ln]
    assert saved == [], "compiled despite the shipped code:\n" + "\n".join(saved)
    assert loaded  # and its kernels did come from the shipped code


def test_a_wheel_with_shipped_code_is_tagged_for_its_interpreter_and_platform():
    """The shipped code is machine code for one interpreter, platform and CPU, so
    the wheel that carries it is not ``py3-none-any`` (issue 37): setup.py tags it
    ``cpXY-cpXY-PLATFORM`` and installs it as platform code."""
    import sysconfig
    from importlib import metadata

    if not _installed_shipped():
        if os.environ.get("TSBATCH_REQUIRE_SHIPPED") == "1":
            pytest.fail("TSBATCH_REQUIRE_SHIPPED=1 but the installed tsbatch has no _nbcache/ code")
        pytest.skip("this tsbatch was not installed from a wheel with compiled kernels")
    here = Path(tsbatch.__file__).resolve()
    # the distribution installed where the imported package lives (a build leaves
    # tsbatch.egg-info in the source tree, which metadata.distribution may find first)
    dist = next(iter(metadata.Distribution.discover(name="tsbatch", path=[str(here.parents[1])])),
                None)
    assert dist is not None, f"no tsbatch distribution beside {here.parents[1]}"
    assert Path(dist.locate_file("tsbatch/__init__.py")).resolve() == here, \
        "the tsbatch imported is not the installed distribution's"
    wheel = dist.read_text("WHEEL") or ""
    tags = [ln.split(":", 1)[1].strip() for ln in wheel.splitlines() if ln.startswith("Tag:")]
    assert tags, wheel
    py = f"cp{sys.version_info.major}{sys.version_info.minor}"
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    for tag in tags:
        interp, abi, platform = tag.split("-")
        assert interp == py and abi == py and platform == plat, tag
    assert "Root-Is-Purelib: false" in wheel
