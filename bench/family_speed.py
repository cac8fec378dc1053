"""Warm rows/s of every kernel family with a built-in sweep, GEMM timed beside it (issue 35).

    OMP_WAIT_POLICY=passive python bench/family_speed.py [--rows 100000] [--hw h100,a100]
                                                         [--families gemm,rowwise,...]
                                                         [--repeats 3] [--stages] [--json OUT.json]

Issue 35's speed target includes "no family slower than GEMM per row". This
times warm, in-process ``evaluate(table, hw, family=F)`` for every family that
has a built-in sweep (``sweeps/*.toml``), GEMM among them, on a table of about
``--rows`` distinct rows per family, and prints rows/s and the ratio
family / GEMM (rows/s of the family over GEMM's, same GPU, same run), marking
every family below 1.0 (slower than GEMM per row). The ratio is given twice: by
wall time (what a user waits for) and by the process's CPU time (every thread)
of the same passes (the work per row). On a shared machine the wall ratio swings
by 0.1-0.2 between runs while the CPU one holds (docs/gemm_accuracy.md, "Where
issue 35 stands at the end of session 9"), so compare two versions by the CPU
ratio there; the two differ for good where a family's work runs on fewer threads
than GEMM's (whose cache model uses every core).

The table of a family (:func:`family_table`). Its base is the candidate rows of
the family's largest built-in sweep (tile sweeps through
``tsbatch.engine.sweep.load_sweep`` / ``candidate_chunks``; the collective and
fused compute-communication sweeps, ``comm_*.toml``, through
``tsbatch.collectives.cli.sweep_frame``, as ``tsbatch comm sweep`` expands
them), cut to the family's input columns, duplicates dropped. Copy ``i``
(0, 1, 2, ...) of the base has the family's size column raised by ``i``
(:data:`SHIFT`: ``m``, ``tokens``, ``rows``, ``seq_len``, ``seq_len_kv``,
``bytes``; the fused families by a step that keeps their sizes divisible by
their GPU and chunk counts, and over two columns where the sweep is tiny), so a
copy is the same workloads slightly larger; a shifted row equal to an earlier
one (a size 1 raised to 64 where the sweep also has 64) is dropped, and copies
are added until there are at least ``--rows`` distinct rows; more than
``--rows``: evenly spaced rows of them. The same arguments give the same
table, in the same order.

Why distinct: the evaluator shares work between equal rows and equal cache
problems (``tsbatch.engine.evaluate`` groups identical cache-problem keys,
and chunks share a ``CacheMemo``), so the sweep replicated as it is would
price each copy after the first almost for free, and would flatter the
families whose rows deduplicate (GEMM's cache problems most) over those that
price every row on its own. Shifted copies are what a real sweep looks like
(the 2 M-row LLM sweep repeats its shapes with M + 1, M + 2, ...): rows still
share what genuinely equal rows share, nothing more. The cost of a shifted
row is the sweep row's within a few per cent (sizes grow by at most a few
hundred elements on shapes of thousands, except ``rows`` of the norms sweep
and ``tokens`` of the MoE sweeps, which start at 1 and 128: the table says
how many rows are feasible).

Timing. Per GPU: each family is evaluated once untimed on an evenly spaced
slice of its table (``--warmup-rows``: numba kernels load or compile, caches),
then ``--repeats`` rounds time the whole table of every family in turn, the
order reversed every other round so no family always runs after the same
neighbour; in a round a family's time is the best of as many passes as add up
to 1 s (at most 10: :func:`time_round`), and the median of the rounds is
reported. Only ratios measured in the same
run compare across runs (the machine may be shared and noisy).

Not compared: a family with under half its rows feasible on a GPU
(:data:`MIN_FEASIBLE`; the Hopper-only ``attention_fa3`` and ``mla_decode`` on
A100, none feasible) is timed and listed apart, not counted among the families
set against GEMM there: an infeasible row is priced in a fraction of a feasible
one's time, so its ratio would measure the infeasibility check.

``--stages``: after the rounds, one more ``evaluate`` per family with
evaluate's ``timings`` says where each family's time goes (validate, lowering,
occupancy, cache model, envelope, assemble), how many cache problems it
solved and the cache model's microseconds per problem, each against GEMM's per
row. A diagnosis beside the ratios, not one of them (e.g. session 16:
moe_grouped_gemm's 11,951 cache problems take 22 us each on H100 against GEMM's
10,262 at 12 us: 2.2x GEMM's cache time per row, and 1.7x its other stages).

Left out: families with no built-in sweep (``ag_gemm``; a user's tile program),
named in the output. The collective families (``collective``, ``gemm_rs``,
``moe_ep``, ``ulysses``) run through ``evaluate`` like the others, but their
GPUs come from the ``system`` column, not from ``--hw``. The fused ones
(``gemm_rs``, ``moe_ep``, ``ulysses``: a GEMM or attention kernel priced on the
system's GPU) run in each GPU's rounds on that GPU's system
(:func:`gpu_tables`: ``a100`` on ``dgx_a100``, ``h100`` on ``dgx_h100``), so
that their ratio to the GEMM of the same rounds compares work on one GPU (their
sweeps name ``dgx_h100`` and ``hgx_b200``: before session 16 an A100 round timed
H100 and B200 kernels against A100's GEMM, whose rows cost about a third less).
``collective`` prices no kernel and keeps its sweep's systems.

``bench/regress.py`` imports :func:`family_tables` (the working tree builds
the tables once, for both versions) and :func:`time_round` (in
``bench/regress_worker.py serve-families``, under either version's tsbatch),
so the timing helpers take ``evaluate`` as an argument and import nothing of
tsbatch themselves.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "passive")

import numpy as np  # noqa: E402
import polars as pl  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

#: per family, the (input column, step) pairs its copies shift: copy ``i`` of the sweep,
#: written in base ``R`` with one digit per pair (``R`` the smallest with ``R ** pairs`` >=
#: the copies needed), raises each column by its digit x its step. One column, step 1, for
#: the tile families: ragged sizes are what a real sweep holds. The fused families split
#: their sizes over GPUs and chunks: their steps keep every size divisible as the sweep's
#: were (a size that is not makes the row infeasible, priced cheaply: a table of those
#: would flatter the family). Their sweeps hold 9 to 30 rows, so thousands of copies: a
#: second column (one that is not split) keeps gemm_rs's and moe_ep's sizes within ~2x of
#: the sweep's (with m alone, step 128, moe_ep's tokens grew 130x and its rows/s halved).
#: gemm_rs: m by num_gpus x chunks (8 x 16), n; moe_ep: tokens by chunks x num_gpus
#: (8 x 8), ffn; ulysses: seq_len by num_gpus (8) alone, 32k to ~120k tokens at 100k rows
#: (its other columns are split, or head_dim, which attention keeps to a few values).
SHIFT = {
    "gemm": (("m", 1),), "gemm_epilogue": (("m", 1),), "moe_grouped_gemm": (("tokens", 1),),
    "rowwise": (("rows", 1),), "attention": (("seq_len", 1),), "attention_fa3": (("seq_len", 1),),
    "flash_decoding": (("seq_len_kv", 1),), "mla_decode": (("seq_len_kv", 1),),
    "collective": (("bytes", 1),), "ag_gemm": (("m", 128), ("n", 1)),
    "gemm_rs": (("m", 128), ("n", 1)), "moe_ep": (("tokens", 64), ("ffn", 1)),
    "ulysses": (("seq_len", 8),),
}
DEFAULT_ROWS = 100_000
#: a family whose table has fewer feasible rows than this share on a GPU (the Hopper-only
#: attention_fa3 and mla_decode on A100: none) is timed but not compared with GEMM there:
#: an infeasible row is priced in a fraction of a feasible one's time, so its ratio would
#: measure the infeasibility check, not the model
MIN_FEASIBLE = 0.5


def comparable(feasible: int | None, rows: int) -> bool:
    """Whether a family's ratio to GEMM on a GPU compares priced rows (:data:`MIN_FEASIBLE`);
    ``feasible`` None (a family that reports no feasibility): comparable."""
    return feasible is None or rows == 0 or feasible >= MIN_FEASIBLE * rows


# ----------------------------------------------------------------------
# tables
# ----------------------------------------------------------------------
def _error(msg: str) -> Exception:
    from tsbatch.errors import InputError

    return InputError(msg)


def builtin_sweeps() -> dict[str, tuple[str, pl.DataFrame]]:
    """Per family with a built-in sweep: (sweep name, its candidate rows) of its largest
    built-in sweep (most candidate rows; ties by name)."""
    import tomllib

    from tsbatch.collectives.cli import sweep_frame
    from tsbatch.engine.sweep import candidate_chunks, list_sweeps, load_sweep, sweep_dir

    best: dict[str, tuple[str, pl.DataFrame]] = {}
    for name in list_sweeps():
        path = sweep_dir() / f"{name}.toml"
        doc = tomllib.loads(path.read_text())
        if "sweep" in doc:  # a tile sweep of one GPU
            sp = load_sweep(path)
            family = sp.family
            frame = pl.concat(list(candidate_chunks(sp)), how="vertical")
        else:  # a collective or fused sweep (tsbatch comm sweep)
            family, frame, _ = sweep_frame(path)
        if family not in best or frame.height > best[family][1].height:
            best[family] = (name, frame)
    return dict(sorted(best.items(), key=lambda kv: (kv[0] != "gemm", kv[0])))


class NoRowsOnSystem(Exception):
    """A sweep none of whose rows a system can run (:func:`family_table` with ``system``)."""


def system_for_gpu(hw) -> str | None:
    """The multi-GPU system the fused compute-communication families run on in ``hw``'s
    rounds: of the systems in ``hw/systems/`` whose GPU is ``hw``, the one with the most
    GPUs per node, an NVLink switch before bridges or a mesh, then by name (``a100``:
    ``dgx_a100``, ``h100``: ``dgx_h100``); None where no system has that GPU."""
    from tsbatch.collectives.systems import get_system, list_systems
    from tsbatch.engine.evaluate import resolve_hw

    key = resolve_hw(hw).key
    have = [s for s in (get_system(k) for k in list_systems()) if s.gpu == key]
    if not have:
        return None

    def rank(s):
        switched = s.nvlink is not None and s.nvlink.topology == "switched"
        return (-s.gpus_per_node, not switched, s.key)
    return min(have, key=rank).key


def gpu_tables(families, hw, rows: int = DEFAULT_ROWS,
               sweeps: dict[str, tuple[str, pl.DataFrame]] | None = None
               ) -> tuple[dict[str, pl.DataFrame], dict[str, str]]:
    """The fused families' tables for ``hw``'s rounds, and the system each runs on.

    A fused compute-communication family (``kernels_catalog.fused_comm``: ``gemm_rs``,
    ``moe_ep``, ``ulysses``, ``ag_gemm``) prices its GEMM or attention on the GPU of its
    rows' ``system``, not on ``--hw``: its sweep's system (``dgx_h100``, ``hgx_b200``) would
    be timed against another GPU's GEMM. Of each fused family in ``families`` this gives
    :func:`family_table` on :func:`system_for_gpu` (``hw``): the sweep's rows moved to that
    system, those it cannot run dropped (``gemm_rs``'s NVLS rows on ``dgx_a100``, whose
    NVSwitch does not reduce: infeasible rows are priced in a fraction of a feasible row's
    time and would flatter the family), then shifted to ``rows`` as any table. Where no
    system has ``hw``'s GPU, or the system runs none of the sweep's rows, the family keeps
    its shared table (not returned) and its entry says why. ``collective`` prices no
    kernel on a GPU and keeps its sweep's systems."""
    from kernels_catalog.fused_comm import FAMILIES as FUSED

    sweeps = builtin_sweeps() if sweeps is None else sweeps
    out, systems = {}, {}
    target = None
    for fam in families:
        if fam not in FUSED or fam not in sweeps:
            continue
        target = target or system_for_gpu(hw) or ""
        if not target:
            systems[fam] = f"its sweep's (no system with {hw})"
            continue
        try:
            out[fam] = family_table(fam, rows, sweeps, system=target)
            systems[fam] = target
        except NoRowsOnSystem as exc:
            systems[fam] = f"its sweep's ({exc})"
    return out, systems


def families_without_sweep(have) -> list[str]:
    """Registered families that no built-in sweep covers (left out of the timing)."""
    from kernels_catalog.registry import FAMILIES

    return [f for f in FAMILIES if f not in have]


def family_table(family: str, rows: int = DEFAULT_ROWS,
                 sweeps: dict[str, tuple[str, pl.DataFrame]] | None = None,
                 system: str | None = None) -> pl.DataFrame:
    """About ``rows`` distinct rows of ``family`` made from its built-in sweep (see the
    module's docstring): shifted copies of the sweep's rows, evenly thinned to ``rows``.
    ``system`` (a family with a ``system`` column): the sweep's rows moved to that system
    first, those infeasible there dropped (:func:`gpu_tables`)."""
    from kernels_catalog.registry import FAMILIES

    if rows < 1:
        raise _error(f"rows must be at least 1, got {rows}")
    sweeps = builtin_sweeps() if sweeps is None else sweeps
    if family not in sweeps:
        if family in FAMILIES:
            raise _error(f"family '{family}' has no built-in sweep; families with one: "
                         f"{', '.join(sweeps)}")
        raise _error(f"unknown family '{family}'; families with a built-in sweep: {', '.join(sweeps)}")
    if family not in SHIFT:
        raise _error(f"family '{family}': no size column to shift in bench/family_speed.py SHIFT")
    pairs = SHIFT[family]
    name, frame = sweeps[family]
    known = {c.name for c in FAMILIES[family].columns}
    base = frame.select([c for c in frame.columns if c in known]).unique(maintain_order=True)
    if system is not None:
        base = _on_system(family, base, system)
    for col, _ in pairs:
        if col not in base.columns:
            raise _error(f"family '{family}': sweep {name} has no column {col!r} to shift")
    copies = -(-rows // base.height)
    while True:
        table = _shifted(base, pairs, copies)
        if table.height >= rows:
            break
        copies += -(-(rows - table.height) // base.height)
    if table.height > rows:
        table = table[(np.arange(rows, dtype=np.int64) * table.height) // rows]
    return table


def _on_system(family: str, base: pl.DataFrame, system: str) -> pl.DataFrame:
    """``base``'s rows with ``system`` in their ``system`` column, the rows infeasible
    there dropped (evaluated: the sweeps hold 9 to 540 rows)."""
    from tsbatch.collectives.systems import get_system
    from tsbatch.engine.evaluate import evaluate

    if "system" not in base.columns:
        raise _error(f"family '{family}': its sweep has no system column to move")
    moved = base.with_columns(pl.lit(system, dtype=base.schema["system"]).alias("system"))
    moved = moved.unique(maintain_order=True)
    feasible = evaluate(moved, get_system(system).gpu, family=family)["feasible"].to_numpy()
    if not feasible.any():
        raise NoRowsOnSystem(f"{system} runs none of its rows")
    return moved.filter(pl.Series(feasible))


def _shifted(base: pl.DataFrame, pairs, copies: int) -> pl.DataFrame:
    """``copies`` shifted copies of ``base`` (copy 0 as it is), duplicates dropped."""
    radix = 1
    while radix ** len(pairs) < copies:
        radix += 1
    parts = []
    for i in range(copies):
        shifts, rest = [], i
        for col, step in pairs:
            rest, digit = divmod(rest, radix)
            if digit:
                shifts.append((pl.col(col) + digit * step).cast(base.schema[col]))
        parts.append(base.with_columns(shifts) if shifts else base)
    return pl.concat(parts, how="vertical").unique(maintain_order=True)


def family_tables(rows: int = DEFAULT_ROWS, families: list[str] | None = None,
                  sweeps: dict[str, tuple[str, pl.DataFrame]] | None = None
                  ) -> dict[str, tuple[str, pl.DataFrame]]:
    """(sweep name, table) per family, GEMM first; ``families`` None: every one with a sweep;
    ``sweeps``: :func:`builtin_sweeps` (made here when not given)."""
    sweeps = builtin_sweeps() if sweeps is None else sweeps
    names = list(sweeps) if families is None else families
    out = {}
    for f in names:
        out[f] = (sweeps[f][0] if f in sweeps else "", family_table(f, rows, sweeps))
    if "gemm" in out:
        out = {"gemm": out["gemm"], **{k: v for k, v in out.items() if k != "gemm"}}
    return out


# ----------------------------------------------------------------------
# timing (no tsbatch import: ``evaluate`` is passed in)
# ----------------------------------------------------------------------
def warm_up(evaluate, tables: dict[str, pl.DataFrame], hw, warmup_rows: int = 2000) -> dict[str, dict]:
    """One untimed ``evaluate`` per family on an evenly spaced slice of its table.
    Per family ``{"status": "ok", "seconds"}`` or, when the version cannot evaluate it
    (an unknown family or column), ``{"status": "error", "error"}``."""
    out = {}
    for fam, table in tables.items():
        step = max(1, table.height // max(warmup_rows, 1))
        t0 = time.perf_counter()
        try:
            evaluate(table.gather_every(step), hw, family=fam)
            out[fam] = {"status": "ok", "seconds": time.perf_counter() - t0}
        except Exception as exc:  # noqa: BLE001  (a version without this family: n/a)
            text = str(exc).strip().splitlines()
            out[fam] = {"status": "error", "error": f"{type(exc).__name__}: {text[0] if text else ''}"}
    return out


def time_round(evaluate, tables: dict[str, pl.DataFrame], hw, order: list[str], log=None,
               label: str = "", min_seconds: float = 1.0, max_passes: int = 10) -> dict[str, dict]:
    """Timed ``evaluate`` of each family's whole table, in ``order``: passes until they
    add up to ``min_seconds`` (at most ``max_passes``), the family's time the best of them
    (the pass least disturbed by the machine's other jobs; a family slower than
    ``min_seconds`` gets one pass, the quick ones a few, whose single pass of ~0.1 s a
    moment's load would swing). ``cpu_seconds``: the process's CPU time (every thread) of
    that best pass, which other jobs on the machine disturb far less than its wall time.
    Per family ``{"status": "ok", "seconds", "cpu_seconds", "passes", "rows", "feasible"}``
    or ``{"status": "error", "error"}``."""
    out = {}
    for fam in order:
        table = tables[fam]
        passes, cpu = [], []
        try:
            while not passes or (sum(passes) < min_seconds and len(passes) < max_passes):
                t0, c0 = time.perf_counter(), time.process_time()
                res = evaluate(table, hw, family=fam)
                passes.append(time.perf_counter() - t0)
                cpu.append(time.process_time() - c0)
        except Exception as exc:  # noqa: BLE001
            text = str(exc).strip().splitlines()
            out[fam] = {"status": "error", "error": f"{type(exc).__name__}: {text[0] if text else ''}"}
            continue
        best = min(range(len(passes)), key=passes.__getitem__)
        dt = passes[best]
        feas = int(res["feasible"].sum()) if "feasible" in res.columns else None
        out[fam] = {"status": "ok", "seconds": dt, "cpu_seconds": cpu[best], "passes": passes,
                    "rows": table.height, "feasible": feas}
        if log:
            log(f"  {label or hw}: {fam} {dt:.2f} s ({table.height / dt:,.0f} rows/s, best of {len(passes)})")
    return out


#: evaluate's ``timings`` keys, in the order a tile family's rows go through them
STAGES = ("validate_s", "lowering_s", "occupancy_s", "cache_s", "envelope_s", "assemble_s")


def stage_times(evaluate, tables: dict[str, pl.DataFrame], hw, passes: int = 3) -> dict[str, dict]:
    """Where each family's time goes: ``evaluate(..., timings=...)`` of its whole table,
    the pass of least wall time of ``passes``; per family ``{"seconds", <STAGES>,
    "cache_problems", "cache_problems_reused"}`` (the stages, the cache problems solved
    and those shared, as evaluate counts them). The families that compose others (the
    fused ones, collectives) keep no stage timings: theirs are ``None`` beside their
    ``seconds``. Untimed in the rounds' figures: a diagnosis of the ratios, not a ratio."""
    out = {}
    for fam, table in tables.items():
        best = None
        for _ in range(max(passes, 1)):
            tm: dict = {}
            t0 = time.perf_counter()
            evaluate(table, hw, family=fam, timings=tm)
            dt = time.perf_counter() - t0
            if best is None or dt < best["seconds"]:
                best = {"seconds": dt, **{k: tm.get(k) for k in STAGES},
                        "cache_problems": tm.get("cache_problems"),
                        "cache_problems_reused": tm.get("cache_problems_reused")}
        out[fam] = best
    return out


def format_stages(hw: str, rows: dict[str, int], st: dict[str, dict]) -> str:
    """The table of :func:`stage_times`: seconds per stage, cache problems, the cache
    model's microseconds per problem solved, and each stage over GEMM's."""
    lines = [f"\n{hw}: where the time goes (one evaluate per family, best of its passes; "
             "'x GEMM' = the stage's seconds per row over GEMM's)",
             f"{'family':>17} {'total s':>8} " + " ".join(f"{k[:-2]:>10}" for k in STAGES)
             + f" {'problems':>9} {'us/problem':>10} {'cache x GEMM':>12} {'other x GEMM':>12}"]
    g = st.get("gemm")
    for f, r in st.items():
        cells = " ".join(f"{r[k]:>10.3f}" if r[k] is not None else f"{'n/a':>10}" for k in STAGES)
        probs = r["cache_problems"]
        us = (f"{1e6 * r['cache_s'] / probs:>10.1f}" if probs and r["cache_s"] is not None
              else f"{'n/a':>10}")
        ratios = [f"{'n/a':>12}"] * 2
        if g is not None and r["cache_s"] is not None:
            # the cache model's seconds, and everything else of the wall time, per row over GEMM's
            pairs = ((r["cache_s"], g["cache_s"]),
                     (r["seconds"] - r["cache_s"], g["seconds"] - g["cache_s"]))
            ratios = [f"{(mine / rows[f]) / (base / rows['gemm']):>12.2f}" if base else f"{'n/a':>12}"
                      for mine, base in pairs]
        lines.append(f"{f:>17} {r['seconds']:>8.3f} {cells} "
                     f"{probs if probs is not None else 'n/a':>9} {us} {' '.join(ratios)}")
    return "\n".join(lines)


def round_order(families: list[str], i: int) -> list[str]:
    """Round ``i``'s order: as listed on even rounds, reversed on odd ones."""
    return list(families) if i % 2 == 0 else list(families)[::-1]


# ----------------------------------------------------------------------
# command line
# ----------------------------------------------------------------------
def _split(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def run(args, log) -> dict:
    from tsbatch.engine.evaluate import evaluate, resolve_hw

    hws = _split(args.hw)
    if not hws:
        raise _error("--hw: no GPU named")
    specs = {}
    for h in hws:
        specs[h] = resolve_hw(h)  # an unknown GPU: one InputError naming it
    sweeps = builtin_sweeps()
    fams = list(sweeps) if args.families is None else _split(args.families)
    if "gemm" not in fams:
        fams = ["gemm", *fams]  # the yardstick
    t0 = time.perf_counter()
    built = {}
    for f in fams:
        built[f] = (sweeps[f][0] if f in sweeps else "", family_table(f, args.rows, sweeps))
    fams = ["gemm", *[f for f in fams if f != "gemm"]]
    tables = {f: built[f][1] for f in fams}
    log(f"tables: {len(fams)} families, {sum(t.height for t in tables.values()):,} rows "
        f"in {time.perf_counter() - t0:.1f} s")
    out: dict = {"rows": args.rows, "repeats": args.repeats, "cpus": os.cpu_count(),
                 "load_avg_1min_start": os.getloadavg()[0], "hw": {},
                 "sweeps": {f: built[f][0] for f in fams},
                 "left_out": {f: "no built-in sweep" for f in families_without_sweep(sweeps)}}
    out["systems"] = {}
    for h in hws:
        own, out["systems"][h] = gpu_tables(fams, h, args.rows, sweeps)
        tabs = {**tables, **own}
        warm = warm_up(evaluate, tabs, specs[h], args.warmup_rows)
        bad = {f: w["error"] for f, w in warm.items() if w["status"] != "ok"}
        if bad:
            raise _error(f"{h}: " + "; ".join(f"{f}: {e}" for f, e in bad.items()))
        log(f"{h}: warm-up " + ", ".join(f"{f} {w['seconds']:.1f} s" for f, w in warm.items()))
        runs: dict[str, list[dict]] = {f: [] for f in fams}
        for i in range(args.repeats):
            log(f"{h}: round {i + 1}/{args.repeats}")
            res = time_round(evaluate, tabs, specs[h], round_order(fams, i), log, h)
            for f, r in res.items():
                if r["status"] != "ok":
                    raise _error(f"{h}: {f}: {r['error']}")
                runs[f].append(r)
        per = {}
        for f in fams:
            med = statistics.median(r["seconds"] for r in runs[f])
            cpu = statistics.median(r["cpu_seconds"] for r in runs[f])
            per[f] = {"sweep": built[f][0], "rows": tabs[f].height, "median_s": med,
                      "all_s": [r["seconds"] for r in runs[f]], "rows_per_s": tabs[f].height / med,
                      "cpu_median_s": cpu, "cpu_rows_per_s": tabs[f].height / cpu,
                      "feasible": runs[f][-1]["feasible"]}
        g = per["gemm"]["rows_per_s"]
        gc = per["gemm"]["cpu_rows_per_s"]
        for f in fams:
            per[f]["over_gemm"] = per[f]["rows_per_s"] / g
            per[f]["cpu_over_gemm"] = per[f]["cpu_rows_per_s"] / gc
        out["hw"][h] = per
        if getattr(args, "stages", False):
            out.setdefault("stages", {})[h] = stage_times(evaluate, tabs, specs[h])
    out["load_avg_1min_end"] = os.getloadavg()[0]
    return out


def format_table(out: dict) -> str:
    lines = []
    for h, per in out["hw"].items():
        lines.append(f"\n{h}: {out['repeats']} rounds, medians; family/GEMM = rows/s over GEMM's "
                     "(same GPU, same rounds), by wall time and by the process's CPU time (every "
                     "thread; other jobs on a shared machine disturb it far less); '<1' marks a "
                     "family slower than GEMM per row")
        lines.append(f"{'family':>17} {'sweep':>15} {'rows':>9} {'feasible':>9} {'median s':>9} "
                     f"{'rows/s':>11} {'family/GEMM':>12}    {'CPU s':>7} {'CPU fam/GEMM':>13}")
        for f, r in per.items():
            feas = "n/a" if r["feasible"] is None else f"{100 * r['feasible'] / r['rows']:.0f} %"
            mark = "  <1" if r["over_gemm"] < 1.0 else "    "
            cmark = "  <1" if r["cpu_over_gemm"] < 1.0 else ""
            lines.append(f"{f:>17} {r['sweep']:>15} {r['rows']:>9,} {feas:>9} {r['median_s']:>9.3f} "
                         f"{r['rows_per_s']:>11,.0f} {r['over_gemm']:>12.3f}{mark}"
                         f"{r['cpu_median_s']:>7.3f} {r['cpu_over_gemm']:>13.3f}{cmark}")
        on = out.get("systems", {}).get(h, {})
        if on:
            lines.append(f"{h}: fused families on " + ", ".join(f"{f} {s}" for f, s in on.items()))
        out_of = {f: r for f, r in per.items() if comparable(r["feasible"], r["rows"])}
        aside = [f"{f} {100 * r['feasible'] / r['rows']:.0f} %" for f, r in per.items() if f not in out_of]
        for what, key in (("wall", "over_gemm"), ("CPU", "cpu_over_gemm")):
            slow = [f for f, r in out_of.items() if r[key] < 1.0]
            lines.append(f"{h}: {len(slow)} of {len(out_of) - 1} families slower than GEMM per row by "
                         f"{what} time" + (f": {', '.join(slow)}" if slow else ""))
        if aside:
            lines.append(f"{h}: not compared (under {100 * MIN_FEASIBLE:.0f} % of the rows feasible on "
                         f"this GPU, their time is the infeasibility check's): {', '.join(aside)}")
    for h, st in out.get("stages", {}).items():
        lines.append(format_stages(h, {f: r["rows"] for f, r in out["hw"][h].items()}, st))
    if out["left_out"]:
        lines.append("left out: " + ", ".join(f"{f} ({why})" for f, why in out["left_out"].items()))
    lines.append(f"load avg (1 min) start {out['load_avg_1min_start']:.2f}, end {out['load_avg_1min_end']:.2f}, "
                 f"{out['cpus']} CPUs (shared machine: compare ratios of one run, not rates across runs)")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--rows", type=int, default=DEFAULT_ROWS,
                    help="distinct rows per family (default %(default)s)")
    ap.add_argument("--hw", default="h100", help="GPUs, comma-separated (default %(default)s)")
    ap.add_argument("--families", default=None,
                    help="comma-separated families (default: every one with a built-in sweep; "
                         "GEMM is always timed)")
    ap.add_argument("--repeats", type=int, default=3, help="timed rounds (default %(default)s)")
    ap.add_argument("--warmup-rows", type=int, default=2000,
                    help="rows of each family's untimed warm-up (default %(default)s)")
    ap.add_argument("--stages", action="store_true",
                    help="after the rounds, one more evaluate per family with evaluate's timings: "
                         "seconds per stage (validate, lowering, occupancy, cache, envelope, "
                         "assemble), cache problems and the cache model's us per problem, against "
                         "GEMM's (where a family's time goes; not part of the ratios)")
    ap.add_argument("--json", type=Path, default=None, metavar="OUT.json", help="write every figure as JSON")
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(REPO))
    from tsbatch.errors import InputError

    log = (lambda msg: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    try:
        if args.repeats < 1:
            raise InputError(f"--repeats must be at least 1, got {args.repeats}")
        out = run(args, log)
    except InputError as exc:
        print(f"family_speed.py: {exc}", file=sys.stderr)
        return 2
    print(f"bench/family_speed.py --rows {args.rows} --hw {args.hw} --repeats {args.repeats}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(format_table(out))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
