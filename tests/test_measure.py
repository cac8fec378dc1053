"""``tsbatch measure`` / ``tsbatch calibrate``: the data shaping, on the CPU.

The GPU timing itself (torch, triton, CUDA events) cannot run here; every
function that shapes data around it can: working-set sizes, grids, the
measured-schema row builder, the kernel's launch order, device-name mapping,
the plateau/cliff analysis of bandwidth sweeps, the compute ceilings and the
hw TOML that ``calibrate`` writes. ``measure`` without torch/CUDA must exit 2
with one clear line.

Tolerances of the bandwidth analysis (synthetic logistic cliffs in log size,
multiplicative log-normal noise, seeded):

* noise 1 %: plateaus within 3 %, L2 cliff within 5 %;
* noise 2 %: plateaus within 5 %, L2 cliff within 8 %;
* L1.5 cliffs (small steps, coarse sampling): within 12 %, about half a
  sampling step at 4 points per octave.
"""

from __future__ import annotations

import ast
import math
import re
import sys
import types
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from tsbatch.measured import measure as ms
from tsbatch.measured.calibrate import (
    analyze_bandwidth,
    best_gemm_tflops,
    launch_floor_us,
    tc_ceilings,
    update_toml_text,
)
from tsbatch.front.cli import main
from tsbatch.errors import InputError
from tsbatch.hw import get_hw, hw_dir, load_hw_file
from tsbatch.boundary.io import read_metadata, write_parquet

try:
    import tomllib
except ModuleNotFoundError:  # pragma: no cover
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parent.parent
MIB = 1 << 20
DATE = "2025-06-01T12:00:00+00:00"


def _curve(sizes, levels, cliffs, widths, noise, seed):
    """Rates (GB/s): ``levels`` from small to large working sets, logistic steps
    centred (midpoint of the two levels) at ``cliffs`` bytes, ``widths`` in octaves."""
    rng = np.random.default_rng(seed)
    lx = np.log2(np.asarray(sizes, dtype=float))
    bw = np.full(lx.size, float(levels[-1]))
    for j, (c, w) in enumerate(zip(cliffs, widths)):
        bw += (levels[j] - levels[j + 1]) / (1.0 + np.exp((lx - math.log2(c)) / w))
    return bw * np.exp(rng.normal(0.0, noise, lx.size))


def _rel(a, b):
    return abs(a / b - 1.0)


# ============================================================================ bandwidth analysis
TWO_LEVEL = {  # name: (L2 GB/s, DRAM GB/s, cliff bytes, width octaves, nominal L2 bytes)
    "h100": (9200, 3020, 40 * MIB, 0.2, 50 * MIB),
    "a100": (5000, 1700, 30 * MIB, 0.1, 40 * MIB),
    "b6000": (7434, 1600, 130.62 * MIB, 0.08, 128 * MIB),
}


@pytest.mark.parametrize("gpu", sorted(TWO_LEVEL))
@pytest.mark.parametrize("noise,tol_level,tol_cliff", [(0.0, 0.005, 0.02), (0.01, 0.03, 0.05),
                                                       (0.02, 0.05, 0.08)])
@pytest.mark.parametrize("per_octave", [4, 6])
def test_two_level_curve_plateaus_and_cliff(gpu, noise, tol_level, tol_cliff, per_octave):
    l2, dram, cliff, width, nominal = TWO_LEVEL[gpu]
    sizes = ms.working_set_sizes(MIB, 4 * nominal, per_octave)
    for seed in range(8):
        fit = analyze_bandwidth(sizes, _curve(sizes, [l2, dram], [cliff], [width], noise, seed))
        assert fit.l2 is not None and fit.l15 is None, (seed, fit)
        assert len(fit.caches) == 1
        assert _rel(fit.dram.gbps, dram) <= tol_level, (seed, fit.dram)
        assert _rel(fit.l2.gbps, l2) <= tol_level, (seed, fit.l2)
        assert _rel(fit.l2_cliff_bytes, cliff) <= tol_cliff, (seed, fit.l2_cliff_bytes / MIB)
        assert fit.warnings == ()


THREE_LEVEL = {  # TileSight Fig. 2 B200 (L1.5/LRC tier 9 % above L2), and an H200-like step
    "h200_like": ((12760, 9200, 4200), (4 * MIB, 40 * MIB), (0.2, 0.2), 50 * MIB, 0.01, 4),
    "b200_fig2": ((22465, 20549, 7407), (6 * MIB, 83.12 * MIB), (0.15, 0.35), 126.5 * MIB,
                  0.005, 6),
}


@pytest.mark.parametrize("gpu", sorted(THREE_LEVEL))
def test_three_level_curve_finds_l15_and_l2(gpu):
    levels, cliffs, widths, nominal, noise, per_octave = THREE_LEVEL[gpu]
    sizes = ms.working_set_sizes(MIB, 4 * nominal, per_octave)
    for seed in range(8):
        fit = analyze_bandwidth(sizes, _curve(sizes, levels, cliffs, widths, noise, seed))
        assert fit.l15 is not None and fit.l2 is not None, (seed, fit.caches)
        assert _rel(fit.l15.gbps, levels[0]) <= 0.03, (seed, fit.l15)
        assert _rel(fit.l2.gbps, levels[1]) <= 0.03, (seed, fit.l2)
        assert _rel(fit.dram.gbps, levels[2]) <= 0.03, (seed, fit.dram)
        assert _rel(fit.l2_cliff_bytes, cliffs[1]) <= 0.05, (seed, fit.l2_cliff_bytes / MIB)
        assert _rel(fit.l15_cliff_bytes, cliffs[0]) <= 0.12, (seed, fit.l15_cliff_bytes / MIB)
        assert fit.l15.last_bytes < fit.l2.first_bytes


def test_analysis_is_order_and_duplicate_insensitive():
    sizes = np.array(ms.working_set_sizes(MIB, 200 * MIB, 4))
    y = _curve(sizes, [9200, 4200], [40 * MIB], [0.2], 0.01, 3)
    a = analyze_bandwidth(sizes, y)
    perm = np.random.default_rng(0).permutation(sizes.size)
    b = analyze_bandwidth(np.r_[sizes[perm], sizes], np.r_[y[perm], y])
    assert b.l2.gbps == pytest.approx(a.l2.gbps) and b.dram.gbps == pytest.approx(a.dram.gbps)
    assert b.l2_cliff_bytes == pytest.approx(a.l2_cliff_bytes)


def test_low_rate_at_the_smallest_sets_is_not_a_cache_level():
    # a ramp-up (too little parallelism at 1-2 MiB) below the L2 plateau is dropped
    sizes = np.array(ms.working_set_sizes(MIB, 200 * MIB, 4))
    y = _curve(sizes, [9200, 4200], [40 * MIB], [0.2], 0.0, 0)
    y[:4] = 6000.0
    fit = analyze_bandwidth(sizes, y)
    assert fit.l15 is None and fit.l2.gbps == pytest.approx(9200, rel=0.01)
    assert any("below the next level" in w for w in fit.warnings)


def test_flat_curve_has_no_cache_level():
    sizes = ms.working_set_sizes(MIB, 64 * MIB, 4)
    fit = analyze_bandwidth(sizes, _curve(sizes, [3000, 3000], [8 * MIB], [0.2], 0.005, 1))
    assert fit.l2 is None and fit.l2_cliff_bytes is None
    assert fit.dram.gbps == pytest.approx(3000, rel=0.02)
    assert any("no cache plateau" in w for w in fit.warnings)


def test_sweep_that_stops_inside_the_cliff_warns():
    sizes = ms.working_set_sizes(MIB, 64 * MIB, 4)     # the cliff (40 MiB) is in the top octave
    fit = analyze_bandwidth(sizes, _curve(sizes, [9200, 3000], [40 * MIB], [0.3], 0.0, 0))
    assert any("may not reach the DRAM plateau" in w for w in fit.warnings)


@pytest.mark.parametrize("sizes,gbps", [
    ([1, 2, 3], [1.0, 1.0, 1.0]),                      # too few sizes
    (list(range(1, 11)), [1.0] * 9 + [0.0]),           # non-positive rate
    (list(range(1, 11)), [1.0] * 9 + [float("nan")]),
    (list(range(1, 11)), [1.0] * 9),                   # unequal lengths
])
def test_bad_bandwidth_input_raises(sizes, gbps):
    with pytest.raises(InputError):
        analyze_bandwidth(sizes, gbps)


# ============================================================================ working sets, frames
@pytest.mark.parametrize("hi,per_octave", [(200 * MIB, 4), (4 * 126.5 * MIB, 6), (4 * 40 * MIB, 3)])
def test_working_set_sizes_are_geometric_from_1mib_to_4x_l2(hi, per_octave):
    s = np.array(ms.working_set_sizes(MIB, int(hi), per_octave, align=16 * 1024))
    assert s[0] == MIB and s[-1] >= hi * 0.99 and np.all(np.diff(s) > 0)
    assert np.all(s % (16 * 1024) == 0)
    steps = np.diff(np.log2(s))
    assert np.allclose(steps, 1.0 / per_octave, atol=0.02)


def test_bandwidth_and_matmul_frames():
    bw = ms.bandwidth_frame([
        {"bytes": 2 * MIB, "times_ms": [0.2, 0.1, 0.3], "passes": 500},
        {"bytes": MIB, "times_ms": [0.1, 0.1], "passes": 1000, "kernel": "torch_sum"},
    ])
    assert bw["bytes"].to_list() == [MIB, 2 * MIB]                # sorted by size
    row = bw.row(1, named=True)
    assert row["gbps"] == pytest.approx(2 * MIB * 500 / 0.2e-3 / 1e9)   # median time
    assert row["gbps_min"] < row["gbps"] < row["gbps_max"] and row["repeats"] == 3
    assert bw.schema["bytes"] == pl.Int64 and bw.schema["gbps"] == pl.Float64
    mm = ms.matmul_frame([{"dtype": "float16", "m": 8192, "n": 8192, "k": 8192,
                           "times_ms": [1.5, 1.4, 1.6]},
                          {"dtype": "float32", "m": 4096, "n": 4096, "k": 4096,
                           "times_ms": [0.5]}])
    assert mm["tflops"][0] == pytest.approx(2 * 8192 ** 3 / 1.5e-3 / 1e12)
    assert mm["tf32"].to_list() == [False, True]
    with pytest.raises(ValueError):
        ms.bandwidth_frame([{"bytes": MIB, "times_ms": [0.0], "passes": 1}])


def test_metadata_has_provenance():
    env = {"device_name": "NVIDIA H200", "gpu": "h200", "driver": "550.54.15", "cuda": "12.4",
           "torch": "2.5.1", "triton": "3.1.0", "date": DATE, "sm_count": 132}
    md = ms.measurement_metadata(env, "bandwidth", {"args": {"quick": True}})
    assert md["tsbatch.device_name"] == "NVIDIA H200" and md["tsbatch.driver"] == "550.54.15"
    assert md["tsbatch.torch_version"] == "2.5.1" and md["tsbatch.triton_version"] == "3.1.0"
    assert md["tsbatch.date"] == DATE and md["tsbatch.sm_count"] == "132"
    assert md["tsbatch.args"] == '{"quick": true}'
    assert all(isinstance(v, str) and k.startswith("tsbatch.") for k, v in md.items())


@pytest.mark.parametrize("name,key", [
    ("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100_sxm"),
    ("NVIDIA H100 PCIe", "h100_pcie"), ("NVIDIA A100-SXM4-80GB", "a100"),
    ("NVIDIA B200", "b200"), ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "rtx_pro_6000"),
    ("AMD Instinct MI210", "mi210"), ("NVIDIA GeForce RTX 4090", "geforce_rtx_4090"),
])
def test_gpu_key_maps_device_names_to_hw_keys(name, key):
    assert ms.gpu_key(name) == key


def test_known_gpu_keys_are_hw_files():
    for name in ("NVIDIA H200", "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA B200",
                 "NVIDIA RTX PRO 6000 Blackwell Server Edition", "AMD Instinct MI210"):
        assert get_hw(ms.gpu_key(name)).key == ms.gpu_key(name)


# ============================================================================ GEMM grid and rows
def _shared_gemm_schema(shared_dir):
    return pl.read_parquet_schema(shared_dir / "gemm" / "h100_triton_mm.parquet")


MEASURED_SCHEMA = {  # ../shared/data/README.md, gemm/ Triton sets
    "source": pl.String, "gpu": pl.String, "m": pl.Int64, "n": pl.Int64, "k": pl.Int64,
    "dtype": pl.String, "a_row_major": pl.Boolean, "b_row_major": pl.Boolean,
    "tf32": pl.Boolean, "backend": pl.String, "block_m": pl.Int32, "block_n": pl.Int32,
    "block_k": pl.Int32, "num_stages": pl.Int32, "num_warps": pl.Int32, "group_m": pl.Int32,
    "time_ms": pl.Float64,
}


@pytest.mark.parametrize("quick", [False, True])
def test_grid_rows_are_exactly_the_measured_schema(quick):
    grid = ms.default_grid(quick)
    dtypes = ("float16", "bfloat16", "float32")
    problems = ms.grid_problems(grid, dtypes)
    recs = []
    for i, p in enumerate(problems):
        recs.append(ms.gemm_record(p, None, 0.5 + i))
        for j, cfg in enumerate(grid.configs):
            recs.append(ms.gemm_record(p, cfg, math.inf if j == 0 else 1.0 + j))
    df = ms.gemm_rows(recs, "h200")
    assert list(df.schema.items()) == list(MEASURED_SCHEMA.items()) + [
        ("raster", pl.String), ("num_regs", pl.Int32), ("num_spills", pl.Int32),
        ("shared_bytes", pl.Int64)]
    for c in ("num_regs", "num_spills", "shared_bytes"):       # none given: null
        assert df[c].null_count() == df.height
    assert df.height == len(problems) * (len(grid.configs) + 1)
    assert len(problems) == len(grid.shapes) * len(dtypes)
    assert set(df["source"]) == {"tsbatch measure"} and set(df["gpu"]) == {"h200"}
    lib = df.filter(pl.col("backend") == "cublas")
    tri = df.filter(pl.col("backend") == "triton")
    assert lib.height == len(problems)
    for c in ("block_m", "block_n", "block_k", "num_stages", "num_warps", "group_m", "raster"):
        assert lib[c].null_count() == lib.height and tri[c].null_count() == 0
    assert tri.filter(pl.col("raster") == "grouped")["group_m"].unique().to_list() == [8]
    assert tri.filter(pl.col("raster") == "row")["group_m"].unique().to_list() == [1]
    assert (df["tf32"] == (df["dtype"] == "float32")).all()
    assert int(tri["time_ms"].is_infinite().sum()) == len(problems)
    assert set(df["raster"].drop_nulls()) == {"grouped", "row"}


def test_grid_rows_match_the_shared_data_schema(shared_data):
    want = _shared_gemm_schema(shared_data)
    df = ms.gemm_rows([ms.gemm_record(ms.Problem(64, 64, 64, True, True, "float16"),
                                      ms.default_grid(True).configs[0], 0.01)], "h100_sxm")
    assert list(df.drop("raster", "num_regs", "num_spills", "shared_bytes").schema.items()) == \
        list(want.items())


def test_measured_rows_evaluate_and_score(tmp_path):
    """The rows measure writes are valid tsbatch candidates (raster included)."""
    grid = ms.default_grid(True)
    p = ms.Problem(4096, 4096, 4096, True, True, "float16")
    df = ms.gemm_rows([ms.gemm_record(p, c, 1.0) for c in grid.configs], "h200")
    f = tmp_path / "h200_gemm.parquet"
    df.write_parquet(f)
    out = tmp_path / "pred.parquet"
    assert main(["evaluate", str(f), "--hw", "h200", "-o", str(out), "-q"]) == 0
    assert pl.read_parquet(out)["latency_us"].is_not_null().all()


def test_gemm_rows_rejects_bad_records():
    p = ms.Problem(64, 64, 64, True, True, "float16")
    good = ms.gemm_record(p, ms.default_grid(True).configs[0], 1.0)
    for bad in ({**good, "backend": "cutlass"}, {**good, "dtype": "int8"},
                {**good, "time_ms": 0.0}, {**good, "raster": "spiral"}):
        with pytest.raises(ValueError):
            ms.gemm_rows([bad], "h200")


@pytest.mark.parametrize("raster,order_name", [("grouped", "grouped"), ("row", "row"),
                                               ("col", "col")])
@pytest.mark.parametrize("gm,gn,group", [(7, 5, 3), (16, 4, 8), (3, 9, 8), (8, 8, 1)])
def test_kernel_launch_order_matches_the_model(raster, order_name, gm, gn, group):
    """The Triton kernel's pid -> tile mapping is the model's order of the same name."""
    from tsbatch.kernels.order import ORDER_NAMES, launch_order_array

    x0, x1, _ = launch_order_array(ORDER_NAMES[order_name], gm, gn, 1, group)
    got = ms.kernel_tile_order(raster, gm, gn, group)
    assert got == list(zip(x0.tolist(), x1.tolist()))


def test_kernel_source_is_python_with_the_constexprs():
    tree = ast.parse(ms.KERNEL_SOURCE)
    fns = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert set(fns) == {"read_kernel", "matmul_kernel"}
    args = [a.arg for a in fns["matmul_kernel"].args.args]
    for c in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "RASTER", "IEEE"):
        assert c in args
    # the mirrored order arithmetic is the kernel's
    for line in ("group_size_m = min(num_pid_m - first_pid_m, GROUP_M)",
                 "pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)",
                 "pid_n = (pid % num_pid_in_group) // group_size_m"):
        assert line in ms.KERNEL_SOURCE


def test_load_grid_product_and_explicit(tmp_path):
    f = tmp_path / "grid.toml"
    f.write_text('shapes = [[4096, 4096, 4096], [512, 8192, 4096]]\n'
                 'dtypes = ["bf16"]\n'
                 'block_m = [64, 128]\nblock_n = [128]\nblock_k = [32, 64]\n'
                 'num_stages = [3]\nnum_warps = [4, 8]\ngroup_m = [4, 8]\n'
                 'raster = ["grouped", "row", "col"]\nb_row_major = [true, false]\n')
    g = ms.load_grid(f)
    assert g.shapes == ((4096, 4096, 4096), (512, 8192, 4096)) and g.dtypes == ("bfloat16",)
    assert len(g.configs) == 2 * 1 * 2 * 1 * 2 * 4       # tiles x (grouped 4, 8, row, col)
    assert {(c.raster, c.group_m) for c in g.configs} == {("grouped", 4), ("grouped", 8),
                                                          ("row", 1), ("col", 1)}
    assert g.layouts == ((True, True), (True, False))
    assert len(ms.grid_problems(g, g.dtypes)) == 4
    f.write_text('shapes = [[64, 64, 64]]\nconfigs = [{block_m = 128, block_n = 64, '
                 'block_k = 32, num_stages = 4, num_warps = 4}, {block_m = 64, block_n = 64, '
                 'block_k = 32, num_stages = 2, num_warps = 4, raster = "row", group_m = 8}]\n')
    g = ms.load_grid(f)
    assert g.configs == (ms.GemmConfig(128, 64, 32, 4, 4, 8, "grouped"),
                         ms.GemmConfig(64, 64, 32, 2, 4, 1, "row"))


@pytest.mark.parametrize("loader,text,needle", [(ms.load_grid, t, n) for t, n in [
    ("block_m = [64]", "'shapes'"),
    ("shapes = [[64, 64]]", "[m, n, k]"),
    ("shapes = [[64, 64, 0]]", "positive integer"),
    ("shapes = [[64, 64, 64]]\nblock_m = [64]\nblock_n=[64]\nblock_k=[32]\nnum_stages=[2]\n"
     "num_warps=[4]\nraster=['spiral']", "spiral"),
    ("shapes = [[64, 64, 64]]\nblock_m = [96]\nblock_n=[64]\nblock_k=[32]\nnum_stages=[2]\n"
     "num_warps=[4]", "powers of two"),
    ("shapes = [[64, 64, 64]]\nblock_m = [64]", "'block_n' is required"),
    ("shapes = [[64, 64, 64]]\ntile = 3", "unknown keys ['tile']"),
    ("shapes = [[64, 64, 64]]\ndtypes = ['int8']", "unknown dtype"),
    ("shapes = [[64, 64, 64]]\nconfigs = [{block_m = 64}]", "lacks 'block_n'"),
    ("shapes = [[64, 64, 64", "invalid TOML"),
]] + [(ms.load_library_grid, t, n) for t, n in [
    ("dtypes = ['float16']", "'shapes'"),
    ("shapes = [[16, 4096]]", "[m, n, k]"),
    ("shapes = [[16, 4096, 4096]]\nblock_m = [64]", "unknown keys ['block_m']"),
    ("shapes = [[16, 4096, 4096]]\nb_row_major = 'no'", "'b_row_major'"),
    ("shapes = [[16, 4096, 4096", "invalid TOML"),
]])
def test_grid_loaders_errors_name_the_problem(tmp_path, loader, text, needle):
    """load_grid (the Triton grid) and load_library_grid: one clear error naming the file."""
    f = tmp_path / "grid.toml"
    f.write_text(text)
    with pytest.raises(InputError) as exc:
        loader(f)
    assert needle in str(exc.value) and str(f) in str(exc.value)


def test_parse_dtypes():
    assert ms.parse_dtypes(None) == ("float16", "bfloat16")
    assert ms.parse_dtypes("fp16, bf16,float16,tf32") == ("float16", "bfloat16", "float32")
    for bad in ("", "int8", "float16,fp64"):
        with pytest.raises(InputError):
            ms.parse_dtypes(bad)


# ============================================================================ measure without a GPU
def _hide(monkeypatch, torch=None, triton=None):
    monkeypatch.setitem(sys.modules, "torch", torch)      # None makes `import torch` fail
    monkeypatch.setitem(sys.modules, "triton", triton)


def test_measure_without_torch_exits_2_with_a_clear_message(tmp_path, capsys, monkeypatch):
    _hide(monkeypatch)
    out = tmp_path / "meas"
    assert main(["measure", "--out", str(out), "--quick"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tsbatch: error: tsbatch measure needs a CUDA GPU with torch and "
                          "triton installed (found: ")
    assert "torch not importable" in err and "triton not importable" in err
    assert len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_measure_with_cpu_only_torch_names_the_missing_cuda(tmp_path, capsys, monkeypatch):
    torch = types.ModuleType("torch")
    torch.__version__ = "2.5.1+cpu"
    torch.cuda = types.SimpleNamespace(is_available=lambda: False)
    triton = types.ModuleType("triton")
    triton.__version__ = "3.1.0"
    _hide(monkeypatch, torch, triton)
    out = tmp_path / "meas"
    assert main(["measure", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "needs a CUDA GPU" in err
    assert "torch 2.5.1+cpu with no CUDA device available" in err and "triton 3.1.0" in err
    assert not out.exists()


def test_measure_checks_its_arguments_before_the_gpu(tmp_path, capsys, monkeypatch):
    _hide(monkeypatch)
    bad = tmp_path / "grid.toml"
    bad.write_text("shapes = 3\n")
    assert main(["measure", "--out", str(tmp_path / "m"), "--gemm-grid", str(bad)]) == 2
    assert "grid.toml: 'shapes'" in capsys.readouterr().err
    assert main(["measure", "--out", str(tmp_path / "m"), "--dtypes", "int4"]) == 2
    assert "unknown dtype 'int4'" in capsys.readouterr().err
    f = tmp_path / "file"
    f.write_text("")
    assert main(["measure", "--out", str(f)]) == 2
    assert "must be a directory" in capsys.readouterr().err
    assert main(["measure", "--out", str(tmp_path / "m"), "--compile-workers", "-1"]) == 2
    assert "--compile-workers -1" in capsys.readouterr().err
    assert main(["measure", "--out", str(tmp_path / "m"), "--time-budget-s", "0"]) == 2
    assert "--time-budget-s 0" in capsys.readouterr().err


def test_kernel_resources_from_the_compiled_kernel():
    """Registers, spills and shared memory as Triton's compiled kernel reports them
    (``n_regs``, ``n_spills``, ``metadata.shared``), into the rows of Triton configurations."""
    import types

    k = types.SimpleNamespace(n_regs=168, n_spills=0, metadata=types.SimpleNamespace(shared=98304))
    res = ms.kernel_resources(k)
    assert res == {"num_regs": 168, "num_spills": 0, "shared_bytes": 98304}
    assert ms.kernel_resources(None) is None
    assert ms.kernel_resources(types.SimpleNamespace()) is None
    p = ms.Problem(256, 256, 256, True, True, "float16")
    rows = ms.gemm_rows([ms.gemm_record(p, None, 0.5, resources=res),
                         ms.gemm_record(p, ms.GemmConfig(64, 64, 32, 3, 4), 0.6, resources=res)],
                        "h200")
    assert rows["num_regs"].to_list() == [None, 168]           # library rows: null
    assert rows["shared_bytes"].to_list() == [None, 98304]


def test_warm_jobs_are_each_compilation_once(tmp_path):
    """The warm-up processes compile one kernel per (dtype, layout, configuration):
    Triton specialises on those, not on the sizes, when every size is a multiple of 16."""
    g = tmp_path / "g.toml"
    g.write_text("shapes = [[64, 128, 256], [4096, 16, 48]]\nblock_m = [32, 64]\n"
                 "block_n = [32]\nblock_k = [32]\nnum_stages = [2]\nnum_warps = [4]\n"
                 "raster = ['grouped', 'col']\nb_row_major = [true, false]\n")
    grid = ms.load_grid(g)
    jobs = ms.warm_jobs(grid, ("float16", "float32"))
    assert len(jobs) == len(set(jobs)) == 2 * 2 * len(grid.configs) == 16
    assert {(d, a, b) for d, a, b, _ in jobs} == {
        (d, True, b) for d in ("float16", "float32") for b in (True, False)}
    assert ms._warm_shape_ok(grid)
    g.write_text(g.read_text().replace("[4096, 16, 48]", "[4096, 16, 40]"))
    assert not ms._warm_shape_ok(ms.load_grid(g))
    assert ms.warm_compile(tmp_path / "k.py", jobs, 0, 10.0, quiet=True)["compiled"] == 0


@pytest.mark.parametrize("dtype,fp32,tf32", [("float32", "tf32", True), ("float32", "ieee", False),
                                             ("float16", "tf32", False), ("bfloat16", "ieee", False)])
def test_rows_say_how_float32_ran(dtype, fp32, tf32):
    p = ms.Problem(256, 256, 256, True, False, dtype)
    cfg = ms.GemmConfig(64, 64, 32, 3, 4)
    recs = [ms.gemm_record(p, None, 0.5, fp32), ms.gemm_record(p, cfg, 0.6, fp32)]
    assert [r["tf32"] for r in recs] == [tf32, tf32]
    assert ms.gemm_rows(recs, "h200")["tf32"].to_list() == [tf32, tf32]
    mm = ms.matmul_frame([{"dtype": dtype, "m": 8, "n": 8, "k": 8, "times_ms": [1.0],
                           "tf32": dtype == "float32" and fp32 == "tf32"}])
    assert mm["tf32"].to_list() == [tf32]


# ============================================================================ ceilings
def _gemm_frame():
    P = ms.Problem
    g = ms.default_grid(True).configs
    recs = [ms.gemm_record(P(64, 64, 64, True, True, "float16"), None, 0.0062),
            ms.gemm_record(P(64, 64, 64, True, True, "float16"), g[0], 0.0071),
            ms.gemm_record(P(64, 64, 64, True, True, "float16"), g[1], math.inf),
            ms.gemm_record(P(8192, 8192, 8192, True, True, "bfloat16"), None, 1.70),
            ms.gemm_record(P(8192, 8192, 8192, True, True, "float16"), g[2], 1.80),
            ms.gemm_record(P(8192, 8192, 8192, True, True, "float32"), None, 1.0)]
    return ms.gemm_rows(recs, "h200")


def test_ceilings_from_matmul_and_gemm_frames():
    mm = ms.matmul_frame([
        {"dtype": "float16", "m": 4096, "n": 4096, "k": 4096, "times_ms": [0.25]},
        {"dtype": "float16", "m": 8192, "n": 8192, "k": 8192, "times_ms": [1.60, 1.62]},
        {"dtype": "bfloat16", "m": 8192, "n": 8192, "k": 8192, "times_ms": [1.65]},
    ])
    c = tc_ceilings(mm)
    assert set(c) == {"float16", "bfloat16"}
    assert c["float16"]["m"] == 8192
    assert c["float16"]["tflops"] == pytest.approx(2 * 8192 ** 3 / 1.61e-3 / 1e12)
    best = best_gemm_tflops(_gemm_frame())
    assert best["backend"] == "cublas" and best["dtype"] == "bfloat16"   # float32 not counted
    assert best["tflops"] == pytest.approx(2 * 8192 ** 3 / 1.70e-3 / 1e12)
    floor = launch_floor_us(_gemm_frame())
    assert floor["time_us"] == pytest.approx(6.2) and floor["backend"] == "cublas"
    empty = _gemm_frame().head(0)
    assert best_gemm_tflops(empty) is None and launch_floor_us(empty) is None


# ============================================================================ calibrate end to end
ENV = {"device_name": "NVIDIA H200", "gpu": "h200", "driver": "550.54.15", "cuda": "12.4",
       "torch": "2.5.1", "triton": "3.1.0", "date": DATE}


def _write_measurements(d, *, gpu="h200", bandwidth=True, matmul=True, gemm=True, seed=0):
    d.mkdir(parents=True, exist_ok=True)
    env = {**ENV, "gpu": gpu}
    if bandwidth:
        sizes = ms.working_set_sizes(MIB, 200 * MIB, 6)
        y = _curve(sizes, [9300, 4300], [42 * MIB], [0.2], 0.005, seed)
        recs = [{"bytes": b, "times_ms": [b * 10 / (g * 1e9) * 1e3], "passes": 10}
                for b, g in zip(sizes, y)]
        write_parquet(ms.bandwidth_frame(recs), d / "bandwidth.parquet",
                      ms.measurement_metadata(env, "bandwidth"))
    if matmul:
        mm = ms.matmul_frame([
            {"dtype": "float16", "m": 8192, "n": 8192, "k": 8192, "times_ms": [1.6]},
            {"dtype": "bfloat16", "m": 8192, "n": 8192, "k": 8192, "times_ms": [1.65]}])
        write_parquet(mm, d / "matmul.parquet", ms.measurement_metadata(env, "matmul"))
    if gemm:
        write_parquet(_gemm_frame().with_columns(pl.lit(gpu).alias("gpu")), d / "gemm.parquet",
                      ms.measurement_metadata(env, "gemm"))
    return d


def test_calibrate_writes_a_loadable_hw_file(tmp_path, capsys):
    d = _write_measurements(tmp_path / "meas")
    out = tmp_path / "h200.toml"
    src = hw_dir() / "h200.toml"
    before = src.read_bytes()
    assert main(["calibrate", str(d), "--hw", "h200", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert src.read_bytes() == before                       # the repository file is untouched
    spec = load_hw_file(out)
    old = get_hw("h200")
    # [measured]
    assert spec.measured["dram_bw_tbps"] == pytest.approx(4.3, rel=0.02)
    assert spec.measured["l2_bw_tbps"] == pytest.approx(9.3, rel=0.02)
    tc16 = 2 * 8192 ** 3 / 1.6e-3 / 1e12
    assert spec.measured["tc_fp16_tflops"] == pytest.approx(tc16, rel=1e-3)
    assert "l15_bw_tbps" not in spec.measured
    # [calibration]
    assert spec.calibration["l2_capacity_fraction"] == pytest.approx(42 * MIB / old.l2_bytes,
                                                                     rel=0.04)
    best = 2 * 8192 ** 3 / 1.70e-3 / 1e12
    assert spec.calibration["tc_efficiency"] == pytest.approx(best / tc16, rel=2e-3)
    lat = old.cal("mem_latency_us")
    assert spec.calibration["launch_overhead_us"] == pytest.approx(6.2 - lat, abs=1e-3)
    # sources name the file, the device and the date
    for key in ("measured.dram_bw_tbps", "measured.l2_bw_tbps",
                "calibration.l2_capacity_fraction"):
        s = spec.sources[key]
        assert "tsbatch calibrate" in s and "meas/bandwidth.parquet" in s
        assert "NVIDIA H200" in s and "2025-06-01" in s
    assert "meas/matmul.parquet" in spec.sources["measured.tc_fp16_tflops"]
    for key in ("calibration.tc_efficiency", "calibration.launch_overhead_us"):
        assert "meas/gemm.parquet" in spec.sources[key]
    # everything else is kept
    assert spec.measured["clock_mhz"] == old.measured["clock_mhz"]
    assert spec.sources["measured.clock_mhz"] == old.sources["measured.clock_mhz"]
    assert (spec.name, spec.aliases, spec.l2_bytes) == (old.name, old.aliases, old.l2_bytes)
    assert out.read_text().splitlines()[0] == src.read_text().splitlines()[0]   # comments kept
    # the summary names what changed
    assert "[measured] l2_bw_tbps" in text and "[calibration] l2_capacity_fraction" in text
    assert f"wrote 6 calibrated values to {out}" in text


def test_calibrate_with_only_some_files(tmp_path, capsys):
    d = _write_measurements(tmp_path / "meas", matmul=False, gemm=False)
    out = tmp_path / "h200.toml"
    assert main(["calibrate", str(d), "--hw", "h200", "-o", str(out)]) == 0
    spec = load_hw_file(out)
    assert spec.measured["tc_fp16_tflops"] == get_hw("h200").measured["tc_fp16_tflops"]
    for key in ("tc_efficiency", "launch_overhead_us"):            # not touched
        assert spec.calibration.get(key) == get_hw("h200").calibration.get(key)
        assert spec.sources.get(f"calibration.{key}") == get_hw("h200").sources.get(
            f"calibration.{key}")
    assert "not calibrated: tc_fp16_tflops: no matmul.parquet" in capsys.readouterr().out


def test_calibrate_dry_run_writes_nothing(tmp_path, capsys):
    d = _write_measurements(tmp_path / "meas")
    out = tmp_path / "x.toml"
    assert main(["calibrate", str(d), "--hw", "h200", "-o", str(out), "--dry-run"]) == 0
    assert not out.exists() and "dry run" in capsys.readouterr().out


def test_calibrate_refuses_another_gpus_measurements(tmp_path, capsys):
    d = _write_measurements(tmp_path / "meas", gpu="a100")
    out = tmp_path / "h200.toml"
    assert main(["calibrate", str(d), "--hw", "h200", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "measured on 'a100'" in err and "--force" in err and not out.exists()
    assert main(["calibrate", str(d), "--hw", "h200", "-o", str(out), "--force"]) == 0


@pytest.mark.parametrize("case", ["missing_dir", "empty_dir", "bad_hw", "out_is_dir",
                                  "second_file_in_hw_dir", "missing_column"])
def test_calibrate_input_errors_exit_2(tmp_path, capsys, case):
    d = _write_measurements(tmp_path / "meas")
    argv = ["calibrate", str(d), "--hw", "h200", "-o", str(tmp_path / "o.toml")]
    needle = {"missing_dir": "not a directory", "empty_dir": "has none of",
              "bad_hw": "unknown GPU", "out_is_dir": "is a directory",
              "second_file_in_hw_dir": "would repeat its aliases",
              "missing_column": "missing column 'gbps'"}[case]
    if case == "missing_dir":
        argv[1] = str(tmp_path / "nope")
    elif case == "empty_dir":
        (tmp_path / "empty").mkdir()
        argv[1] = str(tmp_path / "empty")
    elif case == "bad_hw":
        argv[3] = "h900"
    elif case == "out_is_dir":
        argv[5] = str(tmp_path)
    elif case == "second_file_in_hw_dir":
        argv[5] = str(hw_dir() / "h200_calibrated.toml")
    elif case == "missing_column":
        pl.DataFrame({"bytes": [1, 2]}).write_parquet(d / "bandwidth.parquet")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("tsbatch: error: ") and needle in err, err
    assert not (tmp_path / "o.toml").exists()
    assert not (hw_dir() / "h200_calibrated.toml").exists()


def test_calibrate_accepts_a_hw_file_path(tmp_path, capsys):
    d = _write_measurements(tmp_path / "meas")
    src = tmp_path / "h200.toml"
    src.write_bytes((hw_dir() / "h200.toml").read_bytes())
    assert main(["calibrate", str(d), "--hw", str(src)]) == 0      # in place
    assert load_hw_file(src).measured["l2_bw_tbps"] == pytest.approx(9.3, rel=0.02)


def test_measurement_metadata_survives_the_round_trip(tmp_path):
    d = _write_measurements(tmp_path / "meas")
    md = read_metadata(d / "gemm.parquet")
    assert md["tsbatch.device_name"] == "NVIDIA H200" and md["tsbatch.date"] == DATE


# ============================================================================ TOML editing
def test_update_toml_text_replaces_inserts_and_appends():
    text = ('# head comment\n[identity]\nname = "x"\n\n[measured]\n# keep me\n'
            'l2_bw_tbps = { value = 1.0, source = "old" }  # trailing\n'
            'clock_mhz = { value = 1000, source = "clk" }\n\n[memory]\n'
            'l2_bw_tbps = { value = 5.0, source = "spec" }\n')
    new = update_toml_text(text, {
        "measured": {"l2_bw_tbps": (9.3, 'a "quoted" \\ source'), "dram_bw_tbps": (4.2, "d")},
        "calibration": {"tc_efficiency": (0.8, "e")},
    })
    doc = tomllib.loads(new)
    assert doc["measured"]["l2_bw_tbps"] == {"value": 9.3, "source": 'a "quoted" \\ source'}
    assert doc["measured"]["dram_bw_tbps"] == {"value": 4.2, "source": "d"}
    assert doc["measured"]["clock_mhz"]["value"] == 1000
    assert doc["memory"]["l2_bw_tbps"]["value"] == 5.0            # other sections untouched
    assert doc["calibration"]["tc_efficiency"] == {"value": 0.8, "source": "e"}
    assert "# head comment" in new and "# keep me" in new
    lines = new.splitlines()
    # the inserted key sits inside [measured], before [memory]
    assert lines.index("[memory]") > next(i for i, ln in enumerate(lines) if "dram_bw" in ln)


def test_calibrate_caps_the_l2_fraction_at_one(tmp_path, capsys):
    """A cliff past the nominal L2 (a gradual fall: its halfway point lies beyond the
    capacity, as on the H200) gives a fraction of 1, and the summary says so."""
    d = _write_measurements(tmp_path / "meas")
    sizes = ms.working_set_sizes(MIB, 1 << 30, 6)
    y = _curve(sizes, [8600, 4600], [70 * MIB], [0.3], 0.005, 1)
    recs = [{"bytes": b, "times_ms": [b * 10 / (g * 1e9) * 1e3], "passes": 10}
            for b, g in zip(sizes, y)]
    write_parquet(ms.bandwidth_frame(recs), d / "bandwidth.parquet",
                  ms.measurement_metadata(ENV, "bandwidth"))
    out = tmp_path / "h200.toml"
    assert get_hw("h200").l2_bytes < 70 * MIB
    assert main(["calibrate", str(d), "--hw", "h200", "-o", str(out)]) == 0
    assert load_hw_file(out).calibration["l2_capacity_fraction"] == 1.0
    assert "capped at 1" in capsys.readouterr().out


def test_calibrate_keep_higher_keeps_only_the_higher_rates(tmp_path, capsys):
    """A probe bounds a peak from below: --keep-higher leaves each [measured] rate of the
    file that is above the new probe's, takes the others, and rebases tc_efficiency."""
    d = _write_measurements(tmp_path / "meas")          # L2 9.3, DRAM 4.3, fp16 687 TFLOPS
    src = tmp_path / "h200.toml"
    text = (hw_dir() / "h200.toml").read_text()
    for key, v in (("l2_bw_tbps", 9.0), ("dram_bw_tbps", 4.5), ("tc_fp16_tflops", 928.0)):
        text = re.sub(rf"(?m)^{key} = {{ value = [0-9.]+", f"{key} = {{ value = {v}", text,
                      count=0)
    src.write_text(text)
    old = load_hw_file(src)
    assert (old.measured["l2_bw_tbps"], old.measured["dram_bw_tbps"]) == (9.0, 4.5)
    out = tmp_path / "new.toml"
    assert main(["calibrate", str(d), "--hw", str(src), "-o", str(out), "--keep-higher"]) == 0
    said = capsys.readouterr().out
    spec = load_hw_file(out)
    assert spec.measured["l2_bw_tbps"] == pytest.approx(9.3, rel=0.02)      # probe higher: taken
    assert spec.measured["dram_bw_tbps"] == 4.5                             # file higher: kept
    assert spec.measured["tc_fp16_tflops"] == 928.0
    best = 2 * 8192 ** 3 / 1.70e-3 / 1e12
    assert spec.calibration["tc_efficiency"] == pytest.approx(best / 928.0, rel=2e-3)
    assert "dram_bw_tbps: the file's 4.5 is higher" in said
    assert "tc_fp16_tflops: the file's 928 is higher" in said


def test_calibrate_keep_leaves_a_key_and_rebases_the_efficiency(tmp_path, capsys):
    d = _write_measurements(tmp_path / "meas")
    out = tmp_path / "h200.toml"
    assert main(["calibrate", str(d), "--hw", "h200", "-o", str(out),
                 "--keep", "tc_fp16_tflops"]) == 0
    spec, old = load_hw_file(out), get_hw("h200")
    assert spec.measured["tc_fp16_tflops"] == old.measured["tc_fp16_tflops"]
    assert spec.sources["measured.tc_fp16_tflops"] == old.sources["measured.tc_fp16_tflops"]
    best = 2 * 8192 ** 3 / 1.70e-3 / 1e12
    assert spec.calibration["tc_efficiency"] == pytest.approx(best / 928.0, rel=2e-3)
    assert "kept as in the file (--keep)" in capsys.readouterr().out
    assert main(["calibrate", str(d), "--hw", "h200", "-o", str(out), "--keep", "clock"]) == 2
    assert "--keep: clock" in capsys.readouterr().err


# ============================================================================ the library part
def test_default_library_grid_is_the_decode_gemms_as_x_at_w_transposed():
    g = ms.default_library_grid()
    assert g.configs == () and g.layouts == ((True, False),)
    shapes = set(g.shapes)
    # every decode row count of every Llama-3 8B projection (x @ W.T, W of shape n x k)
    for n, k in ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)):
        assert {(m, n, k) for m in (1, 2, 4, 8, 16, 32, 64)} <= shapes
    assert (8, 129792, 4096) in shapes                     # H100's TF32 skinny stream
    assert all(min(s) > 0 for s in g.shapes) and len(shapes) == len(g.shapes)
    q = ms.default_library_grid(True)
    assert set(q.shapes) < shapes and q.name == "library-quick"
    assert ms.library_grid("quick", False).shapes == q.shapes
    assert ms.library_grid(None, True).shapes == q.shapes
    assert "library" in ms.parse_parts(None) and ms.parse_parts("library") == ("library",)


def test_load_library_grid_defaults_to_x_at_w_transposed(tmp_path):
    f = tmp_path / "lib.toml"
    f.write_text("shapes = [[16, 4096, 4096], [1, 28672, 4096]]\ndtypes = ['float32']\n")
    g = ms.load_library_grid(f)
    assert g.shapes == ((16, 4096, 4096), (1, 28672, 4096)) and g.dtypes == ("float32",)
    assert g.layouts == ((True, False),) and g.configs == ()
    f.write_text("shapes = [[16, 4096, 4096]]\na_row_major = [true, false]\nb_row_major = [true]\n")
    assert ms.load_library_grid(f).layouts == ((True, True), (False, True))
    assert ms.library_grid(str(f), False).layouts == ((True, True), (False, True))


def test_kernel_summary_counts_per_call():
    ev = [("gemm", 10.0), ("splitk_reduce", 2.0), ("gemm", 12.0), ("splitk_reduce", 2.0)]
    got = ms.kernel_summary(ev, 2)
    assert got["kernels_per_call"] == 2.0
    assert got["kernel_ms"] == pytest.approx(0.013)
    assert got["kernel_names"] == "gemm;splitk_reduce"
    with pytest.raises(ValueError):
        ms.kernel_summary(ev, 0)


def test_library_rows_are_the_measured_schema_and_the_extra_columns():
    p = ms.Problem(8, 4096, 4096, True, False, "float16")
    recs = [{**ms.gemm_record(p, None, 0.012), "time_ms_warm": 0.009,
             **ms.kernel_summary([("k", 8.0)], 1)},
            ms.gemm_record(ms.Problem(1, 4096, 4096, True, False, "bfloat16"), None, 0.01)]
    df = ms.library_rows(recs, "h100_sxm")
    assert df.columns == [*ms.GEMM_COLUMNS, *ms.LIBRARY_EXTRA]
    assert df["backend"].to_list() == ["cublas", "cublas"]
    assert df["kernels_per_call"].to_list() == [1.0, None]
    assert df["time_ms_warm"].to_list() == [0.009, None]
    assert df["block_m"].is_null().all()
    with pytest.raises(ValueError):
        ms.library_rows([{**recs[0], "backend": "triton"}], "h100_sxm")


class _FakeTensor:
    def __init__(self, *shape, clock=None):
        self.shape = tuple(shape)
        self.clock = clock

    def t(self):
        return _FakeTensor(*reversed(self.shape), clock=self.clock)

    def mul_(self, x):
        return self

    def zero_(self):  # a write: the L2 is left full of dirty lines
        if self.clock is not None:
            self.clock["dirty"] = True
        return self

    def sum(self):  # a read: the L2 is left full of clean lines
        if self.clock is not None:
            self.clock["dirty"] = False
        return _FakeTensor(1)


def _fake_torch(kernels_per_call=2):
    """Just enough of torch for run_library: a clock that advances 5 us a matmul call,
    2 us more after the L2 was left dirty (a zeroed flush buffer), and a profiler
    that sees ``kernels_per_call`` kernels a call."""
    clock = {"t": 0.0, "calls": 0, "dirty": False}

    class Event:
        def __init__(self, enable_timing=False):
            self.at = None

        def record(self):
            self.at = clock["t"]

        def elapsed_time(self, other):
            return other.at - self.at

    def matmul(a, b, out=None):
        assert a.shape[1] == b.shape[0]
        clock["t"] += 0.007 if clock["dirty"] else 0.005
        clock["dirty"] = False
        clock["calls"] += 1
        return _FakeTensor(a.shape[0], b.shape[1])

    class Prof:
        def __init__(self, activities):
            self.start = None

        def __enter__(self):
            self.start = clock["calls"]
            return self

        def __exit__(self, *exc):
            return False

        def events(self):
            n = clock["calls"] - self.start
            ev = []
            for i in range(n * kernels_per_call):
                ev.append(types.SimpleNamespace(
                    name=f"kernel{i % kernels_per_call}", device_type="CUDA",
                    time_range=types.SimpleNamespace(elapsed_us=lambda: 2.0)))
            ev.append(types.SimpleNamespace(name="aten::mm", device_type="CPU",
                                            time_range=types.SimpleNamespace(elapsed_us=lambda: 9.0)))
            return ev

    torch = types.ModuleType("torch")
    torch.float16, torch.bfloat16, torch.float32, torch.int8 = "f16", "bf16", "f32", "i8"
    torch.backends = types.SimpleNamespace(cuda=types.SimpleNamespace(
        matmul=types.SimpleNamespace(allow_tf32=False)))
    torch.cuda = types.SimpleNamespace(Event=Event, synchronize=lambda: None,
                                       empty_cache=lambda: None)
    torch.randn = lambda *shape, device=None, dtype=None: _FakeTensor(*shape)
    torch.empty = lambda *shape, device=None, dtype=None: _FakeTensor(*shape, clock=clock)
    torch.matmul = matmul
    torch.autograd = types.SimpleNamespace(DeviceType=types.SimpleNamespace(CUDA="CUDA"))
    prof = types.ModuleType("torch.profiler")
    prof.ProfilerActivity = types.SimpleNamespace(CUDA="cuda")
    prof.profile = Prof
    return torch, prof


def test_run_library_times_cold_warm_and_profiles_each_problem(monkeypatch, tmp_path):
    """The library part end to end on a stand-in torch: one record per problem and
    dtype with both timings and the profiler's kernels, written as library.parquet."""
    torch, prof = _fake_torch(kernels_per_call=2)
    monkeypatch.setitem(sys.modules, "torch.profiler", prof)
    grid = ms.GemmGrid(((8, 4096, 4096), (1, 1024, 512)), (), ((True, False),), None, "t")
    env = {"l2_bytes": 50 << 20, "gpu": "h100_sxm"}
    seen = []
    recs = ms.run_library(torch, env, grid, ("float16", "bfloat16"), quick=True, quiet=True,
                          on_problem=lambda r, done, planned: seen.append((done, planned)))
    assert seen == [(1, 4), (2, 4), (3, 4), (4, 4)]
    assert [(r["m"], r["dtype"]) for r in recs] == [(8, "float16"), (8, "bfloat16"),
                                                    (1, "float16"), (1, "bfloat16")]
    for r in recs:  # cold after a written flush, cold after a read one, back to back
        assert r["time_ms"] == pytest.approx(0.007)
        assert r["time_ms_clean"] == pytest.approx(0.005)
        assert r["time_ms_warm"] == pytest.approx(0.005)
        assert r["kernels_per_call"] == 2.0 and r["kernel_ms"] == pytest.approx(0.004)
        assert r["kernel_names"] == "kernel0;kernel1" and r["b_row_major"] is False
    df = ms.library_rows(recs, env["gpu"])
    assert df.height == 4 and df["tf32"].to_list() == [False] * 4


def test_run_library_keeps_its_timings_when_the_profiler_fails(monkeypatch, capsys):
    torch, prof = _fake_torch()

    def broken(activities):
        raise RuntimeError("CUPTI unavailable")

    prof.profile = broken
    monkeypatch.setitem(sys.modules, "torch.profiler", prof)
    grid = ms.GemmGrid(((8, 64, 64),), (), ((True, False),), None, "t")
    recs = ms.run_library(torch, {"l2_bytes": 1 << 20}, grid, ("float16",), quick=True,
                          quiet=True)
    assert recs[0]["time_ms"] > 0 and "kernel_ms" not in recs[0]
    assert "CUPTI unavailable" in capsys.readouterr().err
    assert ms.library_rows(recs, "a100")["kernel_ms"].is_null().all()


def test_library_rows_evaluate_and_score(tmp_path):
    """library.parquet is a measured file tsbatch accuracy reads (its extra columns ignored)."""
    p = ms.Problem(8, 4096, 4096, True, False, "float16")
    df = ms.library_rows([{**ms.gemm_record(p, None, 0.02), "time_ms_warm": 0.015}], "h100_sxm")
    f = tmp_path / "library.parquet"
    df.write_parquet(f)
    assert main(["accuracy", str(f), "--hw", "h100_sxm", "--json", str(tmp_path / "r.json")]) == 0


def test_measure_checks_the_library_arguments_before_the_gpu(tmp_path, capsys, monkeypatch):
    _hide(monkeypatch)
    bad = tmp_path / "lib.toml"
    bad.write_text("shapes = [[1, 2]]\n")
    assert main(["measure", "--out", str(tmp_path / "m"), "--library-grid", str(bad)]) == 2
    assert "lib.toml: each shape must be [m, n, k]" in capsys.readouterr().err
    assert main(["measure", "--out", str(tmp_path / "m"), "--library-budget-s", "0"]) == 2
    assert "--library-budget-s 0" in capsys.readouterr().err
    assert main(["measure", "--out", str(tmp_path / "m"), "--only", "library,cublas"]) == 2
    assert "unknown part(s) ['cublas']" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()


def test_library_calls_report_on_a_written_file(tmp_path):
    """bench/library_calls.py: every problem predicted, the ratios and the per-call gap."""
    sys.path.insert(0, str(ROOT / "bench"))
    import library_calls as lc

    recs = []
    for m in (1, 8, 64, 128):
        p = ms.Problem(m, 4096, 4096, True, False, "float16")
        recs.append({**ms.gemm_record(p, None, 0.020), "time_ms_clean": 0.018,
                     "time_ms_warm": 0.015,
                     **ms.kernel_summary([("gemv", 16.0), ("reduce", 1.5)], 1)})
    ms.library_rows(recs, "h100_sxm").write_parquet(tmp_path / "library.parquet")
    df = lc.with_ratios(lc.predict(lc.load(tmp_path), None))
    assert df.height == 4 and (df["pred_us"] > 0).all()
    assert df["cold_over_pred"].to_list() == pytest.approx((20.0 / df["pred_us"]).to_list())
    assert df["cold_minus_kernel_us"].to_list() == pytest.approx([2.5] * 4)
    assert df["cold_minus_clean_us"].to_list() == pytest.approx([2.0] * 4)
    # the written-back L2 at the model's DRAM rate: the L2's bytes at most
    from tsbatch.engine.evaluate import resolve_hw
    h = resolve_hw("h100_sxm")
    cap = h.l2_bytes / (h.dram_bw_tbps * h.cal("dram_efficiency") * 1e6)
    assert ((df["writeback_us"] > 0) & (df["writeback_us"] <= cap * (1 + 1e-12))).all()
    assert df["m_bucket"].to_list() == ["M<=16", "M<=16", "M 17-64", "M>64"]
    s = lc.summary(df)
    assert s["problems"].to_list() == [1, 2, 1] and s["kernels"].to_list() == [2.0] * 3
    assert lc.main([str(tmp_path / "library.parquet"), "--json", str(tmp_path / "s.json")]) == 0


def test_run_measure_writes_library_parquet_with_its_provenance(monkeypatch, tmp_path):
    """run_measure's library block on the stand-in torch: the file, its rows and metadata."""
    torch, prof = _fake_torch(kernels_per_call=1)
    monkeypatch.setitem(sys.modules, "torch.profiler", prof)
    monkeypatch.setattr(ms, "require_gpu", lambda: (torch, types.SimpleNamespace()))
    env = {"device_name": "NVIDIA H100 80GB HBM3", "gpu": "h100_sxm", "driver": "x",
           "cuda": "12.4", "torch": "2.5", "triton": "3.1", "date": DATE, "sm_count": 132,
           "l2_bytes": 50 * MIB}
    monkeypatch.setattr(ms, "_environment", lambda torch, triton: dict(env))
    monkeypatch.setattr(ms, "_load_kernels", lambda workdir: None)
    grid = ms.GemmGrid(((8, 4096, 4096), (64, 1024, 4096)), (), ((True, False),), None, "t")
    res = ms.run_measure(tmp_path, quick=True, grid=ms.default_grid(True),
                         dtypes=("float16",), parts=("library",), quiet=True,
                         lib_grid=grid, lib_dtypes=("bfloat16", "float32"))
    assert res["written"] == {"library.parquet": 4}
    df = pl.read_parquet(tmp_path / "library.parquet")
    assert df.columns == [*ms.GEMM_COLUMNS, *ms.LIBRARY_EXTRA]
    assert sorted(set(df["dtype"])) == ["bfloat16", "float32"]
    assert df["tf32"].to_list() == [False, True, False, True]
    meta = read_metadata(tmp_path / "library.parquet")
    assert meta["tsbatch.measure_kind"] == "library" and meta["tsbatch.complete"] == "true"
    assert meta["tsbatch.gpu"] == "h100_sxm" and "L2 flushed" in meta["tsbatch.timing"]
    assert not (tmp_path / "gemm.parquet").exists()


def test_the_prepared_device_script_passes_tsbatch_measure_its_arguments(monkeypatch, capsys):
    """Every ``tsbatch measure`` line of bench/device/measure.sh parses (the run then
    stops at the missing GPU, not at an argument): a device's minutes are not spent
    finding a typo."""
    import shlex

    _hide(monkeypatch)
    text = (ROOT / "bench" / "device" / "measure.sh").read_text().replace("\\\n", " ")
    subs = {'"$out"': "/tmp/tsbatch-test-out", '"$out/fp32"': "/tmp/tsbatch-test-out/fp32",
            '"$here/': str(ROOT / "bench" / "device") + "/", '"$lib_budget"': "150",
            '"$gemm_budget"': "180", '"$fp32_budget"': "60"}
    calls = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("python3 -m tsbatch.front.cli measure"):
            for k, v in subs.items():
                line = line.replace(k, v)
            args = shlex.split(line.replace('.toml"', ".toml"))[3:]
            assert "$" not in " ".join(args), line
            calls.append(args)
    assert len(calls) >= 3 and calls[0][:1] == ["measure"]
    for args in calls:
        for i, a in enumerate(args):
            if a.endswith(".toml"):
                assert Path(a).exists(), a
        assert main(args) == 2
        err = capsys.readouterr().err
        assert "needs a CUDA GPU" in err, (args, err)


def test_a_spent_budget_stops_the_library_loop_and_counts_what_was_done(monkeypatch):
    torch, prof = _fake_torch()
    monkeypatch.setitem(sys.modules, "torch.profiler", prof)
    grid = ms.GemmGrid(((8, 64, 64), (16, 64, 64)), (), ((True, False),), None, "t")
    stats: dict = {}
    assert ms.run_library(torch, {"l2_bytes": 1 << 20}, grid, ("float16",), quick=True,
                          quiet=True, budget_s=1e-12, stats=stats) == []
    assert stats == {"problems_planned": 2, "problems_done": 0}
    recs = ms.run_library(torch, {"l2_bytes": 1 << 20}, grid, ("float16",), quick=True,
                          quiet=True, stats=stats)
    assert len(recs) == 2 and stats == {"problems_planned": 2, "problems_done": 2}


def test_run_gemm_times_the_library_and_each_configuration(monkeypatch):
    """run_gemm's loop on the stand-in torch (the Triton launch stubbed): a cuBLAS row and
    one row per configuration each problem, a configuration that cannot build recorded
    as not runnable, the counts in ``stats``."""
    torch, _ = _fake_torch()
    grid = ms.GemmGrid(((64, 64, 64), (128, 64, 32)), ms.default_grid(True).configs[:3],
                       ((True, True),), None, "t")
    bad = grid.configs[1]

    def launch(kernels, a, b, c, m, n, k, cfg, ieee, g):
        if cfg == bad:
            raise RuntimeError("out of resource: shared memory")
        return torch.matmul(a, b)

    monkeypatch.setattr(ms, "_launch_matmul", launch)
    monkeypatch.setattr(ms, "kernel_resources", lambda compiled: {"num_regs": 128})
    monkeypatch.setattr(ms, "_check", lambda torch, c, ref, dtype: True)
    torch.empty = lambda *shape, device=None, dtype=None: _FakeTensor(*shape)
    stats: dict = {}
    recs = ms.run_gemm(torch, None, {"l2_bytes": 1 << 20}, grid, ("float16",), quick=True,
                       quiet=True, stats=stats)
    assert [r["backend"] for r in recs] == ["cublas", "triton", "triton", "triton"] * 2
    assert [math.isinf(r["time_ms"]) for r in recs if r["backend"] == "triton"] == \
        [False, True, False] * 2
    assert stats == {"wrong_results": 0, "problems_planned": 2, "problems_done": 2}
    assert ms.gemm_rows(recs, "h100_sxm").height == 8


def test_the_layer_part_runs_only_when_named_and_checks_its_spec_first(tmp_path, capsys,
                                                                      monkeypatch):
    assert "layer" not in ms.parse_parts(None) and ms.parse_parts("layer") == ("layer",)
    _hide(monkeypatch)
    bad = tmp_path / "layer.toml"
    bad.write_text("tp = 0\n")
    assert main(["measure", "--out", str(tmp_path / "m"), "--only", "layer",
                 "--layer-spec", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "layer.toml" in err and "needs a CUDA GPU" not in err
    assert not (tmp_path / "m").exists()


def test_run_measure_hands_the_layer_part_its_spec(monkeypatch, tmp_path):
    from tsbatch.measured import layer

    torch, _ = _fake_torch()
    monkeypatch.setattr(ms, "require_gpu", lambda: (torch, types.SimpleNamespace()))
    env = {"device_name": "x", "gpu": "h100_sxm", "driver": "x", "torch": "2.5",
           "triton": "3.1"}
    monkeypatch.setattr(ms, "_environment", lambda torch, triton: dict(env))
    monkeypatch.setattr(ms, "_load_kernels", lambda workdir: None)
    seen = []
    monkeypatch.setattr(layer, "run_layer_part",
                        lambda out, spec, quiet: seen.append((out, spec, quiet)) or 7)
    spec = layer.default_spec()
    res = ms.run_measure(tmp_path, quick=True, grid=ms.default_grid(True), dtypes=("float16",),
                         parts=("layer",), quiet=True, layer_spec=spec)
    assert res["written"] == {"layer.parquet": 7} and seen == [(tmp_path, spec, True)]
