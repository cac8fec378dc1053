"""Accuracy metrics of predicted against measured kernel times (polars, vectorized).

The input is a *scored* frame, one row per measured configuration (repeats
already aggregated), with the columns

``_problem``
    an integer id of the workload (one GEMM shape, layout and dtype on one
    GPU, from one file);
``_unit``
    an integer id of the set of configurations that compete with each other
    (for GEMM: the problem and its backend, so Triton tile configurations are
    ranked among themselves and the single cuBLAS row stands alone);
``measured_us``
    measured time, finite and positive;
``predicted_us``
    predicted time; ``+inf`` where the model says the configuration cannot run;
``feasible``
    the model's verdict (a feasible row with a non-finite prediction counts as
    infeasible),

plus whatever group columns the caller groups by.

Metrics (:data:`METRICS`), for one group of rows:

``rows``
    configurations in the group (feasible or not).
``problems``
    distinct problems.
``infeasible_rows``
    configurations the model marks infeasible; they are left out of the error
    metrics but stay in the ranking metrics with a predicted time of ``+inf``.
``mape_pct``
    mean of ``|pred - meas| / meas`` over feasible rows, in percent.
``wmape_pct``
    ``sum |pred - meas| / sum meas`` over feasible rows, in percent.
``median_ape_pct``
    median of the same ratio, in percent.
``spearman``
    rank correlation between predicted and measured time within each unit,
    over its feasible rows, averaged over units with at least
    :data:`SPEARMAN_MIN_CONFIGS` of them. Ties take their average rank. When
    either side is constant inside a unit the correlation is undefined and
    counts as 0 (the prediction orders nothing).
``top5_retention_pct``
    per unit with at least two configurations: keep the predicted-fastest
    ``max(1, ceil(5 % of its configurations))``; 100 × measured-best among
    all / measured-best among those kept; averaged over units.
``top1_regret_pct``
    per unit with at least two configurations: 100 × (measured time of the
    predicted-fastest / measured-best − 1); averaged over units.

Ranking ties (equal predictions, including several ``+inf``) are broken
pessimistically: the configuration with the larger measured time is taken
first, so a model that cannot tell configurations apart gets no credit.

A metric with nothing to average over is ``None`` (``null``).
"""

from __future__ import annotations

from typing import Sequence

import polars as pl

__all__ = [
    "METRICS",
    "SPEARMAN_MIN_CONFIGS",
    "RETENTION_FRACTION_PCT",
    "accuracy_metrics",
    "keep_count",
]

#: Metric columns, in report order.
METRICS: tuple[str, ...] = (
    "rows",
    "problems",
    "infeasible_rows",
    "mape_pct",
    "wmape_pct",
    "median_ape_pct",
    "spearman",
    "top5_retention_pct",
    "top1_regret_pct",
)

#: A unit enters the Spearman average only with at least this many feasible
#: configurations (issue 3).
SPEARMAN_MIN_CONFIGS = 5

#: The share of a unit's configurations kept by the pruning that
#: ``top5_retention_pct`` scores, in percent.
RETENTION_FRACTION_PCT = 5

_ALL = "_all"


def keep_count(n_configs: int) -> int:
    """Configurations kept by top-5 % pruning: ``max(1, ceil(5 % of n))``, in integers."""
    return max(1, (n_configs * RETENTION_FRACTION_PCT + 99) // 100)


def accuracy_metrics(scored: pl.DataFrame, by: Sequence[str] = ()) -> pl.DataFrame:
    """Metrics of :data:`METRICS` per group of ``by`` (overall when empty).

    Parameters
    ----------
    scored : polars.DataFrame
        One row per configuration, with ``_problem``, ``_unit``,
        ``measured_us``, ``predicted_us``, ``feasible`` and the ``by`` columns.
    by : sequence of str
        Group columns. Units should nest inside groups (every group column is
        constant within a unit); where they do not, a unit is split by group.

    Returns
    -------
    polars.DataFrame
        The ``by`` columns (sorted) followed by the metric columns.
    """
    by = list(by)
    keys = by if by else [_ALL]
    df = scored.lazy()
    if not by:
        df = df.with_columns(pl.lit(0, dtype=pl.Int8).alias(_ALL))
    df = df.with_columns(
        pl.col("measured_us").cast(pl.Float64),
        pl.col("predicted_us").cast(pl.Float64).fill_null(float("inf")).fill_nan(float("inf")),
    ).with_columns(
        _ok=pl.col("feasible").fill_null(False) & pl.col("predicted_us").is_finite(),
    ).with_columns(
        pl.when(pl.col("_ok")).then(pl.col("predicted_us")).otherwise(float("inf")).alias("predicted_us"),
        _abs_err=pl.when(pl.col("_ok")).then((pl.col("predicted_us") - pl.col("measured_us")).abs()),
    ).with_columns(_ape=pl.col("_abs_err") / pl.col("measured_us"))

    # ---- row-level metrics -------------------------------------------------
    row_metrics = df.group_by(keys).agg(
        rows=pl.len(),
        problems=pl.col("_problem").n_unique(),
        infeasible_rows=(~pl.col("_ok")).sum(),
        mape_pct=100.0 * pl.col("_ape").mean(),
        wmape_pct=100.0
        * pl.col("_abs_err").sum()
        / pl.col("measured_us").filter(pl.col("_ok")).sum(),
        median_ape_pct=100.0 * pl.col("_ape").median(),
        _n_ok=pl.col("_ok").sum(),
    ).with_columns(
        # no feasible row: the error metrics are undefined, not 0
        *[
            pl.when(pl.col("_n_ok") > 0).then(pl.col(c)).alias(c)
            for c in ("mape_pct", "wmape_pct", "median_ape_pct")
        ]
    ).drop("_n_ok")

    unit_keys = keys + ["_unit"]

    # ---- Spearman within units --------------------------------------------
    ranked = (
        df.filter(pl.col("_ok"))
        .with_columns(_n=pl.len().over(unit_keys))
        .filter(pl.col("_n") >= SPEARMAN_MIN_CONFIGS)
        .with_columns(
            _rp=pl.col("predicted_us").rank("average").over(unit_keys),
            _rm=pl.col("measured_us").rank("average").over(unit_keys),
        )
    )
    spearman_units = ranked.group_by(unit_keys).agg(
        _rho=pl.corr("_rp", "_rm", method="pearson")
    ).with_columns(
        # constant ranks on either side: undefined correlation, scored as 0
        pl.col("_rho").fill_nan(0.0).fill_null(0.0)
    )
    spearman = spearman_units.group_by(keys).agg(spearman=pl.col("_rho").mean())

    # ---- top-5 % retention and top-1 regret -------------------------------
    ordered = (
        df.with_columns(_n=pl.len().over(unit_keys))
        .filter(pl.col("_n") >= 2)
        .sort(
            [*unit_keys, "predicted_us", "measured_us"],
            descending=[*([False] * len(unit_keys)), False, True],
            nulls_last=True,
        )
        .with_columns(_pos=pl.int_range(pl.len()).over(unit_keys))
        .with_columns(
            _k=pl.max_horizontal((pl.col("_n") * RETENTION_FRACTION_PCT + 99) // 100, pl.lit(1))
        )
    )
    rank_units = ordered.group_by(unit_keys).agg(
        _best=pl.col("measured_us").min(),
        _best_kept=pl.col("measured_us").filter(pl.col("_pos") < pl.col("_k")).min(),
        _top1=pl.col("measured_us").filter(pl.col("_pos") == 0).first(),
    )
    ranking = rank_units.group_by(keys).agg(
        top5_retention_pct=(100.0 * pl.col("_best") / pl.col("_best_kept")).mean(),
        top1_regret_pct=(100.0 * (pl.col("_top1") / pl.col("_best") - 1.0)).mean(),
    )

    out = (
        row_metrics.join(spearman, on=keys, how="left")
        .join(ranking, on=keys, how="left")
        .sort(keys)
        .collect()
    )
    out = out.select(*keys, *METRICS).with_columns(
        pl.col("rows", "problems", "infeasible_rows").cast(pl.Int64),
        pl.col(
            "mape_pct", "wmape_pct", "median_ape_pct", "spearman",
            "top5_retention_pct", "top1_regret_pct",
        ).cast(pl.Float64),
    )
    if not by:
        out = out.drop(_ALL)
    return out
