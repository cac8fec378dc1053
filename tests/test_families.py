"""The family engine: tile programs, legal orders, the best-order kernel, the
catalog's attention families and user programs from TOML."""

from __future__ import annotations

import dataclasses
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import naive_dag
from kernels_catalog.catalog import PROGRAM_DIR, program_families
from kernels_catalog.program import (
    ProgramError, count_orders, legal_orders, load_program, program_from_dict,
)
from tsbatch.engine.evaluate import FAMILIES, evaluate, get_family
from tsbatch.hw import get_hw
from tsbatch.kernels.dag import best_orders
from tsbatch.kernels.envelope import R_CUDA, R_SMEM, R_TC
from tsbatch.kernels.occupancy import l1_left
from tsbatch.boundary.schema import validate

CATALOG = sorted(PROGRAM_DIR.glob("*.toml"))


# ----------------------------------------------------------------------------- orders
@pytest.mark.parametrize("path", CATALOG, ids=lambda p: p.stem)
def test_legal_order_count_matches_brute_force(path):
    prog = load_program(path)
    preds = prog.body_preds()
    brute = naive_dag.brute_force_orders(preds)
    got = prog.orders()
    assert got.shape[0] == len(brute) == count_orders(preds)
    assert sorted(map(tuple, got.tolist())) == sorted(brute)


def test_paper_mla_order_count_shape():
    # TileSight §3.4: 11 tile actions, 132 legal orders. A 2 x 6 grid of
    # dependencies less its last corner (two streams of 6 and 5 actions, each
    # action after its row predecessor and the action above it) has exactly
    # the Catalan number C6 = 132 linear extensions: the enumerator must find them
    top = list(range(6))
    preds = [[i - 1] if i else [] for i in top]
    for j in range(5):
        preds.append([6 + j - 1, j] if j else [j])
    assert len(preds) == 11
    assert legal_orders(preds).shape[0] == 132 == count_orders(preds)
    assert len(naive_dag.brute_force_orders(preds)) == 132


@st.composite
def dags(draw):
    n = draw(st.integers(1, 7))
    preds = [sorted(draw(st.sets(st.integers(0, i - 1), max_size=i)) if i else []) for i in range(n)]
    perm = draw(st.permutations(range(n)))  # relabel so that index order is not topological
    inv = {old: new for new, old in enumerate(perm)}
    out = [[] for _ in range(n)]
    for i, ps in enumerate(preds):
        out[inv[i]] = [inv[p] for p in ps]
    return out


@given(dags())
@settings(max_examples=60, deadline=None)
def test_orders_are_every_topological_order(preds):
    got = legal_orders(preds)
    assert sorted(map(tuple, got.tolist())) == sorted(naive_dag.brute_force_orders(preds))


@given(dags(), st.data())
@settings(max_examples=60, deadline=None)
def test_best_orders_kernel_equals_twin(preds, data):
    n = len(preds)
    orders = legal_orders(preds)
    rows = data.draw(st.integers(1, 4))
    # each action's uses: up to 3 resources (a resource may repeat), zero durations included
    res = [data.draw(st.lists(st.integers(0, 7), max_size=3)) for _ in range(n)]
    use_res = np.array([r for rs in res for r in rs], dtype=np.int64)
    use_ptr = np.cumsum([0] + [len(rs) for rs in res])
    udur = np.array([[data.draw(st.one_of(st.just(0.0), st.floats(0.0, 10.0)))
                      for _ in range(use_res.size)] for _ in range(rows)]).reshape(rows, -1)
    pred_mask = np.array([sum(1 << p for p in ps) for ps in preds], dtype=np.int64)
    chain, best = best_orders(udur, use_ptr, use_res, pred_mask, orders)
    for i in range(rows):
        uses = [list(zip(res[a], udur[i, use_ptr[a]:use_ptr[a + 1]])) for a in range(n)]
        want, arg = naive_dag.best_order(uses, preds, [tuple(o) for o in orders])
        assert chain[i] == pytest.approx(want, rel=1e-12, abs=1e-12)
        # the kernel's order is a best one (ties may be broken differently only if equal)
        assert naive_dag.chain(uses, preds, tuple(orders[best[i]])) == pytest.approx(want)


def test_order_matters_on_a_shared_unit():
    # a -> b on unit 0, c on unit 0 independent: issuing c first delays b
    preds = [[], [0], []]
    orders = [tuple(o) for o in legal_orders(preds)]
    one = [[(0, 1.0)], [(0, 1.0)], [(0, 5.0)]]
    chains = [naive_dag.chain(one, preds, o) for o in orders]
    assert min(chains) == 7.0 and max(chains) == 7.0  # one unit: every order sums
    two = [[(0, 1.0)], [(1, 1.0)], [(1, 5.0)]]  # b and c share unit 1; a on unit 0
    chains2 = {o: naive_dag.chain(two, preds, o) for o in orders}
    assert chains2[(0, 1, 2)] == 7.0 and chains2[(2, 0, 1)] == 6.0


def test_uses_of_one_action_overlap_on_their_own_resources():
    # a: 1 on unit 0 and 3 on unit 1 (its instructions on two pipes interleave);
    # b after nothing, 2 on unit 0: issued after a, it waits only for a's unit-0
    # share (1), not for a's whole duration (3): the chain is max(3, 1 + 2) = 3
    preds = [[], []]
    uses = [[(0, 1.0), (1, 3.0)], [(0, 2.0)]]
    assert naive_dag.chain(uses, preds, (0, 1)) == 3.0
    got, _ = best_orders(np.array([[1.0, 3.0, 2.0]]), np.array([0, 2, 3]), np.array([0, 1, 0]),
                         np.array([0, 0]), legal_orders(preds))
    assert got[0] == 3.0
    # a dependent successor waits for the whole action
    assert naive_dag.chain(uses, [[], [0]], (0, 1)) == 5.0


# ----------------------------------------------------------------------------- programs
_MINI = """
[family]
name = "mini"
[columns]
n = { kind = "int", doc = "rows", positive = true }
dtype = { kind = "str", doc = "type", choices = ["float16"] }
block = { kind = "int", doc = "tile", positive = true }
[dtypes]
float16 = { eb = 2, tc = "float16" }
[grid]
dims = ["cdiv(n, block)", "1", "1"]
steps = "4"
warps = "4"
[[tensor]]
name = "X"
bytes = "block * 64 * eb"
[[footprint]]
name = "ring"
placement = "smem"
bytes = "2 * block * 64 * eb"
[[action]]
name = "load"
async = true
tensor = "X"
[[action]]
name = "mma"
deps = ["load"]
uses = { tensor_core = "2 * block * 64 * 64" }
[[action]]
name = "post"
deps = ["mma"]
uses = { cuda_core = "2 * block * 64" }
"""


def _mini(tmp_path, text=_MINI, name="mini.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


@pytest.mark.parametrize("edit, what", [
    (("deps = [\"mma\"]", "deps = [\"post\"]"), "cycle"),
    (("cuda_core = ", "warp_core = "), "unknown resource 'warp_core'"),
    (("deps = [\"load\"]", "deps = [\"lod\"]"), "depends on 'lod'"),
    (("placement = \"smem\"", "placement = \"sram\""), "placement 'sram'"),
    (("2 * block * 64 * 64", "2 * blok * 64"), "unknown name 'blok'"),
    (("2 * block * 64 * 64", "__import__('os')"), "not allowed"),
    (("placement = \"smem\"", "placement = \"smem\"\nelastic = true"), "placement 'registers' only"),
    (("placement = \"smem\"", "placement = \"smem\"\nelastic = 1"), "true or false"),
    (("placement = \"smem\"", "placement = \"smem\"\nspill_whole = true"),
     "placement 'registers' without elastic only"),
    (("placement = \"smem\"", "placement = \"smem\"\nspill_whole = 1"),
     "spill_whole must be true, false or an expression, not 1"),
    (("placement = \"smem\"", "placement = \"registers\"\nspill_whole = \"blok > 1\""),
     "footprint 'ring' spill_whole: unknown name 'blok'"),
    (("placement = \"smem\"", "placement = \"smem\"\nspill_hole = true"),
     "unknown key 'spill_hole' (did you mean 'spill_whole'?)"),
    (("[[footprint]]", "[[footprnt]]"), "unknown key 'footprnt' (did you mean 'footprint'?)"),
    (("warps = \"4\"", "warp = \"4\""), "[grid]: unknown key 'warp' (did you mean 'warps'?)"),
    (("async = true", "asynch = true"), "unknown key 'asynch' (did you mean 'async'?)"),
    (("eb = 2, tc", "eb = 2, bytes = 2, tc"), "dtype 'float16': unknown key 'bytes'"),
    (("positive = true }", "positive = true, min = 1 }"), "column 'n': unknown key 'min'"),
])
def test_bad_program_names_action_and_file(tmp_path, edit, what):
    path = _mini(tmp_path, _MINI.replace(*edit))
    with pytest.raises(ProgramError, match=re.escape(what)) as exc:
        load_program(path)
    assert str(path) in str(exc.value)


def test_bad_program_cli_exit_2_nothing_written(tmp_path):
    path = _mini(tmp_path, _MINI.replace('deps = ["mma"]', 'deps = ["post"]'))
    cand = tmp_path / "c.parquet"
    pl.DataFrame({"n": [1024], "dtype": ["float16"], "block": [64]}).write_parquet(cand)
    out = tmp_path / "o.parquet"
    r = subprocess.run([sys.executable, "-m", "tsbatch.front.cli", "evaluate", str(cand), "--hw", "a100",
                        "-o", str(out), "--family", str(path)], capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    assert "post" in r.stderr and str(path) in r.stderr and "cycle" in r.stderr
    assert r.stderr.count("\n") == 1 and not out.exists()


def test_user_program_hand_computed(tmp_path):
    fam = get_family(str(_mini(tmp_path)))
    hw = get_hw("a100")
    df = pl.DataFrame({"n": [4096, 1000], "dtype": ["float16"] * 2, "block": [128, 64]})
    cols, _ = validate(df, fam)
    plan = fam.lower(cols, hw)
    assert plan.g0.tolist() == [32, 16] and plan.ksteps.tolist() == [4, 4]
    assert plan.smem_block.tolist() == [2 * 128 * 64 * 2, 2 * 64 * 64 * 2]
    assert plan.t_bytes[:, 0].tolist() == [128 * 64 * 2, 64 * 64 * 2]
    sms = hw.sm_count
    tc = hw.tc_tflops("float16") * 1e6 / sms * hw.mma_sync_fraction * hw.cal("tc_efficiency")
    cuda = hw.rate("fp32_tflops") * 1e6 / sms
    assert plan.work_iter[0, 0] == 2 * 128 * 64 * 64
    # the chain: mma then post in series (post depends on mma)
    want = 2 * 128 * 64 * 64 / tc + 2 * 128 * 64 / cuda
    assert plan.chain_us[0] == pytest.approx(want, rel=1e-12)
    res = evaluate(df, hw, fam)
    assert res["feasible"].all() and res["steady_order"][0] == "mma > post"


def test_tensor_foot_is_the_cache_models_block(tmp_path):
    # bytes: the grid's average edge tile; foot: every block whole (GEMM's t_foot)
    text = _MINI.replace('bytes = "block * 64 * eb"\n[[footprint]]',
                         'bytes = "n / cdiv(n, block) * 64 * eb"\nfoot = "block * 64 * eb"\n[[footprint]]')
    assert text != _MINI
    hw = get_hw("a100")
    df = pl.DataFrame({"n": [1000, 1010, 1024], "dtype": ["float16"] * 3, "block": [64] * 3})
    fam = get_family(str(_mini(tmp_path, text, "foot.toml")))
    plan = fam.lower(validate(df, fam)[0], hw)
    assert plan.t_bytes[:, 0].tolist() == [1000 / 16 * 128, 1010 / 16 * 128, 64 * 128]
    assert plan.t_foot[:, 0].tolist() == [64 * 128] * 3
    # without foot the cache model takes the traffic bytes
    plain = get_family(str(_mini(tmp_path)))
    assert plain.lower(validate(df, plain)[0], hw).t_foot is None
    # a foot expression is checked as every other one
    with pytest.raises(ProgramError, match="foot"):
        load_program(_mini(tmp_path, text.replace('foot = "block', 'foot = "blok'), "bad.toml"))


@pytest.mark.parametrize("name, size, shared", [
    ("gemm_epilogue", "m", None), ("moe_grouped_gemm", "tokens", ("A", "C")), ("rowwise", "hidden", None)])
def test_program_cache_blocks_whole_tiles(name, size, shared):
    # the catalog programs whose traffic averages edge tiles key the cache model on
    # whole tiles: rows that differ in a size only within one grid get the same
    # blocks (moe's W split by other_share follows the token count: not shared)
    fam = get_family(name)
    base = {"gemm_epilogue": dict(m=1000, n=3000, k=4096, dtype="bfloat16", epilogue="residual",
                                  block_m=128, block_n=128, block_k=64, num_stages=3, num_warps=8),
            "moe_grouped_gemm": dict(tokens=1000, dtype="bfloat16", experts=8, top_k=2, hidden=4096,
                                     ffn=14336, block_m=64, block_n=128, block_k=64, num_stages=3,
                                     num_warps=4),
            "rowwise": dict(rows=1000, hidden=5000, dtype="bfloat16", op="rmsnorm")}[name]
    df = pl.DataFrame([{**base, size: base[size] + d} for d in (0, 1, 3)])
    plan = fam.lower(validate(df, fam)[0], get_hw("h100"))
    names = [t.name for t in fam.program.tensors]
    cols = [names.index(t) for t in shared] if shared else list(range(len(names)))
    foot, traffic = plan.t_foot[:, cols], plan.t_bytes[:, cols]
    assert (foot >= traffic * (1 - 1e-12)).all()
    assert (foot == foot[0]).all() and (foot == np.floor(foot)).all()
    assert (traffic != traffic[0]).any()  # the traffic follows the edge tiles


def test_elastic_registers_take_the_cap_never_spill(tmp_path):
    # 4 warps x 32 threads: per thread 256 B (64 registers) held + 2048 B (512) or
    # 800 B (200) of fragments, elastic or held
    regs = """
[[footprint]]
name = "held"
placement = "registers"
bytes = "128 * 256"
[[footprint]]
name = "frag"
placement = "registers"
{flag}
bytes = "128 * {per_thread}"
"""
    hw = get_hw("a100")
    df = pl.DataFrame({"n": [4096], "dtype": ["float16"], "block": [128]})
    plans = {}
    whole = "spill_whole = true"
    for flag, per_thread in (("elastic = true", 2048), ("", 2048), (whole, 2048), (whole, 800)):
        text = _MINI + regs.format(flag=flag, per_thread=per_thread)
        fam = get_family(str(_mini(tmp_path, text, f"r{len(flag)}_{per_thread}.toml")))
        cols, _ = validate(df, fam)
        plans[flag, per_thread] = (fam.lower(cols, hw), evaluate(df, hw, fam))
    p, res = plans["elastic = true", 2048]
    assert p.regs_thread[0] == hw.max_registers_per_thread
    assert res["register_spill"][0] == 0
    assert p.local_l2 is None
    base = 32  # the grid's default base_registers
    assert 64 + base < hw.max_registers_per_thread < 512
    # held footprints spill their sum's excess over the cap, through L1 only
    p, res = plans["", 2048]
    assert res["register_spill"][0] == 64 + 512 + base - hw.max_registers_per_thread
    assert p.local_l2 is None
    # spill_whole: a footprint of more registers than the cap on its own spills
    # whole (ptxas keeps the array in local memory) and the rest fits
    p, res = plans[whole, 2048]
    assert res["register_spill"][0] == 512
    assert p.regs_thread[0] == 64 + base
    # ... and one that fits the cap on its own spills only the sum's excess
    p, res = plans[whole, 800]
    assert res["register_spill"][0] == 64 + 200 + base - hw.max_registers_per_thread
    # an expression: whole on the rows it selects, the sum's excess on the others
    text = _MINI + regs.format(flag='spill_whole = "block >= 128"', per_thread=2048)
    fam = get_family(str(_mini(tmp_path, text, "rexpr.toml")))
    two = pl.DataFrame({"n": [4096, 4096], "dtype": ["float16"] * 2, "block": [128, 64]})
    res = evaluate(two, hw, fam)
    assert res["register_spill"].to_list() == [512, 64 + 512 + base - hw.max_registers_per_thread]


def test_spilled_registers_beyond_the_l1_left_stream_from_l2(tmp_path):
    # the share of the resident blocks' spilled bytes that the L1 left by the
    # shared-memory carve-out does not hold is read from L2 and written back
    # each iteration (TilePlan.local_l2), and the L2 traffic grows by it
    acc = """
[[footprint]]
name = "acc"
placement = "registers"
spill_whole = true
bytes = "128 * {per_thread}"
"""
    hw = get_hw("a100")
    df = pl.DataFrame({"n": [4096], "dtype": ["float16"], "block": [128]})
    out = {}
    for per_thread in (0, 1024, 2048):  # no spill; 256 and 512 registers, each spilled whole
        text = _MINI + (acc.format(per_thread=per_thread) if per_thread else "")
        fam = get_family(str(_mini(tmp_path, text, f"a{per_thread}.toml")))
        cols, _ = validate(df, fam)
        out[per_thread] = (fam.lower(cols, hw), evaluate(df, hw, fam))
    plan0, res0 = out[0]
    assert plan0.local_l2 is None
    tiles, steps = 32, 4  # the mini program's grid
    for per_thread in (1024, 2048):
        plan, res = out[per_thread]
        spill_block = per_thread * 128.0
        assert res["register_spill"][0] == per_thread // 4
        p, left = l1_left(plan.smem_block, plan.regs_thread, plan.threads, hw)
        share = 1.0 - left[0] / (spill_block * p[0])
        assert 0.0 < share < 1.0
        assert plan.local_l2[0] == pytest.approx(2.0 * spill_block * share, rel=1e-12)
        assert res["l2_bytes"][0] - res0["l2_bytes"][0] == pytest.approx(
            tiles * steps * plan.local_l2[0], rel=1e-9)
        assert res["latency_us"][0] > res0["latency_us"][0]
    assert out[2048][0].local_l2[0] > out[1024][0].local_l2[0]


def test_l1_left_by_the_carve_out():
    # A100: 192 KiB of SRAM, at most 164 KiB of shared memory, 1 KiB reserved a block.
    # 136 KiB blocks at 255 registers: one resident, two by the registers, so the
    # driver carves out all 164 KiB and leaves 28 KiB of L1; 16 KiB blocks at 64
    # registers: eight resident (by the registers), 8 x 17 KiB carved out
    hw = get_hw("a100")
    p, left = l1_left(np.array([136 * 1024, 16 * 1024]), np.array([255, 64]),
                      np.array([128, 128]), hw)
    assert p.tolist() == [1, 8]
    assert left.tolist() == [hw.l1_smem_bytes - hw.sm_smem_bytes,
                             hw.l1_smem_bytes - 8 * (16 + 1) * 1024]
    assert hw.l1_smem_bytes - hw.sm_smem_bytes == 28 * 1024


def test_l1_left_of_a_long_batch_by_distinct_inputs():
    # a batch of L1_LEFT_GROUP_MIN rows or more is solved once per distinct input
    # and spread: the same values as row by row
    from tsbatch.kernels import occupancy

    hw = get_hw("h100")
    rng = np.random.default_rng(3)
    n = occupancy.L1_LEFT_GROUP_MIN * 3
    smem = rng.choice([0, 16384, 73728, 139264, 232448], n)
    regs = rng.choice([32, 96, 168, 255], n)
    threads = rng.choice([64, 128, 256], n)
    p, left = l1_left(smem, regs, threads, hw)
    p1, left1 = occupancy._l1_left(smem, regs, threads, hw)
    assert np.array_equal(p, p1) and np.array_equal(left, left1)
    p2, left2 = l1_left(smem[:10], regs[:10], threads[:10], hw)  # short: row by row
    assert np.array_equal(p2, p1[:10]) and np.array_equal(left2, left1[:10])


def test_attention_registers_against_ptxas():
    # the same compiler table: resident blocks per SM from ptxas's registers and
    # Triton's shared memory, against the model's; and no spill the compiler does not make
    table = pl.read_csv(TRITON_TABLE)
    hw = get_hw("a100")
    launch = table.filter(pl.col("shared") <= hw.smem_per_block_bytes)
    res = evaluate(_table_candidates(launch), hw, "attention")
    w = launch["num_warps"].to_numpy()
    regs = np.minimum(launch["regs"].to_numpy(), hw.max_registers_per_thread)
    unit = hw.register_alloc_unit
    regs_block = np.ceil(regs * 32 / unit) * unit * w
    real = np.minimum.reduce([hw.sm_registers // regs_block, hw.sm_max_warps // w,
                              hw.sm_smem_bytes // (launch["shared"].to_numpy()
                                                   + hw.smem_reserved_per_block_bytes)])
    agree = (res["resident_tiles"].to_numpy() == real).mean()
    assert agree >= 0.85, agree  # 0.887 (the footprint before: 0.66)
    spills = res["register_spill"].to_numpy() > 0
    assert not np.any(spills & (launch["spill_bytes"].to_numpy() == 0))


def test_attention_whole_accumulator_spill_against_ptxas():
    # the accumulator's spill_whole against the compiler table (every configuration,
    # launchable or not): where the model's accumulator alone exceeds the register
    # cap ptxas spills more than 4 KB a thread, and where ptxas compiles the kernel
    # to 32 registers the model spills at least the whole accumulator
    table = pl.read_csv(TRITON_TABLE)
    hw = get_hw("a100")
    fam = FAMILIES["attention"]
    cols, _ = validate(_table_candidates(table), fam)
    plan = fam.lower(cols, hw)
    d = table["head_dim"].to_numpy()
    bm, w = table["block_m"].to_numpy(), table["num_warps"].to_numpy()
    lay_m = np.where(bm >= d, w, 1)
    lay_n = np.where(bm >= d, 1, w)
    acc = np.maximum(bm / lay_m, 16) * np.maximum(d / lay_n, 8) / 32  # registers a thread
    spill = plan.extra["register_spill"]
    over = acc > hw.max_registers_per_thread
    assert over.sum() == 12
    assert (table["spill_bytes"].to_numpy()[over] > 4096).all()
    assert (spill[over] >= acc[over]).all()
    whole = table["regs"].to_numpy() == 32
    assert whole.sum() == 10 and (spill[whole] >= acc[whole]).all()


def test_attention_whole_accumulator_spill_on_the_mma_sync_path_only():
    # ptxas spills the 256-register accumulator of the 128x32 head_dim-256 tile whole
    # for sm_80 (32 registers, 13,928 bytes) but not for sm_90a on the warpgroup-MMA
    # path (255 registers, 2,304 bytes): the program's spill_whole is "not wg_path"
    row = dict(batch=8, heads=8, seq_len=2048, head_dim=256, dtype="float16", score_mod_nodes=6,
               block_m=128, block_n=32, num_stages=3, num_warps=4)
    df = pl.DataFrame([row])
    fam = FAMILIES["attention"]
    cols, _ = validate(df, fam)
    a100 = fam.lower(cols, get_hw("a100"))
    h100 = fam.lower(cols, get_hw("h100"))
    assert a100.extra["mma_path"][0] != h100.extra["mma_path"][0]
    assert a100.extra["register_spill"][0] >= 256 and a100.local_l2 is not None
    assert 0 < h100.extra["register_spill"][0] < 256 and h100.local_l2 is None


def test_user_program_alu_work_by_hand(tmp_path):
    """An action's ``alu`` work runs on the integer/logic pipe where the GPU has
    one (A100: alu_tops operations per second, beside the FMA pipe), and as one
    elementwise operation (2 FLOPs) each on the CUDA cores where it has not
    (MI210: alu_tops = 0)."""
    text = _MINI.replace('uses = { cuda_core = "2 * block * 64" }',
                         'uses = { cuda_core = "2 * block * 64", alu = "3 * block * 64" }')
    fam = get_family(str(_mini(tmp_path, text, "alu.toml")))
    df = pl.DataFrame({"n": [4096], "dtype": ["float16"], "block": [128]})
    cols, _ = validate(df, fam)
    a100 = fam.lower(cols, get_hw("a100"))
    assert a100.work_iter[0, 1] == 2 * 128 * 64 and a100.work_iter[0, 8] == 3 * 128 * 64
    alu = get_hw("a100").rate("alu_tops") * 1e6 / get_hw("a100").sm_count
    assert a100.rate[0, 8] == pytest.approx(alu)
    mi = fam.lower(cols, get_hw("mi210"))
    assert mi.work_iter[0, 8] == 0.0 and mi.work_iter[0, 1] == 2 * 128 * 64 + 2 * 3 * 128 * 64
    # the ALU work is one more resource of the chain's post action, not a new step
    tc = get_hw("a100").tc_tflops("float16") * 1e6 / 108 * get_hw("a100").cal("tc_efficiency")
    cuda = get_hw("a100").rate("fp32_tflops") * 1e6 / 108
    post = max(2 * 128 * 64 / cuda, 3 * 128 * 64 / alu)
    assert a100.chain_us[0] == pytest.approx(2 * 128 * 64 * 64 / tc + post, rel=1e-12)
    res = evaluate(df, "a100", fam)
    assert res["feasible"].all() and "util_alu" in res.columns


# ----------------------------------------------------------------------------- attention
def _attn_row(**kw):
    row = dict(batch=2, heads=8, seq_len=1024, head_dim=64, dtype="float16", score_mod_nodes=8,
               block_m=128, block_n=64, num_stages=3, num_warps=4, kv_heads=0, causal=False)
    row.update(kw)
    return pl.DataFrame({k: [v] for k, v in row.items()})


def test_attention_resource_vector_by_hand():
    fam = FAMILIES["attention"]
    hw = get_hw("a100")
    cols, _ = validate(_attn_row(), fam)
    p = fam.lower(cols, hw)
    BM, BN, D, eb = 128, 64, 64, 2
    assert (p.g0[0], p.g1[0], p.g2[0], p.ksteps[0]) == (1024 // BM, 1, 2 * 8, 1024 // BN)
    assert p.work_iter[0, 0] == 2 * (2 * BM * BN * D)                       # QK^T and PV
    fma = 2 + 1 + 1  # FMA pipe per score: softmax scale and 1/ln 2, s - m, the row sum
    assert p.work_iter[0, 1] == pytest.approx(2 * fma * BM * BN + 2 * BM * D)  # + rescale
    alu = 2 + 1 + 0.5  # ALU pipe: score_mod (8 nodes - 6), the row max, P packed to fp16
    assert p.work_iter[0, 8] == pytest.approx(alu * BM * BN)
    assert p.work_iter[0, 2] == BM * BN + BM                               # exp2, alpha
    warps_m = 4
    assert p.work_iter[0, 3] == pytest.approx(2 * BN * D * eb + 2 * warps_m * BN * D * eb)
    # K/V ring (num_stages - 1 slots) and Q; P converted in registers (16-bit P,
    # block_m >= head_dim: warps along M), so no P buffer
    assert p.smem_block[0] == 2 * 2 * BN * D * eb + BM * D * eb
    assert p.t_bytes[0].tolist() == [BM * D * eb, BN * D * eb, BN * D * eb, BM * D * eb]
    assert p.t_mask[0].tolist() == [0, 0b011, 0b011, 0]
    assert p.useful_flops[0] == 4.0 * 2 * 8 * 1024 * 1024 * 64


def test_program_power_limited_clock_by_hand():
    """A program grid of fewer tiles than SMs runs at GEMM's power-limited
    clock: the tensor-core rate boosted by min(1 / tc_efficiency, sms / tiles),
    the per-clock (CUDA-core, shared-memory) rates by that up to max_clock_mhz /
    clock_mhz; a grid of more tiles than SMs at the full-grid rates (no
    last-round boost in the program families), a GPU without headroom
    (tc_efficiency 1) at the full-grid rates everywhere, and the CUDA cores'
    ceiling over the clock their rate is stated at when the clock alone falls."""
    fam = FAMILIES["attention"]
    hw = get_hw("a100")
    sms, eff = hw.sm_count, hw.cal("tc_efficiency")
    assert sms == 108 and eff == 0.85
    assert hw.max_clock_mhz == 1410.0 and hw.rate("clock_mhz") == 1387.0
    cap = 1410.0 / 1387.0
    rows = pl.concat([_attn_row(),                        # 8 x 16 = 128 tiles: none
                      _attn_row(batch=1, heads=4),        # 32 tiles: boost 1 / 0.85
                      _attn_row(batch=3, heads=4),        # 96 tiles: boost 108 / 96
                      _attn_row(batch=27, heads=1),       # 216 tiles: two full rounds
                      _attn_row(batch=1, heads=4, dtype="float32")])  # 32 tiles
    cols, _ = validate(rows, fam)
    p = fam.lower(cols, hw)
    assert p.extra["tiles"].tolist() == [128, 32, 96, 216, 32]
    tc0 = hw.tc_tflops("float16") * 1e6 / sms * hw.mma_sync_fraction * eff
    cuda0 = hw.rate("fp32_tflops") * 1e6 / sms
    smem0 = hw.smem_bytes_per_clk * 1387.0
    tc_f = [1.0, 1.0 / eff, 108.0 / 96.0, 1.0, None]
    clk_f = [1.0, cap, cap, 1.0, cap]
    for i in range(5):
        if tc_f[i] is not None:
            assert p.rate[i, R_TC] == pytest.approx(tc0 * tc_f[i], rel=1e-12), i
        assert p.rate[i, R_CUDA] == pytest.approx(cuda0 * clk_f[i], rel=1e-12), i
        assert p.rate[i, R_SMEM] == pytest.approx(smem0 * clk_f[i], rel=1e-12), i
    # a GPU whose tc_efficiency is 1 has no headroom: the full-grid rates
    full = dataclasses.replace(hw, calibration={**hw.calibration, "tc_efficiency": 1.0})
    q = fam.lower(cols, full)
    assert q.rate[1, R_CUDA] == pytest.approx(cuda0, rel=1e-12)
    assert q.rate[1, R_TC] == pytest.approx(tc0 / eff, rel=1e-12)
    # the clock lowered alone: shared memory (bytes per clock) may rise to the
    # maximum clock, now 1410 / 1248.3 above it; the CUDA cores' rate is stated
    # on its own at 1387 MHz, so their ceiling stays 1410 / 1387
    slow = dataclasses.replace(hw, clock_mhz=hw.clock_mhz * 0.9,
                               measured={**hw.measured, "clock_mhz": 1387.0 * 0.9})
    r = fam.lower(cols, slow)
    assert r.rate[1, R_CUDA] == pytest.approx(cuda0 * cap, rel=1e-12)
    assert r.rate[1, R_SMEM] == pytest.approx(
        hw.smem_bytes_per_clk * 1387.0 * 0.9 * min(1.0 / eff, 1410.0 / (1387.0 * 0.9)), rel=1e-12)


TRITON_TABLE = Path(__file__).parent / "data" / "triton31_attention_sm80.csv"


def _table_candidates(table: pl.DataFrame) -> pl.DataFrame:
    """The compiler table's tile configurations as attention candidates (one
    shape: the footprints do not depend on it)."""
    return table.select("head_dim", "dtype", "block_m", "block_n", "num_warps",
                        "num_stages").with_columns(
        batch=pl.lit(8), heads=pl.lit(8), seq_len=pl.lit(1024), score_mod_nodes=pl.lit(6),
        seq_len_kv=pl.lit(128))


def test_attention_p_buffer_by_hand():
    # P goes through shared memory for TF32, for block_m < head_dim (warps along N),
    # and on the warpgroup-MMA path; not for 16-bit P with warps along M on mma.sync
    fam = FAMILIES["attention"]
    rows = pl.concat([_attn_row(block_m=64, block_n=64, head_dim=64),
                      _attn_row(block_m=32, block_n=64, head_dim=64),
                      _attn_row(block_m=64, block_n=64, head_dim=64, dtype="float32")])
    cols, _ = validate(rows, fam)
    a100 = fam.lower(cols, get_hw("a100")).smem_block.tolist()
    ring = lambda bn, d, eb: 2 * 2 * bn * d * eb  # noqa: E731
    assert a100 == [ring(64, 64, 2) + 64 * 64 * 2,
                    ring(64, 64, 2) + 32 * 64 * 2 + 32 * 64 * 2,
                    ring(64, 64, 4) + 64 * 64 * 4 + 64 * 64 * 4]
    h100 = fam.lower(cols, get_hw("h100")).smem_block.tolist()
    assert h100[0] == ring(64, 64, 2) + 64 * 64 * 2 + 64 * 64 * 2   # warpgroup MMA keeps P staged


def test_attention_smem_matches_triton_allocation():
    # bench/triton_footprints.py: what Triton 3.1 allocates for sm_80 for a
    # FlexAttention-shaped kernel (compiler output, not timings). The model's
    # footprint is within 1 KiB wherever the kernel can launch, and the launch
    # outcome (163 KiB per block on A100) is the compiler's on every row
    table = pl.read_csv(TRITON_TABLE)
    assert table.height >= 100
    fam = FAMILIES["attention"]
    hw = get_hw("a100")
    cand = _table_candidates(table)
    cols, _ = validate(cand, fam)
    smem = fam.lower(cols, hw).smem_block
    shared = table["shared"].to_numpy()
    fits = shared <= hw.smem_per_block_bytes
    assert np.all(np.abs(smem - shared)[fits] <= 1024)
    res = evaluate(cand, hw, "attention")
    assert res["feasible"].to_list() == fits.tolist()


def test_attention_gqa_and_causal():
    fam = FAMILIES["attention"]
    hw = get_hw("h100")
    cols, _ = validate(pl.concat([_attn_row(kv_heads=2), _attn_row(causal=True),
                                  _attn_row(kv_heads=3)]), fam)
    p = fam.lower(cols, hw)
    assert (p.g1[0], p.g2[0]) == (4, 2 * 2)        # 4 query heads share each KV head
    assert p.ksteps[1] < p.ksteps[0]               # causal tiles skip masked blocks
    res = evaluate(pl.concat([_attn_row(kv_heads=2), _attn_row(kv_heads=3)]), hw, "attention")
    assert res["feasible"].to_list() == [True, False]
    assert "multiple of kv_heads" in res["infeasible_reason"][1]


def test_attention_rules_and_infeasible_rows():
    df = pl.concat([_attn_row(block_m=48), _attn_row(num_warps=3), _attn_row(head_dim=256,
                    block_m=128, block_n=128)])
    res = evaluate(df, "a100", "attention")
    assert not res["feasible"].any()
    assert res["latency_us"].null_count() == 3
    assert "power-of-two" in res["infeasible_reason"][0]
    assert "shared memory" in res["infeasible_reason"][2]


def test_attention_never_faster_with_more_work():
    base = evaluate(_attn_row(), "a100", "attention")["latency_us"][0]
    for kw in (dict(seq_len=2048), dict(batch=4), dict(head_dim=128), dict(score_mod_nodes=12)):
        assert evaluate(_attn_row(**kw), "a100", "attention")["latency_us"][0] >= base


@pytest.mark.parametrize("name, row", [
    ("attention_fa3", dict(batch=1, heads=16, seq_len=4096, head_dim=128, dtype="bfloat16")),
    ("flash_decoding", dict(batch=8, heads=32, kv_heads=8, seq_len_kv=4096, head_dim=128,
                            dtype="bfloat16", num_splits=4)),
    ("mla_decode", dict(batch=16, heads=128, seq_len_kv=2048, dtype="bfloat16")),
])
def test_hopper_families_evaluate_and_explain(name, row):
    df = pl.DataFrame({k: [v] for k, v in row.items()})
    res = evaluate(df, "h100", name)
    assert res["feasible"][0] and math.isfinite(res["latency_us"][0])
    assert res["steady_order"][0]
    a100 = evaluate(df, "a100", name)
    if name != "flash_decoding":
        assert not a100["feasible"][0] and "Hopper" in a100["infeasible_reason"][0]
    from tsbatch.front.explain import explain_text

    text = explain_text(res.row(0, named=True), get_hw("h100"), get_family(name))
    assert "legal issue order" in text and "critical" in text


def test_fa3_softmax_hidden_under_gemms():
    # ping-pong + intra-warpgroup pipelining: the chain over two streams stays
    # under the tensor-core time at head_dim 128 (TileSight Table 4's FA-3 case)
    df = pl.DataFrame({"batch": [1], "heads": [64], "seq_len": [8192], "head_dim": [128],
                       "dtype": ["bfloat16"]})
    res = evaluate(df, "h100", "attention_fa3")
    assert res["bottleneck"][0] == "tensor_core"


def test_split_decoding_adds_a_launch():
    one = pl.DataFrame({"batch": [1], "heads": [32], "seq_len_kv": [32768], "head_dim": [128],
                        "dtype": ["bfloat16"], "num_splits": [1]})
    res = evaluate(pl.concat([one, one.with_columns(num_splits=pl.lit(16, dtype=pl.Int64))]), "h100",
                   "flash_decoding")
    lat = res["latency_us"].to_list()
    assert res["t_launch_us"][1] == 2 * res["t_launch_us"][0]
    assert lat[1] < lat[0]  # one sequence: 1 CTA per KV head without splits, 16x more with


def test_catalog_families_registered():
    for name in program_families():
        assert name in FAMILIES and FAMILIES[name].program is not None


def test_prune_attention_equals_rank_of_evaluate():
    from tsbatch.engine.prune import prune
    from tsbatch.engine.rank import rank

    wl = dict(batch=4, heads=32, kv_heads=8, seq_len=4096, head_dim=128, dtype="bfloat16",
              causal=True)
    cfgs = [dict(block_m=bm, block_n=bn, num_stages=s, num_warps=w) for bm in (32, 64, 128)
            for bn in (16, 64, 128) for s in (2, 3) for w in (4, 8)]
    got = prune(wl, cfgs, hw="a100", top=0.1, family="attention")
    frame = pl.DataFrame(cfgs).with_columns([pl.lit(v).alias(k) for k, v in wl.items()])
    full = evaluate(frame, "a100", "attention").with_row_index("i")
    want = rank(full, list(wl), top=0.1).sort("rank")
    assert list(got.indices) == want["i"].to_list()
    assert got.latency_us == tuple(want["latency_us"].to_list())


@given(st.lists(st.tuples(st.sampled_from([16, 32, 64, 128, 256]), st.sampled_from([16, 32, 64, 128, 256]),
                          st.sampled_from([16, 32, 64, 128]), st.integers(1, 5), st.sampled_from([2, 4, 8]),
                          st.integers(1, 625).map(lambda v: 8 * v),
                          st.integers(1, 625).map(lambda v: 8 * v),
                          st.integers(1, 1125).map(lambda v: 8 * v),
                          st.sampled_from(["float16", "bfloat16", "float32"]), st.booleans(),
                          st.sampled_from(["grouped", "row", "col", "persistent"]),
                          st.sampled_from([1, 2, 4])), min_size=1, max_size=12))
@settings(max_examples=40, deadline=None)
def test_gemm_lowering_agrees_with_its_tile_program(rows):
    """GEMM's own lowering and the generic lowering of programs/gemm.toml give the
    same grid, loop, launch order, footprint, tensor accesses and tensor-core work
    (where the specialized rules add nothing: loads in whole 32-byte sectors, sizes
    that are multiples of 8 so every operand load is 16-byte vectorized and pipelined)."""
    from kernels_catalog import gemm
    from kernels_catalog.lowering import lower_program

    keys = ("block_m", "block_n", "block_k", "num_stages", "num_warps", "m", "n", "k", "dtype",
            "tf32", "raster", "split_k")
    df = pl.DataFrame([dict(zip(keys, r)) for r in rows])
    hw = get_hw("a100")
    cols, _ = validate(df, gemm.FAMILY)
    own = gemm.lower(cols, hw)
    gen = lower_program(gemm.PROGRAM, cols, hw)
    # a specialized rule the program does not have: Triton's one-stage mma.sync loop
    # of 16-bit operands issues the next K step's loads ahead of the step's HMMAs
    # (gemm._lower_rows, bench/triton_loop_sass.py --overlap), so the envelope
    # pipelines it as two stages; A100 runs every 16-bit row on mma.sync
    one16 = ((df["num_stages"] == 1) & df["dtype"].is_in(["float16", "bfloat16"])).to_numpy()
    assert (own.stages[one16] == 2).all() and (gen.stages[one16] == 1).all()
    own_stages = np.where(one16, 1, own.stages)
    assert np.array_equal(own_stages, gen.stages), "stages"
    for f in ("g0", "g1", "g2", "ksteps", "order", "group", "smem_block", "t_mask",
              "t_per_step", "persistent"):
        assert np.array_equal(getattr(own, f), getattr(gen, f)), f
    np.testing.assert_allclose(own.t_bytes, gen.t_bytes, rtol=1e-12)
    np.testing.assert_allclose(own.work_iter[:, 0], gen.work_iter[:, 0], rtol=1e-12)  # TC
    np.testing.assert_allclose(own.useful_flops, gen.useful_flops, rtol=1e-12)
    assert gemm.FAMILY.program is gemm.PROGRAM and gemm.PROGRAM.orders().shape[0] == 2


def test_launch_overhead_split_per_family():
    """GEMM rows take the GPU's launch_overhead_us, rows of the tile-program
    families its program_launch_overhead_us (each set by its own family's
    measured floor; A100: 6.6 and 5.1 us), and a GPU that sets no program
    value gives both the same."""
    from tsbatch.hw import get_hw

    gemm_row = pl.DataFrame({"m": [4096], "n": [4096], "k": [4096], "dtype": ["float16"],
                             "block_m": [128], "block_n": [128], "block_k": [32],
                             "num_stages": [3], "num_warps": [4]})
    for gpu in ("a100", "h100"):
        hw = get_hw(gpu)
        g = evaluate(gemm_row, gpu)["t_launch_us"][0]
        a = evaluate(_attn_row(), gpu, "attention")["t_launch_us"][0]
        assert g == pytest.approx(hw.launch_us)
        assert a == pytest.approx(hw.program_launch_us)
    a100 = get_hw("a100")
    assert a100.launch_us == pytest.approx(6.6) and a100.program_launch_us == pytest.approx(5.1)
    h100 = get_hw("h100")
    assert "program_launch_overhead_us" not in h100.calibration
    assert h100.program_launch_us == h100.launch_us
