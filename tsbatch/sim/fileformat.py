"""The tile-graph file format (JSON), for graphs built outside tsbatch.

GTSim §4.3 lets users hand the simulator a graph directly by "specifying its
node descriptors, execution groups, and data/order edges". A file is one
JSON object (format documented in ``docs/sim.md``)::

    {
      "format": "tsbatch.tilegraph", "version": 1, "name": "my_gemm",
      "cta": {"warps": 8, "smem_bytes": 65536, "regs_per_thread": 128,
              "mma_dtype": "float16", "mma_kind": "warpgroup"},
      "grid": {"grid_m": 4, "grid_n": 4, "group_m": 1},
      "tensors": [{"name": "A", "rows": 512, "cols": 256, "dtype": "float16",
                   "row_major": true}, ...],
      "nodes": [
        {"id": "ldA0", "op": "tma_load", "warps": [0, 1], "group": 0,
         "tile": {"tensor": "A", "shape": [128, 64], "coord": [0, 1, 0, 0, 0, 0]}},
        {"id": "mma0", "op": "mma", "warps": [4, 4], "group": 1, "work": 2097152},
        ...
      ],
      "edges": [["ldA0", "mma0", "data"], ["mma0", "mma1", "order"], ...]
    }

``grid`` is either ``{"grid_m", "grid_n", "group_m"}`` (Triton's grouped
launch order) or explicit ``{"cta_m": [...], "cta_n": [...]}`` lists.
``coord`` is ``[row0, row_m, row_n, col0, col_m, col_n]``: the tile's row
index is ``row0 + row_m * cta_m + row_n * cta_n`` (in tiles), likewise the
column. ``work`` is FLOPs (``mma``), element operations (``alu``, ``sfu``),
bytes (``smem``) or a fixed delay in cycles (``sync``); memory ops take
their bytes from the tile.
"""

from __future__ import annotations

import json
from pathlib import Path

from tsbatch.errors import InputError
from tsbatch.sim.builders import grouped_order
from tsbatch.sim.graph import EDGE_DATA, OPS, STORAGE, GraphBuilder, Tensor, TileGraph

__all__ = ["FORMAT", "VERSION", "graph_to_dict", "graph_from_dict", "load_graph", "save_graph"]

FORMAT = "tsbatch.tilegraph"
VERSION = 1
_DTYPE_OF_BYTES = {1: "float8", 2: "float16", 4: "float32"}


def graph_to_dict(g: TileGraph) -> dict:
    """The JSON-ready description of a graph (explicit CTA lists)."""
    nodes = []
    for v in range(g.n_nodes):
        d = {"id": g.labels[v] if g.labels else f"n{v}", "op": OPS[int(g.op[v])],
             "warps": [int(g.warp0[v]), int(g.n_warps[v])], "group": int(g.group[v])}
        if g.tensor[v] >= 0:
            d["tile"] = {"tensor": g.tensors[int(g.tensor[v])].name,
                         "shape": [int(g.tile_rows[v]), int(g.tile_cols[v])],
                         "coord": [int(c) for c in g.coord[v]],
                         "storage": STORAGE[int(g.storage[v])]}
        else:
            d["work"] = float(g.work[v])
        nodes.append(d)
    ids = [nd["id"] for nd in nodes]
    if len(set(ids)) != len(ids):
        for v, nd in enumerate(nodes):
            nd["id"] = f"{nd['id']}#{v}"
        ids = [nd["id"] for nd in nodes]
    edges = [[ids[u], ids[w], "data" if k == EDGE_DATA else "order"] for u, w, k in g.edges()]
    return {
        "format": FORMAT, "version": VERSION, "name": g.name,
        "cta": {"warps": g.warps_per_cta, "smem_bytes": g.smem_bytes_per_cta,
                "regs_per_thread": g.regs_per_thread, "mma_dtype": g.mma_dtype, "mma_kind": g.mma_kind},
        "grid": {"cta_m": [int(x) for x in g.cta_m], "cta_n": [int(x) for x in g.cta_n]},
        "tensors": [{"name": t.name, "rows": t.rows, "cols": t.cols, "dtype": t.dtype,
                     "row_major": t.row_major} for t in g.tensors],
        "nodes": nodes,
        "edges": edges,
    }


def _get(d: dict, key: str, where: str, typ=None):
    if not isinstance(d, dict) or key not in d:
        raise InputError(f"{where}: missing '{key}'")
    val = d[key]
    if typ is not None and (not isinstance(val, typ) or isinstance(val, bool) and typ is not bool):
        raise InputError(f"{where}: '{key}' must be {getattr(typ, '__name__', typ)}, got {val!r}")
    return val


def graph_from_dict(doc: dict, source: str = "<graph>") -> TileGraph:
    """Validate and build a :class:`TileGraph` from its JSON description."""
    if not isinstance(doc, dict):
        raise InputError(f"{source}: top level must be a JSON object")
    if doc.get("format") != FORMAT:
        raise InputError(f"{source}: 'format' must be {FORMAT!r}, got {doc.get('format')!r}")
    if doc.get("version") != VERSION:
        raise InputError(f"{source}: unsupported version {doc.get('version')!r} (expected {VERSION})")
    b = GraphBuilder(str(doc.get("name", Path(source).stem)))
    for i, t in enumerate(_get(doc, "tensors", source, list)):
        w = f"{source}: tensors[{i}]"
        b.tensor(Tensor(_get(t, "name", w, str), _get(t, "rows", w, int), _get(t, "cols", w, int),
                        _get(t, "dtype", w, str), bool(t.get("row_major", True))))
    index: dict[str, int] = {}
    for i, nd in enumerate(_get(doc, "nodes", source, list)):
        w = f"{source}: nodes[{i}]"
        nid = str(_get(nd, "id", w))
        if nid in index:
            raise InputError(f"{w}: duplicate id {nid!r}")
        warps = _get(nd, "warps", w, list)
        if len(warps) != 2 or not all(isinstance(x, int) for x in warps):
            raise InputError(f"{w}: 'warps' must be [first_warp, n_warps], got {warps!r}")
        op = _get(nd, "op", w, str)
        kw = {}
        if "tile" in nd:
            tile = nd["tile"]
            shape = _get(tile, "shape", w + ".tile", list)
            coord = tile.get("coord", [0, 0, 0, 0, 0, 0])
            if len(shape) != 2 or len(coord) != 6:
                raise InputError(f"{w}.tile: shape needs 2 numbers and coord 6, got {shape!r}, {coord!r}")
            kw = {"tensor": _get(tile, "tensor", w + ".tile", str), "tile": tuple(int(x) for x in shape),
                  "coord": tuple(int(x) for x in coord)}
            if "storage" in tile:
                if tile["storage"] not in STORAGE:
                    raise InputError(f"{w}.tile: storage must be one of {STORAGE}, got {tile['storage']!r}")
                kw["storage"] = tile["storage"]
        work = nd.get("work", 0.0)
        if isinstance(work, bool) or not isinstance(work, (int, float)):
            raise InputError(f"{w}: 'work' must be a number, got {work!r}")
        index[nid] = b.node(op, warps=(warps[0], warps[1]), group=int(nd.get("group", 0)),
                            work=float(work), label=nid, **kw)
    for i, e in enumerate(_get(doc, "edges", source, list)):
        if not (isinstance(e, list) and len(e) == 3):
            raise InputError(f"{source}: edges[{i}] must be [src, dst, 'data'|'order'], got {e!r}")
        src, dst, kind = e
        if src not in index or dst not in index:
            raise InputError(f"{source}: edges[{i}] names unknown node {src if src not in index else dst!r}")
        if kind == "data":
            b.data(index[src], index[dst])
        elif kind == "order":
            b.order(index[src], index[dst])
        else:
            raise InputError(f"{source}: edges[{i}] kind must be 'data' or 'order', got {kind!r}")
    cta = _get(doc, "cta", source, dict)
    grid = _get(doc, "grid", source, dict)
    if "cta_m" in grid:
        cm, cn = _get(grid, "cta_m", source + ".grid", list), _get(grid, "cta_n", source + ".grid", list)
    else:
        gm = _get(grid, "grid_m", source + ".grid", int)
        gn = _get(grid, "grid_n", source + ".grid", int)
        if gm <= 0 or gn <= 0:
            raise InputError(f"{source}.grid: grid_m and grid_n must be positive, got {gm}, {gn}")
        cm, cn = grouped_order(gm, gn, int(grid.get("group_m", 1)))
    return b.build(cta_m=cm, cta_n=cn, warps_per_cta=_get(cta, "warps", source + ".cta", int),
                   smem_bytes_per_cta=int(cta.get("smem_bytes", 0)),
                   regs_per_thread=int(cta.get("regs_per_thread", 64)),
                   mma_dtype=str(cta.get("mma_dtype", "float16")),
                   mma_kind=str(cta.get("mma_kind", "warpgroup")))


def load_graph(path: str | Path) -> TileGraph:
    """Read a graph file."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except OSError as exc:
        raise InputError(f"{p}: cannot read graph file ({exc.strerror})") from exc
    except json.JSONDecodeError as exc:
        raise InputError(f"{p}: invalid JSON ({exc})") from exc
    return graph_from_dict(doc, str(p))


def save_graph(g: TileGraph, path: str | Path) -> None:
    """Write a graph file."""
    Path(path).write_text(json.dumps(graph_to_dict(g), indent=1))
