"""End-to-end accuracy: measured serving files (``shared/data/e2e``) against predictions.

``tsbatch accuracy e2e/pipeweave_vllm_dev.parquet`` routes here when every file given
has the e2e columns (``prefill_ms``, ``decode_step_ms``, ``total_ms``): MAPE and WMAPE
of prefill time, decode step time and total time, per GPU and per configuration.

:func:`fit_engine` fits the engine profile's four composition constants (per-op gap in
prefill and in decode, per-step overhead in prefill and in decode) by nonnegative least
squares of the relative error on the rows given; bench/e2e_accuracy.py uses it for the
dev fit and the leave-one-GPU-out figures.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from tsbatch.errors import InputError

__all__ = ["E2E_COLUMNS", "is_e2e_file", "load_e2e", "score", "fit_engine", "run_e2e"]

E2E_COLUMNS = ("gpu", "gpus_per_node", "tp", "pp", "model", "batch", "prompt_tokens",
               "output_len", "prefill_ms", "decode_step_ms", "total_ms")


def is_e2e_file(path) -> bool:
    try:
        import pyarrow.parquet as pq

        names = set(pq.read_schema(str(path)).names)
    except Exception:  # noqa: BLE001 - not a Parquet file we can read: not e2e
        return False
    return {"prefill_ms", "decode_step_ms", "total_ms"} <= names


def system_for(gpu: str, gpus_per_node: int) -> str:
    """The hw/systems file a measured machine is described by."""
    from tsbatch.collectives.systems import list_systems

    have = set(list_systems())
    if gpu == "h100" and gpus_per_node == 4:
        # the 4-GPU NVLink node without NVSwitch; dgx_h100 until its file exists
        return "hgx_h100_4gpu" if "hgx_h100_4gpu" in have else "dgx_h100"
    if gpu == "a100" and gpus_per_node == 8:
        return "dgx_a100"
    if gpu in ("h100", "h100_sxm") and gpus_per_node == 8:
        return "dgx_h100"
    return gpu


def load_e2e(path) -> pl.DataFrame:
    """A measured e2e file with a deployment per row (``model, system, tp, pp, batch,
    prompt_len, output_len, engine``)."""
    p = Path(path)
    try:
        df = pl.read_parquet(p)
    except Exception as exc:  # noqa: BLE001
        raise InputError(f"{p}: cannot read as Parquet ({exc})") from None
    miss = [c for c in E2E_COLUMNS if c not in df.columns]
    if miss:
        raise InputError(f"{p}: column {miss[0]!r} is missing (e2e files need "
                         f"{', '.join(E2E_COLUMNS)})")
    sysmap = {(g, n): system_for(g, n) for g, n in df.select("gpu", "gpus_per_node").unique()
              .iter_rows()}
    systems = [sysmap[(g, n)] for g, n in zip(df["gpu"], df["gpus_per_node"])]
    if "prompt_len_rms" not in df.columns:  # per-request prompt lengths not recorded
        df = df.with_columns(pl.lit(0, pl.Int64).alias("prompt_len_rms"))
    return df.with_columns(
        pl.Series("system", systems, dtype=pl.String),
        (pl.col("prompt_tokens") // pl.col("batch")).alias("prompt_len"),
        pl.lit("vllm").alias("engine") if "engine" not in df.columns else pl.col("engine"),
        pl.lit("bf16").alias("weights"),
    )


def _metrics(pred: np.ndarray, meas: np.ndarray) -> tuple[float, float]:
    ape = np.abs(pred - meas) / meas
    return 100.0 * float(ape.mean()), 100.0 * float(np.abs(pred - meas).sum() / meas.sum())


def score(rows: pl.DataFrame, pred: pl.DataFrame) -> pl.DataFrame:
    """MAPE and WMAPE per GPU (and ``all``) of prefill, decode step and total time."""
    j = rows.select("gpu", "prefill_ms", "decode_step_ms", "total_ms").with_columns(
        pred["prefill_ms"].alias("p_prefill"), pred["decode_step_ms"].alias("p_decode"),
        pred["total_ms"].alias("p_total"))
    out = []
    for gpu in sorted(j["gpu"].unique().to_list()) + ["all"]:
        s = j if gpu == "all" else j.filter(pl.col("gpu") == gpu)
        row = {"gpu": gpu, "rows": s.height}
        for what, m, p in (("prefill", "prefill_ms", "p_prefill"),
                           ("decode_step", "decode_step_ms", "p_decode"),
                           ("total", "total_ms", "p_total")):
            ok = s[p].is_not_null() & s[p].is_finite()
            a, w = _metrics(s[p].filter(ok).to_numpy(), s[m].filter(ok).to_numpy()) \
                if ok.any() else (float("nan"), float("nan"))
            row[f"{what}_mape"] = a
            row[f"{what}_wmape"] = w
        out.append(row)
    return pl.DataFrame(out)


def _nnls2(a: np.ndarray, b: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """min sum ((x a + z b - y))^2 over x, z >= 0 (two columns, by cases)."""
    best = (0.0, 0.0, float((y ** 2).sum()))
    A = np.column_stack([a, b])
    try:
        x, z = np.linalg.lstsq(A, y, rcond=None)[0]
        if x >= 0 and z >= 0:
            return float(x), float(z)
    except np.linalg.LinAlgError:  # pragma: no cover
        pass
    for col, other in ((a, 0), (b, 1)):
        d = float(col @ col)
        v = max(0.0, float(col @ y) / d) if d > 0 else 0.0
        r = float(((v * col - y) ** 2).sum())
        if r < best[2]:
            best = (v, 0.0, r) if other == 0 else (0.0, v, r)
    return best[0], best[1]


def fit_engine(rows: pl.DataFrame) -> dict:
    """The four composition constants fitted on measured rows (relative least squares).

    Returns ``gap_prefill_us, step_prefill_us, gap_decode_us, step_decode_us``.
    """
    from tsbatch.serving.deploy import resolve
    from tsbatch.serving.predict import predict_ops

    dep = resolve(rows.select("model", "system", "tp", "pp", "batch", "prompt_len",
                              "prompt_len_rms", "output_len", "engine", "weights"))
    dep = dep.with_columns(pl.lit(0.0).alias(k) for k in
                           ("gap_prefill_us", "gap_decode_us", "step_prefill_us",
                            "step_decode_us"))
    ops = predict_ops(dep)
    from tsbatch.serving.predict import step_points

    per = ops.group_by("dep", "phase", "point").agg((pl.col("mult") * pl.col("t_us")).sum()
                                                   .alias("body"), pl.col("mult").sum().alias("n"))
    p = step_points(dep).join(per, on=["dep", "phase", "point"], how="left").fill_null(0)
    mid = (dep["decode_points"][0] - 1) // 2
    pre = p.filter(pl.col("phase") == "prefill").group_by("dep").agg(
        (pl.col("body") * pl.col("count")).sum().alias("body"),
        (pl.col("n") * pl.col("count")).sum().alias("n"),
        (pl.col("count") * pl.col("steps")).sum().alias("steps")).sort("dep")
    dec = p.filter((pl.col("phase") == "decode") & (pl.col("point") == mid)).sort("dep")
    y1 = rows["prefill_ms"].to_numpy() * 1e3
    y2 = rows["decode_step_ms"].to_numpy() * 1e3
    out = {}
    for (gap, step), y, t in ((("gap_prefill_us", "step_prefill_us"), y1, pre),
                              (("gap_decode_us", "step_decode_us"), y2, dec)):
        n = t["n"].to_numpy().astype(float)
        k = t["steps"].to_numpy().astype(float) if gap == "gap_prefill_us" else np.ones(len(n))
        r = y - t["body"].to_numpy()
        g, s = _nnls2(n / y, k / y, r / y)
        out[gap], out[step] = g, s
    return out


def predict_rows(rows: pl.DataFrame, constants: dict | None = None) -> pl.DataFrame:
    """Predictions for measured rows, with the engine constants replaced by ``constants``."""
    from tsbatch.serving.deploy import resolve
    from tsbatch.serving.predict import compose, predict_ops

    dep = resolve(rows.select("model", "system", "tp", "pp", "batch", "prompt_len",
                              "prompt_len_rms", "output_len", "engine", "weights"))
    if constants:
        dep = dep.with_columns(pl.lit(float(v)).alias(k) for k, v in constants.items())
    return compose(dep, predict_ops(dep, detail=False)).sort("dep")


def run_e2e(paths, json_path: str | None = None, fail_above: list[str] | None = None) -> int:
    """``tsbatch accuracy`` on e2e files: print the per-GPU and per-configuration tables.

    ``fail_above``: ``METRIC=VALUE`` (a column of the per-GPU table, e.g.
    ``prefill_mape=10``), checked on every GPU's row; 1 when any is broken."""
    import json
    import sys

    limits = []
    for t in fail_above or []:
        name, _, val = t.partition("=")
        known = [f"{w}_{m}" for w in ("prefill", "decode_step", "total") for m in ("mape", "wmape")]
        try:
            limits.append((name.strip(), float(val)))
        except ValueError:
            raise InputError(f"--fail-above {t!r}: give METRIC=VALUE, e.g. prefill_mape=10") \
                from None
        if name.strip() not in known:
            raise InputError(f"--fail-above {t!r}: end-to-end metrics are {', '.join(known)}")
    rows = pl.concat([load_e2e(p) for p in paths], how="diagonal_relaxed")
    pred = predict_rows(rows)
    tab = score(rows, pred)
    with pl.Config(tbl_rows=100, tbl_cols=30, tbl_width_chars=200, float_precision=2):
        print("end-to-end accuracy (MAPE / WMAPE, %) per GPU")
        print(tab)
        per = rows.select("gpu", "system", "tp", "model", "workload" if "workload" in rows.columns
                          else "batch", "batch", "prefill_ms", "decode_step_ms", "total_ms"
                          ).with_columns(
            pred["prefill_ms"].alias("pred_prefill_ms"),
            pred["decode_step_ms"].alias("pred_decode_ms"),
            pred["total_ms"].alias("pred_total_ms"))
        per = per.with_columns(
            (100 * (pl.col("pred_prefill_ms") / pl.col("prefill_ms") - 1)).alias("prefill_err_pct"),
            (100 * (pl.col("pred_decode_ms") / pl.col("decode_step_ms") - 1)).alias("decode_err_pct"),
            (100 * (pl.col("pred_total_ms") / pl.col("total_ms") - 1)).alias("total_err_pct"))
        print("\nper configuration")
        print(per.drop("prefill_ms", "decode_step_ms", "total_ms", "pred_prefill_ms",
                       "pred_decode_ms", "pred_total_ms"))
    if json_path:
        Path(json_path).write_text(json.dumps({"per_gpu": tab.to_dicts(),
                                               "per_configuration": per.to_dicts()}, indent=2))
    broken = [f"{name}[gpu={r['gpu']}] = {r[name]:.2f} > {lim:g}"
              for name, lim in limits for r in tab.filter(pl.col("gpu") != "all").iter_rows(named=True)
              if not r[name] <= lim]
    for b in broken:
        print(f"tsbatch accuracy: threshold broken: {b}", file=sys.stderr)
    return 1 if broken else 0
