"""The serving layer's Python API: explain one deployment, sweep many.

    from tsbatch.serving import explain_deployment, sweep_deployments, predict
    e = explain_deployment("meta-llama/Llama-3.1-70B", "dgx_h100", tp=4, batch=16,
                           prompt_len=2048, output_len=256)
    print(e)                       # per-op tables for prefill and decode
    e.plot("breakdown.png")        # stacked bars per layer op, prefill beside decode
    ranked = sweep_deployments("sweeps/serve_llm.toml")
"""

from __future__ import annotations

import dataclasses
import itertools
import tomllib
from pathlib import Path

import polars as pl

from tsbatch.errors import InputError
from tsbatch.serving.deploy import DEPLOYMENT_COLUMNS
from tsbatch.serving.predict import predict

__all__ = ["explain_deployment", "ServingExplanation", "load_sweep", "sweep_deployments",
           "rank_deployments"]


@dataclasses.dataclass(frozen=True, repr=False)
class ServingExplanation:
    result: dict            #: the deployment's result row
    ops: pl.DataFrame       #: its op rows (prefill and the median decode step)

    def table(self, phase: str) -> pl.DataFrame:
        """Per-op rows of one phase: time per step (all layers), share, bound, config."""
        o = self.ops.filter(pl.col("phase") == phase)
        if phase == "prefill":
            o = o.with_columns((pl.col("t_us") * pl.col("mult") * pl.col("count")).alias("total_us"))
        else:
            o = o.with_columns((pl.col("t_us") * pl.col("mult")).alias("total_us"))
        g = o.group_by("op_name", "family", maintain_order=True).agg(
            pl.col("order").first(), pl.col("mult").first().alias("per_step"),
            pl.col("total_us").sum(), pl.col("t_us").mean().alias("one_us"),
            pl.col("bound").first(), pl.col("config").first(), pl.col("shape").first())
        tot = g["total_us"].sum()
        return g.sort("order").with_columns(
            (100 * pl.col("total_us") / tot).alias("share_pct")).drop("order")

    def __str__(self) -> str:
        r = self.result
        head = (f"{r['model']} on {r['system']} (tp {r['tp']}, pp {r['pp']}, ep {r['ep']}, "
                f"dp {r['dp']}, {r['weights']}, engine {r['engine']}): batch {r['batch']}, "
                f"prompt {r['prompt_len']}, output {r['output_len']}")
        if not r["feasible"]:
            return f"{head}\ninfeasible: {r['infeasible_reason']}"
        lines = [head,
                 f"prefill {r['prefill_ms']:.2f} ms | decode step {r['decode_step_ms']:.3f} ms "
                 f"(median context) | total {r['total_ms']:.1f} ms | "
                 f"{r['tokens_per_s']:.1f} tok/s ({r['tokens_per_s_per_gpu']:.1f} per GPU) | "
                 f"{r['mem_gib_per_gpu']:.1f} GiB per GPU"]
        for phase in ("prefill", "decode"):
            t = self.table(phase)
            lines.append(f"\n{phase} (ops of the whole {phase if phase == 'prefill' else 'step'};"
                         f" per_step = runs per step)")
            lines.append(f"{'op':26s} {'family':16s} {'runs':>5s} {'one us':>10s} "
                         f"{'total ms':>10s} {'share':>6s}  {'bound':12s} config")
            for row in t.iter_rows(named=True):
                one = row["one_us"] if row["one_us"] is not None else float("nan")
                lines.append(f"{row['op_name']:26s} {row['family']:16s} {row['per_step']:5d} "
                             f"{one:10.2f} {row['total_us'] / 1e3:10.3f} "
                             f"{row['share_pct']:5.1f}%  {str(row['bound']):12s} {row['config']}")
        return "\n".join(lines)

    def plot(self, path: str | Path) -> Path:
        """Stacked bars of the ops' shares, prefill beside decode (PNG)."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        tabs = {ph: self.table(ph) for ph in ("prefill", "decode")}
        names = list(dict.fromkeys(tabs["prefill"]["op_name"].to_list()
                                   + tabs["decode"]["op_name"].to_list()))
        fig, ax = plt.subplots(figsize=(7, 5))
        cmap = plt.get_cmap("tab20")
        for x, (ph, t) in enumerate(tabs.items()):
            share = dict(zip(t["op_name"], t["share_pct"]))
            bottom = 0.0
            for i, n in enumerate(names):
                v = share.get(n, 0.0)
                ax.bar(x, v, bottom=bottom, color=cmap(i % 20), label=n if x == 0 or
                       n not in tabs["prefill"]["op_name"].to_list() else None)
                bottom += v
        r = self.result
        ax.set_xticks([0, 1], [f"prefill\n{r['prefill_ms']:.1f} ms",
                               f"decode step\n{r['decode_step_ms']:.2f} ms"])
        ax.set_ylabel("share of the phase's time (%)")
        ax.set_title(f"{r['model']} on {r['system']} tp{r['tp']} batch {r['batch']}", fontsize=9)
        ax.legend(fontsize=7, bbox_to_anchor=(1.02, 1), loc="upper left")
        fig.tight_layout()
        path = Path(path)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path


def explain_deployment(model, system, *, tp=1, pp=1, ep=1, dp=1, weights="bf16",
                       engine="vllm", batch=1, prompt_len=1024, output_len=128,
                       chunk_tokens=0, prompt_len_rms=0) -> ServingExplanation:
    """Predict one deployment and keep its per-op breakdown."""
    row = dict(model=[str(model)], system=[str(system)], tp=[tp], pp=[pp], ep=[ep], dp=[dp],
               weights=[weights], engine=[engine], batch=[batch], prompt_len=[prompt_len],
               output_len=[output_len], chunk_tokens=[chunk_tokens],
               prompt_len_rms=[prompt_len_rms])
    res, ops = predict(pl.DataFrame(row), return_ops=True)
    from tsbatch.serving.deploy import resolve
    from tsbatch.serving.predict import step_points

    dep = resolve(pl.DataFrame(row))
    pts = step_points(dep)
    r = res.row(0, named=True)
    if r["feasible"] and ops.height:
        mid = (int(dep["decode_points"][0]) - 1) // 2
        ops = ops.join(pts.select("dep", "phase", "point", "count"),
                       on=["dep", "phase", "point"], how="left")
        ops = ops.filter((pl.col("phase") == "prefill") | (pl.col("point") == mid))
    return ServingExplanation(result=r, ops=ops)


# ---------------------------------------------------------------- sweeps
_RANK_KEYS = ("tokens_per_s_per_gpu", "tokens_per_s", "decode_tokens_per_s")


def load_sweep(path) -> tuple[pl.DataFrame, dict]:
    """A serving sweep file: the deployments (cross product of ``[grid]``) and options
    (``[serve_sweep]``: ``name``, ``rank_by``, ``max_decode_step_ms``)."""
    p = Path(path)
    if not p.exists():
        from tsbatch.engine.sweep import sweep_dir  # built-in name

        q = sweep_dir() / "serve" / f"{Path(str(path)).stem}.toml"
        if not q.exists():
            raise InputError(f"{path}: no such serving sweep file")
        p = q
    try:
        raw = tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{p}: not valid TOML ({exc})") from None
    opts = raw.get("serve_sweep")
    grid = raw.get("grid")
    if not isinstance(opts, dict) or not isinstance(grid, dict):
        raise InputError(f"{p}: a serving sweep needs a [serve_sweep] and a [grid] table")
    for k in grid:
        if k not in DEPLOYMENT_COLUMNS:
            raise InputError(f"{p}: [grid] key {k!r} is not a deployment column; known: "
                             f"{', '.join(DEPLOYMENT_COLUMNS)}")
    for k in ("model", "system", "batch", "prompt_len", "output_len"):
        if k not in grid:
            raise InputError(f"{p}: [grid] needs {k!r}")
    axes = {k: (v if isinstance(v, list) else [v]) for k, v in grid.items()}
    for k, v in axes.items():
        if not v:
            raise InputError(f"{p}: [grid] {k!r} is empty")
    rank_by = opts.get("rank_by", "tokens_per_s_per_gpu")
    if rank_by not in _RANK_KEYS:
        raise InputError(f"{p}: [serve_sweep] rank_by {rank_by!r}; known: {', '.join(_RANK_KEYS)}")
    lim = opts.get("max_decode_step_ms")
    if lim is not None and (isinstance(lim, bool) or not isinstance(lim, (int, float)) or lim <= 0):
        raise InputError(f"{p}: [serve_sweep] max_decode_step_ms must be a positive number")
    names = list(axes)
    rows = list(itertools.product(*axes.values()))
    df = pl.DataFrame({n: [r[i] for r in rows] for i, n in enumerate(names)}, strict=False)
    return df, {"name": opts.get("name", p.stem), "rank_by": rank_by, "max_decode_step_ms": lim}


def rank_deployments(res: pl.DataFrame, rank_by: str = "tokens_per_s_per_gpu",
                     max_decode_step_ms: float | None = None) -> pl.DataFrame:
    """Feasible deployments within the latency limit, best first (``rank`` 1 = best);
    the others follow with a null rank and their reason."""
    ok = pl.col("feasible")
    if max_decode_step_ms is not None:
        ok = ok & (pl.col("decode_step_ms") <= max_decode_step_ms)
    res = res.with_row_index("_i")
    good = res.filter(ok).sort([rank_by, "_i"], descending=[True, False])
    good = good.with_columns(pl.int_range(1, good.height + 1, dtype=pl.Int64).alias("rank"))
    rest = res.filter(~ok).with_columns(pl.lit(None, dtype=pl.Int64).alias("rank"),
                                        pl.when(pl.col("feasible")).then(pl.lit(
                                            f"decode step over {max_decode_step_ms} ms"))
                                        .otherwise(pl.col("infeasible_reason"))
                                        .alias("infeasible_reason"))
    return pl.concat([good, rest], how="vertical").drop("_i")


def sweep_deployments(path_or_frame, *, rank_by: str | None = None,
                      max_decode_step_ms: float | None = None,
                      timings: dict | None = None) -> pl.DataFrame:
    """Predict and rank every deployment of a sweep file (or a deployment table)."""
    if isinstance(path_or_frame, (str, Path)):
        df, opts = load_sweep(path_or_frame)
    else:
        df, opts = path_or_frame, {"rank_by": "tokens_per_s_per_gpu", "max_decode_step_ms": None}
    rank_by = rank_by or opts["rank_by"]
    if rank_by not in _RANK_KEYS:
        raise InputError(f"rank_by {rank_by!r}; known: {', '.join(_RANK_KEYS)}")
    lim = max_decode_step_ms if max_decode_step_ms is not None else opts["max_decode_step_ms"]
    res = predict(df, timings=timings)
    return rank_deployments(res, rank_by, lim)
