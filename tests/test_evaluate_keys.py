"""evaluate_plan groups cache problems on the key columns that vary: the groups
(ids in order of first appearance, representatives) are those of all columns."""

from __future__ import annotations

import numpy as np
import pytest

from tsbatch.engine import evaluate as ev
from tsbatch.kernels.rowhash import dedup_rows


@pytest.mark.parametrize("rows", [0, 1, 7, 1000, ev.VARYING_MIN_ROWS + 5])
def test_grouping_on_varying_columns_is_grouping_on_all(rows):
    rng = np.random.default_rng(rows)
    parts = [rng.integers(0, 3, rows), np.full(rows, 7), rng.integers(0, 2, (rows, 3)),
             np.tile(np.array([1, 2, 3]), (rows, 1)), rng.integers(0, 2, rows) * 5]
    want = dedup_rows(np.column_stack(parts))
    got = dedup_rows(ev._varying_columns(parts, rows))
    for g, w in zip(got, want):
        assert np.array_equal(g, w)
    if rows >= ev.VARYING_MIN_ROWS:  # the constant columns are left out there
        assert ev._varying_columns(parts, rows).shape[1] == 1 + 3 + 1


def test_all_constant_columns_give_one_group():
    rows = ev.VARYING_MIN_ROWS
    parts = [np.full(rows, 3), np.ones((rows, 2), dtype=np.int64)]
    keys = ev._varying_columns(parts, rows)
    assert keys.shape == (rows, 0)
    inv, rep = dedup_rows(keys)
    assert (inv == 0).all() and rep.tolist() == [0]
