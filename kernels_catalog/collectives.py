"""Collectives across GPUs (all-reduce, all-gather, reduce-scatter, all-to-all, send/recv).

Not a tile grid: the family evaluates its validated frame itself
(:func:`tsbatch.collectives.model.evaluate`): each configuration is planned once
(stages of logical exchanges routed over the system's links,
:mod:`tsbatch.collectives.plan`) and the batched α–β kernel
(:mod:`tsbatch.kernels.alphabeta`, TileSight Eq. 11) costs every message size.
"""

from __future__ import annotations

from kernels_catalog.base import Column, Family

__all__ = ["FAMILY", "COLUMNS", "evaluate"]

COLUMNS = (
    Column("system", "str", "a hw/systems file stem or alias (e.g. dgx_a100, a100_dgx, hgx_b200)"),
    Column("collective", "str", "collective operation",
           choices=("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")),
    Column("num_gpus", "int", "ranks taking part", positive=True),
    Column("gpus_per_node", "int", "ranks per node (default: the system's, up to num_gpus)",
           required=False, positive=True),
    Column("bytes", "int", "message size (nccl-tests convention, see docs/collectives.md)", positive=True),
    Column("algorithm", "str", "force an algorithm (default, null or auto: chosen as NCCL does)",
           required=False,
           choices=("ring", "tree", "nvls", "recursive_doubling", "rabenseifner", "direct", "auto")),
    Column("protocol", "str", "force NCCL's protocol (default, null or auto: chosen)",
           required=False, choices=("ll", "ll128", "simple", "auto")),
    Column("channels", "int", "NCCL channels (default: one per NVLink link, 2 on PCIe)",
           required=False, positive=True),
)


def evaluate(frame, hw=None, engine=None):
    """Input columns followed by ``latency_us, feasible, infeasible_reason, algorithm_used,
    protocol_used, stages, bottleneck_link, alg_bw_gbps, bus_bw_gbps``."""
    from tsbatch.collectives.model import evaluate as _evaluate

    return _evaluate(frame, hw)


FAMILY = Family(
    name="collective",
    columns=COLUMNS,
    workload_columns=("system", "collective", "num_gpus", "gpus_per_node", "bytes"),
    lower=None,
    doc=__doc__,
    evaluate=evaluate,
)
