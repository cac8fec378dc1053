"""Tile programs: a kernel family as data (TileSight §3.1, §3.4; GTSim §2.1).

A :class:`TileProgram` is what a kernel author would sketch on a whiteboard:

- the **grid** of tile-blocks (three dimensions, a launch order), the
  reduction **loop** each block runs (``steps`` iterations, ``stages`` deep)
  and the warps that run it;
- **tensors** the tiles touch, each with its block bytes, the grid
  dimensions along which the same block is read again (its *reuse
  dimensions*, the cache model's input) and its cadence (every loop step,
  or once per tile); optionally its block bytes as the cache model sees
  them (``foot``: every block at its full tile size, GEMM's rule, where
  ``bytes`` holds the grid's average edge tile);
- **footprints**: what each block holds and where (``registers``, ``smem``,
  ``tmem`` on Blackwell, ``global``), which bounds how many blocks an SM
  holds at once;
- the **tile actions** of the body (one loop iteration), of the prologue and
  of the epilogue: each names the resources it uses with the work on each
  (an expression over the candidate columns: FLOPs on tensor and CUDA cores,
  operations on the SFU, bytes on shared memory), or the tensor it loads or
  stores, and the actions it depends on. An ``async`` action (a prefetched
  load: cp.async, TMA) is issued ``stages - 1`` iterations ahead by the
  software pipeline; the others run in the issuing warps.

Every size is an expression over the candidate columns, the ``[let]``
bindings before it, the dtype's numbers (``eb`` element bytes, ``ob``
output bytes, ``tc`` 1 when the dtype runs on tensor cores) and the GPU's
(``sm_count``, ``warp_size``, ...). Expressions are parsed once (Python
syntax, a fixed set of names and functions, nothing else: see
:data:`FUNCTIONS`) and evaluated with numpy on whole columns, so lowering a
batch runs no Python loop per row. A family is then this data plus, where a
rule is too intricate for an expression, a small vectorized lowering of its
own (GEMM's MMA-path and register rules); it adds no numba code.

Steady state (Eq. 4-5). Each legal topological order ``σ`` of the body's
actions is an *issue order*: a list schedule runs the synchronous actions in
that order, each starting when its inputs are ready and its resources are
free, and its makespan is the *chain* of one iteration; with ``q``
independent issue streams on the SM (resident tiles times the program's
``streams`` per tile: e.g. ping-pong warpgroups) the chains of different
streams interleave, so the steady iteration costs
``max(Σ_o u_r(o) over r, chain(σ) / q)`` and the best order is the one with
the shortest chain. Orders are enumerated once per program
(:meth:`TileProgram.orders`) and the minimum is taken per row by
:func:`tsbatch.kernels.dag.best_orders`.

Programs load from TOML (:func:`load_program`), which is how a user
describes a fused kernel of their own; ``kernels_catalog/programs/*.toml``
hold the catalog's. A bad program (a cycle, an unknown resource, a
dependency on a missing action, a footprint without a known placement, an
expression naming an unknown column, a key the format does not have) raises
:class:`ProgramError` naming the file and the action.
"""

from __future__ import annotations

import ast
import difflib
import functools
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tsbatch.errors import InputError

__all__ = [
    "ProgramError",
    "Action",
    "Tensor",
    "Footprint",
    "Rule",
    "TileProgram",
    "Expr",
    "FUNCTIONS",
    "RESOURCES",
    "PLACEMENTS",
    "load_program",
    "program_from_dict",
    "legal_orders",
    "count_orders",
]

#: resource names of the per-tile resource vector (Eq. 1), as in
#: :data:`tsbatch.kernels.envelope.R_NAMES`
RESOURCES = ("tensor_core", "cuda_core", "sfu", "smem", "l15", "l2", "dram", "net", "alu")
#: resources an action may name directly (memory traffic goes through tensors,
#: whose bytes the cache model splits into L1.5, L2 and DRAM)
ACTION_RESOURCES = ("tensor_core", "cuda_core", "sfu", "smem", "net", "alu")
PLACEMENTS = ("registers", "smem", "tmem", "global")
PHASES = ("prologue", "body", "epilogue")
CADENCES = ("step", "tile")
#: most legal orders kept per program (the enumeration stops with an error past it)
MAX_ORDERS = 50_000


class ProgramError(InputError):
    """A tile program that cannot be used, naming its file and the part at fault."""


def _cdiv(a, b):
    a = np.asarray(a)
    b = np.asarray(b)
    return -np.floor_divide(-a, np.where(b == 0, 1, b))


def _pow2ceil(a):
    a = np.maximum(np.asarray(a, dtype=np.float64), 1.0)
    return np.exp2(np.ceil(np.log2(a)))


def _is_pow2(a):
    a = np.asarray(a).astype(np.int64)
    return (a > 0) & ((a & (a - 1)) == 0)


#: functions an expression may call (all elementwise over columns)
FUNCTIONS = {
    "cdiv": _cdiv,
    "min": np.minimum,
    "max": np.maximum,
    "where": np.where,
    "ceil": np.ceil,
    "floor": np.floor,
    "log2": np.log2,
    "sqrt": np.sqrt,
    "abs": np.abs,
    "pow2ceil": _pow2ceil,
    "is_pow2": _is_pow2,
}

_BINOPS = {
    ast.Add: np.add, ast.Sub: np.subtract, ast.Mult: np.multiply, ast.Div: np.true_divide,
    ast.FloorDiv: np.floor_divide, ast.Mod: np.mod, ast.Pow: np.power,
    ast.BitAnd: np.logical_and, ast.BitOr: np.logical_or,
}
_CMPOPS = {
    ast.Lt: np.less, ast.LtE: np.less_equal, ast.Gt: np.greater, ast.GtE: np.greater_equal,
    ast.Eq: np.equal, ast.NotEq: np.not_equal,
}


class Expr:
    """A size expression parsed once; :meth:`__call__` evaluates it on columns.

    Python syntax: numbers, names, ``+ - * / // % **``, comparisons,
    ``and``/``or``/``not``, ``a if c else b`` and calls of :data:`FUNCTIONS`.
    """

    def __init__(self, text, where: str):
        self.text = str(text)
        self.where = where
        try:
            tree = ast.parse(self.text.strip(), mode="eval")
        except SyntaxError as exc:
            raise ProgramError(f"{where}: cannot parse expression {self.text!r}: {exc.msg}") from None
        self.names: set[str] = set()
        #: the parsed expression (kernels_catalog.lowering proves bounds on it)
        self.tree = tree.body
        self._fn = self._compile(tree.body)

    def _compile(self, node):
        w = self.where
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, bool, str)):
            v = node.value
            return lambda env: v
        if isinstance(node, ast.Name):
            name = node.id
            self.names.add(name)
            return lambda env: env[name]
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            op = _BINOPS[type(node.op)]
            a, b = self._compile(node.left), self._compile(node.right)
            return lambda env: op(a(env), b(env))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            a = self._compile(node.operand)
            return lambda env: np.negative(a(env))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            a = self._compile(node.operand)
            return lambda env: np.logical_not(a(env))
        if isinstance(node, ast.BoolOp):
            parts = [self._compile(v) for v in node.values]
            op = np.logical_and if isinstance(node.op, ast.And) else np.logical_or

            def boolop(env):
                out = parts[0](env)
                for p in parts[1:]:
                    out = op(out, p(env))
                return out
            return boolop
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _CMPOPS:
            op = _CMPOPS[type(node.ops[0])]
            a, b = self._compile(node.left), self._compile(node.comparators[0])
            return lambda env: op(a(env), b(env))
        if isinstance(node, ast.IfExp):
            c, a, b = self._compile(node.test), self._compile(node.body), self._compile(node.orelse)
            return lambda env: np.where(c(env), a(env), b(env))
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in FUNCTIONS and not node.keywords):
            fn = FUNCTIONS[node.func.id]
            args = [self._compile(a) for a in node.args]
            return lambda env: fn(*[a(env) for a in args])
        what = ast.unparse(node) if hasattr(ast, "unparse") else type(node).__name__
        raise ProgramError(f"{w}: {what!r} is not allowed in an expression (numbers, names, "
                           f"arithmetic, comparisons, 'a if c else b' and "
                           f"{', '.join(FUNCTIONS)})")

    def __call__(self, env: dict):
        return self._fn(env)

    def __repr__(self) -> str:
        return f"Expr({self.text!r})"


@dataclass(frozen=True)
class Tensor:
    """A tensor access of every tile: block bytes, reuse dimensions, cadence."""

    name: str
    bytes: Expr
    reuse: tuple[int, ...]
    cadence: str  # "step" (every loop iteration) or "tile" (once per tile)
    store: bool = False
    #: block bytes as the cache model sees them (its footprints and the cache
    #: problem's key) where they differ from the traffic ``bytes``: every block at
    #: its full tile size, so that problems of one grid share their cache results
    #: whatever the sizes' edge tiles (GEMM's ``TilePlan.t_foot``); None: ``bytes``
    foot: Expr | None = None

    @property
    def mask(self) -> int:
        return sum(1 << d for d in self.reuse)


@dataclass(frozen=True)
class Footprint:
    """What a block holds on chip (or in global memory) and where."""

    name: str
    placement: str
    bytes: Expr
    #: registers only: operand fragments the compiler holds while registers
    #: allow and otherwise streams (reloads per MMA step) instead of spilling:
    #: they count toward the registers allocated, up to the cap, never toward spills
    elastic: bool = False
    #: registers only: where this footprint alone needs more registers per thread
    #: than the cap, the compiler keeps it in local memory whole (all of it spills,
    #: the rest of the registers stay for the others), not just the excess; true,
    #: false, or an expression: the rows where the compiler does so
    spill_whole: bool | Expr = False


@dataclass(frozen=True)
class Action:
    """A tile action: resources with their work, or a tensor it moves; dependencies."""

    name: str
    phase: str
    uses: tuple[tuple[str, Expr], ...]
    deps: tuple[str, ...]
    tensor: str | None = None
    is_async: bool = False
    doc: str = ""


@dataclass(frozen=True)
class Rule:
    """A configuration the kernel cannot build: rows where ``when`` holds are infeasible."""

    when: Expr
    reason: str


@dataclass
class TileProgram:
    """A kernel family's tile program (see the module docstring)."""

    name: str
    source: str
    doc: str
    columns: tuple  # of kernels_catalog.base.Column
    workload: tuple[str, ...]
    dtypes: dict
    lets: tuple[tuple[str, Expr], ...]
    grid: tuple[Expr, Expr, Expr]
    order: str
    group: Expr
    steps: Expr
    stages: Expr
    warps: Expr
    streams: Expr | None
    wgmma: Expr
    tensor_cores: Expr
    base_registers: Expr
    spill_passes: Expr
    tensors: tuple[Tensor, ...]
    footprints: tuple[Footprint, ...]
    actions: tuple[Action, ...]
    rules: tuple[Rule, ...] = ()
    useful_flops: Expr | None = None
    extra_outputs: tuple[tuple[str, Expr], ...] = ()
    launches: Expr | None = None
    _orders: np.ndarray | None = field(default=None, repr=False)
    _order_texts: list | None = field(default=None, repr=False)
    #: per expression, the columns its value depends on where the lowering may
    #: evaluate it on their distinct rows (kernels_catalog.lowering._share_plan; made once)
    _shared: dict | None = field(default=None, repr=False, compare=False)
    #: kernels_catalog.lowering.shadow_exact's answers by the columns' ranges
    _proofs: dict = field(default_factory=dict, repr=False, compare=False)

    # ------------------------------------------------------------------ DAG
    @property
    def body(self) -> tuple[Action, ...]:
        return tuple(a for a in self.actions if a.phase == "body")

    def body_preds(self) -> list[list[int]]:
        """Per body action, the indices of its in-iteration predecessors."""
        names = [a.name for a in self.body]
        idx = {n: i for i, n in enumerate(names)}
        return [[idx[d] for d in a.deps if d in idx] for a in self.body]

    def orders(self) -> np.ndarray:
        """The legal topological orders of the body, ``(n_orders, n_actions)``
        action indices in issue order; enumerated once and kept."""
        if self._orders is None:
            self._orders = legal_orders(self.body_preds(), where=f"{self.source}: program "
                                        f"{self.name!r}")
        return self._orders

    def order_names(self, k: int) -> str:
        """Order ``k`` as text: the body's synchronous actions in issue order."""
        return self.order_texts()[k]

    def order_texts(self) -> list[str]:
        """Every legal order as text (made once and kept, like :meth:`orders`)."""
        if self._order_texts is None:
            body = self.body
            self._order_texts = [" > ".join(body[j].name for j in o if not body[j].is_async)
                                 for o in self.orders()]
        return self._order_texts

    def has_chain(self) -> bool:
        """Whether any synchronous body action depends on another synchronous one
        (without such a dependency every order's chain is the longest action)."""
        body = self.body
        for a, preds in zip(body, self.body_preds()):
            if not a.is_async and any(not body[p].is_async for p in preds):
                return True
        return False

    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)


# ---------------------------------------------------------------------- orders
def legal_orders(preds: list[list[int]], where: str = "program") -> np.ndarray:
    """Every topological order of a DAG given by its predecessor lists
    (depth-first, lexicographic by action index). Raises :class:`ProgramError`
    past :data:`MAX_ORDERS`."""
    n = len(preds)
    pmask = [sum(1 << p for p in ps) for ps in preds]
    out: list[list[int]] = []
    seq: list[int] = []

    def rec(done: int):
        if len(seq) == n:
            out.append(list(seq))
            if len(out) > MAX_ORDERS:
                raise ProgramError(f"{where}: more than {MAX_ORDERS} legal orders; add "
                                   f"dependencies or merge actions")
            return
        for a in range(n):
            if not (done >> a) & 1 and (pmask[a] & done) == pmask[a]:
                seq.append(a)
                rec(done | (1 << a))
                seq.pop()

    rec(0)
    return np.array(out, dtype=np.int64).reshape(len(out), n)


def count_orders(preds: list[list[int]]) -> int:
    """The number of topological orders, by dynamic programming over subsets."""
    n = len(preds)
    pmask = [sum(1 << p for p in ps) for ps in preds]

    @functools.lru_cache(maxsize=None)
    def ways(done: int) -> int:
        if done == (1 << n) - 1:
            return 1
        return sum(ways(done | (1 << a)) for a in range(n)
                   if not (done >> a) & 1 and (pmask[a] & done) == pmask[a])

    return ways(0)


def _find_cycle(names: list[str], deps: dict[str, tuple[str, ...]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(v: str):
        state[v] = 1
        stack.append(v)
        for d in deps.get(v, ()):
            if state.get(d) == 1:
                return stack[stack.index(d):] + [d]
            if state.get(d) is None:
                c = visit(d)
                if c:
                    return c
        stack.pop()
        state[v] = 2
        return None

    for v in names:
        if state.get(v) is None:
            c = visit(v)
            if c:
                return c
    return None


# ---------------------------------------------------------------------- loading
#: names every expression may use besides columns and lets
DTYPE_NAMES = ("eb", "ob", "tc")
HW_NAMES = ("sm_count", "warp_size", "clock_mhz", "smem_per_block_bytes", "sm_smem_bytes",
            "max_registers_per_thread", "sm_registers", "l2_bytes", "is_hopper", "is_blackwell")


def load_program(path: str | Path) -> TileProgram:
    """Read a tile program from a TOML file (format: ``docs/families.md``)."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ProgramError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ProgramError(f"{path}: cannot read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ProgramError(f"{path}: not valid TOML: {exc}") from None
    return program_from_dict(data, str(path))


def _need(d: dict, key: str, where: str):
    if key not in d:
        raise ProgramError(f"{where}: missing '{key}'")
    return d[key]


#: the keys each part of a program may have (docs/families.md, "The file format")
PROGRAM_KEYS = {
    "": ("family", "columns", "dtypes", "let", "grid", "tensor", "footprint", "action", "rule",
         "output"),
    "[family]": ("name", "doc", "workload", "useful_flops"),
    "column": ("kind", "doc", "required", "default", "positive", "choices"),
    "dtype": DTYPE_NAMES,
    "[grid]": ("dims", "order", "group", "steps", "stages", "warps", "streams", "wgmma",
               "tensor_cores", "base_registers", "spill_passes", "launches"),
    "[[tensor]]": ("name", "bytes", "reuse", "cadence", "store", "foot"),
    "[[footprint]]": ("name", "placement", "bytes", "elastic", "spill_whole"),
    "[[action]]": ("name", "phase", "uses", "deps", "tensor", "async", "doc"),
    "[[rule]]": ("when", "reason"),
}


def _known_keys(d, part: str, where: str) -> None:
    """A key the format does not have (a misspelt ``spill_whole`` would otherwise be
    ignored without a word): one error naming it, the nearest known key, and all of them."""
    if not isinstance(d, dict):
        return
    allowed = PROGRAM_KEYS[part]
    for k in d:
        if k not in allowed:
            near = difflib.get_close_matches(str(k), allowed, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise ProgramError(f"{where}: unknown key {k!r}{hint}; {part or 'a program'} takes "
                               f"{', '.join(allowed)}")


def program_from_dict(data: dict, source: str = "<program>") -> TileProgram:
    """Build and check a :class:`TileProgram` from its TOML document (a dict)."""
    from kernels_catalog.base import Column  # noqa: PLC0415 (base imports nothing of ours)

    fam = data.get("family", {})
    name = str(_need(fam, "name", f"{source}: [family]"))
    where = f"{source}: program {name!r}"
    _known_keys(data, "", where)
    _known_keys(fam, "[family]", f"{where}: [family]")

    # ---- columns
    cols_d = _need(data, "columns", where)
    columns = []
    for cname, spec in cols_d.items():
        w = f"{where}: column {cname!r}"
        if not isinstance(spec, dict):
            raise ProgramError(f"{w}: expected a table {{ kind = ..., doc = ... }}")
        _known_keys(spec, "column", w)
        kind = spec.get("kind", "int")
        if kind not in ("int", "str", "bool", "float"):
            raise ProgramError(f"{w}: kind {kind!r} is not int, str, bool or float")
        columns.append(Column(cname, kind, str(spec.get("doc", "")),
                              required=bool(spec.get("required", "default" not in spec)),
                              default=spec.get("default"), positive=bool(spec.get("positive", False)),
                              choices=tuple(spec.get("choices", ()))))
    col_names = {c.name for c in columns}
    if "dtype" not in col_names:
        raise ProgramError(f"{where}: needs a 'dtype' column (its [dtypes] give eb, ob and tc)")

    dtypes = _need(data, "dtypes", where)
    for dn, dv in dtypes.items():
        _known_keys(dv, "dtype", f"{where}: dtype {dn!r}")
        for k in ("eb", "tc"):
            if k not in dv:
                raise ProgramError(f"{where}: dtype {dn!r} needs '{k}'")
    known = set(col_names) | set(DTYPE_NAMES) | set(HW_NAMES)

    def expr(text, w: str) -> Expr:
        e = Expr(text, w)
        unknown = sorted(e.names - known)
        if unknown:
            raise ProgramError(f"{w}: unknown name {unknown[0]!r} in {e.text!r} (not a column, "
                               f"an earlier [let] or one of {', '.join(DTYPE_NAMES + HW_NAMES)})")
        return e

    lets = []
    for lname, text in data.get("let", {}).items():
        lets.append((lname, expr(text, f"{where}: let {lname!r}")))
        known.add(lname)

    grid = _need(data, "grid", where)
    _known_keys(grid, "[grid]", f"{where}: [grid]")
    dims = _need(grid, "dims", f"{where}: [grid]")
    if len(dims) != 3:
        raise ProgramError(f"{where}: [grid] dims must list 3 expressions (use \"1\" for unused)")
    from tsbatch.kernels.order import ORDER_NAMES  # noqa: PLC0415

    order = str(grid.get("order", "row"))
    str_cols = {c.name for c in columns if c.kind == "str"}
    if order not in ORDER_NAMES and order not in str_cols:
        raise ProgramError(f"{where}: [grid] order {order!r} is not one of {', '.join(ORDER_NAMES)} "
                           f"nor a text column holding them")
    gw = f"{where}: [grid]"
    g = tuple(expr(d, f"{gw} dims[{i}]") for i, d in enumerate(dims))

    tensors = []
    for t in data.get("tensor", []):
        tn = str(_need(t, "name", f"{where}: [[tensor]]"))
        w = f"{where}: tensor {tn!r}"
        _known_keys(t, "[[tensor]]", w)
        reuse = tuple(int(r) for r in t.get("reuse", ()))
        if any(r not in (0, 1, 2) for r in reuse):
            raise ProgramError(f"{w}: reuse dimensions must be grid dimensions 0, 1 or 2")
        cad = str(t.get("cadence", "step"))
        if cad not in CADENCES:
            raise ProgramError(f"{w}: cadence {cad!r} is not 'step' or 'tile'")
        foot = expr(str(t["foot"]), f"{w} foot") if "foot" in t else None
        tensors.append(Tensor(tn, expr(_need(t, "bytes", w), f"{w} bytes"), reuse, cad,
                              bool(t.get("store", False)), foot))
    tnames = [t.name for t in tensors]

    footprints = []
    for f in data.get("footprint", []):
        fn = str(_need(f, "name", f"{where}: [[footprint]]"))
        w = f"{where}: footprint {fn!r}"
        _known_keys(f, "[[footprint]]", w)
        pl_ = f.get("placement")
        if pl_ not in PLACEMENTS:
            raise ProgramError(f"{w}: placement {pl_!r} is not one of {', '.join(PLACEMENTS)}")
        elastic = f.get("elastic", False)
        if not isinstance(elastic, bool):
            raise ProgramError(f"{w}: elastic must be true or false, not {elastic!r}")
        if elastic and pl_ != "registers":
            raise ProgramError(f"{w}: elastic applies to placement 'registers' only, not {pl_!r}")
        whole = f.get("spill_whole", False)
        if not isinstance(whole, (bool, str)):
            raise ProgramError(f"{w}: spill_whole must be true, false or an expression, "
                               f"not {whole!r}")
        if whole is not False and (pl_ != "registers" or elastic):
            raise ProgramError(f"{w}: spill_whole applies to placement 'registers' without "
                               f"elastic only")
        if isinstance(whole, str):
            whole = expr(whole, f"{w} spill_whole")
        footprints.append(Footprint(fn, pl_, expr(_need(f, "bytes", w), f"{w} bytes"), elastic,
                                    whole))

    actions = []
    seen = set()
    for a in data.get("action", []):
        an = str(_need(a, "name", f"{where}: [[action]]"))
        w = f"{where}: action {an!r}"
        _known_keys(a, "[[action]]", w)
        if an in seen:
            raise ProgramError(f"{w}: defined twice")
        seen.add(an)
        phase = str(a.get("phase", "body"))
        if phase not in PHASES:
            raise ProgramError(f"{w}: phase {phase!r} is not one of {', '.join(PHASES)}")
        uses = []
        for r, text in a.get("uses", {}).items():
            if r not in ACTION_RESOURCES:
                hint = " (memory traffic goes through a tensor = '...')" if r in RESOURCES else ""
                raise ProgramError(f"{w}: unknown resource {r!r}{hint}; known: "
                                   f"{', '.join(ACTION_RESOURCES)}")
            uses.append((r, expr(text, f"{w} uses.{r}")))
        tensor = a.get("tensor")
        if tensor is not None and tensor not in tnames:
            raise ProgramError(f"{w}: tensor {tensor!r} is not a [[tensor]] of the program")
        if tensor is None and not uses:
            raise ProgramError(f"{w}: uses no resource and moves no tensor")
        actions.append(Action(an, phase, tuple(uses), tuple(str(d) for d in a.get("deps", ())),
                              tensor, bool(a.get("async", False)), str(a.get("doc", ""))))
    if not any(a.phase == "body" for a in actions):
        raise ProgramError(f"{where}: no body action (phase = 'body')")
    by_name = {a.name: a for a in actions}
    for a in actions:
        for d in a.deps:
            if d not in by_name:
                raise ProgramError(f"{where}: action {a.name!r} depends on {d!r}, which is not "
                                   f"an action of the program")
            rank = PHASES.index
            if rank(by_name[d].phase) > rank(a.phase):
                raise ProgramError(f"{where}: action {a.name!r} ({a.phase}) depends on {d!r} "
                                   f"of a later phase ({by_name[d].phase})")
    cyc = _find_cycle([a.name for a in actions], {a.name: a.deps for a in actions})
    if cyc:
        raise ProgramError(f"{where}: action {cyc[0]!r} is on a dependency cycle: "
                           f"{' -> '.join(cyc)}")

    rules = []
    for r in data.get("rule", []):
        _known_keys(r, "[[rule]]", f"{where}: [[rule]]")
        rules.append(Rule(expr(_need(r, "when", f"{where}: [[rule]]"), f"{where}: rule"),
                          str(_need(r, "reason", f"{where}: [[rule]]"))))
    rules = tuple(rules)
    outputs = tuple((k, expr(v, f"{where}: output {k!r}")) for k, v in data.get("output", {}).items())
    workload = tuple(fam.get("workload", ()))
    for c in workload:
        if c not in col_names:
            raise ProgramError(f"{where}: workload column {c!r} is not a column")
    uf = fam.get("useful_flops")
    la = grid.get("launches")
    prog = TileProgram(
        name=name, source=source, doc=str(fam.get("doc", "")), columns=tuple(columns),
        workload=workload, dtypes=dtypes, lets=tuple(lets), grid=g, order=order,
        group=expr(grid.get("group", 1), f"{gw} group"),
        steps=expr(_need(grid, "steps", gw), f"{gw} steps"),
        stages=expr(grid.get("stages", 1), f"{gw} stages"),
        warps=expr(_need(grid, "warps", gw), f"{gw} warps"),
        streams=expr(grid["streams"], f"{gw} streams") if "streams" in grid else None,
        wgmma=expr(grid.get("wgmma", 0), f"{gw} wgmma"),
        tensor_cores=expr(grid.get("tensor_cores", "tc"), f"{gw} tensor_cores"),
        base_registers=expr(grid.get("base_registers", 32), f"{gw} base_registers"),
        spill_passes=expr(grid.get("spill_passes", 1), f"{gw} spill_passes"),
        tensors=tuple(tensors), footprints=tuple(footprints), actions=tuple(actions),
        rules=rules, useful_flops=expr(uf, f"{where}: useful_flops") if uf is not None else None,
        extra_outputs=outputs, launches=expr(la, f"{gw} launches") if la is not None else None)
    prog.orders()  # enumerate now: a program with too many orders fails at load
    return prog
