"""Hypothesis strategies shared by the kernel and evaluator tests.

``gemm_row`` / ``gemm_frames``: GEMM candidate rows as ``evaluate`` takes
them (sizes, power-of-two tiles, stages 1-6, warps 1/2/4/8, ``group_m``,
``raster``, ``split_k``, layouts, optional library rows).

``cache_problems``: GEMM-shaped problems for
:func:`tsbatch.kernels.reuse.cache_hit_rates` (A reused along grid dim 1,
B along dim 0, C stored once per tile) as a dict of scalars; see
:func:`cache_args` to turn a list of them into the kernel's arguments.
"""

from __future__ import annotations

import math

import polars as pl
from hypothesis import strategies as st

from kernels_catalog.gemm import DTYPES
from tsbatch.kernels.order import ORDER_NAMES

#: GEMM tensor accesses: A (reuse dim 1, per step), B (reuse dim 0, per step), C (once)
GEMM_MASK = (0b010, 0b001, 0b000)
GEMM_PER_STEP = (1, 1, 0)

ROW, COL, GROUPED, ZORDER, PERSISTENT = (ORDER_NAMES[k] for k in
                                         ("row", "col", "grouped", "zorder", "persistent"))


def pow2(lo: int, hi: int):
    """Powers of two ``2**lo .. 2**hi``."""
    return st.integers(lo, hi).map(lambda e: 2 ** e)


# ----------------------------------------------------------------------
# GEMM candidate rows
# ----------------------------------------------------------------------
@st.composite
def gemm_row(draw, max_size: int = 4096, library: bool = True) -> dict:
    """One GEMM candidate row (a dict of the family's columns).

    With ``library`` a row is now and then a ``cublas`` row whose tile
    columns are null (it is predicted as the best catalog tile).
    """
    row = dict(
        m=draw(st.integers(1, max_size)),
        n=draw(st.integers(1, max_size)),
        k=draw(st.integers(1, max_size)),
        dtype=draw(st.sampled_from(sorted(DTYPES))),
        a_row_major=draw(st.booleans()),
        b_row_major=draw(st.booleans()),
        tf32=draw(st.booleans()),
        backend="triton",
        block_m=draw(pow2(4, 8)),
        block_n=draw(pow2(4, 8)),
        block_k=draw(pow2(4, 7)),
        num_stages=draw(st.integers(1, 6)),
        num_warps=draw(st.sampled_from([1, 2, 4, 8])),
        group_m=draw(pow2(0, 4)),
        raster=draw(st.sampled_from(sorted(ORDER_NAMES))),
        split_k=draw(st.sampled_from([1, 1, 2, 4, 8])),
    )
    if library and draw(st.integers(0, 9)) == 0:
        row["backend"] = "cublas"
        for c in ("block_m", "block_n", "block_k", "num_stages", "num_warps"):
            row[c] = None
    return row


GEMM_SCHEMA = {
    "m": pl.Int64, "n": pl.Int64, "k": pl.Int64, "dtype": pl.String,
    "a_row_major": pl.Boolean, "b_row_major": pl.Boolean, "tf32": pl.Boolean,
    "backend": pl.String, "block_m": pl.Int64, "block_n": pl.Int64, "block_k": pl.Int64,
    "num_stages": pl.Int64, "num_warps": pl.Int64, "group_m": pl.Int64, "raster": pl.String,
    "split_k": pl.Int64,
}


def frame(rows: list[dict]) -> pl.DataFrame:
    """Rows as a candidate frame with a fixed schema (null tile columns stay Int64)."""
    return pl.DataFrame(rows, schema=GEMM_SCHEMA)


def gemm_frames(min_rows: int = 1, max_rows: int = 6, max_size: int = 4096, library: bool = True):
    """Candidate frames of ``min_rows..max_rows`` GEMM rows."""
    return st.lists(gemm_row(max_size=max_size, library=library), min_size=min_rows,
                    max_size=max_rows).map(frame)


@st.composite
def infeasible_gemm_row(draw) -> dict:
    """A triton row whose shared-memory ring cannot fit any GPU (>= 320 KiB):
    e.g. block 256x256x128, 5 stages, fp32. Its sizes are multiples of 8, so
    both operands' rows start 16-byte aligned and Triton pipelines both (an
    operand loaded under 4 bytes a thread holds one buffer, not a ring)."""
    row = draw(gemm_row(library=False))
    row.update(m=8 * row["m"], n=8 * row["n"], k=8 * row["k"])
    dtype = draw(st.sampled_from(["float32", "float16", "bfloat16"]))
    row.update(block_m=256, block_n=256, num_stages=draw(st.integers(3, 6)), dtype=dtype,
               block_k=draw(st.sampled_from([64, 128])) if dtype == "float32" else 128)
    eb = DTYPES[row["dtype"]][0]
    assert row["num_stages"] * (2 * 256 * row["block_k"]) * eb >= 320 * 1024
    return row


# ----------------------------------------------------------------------
# cache problems
# ----------------------------------------------------------------------
@st.composite
def cache_problems(draw, max_grid: int = 6, max_g2: int = 2, max_k: int = 4,
                   l15: bool = True, exact_layout: bool = False) -> dict:
    """A small GEMM-shaped cache problem.

    Capacities are drawn strictly above ``assoc`` blocks (``A / B < 1``), the
    range where the SDCM's Eq. 7 is defined (the single-set rule below it is
    checked on its own: ``test_kernels.py``, ``test_single_set_matches_twin``). With ``exact_layout`` the wave size is chosen so
    that the union approximation of ``reuse.py`` is exact (see
    :func:`union_exact`).
    """
    g0 = draw(st.integers(1, max_grid))
    g1 = draw(st.integers(1, max_grid))
    g2 = draw(st.integers(1, max_g2))
    order = draw(st.sampled_from([ROW, COL, GROUPED, ZORDER, PERSISTENT]))
    group = draw(st.sampled_from([1, 2, 3, 4, 8]))
    P = g0 * g1 * g2
    if exact_layout:
        kind = draw(st.sampled_from(["single", "aligned"]))
        if kind == "single" or order == ZORDER:
            conc = draw(st.integers(P, P + 4))
        elif order == ROW:
            conc = g1 * draw(st.integers(1, g0 * g2))
        elif order == COL:
            conc = g0 * draw(st.integers(1, g1 * g2))
        else:
            gm = min(group, g0)
            if g2 > 1 and g0 % gm:
                g0 = gm * max(1, g0 // gm)  # no partial panel inside the sequence
                P = g0 * g1 * g2
            conc = gm * g1 * draw(st.integers(1, max(1, P // (gm * g1))))
    else:
        conc = draw(st.integers(1, P + 2))
    ksteps = draw(st.integers(1, max_k))
    a = draw(st.sampled_from([128, 256, 512, 1024, 2048]))
    b = draw(st.sampled_from([128, 256, 512, 1024, 2048]))
    c = draw(st.sampled_from([256, 1024, 4096]))
    unit = (a + b) / 2.0
    assoc2 = float(draw(st.sampled_from([1, 2, 4, 8, 16])))
    blocks2 = draw(st.floats(assoc2 * 1.05, 400.0))
    prob = dict(g0=g0, g1=g1, g2=g2, order=order, group=group, conc=conc, ksteps=ksteps,
                tbytes=(float(a), float(b), float(c)), cap2=blocks2 * unit, assoc2=assoc2,
                nsm=1, g15=0, cap15=0.0, assoc15=0.0)
    if l15 and draw(st.booleans()):
        assoc15 = float(draw(st.sampled_from([2, 4, 8])))
        prob.update(nsm=draw(st.integers(1, 8)), g15=draw(st.integers(1, 4)),
                    assoc15=assoc15, cap15=draw(st.floats(assoc15 * 1.05, 40.0)) * unit)
    return prob


def union_exact(p: dict) -> bool:
    """Where ``reuse.py``'s cross-wave union of blocks is exact, not an upper bound.

    Found by comparing with the unsampled naive model (test_kernels.py):
    exact when there is a single wave, or when every wave is made of whole
    row panels (row order, ``conc`` a multiple of ``g1``), whole columns (col
    order, ``conc`` a multiple of ``g0``) or whole super-groups (grouped and
    persistent orders, ``conc`` a multiple of ``min(group, g0) * g1``, and no
    partial group inside the sequence). Then no block skips a wave, every
    cross-wave reuse comes from the previous wave, and the blocks touched
    after a block in its old wave and before it in its new wave are disjoint.
    """
    P = p["g0"] * p["g1"] * p["g2"]
    if p["conc"] >= P:
        return True
    if p["order"] == ROW:
        return p["conc"] % p["g1"] == 0
    if p["order"] == COL:
        return p["conc"] % p["g0"] == 0
    if p["order"] in (GROUPED, PERSISTENT):
        gm = min(p["group"], p["g0"])
        return p["conc"] % (gm * p["g1"]) == 0 and (p["g0"] % gm == 0 or p["g2"] == 1)
    return False


def l15_groups_per_wave(p: dict) -> int:
    """SM groups of the L1.5 tier that a full wave touches (1 when no L1.5)."""
    if p["g15"] <= 0 or p["cap15"] <= 0 or p["assoc15"] <= 0:
        return 1
    slots = min(p["conc"], p["g0"] * p["g1"] * p["g2"])
    return len({(s % p["nsm"]) // p["g15"] for s in range(slots)})


def cache_args(problems: list[dict]) -> tuple:
    """``cache_hit_rates`` positional arguments for a list of problems."""
    col = lambda k: [p[k] for p in problems]  # noqa: E731
    n = len(problems)
    return (col("g0"), col("g1"), col("g2"), col("order"), col("group"), col("conc"),
            col("ksteps"), [list(GEMM_MASK)] * n, [list(GEMM_PER_STEP)] * n,
            [list(p["tbytes"]) for p in problems], col("cap2"), col("assoc2"), col("nsm"),
            col("g15"), col("cap15"), col("assoc15"))


def naive_args(p: dict) -> tuple:
    """:func:`naive.cache_hit_rates_one` positional arguments for one problem."""
    return (p["g0"], p["g1"], p["g2"], p["order"], p["group"], p["conc"], p["ksteps"],
            GEMM_MASK, GEMM_PER_STEP, p["tbytes"], p["cap2"], p["assoc2"], p["nsm"],
            p["g15"], p["cap15"], p["assoc15"])


def waves(p: dict) -> int:
    return math.ceil(p["g0"] * p["g1"] * p["g2"] / p["conc"])
