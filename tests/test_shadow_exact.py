"""The tile programs' admission without its float64 shadow pass where that is exact
(``kernels_catalog.lowering.shadow_exact``): an interval pass over the expressions
proves that the shadow evaluation would equal the int64 one on every row of the
batch; ``admit_program`` then skips it. Its codes must be the shadow pass's, bit for
bit, on rows from ordinary sizes to sizes that wrap int64."""

from __future__ import annotations

import ast

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels_catalog import lowering
from kernels_catalog.lowering import _NoProof, _kind, _program_exprs, admit_program, program_env
from kernels_catalog.lowering import shadow_exact
from tsbatch.boundary.schema import validate
from tsbatch.engine.evaluate import FAMILIES
from tsbatch.engine.sweep import candidate_chunks, load_sweep
from tsbatch.hw import get_hw

BASE = {
    "moe_grouped_gemm": dict(tokens=4096, experts=8, top_k=2, hidden=4096, ffn=14336,
                             proj="gate_up", dtype="bfloat16", routing="balanced", skew=1.0,
                             hot_fraction=0.5, block_m=128, block_n=128, block_k=64,
                             num_stages=4, num_warps=8, raster="persistent"),
    "gemm_epilogue": dict(m=4096, n=4096, k=1024, dtype="bfloat16", epilogue="none",
                          block_m=128, block_n=128, block_k=64, num_stages=3, num_warps=8),
    "rowwise": dict(op="rmsnorm", rows=4096, hidden=4096, dtype="bfloat16"),
}
SIZES = {"moe_grouped_gemm": ("tokens", "hidden", "ffn", "experts", "block_m", "block_n",
                              "block_k", "num_stages"),
         "gemm_epilogue": ("m", "n", "k", "block_m", "block_n", "block_k", "num_stages"),
         "rowwise": ("rows", "hidden", "threads", "rows_per_block")}
CHOICES = {"moe_grouped_gemm": {"proj": ["gate_up", "up", "down"],
                                "routing": ["balanced", "zipf", "hot"],
                                "raster": ["persistent", "col"]},
           "gemm_epilogue": {"epilogue": ["none", "bias", "silu", "gelu", "residual", "swiglu"]},
           "rowwise": {"op": ["rmsnorm", "layernorm", "softmax", "silu_mul"]}}

_size = st.one_of(st.sampled_from([1, 16, 64, 128, 4096, 14336]), st.integers(1, 1 << 20),
                  st.integers(1, 1 << 62))


def _cols(name, rows):
    fam = FAMILIES[name]
    cols, _ = validate(pl.DataFrame(rows), fam)
    return fam.program, cols


def _both(name, rows, gpu):
    prog, cols = _cols(name, rows)
    hw = get_hw(gpu)
    with np.errstate(all="ignore"):
        env = program_env(prog, cols, hw)
    return (admit_program(prog, cols, hw, env), admit_program(prog, cols, hw, env, exact=False),
            shadow_exact(prog, cols, env))


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(BASE)), st.data())
def test_admission_equals_the_shadow_pass(name, data):
    """Batches of random rows (sizes up to 2^62, where int64 wraps): the codes with
    the proof are the shadow pass's, whether the proof holds or not."""
    rows = []
    for _ in range(data.draw(st.integers(1, 6))):
        row = dict(BASE[name])
        for c in SIZES[name]:
            if data.draw(st.booleans()):
                row[c] = data.draw(_size)
        for c, ch in CHOICES[name].items():
            row[c] = data.draw(st.sampled_from(ch))
        rows.append(row)
    gpu = data.draw(st.sampled_from(["h100", "a100"]))
    got, want, _ = _both(name, rows, gpu)
    assert got.tolist() == want.tolist()


@pytest.mark.parametrize("name", sorted(BASE))
def test_proof_holds_on_ordinary_sizes_and_fails_past_2_53(name):
    rows = [dict(BASE[name], **{c: v}) for c in SIZES[name] for v in (1, 16, 4096)]
    got, want, exact = _both(name, rows, "h100")
    assert exact and got.tolist() == want.tolist() and not got.any()
    big = rows + [dict(BASE[name], **{SIZES[name][0]: (1 << 62) + 1})]
    got, want, exact = _both(name, big, "h100")
    assert not exact  # a size past 2^53: the shadow pass runs
    assert got.tolist() == want.tolist() and got[-1] > 0


def _column_kinds(prog, values):
    """The interval pass's kinds of ``prog``'s columns (an integer column's interval
    from ``values``) and of the dtype and GPU numbers, as :func:`shadow_exact` sets them."""
    kinds = {c.name: ((lowering._INT, int(np.min(values[c.name])), int(np.max(values[c.name])))
                      if c.kind == "int" else ({"float": (lowering._FLOAT,),
                                                "bool": (lowering._BOOL,)}.get(
                                                    c.kind, (lowering._STR,))))
             for c in prog.columns}
    for nm in lowering.DTYPE_NAMES + lowering.HW_NAMES:
        kinds[nm] = (lowering._FLOAT,)
    return kinds


@pytest.mark.parametrize("name", ["moe_grouped_gemm", "gemm_epilogue", "rowwise", "attention",
                                  "attention_fa3", "flash_decoding", "mla_decode"])
def test_intervals_hold_the_values(name):
    """Soundness: on random rows of ordinary sizes, every integer-valued let and
    expression lies in the interval the proof gives it, and every value the proof
    calls an integer is one (numpy's dtype on the int64 columns)."""
    rng = np.random.default_rng(7)
    fam = FAMILIES[name]
    prog = fam.program
    base = BASE.get(name)
    if base is None:  # rows of the family's built-in sweep
        swp = {"attention": "attention_llm", "attention_fa3": "attention_fa3",
               "flash_decoding": "decode_llm", "mla_decode": "mla_deepseek"}[name]
        frame = next(iter(candidate_chunks(load_sweep(swp))))
        keep = [c.name for c in prog.columns if c.name in frame.columns]
        cols, _ = validate(frame.select(keep).gather_every(max(frame.height // 400, 1)), fam)
    else:
        rows = []
        for _ in range(300):
            row = dict(base)
            for c in SIZES[name]:
                row[c] = int(rng.choice([1, 2, 3, 16, 17, 64, 128, 255, 4096, 14336, 100000]))
            for c, ch in CHOICES[name].items():
                row[c] = str(rng.choice(ch))
            rows.append(row)
        cols, _ = validate(pl.DataFrame(rows), fam)
    hw = get_hw("h100")
    with np.errstate(all="ignore"):
        env = program_env(prog, cols, hw)
        assert shadow_exact(prog, cols, env)
        kinds = _column_kinds(prog, env)
        checked = 0
        exprs = [(nm, e) for nm, e in prog.lets] + [(None, e) for e in _program_exprs(prog)]
        for nm, e in exprs:
            k = _kind(e.tree, kinds)
            if nm is not None:
                kinds[nm] = k
            v = np.asarray(e(env))
            if k[0] == lowering._INT:
                assert v.dtype.kind == "i", (e.text, v.dtype)
                assert k[1] <= v.min() and v.max() <= k[2], (e.text, k, v.min(), v.max())
                checked += 1
            elif k[0] == lowering._BOOL:
                assert v.dtype == np.bool_, (e.text, v.dtype)
            elif k[0] == lowering._FLOAT:
                assert v.dtype.kind == "f", (e.text, v.dtype)
    assert checked > 0


def _k(text, **kinds):
    return _kind(ast.parse(text, mode="eval").body, kinds)


def test_kind_by_hand():
    a = ("int", 1, 1 << 20)
    z = ("int", 0, 4)
    f = ("float",)
    assert _k("a * a", a=a) == ("int", 1, 1 << 40)
    assert _k("cdiv(a, z)", a=a, z=z) == ("int", 1, 1 << 20)   # a zero divisor is taken as 1
    assert _k("a // 4 - 1", a=a) == ("int", -1, (1 << 18) - 1)
    assert _k("a % 64", a=a) == ("int", 0, 63)
    assert _k("where(a > 2, a, 0)", a=a) == ("int", 0, 1 << 20)
    assert _k("min(a, 2.5)", a=a) == ("float",)
    assert _k("a / a", a=a) == ("float",)
    assert _k("ceil(a)", a=a) == a and _k("ceil(f)", f=f) == f
    assert _k("abs(-a)", a=a) == a
    assert _k("(a > 1) and (f < 2.0)", a=a, f=f) == ("bool",)
    for bad in ("a // z", "a % z", "a * a * a", "2 ** a", "unknown + 1"):
        with pytest.raises(_NoProof):
            _k(bad, a=a, z=z)
    assert _k("2.0 ** a", a=a) == ("float",)


def test_where_narrows_the_compared_name():
    """A ``where`` (or ``a if c else b``) whose test compares a name with an integer
    constant takes each branch's interval on the rows that take it: the defaults of
    attention's optional columns (``kv_heads`` 0 on every row: the MHA rows of
    ulysses' chunks) leave ``where(kv_heads > 0, kv_heads, heads)`` a divisor."""
    h = ("int", 1, 16)
    z = ("int", 0, 0)
    k = ("int", 0, 8)
    assert _k("where(z > 0, z, h)", z=z, h=h) == h          # the first branch taken by no row
    assert _k("h // where(z > 0, z, h)", z=z, h=h) == ("int", 0, 16)
    assert _k("where(k > 0, k, h)", k=k, h=h) == ("int", 1, 16)
    assert _k("where(0 < k, k, h)", k=k, h=h) == ("int", 1, 16)   # the comparison flipped
    assert _k("k if k >= 2 else 2", k=k) == ("int", 2, 8)
    assert _k("where(k < 3, 3, k * 2)", k=k) == ("int", 3, 16)
    assert _k("where(k <= 2, 7, k)", k=k) == ("int", 3, 8)
    assert _k("where(k == 0, 1, k)", k=k) == ("int", 1, 8)
    assert _k("where(k != 0, k, 1)", k=k) == ("int", 1, 8)
    assert _k("where(k != 4, k, 1)", k=k) == ("int", 0, 8)  # 4 is inside: nothing cut
    # a branch no row takes still sets the type: numpy's where promotes to float
    assert _k("where(z > 0, 1.5, h)", z=z, h=h) == ("float",)
    # both branches run on every row: one that cannot be proved there fails the whole
    for bad in ("where(k > 0, h // k, 1)", "where(z > 0, z * z * (1 << 40), h)"):
        with pytest.raises(_NoProof):
            _k(bad, k=k, z=z, h=h)
    # other tests leave the intervals as they are (their union)
    assert _k("where(k > h, k, h)", k=k, h=h) == ("int", 0, 16)
    assert _k("where(k > 1.5, k, h)", k=k, h=h) == ("int", 0, 16)
    assert _k("where((k > 0) and (h > 0), k, h)", k=k, h=h) == ("int", 0, 16)


def _attention_rows(n, rng, **fixed):
    """``n`` attention rows of random sizes, the optional columns at ``fixed``."""
    rows = []
    for _ in range(n):
        row = dict(batch=int(rng.choice([1, 2, 8])), heads=int(rng.choice([1, 2, 8, 16, 32])),
                   seq_len=int(rng.choice([128, 1000, 4096, 32768, 77208])), head_dim=128,
                   dtype="bfloat16", block_m=int(rng.choice([64, 128])),
                   block_n=int(rng.choice([32, 64])), num_stages=2, num_warps=4,
                   causal=bool(rng.integers(2)))
        row.update(fixed)
        rows.append(row)
    return rows


@pytest.mark.parametrize("fixed", [{}, {"kv_heads": 0, "seq_len_kv": 0},
                                   {"kv_heads": 1}, {"seq_len_kv": 512}])
def test_attention_defaults_are_proved(fixed):
    """Attention rows with the optional columns at their defaults (ulysses' chunks:
    no ``kv_heads``, no ``seq_len_kv``) or set: the proof holds, and the codes and the
    int64 lets' values are the shadow pass's; every integer let lies in its interval."""
    rng = np.random.default_rng(3)
    rows = _attention_rows(200, rng, **fixed)
    got, want, exact = _both("attention", rows, "b200")
    assert exact and got.tolist() == want.tolist()
    prog, cols = _cols("attention", rows)
    hw = get_hw("b200")
    kinds = _column_kinds(prog, cols)
    with np.errstate(all="ignore"):
        env = program_env(prog, cols, hw)
        shadow = program_env(prog, cols, hw, shadow=True)
    for nm, e in prog.lets:
        k = _kind(e.tree, kinds)
        kinds[nm] = k
        if k[0] == lowering._INT:
            v = np.asarray(env[nm])
            assert k[1] <= v.min() and v.max() <= k[2], (nm, k, v.min(), v.max())
            assert np.array_equal(np.broadcast_to(v, (len(rows),)).astype(np.float64),
                                  np.broadcast_to(np.asarray(shadow[nm], dtype=np.float64),
                                                  (len(rows),))), nm


# ----------------------------------------------------------------------------- shared lets
PROGRAM_SWEEPS = {"gemm_epilogue": "epilogue_llm", "moe_grouped_gemm": "moe_mixtral",
                  "rowwise": "norms_llm", "attention": "attention_llm",
                  "flash_decoding": "decode_llm", "mla_decode": "mla_deepseek",
                  "attention_fa3": "attention_fa3"}
#: the column each sweep's second copy raises
SWEEP_SIZE = {"gemm_epilogue": "m", "moe_grouped_gemm": "tokens", "rowwise": "rows",
              "attention": "seq_len", "flash_decoding": "seq_len_kv", "mla_decode": "seq_len_kv",
              "attention_fa3": "seq_len"}


def _plan_arrays(plan):
    out = {}
    for k, v in vars(plan).items():
        if isinstance(v, np.ndarray):
            out[k] = v
    for k, v in plan.extra.items():
        if isinstance(v, np.ndarray):
            out["extra." + k] = v
    return out


def _assert_bit_equal(plain: dict, shared: dict) -> None:
    """Two plans' arrays (:func:`_plan_arrays`) equal: the same keys, dtypes and
    shapes, floats by their bits."""
    assert plain.keys() == shared.keys()
    for k, v in plain.items():
        w = shared[k]
        assert v.dtype == w.dtype and v.shape == w.shape, k
        if v.dtype.kind == "f":
            assert np.array_equal(v.view(np.int64), w.view(np.int64)), k
        else:
            assert np.array_equal(v, w), k


@pytest.mark.parametrize("name", sorted(PROGRAM_SWEEPS))
def test_shared_expressions_equal_to_the_bit(name, monkeypatch):
    """The plan of a sweep (its workloads x tiles, sizes shifted in a second copy) with
    the expressions evaluated on the distinct rows of their columns equals, array by
    array and bit by bit, the plan with every expression on every row; and for the
    epilogue and MoE sweeps some expressions are shared."""
    fam = FAMILIES[name]
    prog = fam.program
    frame = next(iter(candidate_chunks(load_sweep(PROGRAM_SWEEPS[name]))))
    keep = [c.name for c in prog.columns if c.name in frame.columns]
    size = SWEEP_SIZE[name]
    frame = frame.select(keep)
    frame = pl.concat([frame, frame.with_columns(pl.col(size) + 3)])
    cols, _ = validate(frame, fam)
    made = []
    orig = lowering._Sharing.__init__

    def spy(self, *a, **k):
        orig(self, *a, **k)
        made.append(self.rep is not None)
    monkeypatch.setattr(lowering._Sharing, "__init__", spy)
    for gpu in ("h100", "a100"):
        hw = get_hw(gpu)
        monkeypatch.setattr(lowering, "SHARE_MIN_ROWS", 1 << 62)
        plain = _plan_arrays(lowering.lower_program(prog, cols, hw))
        monkeypatch.setattr(lowering, "SHARE_MIN_ROWS", 16)
        shared = _plan_arrays(lowering.lower_program(prog, cols, hw))
        _assert_bit_equal(plain, shared)
    if name in ("gemm_epilogue", "moe_grouped_gemm"):
        assert any(made)


@pytest.mark.parametrize("name", ["attention", "mla_decode", "flash_decoding"])
def test_chain_made_once_per_distinct_inputs(name, monkeypatch):
    """On a grouped batch the chain is made on fewer rows than the batch (one per
    distinct set of its inputs: ``_chain_rows``), and every row's chain and order are
    those of the rows it was spread from: equal to the chain made on every row (the
    plan with no grouping, bit for bit; ``test_shared_expressions_equal_to_the_bit``
    checks every other array). attention's mask use varies within the sharing's groups
    (its ``diag_frac`` reads the sequence length), mla_decode's uses are shared or
    constant."""
    fam = FAMILIES[name]
    prog = fam.program
    frame = next(iter(candidate_chunks(load_sweep(PROGRAM_SWEEPS[name]))))
    frame = frame.select([c.name for c in prog.columns if c.name in frame.columns])
    frame = pl.concat([frame, frame.with_columns(pl.col(SWEEP_SIZE[name]) + 3)])
    cols, _ = validate(frame, fam)
    seen = []
    orig = lowering._chain_rows

    def spy(*a, **k):
        rows, spread = orig(*a, **k)
        seen.append((rows, spread))
        return rows, spread
    monkeypatch.setattr(lowering, "_chain_rows", spy)
    hw = get_hw("h100")
    monkeypatch.setattr(lowering, "SHARE_MIN_ROWS", 16)
    shared = lowering.lower_program(prog, cols, hw)
    rows, spread = seen[-1]
    assert rows is not None and rows.shape[0] < frame.height / 4
    assert spread.shape == (frame.height,) and spread.max() < rows.shape[0]
    monkeypatch.setattr(lowering, "SHARE_MIN_ROWS", 1 << 62)
    plain = lowering.lower_program(prog, cols, hw)
    assert seen[-1] == (None, None)
    assert np.array_equal(plain.chain_us.view(np.int64), shared.chain_us.view(np.int64))
    assert np.array_equal(plain.order_idx, shared.order_idx)
    # a row's inputs are those of the row it was spread from
    for a in prog.body:
        if a.is_async:
            continue
        for _, e in a.uses:
            v = np.broadcast_to(np.asarray(e(program_env(prog, cols, hw)), dtype=np.float64),
                                (frame.height,))
            assert np.array_equal(v, v[rows][spread]), e.text


@pytest.mark.parametrize("name", sorted(PROGRAM_SWEEPS))
def test_lazy_shared_lets_equal_to_the_bit(name, monkeypatch):
    """Every ``[let]`` of ``program_env`` read from the environment whose shared lets
    are spread to the batch on first read (``_Env``) equals, bit for bit, the let
    evaluated on every row; for the epilogue and MoE sweeps some lets are held back
    (spread only when read)."""
    fam = FAMILIES[name]
    prog = fam.program
    frame = next(iter(candidate_chunks(load_sweep(PROGRAM_SWEEPS[name]))))
    frame = frame.select([c.name for c in prog.columns if c.name in frame.columns])
    cols, _ = validate(frame, fam)
    hw = get_hw("h100")
    with np.errstate(all="ignore"):
        monkeypatch.setattr(lowering, "SHARE_MIN_ROWS", 1 << 62)
        plain = program_env(prog, cols, hw)
        monkeypatch.setattr(lowering, "SHARE_MIN_ROWS", 16)
        lazy = program_env(prog, cols, hw)
    held = set(lazy.lazy)
    assert held <= {nm for nm, _ in prog.lets}
    for nm, _ in prog.lets:
        v, w = np.asarray(plain[nm]), np.asarray(lazy[nm])
        assert v.dtype == w.dtype and v.shape == w.shape, nm
        if v.dtype.kind == "f":
            assert np.array_equal(v.view(np.int64), w.view(np.int64)), nm
        else:
            assert np.array_equal(v, w), nm
    assert not lazy.lazy  # every held let was spread when read
    if name in ("gemm_epilogue", "moe_grouped_gemm"):
        assert held
    with pytest.raises(KeyError):
        lazy["no such name"]


@pytest.mark.parametrize("copies", [False, True])
def test_text_columns_grouped_by_identity(copies, monkeypatch):
    """A text column is grouped on by the identity of its strings: on the epilogue
    sweep the ``epilogue``-dependent lets are shared, and the plan equals the unshared
    one array by array and bit by bit, also where every row's string is an object of
    its own (equal strings that are distinct objects: more groups, never a wrong one)."""
    fam = FAMILIES["gemm_epilogue"]
    prog = fam.program
    frame = next(iter(candidate_chunks(load_sweep("epilogue_llm"))))
    frame = frame.select([c.name for c in prog.columns if c.name in frame.columns])
    frame = pl.concat([frame, frame.with_columns(pl.col("m") + 3)])
    cols, _ = validate(frame, fam)
    assert len(set(cols["epilogue"].tolist())) > 1
    if copies:
        cols = dict(cols)
        cols["epilogue"] = np.array(["".join(list(x)) for x in cols["epilogue"]] + [None],
                                    dtype=object)[:-1]
        assert len({id(x) for x in cols["epilogue"]}) == frame.height
    hw = get_hw("h100")
    with np.errstate(all="ignore"):
        monkeypatch.setattr(lowering, "SHARE_MIN_ROWS", 16)
        env = program_env(prog, cols, hw)
        shared = _plan_arrays(lowering.lower_program(prog, cols, hw))
        monkeypatch.setattr(lowering, "SHARE_MIN_ROWS", 1 << 62)
        plain = _plan_arrays(lowering.lower_program(prog, cols, hw))
    sh = env[lowering._SHARE_KEY]
    assert ("epilogue" in sh.low) == (not copies)
    if not copies:
        assert {"swiglu", "epi_ops", "epi_sfu"} <= set(env.lazy) | set(sh.small)
    _assert_bit_equal(plain, shared)


def _shared_ops(prog, cols, hw, monkeypatch):
    monkeypatch.setattr(lowering, "SHARE_MIN_ROWS", 16)
    with np.errstate(all="ignore"):
        sh = program_env(prog, cols, hw)[lowering._SHARE_KEY]
    plan = lowering._share_plan(prog)
    return sum(d[1] for d in plan.values()
               if d is not None and sh.rep is not None and d[0] <= sh.low)


@pytest.mark.parametrize("name", sorted(PROGRAM_SWEEPS))
def test_text_columns_never_share_fewer_operations(name, monkeypatch):
    """Text columns in the grouping never leave fewer operations shared than the
    grouping without them (every row's string its own object: no text column is of
    few values) on the program sweeps, sizes shifted in a second copy (there the
    greedy drops with MoE's routing and hot_fraction let them displace block_k,
    num_stages and the dtype)."""
    fam = FAMILIES[name]
    prog = fam.program
    frame = next(iter(candidate_chunks(load_sweep(PROGRAM_SWEEPS[name]))))
    size = SWEEP_SIZE[name]
    frame = frame.select([c.name for c in prog.columns if c.name in frame.columns])
    frame = pl.concat([frame, frame.with_columns(pl.col(size) + 3)])
    cols, _ = validate(frame, fam)
    alone = dict(cols)
    for c in prog.columns:
        if c.kind == "str":
            alone[c.name] = np.array(["".join(list(x)) for x in cols[c.name]] + [None],
                                     dtype=object)[:-1]
    hw = get_hw("h100")
    assert _shared_ops(prog, cols, hw, monkeypatch) >= _shared_ops(prog, alone, hw, monkeypatch)


@pytest.mark.parametrize("gpu", ["a100", "h100", "h200"])
def test_rates_are_the_gpus_scalars(gpu):
    """``lower_program`` divides the chain's work by ``_rates(hw, 1)[0]``: exact only
    while every row's rate (the tensor cores' set apart) is that one number."""
    hw = get_hw(gpu)
    rate = lowering._rates(hw, 7)
    row = lowering._rates(hw, 1)[0]
    assert np.array_equal(rate.view(np.int64), np.broadcast_to(row, rate.shape).view(np.int64))


_CMP_TEXT = [">", ">=", "<", "<=", "==", "!="]


@settings(max_examples=200, deadline=None)
@given(st.integers(-50, 50), st.integers(0, 60), st.integers(-50, 50), st.integers(0, 60),
       st.integers(-60, 60), st.sampled_from(_CMP_TEXT), st.booleans(), st.integers(0, 3))
def test_where_intervals_hold_the_values(xlo, xw, ylo, yw, c, op, flip, shape):
    """Soundness of the narrowed ``where``: on every (x, y) of the two intervals,
    numpy's value of the expression lies in the interval the pass gives it."""
    x_k, y_k = ("int", xlo, xlo + xw), ("int", ylo, ylo + yw)
    test = f"{c} {_FLIPPED_TEXT[op]} x" if flip else f"x {op} {c}"
    body, orelse = [("x", "y"), ("x * 3 - y", "y + 7"), ("x // 2", "-x"), ("y", "x % 5 + y")][shape]
    text = f"where({test}, {body}, {orelse})"
    k = _k(text, x=x_k, y=y_k)
    xs, ys = np.meshgrid(np.arange(xlo, xlo + xw + 1), np.arange(ylo, ylo + yw + 1))
    v = np.asarray(eval(text, {"where": np.where}, {"x": xs.ravel(), "y": ys.ravel()}))  # noqa: S307
    assert v.dtype.kind == "i" and k[0] == "int"
    assert k[1] <= v.min() and v.max() <= k[2], (text, k, v.min(), v.max())


_FLIPPED_TEXT = {">": "<", ">=": "<=", "<": ">", "<=": ">=", "==": "==", "!=": "!="}
