"""The Triton adapter against the real ``triton`` package (no GPU needed).

A real ``@triton.jit`` matmul kernel is wrapped by ``triton.autotune`` with
real ``triton.Config`` objects and ``prune_configs_by={"early_config_prune":
early_config_prune(...)}``. The kernel is then called as a user calls it
(``kernel[grid](...)``), so Triton's own ``Autotuner.run`` builds its tuning
key, calls its ``prune_configs`` step, which calls the adapter with the
arguments Triton passes (``configs``, ``named_args`` = the positional
arguments by parameter name, ``**kwargs`` = the keyword arguments with
``grid`` and ``warmup``), benchmarks the configurations the adapter kept and
launches the fastest. Only the two steps that need a GPU are replaced, on
the one ``Autotuner`` instance: ``_bench`` (records which configurations
Triton would time and returns a made-up time) and the compiled kernel's
``run`` (records the launch). Tensors are numpy arrays, whose ``.dtype``
Triton puts in its tuning key as it does torch's. ``Autotuner.warmup`` (ahead-of-
time compilation), which prunes the same way, is exercised with the compile step
recorded instead of run.

``scripts/test.sh`` installs the ``triton`` extra and sets
``TSBATCH_REQUIRE_TRITON=1``, so in CI a missing Triton fails these tests
instead of skipping them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tsbatch.errors import InputError
from tsbatch.engine.prune import NoFeasibleConfigError, prune
from tsbatch.engine.rank import keep_count
from tsbatch.front.triton_adapter import dtype_name, early_config_prune

if os.environ.get("TSBATCH_REQUIRE_TRITON") == "1":
    import triton  # noqa: E402  (CI: must be installed)
else:
    triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                  stride_cm, stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """Triton's tutorial matmul (grouped launch order), fp32 accumulator."""
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    group = GROUP_M * num_pid_n
    first_m = (pid // group) * GROUP_M
    size_m = min(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group) % size_m
    pid_n = (pid % group) // size_m
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptrs, mask=offs_k[None, :] < K - k * BLOCK_K, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < K - k * BLOCK_K, other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty),
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def _configs():
    """A Triton-style tile space: 72 real ``triton.Config`` objects."""
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8},
                          num_stages=s, num_warps=w)
            for bm in (64, 128, 256) for bn in (64, 128, 256) for bk in (32, 64)
            for s in (3, 4) for w in (4, 8)]


def _columns(cfg) -> dict:
    """tsbatch configuration columns of a ``triton.Config``, read by hand."""
    return {"block_m": cfg.kwargs["BLOCK_M"], "block_n": cfg.kwargs["BLOCK_N"],
            "block_k": cfg.kwargs["BLOCK_K"], "group_m": cfg.kwargs["GROUP_M"],
            "num_stages": cfg.num_stages, "num_warps": cfg.num_warps}


class Recorder:
    """Wraps the adapter's function to record what Triton called it with."""

    def __init__(self, fn):
        self.fn = fn
        self.calls = []

    def __call__(self, configs, named_args, **kwargs):
        kept = self.fn(configs, named_args, **kwargs)
        self.calls.append({"configs": list(configs), "named_args": dict(named_args),
                           "kwargs": dict(kwargs), "kept": list(kept)})
        return kept


def _tuned(configs, prune_fn, key=("M", "N", "K")):
    """``triton.autotune`` around the kernel, the GPU steps recorded instead of run."""
    jitted = triton.jit(matmul_kernel.fn)  # a JITFunction of its own, whose run is replaced
    kernel = triton.autotune(configs, key=list(key),
                             prune_configs_by={"early_config_prune": prune_fn})(jitted)
    assert isinstance(kernel, triton.runtime.Autotuner)
    kernel.benched, kernel.launched = [], []

    def bench(*args, config, **meta):  # the made-up time: slower the later it is timed
        kernel.benched.append(config)
        return [float(len(kernel.benched))]

    def launch(*args, **kwargs):
        kernel.launched.append(kwargs)

    kernel._bench = bench
    assert kernel.fn is jitted
    jitted.run = launch
    return kernel


def _arrays(dtype=np.float16):
    x = np.zeros((4, 4), dtype=dtype)
    return x, x.copy(), x.copy()


def test_autotune_benchmarks_only_the_predicted_top():
    configs = _configs()
    rec = Recorder(early_config_prune(hw="h100", top=0.1))
    kernel = _tuned(configs, rec)
    a, b, c = _arrays()
    M, N, K = 4096, 2048, 1024
    kernel[(1,)](a, b, c, M, N, K, K, 1, N, 1, N, 1)

    (call,) = rec.calls
    # what Triton passes: every configuration, the positional arguments by
    # the kernel's parameter names, the launch's keywords
    assert call["configs"] == configs
    assert list(call["named_args"]) == matmul_kernel.arg_names[:12]
    assert call["named_args"]["M"] == M and call["named_args"]["a_ptr"] is a
    assert set(call["kwargs"]) == {"grid", "warmup"}
    # what the adapter keeps: tsbatch.engine.prune's top 10 % of the same tiles
    ref = prune({"m": M, "n": N, "k": K, "dtype": "float16"},
                [_columns(x) for x in configs], hw="h100", top=0.1)
    assert len(ref) == keep_count(len(configs), 0.1)
    assert call["kept"] == [configs[i] for i in ref.indices]
    # Triton timed exactly those, in that order, and launched the fastest
    assert kernel.benched == call["kept"]
    assert kernel.best_config is kernel.benched[0]
    (launch,) = kernel.launched
    assert {k: launch[k] for k in kernel.best_config.all_kwargs()} == \
        kernel.best_config.all_kwargs()

    # same key: Triton's cache, no second prune; a new size: pruned again for it
    kernel[(1,)](a, b, c, M, N, K, K, 1, N, 1, N, 1)
    assert len(rec.calls) == 1
    kernel[(1,)](a, b, c, 64, 64, 16384, 16384, 1, 64, 1, 64, 1)
    assert len(rec.calls) == 2
    small = prune({"m": 64, "n": 64, "k": 16384, "dtype": "float16"},
                  [_columns(x) for x in configs], hw="h100", top=0.1)
    assert rec.calls[1]["kept"] == [configs[i] for i in small.indices]
    assert small.indices != ref.indices  # the sizes reached the model


def test_autotune_warmup_compiles_only_the_predicted_top():
    """``Autotuner.warmup`` (ahead-of-time compilation) runs the same pruning step."""
    configs = _configs()
    rec = Recorder(early_config_prune(hw="h200", top=0.05))
    kernel = _tuned(configs, rec)
    compiled = []
    kernel.fn.warmup = lambda *args, **kwargs: compiled.append(kwargs)
    a, b, c = _arrays()
    kernel.warmup(a, b, c, 8192, 8192, 512, 512, 1, 8192, 1, 8192, 1, grid=(1,))
    (call,) = rec.calls
    ref = prune({"m": 8192, "n": 8192, "k": 512, "dtype": "float16"},
                [_columns(x) for x in configs], hw="h200", top=0.05)
    assert call["kept"] == [configs[i] for i in ref.indices]
    assert len(compiled) == len(call["kept"]) == keep_count(len(configs), 0.05)
    assert [{k: kw[k] for k in cfg.all_kwargs()} for kw, cfg in zip(compiled, call["kept"])] \
        == [cfg.all_kwargs() for cfg in call["kept"]]
    assert kernel.benched == [] and kernel.launched == []


def test_autotune_with_keyword_arguments_and_bfloat16_hint():
    """Arguments given by keyword reach the adapter in ``kwargs``, not ``named_args``."""
    configs = _configs()
    rec = Recorder(early_config_prune(hw="a100", top=0.05, dtype="bf16"))
    kernel = _tuned(configs, rec)
    a, b, c = _arrays(np.float32)  # numpy has no bfloat16: the dtype comes from the hint
    kernel[(1,)](a_ptr=a, b_ptr=b, c_ptr=c, M=1000, N=3000, K=500, stride_am=500, stride_ak=1,
                 stride_bk=3000, stride_bn=1, stride_cm=3000, stride_cn=1)
    (call,) = rec.calls
    assert call["named_args"] == {}
    assert {"M", "N", "K", "a_ptr"} <= set(call["kwargs"])
    ref = prune({"m": 1000, "n": 3000, "k": 500, "dtype": "bfloat16"},
                [_columns(x) for x in configs], hw="a100", top=0.05)
    assert call["kept"] == kernel.benched == [configs[i] for i in ref.indices]


def test_dtype_read_from_keyword_tensors():
    configs = _configs()
    rec = Recorder(early_config_prune(hw="h100", top=0.05))
    kernel = _tuned(configs, rec)
    a, b, c = _arrays(np.float32)
    kernel[(1,)](a_ptr=a, b_ptr=b, c_ptr=c, M=512, N=512, K=8192, stride_am=8192,
                 stride_ak=1, stride_bk=512, stride_bn=1, stride_cm=512, stride_cn=1)
    ref = prune({"m": 512, "n": 512, "k": 8192, "dtype": "float32"},
                [_columns(x) for x in configs], hw="h100", top=0.05)
    assert rec.calls[0]["kept"] == [configs[i] for i in ref.indices]


def test_triton_dtypes():
    from triton.runtime.jit import MockTensor

    want = {tl.float16: "float16", tl.bfloat16: "bfloat16", tl.float32: "float32",
            tl.float8e4nv: "float8", tl.float8e5: "float8"}
    for dt, name in want.items():
        assert dtype_name(dt) == name
        assert dtype_name(MockTensor(dt).dtype) == name  # what Triton's warmup passes
    assert dtype_name(np.dtype(np.float16)) == "float16"
    with pytest.raises(InputError, match="not supported"):
        dtype_name(tl.int8)


def test_cluster_configs_are_kept_unjudged():
    """``num_ctas`` > 1 (a Hopper thread-block cluster) is not what the model
    predicts: such configurations are kept after the ranked ones."""
    configs = _configs()
    cluster = triton.Config({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8},
                            num_stages=3, num_warps=8, num_ctas=2)
    rec = Recorder(early_config_prune(hw="h100", top=0.05))
    kernel = _tuned([cluster] + configs, rec)
    a, b, c = _arrays()
    kernel[(1,)](a, b, c, 2048, 2048, 2048, 2048, 1, 2048, 1, 2048, 1)
    ref = prune({"m": 2048, "n": 2048, "k": 2048, "dtype": "float16"},
                [_columns(x) for x in configs], hw="h100", top=0.05)
    assert kernel.benched == [configs[i] for i in ref.indices] + [cluster]


def test_no_feasible_configuration_reaches_the_caller():
    huge = [triton.Config({"BLOCK_M": 256, "BLOCK_N": 256, "BLOCK_K": 256, "GROUP_M": 8},
                          num_stages=8, num_warps=4),
            triton.Config({"BLOCK_M": 256, "BLOCK_N": 256, "BLOCK_K": 128, "GROUP_M": 8},
                          num_stages=8, num_warps=4)]
    a, b, c = _arrays(np.float32)
    kernel = _tuned(huge, early_config_prune(hw="h100"))
    with pytest.raises(NoFeasibleConfigError, match="none of the 2 configurations can run"):
        kernel[(1,)](a, b, c, 64, 64, 64, 64, 1, 64, 1, 64, 1)
    assert kernel.benched == [] and kernel.launched == []
    keep = _tuned(huge, early_config_prune(hw="h100", on_infeasible="keep"))
    keep[(1,)](a, b, c, 64, 64, 64, 64, 1, 64, 1, 64, 1)
    assert keep.benched == huge


def test_adapter_module_does_not_import_triton():
    code = ("import sys, tsbatch.front.triton_adapter as ta; "
            "assert 'triton' not in sys.modules, 'triton imported'; ta.early_config_prune('h100')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parent.parent)
    assert proc.returncode == 0, proc.stderr
