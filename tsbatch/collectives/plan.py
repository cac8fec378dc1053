"""Topology, routing and stage decomposition of collectives (TileSight Algorithm 1, lines 8-14).

For one configuration (system, collective, GPU count, GPUs per node, and
optionally a forced algorithm, protocol and channel count) :func:`build_plan`
returns its *variants*: every (algorithm, protocol) pair NCCL would consider
(or the forced one), each an ordered list of :class:`Stage` s. A stage is a
set of logical exchanges ``(src, dst, bytes per message byte)`` between ranks;
:class:`Topology` routes each exchange over the system's links and the
stage's per-link *loads* are the routed bytes summed per link
(Eq. 11's ``B_{l,k}`` per message byte). Nothing here depends on the message
size, so a plan is built once per configuration and the batched kernel
(:mod:`tsbatch.kernels.alphabeta`) evaluates any number of sizes on it.

Ranks are node-major: rank ``r`` sits on node ``r // gpus_per_node`` as its
local GPU ``r % gpus_per_node``, which is physical GPU ``r % gpus_per_node``
of that node (a job with fewer GPUs per node than the system has uses the
first ones, as the measured data did).

Links (one direction each, achieved bandwidth = spec x calibrated efficiency):

- switched NVLink: ``nvl_out[g]``, ``nvl_in[g]``: a GPU's port into the
  NVSwitch fabric; in-switch reduction (NVLS) exchanges end or start at the
  switch (:data:`SWITCH`);
- bridged NVLink (and a full-mesh node, ``topology = "mesh"``: one bridge group of
  the whole node): ``bridge[s, d]`` per ordered pair of a bridge group, the
  GPU's NVLink bandwidth split over its ``group - 1`` peers;
- PCIe: ``pcie_out[g]``, ``pcie_in[g]`` (the GPU's x16 link to its switch)
  and, between switches, ``uplink_up[switch]``, ``uplink_down[switch]``;
- network: ``nic_out[node, j]``, ``nic_in[node, j]``; a GPU uses NIC
  ``local * nics_per_node // gpus_per_node`` (its PCIe neighbour); without
  GPUDirect RDMA (:meth:`Topology.staging_bw`) also ``stage_up[node, switch]``,
  ``stage_down[node, switch]``: the host-staged traffic of the GPUs of one PCIe
  switch, with a both-directions port like a NIC's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

from tsbatch.collectives import nccl
from tsbatch.collectives.systems import System, get_system

__all__ = ["SWITCH", "COLLECTIVES", "Exchange", "Stage", "Variant", "Plan", "Topology",
           "build_plan", "stages_for", "bus_factor"]

#: pseudo-rank of the NVSwitch in in-switch-reduction exchanges
SWITCH = -1

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")

#: algorithms NCCL's tuner chooses among, per collective (NVLS only where the switch reduces)
AUTO_ALGORITHMS = {
    "all_reduce": ("ring", "tree", "nvls"),
    "all_gather": ("ring", "nvls"),
    "reduce_scatter": ("ring", "nvls"),
    "all_to_all": ("direct",),
    "send_recv": ("direct",),
}
#: algorithms that can be forced, per collective
VALID_ALGORITHMS = {
    "all_reduce": ("ring", "tree", "nvls", "recursive_doubling", "rabenseifner"),
    "all_gather": ("ring", "nvls", "recursive_doubling"),
    "reduce_scatter": ("ring", "nvls", "recursive_doubling"),
    "all_to_all": ("direct",),
    "send_recv": ("direct",),
}


def bus_factor(collective: str, n: int) -> float:
    """nccl-tests' bus-bandwidth factor: busbw = algbw x factor."""
    if collective == "all_reduce":
        return 2.0 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


@dataclass(frozen=True)
class Exchange:
    """A logical exchange: ``src`` sends ``frac`` x message bytes to ``dst``."""

    src: int
    dst: int
    frac: float


@dataclass
class Stage:
    """One stage of a collective: concurrent exchanges, repeated ``reps`` times."""

    name: str
    exchanges: list[Exchange]
    reps: int = 1
    #: the exchange whose hop latency the stage pays (a ring step's leading
    #: chunk); None: the slowest route of all (Eq. 11's max)
    critical: Exchange | None = None
    alpha_us: float = 0.0
    loads: dict = field(default_factory=dict)  # link id -> bytes per message byte


@dataclass
class Variant:
    algorithm: str
    protocol: str
    stages: list[Stage]
    #: stages run concurrently in chunks (their loads add, their latencies add)
    pipelined: bool
    base_us: float = 0.0
    proto_eff: float = 1.0
    cap_gbps: float = math.inf
    #: NCCL's own prediction, used only to choose the variant (nccl.selection_model)
    sel_lat_us: float = 0.0
    sel_inv_bw: float = 0.0  # us per byte
    sel_tree: int = -1  # protocol row of NCCL's tree correction, -1: none
    sel_max_bytes: float = math.inf
    #: the variant's cost lines by size (:class:`Line`): ``n_chan`` lines for 1 ... n_chan
    #: active channels (message bytes per channel step ``chan_unit``: NCCL's
    #: ``nBytes < nc * nt * threadThreshold`` rule), then, where ``window_bytes > 0``,
    #: as many again for messages under ``window_bytes`` (the network's burst rate).
    #: Empty: one line, the variant's own stages, efficiency and cap.
    lines: list = field(default_factory=list)
    chan_unit: float = math.inf
    n_chan: int = 1
    window_bytes: float = 0.0

    @property
    def n_stages(self) -> int:
        return sum(s.reps for s in self.stages)

    def kernel_lines(self) -> list["Line"]:
        return self.lines or [Line(self.stages, self.proto_eff, self.cap_gbps, self.n_chan)]

    def line_index(self, nbytes: float) -> int:
        """Which of :meth:`kernel_lines` a message of ``nbytes`` runs on."""
        k = 1 if not math.isfinite(self.chan_unit) else int(min(max(nbytes // self.chan_unit, 1), self.n_chan))
        k = min(k, self.n_chan)
        off = self.n_chan if (self.window_bytes > 0 and nbytes < self.window_bytes) else 0
        return off + k - 1 if self.lines else 0

    def kernel_stages(self, stages: list | None = None) -> list[tuple[float, float, dict]]:
        """(alpha, reps, loads) as the kernel sees them: a pipelined variant's
        stages merged into one (loads summed, latencies summed)."""
        stages = self.stages if stages is None else stages
        if not self.pipelined or len(stages) <= 1:
            return [(s.alpha_us, float(s.reps), s.loads) for s in stages]
        loads: dict = {}
        alpha = 0.0
        for s in stages:
            alpha += s.reps * s.alpha_us
            for lk, f in s.loads.items():
                loads[lk] = loads.get(lk, 0.0) + s.reps * f
        return [(alpha, 1.0, loads)]


@dataclass
class Line:
    """One cost line of a variant: its stages with ``channels`` NCCL channels active."""

    stages: list
    proto_eff: float
    cap_gbps: float
    channels: int = 0


@dataclass
class Plan:
    system: System
    collective: str
    num_gpus: int
    gpus_per_node: int
    topology: "Topology | None"
    variants: list[Variant]
    reason: str = ""

    @property
    def feasible(self) -> bool:
        return bool(self.variants)


class Topology:
    """The links a job of ``n`` ranks (``gpn`` per node) uses on a system, and routes."""

    def __init__(self, system: System, n: int, gpn: int):
        self.system = system
        self.n = n
        self.gpn = gpn
        self.nodes = n // gpn
        self.ids: dict[tuple, int] = {}
        self.bw: list[float] = []
        self.cls: list[str] = []
        self.hw: list[str] = []
        self.alpha_ll: list[float] = []
        #: route network hops over the burst-rate links (lines under the buffer window)
        self.burst = False

    def node(self, r: int) -> int:
        return r // self.gpn

    def local(self, r: int) -> int:
        return r % self.gpn

    def _link(self, key: tuple, bw: float, cls: str, hw: str, alpha: float) -> int:
        i = self.ids.get(key)
        if i is None:
            i = len(self.bw)
            self.ids[key] = i
            self.bw.append(bw)
            self.cls.append(cls)
            self.hw.append(hw)
            self.alpha_ll.append(alpha)
        return i

    def name(self, link: int) -> str:
        for k, v in self.ids.items():
            if v == link:
                return "/".join(str(x) for x in k)
        raise KeyError(link)

    # --------------------------------------------------------------- routing
    def nic(self, local: int) -> int:
        nics = int(self.system.net.counts.get("nics_per_node", 1))
        return local * nics // self.system.gpus_per_node

    def staging_bw(self) -> float:
        """Achieved per-direction rate (GB/s) of a PCIe switch's network traffic staged
        through host memory, 0 where the network is reached by GPUDirect RDMA.

        NCCL (2.19, ``src/graph/paths.cc``, ``ncclTopoCheckGdr``) enables GPUDirect RDMA
        only where the GPU's path to the NIC is at most ``NCCL_NET_GDR_LEVEL`` (default
        ``PATH_PXB``); otherwise ``ncclTopoComputePaths`` diverts the GPU-NIC traffic
        through the CPU local to the GPU. The threshold is the one that keeps LL128 off
        across nodes (``typeInter <= PATH_PXB``), so staging applies only to a system whose
        file says ``net_ll128 = 0`` and calibrates ``net_staging_bw_gbps``. Point-to-point
        messages within the burst window (``net_burst_efficiency``) are not staged.
        """
        cal = self.system.calibration
        if self.burst or cal.get("net_ll128", 1.0) > 0:
            return 0.0
        return float(cal.get("net_staging_bw_gbps", 0.0))

    def switch(self, local: int) -> int:
        """The PCIe switch of a node's GPU ``local`` (``gpus_per_switch`` GPUs per switch)."""
        pc = self.system.pcie
        return local // int(pc.counts.get("gpus_per_switch", 1)) if pc is not None else local

    def same_bridge_group(self, s: int, d: int) -> bool:
        """Whether ranks ``s`` and ``d`` are joined by their own direct link (an NVLink
        bridge group, or the node of a full-mesh system: ``topology = "mesh"``)."""
        nv = self.system.nvlink
        if nv is None or nv.topology not in ("bridged", "mesh") or self.node(s) != self.node(d):
            return False
        k = int(nv.counts.get("bridge_group", 2))
        return self.local(s) // k == self.local(d) // k

    def full_mesh(self) -> bool:
        """A one-node job of more than 2 ranks whose every pair has its own direct link
        (all of it within one bridge group or a full-mesh node)."""
        return (self.nodes == 1 and self.n > 2
                and all(self.same_bridge_group(0, r) for r in range(1, self.n)))

    def intra_is_nvlink(self, s: int, d: int) -> bool:
        nv = self.system.nvlink
        if nv is None:
            return False
        return nv.topology == "switched" or self.same_bridge_group(s, d)

    def _port(self, key: tuple, bw: float, cls: str, hw: str, alpha: float) -> list[int]:
        """The shared both-directions capacity of a port (``duplex_factor`` x one
        direction's bandwidth; a NIC's ``net_duplex_factor`` where given), when the
        system declares one (< 2: imperfect duplex)."""
        cal = self.system.calibration
        dup = cal.get("duplex_factor", 0.0)
        if hw == "net":
            dup = cal.get("net_duplex_factor", dup)
        if dup <= 0 or dup >= 2:
            return []
        return [self._link(("duplex",) + key, bw * dup, cls + "_duplex", hw, alpha)]

    def route(self, s: int, d: int) -> list[int]:
        """Link ids an exchange from rank ``s`` to rank ``d`` crosses."""
        return self._route(s, d)

    def _route(self, s: int, d: int) -> list[int]:
        sy = self.system
        if s == SWITCH or d == SWITCH:
            nv = sy.nvlink
            bw = sy.link_bw_gbps("nvlink")
            if s == SWITCH:
                return ([self._link(("nvl_in", d), bw, "nvlink", "nvlink", nv.alpha_us)]
                        + self._port(("nvl", d), bw, "nvlink", "nvlink", nv.alpha_us))
            return ([self._link(("nvl_out", s), bw, "nvlink", "nvlink", nv.alpha_us)]
                    + self._port(("nvl", s), bw, "nvlink", "nvlink", nv.alpha_us))
        if self.node(s) != self.node(d):
            net = sy.net
            bw = sy.link_bw_gbps("net")
            ns, nd = self.node(s), self.node(d)
            js, jd = self.nic(self.local(s)), self.nic(self.local(d))
            o, i, pt = "nic_out", "nic_in", "nic"
            if self.burst:  # a message within NCCL's buffer: the network's burst rate
                bw = net.bw_gbps * sy.calibration["net_burst_efficiency"]
                o, i, pt = "nic_out_burst", "nic_in_burst", "nic_burst"
            out = [self._link((o, ns, js), bw, "net", "net", net.alpha_us),
                   self._link((i, nd, jd), bw, "net", "net", net.alpha_us)]
            out += self._port((pt, ns, js), bw, "net", "net", net.alpha_us)
            out += self._port((pt, nd, jd), bw, "net", "net", net.alpha_us)
            stage = self.staging_bw()
            if stage > 0:
                # GPUDirect RDMA off (the GPU's path to its NIC is beyond PATH_PXB): NCCL
                # diverts the traffic through the CPU local to the GPU (paths.cc,
                # ncclTopoComputePaths / ncclTopoCheckGdr), so it crosses the uplink of the
                # GPU's PCIe switch, shared by the switch's GPUs
                ss, sd = self.switch(self.local(s)), self.switch(self.local(d))
                out.append(self._link(("stage_up", ns, ss), stage, "net_staging", "net", net.alpha_us))
                out.append(self._link(("stage_down", nd, sd), stage, "net_staging", "net", net.alpha_us))
                out += self._port(("stage", ns, ss), stage, "net_staging", "net", net.alpha_us)
                out += self._port(("stage", nd, sd), stage, "net_staging", "net", net.alpha_us)
            cap = sy.calibration.get("net_node_bw_gbps", 0.0)
            if cap > 0:  # a node's whole network share (calibrated; 0: the NICs' sum, no cap)
                out.append(self._link(("node_out", ns), cap, "net_node", "net", net.alpha_us))
                out.append(self._link(("node_in", nd), cap, "net_node", "net", net.alpha_us))
            return out
        nv = sy.nvlink
        if nv is not None and nv.topology == "switched":
            bw = sy.link_bw_gbps("nvlink")
            return ([self._link(("nvl_out", s), bw, "nvlink", "nvlink", nv.alpha_us),
                     self._link(("nvl_in", d), bw, "nvlink", "nvlink", nv.alpha_us)]
                    + self._port(("nvl", s), bw, "nvlink", "nvlink", nv.alpha_us)
                    + self._port(("nvl", d), bw, "nvlink", "nvlink", nv.alpha_us))
        if self.same_bridge_group(s, d):
            k = int(nv.counts.get("bridge_group", 2))
            bw = sy.link_bw_gbps("nvlink") / max(k - 1, 1)
            return ([self._link(("bridge", s, d), bw, "nvlink_bridge", "nvlink", nv.alpha_us)]
                    + self._port(("bridge", min(s, d), max(s, d)), bw, "nvlink_bridge", "nvlink", nv.alpha_us))
        pc = sy.pcie
        bw = sy.link_bw_gbps("pcie")
        out = [self._link(("pcie_out", s), bw, "pcie", "pci", pc.alpha_us)]
        out += self._port(("pcie", s), bw, "pcie", "pci", pc.alpha_us)
        per = int(pc.counts.get("gpus_per_switch", 1))
        sw_s, sw_d = self.local(s) // per, self.local(d) // per
        if sw_s != sw_d:
            up = pc.counts.get("uplink_bw_unidir_gbps", pc.bw_gbps) * sy.cal("pcie_efficiency")
            out.append(self._link(("uplink_up", self.node(s), sw_s), up, "pcie_uplink", "pci", pc.alpha_us))
            out.append(self._link(("uplink_down", self.node(d), sw_d), up, "pcie_uplink", "pci", pc.alpha_us))
        out.append(self._link(("pcie_in", d), bw, "pcie", "pci", pc.alpha_us))
        out += self._port(("pcie", d), bw, "pcie", "pci", pc.alpha_us)
        return out

    def route_alpha(self, links: list[int], algorithm: str, protocol: str) -> float:
        """Eq. 11's routed hop latency of one route: its slowest link's."""
        return max(nccl.hop_latency_us(self.hw[lk], self.alpha_ll[lk], algorithm, protocol)
                   for lk in links)


# ------------------------------------------------------------------ stages
def _rings(topo: Topology, channels: int = 0) -> list[list[int]]:
    """NCCL-like rings: one on a node; across nodes one per NIC a node's ranks can reach,
    each leaving a node through a different GPU (and so a different NIC); with
    ``channels`` > 0 active channels, at most that many rings (channel c runs ring c mod R)."""
    n, gpn = topo.n, topo.gpn
    if topo.nodes == 1:
        return [list(range(n))]
    nics = sorted({topo.nic(l) for l in range(gpn)})
    r_count = max(1, min(gpn, len(nics)))
    if channels > 0:
        r_count = min(r_count, channels)
    rings = []
    for j in range(r_count):
        o = j * gpn // r_count
        ring = [node * gpn + (o + t) % gpn for node in range(topo.nodes) for t in range(gpn)]
        rings.append(ring)
    return rings


def _ring_stages(topo: Topology, collective: str, steps_per_phase: list[tuple[str, int]],
                 channels: int = 0) -> list[Stage]:
    rings = _rings(topo, channels)
    n = topo.n
    frac = 1.0 / (n * len(rings))
    ex = [Exchange(r[i], r[(i + 1) % n], frac) for r in rings for i in range(n)]
    if topo.full_mesh():
        # every pair has its own link: NCCL's (RCCL's) ring search lays its channels on
        # rings of different orders so that every link carries traffic (on a fully
        # connected node the channels' rings cover the pairs evenly). The even mixture
        # of all directed Hamiltonian cycles of n ranks puts 1/(n-1) of a ring step's
        # bytes on every ordered pair; for n = 4 it is exactly the three 4-cycles run
        # both ways. Each rank still sends 1/n of the message per step.
        ex = [Exchange(a, b, 1.0 / (n * (n - 1))) for a in range(n) for b in range(n) if a != b]
        frac = 1.0 / (n * (n - 1))
    r0 = rings[0]
    stages = []
    for phase, steps in steps_per_phase:
        # the leading chunk crosses ring-0 edge (t mod n) at step t: group steps by hop kind
        groups: dict[bool, int] = {}
        crit: dict[bool, Exchange] = {}
        for t in range(steps):
            i = t % n
            inter = topo.node(r0[i]) != topo.node(r0[(i + 1) % n])
            groups[inter] = groups.get(inter, 0) + 1
            crit.setdefault(inter, Exchange(r0[i], r0[(i + 1) % n], frac))
        for inter in sorted(groups):
            stages.append(Stage(f"{phase} step ({'inter-node' if inter else 'intra-node'} hop)",
                                ex, reps=groups[inter], critical=crit[inter]))
    return stages


def _chain_tree_stages(topo: Topology) -> list[Stage]:
    """NCCL's tree all-reduce: a chain inside each node, a double binary tree over nodes
    (each tree carries half the message), reduce up then broadcast down (pipelined)."""
    gpn, nodes = topo.gpn, topo.nodes
    trees = 1 if nodes == 1 else 2
    half = 1.0 / trees
    up: list[Stage] = []
    # intra-node chain toward the tree's head (local 0 for tree A, local gpn-1 for tree B)
    for k in range(gpn - 1):
        ex = []
        for node in range(nodes):
            base = node * gpn
            ex.append(Exchange(base + gpn - 1 - k, base + gpn - 2 - k, half))
            if trees == 2:
                ex.append(Exchange(base + k, base + k + 1, half))
        up.append(Stage(f"reduce chain hop {k + 1}", ex))
    if nodes > 1:
        depth = lambda i: int(math.floor(math.log2(i + 1)))  # noqa: E731
        max_d = depth(nodes - 1)
        for d in range(max_d, 0, -1):
            ex = []
            for i in range(nodes):
                if depth(i) != d:
                    continue
                p = (i - 1) // 2
                ex.append(Exchange(i * gpn, p * gpn, half))
                mi, mp = nodes - 1 - i, nodes - 1 - p
                ex.append(Exchange(mi * gpn + gpn - 1, mp * gpn + gpn - 1, half))
            up.append(Stage(f"reduce tree level {d}", ex))
    down = [Stage(s.name.replace("reduce", "broadcast"),
                  [Exchange(e.dst, e.src, e.frac) for e in s.exchanges]) for s in reversed(up)]
    return up + down


def _pow2(n: int) -> bool:
    return n >= 1 and (n & (n - 1)) == 0


def stages_for(topo: Topology, collective: str, algorithm: str,
               channels: int = 0) -> tuple[list[Stage], bool] | str:
    """Stages of ``collective`` by ``algorithm`` on ``topo`` (rings: with ``channels``
    active channels, 0: all), and whether they pipeline; a string says why the
    combination cannot run."""
    n = topo.n
    sy = topo.system
    if algorithm not in VALID_ALGORITHMS[collective]:
        return (f"algorithm '{algorithm}' does not apply to {collective} "
                f"(valid: {', '.join(VALID_ALGORITHMS[collective])})")
    if algorithm == "ring":
        if collective == "all_reduce":
            return _ring_stages(topo, collective, [("reduce-scatter", n - 1), ("all-gather", n - 1)],
                                channels), False
        phase = "reduce-scatter" if collective == "reduce_scatter" else "all-gather"
        return _ring_stages(topo, collective, [(phase, n - 1)], channels), False
    if algorithm == "tree":
        return _chain_tree_stages(topo), True
    if algorithm == "nvls":
        if not sy.nvls:
            return f"nvls needs in-switch reduction (NVSwitch with NVLink SHARP); {sy.key} has none"
        if topo.nodes > 1:
            return "nvls is modelled within one node (NVLS across nodes needs CollNet/SHARP networks)"
        ranks = range(n)
        if collective == "all_reduce":
            ex = ([Exchange(g, SWITCH, 1.0) for g in ranks] + [Exchange(SWITCH, g, 1.0 / n) for g in ranks]
                  + [Exchange(g, SWITCH, 1.0 / n) for g in ranks] + [Exchange(SWITCH, g, 1.0) for g in ranks])
            return [Stage("in-switch reduce (multimem.ld_reduce) + multicast (multimem.st)", ex)], True
        if collective == "all_gather":
            ex = [Exchange(g, SWITCH, 1.0 / n) for g in ranks] + [Exchange(SWITCH, g, 1.0) for g in ranks]
            return [Stage("multicast of each shard", ex)], True
        ex = [Exchange(g, SWITCH, 1.0) for g in ranks] + [Exchange(SWITCH, g, 1.0 / n) for g in ranks]
        return [Stage("in-switch reduce of each shard", ex)], True
    if algorithm in ("recursive_doubling", "rabenseifner"):
        if not _pow2(n):
            return f"{algorithm} needs a power-of-two GPU count, got {n}"
        steps = int(math.log2(n))
        stages = []
        if collective == "all_reduce" and algorithm == "recursive_doubling":
            for k in range(steps):
                stages.append(Stage(f"exchange with rank xor {1 << k}",
                                    [Exchange(r, r ^ (1 << k), 1.0) for r in range(n)]))
            return stages, False
        if collective in ("all_reduce", "reduce_scatter"):
            for k in range(steps):  # recursive halving: distance n/2, n/4, ...; half, quarter, ...
                dist = n >> (k + 1)
                stages.append(Stage(f"reduce-scatter halving, partner xor {dist}",
                                    [Exchange(r, r ^ dist, 1.0 / (2 << k)) for r in range(n)]))
        if collective in ("all_reduce", "all_gather"):
            for k in range(steps):  # recursive doubling: distance 1, 2, ...; 1/n, 2/n, ...
                dist = 1 << k
                stages.append(Stage(f"all-gather doubling, partner xor {dist}",
                                    [Exchange(r, r ^ dist, float(1 << k) / n) for r in range(n)]))
        return stages, False
    # direct
    if collective == "send_recv":
        return [Stage("send rank 0 -> rank n-1", [Exchange(0, n - 1, 1.0)])], True
    ex = [Exchange(s, d, 1.0 / n) for s in range(n) for d in range(n) if s != d]
    return [Stage("all-to-all: every rank sends 1/n to every other", ex)], True


def _protocols(topo: Topology, collective: str, algorithm: str, stages: list[Stage]) -> tuple[str, ...]:
    if algorithm == "nvls":
        return ("simple",)
    if collective in ("send_recv", "all_to_all"):
        return ("ll", "simple")  # NCCL point-to-point: LL for small, Simple otherwise
    # LL128 only where every intra-node hop is NVLink (NCCL enables it on NVLink paths only)
    nvl = all(topo.intra_is_nvlink(e.src, e.dst) for s in stages for e in s.exchanges
              if e.src >= 0 and e.dst >= 0 and topo.node(e.src) == topo.node(e.dst))
    # ... and, across nodes, only where the GPU reaches its NIC within a PCIe switch (NCCL's
    # typeInter <= PATH_PXB): a system file whose cluster does not says net_ll128 = 0
    net_ok = topo.nodes == 1 or topo.system.calibration.get("net_ll128", 1.0) > 0
    return ("ll", "ll128", "simple") if nvl and net_ok and topo.system.nvlink is not None else ("ll", "simple")


def _cost(topo: Topology, stages: list[Stage], algorithm: str, protocol: str) -> list[Stage]:
    out = []
    for s in stages:
        loads: dict[int, float] = {}
        worst_alpha = 0.0
        crit_alpha = None
        for e in s.exchanges:
            links = topo.route(e.src, e.dst)
            a = topo.route_alpha(links, algorithm, protocol)
            worst_alpha = max(worst_alpha, a)
            if s.critical is not None and e == s.critical:
                crit_alpha = a
            for lk in links:
                loads[lk] = loads.get(lk, 0.0) + e.frac
        if s.critical is not None and crit_alpha is None:
            crit_alpha = topo.route_alpha(topo.route(s.critical.src, s.critical.dst), algorithm, protocol)
        out.append(Stage(s.name, s.exchanges, s.reps, s.critical,
                         crit_alpha if s.critical is not None else worst_alpha, loads))
    return out


def default_channels(system: System) -> int:
    """NCCL channels assumed when the row gives none: the system's calibrated
    ``nccl_channels`` if it has one, else one per NVLink link of a GPU (NCCL's
    ring search builds about one channel per link), else 2 (PCIe)."""
    if "nccl_channels" in system.calibration:
        return int(system.calibration["nccl_channels"])
    if system.nvlink is not None:
        return int(system.nvlink.counts.get("links_per_gpu", 12))
    return 2


def check_shape(system: System, collective: str, n: int, gpn: int) -> str:
    """Why a job shape cannot run on a system ('' when it can)."""
    if n < 2:
        return f"num_gpus {n}: a collective needs at least 2 GPUs"
    if gpn > system.gpus_per_node:
        return f"gpus_per_node {gpn} exceeds {system.key}'s {system.gpus_per_node} GPUs per node"
    if n % gpn:
        return f"num_gpus {n} is not a multiple of gpus_per_node {gpn}"
    nodes = n // gpn
    if nodes > system.max_nodes:
        if system.net is None:
            return f"num_gpus {n} needs {nodes} nodes; {system.key} is a single node without an inter-node network"
        return f"num_gpus {n} needs {nodes} nodes; {system.key} has at most {system.max_nodes}"
    if collective == "send_recv" and n != 2:
        return f"send_recv is between 2 GPUs, got num_gpus {n}"
    return ""


@lru_cache(maxsize=4096)
def build_plan(system_key: str, collective: str, n: int, gpn: int, algorithm: str | None = None,
               protocol: str | None = None, channels: int | None = None) -> Plan:
    """Every variant a configuration may run (the forced one when given)."""
    system = get_system(system_key)
    reason = check_shape(system, collective, n, gpn)
    if reason:
        return Plan(system, collective, n, gpn, None, [], reason)
    topo = Topology(system, n, gpn)
    algos = (algorithm,) if algorithm else AUTO_ALGORITHMS[collective]
    ch = int(channels) if channels else default_channels(system)
    arch = _gpu_arch(system.gpu)
    variants: list[Variant] = []
    reasons = []
    bus_bw = _ring_bus_bw(topo, collective) if collective not in ("send_recv", "all_to_all") else 0.0
    intra_hw = "nvlink" if (system.nvlink is not None and all(
        topo.intra_is_nvlink(r, r + 1) for r in range(n - 1) if topo.node(r) == topo.node(r + 1))) else "pci"
    # NCCL's tuner uses its own latency table, not the system file's (calibrated) alphas
    alpha_ll = {k: nccl.HW_LAT_US[k]["ring"][0] for k in ("nvlink", "pci", "net")}
    for a in algos:
        got = stages_for(topo, collective, a)
        if isinstance(got, str):
            reasons.append(got)
            continue
        stages, pipelined = got
        protos = _protocols(topo, collective, a, stages)
        if protocol:
            if protocol not in protos:
                reasons.append(f"protocol '{protocol}' is not available to {a} {collective} on "
                               f"{system.key} (available: {', '.join(protos)})")
                continue
            protos = (protocol,)
        for p in protos:
            eff, cap = nccl.proto_bandwidth(a, p, collective, topo.nodes, float(gpn), ch, arch)
            base = (nccl.base_latency_us(system.base_latency_us, a, p)
                    if collective not in ("send_recv", "all_to_all") else 0.0)
            base += system.cal("launch_overhead_us") + system.cal("rank_skew_us") * math.log2(n)
            var = Variant(a, p, _cost(topo, stages, a, p), pipelined, base, eff, cap)
            _add_lines(var, topo, collective, stages, ch, arch, bus_bw, pinned=bool(channels))
            if collective in ("send_recv", "all_to_all"):
                # NCCL point-to-point: LL up to NCCL_P2P_LL_THRESHOLD, Simple beyond
                ll = p == "ll"
                var.sel_lat_us = 0.0 if ll else 1.0
                var.sel_max_bytes = (nccl.P2P_LL_THRESHOLD_BYTES * (n - 1) if collective == "all_to_all"
                                     else nccl.P2P_LL_THRESHOLD_BYTES) if ll and not protocol else math.inf
            elif a in ("ring", "tree", "nvls"):
                lat, bw = nccl.selection_model(a, p, collective, n, topo.nodes, bus_bw, ch, arch,
                                               intra_hw, system.base_latency_us, alpha_ll)
                var.sel_lat_us = lat
                var.sel_inv_bw = 1.0 / (bw * 1e3) if bw > 0 else math.inf
                var.sel_tree = nccl.PROTOCOLS.index(p) if a == "tree" else -1
            variants.append(var)
    return Plan(system, collective, n, gpn, topo, variants, "; ".join(reasons) if not variants else "")


def _add_lines(var: Variant, topo: Topology, collective: str, stages: list[Stage], ch: int,
               arch: str, bus_bw: float, pinned: bool) -> None:
    """The variant's cost lines by message size (:attr:`Variant.lines`).

    Channels (NCCL ``src/enqueue.cc``, ``topoGetAlgoInfo``, ring/tree channel tuning):
    NCCL starts from all ``ch`` channels and drops one while ``nBytes < nc * nt *
    threadThreshold``, so a message runs on ``nc = clamp(floor(nBytes / (nt *
    threadThreshold)), 1, ch)`` channels (:func:`nccl.channel_unit_bytes`). Fewer
    channels lower the protocol's per-channel caps (``nc x perCh``) and, across nodes,
    the rings (NICs) in use. A forced ``channels`` column pins ``ch``; point-to-point
    and NVLS keep their channels.

    Network buffer window: a point-to-point message across nodes of less than
    NCCL_BUFFSIZE (4 MiB, ``src/include/comm.h`` DEFAULT_BUFFER_SIZE_BYTES) runs at the
    system's ``net_burst_efficiency`` where the system file calibrates one.
    """
    sy = topo.system
    algo, proto = var.algorithm, var.protocol
    p2p = collective in ("send_recv", "all_to_all")
    window = 0.0
    if p2p and topo.nodes > 1 and "net_burst_efficiency" in sy.calibration:
        window = nccl.NCCL_BUFFSIZE_BYTES * ((topo.n - 1) if collective == "all_to_all" else 1)
    unit = math.inf
    if not p2p and algo in ("ring", "tree") and not pinned:
        # Ring/Simple runs 256 threads only where the ring graph's nominal bwIntra x
        # nChannels is at most PCI_BW (12 GB/s): never on these systems' graphs
        u = nccl.channel_unit_bytes(algo, proto, topo.n)
        # nBytes of an all-gather / reduce-scatter is one rank's share of the row's buffer
        unit = u * (topo.n if collective in ("all_gather", "reduce_scatter") else 1)
    if not math.isfinite(unit) and window <= 0:
        return
    lines: list[Line] = []
    ks = range(1, ch + 1) if math.isfinite(unit) else [ch]
    for burst in ((False, True) if window > 0 else (False,)):
        topo.burst = burst
        try:
            for k in ks:
                if algo == "ring" and topo.nodes > 1:
                    got = stages_for(topo, collective, algo, channels=k)
                    st = got[0]
                else:
                    st = stages
                eff, cap = nccl.proto_bandwidth(algo, proto, collective, topo.nodes, float(topo.gpn), k, arch)
                lines.append(Line(_cost(topo, st, algo, proto), eff, cap, k))
        finally:
            topo.burst = False
    var.lines = lines
    var.chan_unit = unit
    var.n_chan = len(ks)
    var.window_bytes = window


def _ring_bus_bw(topo: Topology, collective: str) -> float:
    """Bus bandwidth (GB/s) of the routed ring under Simple: what NCCL's topology
    search would report as ``nChannels x bwIntra`` for this job."""
    coll = collective if collective in ("all_gather", "reduce_scatter") else "all_reduce"
    got = stages_for(topo, coll, "ring")
    stages = _cost(topo, got[0], "ring", "simple")
    w = 0.0  # us per message byte
    for s in stages:
        w += s.reps * max(f / (topo.bw[lk] * 1e3) for lk, f in s.loads.items())
    nsteps = 2 * (topo.n - 1) if coll == "all_reduce" else topo.n - 1
    return nsteps / topo.n / (w * 1e3)


@lru_cache(maxsize=None)
def _gpu_arch(gpu: str) -> str:
    from tsbatch.hw import get_hw

    return get_hw(gpu).arch
