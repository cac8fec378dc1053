"""Row shares on the thread pool (tsbatch.kernels._threads)."""

from __future__ import annotations

import threading

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
