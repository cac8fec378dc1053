"""The warp-centric tile graph (GTSim §4.1) and its isomorphic-CTA template.

A kernel is a DAG ``G = (V, E)``. Every node is one tile-level operation
with an operation type (which fixes the hardware resource that serves it),
the warps that execute it (a single warp, a producer warp, a whole warp
group) and a tile descriptor (storage level, dtype, shape, layout and the
logical coordinates of the tile inside its parent tensor). Edges are *data*
edges (producer -> consumer, released when the producer completes) or
*order* edges (program order within a warp, signal/wait pairs, barriers,
buffer-slot reuse; released when the source issues).

Isomorphic CTAs share one template (GTSim §6, "Graph construction"): the
template holds the nodes and edges of one CTA once; tile coordinates are
affine in the CTA's grid coordinates ``(cta_m, cta_n)``, so per-CTA state is
only the pair of coordinates and the runtime counters. A 4096^3 GEMM is one
template of a few hundred physical nodes standing for hundreds of thousands
of logical ones.

Coordinates are in units of tiles: a node's tile covers rows
``[row * tile_rows, (row + 1) * tile_rows)`` of its tensor with
``row = row0 + row_m * cta_m + row_n * cta_n`` (and the same for columns),
clipped to the tensor's extent like a TMA box.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from tsbatch.errors import InputError

__all__ = [
    "OPS",
    "OP_RESOURCE",
    "RESOURCES",
    "STORAGE",
    "DTYPE_BYTES",
    "EDGE_DATA",
    "EDGE_ORDER",
    "Tensor",
    "TileGraph",
    "GraphBuilder",
]

#: operation types; the index is the op code stored in ``TileGraph.op``
OPS = (
    "tma_load",   # bulk global -> shared copy by the TMA engine
    "ldg",        # cp.async / ld.global: global -> shared through the LSU
    "mma",        # tensor-core matrix multiply (mma.sync, wgmma, tcgen05)
    "alu",        # CUDA-core elementwise / reduction work
    "sfu",        # special-function work (exp, rcp, ...)
    "smem",       # shared-memory load/store (epilogue staging, fragment loads)
    "tma_store",  # bulk shared -> global copy by the TMA engine
    "stg",        # st.global through the LSU
    "sync",       # barrier, arrive, wait: takes no resource time
)
#: resources; ``RESOURCES[OP_RESOURCE[op]]`` serves op
RESOURCES = ("none", "tensor", "cuda", "sfu", "smem", "tma", "lsu")
OP_RESOURCE = np.array([5, 6, 1, 2, 3, 4, 5, 6, 0], dtype=np.int32)
#: storage levels of a tile descriptor
STORAGE = ("global", "shared", "register", "tmem")
DTYPE_BYTES = {
    "float8": 1, "float16": 2, "bfloat16": 2, "tf32": 4, "float32": 4,
}
EDGE_DATA = 0
EDGE_ORDER = 1
_MEMORY_OPS = (0, 1, 6, 7)
_STORE_OPS = (6, 7)


@dataclass(frozen=True)
class Tensor:
    """A global tensor addressed by tiles (row-major unless ``row_major`` is False)."""

    name: str
    rows: int
    cols: int
    dtype: str
    row_major: bool = True

    @property
    def elem_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]


@dataclass(frozen=True)
class TileGraph:
    """One CTA template plus the launch grid: the whole kernel.

    Node arrays have one entry per template node (``n_nodes``); edge arrays
    are in CSR form over successors. ``cta_m``/``cta_n`` list the grid
    coordinates of every logical CTA in launch order.

    Attributes
    ----------
    name : str
    op, warp0, n_warps, group : int32 arrays
        Operation code (index into :data:`OPS`), first warp, warp count and
        warp-group index of the executing warps.
    work : float64 array
        FLOPs for ``mma``, element operations for ``alu``/``sfu``, bytes for
        ``smem``; memory nodes take their bytes from the tile descriptor.
    storage, dtype_bytes, tile_rows, tile_cols : int32 arrays
        Tile descriptor: storage level, element size, shape.
    tensor : int32 array
        Index into ``tensors`` for memory nodes, -1 otherwise.
    coord : int32 array, shape (n_nodes, 6)
        ``(row0, row_m, row_n, col0, col_m, col_n)`` affine tile coordinates.
    succ_ptr, succ_idx, succ_kind : int32 arrays
        Successor lists (kind :data:`EDGE_DATA` or :data:`EDGE_ORDER`).
    n_pred : int32 array
        Incoming edge count of every node (data + order).
    tensors : tuple of Tensor
    cta_m, cta_n : int32 arrays
        Grid coordinates of each logical CTA, in launch order.
    warps_per_cta, smem_bytes_per_cta, regs_per_thread : int
        Residency demands of one CTA.
    mma_dtype : str
        Input dtype of the tensor-core work (selects the peak rate).
    mma_kind : str
        ``"warpgroup"`` (wgmma / tcgen05), ``"warp"`` (mma.sync) or ``"fma"``
        (no tensor cores: fp32 on CUDA cores).
    labels : tuple of str
        Human-readable node names (for traces).
    """

    name: str
    op: np.ndarray
    warp0: np.ndarray
    n_warps: np.ndarray
    group: np.ndarray
    work: np.ndarray
    storage: np.ndarray
    dtype_bytes: np.ndarray
    tile_rows: np.ndarray
    tile_cols: np.ndarray
    tensor: np.ndarray
    coord: np.ndarray
    succ_ptr: np.ndarray
    succ_idx: np.ndarray
    succ_kind: np.ndarray
    n_pred: np.ndarray
    tensors: tuple
    cta_m: np.ndarray
    cta_n: np.ndarray
    warps_per_cta: int
    smem_bytes_per_cta: int
    regs_per_thread: int
    mma_dtype: str = "float16"
    mma_kind: str = "warpgroup"
    labels: tuple = field(default=(), compare=False)

    @property
    def n_nodes(self) -> int:
        return int(self.op.shape[0])

    @property
    def n_edges(self) -> int:
        return int(self.succ_idx.shape[0])

    @property
    def n_ctas(self) -> int:
        return int(self.cta_m.shape[0])

    @property
    def n_logical_nodes(self) -> int:
        return self.n_nodes * self.n_ctas

    def edges(self) -> list[tuple[int, int, int]]:
        """All edges as ``(src, dst, kind)`` triples."""
        out = []
        for u in range(self.n_nodes):
            for e in range(self.succ_ptr[u], self.succ_ptr[u + 1]):
                out.append((u, int(self.succ_idx[e]), int(self.succ_kind[e])))
        return out

    def without_edges(self, kind: int | None = None, where=None) -> "TileGraph":
        """A copy with some edges removed (the ablation of GTSim Table 4).

        Parameters
        ----------
        kind : int or None
            Remove every edge of this kind (``EDGE_ORDER`` for "no order
            constraints").
        where : callable or None
            ``where(src, dst, kind) -> bool``: remove the edges it accepts.
        """
        keep = []
        for u, v, k in self.edges():
            drop = (kind is not None and k == kind) or (where is not None and where(u, v, k))
            if not drop:
                keep.append((u, v, k))
        ptr, idx, knd, npred = _csr(self.n_nodes, keep)
        return _replace(self, succ_ptr=ptr, succ_idx=idx, succ_kind=knd, n_pred=npred)

    def memory_nodes(self) -> np.ndarray:
        return np.flatnonzero(np.isin(self.op, _MEMORY_OPS))


def _replace(g: TileGraph, **kw) -> TileGraph:
    import dataclasses

    return dataclasses.replace(g, **kw)


def _csr(n: int, edges: Sequence[tuple[int, int, int]]):
    order = sorted(range(len(edges)), key=lambda i: (edges[i][0], i))
    ptr = np.zeros(n + 1, dtype=np.int32)
    idx = np.empty(len(edges), dtype=np.int32)
    knd = np.empty(len(edges), dtype=np.int32)
    npred = np.zeros(n, dtype=np.int32)
    for j, i in enumerate(order):
        u, v, k = edges[i]
        ptr[u + 1] += 1
        idx[j] = v
        knd[j] = k
        npred[v] += 1
    np.cumsum(ptr, out=ptr)
    return ptr, idx, knd, npred


class GraphBuilder:
    """Mutable helper that collects nodes and edges and freezes a :class:`TileGraph`.

    Builders call :meth:`node` for each tile operation and :meth:`data` /
    :meth:`order` for edges; :meth:`build` checks acyclicity and freezes.
    """

    def __init__(self, name: str):
        self.name = name
        self._nodes: list[tuple] = []
        self._labels: list[str] = []
        self._edges: list[tuple[int, int, int]] = []
        self._tensors: list[Tensor] = []
        self._tensor_index: dict[str, int] = {}

    def tensor(self, t: Tensor) -> int:
        if t.dtype not in DTYPE_BYTES:
            raise InputError(f"tensor {t.name!r}: unknown dtype {t.dtype!r}")
        if t.rows <= 0 or t.cols <= 0:
            raise InputError(f"tensor {t.name!r}: shape must be positive, got {t.rows}x{t.cols}")
        self._tensor_index[t.name] = len(self._tensors)
        self._tensors.append(t)
        return self._tensor_index[t.name]

    def node(
        self,
        op: str,
        *,
        warps: tuple[int, int],
        group: int = 0,
        work: float = 0.0,
        label: str = "",
        tensor: str | None = None,
        tile: tuple[int, int] = (0, 0),
        coord: tuple[int, int, int, int, int, int] = (0, 0, 0, 0, 0, 0),
        storage: str | None = None,
        dtype: str = "float16",
    ) -> int:
        """Add a node; returns its index.

        ``warps = (first_warp, n_warps)``; ``tile = (rows, cols)``;
        ``coord = (row0, row_m, row_n, col0, col_m, col_n)``.
        """
        if op not in OPS:
            raise InputError(f"unknown op {op!r}; known: {', '.join(OPS)}")
        code = OPS.index(op)
        if warps[1] <= 0 or warps[0] < 0:
            raise InputError(f"node {label or len(self._nodes)}: bad warps {warps}")
        t = -1
        if code in _MEMORY_OPS:
            if tensor not in self._tensor_index:
                raise InputError(f"node {label or len(self._nodes)}: memory op needs a known tensor, got {tensor!r}")
            t = self._tensor_index[tensor]
            if tile[0] <= 0 or tile[1] <= 0:
                raise InputError(f"node {label}: tile shape must be positive, got {tile}")
            dtype = self._tensors[t].dtype
        elif work < 0:
            raise InputError(f"node {label}: work must be >= 0, got {work}")
        if storage is None:
            storage = "global" if code in _MEMORY_OPS else ("shared" if op == "smem" else "register")
        if dtype not in DTYPE_BYTES:
            raise InputError(f"node {label}: unknown dtype {dtype!r}")
        self._nodes.append(
            (code, warps[0], warps[1], group, float(work), STORAGE.index(storage),
             DTYPE_BYTES[dtype], tile[0], tile[1], t, tuple(int(c) for c in coord))
        )
        self._labels.append(label or f"{op}{len(self._nodes) - 1}")
        return len(self._nodes) - 1

    def data(self, src: int, dst: int) -> None:
        self._edge(src, dst, EDGE_DATA)

    def order(self, src: int, dst: int) -> None:
        self._edge(src, dst, EDGE_ORDER)

    def _edge(self, src: int, dst: int, kind: int) -> None:
        n = len(self._nodes)
        if not (0 <= src < n and 0 <= dst < n) or src == dst:
            raise InputError(f"edge {src}->{dst}: endpoints must be distinct existing nodes")
        self._edges.append((src, dst, kind))

    def build(
        self,
        *,
        cta_m: Sequence[int],
        cta_n: Sequence[int],
        warps_per_cta: int,
        smem_bytes_per_cta: int,
        regs_per_thread: int,
        mma_dtype: str = "float16",
        mma_kind: str = "warpgroup",
    ) -> TileGraph:
        n = len(self._nodes)
        if n == 0:
            raise InputError(f"graph {self.name!r} has no nodes")
        cols = list(zip(*self._nodes))
        ptr, idx, knd, npred = _csr(n, self._edges)
        _check_acyclic(n, ptr, idx, self._labels)
        cm = np.asarray(cta_m, dtype=np.int32)
        cn = np.asarray(cta_n, dtype=np.int32)
        if cm.shape != cn.shape or cm.size == 0:
            raise InputError("cta_m and cta_n must be non-empty and of equal length")
        if mma_kind not in ("warpgroup", "warp", "fma"):
            raise InputError(f"mma_kind must be warpgroup, warp or fma, got {mma_kind!r}")
        if mma_dtype not in DTYPE_BYTES:
            raise InputError(f"unknown mma_dtype {mma_dtype!r}")
        max_warp = max(w0 + nw for w0, nw in zip(cols[1], cols[2]))
        if max_warp > warps_per_cta:
            raise InputError(f"a node uses warp {max_warp - 1} but warps_per_cta is {warps_per_cta}")
        return TileGraph(
            name=self.name,
            op=np.array(cols[0], dtype=np.int32),
            warp0=np.array(cols[1], dtype=np.int32),
            n_warps=np.array(cols[2], dtype=np.int32),
            group=np.array(cols[3], dtype=np.int32),
            work=np.array(cols[4], dtype=np.float64),
            storage=np.array(cols[5], dtype=np.int32),
            dtype_bytes=np.array(cols[6], dtype=np.int32),
            tile_rows=np.array(cols[7], dtype=np.int32),
            tile_cols=np.array(cols[8], dtype=np.int32),
            tensor=np.array(cols[9], dtype=np.int32),
            coord=np.array(cols[10], dtype=np.int32).reshape(n, 6),
            succ_ptr=ptr,
            succ_idx=idx,
            succ_kind=knd,
            n_pred=npred,
            tensors=tuple(self._tensors),
            cta_m=cm,
            cta_n=cn,
            warps_per_cta=int(warps_per_cta),
            smem_bytes_per_cta=int(smem_bytes_per_cta),
            regs_per_thread=int(regs_per_thread),
            mma_dtype=mma_dtype,
            mma_kind=mma_kind,
            labels=tuple(self._labels),
        )


def _check_acyclic(n: int, ptr: np.ndarray, idx: np.ndarray, labels: Sequence[str]) -> None:
    indeg = np.zeros(n, dtype=np.int64)
    for v in idx:
        indeg[v] += 1
    stack = [u for u in range(n) if indeg[u] == 0]
    seen = 0
    while stack:
        u = stack.pop()
        seen += 1
        for e in range(ptr[u], ptr[u + 1]):
            v = idx[e]
            indeg[v] -= 1
            if indeg[v] == 0:
                stack.append(int(v))
    if seen != n:
        bad = [labels[i] for i in range(n) if indeg[i] > 0][:5]
        raise InputError(f"tile graph has a cycle through nodes {bad}")
