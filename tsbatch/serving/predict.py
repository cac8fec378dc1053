"""Deployments in, prefill / decode / total times and tokens per second out.

    deployments -> resolve (model, machine, engine)            deploy.py
      -> points, signatures and op rows, one frame per family  ops.py
      -> distinct op rows per family x tile candidates
      -> each family evaluated once per GPU, vectorized        tsbatch.engine.evaluate.evaluate
      -> best candidate per op row, joined back
      -> compose: op times + per-op gap + per-step overhead    (this module)

The kernel families are the same entry the Python API uses
(:func:`tsbatch.engine.evaluate.evaluate`); they know nothing of models. An op's time is the
family's ``latency_us`` less the kernel's own launch overhead (``t_launch_us``: the
measured harness's empty-kernel time, or the collective system's
``launch_overhead_us``), plus the engine's gap for the phase (eager prefill, graph
decode). A step adds the engine's per-step overhead.
"""

from __future__ import annotations

import itertools
import time

import polars as pl

from tsbatch.errors import InputError
from tsbatch.serving.deploy import resolve
from tsbatch.serving.ops import FAMILY_KEYS, points

__all__ = ["predict", "predict_ops", "RESULT_COLUMNS", "TILE_CANDIDATES"]

c = pl.col


def _grid(**axes) -> pl.DataFrame:
    names = list(axes)
    rows = list(itertools.product(*axes.values()))
    return pl.DataFrame({n: [r[i] for r in rows] for i, n in enumerate(names)})


#: the schedules each family is tried with (the engine's kernel picks the best of them)
TILE_CANDIDATES = {
    # FA-2 forward tiles (flash-attention csrc/flash_fwd_launch_template.h: 128x64 and
    # 128x128 / 4-8 warps for head_dim 64-256 on sm80) plus two smaller ones
    "attention": _grid(block_m=[128, 64], block_n=[64, 128, 32], num_stages=[2],
                       num_warps=[4, 8]),
    # FA-3 forward: 128-row CTAs of two consumer warpgroups, 64-176 key rows per step
    "attention_fa3": _grid(block_m=[128], block_n=[64, 128, 176], num_stages=[2]),
    # split-KV decode: the split count the heuristic picks from (1-32), 64/128-row KV blocks
    "flash_decoding": _grid(num_splits=[1, 2, 4, 8, 16, 32], block_n=[64, 128],
                            num_stages=[2], num_warps=[4]),
    "mla_decode": _grid(num_splits=[1, 2, 4, 8, 16, 32], block_n=[64], num_stages=[2]),
    # vLLM's fused-MoE Triton kernel is tuned per shape: the best of a small space
    "moe_grouped_gemm": _grid(block_m=[16, 32, 64, 128], block_n=[64, 128], block_k=[64],
                              num_stages=[3], num_warps=[4]),
    # the "tuned" profile's Triton GEMM catalog
    "gemm_triton": _grid(block_m=[16, 32, 64, 128], block_n=[64, 128, 256], block_k=[64],
                         num_stages=[3, 4], num_warps=[4, 8]),
}

#: what :func:`predict` adds to each deployment row
RESULT_COLUMNS = {
    "feasible": "the deployment can run (else infeasible_reason)",
    "infeasible_reason": "why not",
    "gpus": "GPUs used (tp x pp x dp)",
    "mem_gib_per_gpu": "weights + KV cache per GPU, GiB",
    "prefill_ms": "time to prefill the whole batch (all chunks)",
    "decode_step_ms": "one decode step at the median context (prompt + output / 2)",
    "decode_mean_step_ms": "mean decode step over the output",
    "total_ms": "static batch: prefill + (output_len - 1) decode steps",
    "tokens_per_s": "generated tokens per second of the whole deployment (all DP replicas)",
    "tokens_per_s_per_gpu": "tokens_per_s / gpus",
    "decode_tokens_per_s": "batch / decode_step_ms, per replica",
}


def _config_text(fam: str) -> pl.Expr:
    if fam == "gemm":
        return (pl.when(c("library_tile") != "").then(pl.concat_str(pl.lit("cublas "),
                                                                    c("library_tile")))
                .otherwise(pl.format("triton {}x{}x{}/s{}/w{}", "block_m", "block_n", "block_k",
                                     "num_stages", "num_warps")))
    if fam == "attention":
        return pl.format("fa2 {}x{}/s{}/w{}", "block_m", "block_n", "num_stages", "num_warps")
    if fam == "attention_fa3":
        return pl.format("fa3 {}x{}/s{}", "block_m", "block_n", "num_stages")
    if fam == "flash_decoding":
        return pl.format("splits {} bn {}", "num_splits", "block_n")
    if fam == "mla_decode":
        return pl.format("mla splits {}", "num_splits")
    if fam == "moe_grouped_gemm":
        return pl.format("fused_moe {}x{}x{}/s{}/w{}", "block_m", "block_n", "block_k",
                         "num_stages", "num_warps")
    if fam == "rowwise":
        return pl.format("{} t{} v{}", "op", "threads", "vec")
    if fam == "collective":
        return pl.format("nccl {}/{}", "algorithm_used", "protocol_used")
    return pl.lit("")


def _evaluate_family(fam: str, keys: pl.DataFrame, timings: dict | None,
                     hw_specs: dict | None = None) -> pl.DataFrame:
    """Best candidate per distinct key row: key columns + ``t_kernel_us, t_launch_us,
    bound, config`` (t_kernel_us null when nothing is feasible)."""
    from tsbatch.engine.evaluate import evaluate

    if fam == "custom_ar":
        return custom_ar_table(keys, hw_specs)
    keys = keys.with_row_index("_key")
    if fam == "collective":
        frame = keys.rename({"comm_system": "system"})
        res = evaluate(frame.drop("_key"), None, "collective")
        res = res.with_columns(keys["_key"], keys["comm_system"])
        res = res.with_columns(pl.lit(0.0).alias("t_launch_us"),
                               c("bottleneck_link").alias("bottleneck"))
        parts = [res]
    else:
        parts = []
        for gpu, sub in keys.partition_by("gpu", as_dict=True).items():
            gpu = gpu[0] if isinstance(gpu, tuple) else gpu
            if fam == "gemm":
                lib = sub.filter(c("impl") == "cublas").with_columns(
                    pl.lit("cublas").alias("backend"), pl.lit(True).alias("a_row_major"),
                    pl.lit(False).alias("b_row_major"))
                tri = sub.filter(c("impl") == "triton").join(
                    TILE_CANDIDATES["gemm_triton"], how="cross").with_columns(
                    pl.lit("triton").alias("backend"), pl.lit(True).alias("a_row_major"),
                    pl.lit(False).alias("b_row_major"))
                cand = pl.concat([lib, tri], how="diagonal_relaxed")
            elif fam == "rowwise":
                # one launch configuration per row, as vLLM's kernels size their blocks: 16-byte
                # vector loads, threads to cover the row (a power of two), at least a warp per
                # block (short rows share a block), at most 1024 threads
                vec = pl.when(c("dtype") == "float32").then(4).otherwise(8)
                need = (c("hidden") + vec - 1) // vec
                per_row = (2 ** need.cast(pl.Float64).log(2).ceil()).cast(pl.Int64)
                threads = per_row.clip(32, 1024)
                cand = sub.with_columns(vec.alias("vec"), threads.alias("threads"),
                                        pl.max_horizontal(threads // per_row, pl.lit(1))
                                        .alias("rows_per_block"))
            else:
                cand = sub.join(TILE_CANDIDATES[fam], how="cross") \
                    if fam in TILE_CANDIDATES else sub
            spec = (hw_specs or {}).get(gpu, gpu)
            r = evaluate(cand.drop("gpu", "impl", strict=False), spec, fam)
            parts.append(r.with_columns(cand["_key"], cand["gpu"]))
        res = pl.concat(parts, how="diagonal_relaxed")
    res = res.with_columns(_config_text(fam).alias("config"))
    if "t_launch_us" not in res.columns:
        res = res.with_columns(pl.lit(0.0).alias("t_launch_us"))
    why = res.group_by("_key").agg(c("infeasible_reason").first().alias("why"))
    res = res.filter(c("feasible") & c("latency_us").is_finite())
    # the engine's kernel time is the body without the harness's launch overhead (its own
    # gap is added per op): the best candidate is the one with the shortest body
    res = res.with_columns((c("latency_us") - c("t_launch_us").fill_null(0.0)).alias("_body"))
    best = (res.sort("_body").group_by("_key", maintain_order=True).first()
            .select("_key", c("latency_us").alias("t_kernel_us"),
                    c("t_launch_us").fill_null(0.0), c("bottleneck").alias("bound"), "config"))
    out = keys.join(best, on="_key", how="left").join(why, on="_key", how="left")
    return out.with_columns(pl.when(c("t_kernel_us").is_null()).then(c("why"))
                            .alias("why")).drop("_key")


#: vLLM's custom all-reduce kernel (csrc/custom_all_reduce.cuh): one stage (every rank
#: reads the whole message from every peer and reduces it) for 2 GPUs, and for more under
#: these sizes (bytes, by the largest world size they apply to); two stages (reduce-scatter
#: then all-gather through the peers' buffers) above
CUSTOM_AR_ONE_STAGE_BELOW = ((4, 512 * 1024), (8, 256 * 1024))


def custom_ar_table(keys: pl.DataFrame, hw_specs: dict | None = None) -> pl.DataFrame:
    """The engine's own all-reduce over NVLink P2P (vLLM's custom all-reduce), per key row
    (``gpu, comm_system, num_gpus, gpus_per_node, bytes, eager``): ``t_kernel_us`` (the
    kernel body; no launch: the engine's gap is added per op), ``stages``, ``bound``.

    One stage: each GPU reads the message from each of its n - 1 peers; two stages:
    it reads 2 (n - 1) / n of it (its slice from every peer, then every peer's reduced
    slice). The bytes cross the GPU's direct links at the system's achieved rate
    (``bw_unidir_gbps`` x ``nvlink_efficiency``): through its whole port on a switch,
    each peer's share of it on a full mesh (a pair's links carry that peer's part, the
    slowest pair sets the time). Each stage ends in a barrier: a flag written to every
    peer and polled, one link latency (``alpha_us``) plus the ranks' arrival skew
    (``rank_skew_us``); one more at the start. Outside a captured graph (``eager``, the
    prefill) the input is first copied into the registered buffer: read and written once
    at the GPU's DRAM rate. No constant here is fitted to serving data: the link figures
    are the system file's, the stage rule vLLM's.
    """
    from tsbatch.collectives.systems import get_system
    from tsbatch.hw import get_hw

    names = [n for n in keys["comm_system"].unique().to_list() if n]
    rows = []
    for n in names:
        s = get_system(n)
        lk = s.nvlink
        rows.append({"comm_system": n, "_bw": lk.bw_gbps * s.cal("nvlink_efficiency") * 1e3,
                     "_mesh": lk.topology == "mesh", "_alpha": lk.alpha_us,
                     "_skew": float(s.calibration.get("rank_skew_us", 0.0))})
    sy = pl.DataFrame(rows, schema={"comm_system": pl.String, "_bw": pl.Float64,
                                    "_mesh": pl.Boolean, "_alpha": pl.Float64,
                                    "_skew": pl.Float64})
    gpus = keys["gpu"].unique().to_list()
    gb = pl.DataFrame({"gpu": gpus, "_dram": [((hw_specs or {}).get(g) or get_hw(g))
                                             .rate("dram_bw_tbps") * 1e6 for g in gpus]},
                      schema={"gpu": pl.String, "_dram": pl.Float64})
    k = keys.join(sy, on="comm_system", how="left").join(gb, on="gpu", how="left")
    n = c("num_gpus").cast(pl.Float64)
    S = c("bytes").cast(pl.Float64)
    one = c("num_gpus") == 2
    for ws, lim in CUSTOM_AR_ONE_STAGE_BELOW:
        one = one | ((c("num_gpus") <= ws) & (c("bytes") < lim))
    pair_bw = pl.when(c("_mesh")).then(c("_bw") / (c("gpus_per_node") - 1)).otherwise(c("_bw"))
    inbound = pl.when(one).then((n - 1) * S).otherwise(2 * (n - 1) * S / n)
    per_pair = pl.when(one).then(S).otherwise(2 * S / n)
    t_link = pl.max_horizontal(inbound / c("_bw"), per_pair / pair_bw)
    t_sync = pl.when(one).then(2.0).otherwise(3.0) * (c("_alpha") + c("_skew"))
    t_copy = pl.when(c("eager")).then(2 * S / c("_dram")).otherwise(0.0)
    return k.with_columns(
        (t_sync + t_link + t_copy).alias("t_kernel_us"), pl.lit(0.0).alias("t_launch_us"),
        pl.lit("p2p link").alias("bound"),
        pl.when(one).then(pl.lit("vllm custom_ar 1-stage"))
        .otherwise(pl.lit("vllm custom_ar 2-stage")).alias("config"),
        pl.lit(None, pl.String).alias("why"),
    ).drop("_bw", "_mesh", "_alpha", "_skew", "_dram")


#: the op table's columns when no deployment is feasible
_OPS_SCHEMA = {"dep": pl.Int64, "phase": pl.String, "point": pl.Int32, "op_name": pl.String,
               "part": pl.String, "order": pl.Int32, "mult": pl.Int64, "family": pl.String,
               "op_flops": pl.Float64, "op_bytes": pl.Float64, "t_kernel_us": pl.Float64,
               "t_launch_us": pl.Float64, "why": pl.String, "bound": pl.String, "config": pl.String,
               "shape": pl.String}


def _roofline_family(fam: str, keys: pl.DataFrame, hw_specs: dict | None) -> pl.DataFrame:
    """A roofline's time per distinct key row (the speed benchmark's baseline): the op's
    FLOPs at the GPU's peak tensor rate against its bytes at the DRAM rate; a
    collective's bytes over the system's fastest GPU link."""
    from tsbatch.collectives.systems import get_system
    from tsbatch.hw import get_hw

    if fam in ("collective", "custom_ar"):
        names = keys["comm_system"].unique().to_list()
        bw = pl.DataFrame({"comm_system": names, "_bw": [
            get_system(n).link_bw_gbps("nvlink" if get_system(n).nvlink is not None else "pcie")
            * 1e3 for n in names]})
        k = keys.join(bw, on="comm_system", how="left")
        t = c("op_bytes") / c("_bw")
    else:
        gpus = keys["gpu"].unique().to_list()
        specs = [(hw_specs or {}).get(g) or get_hw(g) for g in gpus]
        rates = pl.DataFrame({"gpu": gpus, "_tc": [s.rate("tc_bf16_tflops") * 1e6 for s in specs],
                              "_tc8": [(s.rate("tc_fp8_tflops") or s.rate("tc_bf16_tflops")) * 1e6
                                       for s in specs],
                              "_bw": [s.rate("dram_bw_tbps") * 1e6 for s in specs]})
        k = keys.join(rates, on="gpu", how="left")
        peak = (pl.when(c("dtype") == "float8").then(c("_tc8")).otherwise(c("_tc"))
                if "dtype" in keys.columns else c("_tc"))
        t = pl.max_horizontal(c("op_flops") / peak, c("op_bytes") / c("_bw"))
    return k.with_columns(t.alias("t_kernel_us"), pl.lit(0.0).alias("t_launch_us"),
                          pl.lit("roofline").alias("bound"), pl.lit("").alias("config")
                          ).drop("_bw", "_tc", "_tc8", strict=False)


def predict_ops(dep: pl.DataFrame, timings: dict | None = None,
                hw_specs: dict | None = None, *, detail: bool = True,
                method: str = "model") -> pl.DataFrame:
    """Op times of every feasible deployment; ``dep`` is resolved.

    The ops are made and evaluated once per point signature (:func:`ops.signatures`):
    every family once, over the distinct rows of all signatures. With ``detail`` (the
    default) the result is every op row of every point of every deployment: ``dep,
    phase, point``, the op, its family, FLOPs, bytes, ``t_kernel_us`` (the family's
    latency), ``t_launch_us``, ``t_us`` (one run: launch gap included), ``bound``,
    ``config`` and ``shape``. With ``detail=False`` (sweeps) it is one row per point:
    ``dep, phase, point, t_ops_us`` (its ops' time, summed), ``missing`` and
    ``missing_op``. ``hw_specs``: GPU key -> :class:`~tsbatch.hw.HwSpec` used instead of
    the registry's (a what-if GPU). ``method="roofline"``: a roofline instead of the
    families (the speed benchmark's baseline)."""
    from tsbatch.serving.ops import lower_sigs, signatures

    t0 = time.perf_counter()
    sigs, pmap = signatures(dep, points(dep))
    by_fam = lower_sigs(sigs)
    t1 = time.perf_counter()
    rows = []
    for fam, ops in by_fam.items():
        kcols = [k for k in FAMILY_KEYS[fam] if k in ops.columns]
        if method == "roofline":
            keys = ops.select(*kcols, "op_flops", "op_bytes").unique()
            best = _roofline_family(fam, keys, hw_specs)
            j = ops.join(best, on=[*kcols, "op_flops", "op_bytes"], how="left", nulls_equal=True)
        else:
            keys = ops.select(kcols).unique()
            tf = time.perf_counter()
            best = _evaluate_family(fam, keys, timings, hw_specs)
            if timings is not None:
                timings[f"{fam}_keys"] = timings.get(f"{fam}_keys", 0) + keys.height
                timings[f"{fam}_s"] = timings.get(f"{fam}_s", 0.0) + time.perf_counter() - tf
            j = ops.join(best, on=kcols, how="left", nulls_equal=True)
            if fam == "collective":  # the system's harness launch overhead is not the engine's
                j = j.with_columns(c("comm_launch_us").alias("t_launch_us"))
        cols = ["sig", "phase", "op_name", "part", "order", "mult", pl.lit(fam).alias("family"),
                "op_flops", "op_bytes", "t_kernel_us", "t_launch_us",
                (c("why") if "why" in j.columns else pl.lit(None, pl.String)).alias("why"),
                (pl.max_horizontal(c("t_kernel_us") - c("t_launch_us"), pl.lit(0.0))
                 + c("gap_us")).alias("t_us")]
        if detail:
            cols += ["bound", "config",
                     pl.concat_str([pl.format("{}={}", pl.lit(k), c(k)) for k in kcols
                                    if k not in ("gpu", "comm_system", "impl")],
                                   separator=" ").alias("shape")]
        rows.append(j.select(cols))
    t2 = time.perf_counter()
    if timings is not None:
        timings["lower_s"] = timings.get("lower_s", 0.0) + t1 - t0
        timings["families_s"] = timings.get("families_s", 0.0) + t2 - t1
    if detail:
        out = (pl.concat(rows, how="vertical_relaxed") if rows else
               pl.DataFrame(schema={"sig": pl.Int64, **{k: v for k, v in _OPS_SCHEMA.items()
                                                         if k not in ("dep", "point")},
                                    "t_us": pl.Float64}))
        out = pmap.select("dep", "phase", "point", "sig").join(
            out.drop("phase", strict=False), on="sig", how="inner").drop("sig")
        return out.sort("dep", "phase", "point", "order")
    if not rows:
        return pl.DataFrame(schema={"dep": pl.Int64, "phase": pl.String, "point": pl.Int32,
                                    "t_ops_us": pl.Float64, "missing": pl.Boolean,
                                    "missing_op": pl.String})
    per_sig = pl.concat(rows, how="vertical_relaxed").group_by("sig").agg(
        (c("mult") * c("t_us")).sum().alias("t_ops_us"),
        c("t_kernel_us").is_null().any().alias("missing"),
        pl.format("{}: {}", "op_name", "why").filter(c("t_kernel_us").is_null()).first()
        .alias("missing_op"))
    return pmap.join(per_sig, on="sig", how="left").group_by("dep", "phase", "point").agg(
        c("t_ops_us").sum(), c("missing").any(), c("missing_op").drop_nulls().first())


def point_sums(ops: pl.DataFrame) -> pl.DataFrame:
    """``dep, phase, point, t_ops_us, missing, missing_op`` from op rows (or as given)."""
    if "t_ops_us" in ops.columns:
        return ops
    return ops.group_by("dep", "phase", "point").agg(
        (c("mult") * c("t_us")).sum().alias("t_ops_us"),
        c("t_kernel_us").is_null().any().alias("missing"),
        pl.format("{}: {}", "op_name", "why").filter(c("t_kernel_us").is_null()).first()
        .alias("missing_op"))


def step_points(dep: pl.DataFrame) -> pl.DataFrame:
    """One row per (dep, phase, point): ``count``, ``weight`` and ``steps`` (1 where the
    point is a prefill chunk step, whose engine overhead counts)."""
    return points(dep).group_by("dep", "phase", "point").agg(
        c("count").first(), c("weight").first(),
        (c("kind") == "tokens").any().cast(pl.Int64).alias("steps"))


def compose(dep: pl.DataFrame, ops: pl.DataFrame) -> pl.DataFrame:
    """Per deployment: prefill, decode and total times, throughput (vectorized)."""
    p = step_points(dep).join(point_sums(ops), on=["dep", "phase", "point"], how="left").join(
        dep.select("dep", "step_prefill_us", "step_decode_us", "decode_points", "pp"), on="dep")
    # PP: the prefill's steps (token-budget chunks) flow through the stages as micro-batches
    # (vLLM V1 keeps up to pp batches in flight): each stage does 1/pp of every step's work,
    # and the pipeline's fill and drain add (pp - 1) stage times of the longest step. The
    # attention and the LM head (points of their own) are shared among the steps in
    # proportion to their linear work. With one step, or pp 1, this is the plain sum.
    pp = c("pp").first().cast(pl.Float64)
    work = (c("t_ops_us") * c("count")).sum()
    lin = (c("t_ops_us") * c("count")).filter(c("steps") > 0).sum()
    longest = (c("t_ops_us").filter(c("steps") > 0).max().fill_null(0.0)
               * pl.when(lin > 0).then(work / lin).otherwise(1.0))
    pre = p.filter(c("phase") == "prefill").group_by("dep").agg(
        (work / pp + (pp - 1) / pp * longest
         + (c("count") * c("steps") * c("step_prefill_us")).sum()).alias("prefill_us"),
        c("missing").any().alias("m1"), c("missing_op").drop_nulls().first().alias("o1"))
    d = p.filter(c("phase") == "decode").with_columns(
        (c("t_ops_us") + c("step_decode_us")).alias("step_us"))
    dec = d.group_by("dep").agg(
        (c("step_us") * c("weight")).sum().alias("decode_mean_us"),
        c("step_us").sort_by("point").get((c("decode_points").first() - 1) // 2)
        .alias("decode_mid_us"),
        c("missing").any().alias("m2"), c("missing_op").drop_nulls().first().alias("o2"))
    r = dep.join(pre, on="dep", how="left").join(dec, on="dep", how="left")
    miss = c("m1").fill_null(False) | c("m2").fill_null(False)
    r = r.with_columns(
        pl.when(c("feasible") & miss).then(pl.format(
            "no feasible kernel configuration for op {}", pl.coalesce("o1", "o2")))
        .otherwise(c("infeasible_reason")).alias("infeasible_reason"),
        (c("feasible") & ~miss).alias("feasible"))
    ok = c("feasible")
    total = c("prefill_us") + (c("output_len") - 1) * c("decode_mean_us")
    tokens = (c("batch") * c("output_len") * c("dp")).cast(pl.Float64)
    r = r.with_columns(
        pl.when(ok).then(c("prefill_us") / 1e3).alias("prefill_ms"),
        pl.when(ok).then(c("decode_mid_us") / 1e3).alias("decode_step_ms"),
        pl.when(ok).then(c("decode_mean_us") / 1e3).alias("decode_mean_step_ms"),
        pl.when(ok).then(total / 1e3).alias("total_ms"),
    ).with_columns(
        pl.when(ok).then(tokens / (c("total_ms") / 1e3)).alias("tokens_per_s"),
        pl.when(ok).then(c("batch") / (c("decode_step_ms") / 1e3)).alias("decode_tokens_per_s"),
    ).with_columns((c("tokens_per_s") / c("gpus")).alias("tokens_per_s_per_gpu"))
    return r.sort("dep")


def predict(deployments, *, timings: dict | None = None, return_ops: bool = False,
            hw_specs: dict | None = None, method: str = "model"):
    """Predict every deployment row (a polars DataFrame, Arrow table or dict of columns).

    Returns the input columns followed by :data:`RESULT_COLUMNS` in input order (and the
    op table when ``return_ops``). Bad input raises one :class:`InputError`.
    """
    dep = resolve(deployments)
    if method not in ("model", "roofline"):
        raise InputError(f"method {method!r}: model or roofline")
    t0 = time.perf_counter()
    ops = predict_ops(dep, timings, hw_specs, detail=return_ops, method=method)
    t1 = time.perf_counter()
    res = compose(dep, ops)
    if timings is not None:
        timings["compose_s"] = timings.get("compose_s", 0.0) + time.perf_counter() - t1
    inputs = [k for k in res.columns if k in _input_columns(deployments)]
    out = res.select(*inputs, *RESULT_COLUMNS)
    return (out, ops) if return_ops else out


def _input_columns(deployments) -> list[str]:
    from tsbatch.serving.deploy import DEPLOYMENT_COLUMNS

    cols = list(getattr(deployments, "columns", None) or getattr(deployments, "column_names", None)
                or list(deployments))
    return list(dict.fromkeys(cols + list(DEPLOYMENT_COLUMNS)))
