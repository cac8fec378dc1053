"""Hardware specifications: ``hw/*.toml`` loaded into frozen dataclasses.

Each GPU file has sections ``[identity]`` (strings), ``[sm]``, ``[compute]``,
``[memory]``, ``[launch]`` (spec numbers), optional ``[measured]`` (the same
keys, microbenchmark values that override the spec for prediction) and
optional ``[calibration]`` (the named per-GPU model constants of
:data:`CALIBRATION_DEFAULTS`). Every number is written as an inline table
``{ value = ..., source = "..." }`` so that each carries its provenance.

Look a spec up by any of its aliases with :func:`get_hw`; an unknown name
raises :class:`UnknownHardwareError` listing the known ones.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Mapping

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

__all__ = [
    "HwSpec",
    "UnknownHardwareError",
    "HwFileError",
    "CALIBRATION_DEFAULTS",
    "get_hw",
    "list_hw",
    "load_hw_file",
    "hw_dir",
]

#: Named per-GPU calibration constants, their defaults and meaning. A GPU file
#: may set any of them in ``[calibration]`` with a ``source`` saying how the
#: value was obtained. Nothing else is fitted (DESIGN.md, "Calibration").
CALIBRATION_DEFAULTS: dict[str, tuple[float, str]] = {
    "tc_efficiency": (
        1.0,
        "fraction of the measured tensor-core peak that a software-pipelined "
        "tile loop sustains once fed (instruction issue, fragment loads)",
    ),
    "l2_capacity_fraction": (
        1.0,
        "fraction of the nominal L2 that holds distinct data (partitioned L2s "
        "duplicate lines across halves)",
    ),
    "dram_efficiency": (
        1.0,
        "fraction of the measured DRAM bandwidth reached by tile loads",
    ),
    "library_store_efficiency": (
        1.0,
        "fraction of dram_efficiency at which a library (cuBLAS) GEMM's epilogue "
        "writes C to DRAM, where it differs from the Triton kernels' direct stores "
        "on the same GPU",
    ),
    "l2_efficiency": (
        1.0,
        "fraction of the L2 bandwidth of the hardware file that tile loads "
        "reach when every SM streams its tiles at once (partition crossings, "
        "slice conflicts)",
    ),
    "launch_overhead_us": (
        0.0,
        "fixed per-kernel time not covered by the tile pipeline (launch, grid "
        "setup, teardown); overrides [launch] when set",
    ),
    "program_launch_overhead_us": (
        0.0,
        "launch_overhead_us of the families lowered from tile programs "
        "(attention, decoding, MLA, norms, MoE, user TOML programs) where their "
        "own measured floor sets it apart from the GEMM's; unset: "
        "launch_overhead_us",
    ),
    "iter_overhead_cycles": (
        0.0,
        "fixed SM cycles per reduction-loop iteration of one tile (barrier, "
        "address arithmetic, loop control), not overlapped with the MMA",
    ),
    "iter_sync_cycles": (
        0.0,
        "SM cycles per reduction-loop iteration a tile's warps stall at the "
        "loop barrier; the tensor cores idle then unless another resident "
        "tile has work, so it is hidden when several tiles share the SM",
    ),
    "tile_overhead_cycles": (
        0.0,
        "fixed SM cycles per tile outside the loop (index math, epilogue "
        "conversion, store issue)",
    ),
    "dram_access_bytes": (
        32.0,
        "bytes of DRAM time one contiguous run of a GEMM tile load costs at "
        "least: a run shorter than the DRAM's access (a K-contiguous operand "
        "with BK x element size < it, an M/N-contiguous one with BM or BN x "
        "element size < it) pays a whole access, at most twice its sectors, its "
        "row-buffer locality lost between the runs of the many concurrent tile "
        "streams; 32 (one sector): nothing beyond the sectors",
    ),
    "mem_latency_us": (
        0.6,
        "latency of one global-memory tile load on an idle chip (fill cost of "
        "the pipeline prologue)",
    ),
    "wgmma_share_efficiency": (
        1.0,
        "tensor-core rate, relative to one warpgroup issuing back to back, when "
        "more than one warpgroup per SM issues warpgroup MMA (several resident "
        "blocks, or 8+ warps per block): their asynchronous MMA chains are "
        "arbitrated onto the same tensor cores",
    ),
    "library_epilogue_pass_cycles": (
        100.0,
        "SM cycles of one pass of a library (cuBLAS/CUTLASS) tensor-core kernel's "
        "epilogue, which stages the accumulator tile through shared memory in "
        "passes of 8 rows of every warp tile: a block barrier, the warps' "
        "shared stores, a second barrier, the shared loads the global stores "
        "wait on (two barriers and two dependent shared-memory accesses, "
        "about 2 x 20 + 2 x 30 cycles on Ampere and Hopper: an estimate from "
        "published microbenchmark magnitudes, not fitted; "
        "docs/gemm_accuracy.md, Library small-K kernels, session 4)",
    ),
    "l2_latency_cycles": (
        200.0,
        "SM cycles one load that misses L1 and hits L2 waits (a spilled register "
        "reloaded from local memory once the spills no longer fit the L1 that "
        "shared memory leaves); the default is kept on every GPU, checked by "
        "bench/calibrate_constants.py GPU --rows ieee-fp32 (best of 100-400: 200 "
        "on A100, 250 on H100, within 0.2 MAPE points of 200)",
    ),
    "l1_latency_cycles": (
        33.0,
        "SM cycles one load that hits L1 waits (a spilled register reloaded from "
        "local memory while the spills fit the L1 that shared memory leaves): the "
        "A100's L1 hit latency measured by Abdelkhalik et al., 'Demystifying the "
        "Nvidia Ampere Architecture through Microbenchmarking and Instruction-level "
        "Analysis' (HPEC 2022), not fitted; kept on every GPU as l2_latency_cycles is",
    ),
    "wgmma_min_warps": (
        4.0,
        "warps per block from which a Hopper Triton kernel issues warpgroup MMA "
        "(one warpgroup = 4 warps)",
    ),
}

_NUMERIC_SECTIONS = ("sm", "compute", "memory", "launch")

_SM_KEYS = (
    "count",
    "clock_mhz",
    "max_warps",
    "max_threads",
    "max_blocks",
    "max_threads_per_block",
    "registers",
    "max_registers_per_thread",
    "register_alloc_unit",
    "smem_bytes",
    "smem_per_block_bytes",
    "smem_reserved_per_block_bytes",
    "smem_bytes_per_clk",
    "l1_smem_bytes",
    "warp_schedulers",
)
_COMPUTE_KEYS = (
    "tc_fp16_tflops",
    "tc_bf16_tflops",
    "tc_tf32_tflops",
    "tc_fp8_tflops",
    "fp32_tflops",
    "sfu_tops",
    "alu_tops",
    "mma_sync_fraction",
)
_MEMORY_KEYS = (
    "l2_bytes",
    "l2_assoc",
    "l2_line_bytes",
    "l2_bw_tbps",
    "l15_bytes",
    "l15_group_sms",
    "l15_bw_tbps",
    "l15_assoc",
    "dram_bytes",
    "dram_bw_tbps",
)
_LAUNCH_KEYS = ("launch_overhead_us",)
#: keys a section may give (with a source, like every other): what is left out
#: keeps its HwSpec default. ``max_clock_mhz``: the highest SM clock the GPU
#: runs at (its maximum boost), the ceiling of the power-limited boost of the
#: per-clock rates (kernels_catalog/gemm.py)
_OPTIONAL = {"sm": ("max_clock_mhz",)}
_REQUIRED = {
    "sm": _SM_KEYS,
    "compute": _COMPUTE_KEYS,
    "memory": _MEMORY_KEYS,
    "launch": _LAUNCH_KEYS,
}
_MMA_KINDS = ("mma_sync", "wgmma", "tcgen05", "mfma")


class UnknownHardwareError(KeyError):
    """Raised for a GPU name that no ``hw/*.toml`` file declares."""

    def __str__(self) -> str:  # KeyError quotes its message otherwise
        return str(self.args[0])


class HwFileError(ValueError):
    """Raised for a malformed hardware file; names the file and the key."""


@dataclass(frozen=True)
class HwSpec:
    """One GPU, spec and measured values side by side.

    Field names carry units. ``sm_*`` are per SM, rates are whole-chip.
    Prediction uses :meth:`rate` which prefers ``[measured]`` values.
    """

    key: str
    name: str
    aliases: tuple[str, ...]
    vendor: str
    arch: str
    compute_capability: str
    mma: str
    # per SM
    sm_count: int
    clock_mhz: float
    sm_max_warps: int
    sm_max_threads: int
    sm_max_blocks: int
    max_threads_per_block: int
    sm_registers: int
    max_registers_per_thread: int
    register_alloc_unit: int
    sm_smem_bytes: int
    smem_per_block_bytes: int
    smem_reserved_per_block_bytes: int
    smem_bytes_per_clk: float
    #: the SM's SRAM that L1 data cache and shared memory share: what shared
    #: memory leaves of it caches local (spilled) and global data
    l1_smem_bytes: int
    warp_schedulers: int
    # compute, whole chip, dense
    tc_fp16_tflops: float
    tc_bf16_tflops: float
    tc_tf32_tflops: float
    tc_fp8_tflops: float
    fp32_tflops: float
    sfu_tops: float
    #: integer/logic (ALU) pipe results per second beside the FP32 FMA pipe;
    #: 0 where integer and FP32 share one pipe (its work then runs as cuda_core)
    alu_tops: float
    mma_sync_fraction: float
    # memory
    l2_bytes: int
    l2_assoc: int
    l2_line_bytes: int
    l2_bw_tbps: float
    l15_bytes: int
    l15_group_sms: int
    l15_bw_tbps: float
    l15_assoc: int
    dram_bytes: int
    dram_bw_tbps: float
    launch_overhead_us: float
    #: the SM's maximum clock (its maximum boost, MHz); 0 where the file gives
    #: none. A grid that keeps fewer SMs busy than the chip has may run its SMs
    #: above the measured (power-limited) clock, up to this one
    max_clock_mhz: float = 0.0
    #: the SM clock the file states ``fp32_tflops`` at: the clock the model
    #: reads (``rate("clock_mhz")``) when the file is loaded; 0: that clock.
    #: The CUDA cores' rate is quoted on its own, not per clock, so its
    #: power-limited boost is bounded by ``max_clock_mhz`` over this clock
    #: (:attr:`fp32_clock_cap`), which stays with the rate when the clock alone
    #: is changed by hand (a slower clock then never runs the CUDA cores faster)
    fp32_clock_mhz: float = 0.0
    measured: Mapping[str, float] = field(default_factory=dict)
    calibration: Mapping[str, float] = field(default_factory=dict)
    sources: Mapping[str, str] = field(default_factory=dict)
    file_sha256: str = ""

    # ------------------------------------------------------------------
    def rate(self, key: str) -> float:
        """The value used for prediction: measured if the file has one, else spec."""
        if key in self.measured:
            return float(self.measured[key])
        return float(getattr(self, key))

    def cal(self, key: str) -> float:
        """A calibration constant (default from :data:`CALIBRATION_DEFAULTS`)."""
        if key in self.calibration:
            return float(self.calibration[key])
        return CALIBRATION_DEFAULTS[key][0]

    @property
    def clock_cap(self) -> float:
        """The per-clock rates' (shared memory's) boost ceiling: ``max_clock_mhz``
        over the measured clock, at least 1; ``inf`` where the file gives no
        maximum."""
        return _clock_ceiling(self.max_clock_mhz, self.rate("clock_mhz"))

    @property
    def fp32_clock_cap(self) -> float:
        """The CUDA cores' boost ceiling: ``max_clock_mhz`` over the clock
        ``fp32_tflops`` is stated at (:attr:`fp32_clock_mhz`), at least 1; ``inf``
        where the file gives no maximum."""
        return _clock_ceiling(self.max_clock_mhz, self.fp32_clock_mhz if self.fp32_clock_mhz > 0
                              else self.rate("clock_mhz"))

    @property
    def launch_us(self) -> float:
        """Per-kernel launch overhead: the calibrated value if set, else ``[launch]``."""
        if "launch_overhead_us" in self.calibration:
            return float(self.calibration["launch_overhead_us"])
        return float(self.launch_overhead_us)

    @property
    def program_launch_us(self) -> float:
        """Launch overhead of the families lowered from tile programs:
        ``program_launch_overhead_us`` where the GPU file sets it, else
        :attr:`launch_us` (DESIGN.md, "Calibration": a constant that two
        families' data set to different floors is split per family)."""
        if "program_launch_overhead_us" in self.calibration:
            return float(self.calibration["program_launch_overhead_us"])
        return self.launch_us

    @property
    def has_l15(self) -> bool:
        return self.l15_bytes > 0 and self.l15_group_sms > 0 and self.l15_bw_tbps > 0

    def tc_tflops(self, dtype: str) -> float:
        """Dense tensor-core peak for an input dtype (measured fp16 scales the others)."""
        spec = {
            "float16": self.tc_fp16_tflops,
            "bfloat16": self.tc_bf16_tflops,
            "tf32": self.tc_tf32_tflops,
            "float8": self.tc_fp8_tflops,
        }[dtype]
        if "tc_fp16_tflops" in self.measured and self.tc_fp16_tflops > 0:
            return spec * self.measured["tc_fp16_tflops"] / self.tc_fp16_tflops
        return spec

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["aliases"] = list(self.aliases)
        return d

    def fingerprint(self) -> str:
        """Short hash over every value, for result metadata."""
        blob = json.dumps(self.to_dict(), sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


# ----------------------------------------------------------------------
def hw_dir() -> Path:
    """Directory holding the GPU TOML files (installed package or source tree)."""
    try:
        p = resources.files("tsbatch._hw")
        path = Path(str(p))
        if path.is_dir() and any(path.glob("*.toml")):
            return path
    except (ModuleNotFoundError, TypeError):  # pragma: no cover - odd installs
        pass
    return Path(__file__).resolve().parent.parent / "hw"


def _num(path: Path, section: str, key: str, entry) -> tuple[float, str]:
    if not isinstance(entry, dict) or "value" not in entry or "source" not in entry:
        raise HwFileError(
            f"{path}: [{section}] {key} must be an inline table "
            "{ value = <number>, source = \"...\" }"
        )
    value = entry["value"]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise HwFileError(f"{path}: [{section}] {key}.value must be a number, got {value!r}")
    if value < 0:
        raise HwFileError(f"{path}: [{section}] {key}.value must be >= 0, got {value!r}")
    source = entry["source"]
    if not isinstance(source, str) or not source.strip():
        raise HwFileError(f"{path}: [{section}] {key}.source must be a non-empty string")
    return value, source


def load_hw_file(path: str | Path) -> HwSpec:
    """Parse one GPU TOML file into a :class:`HwSpec` (strict: every key, every source)."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            raw_bytes = fh.read()
        doc = tomllib.loads(raw_bytes.decode())
    except OSError as exc:
        raise HwFileError(f"{path}: cannot read hardware file ({exc.strerror})") from exc
    except tomllib.TOMLDecodeError as exc:
        raise HwFileError(f"{path}: invalid TOML ({exc})") from exc

    ident = doc.get("identity")
    if not isinstance(ident, dict):
        raise HwFileError(f"{path}: missing [identity] section")
    for k in ("name", "aliases", "vendor", "arch", "compute_capability", "mma"):
        if k not in ident:
            raise HwFileError(f"{path}: [identity] lacks '{k}'")
    if ident["mma"] not in _MMA_KINDS:
        raise HwFileError(f"{path}: [identity] mma must be one of {_MMA_KINDS}, got {ident['mma']!r}")

    values: dict[str, float] = {}
    sources: dict[str, str] = {}
    for section, keys in _REQUIRED.items():
        sec = doc.get(section)
        if not isinstance(sec, dict):
            raise HwFileError(f"{path}: missing [{section}] section")
        for k in keys:
            if k not in sec:
                raise HwFileError(f"{path}: [{section}] lacks '{k}'")
            v, s = _num(path, section, k, sec[k])
            fname = f"sm_{k}" if section == "sm" and k in (
                "count", "max_warps", "max_threads", "max_blocks", "registers", "smem_bytes"
            ) else k
            values[fname] = v
            sources[f"{section}.{k}"] = s
        opt = _OPTIONAL.get(section, ())
        for k in opt:
            if k in sec:
                v, s = _num(path, section, k, sec[k])
                values[k] = v
                sources[f"{section}.{k}"] = s
        extra = set(sec) - set(keys) - set(opt)
        if extra:
            raise HwFileError(f"{path}: [{section}] has unknown keys {sorted(extra)}")

    measured: dict[str, float] = {}
    for k, entry in (doc.get("measured") or {}).items():
        v, s = _num(path, "measured", k, entry)
        target = k
        if target not in values:
            raise HwFileError(f"{path}: [measured] {k} matches no spec key")
        measured[target] = float(v)
        sources[f"measured.{k}"] = s

    calibration: dict[str, float] = {}
    for k, entry in (doc.get("calibration") or {}).items():
        if k not in CALIBRATION_DEFAULTS:
            raise HwFileError(
                f"{path}: [calibration] {k} is not a known constant; known: {sorted(CALIBRATION_DEFAULTS)}"
            )
        v, s = _num(path, "calibration", k, entry)
        calibration[k] = float(v)
        sources[f"calibration.{k}"] = s

    ints = {
        "sm_count", "sm_max_warps", "sm_max_threads", "sm_max_blocks",
        "max_threads_per_block", "sm_registers", "max_registers_per_thread",
        "register_alloc_unit", "sm_smem_bytes", "smem_per_block_bytes",
        "smem_reserved_per_block_bytes", "l1_smem_bytes", "warp_schedulers", "l2_bytes", "l2_assoc",
        "l2_line_bytes", "l15_bytes", "l15_group_sms", "l15_assoc", "dram_bytes",
    }
    kwargs = {k: (int(v) if k in ints else float(v)) for k, v in values.items()}
    if 0 < kwargs.get("max_clock_mhz", 0.0) < kwargs["clock_mhz"]:
        raise HwFileError(
            f"{path}: [sm] max_clock_mhz ({kwargs['max_clock_mhz']:g}) must be at least "
            f"clock_mhz ({kwargs['clock_mhz']:g}): it is the SM's highest clock"
        )
    if kwargs["l1_smem_bytes"] < kwargs["sm_smem_bytes"]:
        raise HwFileError(
            f"{path}: [sm] l1_smem_bytes ({kwargs['l1_smem_bytes']}) must be at least "
            f"smem_bytes ({kwargs['sm_smem_bytes']}): shared memory is carved from it"
        )
    # derived, not read: the clock the file states fp32_tflops at (HwSpec.fp32_clock_mhz)
    fp32_clock = float(measured.get("clock_mhz", kwargs["clock_mhz"]))
    sources["derived.fp32_clock_mhz"] = (
        "the clock the model reads when the file is loaded ("
        + ("[measured]" if "clock_mhz" in measured else "[sm]")
        + " clock_mhz), the clock its fp32_tflops is stated at")
    return HwSpec(
        key=path.stem,
        name=str(ident["name"]),
        aliases=tuple(str(a).lower() for a in ident["aliases"]),
        vendor=str(ident["vendor"]),
        arch=str(ident["arch"]),
        compute_capability=str(ident["compute_capability"]),
        mma=str(ident["mma"]),
        measured=measured,
        calibration=calibration,
        sources=sources,
        file_sha256=hashlib.sha256(raw_bytes).hexdigest(),
        fp32_clock_mhz=fp32_clock,
        **kwargs,
    )


def _clock_ceiling(max_clock: float, clock: float) -> float:
    """A rate's power-limited boost ceiling: the maximum clock over the clock the
    rate is stated at, never below 1 (no ceiling: ``inf`` where no maximum is given)."""
    return max(max_clock / clock, 1.0) if max_clock > 0 else math.inf


@lru_cache(maxsize=None)
def _load_shipped(path: Path) -> HwSpec:
    """One shipped GPU file, parsed once per process."""
    return load_hw_file(path)


#: a GPU file's ``aliases = [...]`` line (the fast look-up of :func:`get_hw`)
_ALIASES_LINE = re.compile(r"^aliases\s*=\s*\[([^\]]*)\]", re.M)


@lru_cache(maxsize=None)
def _alias_index() -> dict[str, Path | None]:
    """Name -> shipped file, from each file's stem and ``aliases`` line alone (no
    TOML parse; None for a name two files claim, which the full registry then
    reports): :func:`get_hw` parses just the file asked for, where parsing
    every file cost a tenth of a second at each start."""
    index: dict[str, Path | None] = {}
    for p in sorted(hw_dir().glob("*.toml")):
        m = _ALIASES_LINE.search(p.read_text(encoding="utf-8"))
        names = re.findall(r'"([^"]*)"', m.group(1)) if m else []
        for name in {p.stem, *(a.lower() for a in names)}:
            index[name] = p if index.get(name, p) == p else None
    return index


@lru_cache(maxsize=None)
def _registry() -> dict[str, HwSpec]:
    reg: dict[str, HwSpec] = {}
    for p in sorted(hw_dir().glob("*.toml")):
        spec = _load_shipped(p)
        for name in (spec.key, *spec.aliases):
            other = reg.get(name)
            if other is not None and other.key != spec.key:
                raise HwFileError(f"{p}: alias '{name}' already used by {other.key}.toml")
            reg[name] = spec
    return reg


def list_hw() -> list[str]:
    """File keys of every known GPU (``a100``, ``h100_sxm``, ...)."""
    return sorted({s.key for s in _registry().values()})


def get_hw(name: str | HwSpec) -> HwSpec:
    """Look a GPU up by file key or alias, case-insensitively."""
    if isinstance(name, HwSpec):
        return name
    key = str(name).strip().lower().replace(" ", "_")
    path = _alias_index().get(key)
    if path is not None:
        spec = _load_shipped(path)
        if key in (spec.key, *spec.aliases):
            return spec
    reg = _registry()
    if key in reg:
        return reg[key]
    known = ", ".join(sorted(reg))
    raise UnknownHardwareError(f"unknown GPU '{name}'; known names: {known}")
