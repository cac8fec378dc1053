"""``evaluate`` in chunks (sharing solved cache problems) equals ``evaluate`` in one piece.

Rows are independent: a row's results depend on its own columns only, and
a cache problem's results on its key (every varying input of the cache
model, block bytes by their exact bits). So splitting a table into chunks,
and taking a problem solved in an earlier chunk from the memo, must give
the same frame, bit for bit.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal
from strategies import gemm_frames

from tsbatch.engine.evaluate import CacheMemo, evaluate


@settings(max_examples=40, deadline=None)
@given(gemm_frames(min_rows=2, max_rows=12, max_size=3000), st.integers(1, 5),
       st.sampled_from(["h100", "a100"]))
def test_chunked_evaluate_equals_one_piece(df, chunk, hw):
    df = pl.concat([df, df.reverse(), df.head(3)])  # repeats: problems met again in later chunks
    whole = evaluate(df, hw, chunk_rows=0)
    tm: dict = {}
    parts = evaluate(df, hw, chunk_rows=chunk, timings=tm)
    assert_frame_equal(parts, whole)
    assert tm["cache_problems"] + tm["cache_problems_reused"] >= 1


def test_memo_reuses_problems_across_calls():
    rng = np.random.default_rng(0)
    n = 400
    df = pl.DataFrame({
        "m": rng.choice([64, 512, 4096], n), "n": rng.choice([1024, 4096], n), "k": 2048,
        "dtype": "bfloat16", "block_m": rng.choice([64, 128], n), "block_n": 128,
        "block_k": 64, "num_stages": rng.choice([2, 3, 4], n), "num_warps": 4,
    })
    memo = CacheMemo()
    t1: dict = {}
    a = evaluate(df, "h100", cache_memo=memo, timings=t1)
    t2: dict = {}
    b = evaluate(df, "h100", cache_memo=memo, timings=t2)
    assert_frame_equal(a, b)
    assert t1["cache_problems"] > 0 and t1["cache_problems_reused"] == 0
    assert t2["cache_problems"] == 0 and t2["cache_problems_reused"] == t1["cache_problems"]
    assert_frame_equal(a, evaluate(df, "h100"))
    # the memo is bound to its GPU and sampling: other sampling is refused, not mixed
    with pytest.raises(ValueError, match="wave_samples"):
        evaluate(df, "h100", cache_memo=memo, wave_samples=3)
    with pytest.raises(ValueError, match="one memo per GPU"):
        evaluate(df, "a100", cache_memo=memo)
