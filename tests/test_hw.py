"""Hardware spec files: strict loading, the alias registry, sanity relations.

Covers every ``hw/*.toml`` GPU file (through :func:`tsbatch.hw.load_hw_file`) and
every ``hw/systems/*.toml`` multi-GPU system file (plain ``tomllib``; nothing in
the package loads those yet). No network, no GPU.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

import pytest

from tsbatch.hw import (
    HwFileError,
    HwSpec,
    UnknownHardwareError,
    get_hw,
    hw_dir,
    list_hw,
    load_hw_file,
)

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

HW_DIR = hw_dir()
GPU_FILES = sorted(HW_DIR.glob("*.toml"))
SYSTEM_FILES = sorted((HW_DIR / "systems").glob("*.toml"))

#: Names the rest of the project relies on, with the file each must resolve to.
REQUIRED_ALIASES = {
    "a100": "a100",
    "h100": "h100_sxm",
    "h100_sxm": "h100_sxm",
    "h200": "h200",
    "b200": "b200",
    "rtx_pro_6000": "rtx_pro_6000",
    "mi210": "mi210",
}

#: Peak fp16 must match sm_count x clock x per-SM rate to this relative tolerance.
#: Loose because vendors quote peaks at slightly different clocks than the boost
#: clock a file records (e.g. NVIDIA's 2.25 PFLOPS for B200 against 1965 MHz).
PEAK_REL_TOL = 0.10

#: Dense fp16 multiply-accumulates per clock per tensor core, by (arch, cc major).
#: Architectural facts from the vendor documents, not results of the files:
#: Ampere GA100 third-gen tensor core 256 FMA/clk (A100 whitepaper); Hopper doubles
#: it (H100 whitepaper); datacenter Blackwell doubles Hopper (8192 FLOP/clk/SM,
#: NVIDIA cudnn-frontend peak table); consumer Blackwell sm_12x runs 1024 FLOP/clk/SM
#: (same table); CDNA2 matrix core 128 FMA/clk (MI210: 4 per CU, 181 TFLOPS at 1.7 GHz
#: over 104 CUs).
_FMA_PER_CLK_PER_TENSOR_CORE = {
    ("ampere", 8): 256,
    ("hopper", 9): 512,
    ("blackwell", 10): 1024,
    ("blackwell", 12): 128,
    ("cdna2", None): 128,
    # issue 36: GA102 (sm_86) and AD102 (sm_89) tensor cores do half GA100's dense fp16
    # FMA per clock (GA102 whitepaper: 128 dense FP16 FMA/clk per tensor core; Ada
    # whitepaper: the same per SM-clock, with FP8 at twice that); CDNA3 doubles CDNA2
    # (CDNA 3 whitepaper: 2048 dense FP16 FLOP/clk/CU)
    ("ampere", "8.6"): 128,
    ("ada", "8.9"): 128,
    ("cdna3", None): 256,
}
#: products that run fp16 with FP32 accumulation at half the die's tensor rate (their
#: datasheets: L40 181 TFLOPS and L20 119.5 TFLOPS dense fp16, where the L40S and RTX 6000
#: Ada with the same AD102 SM quote 362 and 364)
_HALF_RATE_FP32_ACC = {"l40", "l20"}
_TENSOR_CORES_PER_SM = 4  # every part here: 4 sub-partitions / SIMDs, one unit each


def _per_sm_fp16_flop_per_clk(spec: HwSpec) -> int:
    """Dense fp16 FLOP per clock per SM (or CU), derived from the architecture."""
    if spec.vendor == "nvidia":
        key = (spec.arch, spec.compute_capability)
        if key not in _FMA_PER_CLK_PER_TENSOR_CORE:
            key = (spec.arch, int(spec.compute_capability.split(".")[0]))
    else:
        key = (spec.arch, None)
    fma = _FMA_PER_CLK_PER_TENSOR_CORE[key]
    if spec.key in _HALF_RATE_FP32_ACC:
        fma //= 2
    return 2 * fma * _TENSOR_CORES_PER_SM


def _all_specs() -> list[HwSpec]:
    return [load_hw_file(p) for p in GPU_FILES]


def _walk_numbers(node, path=()):
    """Yield (path, entry) for every number in a parsed TOML document.

    ``entry`` is the ``{value, source}`` table when the number sits in one, else the
    bare number itself (which is an error in these files).
    """
    if isinstance(node, dict):
        if "value" in node and isinstance(node["value"], (int, float)) and not isinstance(
            node["value"], bool
        ):
            yield path, node
            return
        for k, v in node.items():
            yield from _walk_numbers(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _walk_numbers(v, (*path, str(i)))
    elif isinstance(node, (int, float)) and not isinstance(node, bool):
        yield path, node


# ----------------------------------------------------------------------
# Loading


def test_hw_dir_has_the_expected_files():
    stems = {p.stem for p in GPU_FILES}
    assert {"a100", "h100_sxm", "h200", "b200", "rtx_pro_6000", "mi210"} <= stems
    assert {"dgx_a100", "dgx_h100"} <= {p.stem for p in SYSTEM_FILES}


@pytest.mark.parametrize("path", GPU_FILES, ids=lambda p: p.name)
def test_every_gpu_file_loads(path: Path):
    spec = load_hw_file(path)
    assert spec.key == path.stem
    assert spec.sm_count > 0 and spec.clock_mhz > 0
    assert spec.aliases, "a GPU file must declare at least one alias"
    assert spec.file_sha256


def test_list_hw_matches_the_files():
    assert list_hw() == sorted(p.stem for p in GPU_FILES)


# ----------------------------------------------------------------------
# Registry


@pytest.mark.parametrize("alias,key", sorted(REQUIRED_ALIASES.items()))
def test_required_alias_resolves_case_insensitively(alias: str, key: str):
    for name in (alias, alias.upper(), alias.title(), f"  {alias}  "):
        assert get_hw(name).key == key


def test_alias_with_space_resolves():
    assert get_hw("RTX PRO 6000").key == "rtx_pro_6000"


def test_get_hw_passes_a_spec_through():
    spec = get_hw("a100")
    assert get_hw(spec) is spec


def test_unknown_gpu_lists_known_names():
    with pytest.raises(UnknownHardwareError) as info:
        get_hw("not-a-gpu-9000")
    msg = str(info.value)
    assert "not-a-gpu-9000" in msg
    for key in REQUIRED_ALIASES:
        assert key in msg
    # a KeyError subclass that still prints its message unquoted
    assert isinstance(info.value, KeyError)
    assert not msg.startswith("'")


def test_aliases_are_unique_across_files():
    owner: dict[str, str] = {}
    for spec in _all_specs():
        for name in (spec.key, *spec.aliases):
            assert owner.setdefault(name, spec.key) == spec.key, (
                f"alias {name!r} used by {owner[name]} and {spec.key}"
            )


# ----------------------------------------------------------------------
# Malformed files


@pytest.fixture
def good_text() -> str:
    return (HW_DIR / "a100.toml").read_text()


def _write(tmp_path: Path, text: str, name: str = "broken.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def _assert_rejected(tmp_path: Path, text: str, key: str) -> None:
    """Loading ``text`` raises HwFileError naming the file and ``key``."""
    path = _write(tmp_path, text)
    with pytest.raises(HwFileError) as info:
        load_hw_file(path)
    assert str(path) in str(info.value) and key in str(info.value)


def _replace_once(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, old
    return text.replace(old, new)


def test_copy_of_a_good_file_loads(tmp_path: Path, good_text: str):
    spec = load_hw_file(_write(tmp_path, good_text, "copy.toml"))
    assert spec.key == "copy" and spec.sm_count == 108


def test_missing_source_names_file_and_key(tmp_path: Path, good_text: str):
    text = re.sub(
        r'^count = \{ value = 108, source = "[^"]*" \}$',
        "count = { value = 108 }",
        good_text,
        count=1,
        flags=re.M,
    )
    assert text != good_text
    _assert_rejected(tmp_path, text, "count")


def test_empty_source_names_file_and_key(tmp_path: Path, good_text: str):
    text = re.sub(
        r'^(l2_line_bytes = \{ value = 128, source = )"[^"]*"',
        r'\1"   "',
        good_text,
        count=1,
        flags=re.M,
    )
    assert text != good_text
    _assert_rejected(tmp_path, text, "l2_line_bytes")


def test_negative_value_names_file_and_key(tmp_path: Path, good_text: str):
    text = _replace_once(good_text, "dram_bw_tbps = { value = 2.039,", "dram_bw_tbps = { value = -2.039,")
    _assert_rejected(tmp_path, text, "dram_bw_tbps")


def test_non_numeric_value_names_file_and_key(tmp_path: Path, good_text: str):
    text = _replace_once(good_text, "max_blocks = { value = 32,", 'max_blocks = { value = "32",')
    _assert_rejected(tmp_path, text, "max_blocks")


def test_unknown_key_names_file_and_key(tmp_path: Path, good_text: str):
    text = _replace_once(
        good_text,
        "[memory]\n",
        '[memory]\nl3_bytes = { value = 1, source = "invented" }\n',
    )
    _assert_rejected(tmp_path, text, "l3_bytes")


def test_missing_key_names_file_and_key(tmp_path: Path, good_text: str):
    text = re.sub(r"^l2_assoc = .*\n", "", good_text, count=1, flags=re.M)
    assert text != good_text
    _assert_rejected(tmp_path, text, "l2_assoc")


def test_unknown_measured_key_names_file_and_key(tmp_path: Path, good_text: str):
    text = good_text + '\nwarp_speed = { value = 9, source = "invented" }\n'
    _assert_rejected(tmp_path, text, "warp_speed")


def test_unknown_calibration_constant_names_file_and_key(tmp_path: Path, good_text: str):
    fudge = 'fudge = { value = 1.0, source = "invented" }\n'
    if "\n[calibration]\n" in good_text:
        text = good_text.replace("\n[calibration]\n", "\n[calibration]\n" + fudge, 1)
    else:
        text = good_text + "\n[calibration]\n" + fudge
    _assert_rejected(tmp_path, text, "fudge")


def test_bad_mma_kind_names_file(tmp_path: Path, good_text: str):
    text = _replace_once(good_text, 'mma = "mma_sync"', 'mma = "magic"')
    _assert_rejected(tmp_path, text, "mma")


def test_bad_toml_names_file(tmp_path: Path, good_text: str):
    path = _write(tmp_path, good_text + "\nthis is = = not toml [\n")
    with pytest.raises(HwFileError) as info:
        load_hw_file(path)
    assert str(path) in str(info.value) and "TOML" in str(info.value)


def test_missing_file_names_file(tmp_path: Path):
    path = tmp_path / "absent.toml"
    with pytest.raises(HwFileError) as info:
        load_hw_file(path)
    assert str(path) in str(info.value)


# ----------------------------------------------------------------------
# Sanity relations for every GPU


@pytest.fixture(params=GPU_FILES, ids=lambda p: p.stem)
def spec(request) -> HwSpec:
    return load_hw_file(request.param)


def test_bf16_at_least_fp16(spec: HwSpec):
    assert spec.tc_bf16_tflops >= spec.tc_fp16_tflops * 0.99


def test_block_smem_fits_in_sm_smem(spec: HwSpec):
    assert spec.smem_per_block_bytes <= spec.sm_smem_bytes
    assert spec.smem_per_block_bytes + spec.smem_reserved_per_block_bytes <= spec.sm_smem_bytes


def test_l2_smaller_than_dram(spec: HwSpec):
    assert 0 < spec.l2_bytes < spec.dram_bytes
    assert spec.l2_line_bytes > 0


def test_occupancy_limits_consistent(spec: HwSpec):
    warp = 64 if spec.vendor == "amd" else 32
    assert spec.sm_max_threads == spec.sm_max_warps * warp
    assert spec.max_threads_per_block <= spec.sm_max_threads
    assert spec.sm_max_blocks >= 1
    assert spec.register_alloc_unit > 0 and spec.sm_registers % spec.register_alloc_unit == 0


def test_peak_fp16_matches_sm_count_clock_and_arch_rate(spec: HwSpec):
    per_sm = _per_sm_fp16_flop_per_clk(spec)
    derived_tflops = spec.sm_count * spec.clock_mhz * 1e6 * per_sm / 1e12
    assert spec.tc_fp16_tflops == pytest.approx(derived_tflops, rel=PEAK_REL_TOL)


@pytest.mark.parametrize(
    "path",
    [p for p in GPU_FILES if load_hw_file(p).vendor == "nvidia"],
    ids=lambda p: p.stem,
)
def test_nvidia_dtype_ratios(path: Path):
    # NVIDIA tensor cores: TF32 at half, FP8 (where present) at twice the fp16 rate.
    spec = load_hw_file(path)
    assert spec.tc_tf32_tflops == pytest.approx(spec.tc_fp16_tflops / 2, rel=0.02)
    if spec.tc_fp8_tflops:
        assert spec.tc_fp8_tflops == pytest.approx(2 * spec.tc_fp16_tflops, rel=0.02)


def test_l15_tier_all_or_nothing(spec: HwSpec):
    parts = (spec.l15_bytes, spec.l15_group_sms, spec.l15_bw_tbps, spec.l15_assoc)
    assert all(p > 0 for p in parts) or all(p == 0 for p in parts)
    if spec.has_l15:
        assert spec.l15_group_sms <= spec.sm_count
        assert spec.l15_bw_tbps > spec.l2_bw_tbps  # a faster tier than L2


def test_mma_sync_fraction_is_a_fraction(spec: HwSpec):
    assert 0 < spec.mma_sync_fraction <= 1
    if spec.mma in ("mma_sync", "mfma"):
        assert spec.mma_sync_fraction == 1.0


def test_measured_values_are_plausible(spec: HwSpec):
    # Microbenchmarks land near the spec: never an order of magnitude off.
    for key, value in spec.measured.items():
        nominal = float(getattr(spec, key))
        assert nominal > 0, key
        assert 0.2 * nominal <= value <= 1.2 * nominal, (key, value, nominal)


def test_calibration_constants_in_range(spec: HwSpec):
    for key in ("l2_capacity_fraction", "dram_efficiency", "tc_efficiency"):
        assert 0 < spec.cal(key) <= 1


# ----------------------------------------------------------------------
# Provenance


@pytest.mark.parametrize("path", GPU_FILES + SYSTEM_FILES, ids=lambda p: p.name)
def test_every_number_has_a_non_empty_source(path: Path):
    doc = tomllib.loads(path.read_text())
    found = 0
    for where, entry in _walk_numbers(doc):
        found += 1
        label = f"{path.name}: {'.'.join(where)}"
        assert isinstance(entry, dict), f"{label} is a bare number without a source"
        source = entry.get("source")
        assert isinstance(source, str) and source.strip(), f"{label} has no source"
        value = entry["value"]
        assert math.isfinite(value) and value >= 0, label
    assert found > 0


def test_loaded_sources_cover_every_numeric_field(spec: HwSpec):
    for key, source in spec.sources.items():
        assert source.strip(), key
    # one spec source per numeric HwSpec field, so nothing numeric came in unsourced
    # (less the fields the loader derives from others, each with a ``derived.`` source)
    derived = [k.split(".", 1)[1] for k in spec.sources if k.startswith("derived.")]
    assert derived == ["fp32_clock_mhz"]
    numeric_fields = [f for f in dataclasses.fields(HwSpec) if f.type in ("int", "float")
                      and f.name not in derived]
    spec_sources = [k for k in spec.sources if k.split(".")[0] in ("sm", "compute", "memory", "launch")]
    # an optional key the file leaves out keeps its default and has no source;
    # one it gives has a source (counted above)
    absent = [f for f in ("max_clock_mhz",) if "sm." + f not in spec.sources]
    for f in absent:
        assert getattr(spec, f) == 0.0, f
    assert len(spec_sources) == len(numeric_fields) - len(absent)
    for key in spec.measured:
        assert spec.sources[f"measured.{key}"].strip(), key
    for key in spec.calibration:
        assert spec.sources[f"calibration.{key}"].strip(), key


# ----------------------------------------------------------------------
# System files


@pytest.mark.parametrize("path", SYSTEM_FILES, ids=lambda p: p.name)
def test_system_file_parses_and_references_a_gpu(path: Path):
    doc = tomllib.loads(path.read_text())
    system = doc["system"]
    assert isinstance(system["name"], str) and system["name"]
    assert system["gpu"] in list_hw(), f"{path.name}: unknown GPU key {system['gpu']!r}"
    get_hw(system["gpu"])  # resolves through the registry too
    assert system["gpus_per_node"]["value"] >= 1

    links = doc["links"]
    assert links, f"{path.name} declares no links"
    scopes = set()
    for name, link in links.items():
        for key in ("kind", "scope", "topology"):
            assert isinstance(link[key], str) and link[key], (name, key)
        assert link["scope"] in ("intra_node", "inter_node"), name
        scopes.add(link["scope"])
        assert link["bw_unidir_gbps"]["value"] > 0, name
        assert link["alpha_us"]["value"] > 0, name
    assert "intra_node" in scopes


@pytest.mark.parametrize("path", SYSTEM_FILES, ids=lambda p: p.name)
def test_system_intra_node_faster_than_inter_node(path: Path):
    links = tomllib.loads(path.read_text())["links"].values()
    intra = [l["bw_unidir_gbps"]["value"] for l in links if l["scope"] == "intra_node"]
    inter = [l["bw_unidir_gbps"]["value"] for l in links if l["scope"] == "inter_node"]
    if inter:
        assert min(intra) > max(inter)


def test_max_clock_is_optional_and_checked(tmp_path):
    """[sm] max_clock_mhz may be left out (0: no maximum) and, when given, is
    at least the spec clock_mhz: one clear error otherwise."""
    from tsbatch.hw import HwFileError, hw_dir, load_hw_file
    text = (hw_dir() / "a100.toml").read_text()
    assert load_hw_file(hw_dir() / "a100.toml").max_clock_mhz == 1410.0
    import re
    without = re.sub(r"(?m)^max_clock_mhz = .*\n", "", text)
    p = tmp_path / "x.toml"
    p.write_text(without)
    assert load_hw_file(p).max_clock_mhz == 0.0
    # no maximum: no boost ceiling; with one, the ratios over the clocks read
    none = load_hw_file(p)
    assert none.clock_cap == math.inf and none.fp32_clock_cap == math.inf
    a100 = load_hw_file(hw_dir() / "a100.toml")
    assert a100.clock_cap == a100.fp32_clock_cap == 1410.0 / 1387.0
    p.write_text(text.replace("max_clock_mhz = { value = 1410", "max_clock_mhz = { value = 1300"))
    with pytest.raises(HwFileError, match="max_clock_mhz"):
        load_hw_file(p)
