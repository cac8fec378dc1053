"""Pruning API and the Triton autotune adapter (no Triton, no GPU).

The adapter is driven with objects shaped like ``triton.Config`` (``kwargs``,
``num_warps``, ``num_stages``) and fake tensors that only carry ``.dtype``.
Every kept set is checked against the top of a full :func:`evaluate` +
:func:`rank` of the same configurations.
"""

from __future__ import annotations

import itertools
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from tsbatch.errors import InputError
from tsbatch.engine.evaluate import evaluate
from tsbatch.engine.prune import NoFeasibleConfigError, Pruner, PruneResult, prune
from tsbatch.engine.rank import keep_count, rank
from tsbatch.front.triton_adapter import config_to_dict, dtype_name, early_config_prune

TILE = ("block_m", "block_n", "block_k", "num_stages", "num_warps")


def _grid(n: int | None = None, seed: int = 0, extra: bool = False) -> list[dict]:
    """Distinct configurations; some infeasible on every GPU (huge smem)."""
    space = list(itertools.product([16, 32, 64, 128, 256], [16, 32, 64, 128, 256],
                                   [32, 64, 128], [2, 3, 4, 6], [2, 4, 8]))
    rng = np.random.default_rng(seed)
    if n is not None:
        space = [space[i] for i in rng.choice(len(space), n, replace=False)]
    out = [dict(zip(TILE, (int(v) for v in c))) for c in space]
    if extra:
        for i, c in enumerate(out):
            c["group_m"] = (4, 8, 16)[i % 3]
            c["split_k"] = (1, 1, 2)[i % 3]
            c["raster"] = ("grouped", "row", "persistent")[i % 3]
    return out


def _reference(workload: dict, configs: list[dict], hw: str, top: float):
    """(indices, latencies) of the top of a full evaluate + rank."""
    df = pl.DataFrame(configs).with_columns(**{k: pl.lit(v) for k, v in workload.items()})
    ranked = rank(evaluate(df, hw).with_row_index("_i"), [], top=top)
    return ranked["_i"].to_list(), ranked["latency_us"].to_numpy()


WORKLOADS = [
    ("h100", {"m": 4096, "n": 4096, "k": 4096, "dtype": "float16"}),
    ("h100", {"m": 16, "n": 8192, "k": 2048, "dtype": "bfloat16"}),
    ("a100", {"m": 1024, "n": 512, "k": 8192, "dtype": "float32", "tf32": True}),
    ("h100", {"m": 2048, "n": 1536, "k": 768, "dtype": "float8", "b_row_major": False}),
]


@pytest.mark.parametrize("hw,workload", WORKLOADS)
def test_prune_matches_full_ranking(hw, workload):
    configs = _grid(240, seed=len(workload))
    res = prune(workload, configs, hw=hw)
    assert isinstance(res, PruneResult)
    n_keep = keep_count(len(configs), 0.05)
    assert n_keep == max(1, math.ceil(0.05 * len(configs)))
    ref_idx, ref_lat = _reference(workload, configs, hw, 0.05)
    assert len(res) == len(ref_idx) == min(n_keep, res.n_feasible)
    assert list(res.indices) == ref_idx
    np.testing.assert_allclose(res.latency_us, ref_lat, rtol=1e-12)
    assert list(res.latency_us) == sorted(res.latency_us)
    assert all(np.isfinite(res.latency_us))
    for i, c in zip(res.indices, res.configs):
        assert {k: c[k] for k in TILE} == configs[i]
    # the full (unscreened) path agrees
    full = prune(workload, configs, hw=hw, screen=False)
    assert full.indices == res.indices and full.latency_us == res.latency_us
    assert res.n_predicted <= full.n_predicted == res.n_feasible


@pytest.mark.parametrize("m,n,k,dtype,top", [
    (1, 8192, 8192, "float16", 0.05), (16, 4096, 4096, "bfloat16", 0.02),
    (64, 14336, 4096, "float16", 0.1), (8, 1024, 1024, "float8", 0.05),
    (32768, 1024, 1024, "float16", 0.01), (300, 700, 5000, "float32", 0.3),
])
@pytest.mark.parametrize("round_min", [None, 1])
def test_screen_rounds_match_unscreened(m, n, k, dtype, top, round_min, monkeypatch):
    """The rounds (first the smallest bounds, then halves of the rows that can still
    make it) keep exactly what predicting every row keeps, also for memory-bound
    shapes where the bound is loose and several rounds run (``round_min`` 1:
    every later round takes a half, however few rows remain)."""
    import tsbatch.engine.prune as prune_mod

    if round_min is not None:
        monkeypatch.setattr(prune_mod, "_ROUND_MIN", round_min)
    configs = _grid(300, seed=m % 7, extra=True)
    wl = {"m": m, "n": n, "k": k, "dtype": dtype}
    res = prune(wl, configs, top=top)
    full = prune(wl, configs, top=top, screen=False)
    assert res.indices == full.indices and res.latency_us == full.latency_us
    assert res.n_predicted <= full.n_predicted


def test_prune_kept_are_feasible_and_optional_columns():
    workload = {"m": 3000, "n": 2000, "k": 1000, "dtype": "float16"}
    configs = _grid(150, seed=3, extra=True)
    res = prune(workload, configs, hw="h100", top=0.2)
    ref_idx, ref_lat = _reference(workload, configs, "h100", 0.2)
    assert list(res.indices) == ref_idx
    np.testing.assert_allclose(res.latency_us, ref_lat, rtol=1e-12)
    df = pl.DataFrame([configs[i] for i in res.indices]).with_columns(
        **{k: pl.lit(v) for k, v in workload.items()})
    assert evaluate(df, "h100")["feasible"].all()
    assert [c["raster"] for c in res.configs] == [configs[i]["raster"] for i in res.indices]
    assert res.n_feasible < res.n_candidates  # the grid holds infeasible tiles


def test_prune_accepts_dataframe_and_iterates():
    workload = {"m": 512, "n": 512, "k": 512, "dtype": "bfloat16"}
    configs = _grid(60, seed=5)
    a = prune(workload, configs, top=0.1)
    b = prune(workload, pl.DataFrame(configs), top=0.1)
    assert a.indices == b.indices and a.latency_us == b.latency_us
    items = list(a)
    assert [p.index for p in items] == list(a.indices)
    assert a[0].latency_us == a.latency_us[0] and a[0].config == a.configs[0]


def test_keep_count_rounding_and_ties():
    workload = {"m": 1024, "n": 1024, "k": 1024, "dtype": "float16"}
    base = {"block_m": 128, "block_n": 128, "block_k": 64, "num_stages": 3, "num_warps": 8}
    configs = [dict(base) for _ in range(7)]  # identical: all tie
    res = prune(workload, configs, top=0.3)
    assert res.indices == (0, 1, 2)  # ceil(2.1) = 3, ties by input order
    assert len(prune(workload, configs, top=1e-6)) == 1
    assert len(prune(workload, configs, top=1.0)) == 7


def test_pruner_cache_hit_is_identical():
    pr = Pruner("h100", top=0.05)
    workload = {"m": 4096, "n": 1024, "k": 512, "dtype": "float16"}
    configs = _grid(100, seed=7)
    first = pr.prune(workload, configs)
    again = pr(dict(workload), [dict(c) for c in configs])
    assert again is first
    assert (pr.hits, pr.misses) == (1, 1)
    other = pr.prune({**workload, "m": 4097}, configs)
    assert pr.misses == 2 and other is not first
    assert pr.prune(workload, configs, top=0.5) is not first
    assert first == prune(workload, configs, hw="h100")
    pr.cache_clear()
    assert pr.prune(workload, configs) == first and pr.misses == 1


def test_all_infeasible_raises():
    configs = [{"block_m": 256, "block_n": 256, "block_k": 256, "num_stages": 8, "num_warps": 4}]
    with pytest.raises(NoFeasibleConfigError, match="none of the 1 configurations can run"):
        prune({"m": 64, "n": 64, "k": 64, "dtype": "float32"}, configs)
    assert issubclass(NoFeasibleConfigError, InputError)


@pytest.mark.parametrize("workload,configs,pattern", [
    ({"m": 1, "n": 1, "dtype": "float16"}, [{}], "workload lacks 'k'"),
    ({"m": 0, "n": 1, "k": 1, "dtype": "float16"}, [{}], "'m' must be a positive integer"),
    ({"m": 8, "n": 8, "k": 8, "dtype": "int8"}, [{}], "'dtype' 'int8' is not one of"),
    ({"m": 8, "n": 8, "k": 8, "dtype": "float16", "batch": 2}, [{}], "unknown key 'batch'"),
    ({"m": 8, "n": 8, "k": 8, "dtype": "float16"}, [], "configs is empty"),
    ({"m": 8, "n": 8, "k": 8, "dtype": "float16"}, [{"block_m": 16}], r"configs\[0\] lacks"),
    ({"m": 8, "n": 8, "k": 8, "dtype": "float16"},
     [dict(block_m=16, block_n=16, block_k=16, num_stages=2, num_warps=4, blockk=3)],
     "unknown key 'blockk'"),
    ({"m": 8, "n": 8, "k": 8, "dtype": "float16"},
     [dict(block_m=16, block_n=16, block_k=16, num_stages=2, num_warps=0)],
     r"configs\[0\]\['num_warps'\] must be a positive integer"),
    ({"m": 8, "n": 8, "k": 8, "dtype": "float16"},
     [dict(block_m=16, block_n=16.5, block_k=16, num_stages=2, num_warps=4)],
     r"configs\[0\]\['block_n'\] must be a positive integer, got 16.5"),
    ({"m": 8, "n": 8, "k": 8, "dtype": "float16"},
     [dict(block_m=16, block_n=16, block_k=16, num_stages=2, num_warps=4, raster="spiral")],
     r"\['raster'\] 'spiral' is not one of"),
    ({"m": 8, "n": 8, "k": 8, "dtype": "float16"}, {"block_m": [16]}, "list of dicts"),
])
def test_input_errors(workload, configs, pattern):
    with pytest.raises(InputError, match=pattern):
        prune(workload, configs)


def test_bad_top_and_hw():
    w = {"m": 8, "n": 8, "k": 8, "dtype": "float16"}
    c = [dict(block_m=16, block_n=16, block_k=16, num_stages=2, num_warps=4)]
    for top in (0, 1.5, "x"):
        with pytest.raises(InputError, match="top must be a fraction"):
            prune(w, c, top=top)
    with pytest.raises(InputError):
        prune(w, c, hw="no_such_gpu")



def _cfg_equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and a[k].tolist() == b[k].tolist() for k in a)


@pytest.mark.parametrize("variant", ["plain", "extra", "mixed_keys", "numpy_ints", "bools",
                                     "floats", "int32", "float_optional", "huge", "one",
                                     "all_bools"])
def test_config_columns_fast_path_matches_row_loop(variant):
    """The loop-free reading of config dicts gives exactly the row loop's columns, or
    declines (``None``) and leaves the input to the row loop."""
    from tsbatch.engine.prune import _config_arrays, _dict_columns, _dict_columns_fast

    configs = _grid(40, seed=9, extra=variant in ("extra", "float_optional"))
    if variant == "numpy_ints":
        configs = [{k: np.int64(v) for k, v in c.items()} for c in configs]
    elif variant == "bools":
        configs[3]["num_stages"] = True  # an int to numpy, as in the row loop
    elif variant == "floats":
        configs[5]["block_k"] = 64.0
    elif variant == "int32":
        configs = [{k: np.int32(v) for k, v in c.items()} for c in configs]
    elif variant == "float_optional":
        configs[7]["group_m"] = 4.0
    elif variant == "mixed_keys":  # optional keys in some dicts only
        configs[2]["group_m"] = 4
        configs[4]["split_k"] = 2
        configs[6]["raster"] = "row"
    elif variant == "huge":  # beyond int64: left to the row loop
        configs[1]["block_m"] = 2**70
        assert _dict_columns_fast(configs, len(configs)) is None
        return
    elif variant == "one":
        configs = configs[:1]
    elif variant == "all_bools":  # the row loop's error, not ones
        from tsbatch.engine.prune import _INT_CONFIG

        configs = [{k: True for k in _INT_CONFIG} for _ in range(3)]
        assert _dict_columns_fast(configs, len(configs)) is None
        with pytest.raises(InputError, match="positive integer"):
            _config_arrays(configs)
        return
    slow = _dict_columns(configs, len(configs))
    fast = _dict_columns_fast(configs, len(configs))
    if variant in ("floats", "float_optional"):
        assert fast is None
    else:
        assert fast is not None and _cfg_equal(fast, slow)
    assert _cfg_equal(_config_arrays(configs), slow)


# --------------------------------------------------------------------------- Triton adapter


class FakeConfig:
    """Shaped like ``triton.Config``."""

    def __init__(self, kwargs, num_warps=4, num_stages=3):
        self.kwargs = kwargs
        self.num_warps = num_warps
        self.num_stages = num_stages

    def __repr__(self):
        return f"FakeConfig({self.kwargs}, w={self.num_warps}, s={self.num_stages})"


class FakeTensor:
    def __init__(self, dtype):
        self.dtype = dtype


class FakeTorchDtype:
    def __init__(self, name):
        self.name = name

    def __str__(self):
        return f"torch.{self.name}"


def _fake_configs(spelling: str = "BLOCK_M", n: int = 120, seed: int = 11):
    names = {"BLOCK_M": ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M"),
             "BLOCK_SIZE_M": ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M")}[spelling]
    out = []
    for c in _grid(n, seed=seed):
        kw = dict(zip(names, (c["block_m"], c["block_n"], c["block_k"], 8)))
        out.append(FakeConfig(kw, num_warps=c["num_warps"], num_stages=c["num_stages"]))
    return out


def _expected(configs, workload, hw="h100", top=0.05):
    rows = [config_to_dict(c) for c in configs]
    ref_idx, _ = _reference(workload, [{k: r[k] for k in TILE} for r in rows], hw, top)
    return [configs[i] for i in ref_idx]


def test_adapter_does_not_import_triton():
    code = ("import sys, tsbatch.front.triton_adapter as ta; "
            "assert 'triton' not in sys.modules, 'triton imported'; "
            "ta.early_config_prune('h100')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parent.parent)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("spelling", ["BLOCK_M", "BLOCK_SIZE_M"])
def test_adapter_keeps_predicted_top(spelling):
    configs = _fake_configs(spelling)
    fn = early_config_prune(hw="h100")
    args = {"a_ptr": FakeTensor(FakeTorchDtype("float16")), "b_ptr": FakeTensor("torch.float16"),
            "c_ptr": FakeTensor("torch.float16"), "M": 2048, "N": 4096, "K": 1024}
    kept = fn(configs, args)
    assert len(kept) == keep_count(len(configs), 0.05)
    assert kept == _expected(configs, {"m": 2048, "n": 4096, "k": 1024, "dtype": "float16"})
    assert all(any(k is c for c in configs) for k in kept)  # the same objects
    # Triton >= 3 passes extra keyword arguments; a second call hits the cache
    assert fn(configs, args, num_warps=None) == kept
    assert fn.pruner.hits == 1


@pytest.mark.parametrize("args,kw,opts", [
    ({"m": 512, "n": 256, "k": 4096}, {}, {}),
    ({"SIZE_M": 512, "SIZE_N": 256, "SIZE_K": 4096}, {}, {}),
    ({"rows": 512, "cols": 256, "red": 4096}, {}, {"key_map": {"m": "rows", "n": "cols", "k": "red"}}),
    ({"M": 512, "N": 256}, {"K": 4096}, {}),  # found in kwargs
])
def test_adapter_size_lookup(args, kw, opts):
    configs = _fake_configs(n=60, seed=2)
    named = {"x": FakeTensor("torch.bfloat16"), **args}
    kept = early_config_prune(hw="a100", top=0.1, **opts)(configs, named, **kw)
    assert kept == _expected(configs, {"m": 512, "n": 256, "k": 4096, "dtype": "bfloat16"},
                             hw="a100", top=0.1)


def test_adapter_dtype_sources():
    configs = _fake_configs(n=40, seed=4)
    named = {"a": FakeTensor("torch.float32"), "b": FakeTensor("torch.bfloat16"),
             "M": 1024, "N": 1024, "K": 1024}
    wl = {"m": 1024, "n": 1024, "k": 1024}
    assert early_config_prune(dtype_from="b")(configs, named) == \
        _expected(configs, {**wl, "dtype": "bfloat16"})
    assert early_config_prune()(configs, named) == _expected(configs, {**wl, "dtype": "float32"})
    assert early_config_prune(dtype="fp8")(configs, named) == \
        _expected(configs, {**wl, "dtype": "float8"})
    no_tensor = {"M": 1024, "N": 1024, "K": 1024}
    assert early_config_prune(dtype="torch.float16")(configs, no_tensor) == \
        _expected(configs, {**wl, "dtype": "float16"})
    assert dtype_name("torch.float8_e4m3fn") == "float8"
    assert dtype_name(FakeTorchDtype("half")) == "float16"


def test_adapter_unjudged_configs_kept_and_defaults():
    judged = _fake_configs(n=40, seed=6)
    odd = [FakeConfig({"BLOCK_M": 64}), FakeConfig({}, num_warps=8)]
    defaults = FakeConfig({"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32}, None, None)
    assert config_to_dict(defaults) == {"block_m": 64, "block_n": 64, "block_k": 32,
                                        "num_warps": 4, "num_stages": 3}
    configs = [odd[0]] + judged[:20] + [odd[1]] + judged[20:]
    named = {"a": FakeTensor("torch.float16"), "M": 777, "N": 999, "K": 333}
    kept = early_config_prune()(configs, named)
    assert kept[-2:] == odd
    assert kept[:-2] == _expected(judged, {"m": 777, "n": 999, "k": 333, "dtype": "float16"})
    assert early_config_prune()(odd, named) == odd


def test_adapter_config_map_and_split_k():
    configs = [FakeConfig({"TM": bm, "TN": bn, "TK": 32, "SPLIT_K": sk}, num_warps=4, num_stages=3)
               for bm in (32, 64, 128) for bn in (32, 64, 128) for sk in (1, 4)]
    named = {"a": FakeTensor("torch.float16"), "M": 64, "N": 64, "K": 16384}
    fn = early_config_prune(top=0.2, config_map={"block_m": "TM", "block_n": "TN", "block_k": "TK"})
    kept = fn(configs, named)
    rows = [dict(block_m=c.kwargs["TM"], block_n=c.kwargs["TN"], block_k=32, num_stages=3,
                 num_warps=4, split_k=c.kwargs["SPLIT_K"]) for c in configs]
    ref_idx, _ = _reference({"m": 64, "n": 64, "k": 16384, "dtype": "float16"}, rows, "h100", 0.2)
    assert kept == [configs[i] for i in ref_idx]


def test_adapter_errors():
    configs = _fake_configs(n=10)
    with pytest.raises(InputError, match="problem size k not found.*key_map"):
        early_config_prune()(configs, {"a": FakeTensor("torch.float16"), "M": 1, "N": 1})
    with pytest.raises(InputError, match="no kernel argument has a .dtype"):
        early_config_prune()(configs, {"M": 1, "N": 1, "K": 1})
    with pytest.raises(InputError, match="dtype_from='q' is not a kernel argument"):
        early_config_prune(dtype_from="q")(configs, {"M": 1, "N": 1, "K": 1})
    with pytest.raises(InputError, match="'torch.int8' is not supported"):
        early_config_prune()(configs, {"a": FakeTensor("torch.int8"), "M": 1, "N": 1, "K": 1})
    with pytest.raises(InputError, match="is not an integer"):
        early_config_prune()(configs, {"a": FakeTensor("torch.float16"), "M": "x", "N": 1, "K": 1})
    with pytest.raises(InputError, match="on_infeasible"):
        early_config_prune(on_infeasible="ignore")
    huge = [FakeConfig({"BLOCK_M": 256, "BLOCK_N": 256, "BLOCK_K": 256}, 4, 8)]
    named = {"a": FakeTensor("torch.float32"), "M": 64, "N": 64, "K": 64}
    with pytest.raises(NoFeasibleConfigError):
        early_config_prune()(huge, named)
    assert early_config_prune(on_infeasible="keep")(huge, named) == huge
