"""Collectives across GPUs: systems, routing, stage decomposition, NCCL-like choice.

TileSight §3.6 (Eq. 11; Algorithm 1 lines 5-15): a collective is decomposed
into ordered stages of logical exchanges (source, destination, bytes), routed
over the system's links, and each stage costs its hop latency plus the
serialization of its bottleneck link. See ``docs/collectives.md``.
"""

from tsbatch.collectives.systems import System, get_system, list_systems

__all__ = ["System", "get_system", "list_systems"]
