"""Attention variants (``variant`` / ``window`` columns of attention and attention_fa3).

Hand computations of the visited KV blocks, the masked edge blocks, the
softcap's extra work and the useful FLOPs; the rules; and the orderings a
user relies on: a window never costs more than no window, a narrower window
never more than a wider one, softcapping never less than none.
"""

from __future__ import annotations

import math

import polars as pl
import pytest

from tsbatch.engine.evaluate import FAMILIES, evaluate
from tsbatch.hw import get_hw
from tsbatch.boundary.schema import validate

BASE = dict(batch=1, heads=8, seq_len=8192, head_dim=128, dtype="bfloat16", block_m=128,
            block_n=64, num_stages=2, num_warps=8, causal=True)
HW = {"attention": "a100", "attention_fa3": "h100"}


def _rows(family, *rows):
    extra = {"num_warps": 12} if family == "attention_fa3" else {}
    return pl.DataFrame([dict(BASE, **extra, **r) for r in rows])


def _plan(family, *rows):
    fam = FAMILIES[family]
    cols, _ = validate(_rows(family, *rows), fam)
    return fam.lower(cols, get_hw(HW[family]))


@pytest.mark.parametrize("family", sorted(HW))
@pytest.mark.parametrize("causal, window", [(True, 1024), (True, 100), (False, 1024),
                                            (True, 20000), (False, 3)])
def test_sliding_window_steps_and_flops_by_hand(family, causal, window):
    bm, bn, s = BASE["block_m"], BASE["block_n"], BASE["seq_len"]
    p = _plan(family, dict(variant="full", window=0, causal=causal),
              dict(variant="sliding_window", window=window, causal=causal))
    kv_blocks = math.ceil(s / bn)
    q_tiles = math.ceil(s / bm)
    causal_steps = min(kv_blocks, max(math.ceil(((q_tiles + 1) * bm // 2) / bn), 1))
    full = causal_steps if causal else kv_blocks
    span = bm + (1 if causal else 2) * (window - 1)
    win = min(kv_blocks, math.ceil(span / bn) + 1)
    if causal:  # q tile t needs min((t + 1) BM / BN, win) blocks: the mean, rounded up
        per_tile = [min((t + 1) * bm / bn, win) for t in range(q_tiles)]
        expect = min(full, max(math.ceil(sum(per_tile) / q_tiles - 1e-9), 1))
    else:
        expect = win
    assert p.ksteps[0] == full
    assert p.ksteps[1] == expect
    # keys each query sees, averaged over the queries (the useful FLOPs)
    if causal:
        seen = sum(min(i + 1, window) for i in range(s)) / s
    else:
        seen = min(2 * window - 1, s)  # the model's count: no clipping at the sequence ends
    flops = 4.0 * 1 * 8 * s * seen * 128
    assert p.useful_flops[1] == pytest.approx(flops, rel=1e-12)


def test_window_edges_are_masked_blocks():
    # attention: the mask action's ALU work is 3 * BM * BN * masked / steps
    bm, bn = BASE["block_m"], BASE["block_n"]
    fam = FAMILIES["attention"]
    rows = [dict(variant="full", window=0), dict(variant="sliding_window", window=1024),
            dict(variant="sliding_window", window=1024, causal=False),
            dict(variant="sliding_window", window=10**6)]
    cols, _ = validate(_rows("attention", *rows), fam)
    p = fam.lower(cols, get_hw("a100"))
    edge = max(math.ceil(bm / bn), 1)
    s, w = BASE["seq_len"], math.ceil((bm + 1024 - 1) / bn) + 1
    q_tiles = math.ceil(s / bm)
    cut = sum(1 for t in range(q_tiles) if (t + 1) * bm / bn > w) / q_tiles  # tiles the window cuts
    # causal: the diagonal, and a far edge on the tiles the window cuts; both sides
    # without causal; a window wider than the sequence cuts nothing
    masked = [edge, edge + cut * (edge + 1), 2 * (edge + 1), edge]
    eb = {"float16": 2, "bfloat16": 2, "float32": 4}[BASE["dtype"]]
    for i, m in enumerate(masked):
        frac = min(m / p.ksteps[i], 1.0)
        # FMA pipe: scale, 1/ln 2, s - m, row sum per score, and the rescale
        assert p.work_iter[i, 1] == pytest.approx(2 * 4 * bm * bn + 2 * bm * 128, rel=1e-12)
        # ALU pipe: row max, P packed to 16 bits, the mask (score_mod_nodes 6: no mod ops)
        alu = bm * bn * (1 + (0.5 if eb == 2 else 0.0)) + 3 * bm * bn * frac
        assert p.work_iter[i, 8] == pytest.approx(alu, rel=1e-12)


@pytest.mark.parametrize("family", sorted(HW))
def test_softcap_adds_two_ops_and_a_tanh_per_score(family):
    bm, bn = BASE["block_m"], BASE["block_n"]
    p = _plan(family, dict(variant="full", window=0), dict(variant="softcap", window=0))
    assert p.work_iter[1, 1] - p.work_iter[0, 1] == pytest.approx(2 * 2 * bm * bn)
    assert p.work_iter[1, 2] - p.work_iter[0, 2] == pytest.approx(bm * bn)
    assert p.ksteps[1] == p.ksteps[0] and p.useful_flops[1] == p.useful_flops[0]


@pytest.mark.parametrize("family", sorted(HW))
def test_variant_orderings(family):
    rows = [dict(variant="full", window=0), dict(variant="sliding_window", window=4096),
            dict(variant="sliding_window", window=1024), dict(variant="sliding_window", window=128),
            dict(variant="softcap", window=0),
            dict(variant="sliding_window", window=10**6)]
    lat = evaluate(_rows(family, *rows), HW[family], family)["latency_us"].to_list()
    assert lat[0] >= lat[1] >= lat[2] >= lat[3]
    assert lat[4] >= lat[0]
    assert lat[5] == lat[0]  # a window wider than the sequence is no window


@pytest.mark.parametrize("family", sorted(HW))
def test_variant_rules(family):
    res = evaluate(_rows(family, dict(variant="sliding_window", window=0),
                         dict(variant="full", window=64), dict(variant="softcap", window=8)),
                   HW[family], family)
    assert not res["feasible"].any() and res["latency_us"].null_count() == 3
    assert "needs window > 0" in res["infeasible_reason"][0]
    assert "window is the key span" in res["infeasible_reason"][1]
    assert "window is the key span" in res["infeasible_reason"][2]


def test_unknown_variant_is_an_input_error():
    from tsbatch.errors import InputError

    with pytest.raises(InputError, match="variant"):
        evaluate(_rows("attention", dict(variant="alibi", window=0)), "a100", "attention")
