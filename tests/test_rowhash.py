"""Exact row hashing (tsbatch.kernels.rowhash) against its plain twins:
``np.unique(axis=0)`` for grouping rows and a dict of row tuples for the index."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tsbatch.kernels.rowhash import RowIndex, dedup_rows

WORDS = st.sampled_from([0, 1, -1, 2, 7, -2**63, 2**63 - 1, 2**40 + 3])


def _matrix(data, rows, width):
    flat = data.draw(st.lists(WORDS, min_size=rows * width, max_size=rows * width))
    return np.array(flat, dtype=np.int64).reshape(rows, width)


@settings(max_examples=200, deadline=None)
@given(data=st.data(), rows=st.integers(0, 120), width=st.integers(1, 5))
def test_dedup_rows_groups_as_np_unique(data, rows, width):
    keys = _matrix(data, rows, width)
    inv, rep = dedup_rows(keys)
    assert np.array_equal(keys[rep[inv]], keys)
    _, twin = np.unique(keys, axis=0, return_inverse=True) if rows else (None, np.zeros(0))
    twin = np.asarray(twin).reshape(-1)
    assert rep.shape[0] == np.unique(twin).shape[0]  # as many groups as distinct rows
    # the same partition: a group id maps to exactly one twin id and back
    pairs = set(zip(inv.tolist(), twin.tolist()))
    assert len(pairs) == rep.shape[0]
    # ids in order of first appearance, each represented by its first row
    assert np.array_equal(inv[rep], np.arange(rep.shape[0]))
    assert np.all(np.diff(rep) > 0)
    for g, r in enumerate(rep):
        assert r == np.flatnonzero(inv == g)[0]


@settings(max_examples=150, deadline=None)
@given(data=st.data(), width=st.integers(1, 4), chunks=st.lists(st.integers(0, 40), max_size=6))
def test_row_index_finds_as_a_dict(data, width, chunks):
    ix = RowIndex(width)
    twin: dict = {}
    for m in chunks:
        new = [r for r in map(tuple, _matrix(data, m, width).tolist()) if r not in twin]
        new = list(dict.fromkeys(new))  # the index takes distinct, new rows
        ix.add(np.array(new, dtype=np.int64).reshape(-1, width))
        for r in new:
            twin[r] = len(twin)
        q = _matrix(data, data.draw(st.integers(0, 30)), width)
        want = [twin.get(r, -1) for r in map(tuple, q.tolist())]
        assert ix.find(q).tolist() == want
    assert len(ix) == len(twin)


def test_row_index_grows_past_its_table():
    rng = np.random.default_rng(1)
    rows = np.unique(rng.integers(-2**62, 2**62, size=(5000, 3)), axis=0)
    ix = RowIndex(3)
    for a in range(0, rows.shape[0], 700):
        ix.add(rows[a:a + 700])
    perm = rng.permutation(rows.shape[0])
    assert np.array_equal(ix.find(rows[perm]), perm)
    assert (ix.find(rows[:50] + 1) == -1).sum() >= 1


def test_row_index_rejects_other_widths():
    ix = RowIndex(3)
    with pytest.raises(ValueError, match="2 columns given to an index of 3-column rows"):
        ix.add(np.zeros((1, 2), dtype=np.int64))
    with pytest.raises(ValueError, match="2-D"):
        dedup_rows(np.zeros(4, dtype=np.int64))


def test_row_index_growth_stops_at_max_rows():
    ix = RowIndex(2, max_rows=10)
    for a in range(0, 12, 3):  # 12 rows: past the limit, still exact
        ix.add(np.arange(2 * a, 2 * a + 6, dtype=np.int64).reshape(3, 2))
    assert ix._rows.shape[0] == 12
    assert ix.find(np.arange(24, dtype=np.int64).reshape(12, 2)).tolist() == list(range(12))
