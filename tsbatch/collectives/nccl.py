"""NCCL's tuning model: base latencies, per-hop latencies, protocol bandwidth factors.

Facts read from NVIDIA NCCL ``src/graph/tuning.cc`` (version 2.19, commit
b6475625fbcaa2c3c0e50eed2fa1255d7514d4a2, function ``ncclTopoTuneModel``);
no code copied. NCCL predicts a collective as ``latency + bytes / bandwidth``
per (algorithm, protocol) and runs the fastest; its tables are:

- ``baseLat[algo][proto]``: fixed cost per call (us); Tree {6.8, 14, 0},
  Ring {6.6, 14, 8.4}, NVLS 0 (LL, LL128, Simple).
- ``hwLat[hw][algo][proto]``: latency per step (us) on NVLink / PCI / network;
  Ring NVLink {0.6, 1.9, 3.4}, PCI {1.0, 2.5, 5.7}, NET {2.7, 4.0, 14.0};
  Tree NVLink {0.6, 1.25, 28}, PCI {1.0, 1.9, 28}, NET {5.0, 8.5, 28};
  NVLS Simple: NVLink 23, NET 18.
- Protocol bandwidth refinements of the bus bandwidth: Ring LL x 1/4 (all-reduce
  or several nodes, else 1/3), capped at ``llMaxBw`` (87.7 GB/s on one Ampere
  or Hopper node, 22.5 on two nodes, 19.0 beyond); Ring LL128 x 0.92 (0.7 with
  under 2 GPUs per node), capped at channels x ``perChMaxRingLL128Bw`` (20 GB/s
  Ampere, 36.7 Hopper); Tree x 0.92 capped at channels x ``perChMaxTreeBw``
  (Ampere 24 / 23.6 / 17.8, Hopper 38.7 / 41.4 / 36.0 for 1 / 2 / more nodes),
  Tree LL x 1/3.8 (cap ``llMaxBw``), Tree LL128 x 7/9 on one node, 120/128 on
  several (cap channels x ``perChMaxTreeLL128Bw``: 20 Ampere, 36.7 Hopper).
- LL128 is enabled by default only on NVLink systems of one compute capability.

tsbatch keeps NCCL's *latencies* and *protocol factors* but replaces NCCL's
single bus bandwidth by the routed Eq. 11 serialization over the system's
links, so the stage decomposition, not a table, carries the topology.
"""

from __future__ import annotations

import math

__all__ = ["PROTOCOLS", "ALGORITHMS", "HW_LAT_US", "BASE_LAT_US", "TREE_CORRECTION",
           "P2P_LL_THRESHOLD_BYTES", "proto_bandwidth", "hop_latency_us", "base_latency_us",
           "selection_model", "arch_index", "kind_of", "channel_unit_bytes"]

PROTOCOLS = ("ll", "ll128", "simple")
#: algorithms tsbatch decomposes; "nccl" ones are those NCCL's tuner chooses among
ALGORITHMS = ("ring", "tree", "nvls", "recursive_doubling", "rabenseifner", "direct")

#: hwLat[hw class][algorithm kind][protocol], us (NCCL 2.19)
HW_LAT_US = {
    "nvlink": {"ring": (0.6, 1.9, 3.4), "tree": (0.6, 1.25, 28.0), "nvls": (0.0, 0.0, 23.0)},
    "pci": {"ring": (1.0, 2.5, 5.7), "tree": (1.0, 1.9, 28.0), "nvls": (0.0, 0.0, 0.0)},
    "net": {"ring": (2.7, 4.0, 14.0), "tree": (5.0, 8.5, 28.0), "nvls": (0.0, 0.0, 18.0)},
}
#: baseLat[algorithm kind][protocol], us (NCCL 2.19)
BASE_LAT_US = {"ring": (6.6, 14.0, 8.4), "tree": (6.8, 14.0, 0.0), "nvls": (0.0, 0.0, 0.0)}

_LL_MAX_BW = (87.7, 22.5, 19.0)  # Ampere / Hopper, by nodes 1 / 2 / more
_RING_LL128_PER_CH = {"ampere": 20.0, "hopper": 36.7, "blackwell": 36.7}
_TREE_PER_CH = {"ampere": (24.0, 23.6, 17.8), "hopper": (38.7, 41.4, 36.0),
                "blackwell": (38.7, 41.4, 36.0)}
_TREE_LL128_PER_CH = {"ampere": (20.0, 20.0, 20.0), "hopper": (36.7, 36.7, 29.0),
                      "blackwell": (36.7, 36.7, 29.0)}


#: treeCorrectionFactor[protocol][log2(bytes / 64)], NCCL 2.19 ``ncclTopoGetAlgoTime``:
#: tree bandwidth multipliers for sizes 64 B ... 256 MiB (1 beyond)
TREE_CORRECTION = (
    (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9),
)
#: NCCL_P2P_LL_THRESHOLD default: point-to-point messages up to this size use LL
P2P_LL_THRESHOLD_BYTES = 16384
#: search.cc (ncclTopoCompute, pass 2): a tree graph's bwIntra rises while it is under
#: twice its bwInter; tuning.cc uses bwIntra for every algorithm on up to two nodes
TREE_2NODE_BW_FACTOR = 2.0
#: ncclTopoGetAlgoTime: ring/Simple all-reduce latency x1.4 on several nodes (compute capability >= 8.0)
RING_PLATEAU_LAT = 1.4
#: NCCL ``src/include/comm.h``: per-thread bytes before another channel (LL, LL128, Simple);
#: the ring LL threshold is multiplied by the rank count (``tuning.cc``)
THREAD_THRESHOLD = (8, 8, 64)
#: ``src/include/device.h``: NCCL_LL_MAX_NTHREADS, NCCL_LL128_MAX_NTHREADS, NCCL_SIMPLE_MAX_NTHREADS
MAX_NTHREADS = (512, 640, 512)
#: ``src/graph/topo.h`` PCI_BW: a ring of at most this bus bandwidth runs Simple on 256 threads
PCI_BW_GBPS = 12.0
#: ``src/include/comm.h`` DEFAULT_BUFFER_SIZE_BYTES: NCCL_BUFFSIZE, 4 MiB per channel and peer
NCCL_BUFFSIZE_BYTES = float(1 << 22)
#: network post overhead per inter-node ring step (us; x3 for Simple), NCCL 2.19 getNetOverhead (x86)
NET_OVERHEAD_US = 1.0


def selection_model(algorithm: str, protocol: str, collective: str, n: int, nodes: int,
                    bus_bw_gbps: float, channels: int, arch: str, intra_hw: str,
                    system_base_us: float, alpha_ll: dict) -> tuple[float, float]:
    """NCCL's own (latency us, algorithm bandwidth GB/s) of one algorithm and protocol.

    ``bus_bw_gbps`` stands for NCCL's ``nChannels x bwIntra`` (its topology
    search result): tsbatch passes the bus bandwidth of the routed ring.
    ``alpha_ll`` maps hardware class -> the system's LL hop latency.
    """
    p = PROTOCOLS.index(protocol)
    kind = kind_of(algorithm)
    ppn = n / nodes
    eff, cap = proto_bandwidth(algorithm, protocol, collective, nodes, ppn, channels, arch)
    if kind == "tree" and nodes == 2:
        # search.cc pass 2 raises a tree graph's bwIntra up to twice its bwInter, and
        # tuning.cc rates every algorithm by bwIntra on up to two nodes (the ring's
        # bwIntra stays equal to its bwInter): NCCL rates the 2-node tree 2x the ring
        bus_bw_gbps = TREE_2NODE_BW_FACTOR * bus_bw_gbps
    bus = min(bus_bw_gbps * eff, cap)
    if kind == "ring":
        nsteps = 2 * (n - 1) if collective == "all_reduce" else n - 1
        ratio = n / nsteps
    elif kind == "tree":
        ratio = 0.5
    else:
        ratio = 5.0 / 6.0
    lat = base_latency_us(system_base_us, algorithm, protocol)
    intra = hop_latency_us(intra_hw, alpha_ll.get(intra_hw, HW_LAT_US[intra_hw]["ring"][0]), algorithm, protocol)
    inter = hop_latency_us("net", alpha_ll.get("net", HW_LAT_US["net"]["ring"][0]), algorithm, protocol)
    if kind == "ring":
        n_inter = (2 * nodes if nodes > 1 else 0) if collective == "all_reduce" else nodes - 1
        if nodes > 1:
            intra = max(intra, NET_OVERHEAD_US * (3 if protocol == "simple" else 1))
        lat += (nsteps - n_inter) * intra + n_inter * inter
        if protocol == "simple" and nodes > 1 and collective == "all_reduce":
            # ncclTopoGetAlgoTime's "plateau effect of ring" (x1.4 from Ampere on, 1.9 before),
            # applied from nBytes / (nChannels nRanks) >= 64, i.e. at every size Simple can win
            lat *= RING_PLATEAU_LAT
    elif kind == "tree":
        lat += 2 * ((ppn - 1) * intra + math.log2(nodes) * inter) if nodes > 1 else 2 * (ppn - 1) * intra
    else:
        lat = intra + (inter if nodes > 1 else 0.0)
    return lat, bus * ratio


def channel_unit_bytes(algorithm: str, protocol: str, n: int, nt_simple: int | None = None) -> float:
    """``nt x threadThreshold``: bytes per channel below which NCCL drops a channel.

    ``src/enqueue.cc`` (2.19, ``topoGetAlgoInfo``): ``while (nBytes < nc*nt*threadThreshold)
    { if (nc >= 2) nc--; ... }`` over ring and tree; ``nt`` is the protocol's maximum
    thread count (Ring/Simple: 256 where the ring's bandwidth is at most PCI_BW,
    ``tuning.cc``), ``threadThreshold`` the per-thread bytes (ring LL: x nRanks).
    """
    p = PROTOCOLS.index(protocol)
    nt = MAX_NTHREADS[p]
    if p == 2 and kind_of(algorithm) == "ring" and nt_simple:
        nt = nt_simple
    thr = THREAD_THRESHOLD[p] * (n if (p == 0 and kind_of(algorithm) == "ring") else 1)
    return float(nt * thr)


def arch_index(arch: str) -> str:
    """NCCL's compute-capability row: Blackwell takes Hopper's (newest in the 2.19 tables)."""
    return arch if arch in _RING_LL128_PER_CH else "ampere"


def _nodes_index(nodes: int) -> int:
    return 0 if nodes <= 1 else (1 if nodes == 2 else 2)


def kind_of(algorithm: str) -> str:
    """NCCL table row of an algorithm: ring-like, tree-like or NVLS."""
    if algorithm in ("tree",):
        return "tree"
    if algorithm == "nvls":
        return "nvls"
    return "ring"


def proto_bandwidth(algorithm: str, protocol: str, collective: str, nodes: int, ppn: float,
                    channels: int, arch: str) -> tuple[float, float]:
    """(efficiency, per-link cap GB/s) of a protocol, from NCCL's refinements.

    The efficiency multiplies every link's achieved bandwidth; the cap bounds
    it (``inf``: none). Algorithms NCCL does not tune (recursive doubling,
    Rabenseifner, direct all-to-all, point-to-point) take the ring factors.
    """
    p = PROTOCOLS.index(protocol)
    kind = kind_of(algorithm)
    ni = _nodes_index(nodes)
    a = arch_index(arch)
    inf = math.inf
    if kind == "nvls":
        return 1.0, inf
    if kind == "tree":
        eff, cap = 0.92, channels * _TREE_PER_CH[a][ni]
        if p == 0:
            return eff / 3.8, min(cap, _LL_MAX_BW[ni])
        if p == 1:
            return eff * (7.0 / 9.0 if nodes == 1 else 120.0 / 128.0), min(cap, channels * _TREE_LL128_PER_CH[a][ni])
        return eff, cap
    if p == 0:
        f = 0.25 if (nodes > 1 or collective == "all_reduce") else 1.0 / 3.0
        return f, _LL_MAX_BW[ni]
    if p == 1:
        return (0.7 if ppn < 2 else 0.92), channels * _RING_LL128_PER_CH[a]
    return 1.0, inf


def hop_latency_us(link_class: str, alpha_ll_us: float, algorithm: str, protocol: str) -> float:
    """Per-hop latency of a link class under an algorithm and protocol.

    The system file gives the class's LL hop latency (``alpha_us``); LL128 and
    Simple scale it by NCCL's ratios for that hardware class, so a system file
    that changes ``alpha_us`` changes every protocol consistently.
    """
    kind = kind_of(algorithm)
    table = HW_LAT_US[link_class]
    ref = table["ring"][0]
    p = PROTOCOLS.index(protocol)
    return alpha_ll_us * table[kind][p] / ref


def base_latency_us(system_base_us: float, algorithm: str, protocol: str) -> float:
    """NCCL's base latency of the algorithm and protocol, scaled by the system's Ring/LL base."""
    kind = kind_of(algorithm)
    return system_base_us * BASE_LAT_US[kind][PROTOCOLS.index(protocol)] / BASE_LAT_US["ring"][0]
