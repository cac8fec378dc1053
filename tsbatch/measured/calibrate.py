"""``tsbatch calibrate``: turn ``tsbatch measure`` results into a hw file's calibrated values.

Pure data shaping (numpy and polars; no GPU). From a directory written by
``tsbatch measure``:

``bandwidth.parquet`` (:func:`analyze_bandwidth`)
    The DRAM plateau is the median rate of the largest working sets (the top
    octave of the sweep). Cache plateaus are runs of at least three
    consecutive sizes spanning at least 0.6 octave whose (median-of-3 smoothed) rate stays within a band
    of ``tol`` (in log rate: 3 times the robust point-to-point noise,
    clamped to 3-12 %) of the run's median and that lie above the DRAM
    plateau (by at least 15 % and by twice the band); adjacent runs on the
    same level (closer than twice the band) merge, and a run lower than the one after it (a
    ramp-up) is dropped. The last cache plateau before DRAM is L2, the one
    before it (when the sweep shows a third level, TileSight Fig. 2: B200)
    is L1.5. A cliff is the working-set size where the rate falls through
    the midpoint (linear GB/s) between a plateau and the next level,
    interpolated in log size between the last point above and the next.
``matmul.parquet`` (:func:`tc_ceilings`)
    The tensor-core ceiling per dtype is the fastest probe (TFLOPS).
``gemm.parquet`` (:func:`best_gemm_tflops`, :func:`launch_floor_us`)
    The best fp16/bf16 throughput over every row gives ``tc_efficiency``
    (against the fp16 ceiling, at most 1); the smallest kernel time gives
    the launch floor.

The output is a copy of the GPU's hw TOML in which only the lines of the
calibrated keys in ``[measured]`` (``dram_bw_tbps``, ``l2_bw_tbps``,
``l15_bw_tbps``, ``tc_fp16_tflops``) and ``[calibration]``
(``l2_capacity_fraction``, ``tc_efficiency``, ``launch_overhead_us``) are
replaced or inserted (comments and every other line are kept), each with a
source naming the measurement file, the device and the date. The result is
checked with :func:`tsbatch.hw.load_hw_file` before it is moved into place.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from tsbatch.errors import InputError

__all__ = [
    "Plateau",
    "BandwidthFit",
    "analyze_bandwidth",
    "tc_ceilings",
    "best_gemm_tflops",
    "launch_floor_us",
    "Measurements",
    "read_measurements",
    "Calibration",
    "calibrate",
    "CALIBRATED_KEYS",
    "update_toml_text",
    "summary_text",
    "write_calibrated",
    "run_calibrate_cli",
]

MIB = float(1 << 20)
#: a cache plateau lies at least this far (log rate, 15 %) above the DRAM plateau
_MIN_STEP = math.log(1.15)
FILES = ("bandwidth.parquet", "matmul.parquet", "gemm.parquet")


# ============================================================================ bandwidth
@dataclass(frozen=True)
class Plateau:
    """A flat stretch of the bandwidth curve: its median rate and extent."""

    gbps: float
    first_bytes: int
    last_bytes: int
    n_points: int
    i0: int
    i1: int

    def describe(self) -> str:
        return (f"{self.gbps:,.0f} GB/s over {self.n_points} working sets "
                f"{self.first_bytes / MIB:.3g}-{self.last_bytes / MIB:.4g} MiB")


@dataclass(frozen=True)
class BandwidthFit:
    """Levels and cliffs found in one bandwidth-versus-working-set curve."""

    dram: Plateau
    caches: tuple[Plateau, ...]                # ascending size, descending rate
    l2: Plateau | None
    l15: Plateau | None
    l2_cliff_bytes: float | None
    l15_cliff_bytes: float | None
    noise: float                               # robust point-to-point noise (log rate)
    tol: float                                 # plateau band used (log rate)
    warnings: tuple[str, ...] = ()


def _median3(v: np.ndarray) -> np.ndarray:
    if v.size < 3:
        return v.copy()
    out = v.copy()
    out[1:-1] = np.median(np.stack([v[:-2], v[1:-1], v[2:]]), axis=0)
    return out


def _cliff(lx: np.ndarray, lin: np.ndarray, i0: int, end: int, hi: float, lo: float) -> float | None:
    """Size where ``lin`` falls through the midpoint of ``hi`` and ``lo`` after index ``i0``."""
    t = 0.5 * (hi + lo)
    above = np.flatnonzero(lin[i0:end + 1] >= t)
    if above.size == 0:
        return float(2.0 ** lx[i0])
    i = i0 + int(above[-1])
    if i >= end:
        return None
    f = (lin[i] - t) / (lin[i] - lin[i + 1])
    return float(2.0 ** (lx[i] + f * (lx[i + 1] - lx[i])))


def analyze_bandwidth(sizes: Sequence[float], gbps: Sequence[float], *,
                      min_points: int = 3, min_octaves: float = 0.6) -> BandwidthFit:
    """Find the DRAM plateau, the cache plateaus (L2, L1.5) and their cliffs.

    ``sizes`` are working sets in bytes, ``gbps`` the read rates (1e9 B/s).
    Repeated sizes are combined by their median. Raises :class:`InputError`
    when the curve is too short or has non-positive values.
    """
    x = np.asarray(sizes, dtype=np.float64)
    y = np.asarray(gbps, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise InputError("bandwidth: 'bytes' and 'gbps' must be columns of equal length")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y)) and np.all(x > 0) and np.all(y > 0)):
        raise InputError("bandwidth: 'bytes' and 'gbps' must be finite and positive")
    ux = np.unique(x)
    if ux.size < 2 * min_points:
        raise InputError(f"bandwidth: {ux.size} distinct working-set sizes; at least "
                         f"{2 * min_points} are needed to find plateaus")
    uy = np.array([np.median(y[x == v]) for v in ux])
    x, y = ux, uy
    n = x.size
    lx = np.log2(x)
    ly = np.log(y)
    s = _median3(ly)
    lin = np.exp(s)

    # noise from second differences (a constant slope cancels; white noise of sigma
    # gives N(0, 6 sigma^2)), by their lower quartile so that the knees of up to half
    # of the points do not count (|z| has its 25th percentile at 0.3186)
    d2 = ly[2:] - 2.0 * ly[1:-1] + ly[:-2]
    noise = float(np.quantile(np.abs(d2), 0.25) / 0.3186 / math.sqrt(6.0))
    tol = float(min(0.12, max(0.03, 3.0 * noise)))
    warnings: list[str] = []

    # DRAM: the top octave of the sweep (at least three sizes)
    big = np.flatnonzero(x >= x[-1] / 2.0)
    if big.size < min_points:
        big = np.arange(n - min_points, n)
    dram_lvl = float(np.median(y[big]))
    dram = Plateau(dram_lvl, int(x[big[0]]), int(x[-1]), int(big.size), int(big[0]), n - 1)
    spread = float(ly[big].max() - ly[big].min())
    if spread > 3 * tol:
        warnings.append(f"the largest working sets ({x[big[0]] / MIB:.0f}-{x[-1] / MIB:.0f} MiB) "
                        f"vary by {100 * (math.exp(spread) - 1):.0f} %: the sweep may not reach "
                        "the DRAM plateau (measure larger working sets)")

    # runs of near-constant smoothed rate
    runs: list[list[int]] = []
    i = 0
    while i < n:
        j = i + 1
        while j < n and abs(s[j] - float(np.median(s[i:j]))) <= tol:
            j += 1
        runs.append([i, j - 1])
        i = j
    # keep runs of min_points or more; then merge the closest neighbours while
    # their levels differ by at most 2 tol (one level cut by noise or a knee)
    merged = [[a, b, float(np.median(ly[a:b + 1]))] for a, b in runs
              if b - a + 1 >= min_points and lx[b] - lx[a] >= min_octaves - 1e-9]
    while len(merged) > 1:
        steps = [abs(merged[k][2] - merged[k + 1][2]) for k in range(len(merged) - 1)]
        k = int(np.argmin(steps))
        if steps[k] > 2 * tol:
            break
        a, b = merged[k][0], merged[k + 1][1]
        merged[k:k + 2] = [[a, b, float(np.median(ly[a:b + 1]))]]

    caches: list[list] = []
    for a, b, lvl in merged:
        if lvl <= math.log(dram_lvl) + max(2 * tol, _MIN_STEP) or a >= big[0]:
            continue
        while caches and caches[-1][2] <= lvl + tol:
            warnings.append(f"dropped a {math.exp(caches[-1][2]):,.0f} GB/s stretch at "
                            f"{x[caches[-1][0]] / MIB:.3g} MiB that is below the next level")
            caches.pop()
        caches.append([a, b, lvl])
    plats = tuple(Plateau(float(math.exp(lvl)), int(x[a]), int(x[b]), b - a + 1, a, b)
                  for a, b, lvl in caches)

    l2 = plats[-1] if plats else None
    l15 = plats[-2] if len(plats) >= 2 else None
    l2_cliff = l15_cliff = None
    if l2 is not None:
        l2_cliff = _cliff(lx, lin, l2.i0, n - 1, l2.gbps, dram.gbps)
        if l2_cliff is None:
            warnings.append("the rate never falls below the midpoint of the L2 and DRAM plateaus")
    else:
        warnings.append("no cache plateau above the DRAM rate was found")
    if l15 is not None and l2 is not None:
        l15_cliff = _cliff(lx, lin, l15.i0, l2.i1, l15.gbps, l2.gbps)
    return BandwidthFit(dram, plats, l2, l15, l2_cliff, l15_cliff, noise, tol, tuple(warnings))


# ============================================================================ compute
def tc_ceilings(matmul) -> dict[str, dict]:
    """Fastest probe per dtype: ``{dtype: {tflops, m, n, k, time_ms}}``."""
    import polars as pl

    out: dict[str, dict] = {}
    df = matmul.filter(pl.col("tflops").is_finite() & (pl.col("tflops") > 0))
    for d in sorted(set(df["dtype"].to_list())):
        row = df.filter(pl.col("dtype") == d).sort("tflops", descending=True).row(0, named=True)
        out[d] = {k: row[k] for k in ("tflops", "m", "n", "k", "time_ms") if k in row}
    return out


def _with_tflops(gemm):
    import polars as pl

    return (gemm.filter(pl.col("time_ms").is_finite() & (pl.col("time_ms") > 0))
            .with_columns((2.0 * pl.col("m").cast(pl.Float64) * pl.col("n") * pl.col("k")
                           / (pl.col("time_ms") * 1e-3) / 1e12).alias("tflops")))


def best_gemm_tflops(gemm, dtypes: Sequence[str] = ("float16", "bfloat16")) -> dict | None:
    """The fastest row (TFLOPS) among ``dtypes``, any backend, or None."""
    import polars as pl

    df = _with_tflops(gemm).filter(pl.col("dtype").is_in(list(dtypes)))
    if df.height == 0:
        return None
    return df.sort("tflops", descending=True).row(0, named=True)


def launch_floor_us(gemm) -> dict | None:
    """The row with the smallest finite kernel time (``time_us`` added), or None."""
    df = _with_tflops(gemm)
    if df.height == 0:
        return None
    row = df.sort("time_ms").row(0, named=True)
    row["time_us"] = row["time_ms"] * 1e3
    return row


# ============================================================================ files
@dataclass
class Measurements:
    """The frames and metadata of one ``tsbatch measure`` directory."""

    dir: Path
    bandwidth: object | None = None
    matmul: object | None = None
    gemm: object | None = None
    meta: dict[str, dict[str, str]] = field(default_factory=dict)

    def origin(self, name: str) -> str:
        """``'bandwidth.parquet (tsbatch measure on NVIDIA H200, 2025-06-01)'``."""
        md = self.meta.get(name, {})
        dev = md.get("tsbatch.device_name", "unknown device")
        date = md.get("tsbatch.date", "undated")[:10]
        return f"{self.dir.name}/{name} (tsbatch measure on {dev}, {date})"


_NEEDED = {
    "bandwidth.parquet": ("bytes", "gbps"),
    "matmul.parquet": ("dtype", "m", "n", "k", "time_ms", "tflops"),
    "gemm.parquet": ("m", "n", "k", "dtype", "backend", "time_ms"),
}


def read_measurements(directory: str | Path) -> Measurements:
    import polars as pl

    from tsbatch.boundary.io import read_metadata

    d = Path(directory)
    if not d.is_dir():
        raise InputError(f"{d}: not a directory (give the --out directory of tsbatch measure)")
    res = Measurements(d)
    for name in FILES:
        p = d / name
        if not p.exists():
            continue
        try:
            df = pl.read_parquet(p)
            md = read_metadata(p)
        except Exception as exc:
            raise InputError(f"{p}: cannot read Parquet file ({exc})") from None
        for c in _NEEDED[name]:
            if c not in df.columns:
                raise InputError(f"{p}: missing column '{c}'")
        setattr(res, name.split(".")[0], df)
        res.meta[name] = md
    if res.bandwidth is None and res.matmul is None and res.gemm is None:
        raise InputError(f"{d}: has none of {', '.join(FILES)} (run tsbatch measure --out {d})")
    return res


# ============================================================================ calibration
@dataclass
class Calibration:
    """What :func:`calibrate` found and the hw-file entries it derived."""

    hw_key: str
    updates: dict[str, dict[str, tuple[float, str]]]     # section -> key -> (value, source)
    notes: dict[str, str]                                # "section.key" -> short reason
    previous: dict[str, float | None]                    # "section.key" -> old value
    fit: BandwidthFit | None
    ceilings: dict[str, dict]
    best_gemm: dict | None
    floor: dict | None
    skipped: list[str]
    origin: str


def _round(v: float, digits: int = 4) -> float:
    if v == 0 or not math.isfinite(v):
        return float(v)
    return float(round(v, max(0, digits - 1 - int(math.floor(math.log10(abs(v)))))))


def _measured_gpu(m: Measurements) -> str | None:
    for md in m.meta.values():
        g = md.get("tsbatch.gpu")
        if g and g != "unknown":
            return g
    if m.gemm is not None and "gpu" in m.gemm.columns and m.gemm.height:
        vals = [v for v in m.gemm["gpu"].unique().to_list() if v]
        if len(vals) == 1:
            return str(vals[0])
    return None


CALIBRATED_KEYS = ("dram_bw_tbps", "l2_bw_tbps", "l15_bw_tbps", "tc_fp16_tflops",
                   "l2_capacity_fraction", "tc_efficiency", "launch_overhead_us")


def calibrate(measurements: Measurements, hw, *, force: bool = False,
              keep: Sequence[str] = (), keep_higher: bool = False) -> Calibration:
    """Derive the ``[measured]`` and ``[calibration]`` entries for ``hw`` (an :class:`HwSpec`).

    Keys in ``keep`` are left as they are in the file (``tc_efficiency`` is
    then taken against the file's tensor-core rate when ``tc_fp16_tflops`` is
    kept). With ``keep_higher``, a ``[measured]`` rate already in the file
    that is higher than the new probe's stays: a probe only bounds a peak
    from below, so of two probes of the same peak the higher is the closer.
    """
    bad = sorted(set(keep) - set(CALIBRATED_KEYS))
    if bad:
        raise InputError(f"--keep: {', '.join(bad)} not calibrated here; "
                         f"known: {', '.join(CALIBRATED_KEYS)}")
    from tsbatch.hw import UnknownHardwareError, get_hw

    m = measurements
    g = _measured_gpu(m)
    if g is not None and not force:
        try:
            key = get_hw(g).key
        except UnknownHardwareError:
            key = None
        if key is not None and key != hw.key:
            raise InputError(f"{m.dir}: measured on '{g}' ({key}) but --hw is '{hw.key}'; "
                             "pass --force to calibrate anyway")

    meas: dict[str, tuple[float, str]] = {}
    cal: dict[str, tuple[float, str]] = {}
    notes: dict[str, str] = {}
    skipped: list[str] = []
    fit = None
    if m.bandwidth is not None:
        src = m.origin("bandwidth.parquet")
        fit = analyze_bandwidth(m.bandwidth["bytes"].to_numpy(), m.bandwidth["gbps"].to_numpy())
        meas["dram_bw_tbps"] = (_round(fit.dram.gbps / 1e3), (
            f"tsbatch calibrate: DRAM plateau of {src}: median read rate of the largest "
            f"working sets, {fit.dram.describe()}"))
        notes["measured.dram_bw_tbps"] = f"DRAM plateau, {fit.dram.describe()}"
        if fit.l2 is not None:
            meas["l2_bw_tbps"] = (_round(fit.l2.gbps / 1e3), (
                f"tsbatch calibrate: L2 plateau of {src}: {fit.l2.describe()}"))
            notes["measured.l2_bw_tbps"] = f"L2 plateau, {fit.l2.describe()}"
            if fit.l2_cliff_bytes is not None and hw.l2_bytes > 0:
                raw = fit.l2_cliff_bytes / hw.l2_bytes
                # a fraction of the nominal L2; a cliff past it (a gradual fall, whose
                # halfway point lies beyond the capacity) means all of it holds data
                frac = min(1.0, raw)
                cap = f" ({raw:.3f}, capped at 1)" if raw > 1.0 else ""
                cal["l2_capacity_fraction"] = (_round(frac, 3), (
                    f"tsbatch calibrate: L2 bandwidth cliff of {src} (rate halfway between the "
                    f"L2 plateau {fit.l2.gbps:,.0f} GB/s and DRAM {fit.dram.gbps:,.0f} GB/s) at "
                    f"{fit.l2_cliff_bytes / MIB:.2f} MiB of working set, / "
                    f"{hw.l2_bytes / MIB:.2f} MiB nominal L2 ([memory] l2_bytes){cap}"))
                notes["calibration.l2_capacity_fraction"] = (
                    f"L2 cliff at {fit.l2_cliff_bytes / MIB:.2f} MiB / {hw.l2_bytes / MIB:.2f} "
                    f"MiB nominal{cap}")
            else:
                skipped.append("l2_capacity_fraction: no L2 cliff in the sweep")
        else:
            skipped.append("l2_bw_tbps, l2_capacity_fraction: no L2 plateau above DRAM")
        if fit.l15 is not None:
            cl = (f"; L1.5 cliff at {fit.l15_cliff_bytes / MIB:.2f} MiB of working set"
                  if fit.l15_cliff_bytes is not None else "")
            meas["l15_bw_tbps"] = (_round(fit.l15.gbps / 1e3), (
                f"tsbatch calibrate: L1.5 plateau of {src}: {fit.l15.describe()}{cl}"))
            notes["measured.l15_bw_tbps"] = f"L1.5 plateau, {fit.l15.describe()}"
    else:
        skipped.append("bandwidth: no bandwidth.parquet")

    ceilings: dict[str, dict] = {}
    if m.matmul is not None:
        ceilings = tc_ceilings(m.matmul)
        c16 = ceilings.get("float16")
        if c16 is not None:
            meas["tc_fp16_tflops"] = (_round(c16["tflops"]), (
                f"tsbatch calibrate: fastest float16 torch.matmul (cuBLAS) probe of "
                f"{m.origin('matmul.parquet')}: {c16['m']}x{c16['n']}x{c16['k']} in "
                f"{c16['time_ms']:.3f} ms = {c16['tflops']:.1f} TFLOPS (a library GEMM, so a "
                "lower bound on the tensor-core peak)"))
            notes["measured.tc_fp16_tflops"] = (
                f"fastest float16 probe, {c16['m']}x{c16['n']}x{c16['k']} torch.matmul")
        else:
            skipped.append("tc_fp16_tflops: no float16 probe in matmul.parquet")
    else:
        skipped.append("tc_fp16_tflops: no matmul.parquet")

    if keep_higher:
        for k in [k for k in meas if k not in keep]:
            old = hw.measured.get(k)
            if old is not None and float(old) > meas[k][0]:
                del meas[k]
                skipped.append(f"{k}: the file's {float(old):g} is higher than this probe's "
                               "and stays (--keep-higher)")
    best = floor = None
    if m.gemm is not None:
        src = m.origin("gemm.parquet")
        best = best_gemm_tflops(m.gemm)
        use = "tc_fp16_tflops" in meas and "tc_fp16_tflops" not in keep
        peak = meas["tc_fp16_tflops"][0] if use else hw.rate("tc_fp16_tflops")
        if best is not None and peak > 0:
            eff = min(1.0, best["tflops"] / peak)
            cap = " (capped at 1)" if best["tflops"] > peak else ""
            cal["tc_efficiency"] = (_round(eff, 3), (
                f"tsbatch calibrate: best float16/bfloat16 GEMM of {src}: {best['m']}x{best['n']}x"
                f"{best['k']} {best['dtype']} {best['backend']} at {best['tflops']:.1f} TFLOPS "
                f"/ {peak:.1f} TFLOPS fp16 ceiling{cap}"))
            notes["calibration.tc_efficiency"] = (
                f"best GEMM {best['tflops']:.1f} TFLOPS ({best['m']}x{best['n']}x{best['k']} "
                f"{best['dtype']} {best['backend']}) / {peak:.1f}{cap}")
        else:
            skipped.append("tc_efficiency: no finite float16/bfloat16 GEMM time")
        floor = launch_floor_us(m.gemm)
        if floor is not None:
            lat = hw.cal("mem_latency_us")
            cal["launch_overhead_us"] = (_round(max(0.0, floor["time_us"] - lat), 3), (
                f"tsbatch calibrate: floor of measured kernel times in {src}: the fastest GEMM "
                f"({floor['m']}x{floor['n']}x{floor['k']} {floor['dtype']} {floor['backend']}) "
                f"takes {floor['time_us']:.2f} us (CUDA events), minus one memory latency "
                f"(mem_latency_us = {lat:g} us)"))
            notes["calibration.launch_overhead_us"] = (
                f"fastest GEMM {floor['time_us']:.2f} us ({floor['m']}x{floor['n']}x{floor['k']} "
                f"{floor['backend']}) - mem_latency {lat:g} us")
        else:
            skipped.append("launch_overhead_us: no finite GEMM time")
    else:
        skipped.append("tc_efficiency, launch_overhead_us: no gemm.parquet")

    for k in keep:
        if meas.pop(k, None) is not None or cal.pop(k, None) is not None:
            skipped.append(f"{k}: kept as in the file (--keep)")
    previous: dict[str, float | None] = {}
    for k in meas:
        previous[f"measured.{k}"] = hw.measured.get(k)
    for k in cal:
        previous[f"calibration.{k}"] = hw.calibration.get(k)
    origin = next((m.origin(n) for n in FILES if n in m.meta), str(m.dir))
    return Calibration(hw.key, {"measured": meas, "calibration": cal}, notes, previous, fit,
                       ceilings, best, floor, skipped, origin)


# ============================================================================ TOML text
_HEADER = re.compile(r"^\s*\[\s*([A-Za-z0-9_.\-\"]+)\s*\]\s*(#.*)?$")


def _toml_value(v: float) -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f"cannot write {v!r} as a hw value")
    if isinstance(v, int) or float(v).is_integer() and abs(v) < 1e15:
        return str(int(v)) if isinstance(v, int) else repr(float(v))
    return repr(float(v))


def _toml_entry(key: str, value: float, source: str) -> str:
    return (f"{key} = {{ value = {_toml_value(value)}, "
            f"source = {json.dumps(source, ensure_ascii=False)} }}")


def update_toml_text(text: str, updates: dict[str, dict[str, tuple[float, str]]]) -> str:
    """Replace or insert ``key = { value, source }`` lines in the named sections.

    Lines of other keys, comments and sections are kept verbatim; a missing
    section is appended at the end of the file.
    """
    lines = text.splitlines()
    for section, entries in updates.items():
        if not entries:
            continue
        headers = [(i, _HEADER.match(ln)) for i, ln in enumerate(lines)]
        heads = [(i, mt.group(1).strip('"')) for i, mt in headers
                 if mt and not lines[i].lstrip().startswith("[[")]
        start = next((i for i, name in heads if name == section), None)
        if start is None:
            while lines and not lines[-1].strip():
                lines.pop()
            lines += ["", f"[{section}]"]
            start = len(lines) - 1
        end = next((i for i, _ in heads if i > start), len(lines))
        for key, (value, source) in entries.items():
            pat = re.compile(rf"^\s*\"?{re.escape(key)}\"?\s*=")
            new = _toml_entry(key, value, source)
            hit = next((i for i in range(start + 1, end) if pat.match(lines[i])), None)
            if hit is not None:
                lines[hit] = new
                continue
            last = start
            for i in range(start + 1, end):
                if lines[i].strip() and not lines[i].lstrip().startswith("#"):
                    last = i
            lines.insert(last + 1, new)
            end += 1
    return "\n".join(lines) + "\n"


def write_calibrated(src: Path, out: Path, cal: Calibration) -> None:
    """Write the updated copy of ``src`` to ``out`` atomically, after checking it loads."""
    from tsbatch.hw import HwFileError, load_hw_file

    text = update_toml_text(src.read_text(), cal.updates)
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise InputError(f"{out}: output directory {parent} does not exist")
    tmp = parent / f".{out.name}.tmp-{os.getpid()}"
    try:
        tmp.write_text(text)
        try:
            spec = load_hw_file(tmp)
        except HwFileError as exc:  # pragma: no cover - a bug in update_toml_text
            raise RuntimeError(f"calibrated hw file does not load: {exc}") from exc
        for sec, entries in cal.updates.items():
            got = spec.measured if sec == "measured" else spec.calibration
            for k, (v, _) in entries.items():
                if not math.isclose(got[k], v, rel_tol=1e-12):  # pragma: no cover
                    raise RuntimeError(f"[{sec}] {k}: wrote {v} but read back {got[k]}")
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            tmp.unlink()


# ============================================================================ summary
def summary_text(cal: Calibration, hw) -> str:
    rows = []
    for sec, entries in cal.updates.items():
        for k, (v, src) in entries.items():
            prev = cal.previous.get(f"{sec}.{k}")
            rows.append((f"[{sec}] {k}", "-" if prev is None else f"{prev:g}", f"{v:g}",
                         cal.notes.get(f"{sec}.{k}", src)))
    out = [f"calibrating {hw.key} ({hw.name}) from {cal.origin}"]
    fit = cal.fit
    if fit is not None:
        lv = [f"L1.5 {fit.l15.describe()}" if fit.l15 else None,
              f"L2 {fit.l2.describe()}" if fit.l2 else None,
              f"DRAM {fit.dram.describe()}"]
        out.append("bandwidth levels: " + "; ".join(v for v in lv if v))
        cl = []
        if fit.l15_cliff_bytes is not None:
            cl.append(f"L1.5 at {fit.l15_cliff_bytes / MIB:.2f} MiB")
        if fit.l2_cliff_bytes is not None:
            cl.append(f"L2 at {fit.l2_cliff_bytes / MIB:.2f} MiB "
                      f"(nominal {hw.l2_bytes / MIB:.2f} MiB)")
        out.append(f"cliffs: {', '.join(cl) or 'none'}; noise {100 * fit.noise:.1f} %, "
                   f"plateau band {100 * fit.tol:.1f} %")
        for w in fit.warnings:
            out.append(f"warning: {w}")
    if cal.ceilings:
        out.append("tensor-core ceilings (fastest probe): " + ", ".join(
            f"{d} {c['tflops']:.1f} TFLOPS" for d, c in cal.ceilings.items()))
    if rows:
        w0 = max(len(r[0]) for r in rows)
        w1 = max(8, max(len(r[1]) for r in rows))
        w2 = max(8, max(len(r[2]) for r in rows))
        out.append(f"{'value':{w0}s}  {'previous':>{w1}s}  {'new':>{w2}s}  from")
        for r in rows:
            out.append(f"{r[0]:{w0}s}  {r[1]:>{w1}s}  {r[2]:>{w2}s}  {r[3]}")
    for s in cal.skipped:
        out.append(f"not calibrated: {s}")
    return "\n".join(out)


# ============================================================================ CLI
def _resolve(name: str):
    from tsbatch.hw import HwFileError, UnknownHardwareError, get_hw, hw_dir, load_hw_file

    p = Path(name)
    if p.suffix == ".toml" or p.exists():
        try:
            return load_hw_file(p), p
        except HwFileError as exc:
            raise InputError(str(exc)) from None
    try:
        spec = get_hw(name)
    except UnknownHardwareError as exc:
        raise InputError(str(exc)) from None
    src = hw_dir() / f"{spec.key}.toml"
    if not src.is_file():  # pragma: no cover - odd installs
        raise InputError(f"{src}: hw file of '{name}' not found")
    return spec, src


def run_calibrate_cli(args) -> int:
    from tsbatch.hw import hw_dir

    spec, src = _resolve(args.hw)
    out = Path(args.output) if args.output else src
    if out.exists() and out.is_dir():
        raise InputError(f"{out}: output path is a directory")
    if out.suffix != ".toml":
        raise InputError(f"{out}: the output must be a .toml file")
    try:
        in_hw_dir = out.resolve().parent == hw_dir().resolve()
    except OSError:  # pragma: no cover
        in_hw_dir = False
    if in_hw_dir and out.stem != spec.key:
        raise InputError(f"{out}: a second file for '{spec.key}' in {hw_dir()} would repeat its "
                         f"aliases; write hw/{spec.key}.toml or outside {hw_dir()}")
    keep = tuple(k.strip() for k in (args.keep or "").split(",") if k.strip())
    cal = calibrate(read_measurements(args.dir), spec, force=args.force, keep=keep,
                    keep_higher=args.keep_higher)
    print(summary_text(cal, spec))
    if not any(cal.updates.values()):
        raise InputError(f"{args.dir}: nothing to calibrate")
    if args.dry_run:
        print(f"dry run: {out} not written")
        return 0
    write_calibrated(src, out, cal)
    n = sum(len(v) for v in cal.updates.values())
    print(f"wrote {n} calibrated values to {out}")
    return 0
