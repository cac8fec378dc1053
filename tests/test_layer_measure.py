"""One layer's ops measured on a GPU (``tsbatch/measured/layer.py``, ``bench/layer_ops.py``):
everything that runs without a GPU.

The timing itself needs CUDA; what is checked here is the spec and its errors, the op
list and shapes against ``tsbatch/serving/ops.py``'s lowering of the same model and
points (so that a change there that this does not follow fails here), the frame, the
predictions joined to a made-up measured file (the plumbing: which op is matched with
which prediction, the ratios; never an accuracy), and, where torch is installed, the
Triton kernels against their plain-torch twins and a whole CPU run (Triton's
interpreter), which checks that every op runs, never a time.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import polars as pl
import pytest

from tsbatch.errors import InputError
from tsbatch.measured import layer as L
from tsbatch.serving.models import load_model
from tsbatch.serving.ops import FAMILY_KEYS

ROOT = Path(__file__).resolve().parents[1]
HAS_TORCH = importlib.util.find_spec("torch") is not None


# ------------------------------------------------------------------ the spec
def test_default_spec_is_the_device_file():
    d = L.default_spec()
    f = L.load_layer_spec(ROOT / "bench" / "device" / "layer.toml")
    assert f == L.LayerSpec(**{**d.__dict__, "name": f.name})
    assert d.config.kind == "dense" and d.dtype == "bfloat16"
    pts = L.spec_points(d)
    assert [p["phase"] for p in pts] == ["prefill"] * 2 + ["decode"] * 8
    assert (pts[1]["m"], pts[1]["reqs"], pts[1]["seq"], pts[1]["ctx"]) == (8 * 512, 8, 512, 0)
    assert (pts[-1]["m"], pts[-1]["reqs"], pts[-1]["seq"], pts[-1]["ctx"]) == (128, 128, 0, 4096)
    assert [p["point"] for p in pts] == [0, 1, *range(8)]


def _spec_file(tmp_path, text):
    p = tmp_path / "layer.toml"
    p.write_text(textwrap.dedent(text))
    return p


def test_spec_file_values(tmp_path):
    s = L.load_layer_spec(_spec_file(tmp_path, """
        model = "Qwen/Qwen3-8B"
        dtype = "fp16"
        tp = 2
        decode = [[4, 100]]
        target_ms = 5
        max_repeats = 7
        profile = false
        graph = false
        time_budget_s = 0
    """))
    assert (s.model, s.dtype, s.tp, s.prefill, s.decode) == ("Qwen/Qwen3-8B", "float16", 2, (),
                                                              ((4, 100),))
    assert (s.target_ms, s.max_repeats, s.profile, s.graph, s.time_budget_s) == (5.0, 7, False,
                                                                              False, 0.0)


@pytest.mark.parametrize("text, match", [
    ("decode = [[1, 8]]\nbogus = 1", r"unknown keys \['bogus'\]"),
    ("decode = [[1, 8]]\ndtype = 'float32'", r"dtype = 'float32': use one of bfloat16, float16"),
    ("decode = [[1, 8]]\ndtype = 3", r"dtype = 3"),
    ("prefill = [[1, 8, 3]]", r"prefill\[0\] must be \[sequences, prompt_len\], got \[1, 8, 3\]"),
    ("prefill = [[1, 0]]", r"prefill\[0\] prompt_len must be a positive integer, got 0"),
    ("decode = [[true, 8]]", r"decode\[0\] batch must be a positive integer, got True"),
    ("decode = 5", r"'decode' must be a list of \[batch, ctx\] pairs, got 5"),
    ("model = 'meta-llama/Meta-Llama-3-8B'", r"give at least one point"),
    ("decode = [[1, 8]]\ntp = 0", r"tp must be a positive integer, got 0"),
    ("decode = [[1, 8]]\ntp = 3", r"tp = 3: the 32 attention heads of .* are not divisible"),
    ("decode = [[1, 8]]\nmodel = 'no-such-model'", r"model = 'no-such-model': unknown model"),
    ("decode = [[1, 8]]\nmodel = 'Qwen/Qwen3-30B-A3B'", r"is a moe model; .* dense"),
    ("decode = [[1, 8]]\nmodel = 'deepseek-ai/DeepSeek-V3'", r"is a mla model"),
    ("decode = [[1, 8192]]\nmodel = 'mistralai/Mistral-7B-v0.1'",
     r"sliding window of 4096 tokens, shorter than a point's 8192"),
    ("decode = [[1, 8]]\ntarget_ms = 0", r"target_ms must be a positive number, got 0"),
    ("decode = [[1, 8]]\ntime_budget_s = -1", r"time_budget_s must be a positive number or 0"),
    ("decode = [[1, 8]]\nmax_repeats = 2.5", r"max_repeats must be a positive integer"),
    ("decode = [[1, 8]]\nprofile = 'yes'", r"profile must be true or false, got 'yes'"),
    ("decode = [[1, 8]", r"invalid TOML"),
])
def test_spec_errors_name_key_and_value(tmp_path, text, match):
    p = _spec_file(tmp_path, text)
    with pytest.raises(InputError, match=match) as ei:
        L.load_layer_spec(p)
    assert str(p) in str(ei.value)


def test_spec_missing_file(tmp_path):
    with pytest.raises(InputError, match=r"nope\.toml: cannot read the layer spec"):
        L.load_layer_spec(tmp_path / "nope.toml")


def test_mistral_window_at_the_longest_point_is_full_attention(tmp_path):
    s = L.load_layer_spec(_spec_file(tmp_path, "model = 'mistralai/Mistral-7B-v0.1'\n"
                                               "decode = [[1, 4096]]"))
    assert s.decode == ((1, 4096),)


# ------------------------------------------------------------------ the ops against ops.py
CASES = [("meta-llama/Meta-Llama-3-8B", 1, "h100_sxm"), ("meta-llama/Meta-Llama-3-8B", 1, "a100"),
         ("Qwen/Qwen3-8B", 1, "h100_sxm"), ("Qwen/Qwen2.5-7B", 1, "a100"),
         ("meta-llama/Llama-3.1-70B", 4, "h200")]
PTS = [{"phase": "prefill", "point": 0, "m": 3 * 700, "reqs": 3, "seq": 700, "ctx": 0},
       {"phase": "prefill", "point": 1, "m": 64, "reqs": 1, "seq": 64, "ctx": 0},
       {"phase": "decode", "point": 0, "m": 5, "reqs": 5, "seq": 0, "ctx": 3000},
       {"phase": "decode", "point": 1, "m": 256, "reqs": 256, "seq": 0, "ctx": 128}]
_SHAPE = {"gemm": {"n": "n", "k": "k"},
          "rowwise": {"row_op": "op", "rows": "rows", "hidden": "hidden", "residual": "residual"},
          "attention": {k: k for k in ("batch", "heads", "kv_heads", "seq_len", "head_dim",
                                       "causal")},
          "flash_decoding": {k: k for k in ("batch", "heads", "kv_heads", "seq_len_kv",
                                            "head_dim")}}
_SHAPE["attention_fa3"] = _SHAPE["attention"]


@pytest.mark.parametrize("model, tp, gpu", CASES)
def test_layer_ops_are_the_lowerings_ops(model, tp, gpu):
    """Same op names in the same order, same families, same GEMM m/n/k, rowwise rows and
    widths, attention keys as ops.py's lowering of the same model and points."""
    from tsbatch.hw import get_hw

    cfg = load_model(model)
    hopper = get_hw(gpu).arch == "hopper"
    low = L.lowered_layer(model, gpu, PTS, tp)
    rows = pl.concat([f.with_columns(pl.lit(fam).alias("family")) for fam, f in low.items()],
                     how="diagonal_relaxed")
    for pt in PTS:
        mine = L.layer_ops(cfg, pt, tp, hopper)
        theirs = rows.filter((pl.col("phase") == pt["phase"]) & (pl.col("point") == pt["point"])) \
            .sort("order").to_dicts()
        assert [o["op"] for o in mine] == [r["op_name"] for r in theirs], pt
        assert [o["op"] for o in mine] == [o for o in L.LAYER_OPS
                                           if o != "qk_norm" or cfg.qk_norm]
        for o, r in zip(mine, theirs):
            assert o["family"] == r["family"], (pt, o["op"])
            if o["family"] == "gemm":
                assert r["m"] == pt["m"], (pt, o["op"])
            for mk, rk in _SHAPE[o["family"]].items():
                assert o[mk] == r[rk], (pt, o["op"], mk, o[mk], r[rk])
            # every key of the family is covered by the layer's own columns (or the point)
            assert set(FAMILY_KEYS[o["family"]]) - {"gpu", "impl", "dtype", "variant", "window",
                                                     "m"} <= set(_SHAPE[o["family"]].values())


def test_layer_ops_shard_by_tp():
    cfg = load_model("meta-llama/Llama-3.1-70B")
    pt = PTS[2]
    one = {o["op"]: o for o in L.layer_ops(cfg, pt, 1)}
    four = {o["op"]: o for o in L.layer_ops(cfg, pt, 4)}
    assert one["qkv_proj"]["n"] == (64 + 16) * 128 and four["qkv_proj"]["n"] == (16 + 4) * 128
    assert four["gate_up_proj"]["n"] * 4 == one["gate_up_proj"]["n"] == 2 * 28672
    assert four["down_proj"]["k"] == 28672 // 4 and four["o_proj"]["k"] == 16 * 128
    assert (four["attention"]["heads"], four["attention"]["kv_heads"]) == (16, 2)


def test_copies_cover_twice_the_l2():
    l2 = 50 << 20
    for nbytes in (1, 4 << 20, 33 << 20, 50 << 20, 99 << 20, 100 << 20, 300 << 20):
        n = L._copies(nbytes, l2)
        assert 1 <= n <= L.MAX_COPIES
        if n < L.MAX_COPIES:
            assert n * nbytes >= 2 * l2
        if n > 1:
            assert (n - 1) * nbytes < 2 * l2
    assert L._copies(300 << 20, l2) == 1 and L._copies(1, l2) == L.MAX_COPIES


# ------------------------------------------------------------------ the frame
def _records(spec: L.LayerSpec, gpu="h100_sxm", hopper=True, layer=True):
    """Made-up records of a run (times from the op's position, not from any data)."""
    cfg = spec.config
    recs = []
    for pt in L.spec_points(spec):
        ops = L.layer_ops(cfg, pt, spec.tp, hopper)
        for i, row in enumerate(ops):
            recs.append({"gpu": gpu, "model": spec.model, "dtype": spec.dtype, "tp": spec.tp,
                         **pt, **row, "time_ms": 0.003 * (i + 1) * (pt["point"] + 1),
                         "time_ms_min": 0.002, "repeats": 9, "copies": 1, "kernels": 1,
                         "kernel_names": f"k{i}", "kernel_ms": 0.002 * (i + 1)})
        if layer:
            for op in ("layer", "layer_graph"):
                recs.append({"gpu": gpu, "model": spec.model, "dtype": spec.dtype,
                             "tp": spec.tp, **pt, "op": op, "family": "layer",
                             "time_ms": 0.05, "repeats": 3})
    return recs


SMALL = L.LayerSpec(prefill=((2, 300),), decode=((4, 1000), (64, 2000)))


def test_layer_frame_schema_and_nulls():
    recs = _records(SMALL)
    f = L.layer_frame(recs)
    assert f.columns == list(L.LAYER_SCHEMA)
    assert {k: str(v) for k, v in f.schema.items()} == {k: t for k, (t, _) in
                                                        L.LAYER_SCHEMA.items()}
    assert f.height == len(recs) == 3 * (10 + 2)
    g = f.filter(pl.col("op") == "gate_up_proj")
    assert g["n"].to_list() == [2 * 14336] * 3 and g["k"].to_list() == [4096] * 3
    assert g["row_op"].null_count() == 3 and g["seq_len"].null_count() == 3
    lay = f.filter(pl.col("op") == "layer")
    assert lay["kernels"].null_count() == lay.height and lay["n"].null_count() == lay.height
    att = f.filter((pl.col("op") == "attention") & (pl.col("phase") == "decode"))
    assert att["seq_len_kv"].to_list() == [1000, 2000] and att["family"].unique().to_list() == [
        "flash_decoding"]
    assert L.layer_frame([]).columns == list(L.LAYER_SCHEMA)
    with pytest.raises(ValueError, match=r"unknown keys \['wat'\]"):
        L.layer_frame([{**recs[0], "wat": 1}])
    with pytest.raises(ValueError, match="time_ms must be positive"):
        L.layer_frame([{**recs[0], "time_ms": 0.0}])


# ------------------------------------------------------------------ predictions and the script
def test_predict_layer_matches_ops_and_ratios():
    from tsbatch.serving.predict import _evaluate_family

    f = L.layer_frame(_records(SMALL))
    p = L.predict_layer(f)
    assert p.height == f.height
    ops = p.filter(~pl.col("op").is_in(["layer", "layer_graph"]))
    assert ops["pred_us"].null_count() == 0 and (ops["pred_us"] > 0).all()
    assert (ops["pred_family"] == ops["family"]).all()
    r = ops["time_ms"] * 1e3 / ops["pred_us"]
    assert (ops["ratio"] - r).abs().max() < 1e-12
    assert ((ops["kernel_ratio"] - ops["kernel_ms"] * 1e3 / ops["pred_us"]).abs().max()) < 1e-12
    # the op as a step composes it: the body without the kernel's launch, plus the gap
    from tsbatch.serving.deploy import engine_profile

    gap = {ph: engine_profile("vllm")[f"gap_{ph}_us"] for ph in ("prefill", "decode")}
    for row in ops.iter_rows(named=True):
        assert 0 < row["pred_step_us"] <= row["pred_us"] + gap[row["phase"]] + 1e-9
    # each GEMM row is the GEMM family's prediction of that row's own m, n, k
    g = ops.filter(pl.col("family") == "gemm").select("m", "n", "k", "pred_us")
    keys = g.select("m", "n", "k").with_columns(pl.lit("h100_sxm").alias("gpu"),
                                                pl.lit("bfloat16").alias("dtype"),
                                                pl.lit("cublas").alias("impl"))
    want = _evaluate_family("gemm", keys, None).select("m", "n", "k", "t_kernel_us")
    j = g.join(want, on=["m", "n", "k"])
    assert j.height == g.height and (j["pred_us"] == j["t_kernel_us"]).all()
    # FA-3 predicted on Hopper, the FA-2 family beside it; nowhere else
    alt = ops.filter(pl.col("pred_alt_us").is_not_null())
    assert alt["op"].to_list() == ["attention"] and alt["pred_family"].to_list() == ["attention_fa3"]
    # the layer rows: sums of their point's op predictions
    for row in p.filter(pl.col("op").is_in(["layer", "layer_graph"])).iter_rows(named=True):
        s = ops.filter((pl.col("phase") == row["phase"]) & (pl.col("point") == row["point"]))
        assert row["pred_us"] == pytest.approx(s["pred_us"].sum(), rel=1e-12)
        assert row["ratio"] == pytest.approx(row["time_ms"] * 1e3 / row["pred_us"], rel=1e-12)
    # --hw: another GPU (not Hopper): FA-2 family, no alternative
    a = L.predict_layer(f, hw="a100")
    att = a.filter((pl.col("op") == "attention") & (pl.col("phase") == "prefill"))
    assert att["pred_family"].to_list() == ["attention"] and att["pred_alt_us"].null_count() == 1
    assert not a["pred_us"].equals(p["pred_us"])


def test_predict_layer_errors():
    f = L.layer_frame(_records(SMALL))
    two = pl.concat([f, f.with_columns(pl.lit("a100").alias("gpu"))])
    with pytest.raises(InputError, match="several GPUs"):
        L.predict_layer(two)
    with pytest.raises(InputError, match="unknown system or GPU 'no_gpu'"):
        L.predict_layer(f.with_columns(pl.lit("no_gpu").alias("gpu")))
    with pytest.raises(InputError, match="no rows"):
        L.predict_layer(f.head(0))


def _load_bench():
    spec = importlib.util.spec_from_file_location("layer_ops_bench", ROOT / "bench" / "layer_ops.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_bench_layer_ops_on_a_written_file(tmp_path, capsys):
    from tsbatch.boundary.io import read_metadata, write_parquet
    from tsbatch.measured.measure import measurement_metadata

    spec = L.LayerSpec(prefill=((2, 300),), decode=((4, 1000),))
    f = L.layer_frame(_records(spec))
    path = tmp_path / "layer.parquet"
    write_parquet(f, path, measurement_metadata({"gpu": "h100_sxm", "torch": "2.11.0",
                                                 "triton": "3.6.0"}, "layer"))
    assert read_metadata(path)["tsbatch.measure_kind"] == "layer"
    bench = _load_bench()
    csv = tmp_path / "out.csv"
    assert bench.main([str(path), "--csv", str(csv)]) == 0
    out = capsys.readouterr().out
    assert "prefill 0: 2 x 300 tokens (m 600)" in out and "decode 0: batch 4, ctx 1000" in out
    pred = L.predict_layer(f)
    for r in pred.filter(pl.col("op") == "down_proj").iter_rows(named=True):
        line = next(ln for ln in out.splitlines()
                    if ln.strip().startswith("down_proj") and f"{r['pred_us']:.1f}" in ln)
        assert f"{r['time_ms'] * 1e3:.1f}" in line and f"{r['ratio']:.3f}" in line
    for op in L.LAYER_OPS:
        if op != "qk_norm":
            assert sum(ln.strip().startswith(op + " ") for ln in out.splitlines()) == 2 + 1
    assert "layer, back to back" in out and "layer, CUDA graph" in out
    assert "median measured / predicted" in out
    back = pl.read_csv(csv)
    assert back.height == f.height and "ratio" in back.columns
    # a file of two GPUs needs --hw; a missing file is one line, exit 2
    two = tmp_path / "two.parquet"
    pl.concat([f, f.with_columns(pl.lit("a100").alias("gpu"))]).write_parquet(two)
    assert bench.main([str(two)]) == 2
    assert "several GPUs" in capsys.readouterr().err
    assert bench.main([str(two), "--hw", "a100"]) == 0
    assert bench.main([str(tmp_path / "none.parquet")]) == 2
    capsys.readouterr()
    # --spec: the predictions alone for a spec, on --hw
    small = _spec_file(tmp_path, "prefill = [[2, 300]]\ndecode = [[4, 1000]]")
    assert bench.main(["--spec", str(small), "--hw", "h100_sxm"]) == 0
    alone = capsys.readouterr().out
    assert "(no measured times: the predictions alone)" in alone
    for r in pred.filter(pl.col("op") == "gate_up_proj").iter_rows(named=True):
        assert any(ln.strip().startswith("gate_up_proj") and f"{r['pred_us']:.1f}" in ln
                   for ln in alone.splitlines())
    for bad in ([], ["--spec", str(small)], [str(path), "--spec", str(small)],
                ["--spec", str(small), "--hw", "no_gpu"]):
        assert bench.main(bad) == 2, bad
        assert capsys.readouterr().err.startswith("error: ")


def test_run_layer_part_needs_a_gpu(tmp_path, monkeypatch):
    if HAS_TORCH:
        import torch

        if torch.cuda.is_available():
            pytest.skip("a CUDA device is present")
    with pytest.raises(InputError, match="needs a CUDA GPU with torch and triton"):
        L.run_layer_part(tmp_path, L.default_spec(), quiet=True)
    assert not (tmp_path / "layer.parquet").exists()


def test_layer_module_imports_no_torch():
    code = ("import sys, tsbatch.measured.layer as L; L.default_spec(); "
            "print('torch' in sys.modules, 'triton' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True)
    assert out.stdout.split() == ["False", "False"]


# ------------------------------------------------------------------ with torch (CPU)
CPU_RUN = r"""
import json, os, sys
os.environ["TRITON_INTERPRET"] = "1"
import torch
from tsbatch.measured import layer as L
from tsbatch.measured import layer_kernels as K
R = L.reference_ops(torch)
torch.manual_seed(0)
dt = torch.bfloat16
out = {}
def pair(*s):
    a = torch.randn(*s).to(dt)
    return a, a.clone()
def diff(a, b):
    return (a.float() - b.float()).abs().max().item()
x, x2 = pair(5, 200); r, r2 = pair(5, 200); w = torch.randn(200).to(dt)
K.add_rmsnorm(x, w, r); R.add_rmsnorm(x2, w, r2)
out["add_rmsnorm"] = [diff(x, x2), diff(r, r2), x.float().abs().max().item()]
x, x2 = pair(7, 64)
K.add_rmsnorm(x, w[:64]); R.add_rmsnorm(x2, w[:64])
out["rmsnorm"] = [diff(x, x2), x.float().abs().max().item()]
x = torch.randn(4, 3000).to(dt); o1 = torch.zeros(4, 1500, dtype=dt); o2 = o1.clone()
K.silu_mul(x, o1); R.silu_mul(x, o2)
out["silu_mul"] = [diff(o1, o2), o1.float().abs().max().item()]
hq, hkv, hd = 6, 2, 96
qkv, qkv2 = pair(9, (hq + 2 * hkv) * hd); before = qkv.clone()
pos = torch.randint(1, 30, (9,)); cs = L._rope_cache(torch, 30, hd, "cpu")
K.rope(qkv, pos, cs, hq + hkv, hd); R.rope(qkv2, pos, cs, hq + hkv, hd)
out["rope"] = [diff(qkv, qkv2), diff(qkv, before),
               diff(qkv[:, (hq + hkv) * hd:], before[:, (hq + hkv) * hd:])]
kc, kc2 = pair(20, hkv * hd); vc, vc2 = pair(20, hkv * hd)
slots = torch.tensor([3, 0, 19, 7, 8, 1, 2, 11, 12])
K.kv_write(qkv, slots, kc, vc, hq * hd, hkv * hd); R.kv_write(qkv, slots, kc2, vc2, hq * hd, hkv * hd)
out["kv_write"] = [torch.equal(kc, kc2), torch.equal(vc, vc2),
                   torch.equal(kc[3], qkv[0, hq * hd:(hq + hkv) * hd])]
spec = L.LayerSpec(model=sys.argv[1], prefill=((2, 24),), decode=((3, 40),), graph=False,
                   target_ms=1.0)
recs = L.run_layer(torch, {"gpu": "a100", "l2_bytes": 1 << 20}, spec, quiet=True, device="cpu")
f = L.layer_frame(recs)
out["ops"] = f.select("phase", "op", "family", "copies", "repeats", "kernels").rows()
out["impl"] = f.filter(f["op"] == "attention")["impl"].to_list()
print(json.dumps(out))
"""


@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed (the device machine has it)")
def test_kernels_match_their_torch_twins_and_a_cpu_run(tmp_path):
    cfgp = tmp_path / "config.json"
    cfgp.write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"], "hidden_size": 256,
                                "intermediate_size": 640, "num_hidden_layers": 2,
                                "num_attention_heads": 4, "num_key_value_heads": 2,
                                "head_dim": 64, "vocab_size": 1000}))
    run = subprocess.run([sys.executable, "-c", CPU_RUN, str(cfgp)], capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                             [str(ROOT), os.environ.get("PYTHONPATH", "")])}, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    # one bf16 rounding step of values of a few units
    for name in ("add_rmsnorm", "rmsnorm", "silu_mul"):
        assert max(out[name][:-1]) <= 2 ** -4, (name, out[name])
        assert out[name][-1] > 0.5, name
    assert out["rope"][0] <= 2 ** -4 and out["rope"][1] > 0.1 and out["rope"][2] == 0.0
    assert out["kv_write"] == [True, True, True]
    ops = out["ops"]
    want = [o for o in L.LAYER_OPS] + ["layer"]
    assert [r[1] for r in ops] == want * 2
    assert [r[0] for r in ops] == ["prefill"] * len(want) + ["decode"] * len(want)
    fam = {(r[0], r[1]): r[2] for r in ops}
    assert fam[("prefill", "attention")] == "attention" and fam[("decode", "attention")] == \
        "flash_decoding"
    # 1 MiB "L2": the KV cache of 3 x 40 tokens (60 KiB) cycles through 32 copies, the
    # 256 KiB qkv weight through 8; repeats and the (empty on the CPU) kernel count are recorded
    cp = {(r[0], r[1]): r[3] for r in ops}
    assert cp[("decode", "attention")] == L._copies(2 * 3 * 40 * 2 * 64 * 2, 1 << 20) > 1
    assert cp[("decode", "qkv_proj")] == L._copies((4 + 4) * 64 * 256 * 2, 1 << 20)
    assert all(r[4] >= 3 for r in ops) and all(r[5] == 0 for r in ops if r[1] != "layer")
    assert all("torch sdpa" in s for s in out["impl"])


# ------------------------------------------------------------------ the CUDA timing path, stood in for
class _FakeCuda:
    """Just enough of ``torch.cuda`` for :func:`layer._time_calls` and
    :func:`layer._graph_layer`: events stamped with a counter of device work, a log."""

    def __init__(self):
        self.log, self.clock = [], 0.0
        outer = self

        class Event:
            def __init__(self, enable_timing=False):
                assert enable_timing
                self.t = None

            def record(self):
                self.t = outer.clock

            def elapsed_time(self, other):
                return other.t - self.t

        class Stream:
            def wait_stream(self, other):
                outer.log.append("wait")

        class _Ctx:
            def __init__(self, what):
                self.what = what

            def __enter__(self):
                outer.log.append(f"enter {self.what}")

            def __exit__(self, *a):
                outer.log.append(f"exit {self.what}")

        class CUDAGraph:
            def replay(self):
                outer.log.append("replay")
                outer.clock += 0.5

        self.Event, self.Stream, self.CUDAGraph = Event, Stream, CUDAGraph
        self.stream = lambda s: _Ctx("stream")
        self.graph = lambda g: _Ctx("graph")
        self.current_stream = lambda: Stream()

    def synchronize(self):
        self.log.append("sync")

    def _sleep(self, cycles):
        self.log.append(("sleep", cycles))


def test_time_calls_queue_behind_a_gpu_sleep():
    import types

    cuda = _FakeCuda()
    torch = types.SimpleNamespace(cuda=cuda)

    def op():  # 0.01 ms of device work a call
        cuda.log.append("op")
        cuda.clock += 0.01

    times = L._time_calls(torch, op, target_ms=0.3, max_rep=100)
    assert len(times) == 30 and all(t == pytest.approx(0.01) for t in times)
    sleeps = [i for i, e in enumerate(cuda.log) if isinstance(e, tuple)]
    assert len(sleeps) == 1 and cuda.log[sleeps[0]][1] > 0
    assert cuda.log[sleeps[0] + 1:].count("op") == 30      # every timed call after the sleep
    assert cuda.log[-1] == "sync"
    assert len(L._time_calls(torch, op, target_ms=1e6, max_rep=7)) == 7
    assert len(L._time_calls(torch, op, target_ms=1e-6, max_rep=7)) == 5
    calls = []
    replay, _g = L._graph_layer(torch, [lambda: calls.append("a"), lambda: calls.append("b")])
    assert calls == ["a", "b"] * 3                       # two warm-ups on a side stream, capture
    assert cuda.log[-3:] == ["enter graph", "exit graph", "sync"]
    replay()
    assert cuda.log[-1] == "replay"


def test_run_layer_goes_on_past_a_failed_point_and_stops_at_its_budget(monkeypatch):
    """The loop around the points, with the per-point work stood in for: a point that
    raises is counted and logged, the next one runs, the file callback sees every point;
    no new point starts once the time budget is spent."""
    import dataclasses
    import time

    def fake_point(torch, K, cfg, spec, pt, device, hopper, l2, base, records, line, stats,
                   graph_ok, quiet):
        if pt["phase"] == "decode" and pt["point"] == 0:
            raise RuntimeError("CUDA out of memory")
        records.append({**base, "phase": pt["phase"], "point": pt["point"], "op": "layer",
                        "time_ms": 1.0})
        return graph_ok

    monkeypatch.setattr(L, "_run_point", fake_point)
    spec = L.LayerSpec(prefill=((1, 64),), decode=((1, 128), (2, 128)), time_budget_s=0)
    seen, stats = [], {}
    recs = L.run_layer(None, {"gpu": "h100_sxm"}, spec, quiet=True, device="cpu",
                       on_point=lambda r, d, n: seen.append((len(r), d, n)), stats=stats)
    assert [(r["phase"], r["point"]) for r in recs] == [("prefill", 0), ("decode", 1)]
    assert seen == [(1, 1, 3), (1, 2, 3), (2, 3, 3)]
    assert (stats["point_errors"], stats["points_done"], stats["points_planned"]) == (1, 3, 3)

    def slow_point(*a, **k):
        time.sleep(0.05)
        return fake_point(*a, **k)

    monkeypatch.setattr(L, "_run_point", slow_point)
    stats = {}
    recs = L.run_layer(None, {"gpu": "h100_sxm"}, dataclasses.replace(spec, time_budget_s=0.01),
                       quiet=True, device="cpu", stats=stats)
    assert len(recs) == 1 and stats["points_done"] == 1
