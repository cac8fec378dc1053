"""Freed heap kept between evaluations (tsbatch.kernels._heap)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tsbatch.kernels import _heap

GLIBC = (getattr(os, "confstr", None) is not None
         and (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc"))

# one process: three rounds of an evaluation's temporaries (160 columns of
# float64, 32k rows: 40 MiB, each written; argv[2] other row counts), all freed at
# the end of a round; the minor page faults of the last round
_ROUNDS = r"""
import json, resource, sys
import numpy as np
from tsbatch.kernels import _heap
if sys.argv[1] == "call":
    _heap.keep_freed_heap()
ROWS = int(sys.argv[2]) if len(sys.argv) > 2 else 32768
def one_round():
    cols = []
    for _ in range(160):
        a = np.empty(ROWS)
        a[:] = 1.0
        cols.append(a)
    del cols
for _ in range(2):
    one_round()
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
one_round()
f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
print(json.dumps({"faults": f1 - f0, "pages": 160 * ROWS * 8 // 4096, "state": _heap._state}))
"""


def _env(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("MALLOC_") and k not in ("GLIBC_TUNABLES", "TSBATCH_KEEP_HEAP")}
    env.update(extra)
    return env


def _rounds(mode: str, rows: int = 32768, **extra) -> dict:
    out = subprocess.run([sys.executable, "-c", _ROUNDS, mode, str(rows)], env=_env(**extra),
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc only")
def test_a_call_after_keep_freed_heap_reuses_the_freed_heap():
    kept = _rounds("call")
    assert kept["state"] is True
    assert kept["faults"] < 0.1 * kept["pages"]
    # the same process without it: glibc gives the top of the heap back, and
    # the round takes it again page by page (what the setting is for)
    off = _rounds("call", TSBATCH_KEEP_HEAP="0")
    assert off["state"] is False
    assert off["faults"] > 0.5 * off["pages"]
    assert _rounds("none")["faults"] > 0.5 * off["pages"]


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc only")
def test_a_100k_row_calls_temporaries_are_kept_too():
    # 160 columns of 100k rows: 122 MiB, past the 64 MiB that glibc's own dynamic
    # rule would keep (the threshold before session 17) and within TRIM_THRESHOLD
    rows = 100_000
    assert 160 * rows * 8 < _heap.TRIM_THRESHOLD
    kept = _rounds("call", rows)
    assert kept["faults"] < 0.1 * kept["pages"]
    at_glibcs = _rounds("none", rows, MALLOC_MMAP_THRESHOLD_=str(_heap.MMAP_THRESHOLD),
                        MALLOC_TRIM_THRESHOLD_=str(2 * _heap.MMAP_THRESHOLD))
    assert at_glibcs["faults"] > 0.5 * at_glibcs["pages"]


@pytest.mark.parametrize("extra", [{"TSBATCH_KEEP_HEAP": "0"}, {"MALLOC_TRIM_THRESHOLD_": "1000000"},
                                   {"MALLOC_MMAP_THRESHOLD_": "1000000"},
                                   {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1000000"}])
def test_a_users_malloc_settings_are_left_alone(monkeypatch, extra):
    for k in _heap._USER_SETTINGS + ("GLIBC_TUNABLES", "TSBATCH_KEEP_HEAP"):
        monkeypatch.delenv(k, raising=False)
    assert _heap._wanted() is GLIBC
    for k, v in extra.items():
        monkeypatch.setenv(k, v)
    assert _heap._wanted() is False


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc only")
def test_evaluate_sets_it_once_per_process():
    code = ("import polars as pl\nfrom tsbatch.kernels import _heap\n"
            "from tsbatch.engine.evaluate import evaluate\n"
            "before = _heap._state\n"
            "evaluate(pl.DataFrame({'m': [256], 'n': [256], 'k': [256], 'dtype': ['float16'],"
            " 'block_m': [64], 'block_n': [64], 'block_k': [32], 'num_stages': [3],"
            " 'num_warps': [4]}), 'h100')\n"
            "print(before, _heap._state)")
    out = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, check=True)
    assert out.stdout.split()[-2:] == ["None", "True"]


# ---------------------------------------------------------------------------
# bench/heap_faults.py: its processes differ in the trim threshold only
# ---------------------------------------------------------------------------
def _heap_faults():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "bench" / "heap_faults.py"
    spec = importlib.util.spec_from_file_location("heap_faults", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_heap_faults_children_set_glibc_and_nothing_else(monkeypatch):
    hf = _heap_faults()
    monkeypatch.setenv("MALLOC_TOP_PAD_", "1")
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=1")
    monkeypatch.setenv("TSBATCH_KEEP_HEAP", "0")
    env = hf._child_env(256)
    assert env["MALLOC_TRIM_THRESHOLD_"] == str(256 << 20)
    assert env["MALLOC_MMAP_THRESHOLD_"] == str(_heap.MMAP_THRESHOLD)
    assert "MALLOC_TOP_PAD_" not in env and "GLIBC_TUNABLES" not in env and "TSBATCH_KEEP_HEAP" not in env
    shipped = hf._child_env(None)  # tsbatch sets its own
    assert not any(k.startswith("MALLOC_") for k in shipped)
    assert hf._mib_list("64,256") == [64, 256]
    for bad in ("x", "0", ""):
        with pytest.raises(Exception):
            hf._mib_list(bad)
