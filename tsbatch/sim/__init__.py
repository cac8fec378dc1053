"""GTSim-style event-driven tile-graph simulator (``docs/sim.md``).

Build a :class:`TileGraph` (builders or a JSON file), pick a
:class:`Machine` (:func:`machine_from_hw`) and :func:`simulate` it.
"""

from tsbatch.sim.builders import (
    PIPELINES,
    flash_attention3_graph,
    gemm_graph,
    gemm_silu_graph,
    grouped_order,
)
from tsbatch.sim.engine import SimResult, simulate
from tsbatch.sim.graph import EDGE_DATA, EDGE_ORDER, OPS, GraphBuilder, Tensor, TileGraph
from tsbatch.sim.machine import Machine, SimParams, machine_from_hw, residency

__all__ = [
    "PIPELINES",
    "EDGE_DATA",
    "EDGE_ORDER",
    "OPS",
    "GraphBuilder",
    "Machine",
    "SimParams",
    "SimResult",
    "Tensor",
    "TileGraph",
    "flash_attention3_graph",
    "gemm_graph",
    "gemm_silu_graph",
    "grouped_order",
    "machine_from_hw",
    "residency",
    "simulate",
]
