"""Declarative sweeps: workload shapes x schedule axes, with validity rules.

A sweep file (TOML) has four tables::

    [sweep]      name, family ("gemm"), description
    [workload]   lists whose product gives the workloads (e.g. m, dtype),
                 plus optional [[workload.shape]] entries (label and fixed
                 columns, e.g. n and k of one projection) crossed with them
    [schedule]   lists whose product gives the schedules (block_m, ...)
    [rules]      valid = ["<polars SQL expression>", ...]: a candidate is
                 kept only if every rule holds (rules see every column)

Candidates are generated and evaluated a chunk of whole workloads at a
time, so a workload's top-k % is exact and memory stays bounded however
large the sweep is. Each chunk is a table through the evaluation pipeline
(:mod:`tsbatch.engine.pipeline`), ranked by screening (:mod:`tsbatch.engine.screen`):
only candidates whose perfect-caching latency
bound can still place them in their workload's top k % are predicted in
full; the result is the same as ranking every prediction.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Iterator

import polars as pl

from tsbatch.errors import InputError
from tsbatch.engine.evaluate import check_sampling, get_family, resolve_hw, sampling_metadata
from tsbatch.boundary.io import ParquetSink, provenance, sha256_file
from tsbatch.engine.pipeline import Stats, collect, results, table_source

try:
    import tomllib
except ModuleNotFoundError:  # pragma: no cover
    import tomli as tomllib  # type: ignore[no-redef]

__all__ = ["SweepSpec", "load_sweep", "sweep_dir", "list_sweeps", "run_sweep"]


@dataclass(frozen=True)
class SweepSpec:
    name: str
    family: str
    description: str
    workload_axes: dict
    shapes: tuple
    schedule_axes: dict
    rules: tuple
    path: Path
    sha256: str
    extra: dict = field(default_factory=dict)

    @property
    def n_workloads(self) -> int:
        n = math.prod(len(v) for v in self.workload_axes.values()) if self.workload_axes else 1
        return n * max(len(self.shapes), 1)

    @property
    def n_schedules(self) -> int:
        return math.prod(len(v) for v in self.schedule_axes.values()) if self.schedule_axes else 1

    def workloads(self) -> pl.DataFrame:
        axes = dict(self.workload_axes)
        names = list(axes)
        rows = [dict(zip(names, combo)) for combo in itertools.product(*axes.values())]
        base = pl.DataFrame(rows) if rows else pl.DataFrame({"_one": [1]})
        if self.shapes:
            shp = pl.DataFrame([dict(s) for s in self.shapes])
            base = base.join(shp, how="cross")
        return base.drop("_one", strict=False)

    def schedules(self) -> pl.DataFrame:
        names = list(self.schedule_axes)
        frame = pl.DataFrame({"_one": [1]})
        for name in names:
            frame = frame.join(pl.DataFrame({name: self.schedule_axes[name]}), how="cross")
        return frame.drop("_one")


def sweep_dir() -> Path:
    try:
        p = Path(str(resources.files("tsbatch._sweeps")))
        if p.is_dir() and any(p.glob("*.toml")):
            return p
    except (ModuleNotFoundError, TypeError):  # pragma: no cover
        pass
    return Path(__file__).resolve().parents[2] / "sweeps"


def list_sweeps() -> list[str]:
    return sorted(p.stem for p in sweep_dir().glob("*.toml"))


def _resolve_path(spec: str | Path) -> Path:
    p = Path(spec)
    if p.exists():
        return p
    for cand in (sweep_dir() / p.name, sweep_dir() / f"{p.name}.toml", sweep_dir() / f"{p.stem}.toml"):
        if cand.exists():
            return cand
    raise InputError(f"{spec}: no such sweep file; built-in sweeps: {', '.join(list_sweeps())}")


def load_sweep(spec: str | Path) -> SweepSpec:
    """Parse and check a sweep file (path, or the name of a built-in sweep)."""
    path = _resolve_path(spec)
    try:
        raw = path.read_bytes()
        doc = tomllib.loads(raw.decode())
    except OSError as exc:
        raise InputError(f"{path}: cannot read sweep file ({exc.strerror})") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: invalid TOML ({exc})") from exc
    head = doc.get("sweep", {})
    family = head.get("family", "gemm")
    fam = get_family(family)
    known = {c.name for c in fam.columns}
    wl = dict(doc.get("workload", {}))
    shapes = tuple(wl.pop("shape", ()))
    sched = dict(doc.get("schedule", {}))
    for section, axes in (("workload", wl), ("schedule", sched)):
        for k, v in axes.items():
            if not isinstance(v, list) or not v:
                raise InputError(f"{path}: [{section}] {k} must be a non-empty list")
    for i, s in enumerate(shapes):
        if not isinstance(s, dict):
            raise InputError(f"{path}: [[workload.shape]] entry {i} must be a table")
    cols = set(wl) | set(sched) | {k for s in shapes for k in s}
    unknown = sorted(cols - known - {"label"})
    if unknown:
        raise InputError(f"{path}: unknown column(s) {unknown} for family {family}; "
                         f"known: {sorted(known)}")
    missing = sorted(c.name for c in fam.columns if c.required and c.name not in cols)
    if missing:
        raise InputError(f"{path}: the sweep never sets required column(s) {missing}")
    rules = tuple(doc.get("rules", {}).get("valid", ()))
    for r in rules:
        try:
            pl.sql_expr(r)
        except Exception as exc:
            raise InputError(f"{path}: rule {r!r} is not a valid expression ({exc})") from None
    return SweepSpec(name=head.get("name", path.stem), family=family,
                     description=head.get("description", ""), workload_axes=wl, shapes=shapes,
                     schedule_axes=sched, rules=rules, path=path, sha256=sha256_file(path))


def candidate_chunks(spec: SweepSpec, chunk_rows: int = 1_000_000) -> Iterator[pl.DataFrame]:
    """Candidate tables of whole workloads, about ``chunk_rows`` rows each."""
    wls = spec.workloads().with_row_index("workload_id")
    sch = spec.schedules()
    per = max(1, chunk_rows // max(sch.height, 1))
    rule = None
    for r in spec.rules:
        e = pl.sql_expr(r)
        rule = e if rule is None else (rule & e)
    for start in range(0, wls.height, per):
        chunk = wls.slice(start, per).join(sch, how="cross")
        if rule is not None:
            try:
                chunk = chunk.filter(rule)
            except Exception as exc:
                raise InputError(f"{spec.path}: a rule failed to evaluate ({exc})") from None
        yield chunk


def run_sweep(spec: str | Path | SweepSpec, hw: str, out: str | Path, top: float = 1.0,
              chunk_rows: int = 1_000_000, progress: bool = True,
              timings: dict | None = None, sampling: dict | None = None) -> dict:
    """Generate, evaluate and rank a sweep; write the ranked rows to ``out``.

    Returns a summary: candidate and kept row counts, workloads, seconds.
    ``timings`` (if given) is filled with the seconds of each stage and
    ``rows_predicted``, the candidates predicted in full (the others were
    screened out by their latency bound). ``sampling`` (``k_samples``,
    ``wave_samples``, ``max_lookback``) goes to :func:`tsbatch.engine.evaluate.evaluate`
    and is recorded in the output's provenance.
    """
    t0 = time.perf_counter()
    sampling = check_sampling(sampling)
    sp = spec if isinstance(spec, SweepSpec) else load_sweep(spec)
    hwspec = resolve_hw(hw)
    fam = get_family(sp.family)
    meta = provenance(hwspec, sp.family, {"sweep": sp.sha256},
                      extra={"sweep": sp.name, "top_fraction": str(top),
                             **sampling_metadata(sampling)})
    workload_cols = ["workload_id", *[c for c in fam.workload_columns]]
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=sp.n_workloads, unit="workload", desc=f"sweep {sp.name}",
                   leave=False, dynamic_ncols=True)
    n_cand = 0
    n_kept = 0
    n_infeasible = 0
    tm = timings if timings is not None else {}
    with ParquetSink(out, meta) as sink:
        for chunk in candidate_chunks(sp, chunk_rows):
            if chunk.height == 0:  # the rules removed every candidate of these workloads
                continue
            # whole workloads per chunk: the chunk's counts are the workloads' counts,
            # and the screen predicts in full only rows that can still be kept
            stats = Stats()
            ranked = collect(results(table_source(chunk), hwspec, fam, ranked=True, top=top,
                                     sampling=sampling, workload=workload_cols, stats=stats,
                                     timings=tm))
            n_infeasible += stats.n_infeasible
            tm["rows_predicted"] = tm.get("rows_predicted", 0) + (stats.n_predicted or 0)
            t_w = time.perf_counter()
            sink.write(ranked)
            tm["write_s"] = tm.get("write_s", 0.0) + (time.perf_counter() - t_w)
            n_cand += chunk.height
            n_kept += ranked.height
            if bar is not None:
                bar.update(chunk.get_column("workload_id").n_unique())
                bar.set_postfix(candidates=n_cand, refresh=False)
        sink.commit()
    if bar is not None:
        bar.close()
    return {"sweep": sp.name, "hw": hwspec.key, "workloads": sp.n_workloads,
            "candidates": n_cand, "infeasible": n_infeasible, "kept": n_kept,
            "seconds": time.perf_counter() - t0, "out": str(out)}
