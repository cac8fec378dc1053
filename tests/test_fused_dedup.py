"""The fused families evaluate each distinct compute chunk once (issue 35, session 8), and
the collectives model groups its rows into plans without a join: the same figures as
evaluating every row on its own, to the bit."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from kernels_catalog.fused_comm import _Reasons, evaluate_fused
from tsbatch.collectives import model as coll_model
from tsbatch.engine.evaluate import evaluate as eval_compute

GEMM_TILE = dict(dtype="float16", block_m=128, block_n=128, block_k=64, num_stages=3, num_warps=8)
ATTN_TILE = dict(dtype="bfloat16", block_m=128, block_n=64, num_stages=2, num_warps=4)
MOE_TILE = dict(dtype="bfloat16", block_m=64, block_n=128, block_k=64, num_stages=3, num_warps=4)


def _rows(family: str) -> list[dict]:
    """Rows sharing compute chunks (equal num_gpus x chunks, repeated rows), on two GPUs,
    with rows infeasible before their compute (sizes not divisible) and by their collective."""
    out = []
    for system in ("dgx_h100", "dgx_a100", "hgx_h100_4gpu"):
        for tp, c in ((2, 4), (4, 2), (8, 1), (2, 2), (4, 1), (4, 2), (3, 1)):
            if family in ("ag_gemm", "gemm_rs"):
                out.append(dict(system=system, m=2048, n=1024, k=2048, **GEMM_TILE, num_gpus=tp, chunks=c))
                out.append(dict(system=system, m=2048 + 128, n=1024, k=2048 + 8, **GEMM_TILE,
                                num_gpus=tp, chunks=c))
            elif family == "ulysses":
                out.append(dict(system=system, batch=1, heads=32, seq_len=4096, head_dim=128, **ATTN_TILE,
                                causal=(c == 2), num_gpus=tp, chunks=c))
                out.append(dict(system=system, batch=2, heads=24, seq_len=4112, head_dim=128, **ATTN_TILE,
                                causal=False, num_gpus=tp, chunks=c))
            else:
                out.append(dict(system=system, tokens=1024, hidden=2048, ffn=1024, experts=16, top_k=2,
                                **MOE_TILE, num_gpus=tp, chunks=c))
                out.append(dict(system=system, tokens=1032, hidden=2048, ffn=768, experts=32, top_k=2,
                                **MOE_TILE, num_gpus=tp, chunks=c))
    return out


def _bits_equal(a: pl.DataFrame, b: pl.DataFrame) -> None:
    assert a.columns == b.columns and a.height == b.height
    for c in a.columns:
        x, y = a[c], b[c]
        if x.dtype.is_float():
            assert np.array_equal(x.to_numpy().view(np.int64), y.to_numpy().view(np.int64)), c
        else:
            assert x.equals(y), c


@pytest.mark.parametrize("family", ["ag_gemm", "gemm_rs", "ulysses", "moe_ep"])
def test_each_distinct_chunk_once_and_rows_as_alone(family):
    rows = _rows(family)
    frame = pl.DataFrame(rows)
    seen: list[pl.DataFrame] = []

    def engine(sub, hw, family):
        seen.append(sub)
        return eval_compute(sub, hw, family=family)

    out = evaluate_fused(frame, family, engine)
    # every call's rows are distinct, one call per GPU
    assert seen and all(not s.is_duplicated().any() for s in seen)
    assert len(seen) <= 2
    # the batch gave each row what it gets alone, to the bit
    alone = pl.concat([evaluate_fused(frame[i:i + 1], family, eval_compute) for i in range(frame.height)])
    _bits_equal(out, alone)
    # the table holds feasible rows, rows infeasible before their compute and by the collective
    reasons = out["infeasible_reason"].to_list()
    assert out["feasible"].any()
    assert any(r and "divisible" in r for r in reasons)
    assert any(r and "nodes" in r for r in reasons)


@pytest.mark.parametrize("family", ["gemm_rs", "ulysses", "moe_ep"])
@pytest.mark.parametrize("why", ["sizes", "collective"])
def test_rows_infeasible_before_compute_are_not_evaluated(family, why):
    if why == "sizes":
        rows = [r for r in _rows(family) if r["num_gpus"] == 3]  # nothing divides by 3
    else:  # 8 GPUs on a 4-GPU system without a network: the collective cannot run
        rows = [r for r in _rows(family) if r["num_gpus"] == 8 and r["system"] == "hgx_h100_4gpu"]
    calls: list[int] = []

    def engine(sub, hw, family):
        calls.append(sub.height)
        return eval_compute(sub, hw, family=family)

    out = evaluate_fused(pl.DataFrame(rows), family, engine)
    assert not out["feasible"].any()
    assert calls == []
    assert out["chunk_compute_us"].is_nan().all()


def test_reasons_keep_the_first():
    r = _Reasons(4)
    r.set(np.array([True, False, True, False]), "a")
    r.set(np.array([True, True, False, False]), "b")
    r.set(np.array([False, False, False, False]), "c")
    assert r.series().to_list() == ["a", "b", "a", None]
    assert r.none().tolist() == [False, False, False, True]


def _plan_index_by_join(df: pl.DataFrame) -> np.ndarray:
    """The plain twin: unique keys in order of first appearance, a left join."""
    keys = df.select(coll_model._KEY).unique(maintain_order=True).with_row_index("_plan")
    return df.join(keys, on=coll_model._KEY, how="left", nulls_equal=True,
                   maintain_order="left")["_plan"].to_numpy().astype(np.int64)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_plan_index_matches_unique_and_join(seed):
    rng = np.random.default_rng(seed)
    n = 500
    pick = lambda vals: rng.choice(np.array(vals, dtype=object), n).tolist()  # noqa: E731
    frame = pl.DataFrame({
        "system": pick(["dgx_h100", "dgx_a100", "hgx_b200"] if seed else ["dgx_h100"]),
        "collective": pick(["all_reduce", "all_gather", "all_to_all"]),
        "num_gpus": pick([2, 4, 8, 16]),
        "bytes": rng.integers(1, 1 << 30, n),
        "algorithm": pick([None, "ring", "tree", "auto", "RING"]),
        "protocol": pick([None, "ll", "simple"] if seed != 2 else [None]),
        "channels": pl.Series(pick([None, 2, 4]), dtype=pl.Int64),
    })
    for part in (frame, frame.filter(pl.col("system") == "dgx_h100").select(
            "system", "num_gpus", "bytes", "channels", collective=pl.lit("all_to_all"))):
        df = coll_model.validate(part)
        inv, keys = coll_model._plan_index(df)
        assert np.array_equal(inv, _plan_index_by_join(df))
        assert keys.equals(df.select(coll_model._KEY).unique(maintain_order=True))
    inv1, keys1 = coll_model._plan_index(coll_model.validate(frame.head(1)))
    assert inv1.tolist() == [0] and keys1.height == 1


@pytest.mark.parametrize("family", ["ag_gemm", "gemm_rs", "ulysses", "moe_ep"])
def test_zero_rows_give_zero_rows(family):
    """An empty table: an empty result with the columns and types of a full one (it raised
    an IndexError: the system codes of no rows were not an integer array)."""
    frame = pl.DataFrame(_rows(family)[:1])
    one = eval_compute(frame, "h100", family=family)
    none = eval_compute(frame.head(0), "h100", family=family)
    assert none.height == 0 and none.schema == one.schema
