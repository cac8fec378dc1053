"""Multi-GPU system files (``hw/systems/*.toml``) as frozen dataclasses.

A :class:`System` holds what the α–β model routes over (TileSight §3.6):
GPUs per node and nodes, and one :class:`LinkClass` per link technology
(NVLink through switches or bridges, PCIe with its switch layout, the
inter-node network with its NICs), each with its spec bandwidth, its per-hop
latency and its source, plus the few calibrated constants of
``[calibration]`` (see ``docs/collectives.md``). Look a system up by file
stem or alias with :func:`get_system`.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from tsbatch.errors import InputError

__all__ = ["LinkClass", "System", "systems_dir", "load_system_file", "get_system", "list_systems",
           "CALIBRATION_KEYS", "OPTIONAL_CALIBRATION_KEYS"]

#: the per-system calibrated constants every system file declares
CALIBRATION_KEYS = ("launch_overhead_us", "rank_skew_us", "nvlink_efficiency",
                    "pcie_efficiency", "net_efficiency")

#: calibrated constants a system may add: net_node_bw_gbps caps a node's total
#: network bandwidth per direction (a shared uplink or host limit; absent: no cap)
#: network bandwidth per direction (a shared uplink or host limit; absent: no cap);
#: nccl_channels is the channel count NCCL runs (its LL128 and tree caps are per channel)
#: duplex_factor: a port's two directions together carry this many times one direction's
#: bandwidth (2 or absent: perfect full duplex);
#: net_ll128: 0 where NCCL leaves LL128 off across nodes (the GPU does not reach its NIC
#: within a PCIe switch: typeInter > PATH_PXB); absent or 1: on as on a DGX
#: net_duplex_factor: the same for a NIC port (absent: duplex_factor);
#: net_burst_efficiency: achieved fraction of the network link's spec for a point-to-point
#: message that fits in NCCL's buffer (NCCL_BUFFSIZE, 4 MiB; absent: net_efficiency)
#: net_staging_bw_gbps: where net_ll128 = 0 (no GPUDirect RDMA either: same PATH_PXB
#: threshold), the achieved per-direction rate of the network traffic a PCIe switch's GPUs
#: stage through host memory (one link per switch and direction; NIC duplex factor)
OPTIONAL_CALIBRATION_KEYS = ("net_node_bw_gbps", "nccl_channels", "duplex_factor", "net_ll128",
                             "net_duplex_factor", "net_burst_efficiency", "net_staging_bw_gbps")


@dataclass(frozen=True)
class LinkClass:
    """One link technology of a system (``[links.<name>]``)."""

    name: str
    kind: str
    scope: str
    topology: str
    bw_gbps: float
    alpha_us: float
    #: NCCL hardware class of the per-hop latency table: "nvlink", "pci" or "net"
    hw_class: str
    counts: dict = field(default_factory=dict)


@dataclass(frozen=True)
class System:
    """A multi-GPU system: GPUs, link classes, NCCL base latency, calibration."""

    key: str
    name: str
    aliases: tuple[str, ...]
    gpu: str
    gpus_per_node: int
    max_nodes: int
    nvlink: LinkClass | None
    pcie: LinkClass | None
    net: LinkClass | None
    nvls: bool
    base_latency_us: float
    calibration: dict
    sources: dict
    path: str

    @property
    def max_gpus(self) -> int:
        return self.gpus_per_node * self.max_nodes

    def cal(self, key: str) -> float:
        return float(self.calibration[key])

    def link_bw_gbps(self, cls: str) -> float:
        """Achieved bandwidth of a link class: spec times its calibrated efficiency."""
        lc = {"nvlink": self.nvlink, "pcie": self.pcie, "net": self.net}[cls]
        eff = {"nvlink": "nvlink_efficiency", "pcie": "pcie_efficiency", "net": "net_efficiency"}[cls]
        return lc.bw_gbps * self.cal(eff)

    def summary(self) -> str:
        parts = []
        if self.nvlink is not None:
            t = (f"bridged x{self.nvlink.counts.get('bridge_group', 2)}"
                 if self.nvlink.topology == "bridged" else
                 f"full mesh of {self.gpus_per_node}" if self.nvlink.topology == "mesh" else
                 "NVSwitch" + (" +NVLS" if self.nvls else ""))
            parts.append(f"{self.nvlink.kind} {self.nvlink.bw_gbps:g} GB/s ({t})")
        if self.pcie is not None:
            parts.append(f"{self.pcie.kind} {self.pcie.bw_gbps:g} GB/s")
        if self.net is not None:
            parts.append(f"{self.net.kind} {self.net.counts.get('nics_per_node', 1)}x{self.net.bw_gbps:g} GB/s")
        return "; ".join(parts)


def systems_dir() -> Path:
    """Where the system files live: the checkout's ``hw/systems``, else the installed package data."""
    here = Path(__file__).resolve().parents[2] / "hw" / "systems"
    if here.is_dir():
        return here
    from importlib.resources import files

    return Path(str(files("tsbatch._hw.systems")))


def _num(path, where, entry) -> tuple[float, str]:
    if not isinstance(entry, dict) or "value" not in entry or "source" not in entry:
        raise InputError(f"{path}: {where} must be an inline table {{ value = ..., source = \"...\" }}")
    return float(entry["value"]), str(entry["source"])


_HW_CLASS = {"nvlink": "nvlink", "pcie": "pci"}

#: kinds of the direct GPU-to-GPU link class (the ``nvlink`` slot): NVIDIA NVLink, AMD
#: Infinity Fabric (xGMI) between Instinct GPUs, which RCCL treats as NCCL treats NVLink
GPU_LINK_KINDS = ("nvlink", "xgmi")


def load_system_file(path: str | Path) -> System:
    """Parse one system file; an error names the file and the key."""
    path = Path(path)
    try:
        doc = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise InputError(f"{path}: cannot read system file ({exc})") from exc
    sources: dict[str, str] = {}

    def num(section: dict, key: str, where: str, default=None):
        if key not in section:
            if default is not None:
                return default
            raise InputError(f"{path}: missing {where}.{key}")
        v, src = _num(path, f"{where}.{key}", section[key])
        sources[f"{where}.{key}"] = src
        return v

    try:
        sysd = doc["system"]
        links = doc.get("links", {})
        cal_doc = doc.get("calibration", {})
    except KeyError as exc:
        raise InputError(f"{path}: missing section [{exc.args[0]}]") from None
    classes: dict[str, LinkClass | None] = {"nvlink": None, "pcie": None, "net": None}
    nvls = False
    for name, ld in links.items():
        scope = ld.get("scope")
        if scope not in ("intra_node", "inter_node"):
            raise InputError(f"{path}: links.{name}.scope must be 'intra_node' or 'inter_node'")
        kind = str(ld.get("kind", ""))
        if scope == "inter_node":
            slot = "net"
        elif kind.startswith(GPU_LINK_KINDS):
            slot = "nvlink"
        elif kind.startswith("pcie"):
            slot = "pcie"
        else:
            raise InputError(f"{path}: links.{name}.kind '{kind}' is neither a GPU-to-GPU link "
                             f"({', '.join(k + '*' for k in GPU_LINK_KINDS)}) nor pcie*")
        counts = {}
        for key in ("links_per_gpu", "switches_per_node", "nics_per_node", "gpus_per_switch",
                    "uplink_bw_unidir_gbps", "bridge_group"):
            if key in ld:
                counts[key] = num(ld, key, f"links.{name}")
        topology = str(ld.get("topology", "switched"))
        if topology not in ("switched", "bridged", "mesh"):
            raise InputError(f"{path}: links.{name}.topology must be 'switched', 'bridged' or 'mesh'")
        if topology == "mesh":
            # every GPU of a node linked directly to every other: one bridge group of the node
            counts["bridge_group"] = num(sysd, "gpus_per_node", "system")
        classes[slot] = LinkClass(
            name=name, kind=kind, scope=scope, topology=topology,
            bw_gbps=num(ld, "bw_unidir_gbps", f"links.{name}"),
            alpha_us=num(ld, "alpha_us", f"links.{name}"),
            hw_class=_HW_CLASS.get(slot, "net"), counts=counts)
        if slot == "nvlink":
            nvls = bool(ld.get("in_switch_reduction", False)) and topology == "switched"
    if classes["nvlink"] is None and classes["pcie"] is None:
        raise InputError(f"{path}: a system needs an intra-node link (links.nvlink or links.pcie)")
    calibration = {k: num(cal_doc, k, "calibration") for k in CALIBRATION_KEYS}
    for k in OPTIONAL_CALIBRATION_KEYS:
        if k in cal_doc:
            calibration[k] = num(cal_doc, k, "calibration")
    gpn = int(num(sysd, "gpus_per_node", "system"))
    max_nodes = int(num(sysd, "max_nodes", "system", default=1.0))
    if classes["net"] is None:
        max_nodes = 1
    base = num(doc.get("collective", {}), "base_latency_us", "collective")
    return System(
        key=path.stem, name=str(sysd.get("name", path.stem)),
        aliases=tuple(str(a).lower() for a in sysd.get("aliases", ())),
        gpu=str(sysd["gpu"]), gpus_per_node=gpn, max_nodes=max_nodes,
        nvlink=classes["nvlink"], pcie=classes["pcie"], net=classes["net"], nvls=nvls,
        base_latency_us=base, calibration=calibration, sources=sources, path=str(path))


@lru_cache(maxsize=None)
def _registry() -> dict[str, System]:
    reg: dict[str, System] = {}
    for p in sorted(systems_dir().glob("*.toml")):
        s = load_system_file(p)
        for name in dict.fromkeys((s.key.lower(), *s.aliases)):
            if name in reg and reg[name].key != s.key:
                raise InputError(f"{p}: alias '{name}' already used by {reg[name].key}.toml")
            reg[name] = s
    return reg


def list_systems() -> list[str]:
    """File stems of the known systems."""
    return sorted({s.key for s in _registry().values()})


def get_system(name: str | System) -> System:
    """A system by file stem or alias (case-insensitive); a path to a TOML file also works."""
    if isinstance(name, System):
        return name
    reg = _registry()
    s = reg.get(str(name).lower())
    if s is not None:
        return s
    if str(name).endswith(".toml") and Path(name).is_file():
        return load_system_file(name)
    raise InputError(f"unknown system '{name}'; known: {', '.join(list_systems())} "
                     f"(aliases: {', '.join(sorted(a for a in reg if a not in list_systems()))})")
