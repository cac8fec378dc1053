"""The serving layer (issue 34): models, the op list of a step, composition, sweeps, errors."""

from __future__ import annotations

import dataclasses
import json
import math

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tsbatch.errors import InputError
from tsbatch.hw import get_hw
from tsbatch.serving.api import explain_deployment, load_sweep, rank_deployments, sweep_deployments
from tsbatch.serving.deploy import resolve
from tsbatch.serving.models import list_models, load_model, parse_config
from tsbatch.serving.ops import lower_ops
from tsbatch.serving.predict import predict


# ------------------------------------------------------------------ models
def test_issue34_shipped_models_load_with_published_sizes():
    want = {  # parameter counts the model cards give, billions (embeddings included)
        "meta-llama/Llama-2-7b-hf": 6.7, "meta-llama/Llama-2-70b-hf": 69.0,
        "meta-llama/Llama-3.1-8B": 8.0, "meta-llama/Llama-3.1-70B": 70.6,
        "meta-llama/Llama-3.1-405B": 405.9, "mistralai/Mistral-7B-v0.1": 7.2,
        "mistralai/Mixtral-8x7B-v0.1": 46.7, "Qwen/Qwen2-7B": 7.6, "Qwen/Qwen2-72B": 72.7,
        "Qwen/Qwen2.5-7B": 7.6, "Qwen/Qwen2.5-14B": 14.8, "Qwen/Qwen2.5-32B": 32.8,
        "Qwen/Qwen2.5-72B": 72.7, "Qwen/Qwen3-8B": 8.2, "Qwen/Qwen3-32B": 32.8,
        "Qwen/Qwen3-30B-A3B": 30.5, "deepseek-ai/DeepSeek-V3": 671.0,
    }
    assert set(want) <= set(list_models())
    for name, b in want.items():
        assert load_model(name).params() / 1e9 == pytest.approx(b, rel=0.01), name
    ds = load_model("deepseek-ai/DeepSeek-V3")
    assert (ds.kind, ds.dense_layers, ds.moe_layers, ds.experts, ds.top_k) == ("mla", 3, 58, 256, 8)
    assert (ds.kv_lora_rank, ds.qk_rope_dim, ds.head_dim, ds.shared_intermediate) == (512, 64, 192, 2048)
    assert load_model("Qwen/Qwen3-32B").qk_norm and not load_model("Qwen/Qwen2.5-32B").qk_norm
    assert load_model("qwen3-32b") == load_model("Qwen/Qwen3-32B")  # alias


def test_issue34_config_errors_name_field_and_file(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
                             "num_hidden_layers": 32, "num_attention_heads": 32,
                             "vocab_size": 32000}))
    with pytest.raises(InputError, match=r"config\.json: field 'intermediate_size' is missing"):
        load_model(tmp_path)
    p.write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(InputError, match=r"config\.json: field 'architectures' names 'GPT2LMHeadModel'"):
        load_model(str(p))
    with pytest.raises(InputError, match="field 'hidden_size' must be a positive integer"):
        parse_config({"architectures": ["Qwen2ForCausalLM"], "hidden_size": "4096"}, "x.json")
    with pytest.raises(InputError, match="unknown model 'no-such-model'"):
        load_model("no-such-model")


# ------------------------------------------------------------------ the op list, by hand
def _ops(model, tp, ep=1, batch=16, prompt=1000, output=64, weights="bf16"):
    # H200 NVL (141 GB): Mixtral at TP 1 and DeepSeek-V3 at TP 8 fit
    dep = resolve(pl.DataFrame({"model": [model], "system": ["h200_nvl"], "tp": [tp],
                                "ep": [ep], "batch": [batch], "prompt_len": [prompt],
                                "output_len": [output], "weights": [weights]}))
    assert dep["feasible"][0], dep["infeasible_reason"][0]
    fams = lower_ops(dep)
    rows = []
    for fam, f in fams.items():
        for r in f.filter((pl.col("phase") == "decode") & (pl.col("point") == 0)).iter_rows(named=True):
            rows.append({**r, "family": fam})
    return {r["op_name"]: r for r in rows}


@pytest.mark.parametrize("tp", [1, 4])
def test_issue34_dense_layer_ops_hand_count(tp):
    ops = _ops("meta-llama/Llama-3.1-8B", tp)
    m, h, L = 16, 4096, 32
    q_heads, kv_heads, hd = 32 // tp, 8 // tp, 128
    qkv_n = (q_heads + 2 * kv_heads) * hd          # 6144 at TP 1, 1536 at TP 4
    ffn = 14336 // tp
    want = {  # op: (family, key shape, FLOPs of one run, bytes of one run, runs per step)
        "qkv_proj": ("gemm", (m, qkv_n, h), 2 * m * qkv_n * h, 2 * (m * h + h * qkv_n + m * qkv_n), L),
        "o_proj": ("gemm", (m, h, q_heads * hd), 2 * m * h * q_heads * hd,
                   2 * (m * q_heads * hd + q_heads * hd * h + m * h), L),
        "gate_up_proj": ("gemm", (m, 2 * ffn, h), 2 * m * 2 * ffn * h,
                         2 * (m * h + h * 2 * ffn + m * 2 * ffn), L),
        "down_proj": ("gemm", (m, h, ffn), 2 * m * h * ffn, 2 * (m * ffn + ffn * h + m * h), L),
        "lm_head": ("gemm", (m, 128256 // tp, h), 2 * m * (128256 // tp) * h,
                    2 * (m * h + h * (128256 // tp) + m * (128256 // tp)), 1),
    }
    for op, (fam, (mm, n, k), flops, nbytes, runs) in want.items():
        r = ops[op]
        assert (r["family"], r["m"], r["n"], r["k"], r["mult"]) == (fam, mm, n, k, runs), op
        assert r["op_flops"] == flops and r["op_bytes"] == nbytes, op
    ctx = 1000 + round(64 * 0.5 / 3)  # the first of three decode points
    a = ops["attention"]
    assert (a["family"], a["batch"], a["heads"], a["kv_heads"], a["seq_len_kv"], a["head_dim"]) \
        == ("flash_decoding", 16, q_heads, kv_heads, ctx, hd)
    assert a["op_flops"] == 4 * 16 * q_heads * ctx * hd
    assert a["op_bytes"] == 2 * 16 * (ctx * 2 * kv_heads * hd + 2 * q_heads * hd)
    n = ops["input_norm"]
    assert (n["op"], n["rows"], n["hidden"], n["residual"], n["op_bytes"]) == \
        ("rmsnorm", m, h, True, 4 * 2 * m * h)
    assert ops["silu_mul"]["hidden"] == ffn and ops["silu_mul"]["op_bytes"] == 3 * 2 * m * ffn
    if tp == 1:
        assert not any("all_reduce" in k or "gather" in k for k in ops)
    else:
        for op in ("attn_all_reduce", "mlp_all_reduce"):
            r = ops[op]
            assert (r["collective"], r["num_gpus"], r["bytes"], r["mult"]) == \
                ("all_reduce", tp, m * h * 2, L)
        assert ops["logits_gather"]["bytes"] == m * 128256 * 2
    assert "qk_norm" not in ops and "router" not in ops


@pytest.mark.parametrize("tp,ep", [(1, 1), (4, 1), (4, 4)])
def test_issue34_moe_layer_ops_hand_count(tp, ep):
    ops = _ops("mistralai/Mixtral-8x7B-v0.1", tp, ep)
    m, h, L, E, k = 16, 4096, 32, 8, 2
    assert "gate_up_proj" not in ops and "down_proj" not in ops  # every layer is MoE
    r = ops["router"]
    assert (r["m"], r["n"], r["k"], r["mult"]) == (m, E, h, L)
    if ep == 1:
        e_l, top, tok, ffn = E, k, m, 14336 // tp
    else:  # 2 experts per GPU at full width; 16 x 2 / 4 = 8 assignments = 4 tokens x top-2
        e_l, top, tok, ffn = E // ep, 2, 4, 14336
    g, d = ops["moe_gate_up"], ops["moe_down"]
    assert (g["tokens"], g["experts"], g["top_k"], g["hidden"], g["ffn"], g["proj"]) == \
        (tok, e_l, top, h, ffn, "gate_up")
    assert g["op_flops"] == 2 * tok * top * (2 * ffn) * h
    assert g["op_bytes"] == e_l * 2 * ffn * h * 2 + tok * top * (2 * ffn + h) * 2
    assert d["op_flops"] == 2 * tok * top * h * ffn
    assert d["op_bytes"] == e_l * h * ffn * 2 + tok * top * (h + ffn) * 2
    assert ops["moe_silu_mul"]["rows"] == tok * top
    if ep > 1:
        for op in ("moe_dispatch_all_to_all", "moe_combine_all_to_all"):
            assert (ops[op]["collective"], ops[op]["num_gpus"], ops[op]["bytes"]) == \
                ("all_to_all", ep, m * k * h * 2)
        assert "moe_all_reduce" not in ops
    elif tp > 1:
        assert ops["moe_all_reduce"]["bytes"] == m * h * 2
    else:
        assert not any("all_" in o for o in ops)


def test_issue34_mla_and_qk_norm_ops():
    ops = _ops("deepseek-ai/DeepSeek-V3", 8, 8, batch=8, weights="fp8")
    assert ops["attention"]["family"] == "mla_decode"
    assert (ops["attention"]["heads"], ops["attention"]["kv_lora_rank"]) == (16, 512)
    assert ops["gate_up_proj"]["mult"] == 3 and ops["moe_gate_up"]["mult"] == 58
    assert ops["shared_gate_up_proj"]["n"] == 2 * 2048 // 8
    q = _ops("Qwen/Qwen3-32B", 2)["qk_norm"]
    assert (q["rows"], q["hidden"]) == (16 * (32 + 4), 128)


# ------------------------------------------------------------------ composition properties
DEPS = pl.DataFrame({"model": ["meta-llama/Llama-3.1-8B", "Qwen/Qwen3-30B-A3B"],
                     "system": ["h100", "h100"], "batch": [8, 4], "prompt_len": [512, 256],
                     "output_len": [32, 16]})
RATE_KEYS = ("dram_bw_tbps", "l2_bw_tbps", "tc_bf16_tflops", "fp32_tflops", "clock_mhz")


def _slower(hw, key, factor):
    measured = dict(hw.measured)
    if key in measured:
        measured[key] *= factor
    return dataclasses.replace(hw, **{key: getattr(hw, key) * factor}, measured=measured)


@settings(max_examples=6, deadline=None)
@given(st.sampled_from(RATE_KEYS), st.floats(0.3, 0.95))
def test_issue34_step_never_faster_when_a_rate_falls(key, factor):
    base = predict(DEPS)
    hw = get_hw("h100")
    slow = predict(DEPS, hw_specs={hw.key: _slower(hw, key, factor)})
    for col in ("prefill_ms", "decode_step_ms", "total_ms"):
        a, b = base[col].to_list(), slow[col].to_list()
        assert all(y >= x * (1 - 1e-9) for x, y in zip(a, b)), (col, key, a, b)


def test_issue34_batched_equals_row_by_row_and_sweep_ranking():
    df = pl.DataFrame({
        "model": ["meta-llama/Llama-3.1-8B"] * 4 + ["Qwen/Qwen3-32B"] * 3 + ["meta-llama/Llama-3.1-70B"],
        "system": ["dgx_h100", "dgx_h100", "dgx_a100", "h100", "dgx_h100", "dgx_a100", "dgx_h100",
                   "h100"],
        "tp": [1, 2, 4, 1, 2, 3, 8, 1],
        "batch": [1, 32, 8, 64, 16, 4, 16, 8],
        "prompt_len": [128, 1024, 512, 256, 2048, 512, 4096, 512],
        "output_len": [64, 128, 32, 16, 64, 32, 64, 64]})
    batched = predict(df)
    alone = pl.concat([predict(df[i:i + 1]) for i in range(df.height)], how="vertical_relaxed")
    for col in ("feasible", "infeasible_reason", "prefill_ms", "decode_step_ms", "total_ms"):
        if batched[col].dtype == pl.Float64:
            assert batched[col].fill_null(-1.0).to_list() == \
                pytest.approx(alone[col].fill_null(-1.0).to_list(), rel=1e-9), col
        else:
            assert batched[col].to_list() == alone[col].to_list(), col
    # tp 3 does not divide Qwen3-32B's 64 heads; 70B at bf16 does not fit one GPU
    assert "not divisible by tp 3" in batched["infeasible_reason"][5]
    assert "GiB per GPU" in batched["infeasible_reason"][7]
    ranked = sweep_deployments(df)
    loop = sorted((r for r in alone.iter_rows(named=True) if r["feasible"]),
                  key=lambda r: -r["tokens_per_s_per_gpu"])
    got = ranked.filter(pl.col("rank").is_not_null())
    assert got["rank"].to_list() == list(range(1, len(loop) + 1))
    assert [(r["model"], r["system"], r["tp"], r["batch"]) for r in got.iter_rows(named=True)] == \
        [(r["model"], r["system"], r["tp"], r["batch"]) for r in loop]
    # the latency limit keeps only what is within it
    lim = sorted(alone.filter(pl.col("feasible"))["decode_step_ms"].to_list())[2]
    capped = rank_deployments(batched, max_decode_step_ms=lim)
    kept = capped.filter(pl.col("rank").is_not_null())
    assert kept.height == 3 and (kept["decode_step_ms"] <= lim).all()


def test_issue34_throughput_and_totals_consistent():
    r = predict(DEPS).row(0, named=True)
    assert r["total_ms"] == pytest.approx(r["prefill_ms"] + 31 * r["decode_mean_step_ms"])
    assert r["tokens_per_s"] == pytest.approx(8 * 32 / (r["total_ms"] / 1e3))
    assert r["decode_step_ms"] > 0 and r["prefill_ms"] > r["decode_step_ms"]


def test_issue34_explain_breakdown(tmp_path):
    e = explain_deployment("meta-llama/Meta-Llama-3-8B", "h100", batch=1, prompt_len=512,
                           output_len=16)
    text = str(e)
    assert "qkv_proj" in text and "flash_decoding" in text and "attention_fa3" in text
    t = e.table("decode")
    assert t["share_pct"].sum() == pytest.approx(100.0)
    png = e.plot(tmp_path / "b.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize("change,match", [
    ({"system": ["dgx_z9000"]}, "column 'system': unknown system or GPU 'dgx_z9000'"),
    ({"weights": ["int3"]}, "column 'weights': unknown value 'int3'"),
    ({"engine": ["sglang"]}, "column 'engine': unknown value 'sglang'"),
    ({"batch": [0]}, "column 'batch' must be positive"),
    ({"model": ["nope/Nope-1B"]}, "unknown model 'nope/Nope-1B'"),
])
def test_issue34_bad_deployment_input(change, match):
    row = {"model": ["meta-llama/Llama-3.1-8B"], "system": ["h100"], "batch": [1],
           "prompt_len": [128], "output_len": [8]}
    row.update(change)
    with pytest.raises(InputError, match=match):
        predict(pl.DataFrame(row))
    with pytest.raises(InputError, match="column 'output_len' is missing"):
        predict(pl.DataFrame({k: v for k, v in row.items() if k != "output_len"}))


def test_issue34_bad_sweep_writes_nothing(tmp_path):
    from tsbatch.front.cli import main

    bad = tmp_path / "s.toml"
    bad.write_text('[serve_sweep]\nname = "x"\n[grid]\nmodel = ["meta-llama/Llama-3.1-8B"]\n'
                   'system = ["h100"]\nbatch = [1]\nprompt_len = [128]\noutput_len = [8]\n'
                   'tpp = [1]\n')
    out = tmp_path / "o.parquet"
    assert main(["serve", "sweep", str(bad), "-o", str(out)]) == 2
    assert not out.exists()
    with pytest.raises(InputError, match=r"\[grid\] key 'tpp' is not a deployment column"):
        load_sweep(bad)
    df, opts = load_sweep("serve_llm")
    assert df.height == 5 * 2 * 4 * 1 * 2 * 4 * 2 * 1 and opts["max_decode_step_ms"] == 60
    assert not math.isnan(opts["max_decode_step_ms"])


def test_issue34_tuned_profile_uses_triton_tiles_and_package_api():
    import tsbatch.serving as serving

    e = serving.explain_deployment("meta-llama/Llama-3.1-8B", "a100", engine="tuned", batch=4,
                                   prompt_len=256, output_len=8)
    cfg = e.ops.filter(pl.col("family") == "gemm")["config"].to_list()
    assert cfg and all(c.startswith("triton ") for c in cfg)
    v = serving.explain_deployment("meta-llama/Llama-3.1-8B", "a100", batch=4, prompt_len=256,
                                   output_len=8)
    assert all(c.startswith("cublas ") for c in
               v.ops.filter(pl.col("family") == "gemm")["config"].to_list())
    assert e.result["decode_step_ms"] > 0 and e.result["prefill_ms"] != v.result["prefill_ms"]


def test_issue34_accuracy_on_the_dev_file(shared_data, capsys):
    from tsbatch.front.cli import main
    from tsbatch.serving.accuracy import load_e2e, predict_rows, score

    path = shared_data / "e2e" / "pipeweave_vllm_dev.parquet"
    assert main(["accuracy", str(path)]) == 0
    assert "per configuration" in capsys.readouterr().out
    # thresholds on the per-GPU table: one nobody can meet fails, one everybody meets passes
    assert main(["accuracy", str(path), "--fail-above", "total_wmape=0"]) == 1
    assert main(["accuracy", str(path), "--fail-above", "total_wmape=1000"]) == 0
    assert main(["accuracy", str(path), "--fail-above", "spearman=1"]) == 2
    rows = load_e2e(path)
    tab = score(rows, predict_rows(rows))
    assert tab["rows"].to_list() == [8, 8, 16]  # every configuration predicted
    for col in ("prefill_mape", "decode_step_mape", "total_mape"):
        assert tab[col].is_finite().all()


def test_issue34_cli_explain_and_sweep(tmp_path, capsys):
    from tsbatch.front.cli import main

    png = tmp_path / "b.png"
    assert main(["serve", "explain", "--model", "Qwen/Qwen3-30B-A3B", "--system", "dgx_h100",
                 "--tp", "2", "--ep", "2", "--batch", "8", "--prompt-len", "512",
                 "--output-len", "16", "--png", str(png)]) == 0
    out = capsys.readouterr().out
    assert "moe_gate_up" in out and "moe_dispatch_all_to_all" in out and png.exists()
    assert main(["serve", "explain", "--model", "Qwen/Qwen3-30B-A3B", "--system", "h100",
                 "--png", str(tmp_path / "x.jpg")]) == 2
    assert not (tmp_path / "x.jpg").exists()
    out = tmp_path / "r.parquet"
    assert main(["serve", "sweep", "serve_moe_mla", "-o", str(out), "-q"]) == 0
    r = pl.read_parquet(out)
    assert r.height == 3 * 2 * 3 * 2 * 2 and r["rank"].drop_nulls().to_list()[:3] == [1, 2, 3]
    ranked = r.filter(pl.col("rank").is_not_null())
    assert ranked["tokens_per_s_per_gpu"].is_sorted(descending=True)
    # DeepSeek-V3 in FP8 fits 16 H100s (tp 8, pp 2), not 8
    ds = r.filter(pl.col("model") == "deepseek-ai/DeepSeek-V3")
    assert ds.filter((pl.col("tp") == 8) & (pl.col("pp") == 2) & (pl.col("ep") != 2))["feasible"].all()
    assert not ds.filter(pl.col("pp") == 1)["feasible"].any()


def test_issue34_context_over_the_model_limit_is_infeasible():
    r = predict(pl.DataFrame({"model": ["meta-llama/Llama-2-7b-hf"] * 2, "system": ["h100"] * 2,
                              "batch": [1, 1], "prompt_len": [4000, 8192],
                              "output_len": [96, 64]})).to_dicts()
    assert r[0]["feasible"] and not r[1]["feasible"]
    assert "max_position_embeddings 4096" in r[1]["infeasible_reason"]


def test_issue34_prefill_chunks_and_decode_points():
    from tsbatch.serving.ops import points

    dep = resolve(pl.DataFrame({"model": ["meta-llama/Llama-3.1-8B"] * 2, "system": ["h100"] * 2,
                                "batch": [10, 10], "prompt_len": [4000, 4000],
                                "output_len": [90, 90], "chunk_tokens": [0, 40000]}))
    p = points(dep)
    tok = {d: sorted((r["m"], r["count"]) for r in p.filter(
        (pl.col("dep") == d) & (pl.col("kind") == "tokens")).iter_rows(named=True))
        for d in (0, 1)}
    assert tok[0] == [(7232, 1), (16384, 2)]       # 40,000 tokens in 16,384-token steps
    assert tok[1] == [(40000, 1)]                  # one pass
    attn = p.filter((pl.col("dep") == 0) & (pl.col("kind") == "attn")).row(0, named=True)
    assert (attn["reqs"], attn["seq"]) == (10, 4000)
    dec = p.filter((pl.col("dep") == 0) & (pl.col("kind") == "decode_attn")).sort("point")
    assert dec["ctx"].to_list() == [4015, 4045, 4075] and dec["weight"].sum() == pytest.approx(1)
    r = predict(dep.select("model", "system", "batch", "prompt_len", "output_len",
                           "chunk_tokens")).to_dicts()
    assert r[0]["decode_step_ms"] == pytest.approx(r[1]["decode_step_ms"])
    assert r[0]["prefill_ms"] != r[1]["prefill_ms"]


def test_issue34_sweep_file_carries_engine_provenance(tmp_path):
    from tsbatch.front.cli import main
    from tsbatch.boundary.io import read_metadata

    out = tmp_path / "r.parquet"
    assert main(["serve", "sweep", "serve_moe_mla", "-o", str(out), "-q"]) == 0
    meta = read_metadata(out)
    assert json.loads(meta["tsbatch.engines"])["vllm"]["step_decode_us"] > 0
    assert meta["tsbatch.family"] == "serving"


# ------------------------------------------------------------------ vLLM's custom all-reduce
def _ar_rows(system, tp, batch, prompt=1000, model="meta-llama/Llama-3.1-8B", **over):
    dep = resolve(pl.DataFrame({"model": [model], "system": [system], "tp": [tp],
                                "batch": [batch], "prompt_len": [prompt], "output_len": [8]}))
    dep = dep.with_columns(pl.lit(v).alias(k) for k, v in over.items())
    assert dep["feasible"][0], dep["infeasible_reason"][0]
    fams = lower_ops(dep)
    out = []
    for fam in ("collective", "custom_ar"):
        if fam in fams:
            out += [{**r, "family": fam} for r in fams[fam].filter(
                pl.col("op_name") == "mlp_all_reduce").iter_rows(named=True)]
    return {(r["phase"], r["point"]): r for r in out}


def test_issue35e_custom_all_reduce_takes_small_tp_messages_on_nvlink():
    # decode of 16 requests: 16 x 4096 x 2 = 128 KiB, under vLLM's 8 MiB limit; the prefill's
    # 16,000 tokens are 125 MiB: NCCL
    for system, tp in (("dgx_h100", 2), ("dgx_h100", 8), ("hgx_h100_4gpu", 4),
                       ("h200_nvl", 2)):
        r = _ar_rows(system, tp, 16)
        assert r[("decode", 0)]["family"] == "custom_ar", (system, tp)
        assert r[("decode", 0)]["bytes"] == 16 * 4096 * 2 and not r[("decode", 0)]["eager"]
        assert r[("prefill", 0)]["family"] == "collective", (system, tp)
    # H200 NVL bridges join pairs: four GPUs are not all NVLink-connected, so NCCL
    assert _ar_rows("h200_nvl", 4, 16)[("decode", 0)]["family"] == "collective"
    # a PCIe-only system has no NVLink P2P: NCCL
    assert _ar_rows("l40s_pcie_server", 2, 16)[("decode", 0)]["family"] == "collective"
    # the engine constant switches it off; a short prefill under the limit takes it, eager
    assert _ar_rows("dgx_h100", 2, 16, custom_ar_max_bytes=0)[("decode", 0)]["family"] == \
        "collective"
    short = _ar_rows("dgx_h100", 2, 2, prompt=100)[("prefill", 0)]
    assert short["family"] == "custom_ar" and short["eager"]


def test_issue35e_custom_all_reduce_cost_by_hand():
    from tsbatch.collectives.systems import get_system
    from tsbatch.serving.predict import custom_ar_table

    def one(system, n, nbytes, eager=False):
        s = get_system(system)
        keys = pl.DataFrame({"gpu": [s.gpu], "comm_system": [system], "num_gpus": [n],
                             "gpus_per_node": [s.gpus_per_node], "bytes": [nbytes],
                             "eager": [eager]})
        return custom_ar_table(keys).row(0, named=True), s

    for system in ("hgx_h100_4gpu", "dgx_h100"):
        for n, nbytes, stages in ((2, 1 << 20, 1), (4, 256 << 10, 1), (4, 1 << 20, 2)):
            r, s = one(system, n, nbytes)
            bw = s.nvlink.bw_gbps * s.cal("nvlink_efficiency") * 1e3  # bytes per us
            pair = bw / (s.gpus_per_node - 1) if s.nvlink.topology == "mesh" else bw
            sync = (s.nvlink.alpha_us + s.cal("rank_skew_us")) * (stages + 1)
            if stages == 1:
                link = max((n - 1) * nbytes / bw, nbytes / pair)
            else:
                link = max(2 * (n - 1) * nbytes / n / bw, 2 * nbytes / n / pair)
            assert r["t_kernel_us"] == pytest.approx(sync + link), (system, n, nbytes)
            assert r["config"] == f"vllm custom_ar {stages}-stage"
            eager, _ = one(system, n, nbytes, eager=True)  # + the copy into the IPC buffer
            dram = get_hw(s.gpu).rate("dram_bw_tbps") * 1e6
            assert eager["t_kernel_us"] == pytest.approx(sync + link + 2 * nbytes / dram)
    # the mesh's pair carries a third of the GPU's links: slower than a switch port
    assert one("hgx_h100_4gpu", 2, 4 << 20)[0]["t_kernel_us"] > \
        one("dgx_h100", 2, 4 << 20)[0]["t_kernel_us"]
    # and the engine's all-reduce beats NCCL's ring on the small decode messages it takes
    # (NCCL's body: its latency less the system's harness launch overhead)
    from tsbatch.serving.predict import _evaluate_family

    s = get_system("dgx_h100")
    nccl = _evaluate_family("collective", pl.DataFrame(
        {"comm_system": ["dgx_h100"], "collective": ["all_reduce"], "num_gpus": [4],
         "gpus_per_node": [8], "bytes": [256 << 10]}), None).row(0, named=True)
    body = nccl["t_kernel_us"] - s.cal("launch_overhead_us")
    assert one("dgx_h100", 4, 256 << 10)[0]["t_kernel_us"] < body


# ------------------------------------------------------------------ FP8 activation quantization
def test_issue35e_fp8_gemm_inputs_are_quantized_first():
    m, h, ffn = 16, 4096, 14336
    bf = _ops("meta-llama/Llama-3.1-8B", 1)
    assert not any(k.endswith(("_absmax", "_quant")) for k in bf)
    ops = _ops("meta-llama/Llama-3.1-8B", 1, weights="fp8")
    for gemm, k in (("qkv_proj", h), ("o_proj", 32 * 128), ("gate_up_proj", h),
                    ("down_proj", ffn)):
        a, q = ops[f"{gemm}_absmax"], ops[f"{gemm}_quant"]
        assert (a["family"], a["rows"], a["mult"]) == ("rowwise", m, 32)
        assert a["op_bytes"] == 2 * m * k and q["op_bytes"] == 3 * m * k, gemm
        assert a["order"] < q["order"] < ops[gemm]["order"]
        assert ops[gemm]["dtype"] == "float8"
    # the LM head stays in bf16: nothing to quantize
    assert "lm_head_quant" not in ops and ops["lm_head"]["dtype"] == "bfloat16"
    moe = _ops("mistralai/Mixtral-8x7B-v0.1", 1, weights="fp8")
    assert moe["moe_gate_up_quant"]["rows"] == m and moe["moe_gate_up_quant"]["op_bytes"] == 3 * m * h
    assert moe["moe_down_quant"]["rows"] == m * 2
    assert moe["moe_down_quant"]["op_bytes"] == 3 * m * 2 * ffn
    assert "router_quant" not in moe
    # the quantization passes cost time: an FP8 step is slower than its GEMMs alone
    dep = pl.DataFrame({"model": ["meta-llama/Llama-3.1-8B"], "system": ["h100"], "batch": [8],
                        "prompt_len": [512], "output_len": [8], "weights": ["fp8"]})
    res, op = predict(dep, return_ops=True)
    qt = op.filter(pl.col("op_name").str.ends_with("_quant") | pl.col("op_name").str.ends_with(
        "_absmax"))
    assert qt.height > 0 and (qt["t_us"] > 0).all()


def test_issue35e_default_token_budget_follows_vllms_gpu_rule():
    # vLLM's LLM class: 16,384 tokens a step on GPUs of >= 70 GiB other than the A100,
    # 8,192 on the others; an explicit chunk_tokens wins
    dep = resolve(pl.DataFrame({"model": ["meta-llama/Llama-3.1-8B"] * 5,
                                "system": ["h100", "a100", "l40s", "h200", "a100"],
                                "batch": [1] * 5, "prompt_len": [512] * 5,
                                "output_len": [8] * 5, "chunk_tokens": [0, 0, 0, 0, 4096]}))
    assert dep["chunk_tokens"].to_list() == [16384, 8192, 8192, 16384, 4096]


def test_issue35e_unequal_prompts_cost_their_sum_of_squares():
    # 16 prompts of mean 2,197 tokens whose squares sum to 1.157 x 16 x 2,197^2: prefill
    # attention runs as 14 prompts of 2,542 tokens (same tokens, same causal work)
    base = {"model": ["meta-llama/Llama-3.1-8B"] * 2, "system": ["h100"] * 2, "batch": [16, 16],
            "prompt_len": [2197, 2197], "output_len": [8, 8]}
    rms = round(2197 * 1.157 ** 0.5)
    dep = resolve(pl.DataFrame({**base, "prompt_len_rms": [0, rms]}))
    from tsbatch.serving.ops import points

    a = points(dep).filter(pl.col("kind") == "attn").sort("dep")
    assert a["reqs"].to_list() == [16, 14] and a["seq"].to_list() == [2197, 2542]
    assert a["m"].to_list() == [16 * 2197] * 2
    r = predict(pl.DataFrame({**base, "prompt_len_rms": [0, rms]}), return_ops=True)
    res, ops = r
    att = ops.filter((pl.col("phase") == "prefill") & (pl.col("op_name") == "attention"))
    t = att.sort("dep")["t_us"].to_list()
    assert t[1] > t[0]  # more causal work
    # the linear ops and the decode step do not depend on how the tokens are split
    lin = ops.filter((pl.col("phase") == "prefill") & (pl.col("op_name") == "qkv_proj"))
    assert lin.filter(pl.col("dep") == 0)["t_us"].to_list() == \
        lin.filter(pl.col("dep") == 1)["t_us"].to_list()
    assert res["decode_step_ms"][0] == pytest.approx(res["decode_step_ms"][1])
    assert res["prefill_ms"][1] > res["prefill_ms"][0]
    # the explanation (and `tsbatch serve explain --prompt-len-rms`) takes it too
    e = explain_deployment("meta-llama/Llama-3.1-8B", "h100", batch=16, prompt_len=2197,
                           output_len=8, prompt_len_rms=rms)
    assert e.result["prefill_ms"] == pytest.approx(res["prefill_ms"][1])
    with pytest.raises(InputError, match="prompt_len_rms"):
        predict(pl.DataFrame({**base, "prompt_len_rms": [2000, 0]}))  # below the mean
    with pytest.raises(InputError, match="prompt_len_rms"):
        predict(pl.DataFrame({**base, "prompt_len_rms": [2197 * 5, 0]}))  # over mean x sqrt(16)


def test_issue35e_pp_prefill_steps_pipeline_through_the_stages():
    from tsbatch.serving.predict import point_sums, step_points

    base = {"model": ["meta-llama/Llama-3.1-8B"] * 3, "system": ["dgx_h100"] * 3,
            "tp": [1, 1, 1], "batch": [16, 16, 16], "prompt_len": [4000] * 3,
            "output_len": [8] * 3}
    # 64,000 prompt tokens: 4 steps of 16,384 tokens (the last shorter); one step of 64,000
    df = pl.DataFrame({**base, "pp": [1, 2, 2], "chunk_tokens": [0, 0, 64000]})
    res, ops = predict(df, return_ops=True)
    dep = resolve(df)
    p = step_points(dep).join(point_sums(ops), on=["dep", "phase", "point"]).filter(
        pl.col("phase") == "prefill")
    for d, pp in ((1, 2), (2, 2)):
        q = p.filter(pl.col("dep") == d)
        work = (q["t_ops_us"] * q["count"]).sum()
        tok = q.filter(pl.col("steps") > 0)
        lin = (tok["t_ops_us"] * tok["count"]).sum()
        longest = tok["t_ops_us"].max() * work / lin
        assert res["prefill_ms"][d] * 1e3 == pytest.approx(work / pp + (pp - 1) / pp * longest)
        if tok["count"].sum() == 1:  # one step: nothing to overlap, the plain sum
            assert res["prefill_ms"][d] * 1e3 == pytest.approx(work)
    q = p.filter(pl.col("dep") == 1)
    assert res["prefill_ms"][1] * 1e3 < (q["t_ops_us"] * q["count"]).sum()  # steps overlap
    # PP 1: the plain sum of the steps
    q = p.filter(pl.col("dep") == 0)
    assert res["prefill_ms"][0] * 1e3 == pytest.approx((q["t_ops_us"] * q["count"]).sum())
