"""What a kernel family is: its candidate columns and a vectorized lowering.

A family declares the columns a candidate table must (or may) have, with
types, defaults and meaning, which workload columns identify a problem
(for ranking), and a ``lower`` function that turns the whole batch of
candidates into a :class:`TilePlan`: the struct-of-arrays tile plan that
the generic numba kernels of :mod:`tsbatch.kernels` consume. Adding a
family adds no numba code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

__all__ = ["Column", "TilePlan", "Family", "map_codes", "same_object", "first_rule", "clamp_group",
           "SIZE_LIMIT", "MAX_GRID_TILES", "MAX_CACHE_BLOCKS", "MMA_PATHS", "mma_path_extra"]


@dataclass(frozen=True)
class Column:
    """One candidate column. ``kind`` is ``int``, ``str``, ``bool`` or ``float``."""

    name: str
    kind: str
    doc: str
    required: bool = True
    default: object = None
    positive: bool = False
    choices: tuple = ()
    #: a regular expression every text value must match in full ('' : any), and
    #: what it asks for, in words, for the error message
    pattern: str = ""
    pattern_doc: str = ""


@dataclass
class TilePlan:
    """A batch of lowered tile plans, one entry per candidate row (SoA).

    Grid and order: ``g0, g1, g2`` tiles along three grid dimensions, the
    launch ``order`` code and its ``group``; ``ksteps`` reduction-loop
    iterations per tile; ``stages`` software-pipeline stages.

    Per block: ``smem_block`` bytes, ``regs_thread``, ``threads``.

    Tensor accesses (``T`` tensors): ``t_mask`` reuse-dimension bit masks,
    ``t_per_step`` cadence flags and ``t_bytes`` block bytes, each ``(n, T)``.

    Resource vector (Eq. 1): ``work_iter`` and ``work_epi`` ``(n, N_RES)`` in
    FLOPs or bytes, before the cache split: the memory columns hold the
    bytes *requested* from global memory, which the cache model splits into
    L1.5, L2 and DRAM traffic. ``rate`` ``(n, N_RES)`` per microsecond.
    """

    g0: np.ndarray
    g1: np.ndarray
    g2: np.ndarray
    order: np.ndarray
    group: np.ndarray
    ksteps: np.ndarray
    stages: np.ndarray
    smem_block: np.ndarray
    regs_thread: np.ndarray
    threads: np.ndarray
    warps: np.ndarray
    t_mask: np.ndarray
    t_per_step: np.ndarray
    t_bytes: np.ndarray
    work_iter: np.ndarray
    work_epi: np.ndarray
    rate: np.ndarray
    warps_full: float
    lat_us: np.ndarray
    ovh_iter_us: np.ndarray
    ovh_tile_us: np.ndarray
    launch_us: np.ndarray
    persistent: np.ndarray
    useful_flops: np.ndarray
    extra: dict = field(default_factory=dict)
    #: per-row tensor-core rate factor when several issue groups share an SM
    #: (:func:`tsbatch.kernels.envelope.envelope_one`); None means 1
    share_eff: np.ndarray | None = None
    #: per-row barrier stall per loop iteration (us), hidden by other resident tiles
    sync_us: np.ndarray | None = None
    #: per-row caps of the power-limited clock's boost of the tensor-core,
    #: shared-memory and CUDA-core rates, which the envelope applies to the last,
    #: partly filled wave of resident slots (:func:`tsbatch.kernels.envelope.wave_time`,
    #: ``tail_tc``); tc_clock_cap 0 or None: the lowered rates are final
    tc_clock_cap: np.ndarray | None = None
    smem_clock_cap: np.ndarray | None = None
    cuda_clock_cap: np.ndarray | None = None
    #: per-row chain of one iteration's best issue order (us, one issue stream at
    #: the SM's full rates; :mod:`tsbatch.kernels.dag`), None: no chain
    chain_us: np.ndarray | None = None
    #: per-row epilogue layout conversion of one tile through shared memory (us),
    #: serial between full waves (:func:`tsbatch.kernels.envelope.wave_time`); None: 0
    conv_us: np.ndarray | None = None
    #: per-row issue streams per tile that interleave their chains (None: 1)
    streams: np.ndarray | None = None
    #: per-row latency (us) of the next tile's copy where a loop does not prefetch
    #: although it has stages to (Triton's 2-stage FMA dot), exposed each
    #: iteration with its transfer (:func:`tsbatch.kernels.envelope.envelope_one`);
    #: None: none
    expose_us: np.ndarray | None = None
    #: per-row index of the winning legal order (None: the family has one order)
    order_idx: np.ndarray | None = None
    #: per-row 1-based index into ``rules`` of a rule the row breaks (0: none);
    #: such a row is infeasible with that rule's text as its reason
    blocked: np.ndarray | None = None
    rules: tuple = ()
    #: per-row block bytes of each tensor as the cache model sees them (its
    #: footprints and the cache problem's key), where they differ from the
    #: traffic ``t_bytes``: GEMM edge tiles fetch only their in-bound rows, but
    #: the cache model takes every block at its full size, so that problems of
    #: one grid share their cache results whatever m and n (None: ``t_bytes``)
    t_foot: np.ndarray | None = None
    #: per-row block bytes of each tensor for the tile the busiest SM runs, where
    #: they differ from ``t_bytes`` (GEMM edge tiles: ``t_bytes`` is the grid's
    #: average tile, the busiest SM runs whole ones), and the extra
    #: once-per-tile L2 and DRAM bytes of that tile ``(n, 2)``: the envelope
    #: takes these, the grid's totals ``t_bytes`` (None: ``t_bytes``, none)
    t_crit: np.ndarray | None = None
    epi_crit: np.ndarray | None = None
    #: per-row DRAM time per byte of each tensor's DRAM traffic relative to its
    #: ``t_bytes`` (runs shorter than the DRAM access; None: 1)
    t_dram_scale: np.ndarray | None = None
    #: per-row flag: the row broke a rule checked before lowering (sizes the model
    #: cannot represent, what the backend cannot build) and was lowered from
    #: placeholder values; its numbers mean nothing and results leave them null
    #: (None: no such row)
    unlowered: np.ndarray | None = None
    #: per-row local-memory bytes a loop iteration moves between L1 and L2: the
    #: registers of footprints spilled whole that do not fit the L1 the
    #: shared-memory carve-out leaves, read and written back each iteration; added
    #: to the L2 traffic after the cache split (their L1 traffic is in
    #: ``work_iter``'s shared-memory column; None: none)
    local_l2: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.g0.shape[0])


@dataclass(frozen=True)
class Family:
    """A kernel family: columns, problem key and lowering."""

    name: str
    columns: tuple[Column, ...]
    workload_columns: tuple[str, ...]
    lower: Callable[..., TilePlan] | None
    doc: str = ""
    #: a family that is not a tile grid on one GPU (collectives) evaluates its
    #: validated frame itself: ``evaluate(frame: polars.DataFrame, hw, engine) ->
    #: frame`` with the input columns followed by its result columns
    #: (``latency_us``, ``feasible``, ``infeasible_reason`` at least); ``lower``
    #: is then None. ``engine(frame, hw, family)`` is the engine's evaluator
    #: (:func:`tsbatch.engine.evaluate.evaluate`), for a family that composes tile
    #: families (the fused ones): handed in, so no family imports the engine
    evaluate: Callable | None = None
    #: the family's tile program (:class:`kernels_catalog.program.TileProgram`),
    #: for the families lowered from one
    program: object = None

    def column(self, name: str) -> Column:
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(name)


def same_object(values: np.ndarray) -> bool:
    """Whether every element of a non-empty object array is one Python object.

    Compares the element pointers (``tobytes`` of an object array: ~0.5 ns a
    row), where ``values == values[0]`` calls ``__eq__`` per row (~10 ns).
    ``False`` proves nothing: equal strings may be distinct objects."""
    ptr = np.frombuffer(values.tobytes(), dtype=np.intp)
    return bool((ptr == ptr[0]).all())


#: object arrays of at least this many rows are mapped once per distinct object
MAP_CODES_GROUP_MIN = 4096


def map_codes(values: np.ndarray, table: dict) -> np.ndarray:
    """Map an object array of strings to integer codes (``KeyError`` on a string
    not in ``table``): a dict lookup per row, ~45 ns, where sorting the strings
    took ~280 ns a row. A column of one value (by identity first: the validated
    columns hold one object per distinct string) is one lookup. A long column of
    few objects is looked up once per distinct object (grouped by the element
    pointers, ~10 ns a row, where the look-up and a comparison with the first
    value cost ~120 ns a row); equal strings that are distinct objects are only
    looked up again."""
    n = values.shape[0]
    if n and type(values[0]) is str and same_object(values):
        return np.full(n, table[values[0]], dtype=np.int64)  # one object
    if n >= MAP_CODES_GROUP_MIN:
        from tsbatch.kernels.rowhash import dedup_rows  # noqa: PLC0415

        ptr = np.frombuffer(values.tobytes(), dtype=np.intp).astype(np.int64, copy=False)
        inv, rep = dedup_rows(ptr.reshape(-1, 1))
        if rep.shape[0] * 8 <= n:
            codes = np.fromiter(map(table.__getitem__, values[rep]), dtype=np.int64,
                                count=rep.shape[0])
            return codes[inv]
    if n and type(values[0]) is str and (values == values[0]).all():
        return np.full(n, table[values[0]], dtype=np.int64)  # one value
    return np.fromiter(map(table.__getitem__, values), dtype=np.int64, count=n)


#: the tensor-core instruction paths a plan's rows take, indexed by their code
MMA_PATHS = ("fma", "mma_sync", "wgmma")


def mma_path_extra(code: np.ndarray) -> dict:
    """A plan's ``extra`` entries for its rows' instruction paths (codes into
    :data:`MMA_PATHS`): ``mma_path``, the names (an object array, which callers of
    the plan read), and ``mma_path_code``, the codes (the evaluator makes its text
    column from them by a gather, where polars would convert 100k Python strings in
    ~5 ms)."""
    return {"mma_path": np.array(MMA_PATHS, dtype=object)[code], "mma_path_code": code}


#: the model's integer quantities (grid tiles, tile iterations, shared-memory
#: bytes) stay below this, far inside int64
SIZE_LIMIT = float(2 ** 62)
#: most tiles (programs) of one launch: CUDA's gridDim.x limit, which also bounds
#: the cache model's per-launch arrays (waves, blocks)
MAX_GRID_TILES = float(2 ** 31 - 1)
#: most distinct operand blocks of one launch the cache model keeps a record of
#: (its memory grows with them: ~40 bytes each)
MAX_CACHE_BLOCKS = float(2 ** 24)


def first_rule(checks, n: int, start: int = 0, code: np.ndarray | None = None) -> np.ndarray:
    """Per row, ``start`` + the 1-based index of the first of ``checks`` (boolean
    arrays, or scalars broadcast to ``n`` rows) that holds, keeping the nonzero
    entries of ``code`` (0: none holds)."""
    code = np.zeros(n, dtype=np.int64) if code is None else code.copy()
    for j, hit in enumerate(checks):
        code = np.where((code == 0) & np.broadcast_to(hit, (n,)), start + j + 1, code)
    return code


def clamp_group(group: np.ndarray, g0: np.ndarray) -> np.ndarray:
    """A super-group taller than the grid orders the tiles as one of the grid's
    height does (Triton's grouped order); the clamp keeps absurd values from
    wrapping the order kernel's products."""
    return np.where(group > 2 ** 31, np.maximum(g0, 1), group)
