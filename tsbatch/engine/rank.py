"""Ranking: per workload, order candidates by predicted latency and keep the top k %.

Ties are broken by the candidate's position in its input (stable), so the
ranking is deterministic and independent of how rows were batched.
Infeasible rows rank after every feasible one and are never kept.
"""

from __future__ import annotations

import math

import polars as pl

from tsbatch.errors import InputError

__all__ = ["parse_top", "rank", "keep_count"]


def parse_top(text: str | float | None) -> float:
    """``'5%'`` -> 0.05, ``'0.05'`` -> 0.05, ``None``/``'100%'``/``'all'`` -> 1.0."""
    if text is None:
        return 1.0
    if isinstance(text, (int, float)):
        frac = float(text)
    else:
        t = text.strip().lower()
        if t in ("all", ""):
            return 1.0
        try:
            frac = float(t[:-1]) / 100.0 if t.endswith("%") else float(t)
        except ValueError:
            raise InputError(f"--top must be a percentage like '5%' or a fraction like 0.05, "
                             f"got {text!r}") from None
    if not (0.0 < frac <= 1.0):
        raise InputError(f"--top must be in (0, 100%], got {text!r}")
    return frac


def keep_count(n: int, frac: float) -> int:
    """Rows kept of a workload with ``n`` candidates: ``max(1, ceil(frac n))``."""
    return max(1, math.ceil(frac * n - 1e-9))


def rank(results: pl.DataFrame, workload: list[str] | tuple[str, ...], top: float = 1.0,
         order_col: str | None = None, count_col: str | None = None) -> pl.DataFrame:
    """Add ``rank`` (1 = fastest within its workload) and keep the top fraction.

    ``order_col`` names a column holding each row's original position
    (for ties); by default the current row order is used. ``count_col``
    names a column holding each row's workload size ``n`` (for the kept
    count), when ``results`` holds only part of each workload's rows: a
    prefix of its ``(latency, position)`` order, as
    :class:`tsbatch.engine.screen.TopKScreen` keeps; by default the rows present
    are counted. ``count_col`` is dropped from the output.
    """
    wl = [c for c in workload if c in results.columns]
    df = results
    if order_col is None:
        df = df.with_row_index("_pos")
        order_col = "_pos"
    key = pl.when(pl.col("feasible")).then(pl.col("latency_us")).otherwise(float("inf"))
    df = df.with_columns(_key=key.fill_null(float("inf")))
    over = wl if wl else None
    n_rows = pl.len().over(over) if over else pl.len()
    n_expr = pl.col(count_col) if count_col else n_rows
    if over:
        df = df.with_columns(
            _n=n_expr,
            _nfeas=pl.col("feasible").sum().over(over),
            rank=pl.struct("_key", order_col).rank("ordinal").over(over).cast(pl.Int64),
        )
    else:
        df = df.with_columns(_n=n_expr,
                             _nfeas=pl.col("feasible").sum(),
                             rank=pl.struct("_key", order_col).rank("ordinal").cast(pl.Int64))
    keep = (pl.col("_n") * top - 1e-9).ceil().clip(lower_bound=1)
    df = df.filter((pl.col("rank") <= keep) & pl.col("feasible"))
    sort_cols = (wl or []) + ["rank"]
    df = df.sort(sort_cols)
    helpers = ("_key", "_n", "_nfeas", "_pos", count_col)
    return df.drop([c for c in dict.fromkeys(helpers) if c and c in df.columns])
