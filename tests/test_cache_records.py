"""The cache model's kernels pass named records, not long argument lists (issue 18).

``tsbatch/kernels/reuse.py``'s kernels took up to 82 positional parameters;
they now take the records of :mod:`tsbatch.kernels._records` (the batch, the
problem, its book-keeping, a wave's scratch, the memo tables) and their own
wave's scalars. These tests keep it so.
"""

from __future__ import annotations

import inspect

from tsbatch.kernels import _records, reuse

#: the most parameters a cache-model kernel takes (``_run_starts``, which
#: tests call with plain numbers: a wave's start and size, the SM groups'
#: three numbers, the launch order's six and the output)
MAX_KERNEL_PARAMS = 12


def _kernels():
    """The numba kernels defined in reuse.py (not those it imports)."""
    return {name: obj for name, obj in vars(reuse).items()
            if getattr(getattr(obj, "py_func", None), "__module__", None) == reuse.__name__}


def test_cache_kernels_take_few_parameters_issue18():
    ks = _kernels()
    assert {"_wave", "_hits_fast", "_hits_blocks", "_group_l15", "_cache_one"} <= set(ks)
    sizes = {n: len(inspect.signature(k.py_func).parameters) for n, k in ks.items()}
    assert max(sizes.values()) <= MAX_KERNEL_PARAMS, sizes


def test_kernels_taking_records_name_them_by_role_issue18():
    """A record parameter is named for its record, in the same place
    everywhere: ``b`` (Batch), ``pb`` (Problem), ``bk`` (Book), ``sc``
    (Scratch), ``mm`` (Memo), in that order, before a kernel's own
    arguments."""
    roles = ["b", "pb", "bk", "sc", "mm"]
    for name, k in _kernels().items():
        params = list(inspect.signature(k.py_func).parameters)
        taken = [p for p in params if p in roles]
        assert params[:len(taken)] == taken, name
        assert taken == sorted(taken, key=roles.index), name


def test_batch_record_holds_cache_hit_rates_columns_issue18():
    """``Batch`` lists ``cache_hit_rates``'s columns in its own order, so a
    batch made from them positionally puts each where its name says."""
    cols = list(inspect.signature(reuse.cache_hit_rates).parameters)[:16]
    assert list(_records.Batch._fields[:16]) == cols

