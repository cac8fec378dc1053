"""Lowering a :class:`~kernels_catalog.program.TileProgram` for a batch of rows.

Every quantity is a numpy expression over whole columns (no Python loop per
row); the only compiled step is the best-order search over the program's
legal orders (:func:`tsbatch.kernels.dag.best_orders`), generic over
programs. What the plan holds, per row:

- grid ``g0 x g1 x g2`` and launch order from ``[grid]``; ``ksteps`` loop
  iterations, ``stages``, ``warps`` (``threads = 32 warps``);
- tensors: block bytes, reuse masks and cadence for the cache model; a
  once-per-tile tensor's bytes go to L2 and DRAM once per tile;
- footprints: shared memory per block (the ``smem`` placements), registers
  per thread (the ``registers`` placements over the threads, plus
  ``base_registers``), capped by the GPU's limit with the excess recorded
  as spilled (and its local-memory traffic charged to shared memory/L1,
  ``spill_passes`` times per iteration); ``tmem`` must fit Blackwell's
  256 KiB of tensor memory per SM;
- work: body actions' uses per iteration, prologue and epilogue actions'
  once per tile, tensor-core work on CUDA cores when the dtype has no
  tensor-core path;
- rates as the GEMM family's (tensor cores at the dtype's rate, times
  ``mma_sync_fraction`` off the warpgroup path, times ``tc_efficiency``);
- the chain: each body action's work on each of its resources (a use) at
  the SM's full rates, list-scheduled per use (an action's uses on distinct
  pipes overlap, :mod:`tsbatch.kernels.dag`); asynchronous actions and
  tensor moves take none; the best order's chain and its index per row.
"""

from __future__ import annotations

import ast

import numpy as np

from kernels_catalog.base import (
    MAX_CACHE_BLOCKS, MAX_GRID_TILES, SIZE_LIMIT, Family, TilePlan, clamp_group, first_rule,
    map_codes, mma_path_extra,
)
from kernels_catalog.program import DTYPE_NAMES, HW_NAMES, TileProgram
from tsbatch.kernels.envelope import (
    N_RES, R_ALU, R_CUDA, R_DRAM, R_L15, R_L2, R_NAMES, R_SFU, R_SMEM, R_TC,
)
from tsbatch.kernels.occupancy import spill_l2_bytes
from tsbatch.kernels.order import ORDER_NAMES, ORDER_PERSISTENT

__all__ = ["lower_program", "family_from_program", "program_env", "admit_program", "ADMIT_RULES",
           "TMEM_BYTES_PER_SM"]

#: Blackwell tensor memory per SM: 128 lanes x 512 columns x 4 bytes (CUDA PTX ISA,
#: "Tensor Memory", tcgen05)
TMEM_BYTES_PER_SM = 128 * 512 * 4

_RES = {name: i for i, name in enumerate(R_NAMES)}


def _hw_names(hw) -> dict:
    return {
        "sm_count": float(hw.sm_count), "warp_size": 32.0, "clock_mhz": hw.rate("clock_mhz"),
        "smem_per_block_bytes": float(hw.smem_per_block_bytes),
        "sm_smem_bytes": float(hw.sm_smem_bytes),
        "max_registers_per_thread": float(hw.max_registers_per_thread),
        "sm_registers": float(hw.sm_registers), "l2_bytes": float(hw.l2_bytes),
        "is_hopper": float(hw.mma == "wgmma"), "is_blackwell": float(hw.mma == "tcgen05"),
    }


def program_env(prog: TileProgram, cols: dict, hw, shadow: bool = False) -> dict:
    """The columns, dtype numbers, GPU numbers and every ``[let]`` of ``prog``
    evaluated on the batch (arrays of the batch's length). ``shadow``: integer
    columns as float64, so that no integer expression can wrap (:func:`admit_program`).
    A large batch's lets of few-valued columns are evaluated on their distinct rows
    (:class:`_Sharing`, kept in the environment for the plan's expressions: the same
    values, bit for bit)."""
    n = len(np.asarray(cols["dtype"]))
    env = _Env()
    for c in prog.columns:
        v = np.asarray(cols[c.name])
        if c.kind == "int":
            v = v.astype(np.float64 if shadow else np.int64, copy=False)
        elif c.kind == "float":
            v = v.astype(np.float64, copy=False)
        elif c.kind == "bool":
            v = v.astype(np.bool_, copy=False)
        env[c.name] = v
    names = list(prog.dtypes)
    code = map_codes(np.asarray(cols["dtype"], dtype=object), {d: i for i, d in enumerate(names)})
    eb = np.array([float(prog.dtypes[d]["eb"]) for d in names])
    ob = np.array([float(prog.dtypes[d].get("ob", prog.dtypes[d]["eb"])) for d in names])
    tc = np.array([1.0 if prog.dtypes[d]["tc"] else 0.0 for d in names])
    env["eb"], env["ob"], env["tc"] = eb[code], ob[code], tc[code]
    env["_dtype_code"] = code
    env.update(_hw_names(hw))
    shared = None if shadow or n < SHARE_MIN_ROWS else _Sharing(prog, env, n)
    for name, e in prog.lets:
        v = None if shared is None else shared.small_value(e)
        if v is None:
            env[name] = np.broadcast_to(e(env), (n,))
            if shared is not None:
                shared.small.pop(name, None)
                env.lazy.pop(name, None)
        else:  # spread to the batch only where an unshared expression reads it
            env.pop(name, None)
            shared.small[name] = v
            env.lazy[name] = (v, shared.inv)
    if shared is not None:
        env[_SHARE_KEY] = shared
    return env


class _Env(dict):
    """:func:`program_env`'s environment: a ``[let]`` that :class:`_Sharing`
    evaluated on the distinct rows is spread to the batch (``values[inv]``) when an
    expression first reads it, not before (most are read only by other shared
    expressions, which take the distinct rows' values as they are)."""

    __slots__ = ("lazy",)

    def __init__(self):
        super().__init__()
        self.lazy: dict = {}

    def __missing__(self, key):
        got = self.lazy.pop(key, None)
        if got is None:
            raise KeyError(key)
        v = got[0][got[1]]
        self[key] = v
        return v


#: where ``env`` keeps its :class:`_Sharing` (not a name an expression can use)
_SHARE_KEY = "<sharing>"
#: batches of fewer rows evaluate every expression on all of them (:class:`_Sharing`)
SHARE_MIN_ROWS = 4096
#: an expression is evaluated on the distinct values of its columns where they are
#: at most this share of the rows
SHARE_MAX_FRACTION = 0.125
#: rows of the sample that screens the columns
SHARE_SAMPLE = 4096
#: a column of at most this many values in the sample may be grouped on
SHARE_LOW_VALUES = 64
#: fewest operations of the shared expressions for the batch to be grouped (a
#: grouping costs about as much as a few dozen operations on the whole batch)
SHARE_MIN_OPS = 48
#: expression parts whose float results might depend on the length of the arrays
#: (vectorized transcendental functions): an expression using one is not shared
_UNSHARED_CALLS = {"log2", "sqrt", "pow2ceil"}
_OPS = (ast.BinOp, ast.Compare, ast.Call, ast.BoolOp, ast.IfExp, ast.UnaryOp)


def _plan_exprs(prog: TileProgram):
    """The expressions :func:`lower_program` evaluates besides the lets."""
    yield from _program_exprs(prog)
    yield from (prog.wgmma, prog.tensor_cores)
    for r in prog.rules:
        yield r.when


def _share_plan(prog: TileProgram) -> dict:
    """Per expression (a ``[let]``'s or the plan's, keyed by the :class:`Expr`), the
    set of columns its value depends on and its number of operations, where
    :class:`_Sharing` may evaluate it on their distinct rows, else None.
    Dependencies go through the lets; the dtype's numbers count as the
    pseudo-column ``_dtype_code``; the GPU's numbers are scalars; a text column
    is grouped on by the identity of its strings (:meth:`_Sharing._key_column`).
    Not shared: an expression using ``**`` or :data:`_UNSHARED_CALLS` itself
    (its value is still an input the expressions after it can share on), and
    one of no column."""
    if prog._shared is not None:
        return prog._shared
    kinds = {c.name: c for c in prog.columns}
    deps: dict = {}

    def columns_of(e):
        d: set = set()
        for nm in e.names:
            if nm in kinds:
                d.add(nm)
            elif nm in DTYPE_NAMES:
                d.add("_dtype_code")
            elif nm in deps:
                if deps[nm] is None:
                    return None
                d |= deps[nm]
        return frozenset(d)

    entries = []
    for name, e in prog.lets:
        deps[name] = columns_of(e)
        entries.append((e, deps[name]))
    entries += [(e, columns_of(e)) for e in _plan_exprs(prog)]
    out: dict = {}
    for e, d in entries:
        nodes = list(ast.walk(e.tree))
        ok = bool(d) and not any(
            isinstance(x, ast.BinOp) and isinstance(x.op, ast.Pow)
            or isinstance(x, ast.Call) and getattr(x.func, "id", "") in _UNSHARED_CALLS
            for x in nodes)
        out[e] = (d, sum(isinstance(x, _OPS) for x in nodes)) if ok else None
    prog._shared = out
    return out


def _val(e, env: dict):
    """``e`` evaluated on ``env``: on the distinct rows of its columns where
    ``env`` shares it (:class:`_Sharing`), else on every row."""
    sh = env.get(_SHARE_KEY)
    v = None if sh is None else sh.value(e)
    return e(env) if v is None else v


class _Sharing:
    """Evaluates an expression on the distinct rows of the columns it depends on and
    spreads the values to the batch (a warp grid depends on three tile columns of a
    few values each, whatever the batch's sizes). The columns grouped on: those of
    at most :data:`SHARE_LOW_VALUES` values in an evenly spaced sample of the batch
    that a shareable expression (:func:`_share_plan`) of such columns only needs,
    less, one at a time, the column the fewest operations depend on while the
    sample has more than :data:`SHARE_MAX_FRACTION` distinct rows of them; the
    batch is grouped once on the rest, where the shared expressions hold at least
    :data:`SHARE_MIN_OPS` operations and the groups are at most that fraction of
    the rows. Text columns (keyed by their strings' identity) are such columns too,
    but the choice is made with and without them and the one sharing more
    operations kept. Each row gets the value the whole-column evaluation gives it:
    the same elementwise numpy operations on the same operands
    (:data:`_UNSHARED_CALLS` excepted)."""

    def __init__(self, prog: TileProgram, env: dict, n: int):
        from tsbatch.kernels.rowhash import dedup_rows  # noqa: PLC0415

        self.env = env
        self.n = n
        self.deps = _share_plan(prog)
        self.low: frozenset = frozenset()
        self.inv = self.rep = None
        #: the shared lets' values on the distinct rows (``rep``)
        self.small: dict = {}
        cand = [v for v in self.deps.values() if v is not None]
        used = set().union(*(d for d, _ in cand)) if cand else set()
        step = max(n // SHARE_SAMPLE, 1)
        keys = {c: self._key_column(c) for c in sorted(used)}
        low = {c for c, k in keys.items()
               if dedup_rows(k[::step].reshape(-1, 1))[1].shape[0] <= SHARE_LOW_VALUES}

        def choose(low: set, greedy: bool = True):
            # the columns grouped on: every low one an expression of low columns
            # needs, dropping first those the fewest operations depend on while the
            # sample has too many distinct rows of them (not greedy: none dropped);
            # (operations shared, columns)
            c = cand
            while True:
                c = [(d, o) for d, o in c if d <= low]
                ops = sum(o for _, o in c)
                cols = sorted(set().union(*(d for d, _ in c))) if c else []
                if ops < SHARE_MIN_OPS or not cols:
                    return 0, []
                sample = np.column_stack([keys[k][::step] for k in cols])
                if dedup_rows(sample)[1].shape[0] <= SHARE_MAX_FRACTION * sample.shape[0]:
                    return ops, cols
                if not greedy:
                    return 0, []
                weight = {k: sum(o for d, o in c if k in d) for k in cols}
                low.discard(min(cols, key=lambda k: (weight[k], k)))

        # text columns come second: the drops above are greedy, and a text column of
        # few values (MoE's routing) can displace numeric ones that more operations
        # depend on. The grouping without them is made first; then the same columns
        # with the text ones added (one sample's check) or, where that grouping is
        # none, the choice among all; the one sharing more operations is kept
        text = {c for c in low if env[c].dtype.kind == "O"}
        ops, cols = choose(low - text)
        if text:
            ops_t, cols_t = choose(set(cols) | text, greedy=False) if cols else choose(set(low))
            if ops_t > ops:
                ops, cols = ops_t, cols_t
        if not cols:
            return
        inv, rep = dedup_rows(np.column_stack([keys[c] for c in cols]))
        if rep.shape[0] <= SHARE_MAX_FRACTION * n:
            self.low, self.inv, self.rep = frozenset(cols), inv, rep

    def _key_column(self, name: str) -> np.ndarray:
        """The int64 key of a column: its values (a float's bits), or for a text
        column the addresses of its string objects (:func:`same_object`'s reading,
        ~0.5 ns a row, where mapping strings to codes costs a dictionary look-up a
        row): rows of one group then hold the very same object, so every
        expression gives them what it gives the group's first row. A validated
        column holds one object per distinct string (equal strings that are
        distinct objects only make more groups)."""
        v = self.env[name]
        if v.dtype.kind == "f":
            return np.ascontiguousarray(v, dtype=np.float64).view(np.int64)
        if v.dtype.kind == "O":
            return np.frombuffer(v.tobytes(), dtype=np.intp).astype(
                np.int64, copy=False)
        return v.astype(np.int64, copy=False)

    def value(self, e):
        """``e``'s values on the batch, or None where it is not shared."""
        v = self.small_value(e)
        return None if v is None else v[self.inv]

    def shares(self, e) -> bool:
        """Whether ``e`` is evaluated on the distinct rows (:meth:`small_value`)."""
        d = self.deps.get(e)
        return d is not None and self.rep is not None and d[0] <= self.low

    def small_value(self, e):
        """``e``'s values on the distinct rows ``rep``, or None where it is not
        shared. A shared let's distinct-row values are ``small``'s (the batch's
        values at ``rep``: ``inv[rep]`` is ``0, 1, ...``)."""
        d = self.deps.get(e)
        if d is None or self.rep is None or not d[0] <= self.low:
            return None
        rep = self.rep
        sub = {}
        for nm in e.names:
            v = self.small.get(nm)
            if v is None:
                v = self.env[nm]
                if isinstance(v, np.ndarray) and v.shape == (self.n,):
                    v = v[rep]
            sub[nm] = v
        return np.broadcast_to(e(sub), (rep.shape[0],))


#: rules checked before a program is lowered (:func:`admit_program`); a row breaking
#: one is lowered from placeholder values and its numbers are left null
ADMIT_RULES = (
    "sizes too large: the tile program's integer sizes overflow int64",
    "grid too large: more than 2^31 - 1 tiles (CUDA's gridDim.x limit)",
    "sizes too large for the cache model: more than 2^24 operand blocks",
    "sizes too large: the grid's tiles times their loop steps exceed 2^62",
)


def _differs(a, b) -> np.ndarray:
    """Where an expression's int64 value ``a`` is not its float64 value ``b`` (beyond
    float rounding): the int64 arithmetic wrapped."""
    a = np.asarray(a)
    b = np.asarray(b, dtype=np.float64)
    if a.dtype.kind not in "iu":
        a = a.astype(np.float64)
    af = a.astype(np.float64)
    same = (af == b) | (np.isnan(af) & np.isnan(b)) | (
        np.abs(af - b) <= 1e-6 * np.maximum(np.abs(af), np.abs(b)))
    return ~same


def _program_exprs(prog: TileProgram):
    """Every size expression of ``prog`` that feeds the plan."""
    yield from prog.grid
    yield from (prog.steps, prog.stages, prog.warps, prog.group, prog.base_registers,
                prog.spill_passes)
    for e in (prog.streams, prog.launches, prog.useful_flops):
        if e is not None:
            yield e
    for t in prog.tensors:
        yield t.bytes
        if t.foot is not None:
            yield t.foot
    for f in prog.footprints:
        yield f.bytes
    for a in prog.actions:
        for _, e in a.uses:
            yield e
    for _, e in prog.extra_outputs:
        yield e


#: an integer of at most this magnitude is held exactly by a float64
EXACT_INT = 1 << 53


class _NoProof(Exception):
    """The interval pass cannot bound an expression (:func:`shadow_exact`)."""


_INT, _BOOL, _FLOAT, _STR = "int", "bool", "float", "str"


def _as_int(k):
    """An integer interval ``(lo, hi)`` of a value of kind ``k`` (a bool is 0 or 1)."""
    if k[0] == _INT:
        return k[1], k[2]
    if k[0] == _BOOL:
        return 0, 1
    raise _NoProof


def _num(a, b, lo_hi):
    """The kind of a numpy arithmetic result of kinds ``a`` and ``b``: float when either
    is, else an integer interval from ``lo_hi(a_interval, b_interval)``."""
    if _STR in (a[0], b[0]):
        raise _NoProof
    if _FLOAT in (a[0], b[0]):
        return (_FLOAT,)
    if a[0] == _BOOL and b[0] == _BOOL:  # numpy's bool arithmetic is logical: not used
        raise _NoProof
    lo, hi = lo_hi(_as_int(a), _as_int(b))
    return _checked(lo, hi)


def _checked(lo: int, hi: int):
    if max(abs(lo), abs(hi)) > EXACT_INT:
        raise _NoProof
    return (_INT, lo, hi)


def _corners(f, a, b):
    v = [f(x, y) for x in a for y in b]
    return min(v), max(v)


def _union(a, b):
    """The kind of ``where(c, a, b)`` (and the interval holding both)."""
    if a[0] == b[0] == _BOOL:
        return (_BOOL,)
    if _STR in (a[0], b[0]):
        if a[0] == b[0]:
            return (_STR,)
        raise _NoProof
    if _FLOAT in (a[0], b[0]):
        return (_FLOAT,)
    (alo, ahi), (blo, bhi) = _as_int(a), _as_int(b)
    return _checked(min(alo, blo), max(ahi, bhi))


#: ``name OP constant`` as ``constant OP' name`` reads (the comparison flipped)
_FLIPPED = {ast.Gt: ast.Lt, ast.GtE: ast.LtE, ast.Lt: ast.Gt, ast.LtE: ast.GtE,
            ast.Eq: ast.Eq, ast.NotEq: ast.NotEq}
#: the comparison that holds where one does not
_NEGATED = {ast.Gt: ast.LtE, ast.GtE: ast.Lt, ast.Lt: ast.GtE, ast.LtE: ast.Gt,
            ast.Eq: ast.NotEq, ast.NotEq: ast.Eq}


def _narrowed(test, kinds: dict, truth: bool):
    """``kinds`` on the rows where ``test`` is ``truth``, when ``test`` compares an
    integer-valued name with an integer constant (``kv_heads > 0``, ``0 < window``):
    that name's interval cut to those rows, or None where no row of the interval can
    be one of them; ``kinds`` itself for any other test (nothing known)."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return kinds
    left, op, right = test.left, type(test.ops[0]), test.comparators[0]
    if isinstance(left, ast.Constant) and isinstance(right, ast.Name):
        left, right, op = right, left, _FLIPPED.get(op)
    if not (op in _NEGATED and isinstance(left, ast.Name) and isinstance(right, ast.Constant)
            and type(right.value) is int):
        return kinds
    k = kinds.get(left.id)
    if k is None or k[0] != _INT:
        return kinds
    lo, hi, c = k[1], k[2], right.value
    if not truth:
        op = _NEGATED[op]
    if op is ast.Gt:
        lo = max(lo, c + 1)
    elif op is ast.GtE:
        lo = max(lo, c)
    elif op is ast.Lt:
        hi = min(hi, c - 1)
    elif op is ast.LtE:
        hi = min(hi, c)
    elif op is ast.Eq:
        lo, hi = max(lo, c), min(hi, c)
    else:  # NotEq: only an end of the interval can be cut
        lo, hi = lo + (lo == c), hi - (hi == c)
    return None if lo > hi else {**kinds, left.id: (_INT, lo, hi)}


def _where_kind(test, body, orelse, kinds: dict):
    """The kind of ``where(test, body, orelse)`` (or ``body if test else orelse``).
    numpy evaluates both branches on every row, so each must be provable on all of
    them (and its type decides the result's); the result's interval is that of each
    branch on the rows that take it, as far as :func:`_narrowed` knows them:
    ``where(kv_heads > 0, kv_heads, heads)`` is at least 1 when ``heads`` is, even
    where ``kv_heads`` is 0 on every row."""
    _kind(test, kinds)
    kb, ko = _kind(body, kinds), _kind(orelse, kinds)
    kind = _union(kb, ko)
    if kind[0] != _INT:
        return kind
    spans = []
    for truth, node, whole in ((True, body, kb), (False, orelse, ko)):
        cut = _narrowed(test, kinds, truth)
        if cut is not None:  # some row takes this branch
            spans.append(_as_int(whole if cut is kinds else _kind(node, cut)))
    return (_INT, min(s[0] for s in spans), max(s[1] for s in spans))


def _nonzero_divisor(b):
    lo, hi = _as_int(b)
    if lo <= 0 <= hi:
        raise _NoProof
    return lo, hi


def _kind(node, kinds: dict):
    """The kind of an expression node (:data:`_INT` with its interval, :data:`_BOOL`,
    :data:`_FLOAT`, :data:`_STR`) as numpy evaluates it on the int64 columns, given
    the kinds of the names; raises :class:`_NoProof` where an integer value may pass
    :data:`EXACT_INT` or an integer division may divide by zero."""
    if isinstance(node, ast.Constant):
        v = node.value
        if isinstance(v, bool):
            return (_BOOL,)
        if isinstance(v, int):
            return _checked(v, v)
        return (_FLOAT,) if isinstance(v, float) else (_STR,)
    if isinstance(node, ast.Name):
        if node.id not in kinds:
            raise _NoProof
        return kinds[node.id]
    if isinstance(node, ast.BinOp):
        a, b = _kind(node.left, kinds), _kind(node.right, kinds)
        op = type(node.op)
        if op in (ast.BitAnd, ast.BitOr):
            return (_BOOL,)
        if op is ast.Div:
            if _STR in (a[0], b[0]):
                raise _NoProof
            return (_FLOAT,)
        if op is ast.Add:
            return _num(a, b, lambda x, y: (x[0] + y[0], x[1] + y[1]))
        if op is ast.Sub:
            return _num(a, b, lambda x, y: (x[0] - y[1], x[1] - y[0]))
        if op is ast.Mult:
            return _num(a, b, lambda x, y: _corners(lambda p, q: p * q, x, y))
        if op is ast.FloorDiv:
            return _num(a, b, lambda x, y: _corners(lambda p, q: p // q, x,
                                                    _nonzero_divisor((_INT, *y))))
        if op is ast.Mod:
            def mod(x, y):
                lo, hi = _nonzero_divisor((_INT, *y))
                m = max(abs(lo), abs(hi)) - 1
                return (0, m) if lo > 0 else (-m, 0)
            return _num(a, b, mod)
        if op is ast.Pow:
            def pw(x, y):
                if y[0] < 0:  # numpy refuses negative integer powers
                    raise _NoProof
                big = max(abs(x[0]), abs(x[1]))
                if big > 1 and y[1] > 63:
                    raise _NoProof
                top = big ** y[1] if big > 1 else 1
                return (0 if x[0] >= 0 else -top), top
            return _num(a, b, pw)
        raise _NoProof
    if isinstance(node, ast.UnaryOp):
        a = _kind(node.operand, kinds)
        if isinstance(node.op, ast.Not):
            return (_BOOL,)
        if a[0] == _INT:
            return (_INT, -a[2], -a[1])
        if a[0] == _FLOAT:
            return a
        raise _NoProof
    if isinstance(node, (ast.BoolOp, ast.Compare)):
        for v in (node.values if isinstance(node, ast.BoolOp) else
                  [node.left, *node.comparators]):
            _kind(v, kinds)
        return (_BOOL,)
    if isinstance(node, ast.IfExp):
        return _where_kind(node.test, node.body, node.orelse, kinds)
    if isinstance(node, ast.Call):
        fn = node.func.id
        if fn == "where" and len(node.args) == 3:
            return _where_kind(*node.args, kinds)
        args = [_kind(x, kinds) for x in node.args]
        if fn in ("min", "max") and len(args) == 2:
            a, b = args
            if a[0] == b[0] == _BOOL:
                return (_BOOL,)
            pick = min if fn == "min" else max
            return _num(a, b, lambda x, y: (pick(x[0], y[0]), pick(x[1], y[1])))
        if fn == "cdiv" and len(args) == 2:
            def cdiv(x, y):
                lo, hi = y
                if lo < 0 <= hi:
                    raise _NoProof
                d = (max(lo, 1), max(hi, 1))  # a zero divisor is taken as 1
                return _corners(lambda p, q: -((-p) // q), x, d)
            return _num(args[0], args[1], cdiv)
        if fn in ("ceil", "floor", "abs") and len(args) == 1:
            a = args[0]
            if a[0] == _FLOAT:
                return a
            if a[0] != _INT:
                raise _NoProof
            if fn != "abs":
                return a
            lo, hi = a[1], a[2]
            return (_INT, 0 if lo <= 0 <= hi else min(abs(lo), abs(hi)), max(abs(lo), abs(hi)))
        if fn in ("log2", "sqrt", "pow2ceil") and len(args) == 1:
            if args[0][0] == _STR:
                raise _NoProof
            return (_FLOAT,)
        if fn == "is_pow2" and len(args) == 1:
            return (_BOOL,)
    raise _NoProof


def shadow_exact(prog: TileProgram, cols: dict, env: dict) -> bool:
    """Whether the float64 shadow evaluation of :func:`admit_program` would agree with
    the int64 one (``env``) on every row, proved from the batch's column ranges by
    interval arithmetic over the expressions: every integer-valued node (numpy's
    types on the int64 columns) within +-2^53, where int64 cannot wrap and float64
    holds it exactly, and no integer division or remainder by a divisor that may be
    zero. A float-valued node then gets the same operands in both evaluations and so
    the same value. False where that cannot be shown (the shadow pass decides)."""
    kinds: dict = {}
    for c in prog.columns:
        if c.kind == "int":
            if np.asarray(cols[c.name]).dtype.kind != "i":  # the shadow reads the column itself
                return False
            v = env[c.name]
            if v.shape[0] == 0:
                return True
            kinds[c.name] = (_INT, int(v.min()), int(v.max()))
        elif c.kind == "float":
            kinds[c.name] = (_FLOAT,)
        elif c.kind == "bool":
            kinds[c.name] = (_BOOL,)
        else:
            kinds[c.name] = (_STR,)
    # the answer depends on the integer columns' ranges only: kept per program (a
    # prune's rounds and a sweep's chunks meet the same ranges again)
    memo = prog._proofs
    key = tuple(kinds[c.name][1:] for c in prog.columns if c.kind == "int")
    got = memo.get(key)
    if got is not None:
        return got
    for name in DTYPE_NAMES + HW_NAMES:
        kinds[name] = (_FLOAT,)
    got = True
    try:
        for name, e in prog.lets:
            kinds[name] = _kind(e.tree, kinds)
        for e in _program_exprs(prog):
            _kind(e.tree, kinds)
    except (_NoProof, AttributeError, TypeError):
        got = False
    if len(memo) >= PROOF_MEMO:
        memo.clear()
    memo[key] = got
    return got


#: most answers of :func:`shadow_exact` kept per program
PROOF_MEMO = 256


def admit_program(prog: TileProgram, cols: dict, hw, env: dict,
                  exact: bool | None = None) -> np.ndarray:
    """Per row, the 1-based code of the first :data:`ADMIT_RULES` entry it breaks
    (0: none): every expression evaluated again with the integer columns as
    float64 (``env`` is the int64 evaluation) must agree with its int64 value,
    and the grid must stay within the model's limits. Where :func:`shadow_exact`
    proves the two evaluations equal on every row, the float64 pass is not run
    (``exact=False`` runs it all the same)."""
    n = env["eb"].shape[0]
    with np.errstate(all="ignore"):
        if exact is None:
            exact = shadow_exact(prog, cols, env)
        if exact:  # the shadow's values are the int64 ones, as float64
            fenv = env
            wrap = np.zeros(n, dtype=bool)
        else:
            fenv = program_env(prog, cols, hw, shadow=True)
            wrap = np.zeros(n, dtype=bool)
            for name, _ in prog.lets:
                wrap |= np.broadcast_to(_differs(env[name], fenv[name]), (n,))
            for e in _program_exprs(prog):
                wrap |= np.broadcast_to(_differs(e(env), e(fenv)), (n,))
        g = [np.maximum(np.broadcast_to(np.asarray(e(fenv), dtype=np.float64), (n,)), 0.0)
             for e in prog.grid]
        tiles = g[0] * g[1] * g[2]
        blocks = np.zeros(n)
        for t in prog.tensors:
            if t.cadence == "step":
                span = np.ones(n)
                for d in range(3):
                    if not (t.mask >> d) & 1:
                        span = span * g[d]
                blocks = blocks + span
        steps = np.maximum(np.broadcast_to(np.asarray(prog.steps(fenv), dtype=np.float64),
                                           (n,)), 1.0)
        checks = (wrap, ~(tiles <= MAX_GRID_TILES), ~(blocks <= MAX_CACHE_BLOCKS),
                  ~(tiles * steps < SIZE_LIMIT))
    return first_rule(checks, n)


def _placeholder_cols(prog: TileProgram, cols: dict, bad: np.ndarray) -> dict:
    """``cols`` with the rows ``bad`` replaced by harmless values: 16 for positive
    integer columns, the default (or 1) for the other numeric ones."""
    out = dict(cols)
    for c in prog.columns:
        if c.kind in ("int", "float"):
            v = 16 if c.positive else (c.default if c.default is not None else 1)
            out[c.name] = np.where(bad, v, np.asarray(cols[c.name]))
    return out


def _arr(e, env, n, dtype=np.float64):
    return np.ascontiguousarray(np.broadcast_to(_val(e, env), (n,)), dtype=dtype)


def _rates(hw, n: int) -> np.ndarray:
    if n != 1:  # every row the GPU's one row of scalars (a row-major copy, not 9 column fills)
        rate = np.empty((n, N_RES), dtype=np.float64)
        rate[:] = _rates(hw, 1)[0]
        return rate
    sms = hw.sm_count
    rate = np.zeros((n, N_RES), dtype=np.float64)
    rate[:, R_CUDA] = hw.rate("fp32_tflops") * 1e6 / sms
    rate[:, R_SFU] = hw.rate("sfu_tops") * 1e6 / sms
    rate[:, R_ALU] = hw.rate("alu_tops") * 1e6 / sms
    rate[:, R_SMEM] = hw.smem_bytes_per_clk * hw.rate("clock_mhz")
    rate[:, R_L15] = hw.rate("l15_bw_tbps") * 1e6 / sms if hw.has_l15 else 0.0
    rate[:, R_L2] = hw.rate("l2_bw_tbps") * 1e6 * hw.cal("l2_efficiency")
    rate[:, R_DRAM] = hw.rate("dram_bw_tbps") * 1e6 * hw.cal("dram_efficiency")
    return rate


def power_clock(tiles, sms: int, tc_eff: float, clk_cap: float, cuda_cap: float):
    """The power-limited clock of a program grid of ``tiles`` tiles, GEMM's
    sub-wave rule (:mod:`kernels_catalog.gemm`, ``_lower_rows`` and ``lower()``'s
    comment, "the power-limited clock"): ``(rows, tc, cuda, smem)``, the rows of
    fewer tiles than SMs and their factors on the full-grid tensor-core rate, the
    CUDA-core rate and the shared-memory rate (every other row's are 1), or
    ``(None, None, None, None)`` where no row has fewer tiles than SMs or
    ``tc_efficiency`` is 1 (no headroom).

    ``tc_efficiency`` is the sustained share of the tensor-core peak with every
    SM busy; a grid that keeps ``active = min(tiles, sms)`` SMs busy runs them at
    ``boost = min(1 / tc_efficiency, sms / active)``, the per-clock rates at that
    boost capped at the maximum clock over the clock each is stated at: shared
    memory's ``clk_cap = max_clock_mhz / clock_mhz``, the CUDA cores' ``cuda_cap``
    over the clock ``fp32_tflops`` is stated at (:attr:`HwSpec.fp32_clock_cap`,
    so that a slower clock alone never runs them faster); both at least 1, ``inf``
    where the GPU file gives no maximum clock.

    GEMM's last-round rule (a grid of more tiles than SMs has its last
    ``tiles - (rounds - 1) sms`` tiles at their SMs' clock) is not applied here:
    its rounds count one tile per SM, while the envelope runs a program grid in
    waves of ``resident x sms`` tiles, so that a grid one tile past a round
    (more rounds, a faster last one) within the same wave was predicted faster
    than the smaller grid (H100 FlexAttention fp16, 64-wide heads, block_m 128,
    1024 queries: 49 -> 50 heads, 392 -> 400 tiles at 2 resident, 33.42 ->
    32.77 us), and its rounds counted in the envelope's waves still fell at
    some tail sizes (the envelope's wave seams; docs/gemm_accuracy.md, "The
    power-limited clock in the program families, session 10")."""
    if not tc_eff < 1.0:
        return None, None, None, None
    tiles = np.asarray(tiles)
    sub = np.flatnonzero(tiles < sms)  # the rows below one tile per SM (the others: 1)
    if not sub.size:
        return None, None, None, None
    t = np.maximum(tiles[sub].astype(np.float64), 1.0)
    tc_f = np.minimum(sms / t, 1.0 / tc_eff)
    return sub, tc_f, np.minimum(tc_f, cuda_cap), np.minimum(tc_f, clk_cap)


def _add_work(cols: dict, col: int, w: np.ndarray) -> None:
    """Add ``w`` to the work column ``col`` of ``cols`` (column index -> array; a
    column not there yet starts at 0.0, as a zeroed matrix's column does)."""
    acc = cols.get(col)
    if acc is None:
        cols[col] = np.add(0.0, w)
    else:
        acc += w


def _work_matrix(cols: dict, n: int) -> np.ndarray:
    """The ``(n, N_RES)`` work matrix of the columns :func:`_add_work` summed (zero elsewhere)."""
    out = np.zeros((n, N_RES), dtype=np.float64)
    for col, v in cols.items():
        out[:, col] = v
    return out


_HW_NAME_SET = frozenset(HW_NAMES)


def _row_free(e) -> bool:
    """Whether ``e`` reads no row's values (numbers and the GPU's): one value for every row."""
    return e.names <= _HW_NAME_SET


def _chain_rows(prog: TileProgram, env: dict, sh, varying: list, on_tc: np.ndarray, n: int):
    """``(rows, spread)``: rows of the batch that between them hold every distinct set
    of the chain's inputs, and per row of the batch the index of its set's row
    (``rows[spread]`` has a row's inputs at every row); ``(None, None)`` where the
    batch is not grouped (:class:`_Sharing`).

    The inputs: the synchronous uses (``varying``: the values of those that are
    neither shared nor the same on every row; the shared ones are functions of the
    sharing's group), the tensor-core unit ``on_tc`` and the tensor-core rate (of
    the dtype, on or off the warpgroup path). The rows are the sharing's
    representatives where nothing varies within its groups, else the first row of
    each distinct (group, varying values) key."""
    if sh is None or sh.rep is None or not n:
        return None, None
    from tsbatch.kernels.rowhash import dedup_rows  # noqa: PLC0415

    cols = [w.view(np.int64) if w.dtype == np.float64 else w.astype(np.int64) for w in varying]
    code = env["_dtype_code"]
    if "_dtype_code" not in sh.low and (code != code[0]).any():
        cols.append(code.astype(np.int64, copy=False))
    for e in (prog.wgmma, prog.tensor_cores):
        if not (sh.shares(e) or _row_free(e)):  # the unit, and the rate's path
            cols.append(np.broadcast_to(_val(e, env) > 0, (n,)).astype(np.int64))
            cols.append(on_tc.astype(np.int64))
            break
    if not cols:
        return sh.rep, sh.inv
    spread, rows = dedup_rows(np.column_stack([sh.inv, *cols]))
    return rows, spread


def lower_program(prog: TileProgram, cols: dict, hw) -> TilePlan:
    """Lower validated candidate columns of ``prog``'s family to a :class:`TilePlan`."""
    from tsbatch.kernels.dag import best_orders  # noqa: PLC0415
    from tsbatch.kernels.rowhash import dedup_rows  # noqa: PLC0415

    with np.errstate(all="ignore"):  # wrapped rows may divide by zero; they are not kept
        env = program_env(prog, cols, hw)
        admitted = admit_program(prog, cols, hw, env)
    if admitted.any():  # lowered with harmless values; residency marks them infeasible
        env = program_env(prog, _placeholder_cols(prog, cols, admitted > 0), hw)
    n = env["eb"].shape[0]
    i64 = np.int64
    g = [np.maximum(_arr(e, env, n, i64), 0) for e in prog.grid]
    ksteps = np.maximum(_arr(prog.steps, env, n, i64), 1)
    stages = np.maximum(_arr(prog.stages, env, n, i64), 1)
    # at most 2^20 warps (far past any GPU's 32 a block), so that threads cannot wrap
    warps = np.minimum(np.maximum(_arr(prog.warps, env, n, i64), 1), 1 << 20)
    threads = warps * 32
    wg = _arr(prog.wgmma, env, n) > 0

    # ---- tensors
    T = len(prog.tensors)
    t_bytes = np.zeros((n, max(T, 1)), dtype=np.float64)
    # the reuse masks and cadences are the program's: one row, copied to every row
    t_mask = np.zeros((n, max(T, 1)), dtype=np.int64)
    t_per_step = np.zeros((n, max(T, 1)), dtype=np.int64)
    t_mask[:, :T] = np.array([t.mask for t in prog.tensors], dtype=np.int64)
    t_per_step[:, :T] = np.array([1 if t.cadence == "step" else 0 for t in prog.tensors],
                                 dtype=np.int64)
    # the cache model's block bytes: every block at its full tile size where the
    # program says so (``foot``), as GEMM's (None: the traffic bytes)
    sh = env.get(_SHARE_KEY)  # the batch's grouping (:class:`_Sharing`), or None
    has_foot = any(t.foot is not None for t in prog.tensors)
    t_foot = None
    foot_done = False
    if has_foot:
        # every block's bytes shared (whole tiles: tile columns only): the matrix made
        # on the distinct rows and gathered by rows, once (the same converted values)
        feet = [t.bytes if t.foot is None else t.foot for t in prog.tensors]
        if sh is not None and feet and all(sh.shares(e) for e in feet):
            fs = np.zeros((sh.rep.shape[0], max(T, 1)), dtype=np.float64)
            for j, e in enumerate(feet):
                fs[:, j] = sh.small_value(e)
            t_foot = fs[sh.inv]
            foot_done = True
        else:
            t_foot = np.zeros((n, max(T, 1)), dtype=np.float64)
    # the work matrices' columns, summed as contiguous arrays (in the order of the
    # terms, from 0.0, as sums into the matrices' columns would be) and written into
    # the matrices once (:func:`_work_matrix`)
    work_iter_c: dict[int, np.ndarray] = {}
    work_epi_c: dict[int, np.ndarray] = {}
    for j, t in enumerate(prog.tensors):
        b = _arr(t.bytes, env, n)
        t_bytes[:, j] = b
        if t_foot is not None and not foot_done:
            t_foot[:, j] = b if t.foot is None else _arr(t.foot, env, n)
        if t.cadence == "tile":
            _add_work(work_epi_c, R_L2, b)
            _add_work(work_epi_c, R_DRAM, b)
        else:
            _add_work(work_iter_c, R_L2, b)  # split by the cache model later

    # ---- work of the actions (and each synchronous body action's work per resource)
    on_tc = np.broadcast_to(np.asarray(_val(prog.tensor_cores, env), dtype=bool), (n,))
    # a dtype without a tensor-core rate on this GPU (fp8 before Hopper) runs on CUDA cores
    tc_has = np.array([hw.tc_tflops(prog.dtypes[d]["tc"] or "float16") > 0 for d in prog.dtypes])
    on_tc = on_tc & tc_has[env["_dtype_code"]]
    # every row on tensor cores (a batch of one dtype that has them): the selections
    # below take their first operand on every row, so it is taken as it is
    all_tc = bool(on_tc.all())
    body = prog.body
    bi = {a.name: k for k, a in enumerate(body)}
    sync_work: list[list[tuple[int, np.ndarray]]] = [[] for _ in body]
    # the synchronous uses whose values vary within the sharing's groups (the chain
    # below is made once per group and per distinct set of these)
    sync_varying: list[np.ndarray] = []
    alu_col = R_ALU if hw.rate("alu_tops") > 0.0 else R_CUDA  # where ALU operations run on this GPU
    for a in prog.actions:
        for r, e in a.uses:
            w = _arr(e, env, n)
            col = _RES[r]
            if col == R_ALU and alu_col == R_CUDA:
                # integer and FP32 share one pipe on this GPU: an ALU operation
                # is one elementwise operation (2 FLOPs) on the CUDA cores
                col, w = R_CUDA, 2.0 * w
            target = work_iter_c if a.phase == "body" else work_epi_c
            if col == R_TC:
                if all_tc:  # (adding 0.0 to a work sum, +0.0 or more, changes no bit)
                    _add_work(target, R_TC, w)
                else:
                    _add_work(target, R_TC, np.where(on_tc, w, 0.0))
                    _add_work(target, R_CUDA, np.where(on_tc, 0.0, w))
            else:
                _add_work(target, col, w)
            if a.phase == "body" and not a.is_async:
                sync_work[bi[a.name]].append((col, w))
                if sh is not None and not (sh.shares(e) or _row_free(e)):
                    sync_varying.append(w)

    work_iter = _work_matrix(work_iter_c, n)
    work_epi = _work_matrix(work_epi_c, n)

    # ---- footprints
    smem = np.zeros(n, dtype=np.float64)
    regb = np.zeros(n, dtype=np.float64)
    whole = None  # bytes of register footprints each larger than the cap on its own
    elastic = np.zeros(n, dtype=np.float64)
    tmem = np.zeros(n, dtype=np.float64)
    cap = np.minimum(float(hw.max_registers_per_thread),
                     np.floor(hw.sm_registers / threads / 8) * 8)
    cap_bytes = None  # the cap's bytes a block (cap an integer: ceil(b / 4t) > cap iff b > cap 4t)
    for f in prog.footprints:
        b = _arr(f.bytes, env, n)
        if f.placement == "smem":
            smem += b
        elif f.placement == "registers":
            if f.elastic:
                elastic += b
                continue
            # spill_whole: a footprint that alone needs more registers than the cap
            # is kept in local memory whole (Footprint.spill_whole: everywhere, or
            # on the rows its expression selects)
            if f.spill_whole is not False:
                if cap_bytes is None:
                    cap_bytes = cap * (4.0 * threads)
                big = b > cap_bytes
                if f.spill_whole is not True:
                    big &= _arr(f.spill_whole, env, n) != 0
                if big.any():
                    part = np.where(big, b, 0.0)
                    whole = part if whole is None else whole + part
                    b = np.where(big, 0.0, b)
            regb += b
        elif f.placement == "tmem":
            tmem += b
    want = np.ceil(regb / (4.0 * threads)) + _arr(prog.base_registers, env, n)
    # elastic fragments take registers up to the cap and are streamed beyond it
    regs = np.minimum(want + np.ceil(elastic / (4.0 * threads)), cap).astype(np.int64)
    spill = np.maximum(want - cap, 0.0)
    if whole is not None:
        whole_regs = np.ceil(whole / (4.0 * threads))
        spill = spill + whole_regs
    passes = _arr(prog.spill_passes, env, n)
    work_iter[:, R_SMEM] += spill * 4.0 * threads * 2.0 * passes
    # local memory goes through L1. A footprint spilled whole is read and written
    # in full every iteration, and the share of the resident blocks' copies beyond
    # the L1 the shared-memory carve-out leaves streams from L2
    # (tsbatch.kernels.occupancy.spill_l2_bytes). A partial spill stays in the L1
    # traffic: ptxas spills the values it uses least, and the model's partial counts
    # are not the compiler's everywhere (a Triton GEMM's 128x128x64 tile on 4 warps:
    # 73-137 registers over the cap by gemm.py's count, 0-4 bytes of spill by ptxas)
    local_l2 = None
    if whole is not None:
        sp_rows = np.flatnonzero(whole > 0)
        l2b = spill_l2_bytes(whole_regs[sp_rows] * 4.0 * threads[sp_rows],
                             np.minimum(np.ceil(smem[sp_rows]), SIZE_LIMIT),
                             regs[sp_rows], threads[sp_rows], hw)
        if (l2b > 0).any():
            local_l2 = np.zeros(n)
            local_l2[sp_rows] = l2b

    # ---- rates
    rate = _rates(hw, n)
    sms = hw.sm_count
    tc_key = [prog.dtypes[d]["tc"] or "float16" for d in prog.dtypes]
    tc_tab = np.array([hw.tc_tflops(k) * 1e6 / sms for k in tc_key])
    rate[:, R_TC] = (tc_tab[env["_dtype_code"]] * np.where(wg, 1.0, hw.mma_sync_fraction)
                     * hw.cal("tc_efficiency"))
    sub_rows, tc_clk, cuda_clk, smem_clk = power_clock(g[0] * g[1] * g[2], sms,
                                                       hw.cal("tc_efficiency"), hw.clock_cap,
                                                       hw.fp32_clock_cap)

    # ---- rules (and tensor memory outside Blackwell)
    rules = list(ADMIT_RULES) + [r.reason for r in prog.rules]
    blocked = first_rule((np.asarray(_val(r.when, env), dtype=bool) for r in prog.rules), n,
                         start=len(ADMIT_RULES), code=admitted)
    if prog.footprints and any(f.placement == "tmem" for f in prog.footprints):
        cap_t = TMEM_BYTES_PER_SM if hw.mma == "tcgen05" else 0
        rules.append("tensor memory (TMEM) footprint exceeds the SM's "
                     f"{cap_t // 1024} KiB" if cap_t else "tensor memory (TMEM) exists only on "
                     "Blackwell")
        blocked = np.where((blocked == 0) & (tmem > cap_t), len(rules), blocked)

    # ---- chain of the best order: each synchronous body action's work on each of
    # its resources (a use) at the SM's full rates; tensor-core work of a dtype
    # without tensor cores runs on the CUDA cores (its use moves there)
    use_ptr = np.zeros(len(body) + 1, dtype=np.int64)
    use_res_l: list[int] = []
    # the durations are written into the chain's dedup key directly (its last column
    # the tensor-core unit, as int64 bits); every rate but the tensor cores' is one
    # number of the GPU (:func:`_rates`): a quotient by that scalar is the quotient
    # by its broadcast column, bit for bit
    n_use = sum(len(uses) for uses in sync_work)
    rate_gpu = _rates(hw, 1)[0]
    # The chain is a function of a row's uses, its tensor-core unit and rate (the
    # dtype's rate, on or off the warpgroup path). A large batch's rows repeat these:
    # the chain is made on the rows ``rows_c`` (one per distinct set) and spread to
    # the batch by ``spread`` (:func:`_chain_rows`); every row gets the numbers of a
    # row with the same inputs, which are its own (the same operations on the same
    # values)
    rows_c, spread = _chain_rows(prog, env, sh, sync_varying, on_tc, n)
    if rows_c is None:
        n_c, on_tc_c, rate_tc_c = n, on_tc, rate[:, R_TC]
    else:
        n_c, on_tc_c, rate_tc_c = rows_c.shape[0], on_tc[rows_c], rate[rows_c, R_TC]
    buf = np.empty((n_c, n_use + 1), dtype=np.float64)
    tc_safe = None  # the tensor-core rate, 1.0 where zero (made once, on first use)
    for k, uses in enumerate(sync_work):
        for col, w in uses:
            if rows_c is not None:
                w = w[rows_c]
            dst = buf[:, len(use_res_l)]
            if col == R_TC:
                # a dtype without tensor cores has a zero rate there: its rows take
                # the CUDA-core quotient (the other one is not used)
                if tc_safe is None:
                    tc_safe = np.where(rate_tc_c > 0, rate_tc_c, 1.0)
                if all_tc:
                    np.divide(w, tc_safe, out=dst)
                else:
                    dst[:] = np.where(on_tc_c, w / tc_safe, w / rate_gpu[R_CUDA])
            elif rate_gpu[col] > 0:
                np.divide(w, rate_gpu[col], out=dst)
            else:
                dst[:] = 0.0
            use_res_l.append(col)
        use_ptr[k + 1] = len(use_res_l)
    use_res = np.array(use_res_l, dtype=np.int64)
    udur = buf[:, :n_use]
    if prog.has_chain() and n_c:
        # tensor-core work of a dtype without tensor cores runs on CUDA cores
        use_res_fma = np.where(use_res == R_TC, R_CUDA, use_res)
        preds = prog.body_preds()
        pred_mask = np.array([sum(1 << p for p in ps) for ps in preds], dtype=np.int64)
        orders = prog.orders()
        # the search runs once per distinct (durations, unit) row: a batch of tile
        # configurations over few shapes repeats them many times
        key = buf.view(np.int64)
        key[:, n_use] = on_tc_c
        inv, rep = dedup_rows(key)
        chain_u = np.zeros(rep.shape[0])
        best_u = np.zeros(rep.shape[0], dtype=np.int64)
        tc_u = on_tc_c[rep]
        for sel, ur in ((tc_u, use_res), (~tc_u, use_res_fma)):
            idx = np.flatnonzero(sel)
            if idx.size:
                c, b = best_orders(udur[rep[idx]], use_ptr, ur, pred_mask, orders)
                chain_u[idx] = c
                best_u[idx] = b
        if spread is not None:  # the chain rows' distinct keys, then the batch's rows
            inv = inv[spread]
        chain = chain_u[inv]
        best = best_u[inv]
    else:
        # no dependency between synchronous actions: the longest action's use
        # (np.maximum over the columns in turn: the same maximum as ``udur.max(axis=1)``,
        # whose reduction along a row of a few strided elements costs ~10x more)
        if udur.shape[1]:
            chain = udur[:, 0].copy()
            for j in range(1, udur.shape[1]):
                np.maximum(chain, udur[:, j], out=chain)
            if spread is not None:
                chain = chain[spread]
        else:
            chain = np.zeros(n)
        best = np.zeros(n, dtype=np.int64)

    if sub_rows is not None:
        # the power-limited clock (:func:`power_clock`) on the rates the envelope
        # prices the grid's work at (the chain above is the SM's own critical path
        # at the measured clock)
        rate[sub_rows, R_TC] *= tc_clk
        rate[sub_rows, R_CUDA] *= cuda_clk
        rate[sub_rows, R_SMEM] *= smem_clk

    if prog.streams is not None:
        streams = np.maximum(_arr(prog.streams, env, n), 1e-9)
    else:
        streams = warps / float(hw.warp_schedulers)
    if prog.order in ORDER_NAMES:
        order = np.full(n, ORDER_NAMES[prog.order], dtype=np.int64)
    else:  # a text column of order names (validated against its choices)
        order = map_codes(np.asarray(env[prog.order], dtype=object), ORDER_NAMES)
    cyc = 1.0 / hw.rate("clock_mhz")
    launches = _arr(prog.launches, env, n) if prog.launches is not None else np.ones(n)
    useful = (_arr(prog.useful_flops, env, n) if prog.useful_flops is not None
              else g[0] * g[1] * g[2] * (ksteps * work_iter[:, R_TC] + work_epi[:, R_TC]))
    extra = {**mma_path_extra(np.where(wg & on_tc, 2, on_tc.astype(np.int64))),
             "register_spill": np.minimum(spill, SIZE_LIMIT).astype(np.int64), "tiles": g[0] * g[1] * g[2],
        "program": prog}
    for name, e in prog.extra_outputs:
        extra[name] = _arr(e, env, n)
    extra["outputs"] = tuple(name for name, _ in prog.extra_outputs)
    env.pop(_SHARE_KEY, None)  # (it holds env: no cycle left to the collector)
    return TilePlan(
        g0=g[0], g1=g[1], g2=g[2], order=order,
        group=clamp_group(np.maximum(_arr(prog.group, env, n, i64), 1), g[0]),
        ksteps=ksteps, stages=stages,
        smem_block=np.minimum(np.ceil(smem), SIZE_LIMIT).astype(np.int64), regs_thread=regs, threads=threads,
        warps=warps, t_mask=t_mask[:, :T], t_per_step=t_per_step[:, :T], t_bytes=t_bytes[:, :T],
        t_foot=None if t_foot is None else t_foot[:, :T],
        work_iter=work_iter, work_epi=work_epi, rate=rate, warps_full=float(hw.warp_schedulers),
        lat_us=np.full(n, hw.cal("mem_latency_us")),
        ovh_iter_us=np.full(n, hw.cal("iter_overhead_cycles") * cyc),
        ovh_tile_us=np.full(n, hw.cal("tile_overhead_cycles") * cyc),
        launch_us=hw.program_launch_us * launches,
        persistent=(order == ORDER_PERSISTENT).astype(np.int64),
        useful_flops=np.asarray(useful, dtype=np.float64),
        share_eff=np.where(wg, hw.cal("wgmma_share_efficiency"), 1.0),
        sync_us=np.full(n, hw.cal("iter_sync_cycles") * cyc),
        chain_us=chain, streams=streams, order_idx=best, blocked=blocked, rules=tuple(rules),
        unlowered=(admitted > 0) if admitted.any() else None, local_l2=local_l2, extra=extra)


def family_from_program(prog: TileProgram) -> Family:
    """The :class:`Family` of a tile program: its columns, workload and lowering."""
    cols = tuple(prog.columns)
    workload = prog.workload or tuple(c.name for c in cols if c.name not in _SCHEDULE_HINTS)
    return Family(name=prog.name, columns=cols, workload_columns=workload,
                  lower=lambda c, hw, _p=prog: lower_program(_p, c, hw), doc=prog.doc,
                  program=prog)


#: column names taken as schedule (not workload) when a program names no workload
_SCHEDULE_HINTS = {"block_m", "block_n", "block_k", "num_stages", "num_warps", "group_m"}
