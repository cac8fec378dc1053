"""The fused families' compute chunks in shares on threads (issue 35, session 10): each
GPU's distinct attention rows cut into contiguous shares, one engine call per share on
a thread of its own; the same figures as one call per GPU, to the bit."""

from __future__ import annotations

import threading

import numpy as np
import polars as pl
import pytest

import kernels_catalog.fused_comm as fc
from kernels_catalog.fused_comm import _shares, evaluate_fused
from tsbatch.engine.evaluate import evaluate as eval_compute
from tsbatch.errors import InputError

from test_fused_dedup import ATTN_TILE, _bits_equal  # noqa: E402  (the same tile; frames equal column by column, floats by their bits)



def _ulysses_rows() -> pl.DataFrame:
    """Ulysses rows on two GPUs (B200 and H100 systems), many distinct attention chunks,
    some repeated, some infeasible before their compute (heads not divisible)."""
    out = []
    for system in ("hgx_b200", "dgx_h100"):
        for s in range(4096, 4096 + 40 * 64, 64):
            for tp, c in ((2, 2), (4, 1), (8, 2), (4, 4)):
                out.append(dict(system=system, batch=1, heads=32, seq_len=s, head_dim=128, **ATTN_TILE,
                                causal=(s // 64) % 2 == 0, num_gpus=tp, chunks=c))
        out.append(dict(system=system, batch=1, heads=30, seq_len=4096, head_dim=128, **ATTN_TILE,
                        causal=False, num_gpus=4, chunks=1))
    return pl.DataFrame(out + out[:7])


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("least", [1, 10, 50, 1000])
def test_shares_cover_each_gpus_rows_in_order(monkeypatch, threads, least):
    monkeypatch.setattr(fc, "num_threads", lambda: threads)
    monkeypatch.setattr(fc, "SHARE_ROWS", {"attention": least})
    rng = np.random.default_rng(threads * 1000 + least)
    grep = rng.integers(0, 3, 400)
    groups = [(g, np.nonzero(grep == g)[0]) for g in range(3)]
    jobs = _shares(groups, len(grep), "attention")
    if threads < 2 or len(grep) < 2 * least:
        assert jobs == groups
    # each GPU's rows, in order, exactly once: the shares of a GPU laid end to end
    for g, idx in groups:
        mine = [j for h, j in jobs if h == g]
        assert np.array_equal(np.concatenate(mine), idx)
        assert len(mine) <= max(threads, 1)
        if len(mine) > 1:
            assert min(len(j) for j in mine) >= least
    # a family not named keeps one call per GPU
    assert _shares(groups, len(grep), "gemm") == groups


def test_shares_equal_one_call_per_gpu_to_the_bit(monkeypatch):
    frame = _ulysses_rows()
    calls: list[tuple[int, str]] = []

    def engine(sub, hw, family):
        calls.append((sub.height, threading.current_thread().name))
        return eval_compute(sub, hw, family=family)

    monkeypatch.setattr(fc, "SHARE_ROWS", {})
    ref = evaluate_fused(frame, "ulysses", engine)
    one = list(calls)
    assert len(one) == 2  # one call per GPU
    calls.clear()
    monkeypatch.setattr(fc, "num_threads", lambda: 3)
    monkeypatch.setattr(fc, "SHARE_ROWS", {"attention": 16})
    out = evaluate_fused(frame, "ulysses", engine)
    _bits_equal(out, ref)
    # the GPUs' rows in shares, on the pool's threads, every distinct row once
    assert len(calls) == 6
    assert sum(n for n, _ in calls) == sum(n for n, _ in one)
    assert all(name.startswith("tsbatch-fused") for _, name in calls)
    assert out["feasible"].any() and not out["feasible"].all()


def test_an_error_in_a_share_is_the_one_per_gpu_calls_give(monkeypatch):
    frame = _ulysses_rows()

    def engine(sub, hw, family):
        raise InputError(f"{hw}: {sub.height} rows")

    monkeypatch.setattr(fc, "SHARE_ROWS", {})
    with pytest.raises(InputError) as ref:
        evaluate_fused(frame, "ulysses", engine)
    monkeypatch.setattr(fc, "num_threads", lambda: 2)
    monkeypatch.setattr(fc, "SHARE_ROWS", {"attention": 16})
    with pytest.raises(InputError) as got:
        evaluate_fused(frame, "ulysses", engine)
    assert str(got.value) == str(ref.value)
