"""Accuracy benchmark: the model against measured kernel times.

``tsbatch accuracy MEASURED.parquet [MORE.parquet ...] [--hw NAME] --json REPORT.json``
reads measured data in the schemas of ``../shared/data`` (see its README),
predicts every measured configuration with the model, and reports how close
the predictions are, overall and per group (GPU, dtype, backend or family).

Pipeline, all columnar (no Python loop per row):

1. Read each file and detect its kernel family from its columns
   (:data:`FAMILIES`). Families without a predictor (:data:`PREDICTORS`) are
   counted as skipped, by rows, never silently dropped.
2. Map the GPU: the ``gpu`` column, else the file-name prefix
   (``h100_...``), else ``--hw``; ``--hw`` overrides all three when given.
   Names resolve through :func:`tsbatch.hw.get_hw` to a ``hw/*.toml`` key.
3. Drop rows whose time is not finite (configurations that failed to run),
   counting them; aggregate repeated measurements of one configuration by
   their median.
4. Predict with the family's predictor (for GEMM :func:`tsbatch.engine.evaluate.evaluate`),
   one call per GPU.
5. Compute :data:`tsbatch.measured.metrics.METRICS` overall and per group.

The predictors are injectable (``predictors={"gemm": fn}``) so the benchmark
and its tests do not depend on the model, and so attention or collective
predictors can be registered once the model supports them.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

import polars as pl

from tsbatch.errors import InputError
from tsbatch.hw import UnknownHardwareError, get_hw, list_hw
from tsbatch.measured.metrics import METRICS, accuracy_metrics

__all__ = [
    "FamilySpec",
    "FAMILIES",
    "PREDICTORS",
    "Predictor",
    "GROUP_KEYS",
    "AccuracyResult",
    "Threshold",
    "run_accuracy",
    "load_measured",
    "detect_family",
    "parse_threshold",
    "check_thresholds",
    "format_table",
    "write_markdown_report",
    "add_parser",
    "run",
]

#: A predictor takes the family's input columns (one row per configuration)
#: and a ``hw/*.toml`` key, and returns a frame of the same height, in the same
#: row order, with ``latency_us`` (float, NaN when infeasible) and ``feasible``.
Predictor = Callable[[pl.DataFrame, str], pl.DataFrame]

#: Columns of a group in the report, in order.
GROUP_KEYS: tuple[str, ...] = ("gpu", "family", "dtype", "backend")

#: Selector keys allowed in a threshold (``mape_pct[gpu=*,backend=triton]=15``).
_SELECTOR_KEYS = GROUP_KEYS


# ----------------------------------------------------------------------
# kernel families of measured data
# ----------------------------------------------------------------------
@dataclass(frozen=True)
class FamilySpec:
    """How one kernel family's measured files look.

    Attributes
    ----------
    name : str
        Family name, the key of :data:`PREDICTORS`.
    detect : frozenset of str
        Columns whose presence identifies the family (first match wins, in
        :data:`FAMILIES` order).
    time_col : str
        Measured time column; ``time_scale_us`` converts it to microseconds.
    problem_cols : tuple of str
        Columns that identify one workload (without the GPU).
    config_cols : tuple of str
        Columns that identify one configuration of a workload (schedule).
    unit_cols : tuple of str
        Columns of ``config_cols`` that split a problem into sets of
        configurations ranked separately (GEMM: ``backend``).
    defaults : mapping
        Columns filled when absent: name -> (value, polars dtype).
    casts : mapping
        Canonical dtype of each column the family keeps.
    backend : str or None
        Column giving the group's ``backend``; ``None`` uses the family name.
    has_gpu : bool
        Whether the data were taken on one GPU (``gpu`` column or file
        prefix); collectives are measured on systems and have none.
    together : tuple of str
        Defaulted columns that come all or none (GEMM tile columns): a file
        with some of them must have all.
    """

    name: str
    detect: frozenset
    time_col: str
    time_scale_us: float
    problem_cols: tuple[str, ...]
    config_cols: tuple[str, ...]
    unit_cols: tuple[str, ...] = ()
    defaults: Mapping[str, tuple[object, pl.DataType]] = field(default_factory=dict)
    casts: Mapping[str, pl.DataType] = field(default_factory=dict)
    backend: str | None = None
    has_gpu: bool = True
    together: tuple[str, ...] = ()

    @property
    def input_cols(self) -> tuple[str, ...]:
        """Columns handed to the predictor."""
        return self.problem_cols + self.config_cols


_TILE_COLS = ("block_m", "block_n", "block_k", "num_stages", "num_warps", "group_m")

GEMM = FamilySpec(
    name="gemm",
    detect=frozenset({"m", "n", "k"}),
    time_col="time_ms",
    time_scale_us=1000.0,
    problem_cols=("m", "n", "k", "dtype", "a_row_major", "b_row_major", "tf32"),
    config_cols=("backend", *_TILE_COLS, "triton_version"),
    unit_cols=("backend",),
    # Library-only sets (LLMCompass) carry no layout: both operands row-major,
    # as in torch.matmul of contiguous tensors; no tile columns.
    defaults={
        "a_row_major": (True, pl.Boolean),
        "b_row_major": (True, pl.Boolean),
        "tf32": (False, pl.Boolean),
        **{c: (None, pl.Int32) for c in _TILE_COLS},
    },
    casts={
        "m": pl.Int64, "n": pl.Int64, "k": pl.Int64, "dtype": pl.String,
        "a_row_major": pl.Boolean, "b_row_major": pl.Boolean, "tf32": pl.Boolean,
        "backend": pl.String, **{c: pl.Int32 for c in _TILE_COLS}, "triton_version": pl.String,
    },
    backend="backend",
    together=_TILE_COLS,
)

#: The Triton release of the AutoHeuristic GEMM collection (rows whose ``source``
#: starts with ``autoheuristic/``: ../shared/data/gemm/*_triton_mm.parquet), which
#: the data do not record. PyTorch's AutoHeuristic was collected in the PyTorch
#: 2.5 cycle, which ships Triton 3.1; and the measured H100 TF32 rows have the
#: code generation of Triton 3.0-3.2, not of 3.3 on (bench/triton_fma_footprints.py
#: --tf32): with an M/N-contiguous operand the 64-wide operands run twice as fast
#: per element as the 128-wide ones, the bank conflicts of 3.0-3.2's register-
#: staged 4-byte stores, and no faster with more stages (the loop is unpipelined).
#: Only the codegen that differs between releases reads it (``triton_version``).
AUTOHEURISTIC_TRITON_VERSION = "3.1"

#: Keys each query block of the measured FlexAttention kernels visited. The
#: AutoHeuristic collection (torchgen/_autoheuristic/flex_attention/
#: gen_data_flex_attention.py) passes no block mask, and the PyTorch of its day
#: ran the default one-block mask as one sparse KV block of the template's
#: 128-key sparse block size: the measured times grow linearly with seq_len
#: (log-log slope 0.95 over the 4,647 problems) where dense attention grows
#: quadratically, and read as dense attention they would run at up to
#: 13 PFLOPS on a 312 TFLOPS A100. A file with its own ``seq_len_kv`` keeps it.
FLEX_DATA_KV_VISITED = 128

ATTENTION = FamilySpec(
    name="attention",
    detect=frozenset({"seq_len", "head_dim"}),
    time_col="time_ms",
    time_scale_us=1000.0,
    problem_cols=("batch", "heads", "seq_len", "head_dim", "dtype", "score_mod_nodes",
                  "seq_len_kv"),
    config_cols=("block_m", "block_n", "num_stages", "num_warps"),
    defaults={"seq_len_kv": (FLEX_DATA_KV_VISITED, pl.Int64)},
    casts={
        "batch": pl.Int64, "heads": pl.Int64, "seq_len": pl.Int64, "head_dim": pl.Int64,
        "dtype": pl.String, "score_mod_nodes": pl.Int32, "seq_len_kv": pl.Int64,
        "block_m": pl.Int32, "block_n": pl.Int32, "num_stages": pl.Int32, "num_warps": pl.Int32,
    },
)

COLLECTIVE = FamilySpec(
    name="collective",
    detect=frozenset({"collective", "bytes"}),
    time_col="time_ms_median",
    time_scale_us=1000.0,
    problem_cols=("system", "collective", "num_gpus", "gpus_per_node", "bytes"),
    config_cols=(),
    casts={
        "system": pl.String, "collective": pl.String, "num_gpus": pl.Int32,
        "gpus_per_node": pl.Int32, "bytes": pl.Int64,
    },
    backend="collective",
    has_gpu=False,
)

#: Known measured-data families, in detection order.
FAMILIES: tuple[FamilySpec, ...] = (GEMM, ATTENTION, COLLECTIVE)


def _gemm_predictor(frame: pl.DataFrame, hw: str) -> pl.DataFrame:
    from tsbatch.engine.evaluate import evaluate  # the evaluator lands separately

    return evaluate(frame, hw)


def _attention_predictor(frame: pl.DataFrame, hw: str) -> pl.DataFrame:
    from tsbatch.engine.evaluate import evaluate

    return evaluate(frame, hw, family="attention")


def _collective_predictor(frame: pl.DataFrame, hw: str) -> pl.DataFrame:
    # collectives name their system per row (column 'system'); hw is the group label only
    from kernels_catalog.registry import get_family

    return get_family("collective").evaluate(frame)


#: Default predictor per family. Families absent here are reported as skipped.
PREDICTORS: dict[str, Predictor] = {"gemm": _gemm_predictor, "attention": _attention_predictor,
                                    "collective": _collective_predictor}


# ----------------------------------------------------------------------
# loading
# ----------------------------------------------------------------------
def _read(path: Path) -> pl.DataFrame:
    if not path.exists():
        raise InputError(f"{path}: measured file not found")
    from tsbatch.boundary.schema import read_table  # Parquet, Arrow IPC, CSV or NDJSON by extension

    return read_table(path, "measured")


def detect_family(columns: Sequence[str], path: str | Path = "<frame>") -> FamilySpec:
    """The :class:`FamilySpec` whose ``detect`` columns ``columns`` contain."""
    cols = set(columns)
    for spec in FAMILIES:
        if spec.detect <= cols:
            return spec
    wanted = "; ".join(f"{s.name}: {', '.join(sorted(s.detect))}" for s in FAMILIES)
    raise InputError(
        f"{path}: cannot tell the kernel family from its columns {sorted(cols)}; "
        f"expected one of ({wanted})"
    )


def _check_types(df: pl.DataFrame, spec: FamilySpec, path: Path) -> None:
    for col, dtype in spec.casts.items():
        if col not in df.columns:
            continue
        have = df.schema[col]
        if have == pl.Null:
            continue
        ok = (
            (dtype.is_integer() and have.is_integer())
            or (dtype == pl.Boolean and have == pl.Boolean)
            or (dtype == pl.String and have in (pl.String, pl.Categorical, pl.Enum) )
        )
        if not ok:
            raise InputError(f"{path}: column '{col}' has type {have}, expected {dtype}")
    t = df.schema[spec.time_col]
    if not t.is_numeric():
        raise InputError(f"{path}: column '{spec.time_col}' has type {t}, expected a float time")


def _file_triton_version(path: Path) -> str | None:
    """The ``tsbatch.triton_version`` a ``tsbatch measure`` Parquet file records."""
    if path.suffix.lower() != ".parquet":
        return None
    from tsbatch.boundary.io import read_metadata

    v = read_metadata(path).get("tsbatch.triton_version", "").strip()
    return v if v and v != "unknown" else None


def _triton_version_column(df: pl.DataFrame, path: Path, given: str | None) -> pl.Expr:
    """A GEMM file's Triton release where it has no ``triton_version`` column: the
    release its ``tsbatch measure`` metadata records, else ``given`` (the
    ``--triton-version`` option), else :data:`AUTOHEURISTIC_TRITON_VERSION` for
    the AutoHeuristic rows and the family's default for the others."""
    from kernels_catalog.gemm import TRITON_VERSION_DEFAULT

    v = _file_triton_version(path) or given
    if v is not None:
        return pl.lit(v, dtype=pl.String).alias("triton_version")
    if "source" in df.columns:
        return (pl.when(pl.col("source").cast(pl.String).str.starts_with("autoheuristic/"))
                .then(pl.lit(AUTOHEURISTIC_TRITON_VERSION))
                .otherwise(pl.lit(TRITON_VERSION_DEFAULT)).alias("triton_version"))
    return pl.lit(TRITON_VERSION_DEFAULT, dtype=pl.String).alias("triton_version")


def _prepare(df: pl.DataFrame, spec: FamilySpec, path: Path,
             triton_version: str | None = None) -> pl.DataFrame:
    """Check columns and types, fill defaults, cast to the canonical schema."""
    if spec.time_col not in df.columns:
        raise InputError(f"{path}: missing time column '{spec.time_col}' ({spec.name} data)")
    fills = []
    if spec is GEMM and "triton_version" not in df.columns:
        fills.append(_triton_version_column(df, path, triton_version))
    partial = any(c in df.columns for c in spec.together)
    for col, (value, dtype) in spec.defaults.items():
        if col not in df.columns and not (partial and col in spec.together):
            fills.append(pl.lit(value, dtype=dtype).alias(col))
    if spec is GEMM and "backend" not in df.columns:
        # no backend column: tile columns name a Triton configuration, else a library kernel
        has_tiles = "block_m" in df.columns
        fills.append(
            (pl.when(pl.col("block_m").is_not_null()).then(pl.lit("triton")).otherwise(pl.lit("cublas"))
             if has_tiles else pl.lit("cublas")).alias("backend")
        )
    if fills:
        df = df.with_columns(fills)
    missing = [c for c in spec.input_cols if c not in df.columns]
    if missing:
        raise InputError(f"{path}: missing column(s) {', '.join(repr(c) for c in missing)} ({spec.name} data)")
    _check_types(df, spec, path)
    keep = list(spec.input_cols) + [spec.time_col] + (["gpu"] if "gpu" in df.columns else [])
    try:
        df = df.select(keep).with_columns(
            [pl.col(c).cast(t) for c, t in spec.casts.items()]
            + [pl.col(spec.time_col).cast(pl.Float64)]
        )
    except pl.exceptions.InvalidOperationError as exc:  # a value beyond the column's type
        raise InputError(f"{path}: {str(exc).strip().splitlines()[0]}") from None
    if "tf32" in df.columns:
        df = df.with_columns(pl.col("tf32").fill_null(False))
    return df


def _resolve_gpu(name: str, what: str) -> str:
    try:
        return get_hw(name).key
    except UnknownHardwareError:
        raise InputError(f"{what}: unknown GPU '{name}'; known: {', '.join(list_hw())}") from None


def _gpu_from_prefix(path: Path) -> str | None:
    prefix = path.stem.split("_", 1)[0]
    try:
        return get_hw(prefix).key
    except UnknownHardwareError:
        return None


def _attach_gpu(df: pl.DataFrame, path: Path, hw: str | None) -> pl.DataFrame:
    """Add ``_hw`` (a ``hw/*.toml`` key) to every row."""
    if hw is not None:
        if "gpu" in df.columns:
            names = [g for g in df["gpu"].unique().to_list() if g is not None]
            keys = {_resolve_gpu(str(g), f"{path}: column 'gpu'") for g in names}
            if len(keys) > 1:
                raise InputError(
                    f"{path}: column 'gpu' names several GPUs {sorted(keys)}; "
                    f"--hw {hw} cannot stand for all of them"
                )
        return df.with_columns(pl.lit(hw).alias("_hw"))
    fallback = _gpu_from_prefix(path)
    if "gpu" not in df.columns:
        if fallback is None:
            raise InputError(
                f"{path}: no 'gpu' column and the file name does not start with a known GPU "
                f"(known: {', '.join(list_hw())}); pass --hw"
            )
        return df.with_columns(pl.lit(fallback).alias("_hw"))
    if df["gpu"].null_count() and fallback is None:
        raise InputError(f"{path}: column 'gpu' has null values and the file name names no GPU; pass --hw")
    names = df["gpu"].drop_nulls().unique().to_list()
    mapping = {str(g): _resolve_gpu(str(g), f"{path}: column 'gpu'") for g in names}
    return df.with_columns(
        pl.col("gpu").cast(pl.String).replace_strict(mapping, default=fallback, return_dtype=pl.String).alias("_hw")
    )


def _select_problems(
    df: pl.DataFrame,
    problem_cols: list[str],
    limit: int | None,
    sample: int | None,
    seed: int,
) -> pl.DataFrame:
    if limit is None and sample is None:
        return df
    problems = df.select(problem_cols).unique().sort(problem_cols, nulls_last=True)
    if limit is not None:
        chosen = problems.head(limit)
    else:
        chosen = problems.sample(n=min(sample, problems.height), seed=seed, shuffle=True)
    chosen = chosen.with_columns(_chosen=pl.lit(True))
    # problem columns are never null after _prepare: a plain join is exact
    return df.join(chosen, on=problem_cols, how="left").filter(pl.col("_chosen").fill_null(False)).drop("_chosen")


#: collectives under this size are reported apart (the latency-bound regime)
COLLECTIVE_LATENCY_BYTES = 1 << 20


def _dtype_label(spec: FamilySpec) -> pl.Expr:
    if spec.name == "collective":
        # no dtype: the group label is the regime, latency-bound (< 1 MiB) or not
        return (pl.when(pl.col("bytes") < COLLECTIVE_LATENCY_BYTES).then(pl.lit("lt_1MiB"))
                .otherwise(pl.lit("ge_1MiB")).alias("dtype"))
    if "dtype" not in spec.problem_cols:
        return pl.lit("n/a").alias("dtype")
    if "tf32" in spec.problem_cols:
        return (
            pl.when((pl.col("dtype") == "float32") & pl.col("tf32"))
            .then(pl.lit("tf32"))
            .otherwise(pl.col("dtype"))
            .alias("dtype")
        )
    return pl.col("dtype").alias("dtype")


@dataclass
class _Loaded:
    frames: dict[str, list[pl.DataFrame]] = field(default_factory=dict)
    skipped_rows: dict[str, int] = field(default_factory=dict)
    skipped_files: dict[str, list[str]] = field(default_factory=dict)
    nonfinite_rows: int = 0
    nonpositive_rows: int = 0
    raw_rows: int = 0
    files: list[str] = field(default_factory=list)


def load_measured(
    paths: Sequence[str | Path],
    *,
    hw: str | None = None,
    families: Sequence[str] = ("gemm",),
    limit_problems: int | None = None,
    sample_problems: int | None = None,
    seed: int = 0,
    triton_version: str | None = None,
    repeats: str | None = None,
) -> _Loaded:
    """Read, validate, filter and median-aggregate measured files.

    Rows of families not in ``families`` are counted, not loaded. Each
    returned frame has ``_hw``, ``_problem`` (an id unique over all files),
    ``_unit``, the family's input columns and ``measured_us``.

    ``repeats``: ``"even"`` or ``"odd"`` aggregates only the repeated measurements
    of each (problem, configuration) of even or odd index in their file's order
    (the 1st, 3rd, ... or the 2nd, 4th, ...): two independent halves of the
    repeats, whose agreement is the data's own noise (``bench/noise_ceiling.py``);
    a configuration measured once is in the even half only. None: every repeat.
    """
    if repeats not in (None, "even", "odd"):
        raise InputError(f"repeats must be 'even', 'odd' or None, got {repeats!r}")
    if not paths:
        raise InputError("no measured file given")
    if hw is not None:
        hw = _resolve_gpu(hw, "--hw")
    for name, value in (("--limit-problems", limit_problems), ("--sample-problems", sample_problems)):
        if value is not None and value < 1:
            raise InputError(f"{name} must be >= 1, got {value}")
    out = _Loaded()
    next_problem = 0
    next_unit = 0
    for raw_path in paths:
        path = Path(raw_path)
        df = _read(path)
        spec = detect_family(df.columns, path)
        out.files.append(str(path))
        if spec.name not in families:
            out.skipped_rows[spec.name] = out.skipped_rows.get(spec.name, 0) + df.height
            out.skipped_files.setdefault(spec.name, []).append(str(path))
            continue
        out.raw_rows += df.height
        df = _prepare(df, spec, path, triton_version)
        if spec.has_gpu:
            df = _attach_gpu(df, path, hw)
        elif "system" in df.columns and hw is None:
            # collectives: the group's 'gpu' label is the measured system
            df = df.with_columns(pl.col("system").cast(pl.String).alias("_hw"))
        else:
            df = df.with_columns(pl.lit(hw or "n/a").alias("_hw"))
        t = pl.col(spec.time_col)
        finite = t.is_not_null() & t.is_finite()
        counts = df.select(nonfinite=(~finite).sum(), nonpositive=(finite & (t <= 0)).sum()).row(0)
        out.nonfinite_rows += int(counts[0])
        out.nonpositive_rows += int(counts[1])
        df = df.filter(finite & (t > 0))
        problem_cols = ["_hw", *spec.problem_cols]
        df = _select_problems(df, problem_cols, limit_problems, sample_problems, seed)
        if df.height == 0:
            continue
        ident = [*problem_cols, *spec.config_cols]
        if repeats is not None:
            df = df.filter(pl.int_range(pl.len()).over(ident) % 2 == (0 if repeats == "even" else 1))
            if df.height == 0:
                continue
        agg = (
            df.group_by(ident, maintain_order=True)
            .agg(pl.col(spec.time_col).median().alias("_time"))
            .with_columns(
                measured_us=pl.col("_time") * spec.time_scale_us,
                _problem=pl.struct(problem_cols).rank("dense").cast(pl.Int64) - 1 + next_problem,
                _unit=pl.struct([*problem_cols, *spec.unit_cols]).rank("dense").cast(pl.Int64) - 1 + next_unit,
            )
            .drop("_time")
        )
        next_problem = int(agg["_problem"].max()) + 1
        next_unit = int(agg["_unit"].max()) + 1
        out.frames.setdefault(spec.name, []).append(agg)
    return out


# ----------------------------------------------------------------------
# the benchmark
# ----------------------------------------------------------------------
@dataclass
class AccuracyResult:
    """Everything one accuracy run produced.

    ``scored`` holds one row per measured configuration (group columns,
    ``measured_us``, ``predicted_us``, ``feasible``, ``infeasible_reason``
    where the predictor gives one, and the identifying columns).
    """

    overall: dict
    groups: pl.DataFrame
    by_gpu: pl.DataFrame
    skipped: dict
    scored: pl.DataFrame
    files: list[str]

    diagnostics: dict = field(default_factory=dict)

    def to_json_dict(self) -> dict:
        """The REPORT.json document: ``overall``, ``groups``, ``skipped`` (and
        ``diagnostics``: checks of the measured labels, see :func:`tf32_label_audit`)."""
        return {
            "overall": {k: _json_value(v) for k, v in self.overall.items()},
            "groups": [{k: _json_value(v) for k, v in row.items()} for row in self.groups.to_dicts()],
            "skipped": self.skipped,
            "diagnostics": self.diagnostics,
        }

    def write_json(self, path: str | Path) -> None:
        path = Path(path)
        if path.parent and not path.parent.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json_dict(), indent=2, allow_nan=False) + "\n")


#: problems at least this large (FLOPs) take part in the TF32 audit: big
#: enough that launch and latency cannot hide a 4x tensor-core speed-up
TF32_AUDIT_MIN_FLOPS = 1e11


def tf32_label_audit(scored: pl.DataFrame) -> dict:
    """Check the ``tf32`` label of float32 GEMM rows against physics, per GPU.

    A float32 problem labelled TF32 whose best measured configuration beats
    the GPU's FP32 CUDA-core peak (the higher of the spec and measured values
    of the hardware file) certainly ran on tensor cores
    (``tf32_proven``); one at or below that peak, although big enough
    (:data:`TF32_AUDIT_MIN_FLOPS`) that TF32 tensor cores would run it
    several times faster, is reported as ``looks_ieee_fp32``. Nothing here
    feeds a prediction: it tells how far the label can be trusted.
    """
    from tsbatch.hw import get_hw

    need = {"m", "n", "k", "tf32", "dtype", "gpu", "measured_us"}
    if not need <= set(scored.columns):
        return {}
    sub = scored.filter((pl.col("dtype") == "tf32") & pl.col("tf32").fill_null(False))
    if sub.height == 0:
        return {}
    flops = 2.0 * pl.col("m").cast(pl.Float64) * pl.col("n") * pl.col("k")
    per = (sub.with_columns(flops.alias("_flops"))
           .group_by("gpu", "m", "n", "k", "a_row_major", "b_row_major")
           .agg(pl.col("_flops").first(), (pl.col("_flops") / pl.col("measured_us") / 1e6).max()
                .alias("best_tflops"))
           .filter(pl.col("_flops") >= TF32_AUDIT_MIN_FLOPS))
    out = {}
    for (gpu,), g in per.group_by("gpu"):
        spec = get_hw(gpu)
        peak = max(float(spec.fp32_tflops), spec.rate("fp32_tflops"))  # the higher: conservative
        proven = int((g["best_tflops"] > peak).sum())
        out[gpu] = {
            "problems_audited": g.height,
            "fp32_cuda_core_peak_tflops": peak,
            "tf32_proven": proven,
            "looks_ieee_fp32": g.height - proven,
            "median_best_over_fp32_peak": float((g["best_tflops"] / peak).median()),
        }
    return {"tf32_label_audit": dict(sorted(out.items()))}


def _json_value(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def _predict(frame: pl.DataFrame, spec: FamilySpec, predictor: Predictor) -> pl.DataFrame:
    parts = []
    for (hw_key,), part in frame.group_by(["_hw"], maintain_order=True):
        pred = predictor(part.select(spec.input_cols), hw_key)
        if not isinstance(pred, pl.DataFrame) or pred.height != part.height:
            raise RuntimeError(
                f"{spec.name} predictor returned {getattr(pred, 'height', type(pred).__name__)} rows "
                f"for {part.height} on {hw_key}"
            )
        if "latency_us" not in pred.columns:
            raise RuntimeError(f"{spec.name} predictor returned no 'latency_us' column")
        latency = pred["latency_us"].cast(pl.Float64)
        feasible = pred["feasible"].cast(pl.Boolean) if "feasible" in pred.columns else latency.is_finite()
        cols = [latency.alias("predicted_us"), feasible.fill_null(False).alias("feasible")]
        if "infeasible_reason" in pred.columns:
            cols.append(pred["infeasible_reason"].cast(pl.String).alias("infeasible_reason"))
        parts.append(part.with_columns(cols))
    return pl.concat(parts, how="diagonal_relaxed")


def run_accuracy(
    paths: Sequence[str | Path],
    *,
    hw: str | None = None,
    predictors: Mapping[str, Predictor] | None = None,
    limit_problems: int | None = None,
    sample_problems: int | None = None,
    seed: int = 0,
    triton_version: str | None = None,
) -> AccuracyResult:
    """Score the model against measured files.

    Parameters
    ----------
    paths : sequence of path
        Measured Parquet files (any family of ``../shared/data``).
    hw : str, optional
        GPU for every row, overriding the ``gpu`` column and file prefix.
    predictors : mapping, optional
        Family -> :data:`Predictor`; default :data:`PREDICTORS`. Families
        without one are reported in ``skipped``.
    limit_problems, sample_problems : int, optional
        Keep only the first N problems (in sorted order) or N problems drawn
        with ``seed``, of each file.
    triton_version : str, optional
        Triton release of the GEMM files that record none (no
        ``triton_version`` column, no ``tsbatch measure`` metadata); default:
        :data:`AUTOHEURISTIC_TRITON_VERSION` for the AutoHeuristic rows, the
        family's default for the others.
    """
    predictors = dict(PREDICTORS if predictors is None else predictors)
    if triton_version is not None:
        from kernels_catalog.gemm import TRITON_VERSION_PATTERN

        if re.fullmatch(TRITON_VERSION_PATTERN, str(triton_version)) is None:
            raise InputError(f"--triton-version: {triton_version!r} is not a Triton release "
                             "(major.minor, e.g. 3.1)")
    loaded = load_measured(
        paths, hw=hw, families=tuple(predictors), limit_problems=limit_problems,
        sample_problems=sample_problems, seed=seed, triton_version=triton_version,
    )
    spec_by_name = {s.name: s for s in FAMILIES}
    scored_parts = []
    for name, frames in loaded.frames.items():
        spec = spec_by_name[name]
        frame = pl.concat(frames, how="vertical_relaxed")
        frame = _predict(frame, spec, predictors[name])
        backend = pl.col(spec.backend).cast(pl.String) if spec.backend else pl.lit(spec.name)
        # group labels replace the input's own dtype/backend columns (tf32 stays
        # recoverable from the 'tf32' column)
        frame = frame.with_columns(
            pl.col("_hw").alias("gpu"),
            pl.lit(spec.name).alias("family"),
            _dtype_label(spec).alias("_dtype_label"),
            backend.alias("_backend_label"),
        )
        frame = frame.drop([c for c in ("dtype", "backend") if c in frame.columns]).rename(
            {"_dtype_label": "dtype", "_backend_label": "backend"}
        )
        scored_parts.append(frame.drop("_hw"))
    lead = [*GROUP_KEYS, "_problem", "_unit", "measured_us", "predicted_us", "feasible"]
    if scored_parts:
        scored = pl.concat(scored_parts, how="diagonal_relaxed")
        scored = scored.select([*lead, *(c for c in scored.columns if c not in lead)])
    else:
        scored = pl.DataFrame(
            schema={
                "gpu": pl.String, "family": pl.String, "dtype": pl.String, "backend": pl.String,
                "_problem": pl.Int64, "_unit": pl.Int64, "measured_us": pl.Float64,
                "predicted_us": pl.Float64, "feasible": pl.Boolean,
            }
        )
    overall_df = accuracy_metrics(scored, ())
    if overall_df.height:
        overall = overall_df.row(0, named=True)
    else:
        overall = {m: (0 if m in ("rows", "problems", "infeasible_rows") else None) for m in METRICS}
    groups = accuracy_metrics(scored, GROUP_KEYS)
    by_gpu = accuracy_metrics(scored, ("gpu", "family", "backend"))
    skipped = {
        "unsupported_family_rows": dict(sorted(loaded.skipped_rows.items())),
        "unsupported_family_files": {k: v for k, v in sorted(loaded.skipped_files.items())},
        "nonfinite_time_rows": loaded.nonfinite_rows,
        "nonpositive_time_rows": loaded.nonpositive_rows,
        "infeasible_rows": int(overall["infeasible_rows"] or 0),
    }
    return AccuracyResult(
        overall=overall, groups=groups, by_gpu=by_gpu, skipped=skipped,
        scored=scored, files=loaded.files, diagnostics=tf32_label_audit(scored),
    )


# ----------------------------------------------------------------------
# thresholds
# ----------------------------------------------------------------------
_THRESHOLD_RE = re.compile(r"^\s*(?P<metric>[a-z0-9_]+)\s*(?:\[(?P<sel>[^\]]*)\])?\s*=\s*(?P<value>[^=\s]+)\s*$")


@dataclass(frozen=True)
class Threshold:
    """``metric`` must stay at or below (``above=True``: fails above) ``value``.

    ``selector`` restricts the check to matching rows, pooled; a selector
    value ``*`` checks each distinct value of that key separately, and
    ``a|b`` pools the rows whose key is any of the listed values.
    """

    metric: str
    value: float
    above: bool
    selector: tuple[tuple[str, str], ...] = ()
    text: str = ""


def parse_threshold(text: str, *, above: bool) -> Threshold:
    """Parse ``METRIC=VALUE`` or ``METRIC[key=val,key=*]=VALUE``.

    Keys are ``gpu`` (any alias), ``family``, ``dtype``, ``backend``; a
    value is ``*`` (each value separately) or one or more values joined by
    ``|`` (those rows pooled).
    """
    flag = "--fail-above" if above else "--fail-below"
    m = _THRESHOLD_RE.match(text)
    if not m:
        raise InputError(
            f"{flag} {text!r}: expected METRIC=VALUE or METRIC[key=value,...]=VALUE, "
            f"e.g. mape_pct=15 or 'mape_pct[gpu=*,backend=triton]=15'"
        )
    metric = m["metric"]
    if metric not in METRICS:
        raise InputError(f"{flag} {text!r}: unknown metric '{metric}'; known: {', '.join(METRICS)}")
    try:
        value = float(m["value"])
    except ValueError:
        raise InputError(f"{flag} {text!r}: threshold '{m['value']}' is not a number") from None
    selector: list[tuple[str, str]] = []
    if m["sel"]:
        for item in m["sel"].split(","):
            if "=" not in item:
                raise InputError(f"{flag} {text!r}: selector item '{item.strip()}' is not key=value")
            key, val = (s.strip() for s in item.split("=", 1))
            if key not in _SELECTOR_KEYS:
                raise InputError(
                    f"{flag} {text!r}: selector key '{key}' unknown; known: {', '.join(_SELECTOR_KEYS)}"
                )
            if val != "*":
                parts = [v.strip() for v in val.split("|")]
                if not all(parts):
                    raise InputError(f"{flag} {text!r}: selector item '{item.strip()}' has an empty value")
                if key == "gpu":
                    parts = [_resolve_gpu(v, f"{flag} {text!r}") for v in parts]
                val = "|".join(parts)
            selector.append((key, val))
    return Threshold(metric=metric, value=value, above=above, selector=tuple(selector), text=text)


def check_thresholds(result: AccuracyResult, thresholds: Sequence[Threshold]) -> list[str]:
    """One message per broken threshold (empty: all hold)."""
    broken: list[str] = []
    for th in thresholds:
        flag = "--fail-above" if th.above else "--fail-below"
        scored = result.scored
        for key, val in th.selector:
            if val != "*":
                scored = scored.filter(pl.col(key).is_in(val.split("|")))
        each = [k for k, v in th.selector if v == "*"]
        if scored.height == 0:
            broken.append(f"{flag} {th.text}: no measured rows match the selector")
            continue
        table = accuracy_metrics(scored, each)
        for row in table.iter_rows(named=True):
            where = ", ".join(f"{k}={row[k]}" for k in each)
            scope = ", ".join(f"{k}={v}" for k, v in th.selector if v != "*")
            label = "; ".join(s for s in (scope, where) if s) or "overall"
            got = row[th.metric]
            if got is None or (isinstance(got, float) and math.isnan(got)):
                broken.append(f"{flag} {th.text}: {th.metric} is undefined ({label})")
            elif (th.above and got > th.value) or (not th.above and got < th.value):
                rel = ">" if th.above else "<"
                broken.append(f"{flag} {th.text}: {th.metric} = {got:.4g} {rel} {th.value:g} ({label})")
    return broken


# ----------------------------------------------------------------------
# output
# ----------------------------------------------------------------------
def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if math.isnan(v):
            return "-"
        return f"{v:.3f}" if abs(v) < 10 else f"{v:.2f}"
    return str(v)


def format_table(df: pl.DataFrame, *, markdown: bool = False) -> str:
    """A plain-text (or Markdown) table of a metrics frame."""
    cols = df.columns
    rows = [[_fmt(v) for v in r] for r in df.iter_rows()]
    if markdown:
        lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(lines)
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(cols)]
    line = lambda cells: "  ".join(c.rjust(w) for c, w in zip(cells, widths))  # noqa: E731
    return "\n".join([line(cols), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def _slug(*parts: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", "_".join(str(p) for p in parts))


def _parity_plot(sub: pl.DataFrame, title: str, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    ok = sub.filter(pl.col("feasible") & pl.col("predicted_us").is_finite() & (pl.col("predicted_us") > 0))
    fig = Figure(figsize=(5.5, 5.0), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    if ok.height:
        x = ok["measured_us"].to_numpy()
        y = ok["predicted_us"].to_numpy()
        lo = float(min(x.min(), y.min())) / 1.5
        hi = float(max(x.max(), y.max())) * 1.5
        ax.scatter(x, y, s=3, alpha=0.35, linewidths=0, rasterized=True)
        ax.plot([lo, hi], [lo, hi], color="black", lw=1, label="y = x")
        ax.plot([lo, hi], [lo * 1.15, hi * 1.15], color="grey", lw=0.8, ls="--", label="±15 %")
        ax.plot([lo, hi], [lo / 1.15, hi / 1.15], color="grey", lw=0.8, ls="--")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.legend(loc="upper left", fontsize=8)
    else:
        ax.text(0.5, 0.5, "no feasible prediction", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("measured (µs)")
    ax.set_ylabel("predicted (µs)")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.25)
    fig.tight_layout()
    fig.savefig(path)


def _ape_histogram(scored: pl.DataFrame, path: Path) -> None:
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    ok = scored.filter(pl.col("feasible") & pl.col("predicted_us").is_finite()).with_columns(
        ape_pct=100.0 * (pl.col("predicted_us") - pl.col("measured_us")).abs() / pl.col("measured_us")
    )
    fig = Figure(figsize=(7.0, 4.2), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    if ok.height:
        top = max(float(ok["ape_pct"].max()), 1.0)
        bins = np.concatenate([[0.0], np.logspace(-1, math.log10(top * 1.01) + 1e-9, 60)])
        for (gpu, backend), sub in ok.group_by(["gpu", "backend"], maintain_order=True):
            ax.hist(sub["ape_pct"].to_numpy(), bins=bins, histtype="step", label=f"{gpu} {backend}")
        ax.set_xscale("symlog", linthresh=0.1)
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no feasible prediction", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("absolute percentage error (%)")
    ax.set_ylabel("configurations")
    ax.set_title("APE of feasible predictions", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)


def write_markdown_report(
    result: AccuracyResult, directory: str | Path, *, broken: Sequence[str] = ()
) -> Path:
    """Write ``README.md``, one parity PNG per group and ``ape_hist.png`` into ``directory``."""
    from tsbatch import MODEL_VERSION

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    lines = [
        "# tsbatch accuracy report",
        "",
        f"Model `{MODEL_VERSION}`. Measured files: " + ", ".join(f"`{f}`" for f in result.files) + ".",
        "",
        "## Overall",
        "",
        format_table(pl.DataFrame([result.overall]), markdown=True),
        "",
        "## Per GPU and backend",
        "",
        format_table(result.by_gpu, markdown=True),
        "",
        "## Per group",
        "",
        format_table(result.groups, markdown=True),
        "",
        "## Skipped",
        "",
    ]
    sk = result.skipped
    for fam, n in sk["unsupported_family_rows"].items():
        lines.append(f"- {n} rows of family `{fam}` (no predictor yet)")
    lines += [
        f"- {sk['nonfinite_time_rows']} rows with non-finite measured time (configuration failed to run)",
        f"- {sk['nonpositive_time_rows']} rows with a non-positive measured time",
        f"- {sk['infeasible_rows']} configurations predicted infeasible "
        "(left out of the error metrics, ranked last in retention and regret)",
        "",
    ]
    audit = result.diagnostics.get("tf32_label_audit", {})
    if audit:
        lines += ["## Are the TF32 labels right?", "",
                  "float32 problems labelled TF32 (at least "
                  f"{TF32_AUDIT_MIN_FLOPS:.0e} FLOPs): if the best measured time beats the "
                  "FP32 CUDA-core peak, TF32 surely ran; if not, the problem most likely ran "
                  "as IEEE FP32 and its TF32 prediction cannot match.", ""]
        for gpu, a in audit.items():
            lines.append(f"- {gpu}: {a['problems_audited']} problems, {a['tf32_proven']} proven TF32, "
                         f"{a['looks_ieee_fp32']} at or below the {a['fp32_cuda_core_peak_tflops']:g} "
                         "TFLOPS FP32 peak")
        lines.append("")
    if broken:
        lines += ["## Broken thresholds", "", *(f"- {b}" for b in broken), ""]
    lines += ["## Each group", ""]
    for row in result.groups.iter_rows(named=True):
        key = [row[k] for k in GROUP_KEYS]
        sub = result.scored.filter(*(pl.col(k) == v for k, v in zip(GROUP_KEYS, key)))
        name = "parity_" + _slug(row["gpu"], row["dtype"], row["backend"]) + ".png"
        title = (
            f"{row['gpu']} {row['dtype']} {row['backend']}: MAPE {_fmt(row['mape_pct'])} %, "
            f"Spearman {_fmt(row['spearman'])}"
        )
        _parity_plot(sub, title, out / name)
        metric_table = "\n".join(
            ["| metric | value |", "|---|---|", *(f"| {m} | {_fmt(row[m])} |" for m in METRICS)]
        )
        lines += [
            f"### {row['gpu']} / {row['dtype']} / {row['backend']}", "",
            metric_table, "", f"![{title}]({name})", "",
        ]
    _ape_histogram(result.scored, out / "ape_hist.png")
    lines += ["## Error distribution", "", "![APE histogram](ape_hist.png)", ""]
    path = out / "README.md"
    path.write_text("\n".join(lines))
    return path


# ----------------------------------------------------------------------
# command line
# ----------------------------------------------------------------------
def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register the ``accuracy`` subcommand on an ``argparse`` subparsers object."""
    p = subparsers.add_parser(
        "accuracy",
        help="score the model against measured kernel times",
        description=(
            "Predict every configuration of measured Parquet files and report MAPE, WMAPE, "
            "median APE, Spearman, top-5 % retention and top-1 regret, overall and per "
            "(gpu, dtype, backend)."
        ),
    )
    p.add_argument("measured", nargs="+", metavar="MEASURED", help="measured Parquet file(s)")
    p.add_argument("--hw", help="GPU of every row (overrides the 'gpu' column and file prefix)")
    p.add_argument("--triton-version", metavar="X.Y",
                   help="Triton release of GEMM files that record none (no 'triton_version' "
                        "column or tsbatch measure metadata); default: "
                        f"{AUTOHEURISTIC_TRITON_VERSION} for PyTorch AutoHeuristic rows, the "
                        "model's default release otherwise")
    p.add_argument("--json", metavar="REPORT.json", help="write the metrics as JSON")
    p.add_argument("--report", metavar="DIR", help="write a Markdown summary with parity plots")
    p.add_argument(
        "--fail-above", action="append", default=[], metavar="METRIC[SEL]=VALUE",
        help="exit 1 when METRIC exceeds VALUE (repeatable), e.g. mape_pct=15 or "
             "'mape_pct[gpu=*,dtype=float16|bfloat16,backend=triton]=15' (each GPU's "
             "fp16 and bf16 Triton rows, pooled)",
    )
    p.add_argument(
        "--fail-below", action="append", default=[], metavar="METRIC[SEL]=VALUE",
        help="exit 1 when METRIC falls below VALUE (repeatable), e.g. spearman=0.85",
    )
    sel = p.add_mutually_exclusive_group()
    sel.add_argument("--limit-problems", type=int, metavar="N",
                     help="only the first N problems of each file (quick runs)")
    sel.add_argument("--sample-problems", type=int, metavar="N",
                     help="N problems of each file drawn at random (see --seed)")
    p.add_argument("--seed", type=int, default=0, help="seed of --sample-problems (default 0)")
    p.set_defaults(func=run)
    return p


def print_summary(result) -> None:
    """Print the per-GPU and per-group tables and what was skipped."""
    print("per GPU and backend")
    print(format_table(result.by_gpu))
    print()
    print("per group")
    print(format_table(result.groups))
    sk = result.skipped
    skipped = ", ".join(f"{n} {f} rows" for f, n in sk["unsupported_family_rows"].items())
    print(
        f"\nskipped: {skipped or 'no unsupported family'}; {sk['nonfinite_time_rows']} non-finite "
        f"times; {sk['infeasible_rows']} predicted infeasible"
    )
    for gpu, a in getattr(result, "diagnostics", {}).get("tf32_label_audit", {}).items():
        print(f"tf32 label audit, {gpu}: of {a['problems_audited']} float32 problems labelled TF32, "
              f"{a['tf32_proven']} beat the {a['fp32_cuda_core_peak_tflops']:g} TFLOPS FP32 peak "
              f"(TF32 ran), {a['looks_ieee_fp32']} do not (most likely IEEE FP32: their TF32 "
              "predictions cannot match)")


def _run_e2e_files(args: argparse.Namespace) -> bool:
    """End-to-end serving files (``shared/data/e2e``): scored by :mod:`tsbatch.serving.accuracy`.

    True when every file given is one (and they were scored), False when none is.
    """
    from tsbatch.serving.accuracy import is_e2e_file, run_e2e

    kinds = {is_e2e_file(p) for p in args.measured}
    if kinds == {False}:
        return False
    if kinds == {True, False}:
        raise InputError("end-to-end files (prefill_ms, decode_step_ms, total_ms) and kernel "
                         "files cannot be scored in one run; give them separately")
    args.e2e_rc = run_e2e(args.measured, json_path=args.json,
                          fail_above=list(getattr(args, "fail_above", []) or []))
    return True


def run(args: argparse.Namespace, *, predictors: Mapping[str, Predictor] | None = None) -> int:
    """Run the ``accuracy`` subcommand; 0 when every threshold holds, 1 otherwise.

    Bad input raises :class:`~tsbatch.errors.InputError` (exit status 2 in the CLI).
    """
    if _run_e2e_files(args):
        return args.e2e_rc
    thresholds = [parse_threshold(t, above=True) for t in args.fail_above]
    thresholds += [parse_threshold(t, above=False) for t in args.fail_below]
    result = run_accuracy(
        args.measured, hw=args.hw, predictors=predictors,
        limit_problems=args.limit_problems, sample_problems=args.sample_problems, seed=args.seed,
        triton_version=getattr(args, "triton_version", None),
    )
    broken = check_thresholds(result, thresholds)
    print_summary(result)
    if args.json:
        result.write_json(args.json)
    if args.report:
        write_markdown_report(result, args.report, broken=broken)
    for b in broken:
        print(f"tsbatch accuracy: threshold broken: {b}", file=sys.stderr)
    return 1 if broken else 0
