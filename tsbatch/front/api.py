"""The Python API: tables in memory in, tables of the same kind out, no files.

Everything here is also at the top of the package, so one import is enough::

    import polars as pl
    import tsbatch

    cands = pl.DataFrame({"m": [4096] * 3, "n": [4096] * 3, "k": [4096] * 3,
                          "dtype": ["float16"] * 3, "block_m": [64, 128, 128],
                          "block_n": [64, 128, 256], "block_k": [32, 64, 64],
                          "num_stages": [3, 4, 3], "num_warps": [4, 8, 8]})
    res = tsbatch.evaluate_table(cands, hw="h100")            # every row predicted
    best = tsbatch.rank_table(cands, hw="h100", top="34%")     # fastest third per workload
    print(tsbatch.explain_config(cands.row(1, named=True), hw="h100"))
    kept = tsbatch.prune_configs({"m": 4096, "n": 4096, "k": 4096, "dtype": "float16"},
                                 cands.drop("m", "n", "k", "dtype").to_dicts(), hw="h100")
    tsbatch.list_gpus()                                        # what `tsbatch hw` lists

Each function converts the caller's table and calls what the CLI command
runs (:func:`tsbatch.engine.pipeline.evaluate_frame`, the pipeline behind ``tsbatch
evaluate``; :func:`tsbatch.engine.prune.prune`, :func:`tsbatch.front.explain.explain_text`,
:mod:`tsbatch.hw`), so the results are those of the command on the same rows. Bad input raises one
:class:`~tsbatch.errors.InputError` naming the problem (the message the
command prints), before anything is predicted.

The names carry a suffix (``evaluate_table``, not ``evaluate``) because
``tsbatch.hw`` is a module of the package (a function of that name would be
replaced by the module the first time the module is imported), as ``evaluate``,
``rank``, ``prune`` and ``explain`` were before they moved to
``tsbatch.engine`` and ``tsbatch.front``.

This module imports neither numba nor polars until a function is called.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from tsbatch.errors import InputError

__all__ = ["evaluate_table", "rank_table", "prune_configs", "explain_config", "Explanation",
           "list_gpus", "list_families"]


# --------------------------------------------------------------------------- tables in and out
def _kind(candidates) -> str:
    """What the caller gave: ``arrow``, ``arrow_batch``, ``pandas`` or ``polars``."""
    mod = type(candidates).__module__
    if mod.startswith("pyarrow"):
        import pyarrow as pa

        if isinstance(candidates, pa.Table):
            return "arrow"
        if isinstance(candidates, pa.RecordBatch):
            return "arrow_batch"
    if mod.startswith("pandas"):
        return "pandas"
    return "polars"  # a polars DataFrame, or a dict or path read into one


def _as_polars(candidates):
    from tsbatch.boundary.schema import to_polars

    if candidates is None:
        raise InputError("candidates is None; give a polars DataFrame or a pyarrow Table")
    return _kind(candidates), to_polars(candidates)


def _back(result, kind: str, original):
    """``result`` (polars) as the kind of table the caller gave."""
    if kind == "polars":
        return result
    if kind == "pandas":
        return result.to_pandas()
    import pyarrow as pa

    table = result.to_arrow()
    # columns passed through keep the caller's Arrow types (polars gives
    # large_string for string, for one)
    fields = []
    for f in table.schema:
        i = original.schema.get_field_index(f.name)
        want = original.schema.field(i).type if i >= 0 else f.type
        fields.append(f.with_type(want) if want != f.type else f)
    schema = pa.schema(fields)
    if schema != table.schema:
        try:
            table = table.cast(schema)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):  # pragma: no cover
            pass
    if kind == "arrow_batch":
        batches = table.combine_chunks().to_batches()
        if len(batches) == 1:
            return batches[0]
        return pa.RecordBatch.from_pylist([], schema=table.schema)
    return table


def _sampling(wave_samples, k_samples) -> dict:
    from tsbatch.engine.evaluate import check_sampling

    return check_sampling({"wave_samples": wave_samples, "k_samples": k_samples})


# --------------------------------------------------------------------------- evaluate, rank
def evaluate_table(candidates, hw, *, family=None, wave_samples: int = 8, k_samples: int = 4):
    """Predict every candidate row; the rows ``tsbatch evaluate`` writes.

    Parameters
    ----------
    candidates : polars.DataFrame, pyarrow.Table or pyarrow.RecordBatch
        One row per (workload, schedule) with the family's columns (GEMM:
        ``m, n, k, dtype, block_m, block_n, block_k, num_stages, num_warps``;
        see the README). A pandas DataFrame, a dict of columns or a path to a
        candidate file are read too.
    hw : str or HwSpec
        GPU name or alias (:func:`list_gpus`), or a loaded spec.
    family : str, optional
        Kernel family (:func:`list_families`) or a tile program ``FILE.toml``;
        by default the family whose columns the table has, as the CLI does.
    wave_samples, k_samples : int
        The cache model's sampling (``--wave-samples``, ``--k-samples``).

    Returns
    -------
    The same kind of table as ``candidates`` (polars for a dict or path):
    the input columns followed by :data:`tsbatch.engine.evaluate.RESULT_COLUMNS`,
    in input row order. Infeasible rows have ``feasible = false`` and an
    ``infeasible_reason``.

    Example
    -------
    >>> import pyarrow as pa, tsbatch
    >>> t = pa.table({"m": [4096], "n": [4096], "k": [4096], "dtype": ["float16"],
    ...               "block_m": [128], "block_n": [128], "block_k": [64],
    ...               "num_stages": [4], "num_warps": [8]})
    >>> out = tsbatch.evaluate_table(t, hw="h100")     # a pyarrow.Table
    >>> out.column("latency_us")                        # doctest: +SKIP
    """
    from tsbatch.engine.evaluate import resolve_hw
    from tsbatch.engine.pipeline import evaluate_frame

    spec = resolve_hw(hw)
    sampling = _sampling(wave_samples, k_samples)
    kind, df = _as_polars(candidates)
    return _back(evaluate_frame(df, spec, family, sampling=sampling), kind, candidates)


def rank_table(candidates, hw, *, top: float | str = 1.0, family=None, wave_samples: int = 8,
               k_samples: int = 4):
    """Rank every workload's candidates and keep the fastest ``top`` fraction.

    The rows ``tsbatch evaluate --top TOP`` (or ``--rank`` when ``top`` is
    1) writes: ``rank`` (1 = fastest within its workload; ties by input
    position) added, the first ``max(1, ceil(top * n))`` rows of each
    workload of ``n`` candidates kept (infeasible rows never), sorted by
    workload then rank. Computed by screening (``tsbatch.engine.screen``): rows that
    cannot reach their workload's top are bounded out, not predicted in full;
    the kept rows are those of ranking every full prediction.

    Parameters
    ----------
    candidates, hw, family, wave_samples, k_samples : as :func:`evaluate_table`.
    top : float or str
        Fraction kept per workload: ``0.05`` or ``"5%"``; ``1.0`` (the
        default) or ``"all"`` keeps every feasible row, ranked.

    Returns
    -------
    The same kind of table as ``candidates``.

    Example
    -------
    >>> best = tsbatch.rank_table(cands, hw="h100", top="5%")   # doctest: +SKIP
    >>> best.filter(pl.col("rank") == 1)                        # doctest: +SKIP
    """
    from tsbatch.engine.evaluate import resolve_hw
    from tsbatch.engine.pipeline import evaluate_frame
    from tsbatch.engine.rank import parse_top

    spec = resolve_hw(hw)
    frac = parse_top(top)
    sampling = _sampling(wave_samples, k_samples)
    kind, df = _as_polars(candidates)
    return _back(evaluate_frame(df, spec, family, top=frac, sampling=sampling), kind,
                 candidates)


# --------------------------------------------------------------------------- prune
def prune_configs(workload: dict, configs, hw="h100", top: float = 0.05, *, screen: bool = True,
                  family: str = "gemm"):
    """Keep the predicted-best ``top`` fraction of one workload's configurations.

    :func:`tsbatch.engine.prune.prune` (its documentation has the details), taking
    a pyarrow Table of configurations too. ``workload``: ``{"m", "n", "k",
    "dtype"}`` and optionally ``a_row_major``, ``b_row_major``, ``tf32``.
    ``configs``: a list of dicts, a polars DataFrame or a pyarrow Table with
    ``block_m, block_n, block_k, num_stages, num_warps`` (and optionally
    ``group_m``, ``raster``, ``split_k``).

    Returns a :class:`tsbatch.engine.prune.PruneResult`: ``.configs`` (fastest
    first), ``.latency_us``, ``.indices`` (positions in ``configs``). Raises
    :class:`tsbatch.engine.prune.NoFeasibleConfigError` (an ``InputError``) when
    none can run on ``hw``. For an autotuner asking again and again, a
    :class:`tsbatch.Pruner` keeps its results.

    Example
    -------
    >>> res = tsbatch.prune_configs({"m": 4096, "n": 4096, "k": 4096, "dtype": "float16"},
    ...                             [{"block_m": 128, "block_n": 128, "block_k": 64,
    ...                               "num_stages": 3, "num_warps": 8},
    ...                              {"block_m": 64, "block_n": 64, "block_k": 32,
    ...                               "num_stages": 2, "num_warps": 4}], hw="h100", top=0.5)
    >>> res.configs[0]["block_m"], res.latency_us[0]      # doctest: +SKIP
    """
    from tsbatch.engine.prune import prune

    if type(configs).__module__.startswith("pyarrow"):
        from tsbatch.boundary.schema import to_polars

        configs = to_polars(configs)
    return prune(workload, configs, hw=hw, top=top, screen=screen, family=family)


# --------------------------------------------------------------------------- explain
@dataclasses.dataclass(frozen=True, repr=False)
class Explanation:
    """One configuration explained: printable, and its numbers at hand.

    ``str()`` (and a notebook's display) is the report ``tsbatch explain``
    prints; ``row`` is the result row (``tsbatch explain --json``): input
    columns and :data:`tsbatch.engine.evaluate.RESULT_COLUMNS`, also reachable as
    ``explanation["l2_hit"]``.
    """

    row: dict      #: the evaluated row, column -> value
    text: str      #: the report
    hw: Any        #: the :class:`~tsbatch.hw.HwSpec` it was predicted for
    family: str    #: the kernel family's name

    @property
    def feasible(self) -> bool:
        return bool(self.row["feasible"])

    @property
    def latency_us(self) -> float | None:
        """Predicted kernel time in microseconds (``None`` when infeasible)."""
        return self.row["latency_us"]

    @property
    def bottleneck(self) -> str:
        return self.row["bottleneck"]

    def __getitem__(self, column: str):
        return self.row[column]

    def to_dict(self) -> dict:
        return dict(self.row)

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        if not self.feasible:
            what = f"infeasible: {self.row['infeasible_reason']}"
        else:
            what = f"{self.latency_us:.2f} us, bottleneck {self.bottleneck}"
        return f"<Explanation {self.family} on {self.hw.name}: {what}>"

    def _repr_pretty_(self, p, cycle) -> None:  # IPython / Jupyter: the report
        p.text(self.text)


def _scalar(v) -> bool:
    if isinstance(v, (list, tuple, dict, set)):
        return False
    mod = type(v).__module__
    if mod.startswith(("polars", "pyarrow", "pandas")):
        return False
    return getattr(v, "ndim", 0) == 0 if mod.startswith("numpy") else True


def _one_row(config):
    import polars as pl

    if isinstance(config, Mapping):
        row = {}
        for k, v in config.items():
            if not _scalar(v):
                raise InputError(f"config[{k!r}] is {type(v).__name__}, not one value; "
                                 f"explain_config takes one configuration (evaluate_table "
                                 f"takes many)")
            row[str(k)] = [v]
        if not row:
            raise InputError("config is empty; give the candidate columns of one configuration")
        return pl.DataFrame(row)
    kind, df = _as_polars(config)
    if df.height != 1:
        raise InputError(f"config has {df.height} rows; explain_config takes one "
                         f"(select it first, e.g. df.slice(i, 1))")
    return df


def explain_config(config, hw, *, family="gemm") -> Explanation:
    """Predict one configuration and explain it, as ``tsbatch explain`` does.

    Parameters
    ----------
    config : dict or one-row table
        The candidate columns of one configuration, e.g. ``{"m": 4096,
        "n": 4096, "k": 4096, "dtype": "float16", "block_m": 128, "block_n":
        128, "block_k": 64, "num_stages": 4, "num_warps": 8}``; columns not
        given take the candidate-table defaults, as in :func:`evaluate_table`
        (so float32 runs on CUDA cores unless ``"tf32": True``; the CLI's
        ``explain`` flags turn TF32 on unless ``--no-tf32``). A polars or
        pyarrow table of one row is taken too.
    hw : str or HwSpec
    family : str
        Kernel family or tile program ``FILE.toml`` (``"attention_fa3"``: give
        ``batch, heads, seq_len, head_dim, dtype`` and its schedule columns).

    Returns
    -------
    Explanation
        ``print()`` it for the report; ``.row``, ``.latency_us``,
        ``.bottleneck``, ``["util_dram"]`` for the numbers.

    Example
    -------
    >>> e = tsbatch.explain_config({"m": 4096, "n": 4096, "k": 4096, "dtype": "float16",
    ...                             "block_m": 128, "block_n": 128, "block_k": 64,
    ...                             "num_stages": 4, "num_warps": 8}, hw="h100")
    >>> print(e)                      # doctest: +SKIP
    >>> e.bottleneck, e["l2_hit"]     # doctest: +SKIP
    """
    from tsbatch.engine.evaluate import evaluate, get_family, resolve_hw
    from tsbatch.front.explain import explain_text

    spec = resolve_hw(hw)
    fam = get_family(family)
    res = evaluate(_one_row(config), spec, fam)
    row = res.row(0, named=True)
    return Explanation(row=row, text=explain_text(row, spec, fam), hw=spec, family=fam.name)


# --------------------------------------------------------------------------- catalogues
def list_gpus():
    """The known GPUs, one row each (what ``tsbatch hw`` lists), as a polars DataFrame.

    Columns: ``key`` (the name to pass as ``hw``), ``name``, ``sm_count``,
    ``tc_fp16_tflops``, ``l2_mib``, ``dram_tbps``, ``aliases``. The full spec
    of one: ``tsbatch.get_hw("h100")``.
    """
    import polars as pl

    from tsbatch.hw import get_hw, list_hw

    specs = [get_hw(k) for k in list_hw()]
    return pl.DataFrame({
        "key": list_hw(),
        "name": [s.name for s in specs],
        "sm_count": [s.sm_count for s in specs],
        "tc_fp16_tflops": [float(s.tc_fp16_tflops) for s in specs],
        "l2_mib": [s.l2_bytes / 2**20 for s in specs],
        "dram_tbps": [float(s.dram_bw_tbps) for s in specs],
        "aliases": [list(s.aliases) for s in specs],
    }, schema_overrides={"aliases": pl.List(pl.String)})


def list_families():
    """The kernel families (what ``tsbatch families`` lists), as a polars DataFrame.

    Columns: ``name`` (the ``family=`` to pass), ``summary``, ``required``,
    ``optional`` (``column=default``) and ``workload`` columns, and for the
    families lowered from a tile program its ``tile_program`` source,
    ``actions``, ``body_actions`` and ``legal_orders`` (null otherwise).
    """
    import polars as pl

    from tsbatch.engine.evaluate import FAMILIES

    rows = []
    for fam in FAMILIES.values():
        prog = fam.program
        doc = fam.doc.strip()
        rows.append({
            "name": fam.name,
            "summary": doc.splitlines()[0] if doc else "",
            "required": [c.name for c in fam.columns if c.required],
            "optional": [f"{c.name}={c.default}" for c in fam.columns if not c.required],
            "workload": list(fam.workload_columns),
            "tile_program": None if prog is None else str(prog.source),
            "actions": None if prog is None else len(prog.actions),
            "body_actions": None if prog is None else len(prog.body),
            "legal_orders": None if prog is None else int(prog.orders().shape[0]),
        })
    return pl.DataFrame(rows, schema={
        "name": pl.String, "summary": pl.String, "required": pl.List(pl.String),
        "optional": pl.List(pl.String), "workload": pl.List(pl.String),
        "tile_program": pl.String, "actions": pl.Int64, "body_actions": pl.Int64,
        "legal_orders": pl.Int64})
