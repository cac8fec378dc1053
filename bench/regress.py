"""Regression guard: a reference commit against the working tree, accuracy and speed, side by side.

    python bench/regress.py REF [--quick] [--json OUT.json] [--no-fail]
                            [--tol-mape 0.3] [--tol-bias 0.02] [--tol-spearman 0.005]
                            [--tol-top5 0.3] [--speed-ratio 0.95] [--min-problems 3]
                            [--skip-speed | --skip-accuracy] [--no-cold] [--workdir DIR]
                            [--family-rows N] [--family-hw h100,a100] [--skip-families]
                            [--confirm N]
                            [--keep-predictions DIR]

Run it before every model or speed commit against main's last landing
(``python bench/regress.py main``) and paste its summary block into the
commit message (issue 35).

Install. ``git archive REF`` is unpacked into ``WORKDIR/trees/<sha>``
(default ``$TSBATCH_REGRESS_DIR`` or ``/tmp/tsbatch-regress``; kept, so its
numba cache survives to the next run) and imported with ``PYTHONPATH`` in
subprocesses; nothing is installed into any environment. The working tree is
imported the same way from this checkout (uncommitted changes included).

Accuracy. Every measured file (``../shared/data`` or ``$TSBATCH_SHARED_DATA``:
``gemm/*``, ``attention/*``, ``collectives/*``; and this tree's
``bench/measured/h200-*/gemm.parquet`` and ``.../more/gemm.parquet``) is read,
validated and median-aggregated once, by the working tree's
:func:`tsbatch.measured.accuracy.load_measured` (so both versions get the very same
input rows and columns); each version predicts them in a subprocess
(``bench/regress_worker.py predict``) with its own ``tsbatch accuracy``
predictor; the working tree's :mod:`tsbatch.measured.metrics` and
:mod:`tsbatch.measured.regress_metrics` score both. Per file x GPU x dtype x backend,
whole and per time bucket (the problem's best measured time: < 20 us,
20-100 us, 0.1-1 ms, > 1 ms) and per operand layout: MAPE, median
measured/predicted, Spearman, top-5 % retention. A family, GPU or dtype a
version cannot predict is n/a for that version, never an error.

Cross-validated figures: bench/cross_validate.py's held-out half (its
``split``, seed 0: per GPU x file x dtype, half the problems), with each
version's shipped constants, whole and m*n*k <= 2e10 (``SMALL_MNK``), per
GPU x dtype x backend x file. The fitted-constants column of a full
cross-validation (a grid search of 10+ minutes per version) is not run.

Speed, ratios reference / working tree measured in this run, the two
alternating, each a new process, one untimed warm-up each:
``tsbatch evaluate`` of the 2,000,000-row LLM sweep
(``../shared/tools/mk_llm_sweep.py``, made once into WORKDIR) ``--hw h100``,
Parquet to Parquet, whole process; the same with ``--top 5%``; the start of
a new process evaluating 1,000 rows (numba kernels cached), and the same with
an empty numba cache (every kernel it uses compiles: minutes; once per version,
off with ``--no-cold`` and in ``--quick``);
``prune`` latency (bench/prune_latency.py's workloads and configurations,
sum of the per-workload medians); attention rows/s (the FlexAttention file
through ``evaluate``; n/a where the reference has no attention family); per
family rows/s (bench/family_speed.py's table of ``--family-rows`` distinct rows
of each family with a built-in sweep, made once by the working tree; warm
``evaluate`` on each GPU of ``--family-hw``, default h100 and a100 (A100's GEMM
costs about a third less per row than H100's, where the L1.5 tier adds cache
work: the stricter yardstick), one process per version, the versions alternating
family by family, at least 3 rounds; n/a
where the reference lacks the family), with the working tree's family / GEMM
rows/s on the same GPU beside (issue 35: no family slower than GEMM per row;
reported, not judged; off with ``--skip-families``). The fused families
(``gemm_rs``, ``moe_ep``, ``ulysses``) price their kernels on their ``system``
column's GPU: each GPU's rounds time them on that GPU's own system
(``family_speed.gpu_tables``); ``collective`` keeps its sweep's systems. A family
mostly infeasible on a GPU is named apart in the summary, not counted.

``--quick``: every 7th row of the sweep (285,715 rows, all its 556
workloads: its first 300,000 rows would miss the ragged-M workloads where the
2a4cd2d slowdown is), one timed
repeat instead of two, 300
problems per measured file, 20,000 rows per family, and no cold start (a few minutes on 2 cores);
its accuracy figures are of the sample, so compare them only with other
``--quick`` runs.

Every figure that moved the wrong way by more than its tolerance is marked
``!!`` (``+``: better by more than the tolerance; ``~``: fewer than
``--min-problems`` problems, shown but not judged). A speed figure that reads
worse is first timed again, ``--confirm`` more rounds (default 4) alternated as
the first, and judged on all its runs together; its line gives the first
ratio and the re-timing's own (the cold start, one run of minutes, is not
re-timed). On this 2-core machine identical code read 0.72-0.95 at one
measurement and above 1 at the next: one low reading is a reason to look
again, not a verdict. The run ends with the
summary block and exits 1 when anything regressed (``--no-fail``: 0).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))  # the working tree's tsbatch, whatever the caller's PYTHONPATH

import polars as pl  # noqa: E402

from tsbatch.measured.accuracy import FAMILIES, _dtype_label, load_measured  # noqa: E402
from tsbatch.errors import InputError  # noqa: E402
from tsbatch.measured.regress_metrics import (  # noqa: E402
    Tolerance, accuracy_figures, add_slices, compare_figures, format_comparison, judge_speed,
    judged_rows, summary_lines,
)

GROUP = ("file", "gpu", "dtype", "backend")
CV_GROUP = ("file", "gpu", "dtype", "backend")
SWEEP_TOOL_REL = Path("tools") / "mk_llm_sweep.py"
PY = sys.executable
#: the command line's entry point of either layout (tsbatch.front.cli from the
#: 2026-12-06 regrouping on, tsbatch.cli before), so a reference of either runs
CLI_MAIN = ("import sys, importlib\n"
            "try:\n    m = importlib.import_module('tsbatch.front.cli')\n"
            "except ModuleNotFoundError:\n    m = importlib.import_module('tsbatch.cli')\n"
            "sys.exit(m.main(sys.argv[1:]))")


# ----------------------------------------------------------------------
# versions
# ----------------------------------------------------------------------
def _git(*args: str, cwd: Path = ROOT) -> str:
    r = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        raise InputError(f"git {' '.join(args)}: {r.stderr.strip() or 'failed'}")
    return r.stdout.strip()


def resolve_ref(ref: str, repo: Path = ROOT) -> str:
    """The full commit id of ``ref`` (one clear error when it names none)."""
    try:
        return _git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", cwd=repo)
    except InputError:
        raise InputError(f"REF {ref!r}: not a commit of {repo}") from None


def install_ref(sha: str, workdir: Path, repo: Path = ROOT) -> Path:
    """``git archive`` of ``sha`` (of ``repo``) unpacked into ``workdir/trees/sha``
    (reused when a previous run completed it)."""
    dest = workdir / "trees" / sha
    if (dest / ".regress-complete").exists():
        return dest
    # unpack beside it and rename: another run may be installing the same commit
    part = workdir / "trees" / f".{sha}.{os.getpid()}"
    shutil.rmtree(part, ignore_errors=True)
    part.mkdir(parents=True)
    archive = subprocess.Popen(["git", "archive", sha], cwd=repo, stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(part)], stdin=archive.stdout, check=True)
    if archive.wait() != 0:
        shutil.rmtree(part, ignore_errors=True)
        raise InputError(f"git archive {sha} failed")
    (part / ".regress-complete").write_text(sha + "\n")
    if dest.exists() and not (dest / ".regress-complete").exists():
        shutil.rmtree(dest, ignore_errors=True)  # left half-way by an interrupted older run
    try:
        part.rename(dest)
    except OSError:  # another run finished first: use its tree
        shutil.rmtree(part, ignore_errors=True)
    return dest


def working_label() -> str:
    head = _git("rev-parse", "--short", "HEAD")
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    return f"{head}{'+dirty' if dirty else ''}"


def pyc_prefix(root: Path) -> Path:
    """Where a tree's Python bytecode goes in the guard's runs: one directory per tree,
    outside it, so that each tree is timed with its own bytecode written by its own
    warm-up run (as an installed copy has it), whatever .pyc files the tree holds
    (a tree whose tests wrote .pyc files would otherwise start faster than one that
    never ran them)."""
    base = Path(os.environ.get("TSBATCH_REGRESS_DIR", "/tmp/tsbatch-regress"))
    return base / "pyc" / hashlib.sha1(str(root.resolve()).encode()).hexdigest()[:16]


def version_env(root: Path, extra: dict | None = None) -> dict:
    env = dict(os.environ, PYTHONPATH=str(root), OMP_WAIT_POLICY="passive",
               PYTHONPYCACHEPREFIX=str(pyc_prefix(root)))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.pop("NUMBA_CACHE_DIR", None)  # each tree keeps its kernels in its own __pycache__
    env.update(extra or {})
    return env


# ----------------------------------------------------------------------
# measured data
# ----------------------------------------------------------------------
def data_root() -> Path:
    return Path(os.environ.get("TSBATCH_SHARED_DATA", ROOT.parent / "shared" / "data"))


def measured_files(root: Path) -> list[tuple[str, Path]]:
    """(label, path) of every measured file, in report order."""
    out = []
    for sub in ("gemm", "attention", "collectives"):
        out += [(f"{sub}/{p.name}", p) for p in sorted((root / sub).glob("*.parquet"))]
    for pattern in ("bench/measured/h200-*/gemm.parquet", "bench/measured/h200-*/more/gemm.parquet"):
        out += [(str(p.relative_to(ROOT)), p) for p in sorted(ROOT.glob(pattern))]
    return out


def load_inputs(files: list[tuple[str, Path]], sample_problems: int | None) -> pl.DataFrame:
    """Every file through the working tree's ``load_measured``: one frame with ``file``,
    ``_family``, ``_hw``, unique ``_problem``/``_unit`` ids, the input columns and ``measured_us``."""
    fams = tuple(s.name for s in FAMILIES)
    parts, p0, u0 = [], 0, 0
    for label, path in files:
        loaded = load_measured([path], families=fams, sample_problems=sample_problems)
        for fam, frames in loaded.frames.items():
            for fr in frames:
                fr = fr.with_columns(pl.col("_problem") + p0, pl.col("_unit") + u0,
                                     pl.lit(label).alias("file"), pl.lit(fam).alias("_family"))
                p0, u0 = int(fr["_problem"].max()) + 1, int(fr["_unit"].max()) + 1
                parts.append(fr)
    if not parts:
        raise InputError("no measured rows in " + ", ".join(str(p) for _, p in files))
    return pl.concat(parts, how="diagonal_relaxed")


def write_jobs(inputs: pl.DataFrame, tmp: Path) -> list[dict]:
    """One prediction job per (file, GPU): its input columns as Parquet."""
    spec = {s.name: s for s in FAMILIES}
    jobs = []
    for i, ((label, fam, hw), part) in enumerate(
            inputs.group_by(["file", "_family", "_hw"], maintain_order=True)):
        cols = list(spec[fam].input_cols)
        src = tmp / f"in_{i}.parquet"
        part.select(cols).write_parquet(src)
        jobs.append({"file": label, "family": fam, "hw": hw, "input": str(src), "index": i})
    return jobs


def predict(root: Path, jobs: list[dict], tmp: Path, tag: str, log) -> list[dict]:
    """Run the worker under ``root``'s tsbatch; per job its status and output path."""
    spec = [{"family": j["family"], "hw": j["hw"], "input": j["input"],
             "output": str(tmp / f"out_{tag}_{j['index']}.parquet")} for j in jobs]
    jp, rp = tmp / f"jobs_{tag}.json", tmp / f"result_{tag}.json"
    jp.write_text(json.dumps(spec))
    t0 = time.perf_counter()
    r = subprocess.run([PY, str(BENCH / "regress_worker.py"), "predict", str(jp), str(rp)],
                       cwd=root, env=version_env(root), capture_output=True, text=True)
    if r.returncode != 0 or not rp.exists():
        log(f"  {tag}: worker failed (status {r.returncode}): {r.stderr.strip()[-2000:]}")
        return [{**s, "status": "error", "error": "worker failed"} for s in spec]
    res = json.loads(rp.read_text())
    log(f"  {tag}: predicted {len(jobs)} file x GPU sets in {time.perf_counter() - t0:.0f} s")
    return [{**s, **x} for s, x in zip(spec, res)]


def scored_frame(inputs: pl.DataFrame, jobs: list[dict], results: list[dict]) -> pl.DataFrame:
    """The rows a version predicted, labelled as ``tsbatch accuracy`` labels them
    (``gpu``, ``family``, ``dtype`` with tf32 and collective regimes, ``backend``)."""
    spec = {s.name: s for s in FAMILIES}
    parts = []
    for (key, part), job, res in zip(inputs.group_by(["file", "_family", "_hw"], maintain_order=True),
                                     jobs, results):
        assert key == (job["file"], job["family"], job["hw"])
        if res.get("status") != "ok":
            continue
        pred = pl.read_parquet(res["output"])
        s = spec[job["family"]]
        backend = pl.col(s.backend).cast(pl.String) if s.backend else pl.lit(s.name)
        part = part.with_columns(pred["latency_us"].alias("predicted_us"), pred["feasible"].alias("feasible"))
        part = part.with_columns(pl.col("_hw").alias("gpu"), pl.lit(s.name).alias("family"),
                                 _dtype_label(s).alias("_dl"), backend.alias("_bl"))
        part = part.drop([c for c in ("dtype", "backend") if c in part.columns]).rename(
            {"_dl": "dtype", "_bl": "backend"})
        parts.append(part)
    if not parts:
        return pl.DataFrame()
    return add_slices(pl.concat(parts, how="diagonal_relaxed"))


def cv_figures(scored: pl.DataFrame, held: pl.DataFrame) -> pl.DataFrame:
    """bench/cross_validate.py's held-out half, whole and m*n*k <= SMALL_MNK."""
    from cross_validate import SMALL_MNK  # noqa: E402  (bench/ is on sys.path)

    if scored.height == 0:
        return pl.DataFrame()
    sc = scored.join(held, on="_problem", how="inner")
    small = sc.filter(pl.col("m").cast(pl.Float64) * pl.col("n") * pl.col("k") <= SMALL_MNK)
    parts = []
    for name, frame in (("held-out", sc), ("held-out mnk<=2e10", small)):
        if frame.height:
            f = accuracy_figures(frame, CV_GROUP, kinds=("all",))
            parts.append(f.with_columns(pl.lit(name).alias("slice"), pl.lit("all").alias("slice_kind")))
    return pl.concat(parts) if parts else pl.DataFrame()


def held_out_problems(inputs: pl.DataFrame) -> pl.DataFrame:
    """Problems of the held-out half of bench/cross_validate.py (seed 0), GEMM files of gemm/."""
    from cross_validate import split  # noqa: E402

    g = inputs.filter(pl.col("file").str.starts_with("gemm/") & (pl.col("_family") == "gemm"))
    if g.height == 0:
        return pl.DataFrame(schema={"_problem": pl.Int64})
    from tsbatch.measured.accuracy import GEMM

    g = g.with_columns(pl.col("file").str.split("/").list.last().str.replace(r"\.parquet$", "").alias("set"),
                       _dtype_label(GEMM).alias("label"))
    halves = split(g, 0, 100)
    return halves.filter(pl.col("half") == "held").select(pl.col("_problem").cast(pl.Int64))


# ----------------------------------------------------------------------
# speed
# ----------------------------------------------------------------------
def _run_timed(cmd: list[str], root: Path, extra_env: dict | None = None) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=root, env=version_env(root, extra_env), capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:6])}...: status {r.returncode}: {r.stderr.strip()[-500:]}")
    return dt


def alternate(versions: dict[str, Path], make_cmd, repeats: int, warmup: int, log, name: str,
              extra_env=None) -> dict[str, list[float] | str]:
    """Whole-process seconds of ``make_cmd(tag)`` per version: ``warmup`` untimed runs each,
    then ``repeats`` timed, alternating (the order flips every round)."""
    times: dict[str, list[float]] = {t: [] for t in versions}
    failed: dict[str, str] = {}
    last: dict[str, float] = {}
    tags = list(versions)
    for i in range(warmup + repeats):
        order = tags if i % 2 == 0 else tags[::-1]
        for tag in order:
            if tag in failed:
                continue
            env = extra_env(tag, i) if callable(extra_env) else extra_env
            try:
                dt = _run_timed(make_cmd(tag), versions[tag], env)
            except RuntimeError as exc:
                failed[tag] = str(exc)
                log(f"  {name} [{tag}] failed: {exc}")
                continue
            if i >= warmup:
                times[tag].append(dt)
            if tag not in failed:
                last[tag] = dt
        log(f"  {name} round {i + 1}/{warmup + repeats}" + ("" if i >= warmup else " (warm-up, untimed)")
            + ": " + ", ".join(f"{t} {last[t]:.2f} s" for t in tags if t in last and t not in failed))
    return {t: (failed[t] if t in failed else times[t]) for t in tags}


FULL_SWEEP_ROWS = 2_000_000


def make_sweep(workdir: Path, rows: int) -> Path:
    """The LLM sweep of ``../shared/tools/mk_llm_sweep.py`` (2,000,000 rows), made once into
    ``workdir``; fewer ``rows``: every k-th row of it, so that the thinned sweep keeps all
    556 workloads, the ragged M of its later repeats (M + 1, M + 2, ...) included, with
    fewer configurations each. (Its first rows alone would be the 56 aligned shapes only:
    the 2a4cd2d slowdown, 10x on the full sweep, is not visible on its first 300,000 rows.)"""
    full = workdir / f"sweep_{FULL_SWEEP_ROWS}.parquet"
    tool = data_root().parent / SWEEP_TOOL_REL
    if not full.exists():
        if not tool.exists():
            raise InputError(f"{tool}: the sweep generator is missing")
        part = workdir / f"sweep_{FULL_SWEEP_ROWS}.{os.getpid()}.tmp.parquet"
        subprocess.run([PY, str(tool), str(part), str(FULL_SWEEP_ROWS)], check=True, capture_output=True)
        part.rename(full)
    if rows >= FULL_SWEEP_ROWS:
        return full
    every = -(-FULL_SWEEP_ROWS // max(rows, 1))
    thin = workdir / f"sweep_every{every}.parquet"
    if not thin.exists():
        part = workdir / f"sweep_every{every}.{os.getpid()}.tmp.parquet"
        pl.read_parquet(full).gather_every(every).write_parquet(part)
        part.rename(thin)
    return thin


def speed_phase(versions: dict[str, Path], args, tmp: Path, workdir: Path, log) -> list[dict]:
    sweep = make_sweep(workdir, args.rows)
    rows = pl.scan_parquet(sweep).select(pl.len()).collect().item()
    reps, warm = args.repeats, 1
    figures: list[dict] = []

    def cli(tag: str, *extra: str) -> list[str]:
        return [PY, "-c", CLI_MAIN, "evaluate", str(sweep), "--hw", "h100",
                "-o", str(tmp / f"sweep_out_{tag}.parquet"), "-q", *extra]

    def record(name: str, res: dict, what: str, unit: str = "s", higher_better: bool = False,
               retime=None) -> dict:
        f = {"name": name, "what": what, "unit": unit, "higher_better": higher_better}
        set_runs(f, res["ref"], res["new"])
        if retime is not None:  # re-times the figure where it reads worse (confirm_figures)
            f["_retime"] = retime
        figures.append(f)
        return f

    def again(make_cmd, name: str):
        # the same whole-process timing, more rounds (the numba cache is warm: no warm-up)
        return lambda n: alternate(versions, make_cmd, n, 0, log, f"{name} (re-timed)")

    log(f"speed: sweep {sweep} ({rows:,} rows), {reps} timed repeats after 1 warm-up, alternating")
    full_cmd = cli
    record(f"full model, evaluate {rows:,}-row sweep",
           alternate(versions, full_cmd, reps, warm, log, "evaluate"),
           "whole-process seconds of tsbatch evaluate SWEEP --hw h100 -o OUT.parquet",
           retime=again(full_cmd, "evaluate"))
    top_cmd = lambda t: cli(t, "--top", "5%")  # noqa: E731
    record(f"top-5 %, evaluate --top 5% of the same sweep",
           alternate(versions, top_cmd, reps, warm, log, "top 5%"),
           "whole-process seconds of tsbatch evaluate SWEEP --hw h100 --top 5% -o OUT.parquet",
           retime=again(top_cmd, "top 5%"))

    from throughput import build_candidates  # noqa: E402  (bench/)

    small = tmp / "start_1000.parquet"
    build_candidates(1000).write_parquet(small)
    start_cmd = lambda t: [PY, "-c", CLI_MAIN, "evaluate", str(small), "--hw", "h100",  # noqa: E731
                           "-o", str(tmp / f"start_out_{t}.parquet"), "-q"]
    record("start, new process evaluating 1,000 rows, kernels cached",
           alternate(versions, start_cmd, max(reps, 3), warm, log, "start"),
           "whole-process seconds, numba cache warm", retime=again(start_cmd, "start"))
    if args.cold:
        def cold_env(tag: str, i: int) -> dict:
            d = tmp / f"numba_cold_{tag}_{i}"
            d.mkdir(exist_ok=True)
            return {"NUMBA_CACHE_DIR": str(d)}
        record("cold start, empty numba cache, 1,000 rows",
               alternate(versions, start_cmd, 1, 0, log, "cold start", extra_env=cold_env),
               "whole-process seconds, every kernel compiled")

    # prune latency and attention rows/s: warm Python API timings, one process per round
    att = tmp / "attention_rows.parquet"
    spec = {"hw": "h100", "attention_hw": "a100", "prune_reps": 20,
            "attention_reps": 2 if args.quick else 3}
    try:
        from tsbatch.measured.accuracy import ATTENTION

        d = load_measured(sorted((data_root() / "attention").glob("*.parquet")), families=("attention",),
                          sample_problems=args.attention_problems)
        if d.frames.get("attention"):
            pl.concat(d.frames["attention"]).select(ATTENTION.input_cols).write_parquet(att)
            spec["attention_input"] = str(att)
    except InputError as exc:
        log(f"  attention rows: {exc}")
    def api_rounds(n: int, label: str) -> dict[str, list[dict]]:
        # ``n`` rounds of the worker's API timings, one process per version per round
        api: dict[str, list[dict]] = {t: [] for t in versions}
        for i in range(n):
            for tag in (list(versions) if i % 2 == 0 else list(versions)[::-1]):
                sp, rp = tmp / f"api_{tag}.json", tmp / f"api_res_{tag}.json"
                rp.unlink(missing_ok=True)
                sp.write_text(json.dumps(spec))
                r = subprocess.run([PY, str(BENCH / "regress_worker.py"), "time-api", str(sp), str(rp)],
                                   cwd=versions[tag], env=version_env(versions[tag]), capture_output=True,
                                   text=True)
                api[tag].append(json.loads(rp.read_text()) if rp.exists() else
                                {"error": r.stderr.strip()[-500:]})
            log(f"  prune/attention {label}round {i + 1}/{n}")
        return api

    def api_values(api: dict, key: str, scale: float = 1.0) -> dict:
        out = {}
        for tag in versions:
            vals = [a[key]["value"] * scale for a in api[tag] if a.get(key, {}).get("status") == "ok"]
            errs = [a.get(key, {}).get("error") or a.get("error") for a in api[tag]]
            out[tag] = vals or next((e for e in errs if e), "not measured")
        return out

    api_again: dict[int, dict] = {}  # one re-timing serves both API figures

    def api_retime(key: str, scale: float = 1.0):
        def retime(n: int) -> dict:
            if n not in api_again:
                api_again[n] = api_rounds(n, "(re-timed) ")
            return api_values(api_again[n], key, scale)
        return retime

    api = api_rounds(max(reps, 2), "")  # cheap, and noisy on a shared machine
    record("prune latency, 4 workloads x 1,000 configs, sum of medians", api_values(api, "prune_s", 1e3),
           "bench/prune_latency.py's workloads, warm prune() calls", unit="ms",
           retime=api_retime("prune_s", 1e3))
    record("attention, FlexAttention rows through evaluate", api_values(api, "attention_rows_per_s"),
           "warm evaluate(family='attention') on the A100 FlexAttention file (aggregated rows)",
           unit="rows/s", higher_better=True, retime=api_retime("attention_rows_per_s"))
    confirm_figures(figures, args.confirm, args.tol, log)
    if not args.skip_families:
        family_phase(versions, args, tmp, log, record)
    return figures


def _median_or_none(runs):
    return statistics.median(runs) if isinstance(runs, list) and runs else None


def set_runs(f: dict, ref, new) -> dict:
    """``f``'s runs (a list of values, or the text of why there are none) and the figures
    made from them: each side's median, ``ratio`` (reference time / working time, or
    working / reference rows/s where ``f["higher_better"]``) and ``ratio_best`` (of each
    side's best run)."""
    hb = f.get("higher_better", False)
    r_med, n_med = _median_or_none(ref), _median_or_none(new)
    ratio = best = None
    if r_med and n_med:
        ratio = n_med / r_med if hb else r_med / n_med
        best = max(new) / max(ref) if hb else min(ref) / min(new)
    f.update(ref=r_med, new=n_med, ref_runs=ref, new_runs=new, ratio=ratio, ratio_best=best)
    return f


def _pooled(first, more):
    """Runs of a figure and its re-timing together (a side that failed keeps its reason)."""
    if isinstance(first, list) and isinstance(more, list):
        return first + more
    return more if isinstance(more, list) else first


def confirm_figures(figures: list[dict], rounds: int, tol, log) -> None:
    """Re-time every figure that reads worse than the tolerance, ``rounds`` more rounds
    alternated as the first were, and judge it on all its runs together (the median of
    the first and the new ones). A speed figure of a shared 2-core machine swings with
    what else runs: identical code read 0.72-0.95 at a first measurement and 0.96-1.48 at
    the next (docs/regress.md), so one reading worse is a reason to look again, not a
    verdict. The figure keeps ``confirm``: the first ratio, the re-timing's own ratio and
    the rounds added; its ``note`` says so. ``rounds`` 0: nothing re-timed."""
    for f in figures:
        retime = f.pop("_retime", None)
        if rounds <= 0 or retime is None or judge_speed(f["ratio"], tol) != "worse":
            continue
        first = f["ratio"]
        log(f"  re-timing {f['name']} (ratio {first:.2f}): {rounds} more round(s)")
        more = retime(rounds)
        again = set_runs({"higher_better": f.get("higher_better", False)}, more["ref"], more["new"])
        set_runs(f, _pooled(f["ref_runs"], more["ref"]), _pooled(f["new_runs"], more["new"]))
        f["confirm"] = {"first": first, "again": again["ratio"], "rounds": rounds}
        _confirm_note(f)


def _confirm_note(f: dict) -> None:
    c = f["confirm"]
    text = (f"first {c['first']:.2f}, re-timed {'n/a' if c['again'] is None else format(c['again'], '.2f')} "
            f"over {c['rounds']} more round(s); judged on all runs")
    f["note"] = f"{f['note']}; {text}" if f.get("note") else text


def family_phase(versions: dict[str, Path], args, tmp: Path, log, record) -> None:
    """Per family rows/s of warm ``evaluate`` on bench/family_speed.py's tables (built once,
    by the working tree), each a speed figure with the working tree's family / GEMM rows/s
    (``over_gemm``) beside. One long-lived worker per version (``regress_worker.py
    serve-families``); in each round every family is timed by both, one right after the
    other, the versions' order flipping family by family and round by round and the
    families' order reversed every other round: a version's time of a family is taken
    next to the other's, not minutes apart, which on a shared machine swung the ratios
    of identical code from 0.7 to 1.4."""
    from family_speed import builtin_sweeps, family_tables, gpu_tables  # noqa: E402

    t0 = time.perf_counter()
    sweeps = builtin_sweeps()
    built = family_tables(args.family_rows, sweeps=sweeps)
    paths = {}
    for fam, (_, table) in built.items():
        paths[fam] = str(tmp / f"family_{fam}.parquet")
        table.write_parquet(paths[fam])
    fams = list(built)
    hws = list(args.family_hw)
    # the fused families on each GPU's own system (family_speed.gpu_tables): per GPU, the
    # tables that differ from the shared ones
    per_gpu: dict[str, dict[str, str]] = {}
    for hw in hws:
        own, systems = gpu_tables(fams, hw, args.family_rows, sweeps)
        per_gpu[hw] = {}
        for fam, table in own.items():
            per_gpu[hw][fam] = str(tmp / f"family_{fam}_{hw}.parquet")
            table.write_parquet(per_gpu[hw][fam])
        if systems:
            log(f"families on {hw}: fused families on " + ", ".join(f"{f} {s}" for f, s in systems.items()))
    spec = {"hw": hws, "tables": paths, "gpu_tables": per_gpu, "warmup_rows": 2000}
    rounds = max(args.repeats, 3)  # a median of 3: identical code read 0.75-1.46 over 2 rounds
    log(f"families: {len(fams)} tables of {args.family_rows:,} rows in {time.perf_counter() - t0:.1f} s; "
        f"{rounds} round(s) on {', '.join(hws)}, the versions alternating family by family")
    runs, failed = _family_rounds(versions, spec, {hw: fams for hw in hws}, rounds, tmp, log)

    def rates(tag: str, key: tuple, got: dict | None = None, why: dict | None = None):
        # rows/s of each ok run (of ``got``, the re-timing's runs, where given), else why none
        got, why = (runs, failed) if got is None else (got, why)
        vals = [r["rows"] / r["seconds"] for r in got[tag][key] if r.get("status") == "ok"]
        if vals:
            return vals
        if tag in why:
            return why[tag]
        return next((r.get("error") for r in got[tag][key] if r.get("error")), "not measured")

    def ratio(key: tuple, got: dict | None = None, why: dict | None = None):
        return set_runs({"higher_better": True}, rates("ref", key, got, why), rates("new", key, got, why))["ratio"]

    # a family that reads worse is timed again by both versions (confirm_figures' rule),
    # in new workers warmed up on those families only, and judged on all its runs
    first = {(hw, fam): ratio((hw, fam)) for hw in hws for fam in fams}
    again: dict = {}
    flagged = {hw: [f for f in fams if judge_speed(first[hw, f], args.tol) == "worse"] for hw in hws}
    flagged = {hw: fl for hw, fl in flagged.items() if fl}
    if args.confirm > 0 and flagged:
        names = sorted({f for fl in flagged.values() for f in fl})
        log(f"  re-timing families that read worse ({'; '.join(f'{hw}: ' + ', '.join(fl) for hw, fl in flagged.items())}): "
            f"{args.confirm} more round(s)")
        sub = {"hw": list(flagged), "tables": {f: paths[f] for f in names},
               "gpu_tables": {hw: {f: p for f, p in per_gpu.get(hw, {}).items() if f in names} for hw in flagged},
               "warmup_rows": 2000}
        more, more_failed = _family_rounds(versions, sub, flagged, args.confirm, tmp, log, "re-timed ")
        for hw, fl in flagged.items():
            for fam in fl:
                again[hw, fam] = ratio((hw, fam), more, more_failed)
                for t in versions:
                    runs[t][hw, fam] += more[t][hw, fam]

    for hw in hws:
        gemm_new = rates("new", (hw, "gemm"))
        g = statistics.median(gemm_new) if isinstance(gemm_new, list) else None
        for fam in fams:
            f = family_figure(record, built[fam], fam, hw, {t: rates(t, (hw, fam)) for t in versions},
                              {t: runs[t][hw, fam] for t in versions}, g)
            if (hw, fam) in again:
                f["confirm"] = {"first": first[hw, fam], "again": again[hw, fam], "rounds": args.confirm}
                _confirm_note(f)


def _family_rounds(versions: dict[str, Path], spec: dict, work: dict[str, list[str]], rounds: int,
                   tmp: Path, log, label: str = "") -> tuple[dict, dict]:
    """``rounds`` rounds of the families ``work`` names per GPU, timed by one long-lived
    worker per version (``regress_worker.py serve-families`` on ``spec``): in each round
    every family is timed by both, one right after the other, the versions' order flipping
    family by family and round by round and the families' order reversed every other
    round. Returns each version's runs per (GPU, family) (the worker's JSON lines) and the
    versions whose worker failed, with why."""
    from family_speed import round_order  # noqa: E402  (bench/)

    spec_path = tmp / f"families{'_' + label.strip() if label else ''}.json"
    spec_path.write_text(json.dumps(spec))
    procs: dict[str, subprocess.Popen] = {}
    errs: dict[str, Path] = {}
    warm: dict[str, dict] = {}
    runs: dict[str, dict[tuple, list]] = {t: {(h, f): [] for h, fl in work.items() for f in fl}
                                          for t in versions}
    failed: dict[str, str] = {}

    def worker_error(tag: str) -> str:
        text = errs[tag].read_text().strip() if errs[tag].exists() else ""
        return text[-300:] or "worker failed"

    try:
        for tag in versions:  # one after the other: their warm-ups compete for no CPU
            errs[tag] = tmp / f"families_{tag}.err"
            with open(errs[tag], "w") as ef:
                procs[tag] = subprocess.Popen(
                    [PY, str(BENCH / "regress_worker.py"), "serve-families", str(spec_path), "-"],
                    cwd=versions[tag], env=version_env(versions[tag]), stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE, stderr=ef, text=True, bufsize=1)
            line = procs[tag].stdout.readline()
            if not line:
                failed[tag] = worker_error(tag)
                log(f"  families [{tag}] failed: {failed[tag]}")
                continue
            warm[tag] = json.loads(line)["warm"]
        for i in range(rounds):
            for hw, fams in work.items():
                for j, fam in enumerate(round_order(fams, i)):
                    tags = list(versions) if (i + j) % 2 == 0 else list(versions)[::-1]
                    for tag in tags:
                        if tag in failed:
                            continue
                        if warm[tag].get(fam, {}).get("status") != "ok":
                            runs[tag][hw, fam].append(warm[tag].get(fam, {"status": "error",
                                                                          "error": "not run"}))
                            continue
                        procs[tag].stdin.write(json.dumps({"family": fam, "hw": hw}) + "\n")
                        procs[tag].stdin.flush()
                        line = procs[tag].stdout.readline()
                        if not line:
                            failed[tag] = worker_error(tag)
                            log(f"  families [{tag}] failed: {failed[tag]}")
                            continue
                        runs[tag][hw, fam].append(json.loads(line))
            log(f"  families {label}round {i + 1}/{rounds}: " + ", ".join(
                f"{t} {sum(r[-1].get('seconds', 0.0) for r in runs[t].values() if r):.1f} s" for t in versions))
    finally:
        for p in procs.values():
            if p.stdin:
                p.stdin.close()
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    return runs, failed


def family_figure(record, built, fam: str, hw: str, rates: dict, runs: dict, gemm_rate) -> dict:
    """One family's speed figure on one GPU: rows/s of both versions, its CPU ratio and
    the working tree's family / GEMM rows/s on that GPU (``over_gemm``) in its note."""
    sweep, table = built
    f = record(f"family {fam} ({sweep}) on {hw}, evaluate rows/s", rates,
               f"warm evaluate(family={fam!r}) on {hw} of bench/family_speed.py's "
               f"{table.height:,} distinct rows from sweeps/{sweep}.toml",
               unit="rows/s", higher_better=True)
    f["family"] = fam
    f["hw"] = hw
    f["over_gemm"] = f["new"] / gemm_rate if (gemm_rate and f["new"]) else None
    ok = [r for r in runs.get("new", []) if r.get("status") == "ok" and r.get("rows")]
    f["feasible_share"] = (ok[-1]["feasible"] / ok[-1]["rows"]
                           if ok and ok[-1].get("feasible") is not None else None)
    cpu = {t: [r["cpu_seconds"] for r in runs[t] if r.get("status") == "ok" and "cpu_seconds" in r]
           for t in runs}
    f["ratio_cpu"] = (statistics.median(cpu["ref"]) / statistics.median(cpu["new"])
                      if cpu["ref"] and cpu["new"] and statistics.median(cpu["new"]) > 0 else None)
    notes = []
    if f["ratio_cpu"] is not None:
        notes.append(f"CPU {f['ratio_cpu']:.2f}")
    if fam != "gemm" and f["over_gemm"] is not None:
        notes.append(f"working {fam}/GEMM {f['over_gemm']:.2f}" + (" (< 1)" if f["over_gemm"] < 1 else ""))
    if notes:
        f["note"] = "; ".join(notes)
    return f


def family_summary(speed: list[dict]) -> str | None:
    """The issue's target as one line: the working tree's families slower than GEMM per
    row, on each GPU the families were timed on (a figure without ``hw``: one group)."""
    fam = [f for f in speed if f.get("family") and f["family"] != "gemm"]
    if not fam:
        return None
    from family_speed import MIN_FEASIBLE  # noqa: E402  (bench/)

    parts = []
    for hw in dict.fromkeys(f.get("hw") for f in fam):
        on = [f for f in fam if f.get("hw") == hw]
        known = [f for f in on if f.get("over_gemm") is not None]
        # a family mostly infeasible on this GPU (Hopper-only kernels on A100) is not compared
        aside = [f for f in known if f.get("feasible_share") is not None
                 and f["feasible_share"] < MIN_FEASIBLE]
        known = [f for f in known if f not in aside]
        slow = sorted((f for f in known if f["over_gemm"] < 1), key=lambda f: f["over_gemm"])
        text = (f"{hw} " if hw else "") + f"{len(slow)} of {len(known)} below 1"
        if slow:
            text += ": " + ", ".join(f"{f['family']} {f['over_gemm']:.2f}" for f in slow)
        if aside:
            text += ("; not compared (mostly infeasible here): "
                     + ", ".join(f"{f['family']} {100 * f['feasible_share']:.0f} % feasible" for f in aside))
        if len(known) + len(aside) < len(on):
            text += f"; {len(on) - len(known) - len(aside)} not measured"
        parts.append(text)
    return ("families, working tree rows/s over its GEMM's on the same GPU (issue 35: no family "
            "slower than GEMM per row): " + "; ".join(parts))


# ----------------------------------------------------------------------
# report
# ----------------------------------------------------------------------
def _fmt_s(v) -> str:
    if v is None:
        return "n/a"
    return f"{v:.3g}" if v < 1e-3 else f"{v:.2f}" if v < 100 else f"{v:.0f}"


def format_speed(figures: list[dict], tol: Tolerance) -> str:
    lines = ["speed: medians of the timed runs (this run, same machine); ratio = ref time / working time "
             "(rows/s: working / ref); above 1: the working tree is faster; judged on the medians, "
             "the ratio of each side's best run beside"]
    for f in figures:
        v = judge_speed(f["ratio"], tol)
        mark = {"worse": "  !!", "better": "  +"}.get(v, "")
        u = f["unit"]
        fmt = (lambda x: f"{x:,.0f} {u}") if u == "rows/s" else (lambda x: f"{_fmt_s(x)} {u}")
        vals = ", ".join(f"{lab} {'n/a' if f[k] is None else fmt(f[k])}"
                         for lab, k in (("ref", "ref"), ("working", "new")))
        note = ""
        for side in ("ref", "new"):
            if isinstance(f[f"{side}_runs"], str):
                note += f"  [{side}: {f[f'{side}_runs'][:120]}]"
        ratio = "n/a" if f["ratio"] is None else f"{f['ratio']:.2f}"
        if f.get("ratio_best") is not None and len(f["ref_runs"]) > 1:
            ratio += f" (best runs: {f['ratio_best']:.2f})"
        if f.get("note"):
            note = f"; {f['note']}{note}"
        lines.append(f"  {f['name']}: {vals}; ratio {ratio}{mark}{note}")
    fl = family_summary(figures)
    if fl:
        lines.append(fl)
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ref", metavar="REF", help="git ref of the reference (e.g. main, ca279d0)")
    ap.add_argument("--quick", action="store_true",
                    help="300k-row sweep, 2 repeats, 300 problems per measured file, no cold start")
    ap.add_argument("--json", type=Path, metavar="OUT.json", help="write every figure as JSON")
    ap.add_argument("--no-fail", action="store_true", help="exit 0 even when something regressed")
    t0d = Tolerance()
    ap.add_argument("--tol-mape", type=float, default=t0d.mape_pct, help="MAPE points (default %(default)s)")
    ap.add_argument("--tol-bias", type=float, default=t0d.bias,
                    help="|median measured/predicted - 1| (default %(default)s)")
    ap.add_argument("--tol-spearman", type=float, default=t0d.spearman, help="(default %(default)s)")
    ap.add_argument("--tol-top5", type=float, default=t0d.top5_retention_pct,
                    help="top-5 %% retention points (default %(default)s)")
    ap.add_argument("--speed-ratio", type=float, default=t0d.speed_ratio,
                    help="ref time / working time below this is worse (default %(default)s)")
    ap.add_argument("--min-problems", type=int, default=t0d.min_problems,
                    help="slices with fewer problems are shown, not judged (default %(default)s)")
    skip = ap.add_mutually_exclusive_group()
    skip.add_argument("--skip-speed", action="store_true", help="accuracy only")
    skip.add_argument("--skip-accuracy", action="store_true", help="speed only")
    ap.add_argument("--cold", action=argparse.BooleanOptionalAction, default=None,
                    help="time a start with an empty numba cache too (compiles every kernel it uses: "
                         "minutes; default on, off with --quick)")
    ap.add_argument("--rows", type=int,
                    help="sweep rows (default 2,000,000; --quick 300,000: every 7th row of the full sweep)")
    ap.add_argument("--repeats", type=int, help="timed repeats of each speed figure after its warm-up (default 2; --quick 1)")
    ap.add_argument("--family-rows", type=int,
                    help="distinct rows per family of the per-family speed figures "
                         "(bench/family_speed.py; default 100,000; --quick 20,000)")
    ap.add_argument("--family-hw", default="h100,a100", type=lambda v: [x for x in v.split(",") if x],
                    metavar="GPU[,GPU...]",
                    help="GPUs the per-family speed figures are timed on, each family against "
                         "that GPU's GEMM (default h100,a100)")
    ap.add_argument("--confirm", type=int, metavar="N",
                    help="re-time every speed figure that reads worse than --speed-ratio, N more "
                         "alternated rounds, and judge it on all its runs (default 4; --quick 2; "
                         "0: judge the first rounds alone)")
    ap.add_argument("--skip-families", action="store_true",
                    help="no per-family speed figures (about 4 min of a default speed run on 2 busy cores)")
    ap.add_argument("--sample-problems", type=int,
                    help="problems per measured file (default all; --quick 300)")
    ap.add_argument("--files", nargs="+", type=Path, metavar="MEASURED",
                    help="these measured files instead of the default set")
    ap.add_argument("--keep-predictions", type=Path, metavar="DIR",
                    help="write each version's scored rows (scored_ref.parquet, scored_new.parquet)")
    ap.add_argument("--repo", type=Path, default=ROOT,
                    help="git repository REF is read from (default: this checkout)")
    ap.add_argument("--workdir", type=Path,
                    default=Path(os.environ.get("TSBATCH_REGRESS_DIR", "/tmp/tsbatch-regress")),
                    help="where the reference tree and the sweep are kept (default %(default)s)")
    args = ap.parse_args(argv)
    args.rows = args.rows or (300_000 if args.quick else 2_000_000)
    args.repeats = args.repeats or (1 if args.quick else 2)
    args.family_rows = args.family_rows or (20_000 if args.quick else 100_000)
    if args.confirm is None:
        args.confirm = 2 if args.quick else 4
    if args.confirm < 0:
        ap.error("--confirm: a number of rounds, 0 or more")
    if not args.skip_speed and not args.skip_families:
        from tsbatch.hw import get_hw  # noqa: PLC0415  (the working tree's GPUs)

        if not args.family_hw:
            ap.error("--family-hw: name at least one GPU")
        for name in args.family_hw:
            try:
                get_hw(name)
            except Exception as exc:  # noqa: BLE001  (the spec loader's own message)
                ap.error(f"--family-hw: {exc}")
    if args.cold is None:
        args.cold = not args.quick
    if args.sample_problems is None and args.quick:
        args.sample_problems = 300
    args.attention_problems = 300 if args.quick else None
    tol = Tolerance(mape_pct=args.tol_mape, bias=args.tol_bias, spearman=args.tol_spearman,
                    top5_retention_pct=args.tol_top5, speed_ratio=args.speed_ratio,
                    min_problems=args.min_problems)
    args.tol = tol
    try:
        return _main(args, tol)
    except InputError as exc:
        print(f"regress.py: {exc}", file=sys.stderr)
        return 2


def _main(args, tol: Tolerance) -> int:
    t_start = time.perf_counter()
    sys.path.insert(0, str(BENCH))
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    sha = resolve_ref(args.ref, args.repo)
    ref_name = f"{args.ref}" if args.ref.startswith(sha[:7]) else f"{args.ref} ({sha[:7]})"
    new_name = f"working tree ({working_label()})"
    args.workdir.mkdir(parents=True, exist_ok=True)
    ref_root = install_ref(sha, args.workdir, args.repo)
    versions = {"ref": ref_root, "new": ROOT}
    now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    header = (f"bench/regress.py {args.ref}{' --quick' if args.quick else ''}: ref = {ref_name} "
              f"[{ref_root}], working = {new_name}; {now}; {platform.node()}, {os.cpu_count()} CPUs, "
              f"load {os.getloadavg()[0]:.1f}")
    print(header)
    report: dict = {"ref": args.ref, "ref_sha": sha, "working": new_name, "date": now, "quick": args.quick,
                    "tolerance": tol.__dict__, "accuracy": [], "cross_validated": [], "speed": []}
    judged_all: list[dict] = []
    group_all = list(GROUP)
    tmp = Path(tempfile.mkdtemp(prefix="regress-", dir=args.workdir))
    try:
        if not args.skip_accuracy:
            files = ([(str(p), p) for p in args.files] if args.files else measured_files(data_root()))
            log(f"accuracy: {len(files)} measured files"
                + (f", {args.sample_problems} problems each" if args.sample_problems else ""))
            inputs = load_inputs(files, args.sample_problems)
            jobs = write_jobs(inputs, tmp)
            res = {tag: predict(root, jobs, tmp, tag, log) for tag, root in versions.items()}
            for tag in versions:
                for j, r in zip(jobs, res[tag]):
                    if r.get("status") != "ok":
                        log(f"  {tag}: {j['file']} on {j['hw']}: n/a ({r.get('status')}: {r.get('error')})")
            scored = {tag: scored_frame(inputs, jobs, res[tag]) for tag in versions}
            if args.keep_predictions:
                args.keep_predictions.mkdir(parents=True, exist_ok=True)
                for tag, sc in scored.items():
                    if sc.height:
                        sc.write_parquet(args.keep_predictions / f"scored_{tag}.parquet")
            figs = {tag: (accuracy_figures(s, GROUP) if s.height else None) for tag, s in scored.items()}
            if figs["new"] is None:
                raise InputError("the working tree predicted none of the measured files")
            cmp = compare_figures(figs["ref"], figs["new"], GROUP)
            print("\naccuracy per measured file x GPU x dtype x backend; slices: all, time bucket "
                  "(problem's best measured time), operand layout; '!!' worse beyond tolerance, "
                  "'+' better, '~' too few problems to judge")
            print(format_comparison(cmp, GROUP, tol, "ref", "working"))
            judged = judged_rows(cmp, GROUP, tol)
            judged_all += judged
            report["accuracy"] = judged
            report["prediction_jobs"] = {tag: [{k: r.get(k) for k in ("family", "hw", "status", "error", "seconds")}
                                               | {"file": j["file"]} for j, r in zip(jobs, res[tag])]
                                         for tag in versions}
            held = held_out_problems(inputs)
            if held.height:
                cv = {tag: cv_figures(s, held) if s.height else None for tag, s in scored.items()}
                if cv["new"] is not None and cv["new"].height:
                    ccmp = compare_figures(cv["ref"] if cv["ref"] is not None and cv["ref"].height else None,
                                           cv["new"], CV_GROUP)
                    print("\ncross-validated (bench/cross_validate.py's held-out half, seed 0, "
                          "shipped constants of each version)")
                    print(format_comparison(ccmp, CV_GROUP, tol, "ref", "working"))
                    cj = [dict(j, slice_kind="cv") for j in judged_rows(ccmp, CV_GROUP, tol)]
                    judged_all += cj
                    report["cross_validated"] = cj
        speed: list[dict] = []
        if not args.skip_speed:
            speed = speed_phase(versions, args, tmp, args.workdir, log)
            for f in speed:
                f["verdict"] = judge_speed(f["ratio"], tol)
            print()
            print(format_speed(speed, tol))
            report["speed"] = speed
            if any(f.get("family") for f in speed):
                report["family_speed"] = {
                    "rows": args.family_rows, "hw": args.family_hw,
                    "over_gemm": {hw: {f["family"]: f.get("over_gemm") for f in speed
                                       if f.get("family") and f.get("hw") == hw} for hw in args.family_hw},
                    "ratio": {hw: {f["family"]: f["ratio"] for f in speed
                                   if f.get("family") and f.get("hw") == hw} for hw in args.family_hw}}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    wall = time.perf_counter() - t_start
    lines = summary_lines(judged_all, speed, group_all, ref_name, new_name, tol)
    fl = family_summary(speed)
    if fl:
        lines.insert(len(lines) - 1, fl)  # before the verdict
    lines.append(f"(bench/regress.py {args.ref}{' --quick' if args.quick else ''}, {wall / 60:.1f} min wall)")
    print("\n---- summary ----")
    print("\n".join(lines))
    report["summary"] = lines
    report["wall_s"] = wall
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1, default=str, allow_nan=False))
    regressed = any(j["verdict"] == "worse" for j in judged_all) or any(
        f["verdict"] == "worse" for f in speed)
    return 1 if regressed and not args.no_fail else 0


if __name__ == "__main__":
    sys.exit(main())
