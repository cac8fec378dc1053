"""Row shares on the thread pool (tsbatch.kernels._threads)."""

from __future__ import annotations

import os
import sys
import threading
import time

import numpy as np
import pytest

from tsbatch.kernels import _threads


@pytest.mark.parametrize("threads", [1, 2, 3, 8])
@pytest.mark.parametrize("n", [0, 1, 5, 100, 1001])
def test_even_bounds_cover_every_row_once(monkeypatch, threads, n):
    monkeypatch.setattr(_threads, "num_threads", lambda: threads)
    for min_share in (1, 7, 1000):
        b = _threads.even_bounds(n, min_share)
        assert b[0] == 0 and b[-1] == n and b == sorted(b)
        k = len(b) - 1
        assert k == max(1, min(threads, n // min_share))
        if k > 1:  # no share below the minimum, none empty
            assert min(np.diff(b)) >= min_share


def test_run_shares_runs_every_share_and_uses_threads(monkeypatch):
    monkeypatch.setattr(_threads, "num_threads", lambda: 3)
    seen = np.zeros(100, dtype=np.int64)
    who = set()

    def kernel(out, lo, hi):
        who.add(threading.get_ident())
        out[lo:hi] += 1

    _threads.run_shares(kernel, (seen,), _threads.even_bounds(100, 10))
    assert (seen == 1).all()
    assert threading.get_ident() not in who  # shares ran on the pool
    _threads.run_shares(kernel, (seen,), [0, 100])  # one share: on this thread
    assert (seen == 2).all() and threading.get_ident() in who


def test_run_shares_raises_a_share_error_after_all_ended():
    done = []

    def kernel(lo, hi):
        if lo == 0:
            raise ValueError("share 0 failed")
        done.append(lo)

    with pytest.raises(ValueError, match="share 0 failed"):
        _threads.run_shares(kernel, (), [0, 1, 2, 3])
    assert sorted(done) == [1, 2]


@pytest.mark.skipif(sys.platform == "win32" or not hasattr(os, "fork"), reason="needs fork")
def test_run_shares_in_a_forked_child(monkeypatch):
    """A child forked after the pool ran work gets a pool of its own (the
    parent's threads are not in the child)."""
    monkeypatch.setattr(_threads, "num_threads", lambda: 2)
    seen = np.zeros(10, dtype=np.int64)

    def kernel(out, lo, hi):
        out[lo:hi] += 1

    both = threading.Barrier(2, timeout=10)

    def together(out, lo, hi):  # both shares at once: the pool holds two threads
        both.wait()
        kernel(out, lo, hi)

    _threads.run_shares(together, (seen,), [0, 5, 10])
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only if both shares ran
        try:
            got = np.zeros(10, dtype=np.int64)
            _threads.run_shares(kernel, (got,), [0, 5, 10])
            os._exit(0 if (got == 1).all() else 1)
        finally:
            os._exit(2)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 30.0:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail("the forked child's shares did not finish (the pool hung)")


def test_num_threads_does_not_start_numbas_threading_layer():
    """Before numba's threading layer starts, ``num_threads`` is ``NUMBA_NUM_THREADS``
    (what ``numba.get_num_threads`` returns until ``set_num_threads``, which starts the
    layer) and does not start it; afterwards it is numba's count."""
    import subprocess
    from pathlib import Path

    code = ("import numba\n"
            "from numba.np.ufunc import parallel\n"
            "from tsbatch.kernels._threads import num_threads\n"
            "before = num_threads()\n"
            "started = parallel._is_initialized\n"
            "numba.set_num_threads(1)\n"
            "print(before, started, num_threads(), numba.config.NUMBA_NUM_THREADS)\n")
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                         env={**os.environ, "NUMBA_NUM_THREADS": "3"},
                         timeout=120, check=True).stdout.split()
    assert out == ["3", "False", "1", "3"]
