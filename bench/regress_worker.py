"""Worker of bench/regress.py, run in a subprocess with one model version on PYTHONPATH.

    python bench/regress_worker.py predict JOBS.json RESULT.json
    python bench/regress_worker.py time-api SPEC.json RESULT.json
    python bench/regress_worker.py serve-families SPEC.json -

It imports whatever ``tsbatch`` the ``PYTHONPATH`` names (the working tree or
a reference installed beside it), so it uses only APIs every version since
ca279d0 has, and reports what a version lacks instead of failing:

``predict``: JOBS.json is a list of ``{"family", "hw", "input", "output"}``;
each input Parquet holds a family's input columns (prepared by the working
tree's ``tsbatch.measured.accuracy.load_measured``). The version's own predictor for
the family (``tsbatch.measured.accuracy.PREDICTORS`` or, before the 2026-12-06 regrouping, ``tsbatch.accuracy.PREDICTORS``, what its ``tsbatch accuracy``
calls) writes ``latency_us`` and ``feasible`` to ``output``. RESULT.json:
one ``{"status": "ok" | "unsupported" | "error", "error", "seconds"}`` per job.

``time-api``: warm timings of the Python API: ``prune`` (bench/prune_latency.py's
workloads and 1,000 configurations: median of ``prune_reps`` warm calls per
workload, summed over the workloads) and, when ``attention_input`` is given,
``evaluate(family="attention")`` rows/s (best of ``attention_reps`` warm calls).

``serve-families``: a long-lived timer of warm ``evaluate`` per family (SPEC:
``hw``, a GPU or a list of them, ``tables`` {family: Parquet path}, optionally
``gpu_tables`` {GPU: {family: Parquet path}} replacing a family's table in that GPU's
timings (the fused families on the GPU's own system), ``warmup_rows``; the tables made
by the working tree's bench/family_speed.py). It reads the tables,
warms every family up untimed on a slice on each GPU, writes one JSON line
``{"ready": true, "warm": {family: status}}`` to stdout (a family's status the
first GPU's error where one had one), then for each line ``{"family": F}`` or
``{"family": F, "hw": H}`` (default: the first GPU) on stdin times F's whole table
(bench/family_speed.py's ``time_round``: the best of up to 10 passes adding up to
1 s) and writes one JSON line ``{"status", "seconds", "passes", "rows",
"feasible"}`` or ``{"status": "error", "error"}``; it ends at the end of stdin.
The guard keeps one per version and alternates them family by family, so the two
versions' times of a family are taken next to each other. A family the version
lacks is reported with its error in ``warm``, never timed. (RESULT.json: unused,
pass ``-``; anything the model prints goes to stderr.)
"""

from __future__ import annotations

import json
import statistics
import sys
import time
import traceback
from pathlib import Path


def _module(new: str, old: str):
    """A module of either layout: ``new`` (the 2026-12-06 regrouping on) or ``old``."""
    import importlib

    try:
        return importlib.import_module(new)
    except ModuleNotFoundError:
        return importlib.import_module(old)


def _predict(jobs_path: str, result_path: str) -> int:
    import polars as pl

    jobs = json.loads(Path(jobs_path).read_text())
    try:
        PREDICTORS = _module("tsbatch.measured.accuracy", "tsbatch.accuracy").PREDICTORS
    except Exception:  # a version without the accuracy module
        PREDICTORS = {}
    results = []
    for job in jobs:
        fam, hw = job["family"], job["hw"]
        t0 = time.perf_counter()
        if fam not in PREDICTORS:
            results.append({"status": "unsupported", "error": f"no predictor for family '{fam}'",
                            "seconds": 0.0})
            continue
        try:
            frame = pl.read_parquet(job["input"])
            pred = PREDICTORS[fam](frame, hw)
            lat = pred["latency_us"].cast(pl.Float64)
            feas = (pred["feasible"].cast(pl.Boolean) if "feasible" in pred.columns
                    else lat.is_finite())
            if lat.len() != frame.height:
                raise RuntimeError(f"{lat.len()} predictions for {frame.height} rows")
            pl.DataFrame({"latency_us": lat, "feasible": feas.fill_null(False)}).write_parquet(job["output"])
            results.append({"status": "ok", "error": None, "seconds": time.perf_counter() - t0})
        except Exception as exc:  # the version cannot predict these rows: n/a, not a crash
            msg = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
            results.append({"status": "error", "error": msg, "seconds": time.perf_counter() - t0,
                            "trace": traceback.format_exc(limit=3)})
    Path(result_path).write_text(json.dumps(results, indent=1))
    return 0


def _median_s(fn, reps: int) -> float:
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def _time_api(spec_path: str, result_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    out: dict = {}
    hw = spec.get("hw", "h100")
    # prune latency: the workloads and configurations of bench/prune_latency.py
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    try:
        from prune_latency import WORKLOADS, configs
        prune = _module("tsbatch.engine.prune", "tsbatch.prune").prune

        cfgs = configs(1000)
        per = {}
        for wl in WORKLOADS:
            prune(wl, cfgs, hw=hw, top=0.05)  # warm-up: compile or load, caches
            per[f"{wl['m']}x{wl['n']}x{wl['k']} {wl['dtype']}"] = _median_s(
                lambda: prune(wl, cfgs, hw=hw, top=0.05), int(spec.get("prune_reps", 20)))
        out["prune_s"] = {"status": "ok", "value": sum(per.values()), "per_workload": per}
    except Exception as exc:
        out["prune_s"] = {"status": "error", "error": f"{type(exc).__name__}: {exc}"}
    if spec.get("attention_input"):
        try:
            import polars as pl
            evaluate = _module("tsbatch.engine.evaluate", "tsbatch.evaluate").evaluate

            frame = pl.read_parquet(spec["attention_input"])
            ahw = spec.get("attention_hw", hw)
            evaluate(frame, ahw, family="attention")  # warm-up
            best = min(_median_s(lambda: evaluate(frame, ahw, family="attention"), 1)
                       for _ in range(int(spec.get("attention_reps", 3))))
            out["attention_rows_per_s"] = {"status": "ok", "value": frame.height / best,
                                           "rows": frame.height, "seconds": best}
        except Exception as exc:
            out["attention_rows_per_s"] = {"status": "error", "error": f"{type(exc).__name__}: {exc}"}
    Path(result_path).write_text(json.dumps(out, indent=1))
    return 0


def _serve_families(spec_path: str, _unused: str) -> int:
    import os

    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # stdout is the protocol's: whatever else is printed goes to stderr
    sys.stdout = sys.stderr
    import polars as pl

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from family_speed import time_round, warm_up  # no tsbatch import: either version's runs

    spec = json.loads(Path(spec_path).read_text())
    hws = spec.get("hw", "h100")
    hws = [hws] if isinstance(hws, str) else list(hws)
    evaluate = _module("tsbatch.engine.evaluate", "tsbatch.evaluate").evaluate
    shared = {f: pl.read_parquet(p) for f, p in spec["tables"].items()}
    # per GPU, the tables of that GPU's rounds: the shared ones, with a GPU's own where the
    # spec gives one (the fused families on the GPU's system: family_speed.gpu_tables)
    tables = {hw: {**shared, **{f: pl.read_parquet(p) for f, p in
                                spec.get("gpu_tables", {}).get(hw, {}).items()}} for hw in hws}
    warm: dict = {}
    for hw in hws:
        for fam, st in warm_up(evaluate, tables[hw], hw, int(spec.get("warmup_rows", 2000))).items():
            if warm.get(fam, {}).get("status") != "error":
                warm[fam] = st
    out.write(json.dumps({"ready": True, "warm": warm}) + "\n")
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        fam, hw = req["family"], req.get("hw", hws[0])
        if fam not in shared or warm.get(fam, {}).get("status") != "ok":
            res = {"status": "error", "error": warm.get(fam, {}).get("error", f"no table for {fam}")}
        elif hw not in hws:
            res = {"status": "error", "error": f"GPU {hw} not warmed up (spec: {', '.join(hws)})"}
        else:
            res = time_round(evaluate, {fam: tables[hw][fam]}, hw, [fam])[fam]
        out.write(json.dumps(res) + "\n")
    return 0


def main(argv: list[str]) -> int:
    cmds = {"predict": _predict, "time-api": _time_api, "serve-families": _serve_families}
    if len(argv) != 3 or argv[0] not in cmds:
        print(__doc__, file=sys.stderr)
        return 2
    return cmds[argv[0]](argv[1], argv[2])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
