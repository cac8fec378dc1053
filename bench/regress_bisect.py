"""Which commit moved each figure the regression guard marks worse (issue 35).

    python bench/regress_bisect.py GUARD.json REF [REF ...] [--all] [--files F ...]
                                   [--repo DIR] [--workdir DIR] [--json OUT.json]

GUARD.json is a ``bench/regress.py REF --json`` report. Its figures marked
worse (``--all``: every judged accuracy figure of it) are traced through the
REFs, given oldest first (e.g. the first-parent commits between the guard's
reference and the working tree, or a handful of them to bisect): each REF is
installed as ``bench/regress.py`` installs it (``WORKDIR/trees/<sha>``, its
numba kernels cached in the tree), predicts the same measured rows with its
own ``tsbatch accuracy`` predictor, and is scored by the working tree's code,
exactly as the guard scores. A REF of ``.`` is the working tree.

Printed per figure: its value at every REF, then each step between two
consecutive REFs that moved it by at least half its tolerance (``+``: the
figure got worse there, ``-``: better). A step that spans several commits is
bisected by running again with commits between its two ends.

The measured files are those of the guard that hold a traced figure
(``--files`` names them; a file of the guard keeps the guard's label). Figures are cached per commit
(``WORKDIR/bisect/<sha>_<files hash>.parquet``) so a second run with more REFs
predicts only the new ones. Exit status 2 on bad input (an unknown REF, a
missing file).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

import polars as pl

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))

import regress as R  # noqa: E402  (bench/regress.py: install, predict, score)
from tsbatch.errors import InputError  # noqa: E402
from tsbatch.measured.regress_metrics import FIGURES, Tolerance, accuracy_figures, badness_delta  # noqa: E402

KEYS = (*R.GROUP, "slice_kind", "slice")


def steps(values: list[float | None], refs: list[str], figure: str, tol: Tolerance,
          share: float = 0.5) -> list[dict]:
    """The steps between consecutive ``refs`` that moved ``figure`` by at least
    ``share`` of its tolerance: ``{"ref", "before", "after", "worse"}`` (the
    ref the step ends at; ``worse`` in the guard's sense, badness_delta > 0).
    A missing value (None) on either side is not a step."""
    out = []
    step = getattr(tol, figure) * share
    for a, b, ref in zip(values, values[1:], refs[1:]):
        if a is None or b is None:
            continue
        d = badness_delta(figure, a, b)
        if abs(d) >= step:
            out.append({"ref": ref, "before": a, "after": b, "worse": d > 0})
    return out


def _figures_of(ref: str, sha: str, root: Path, inputs: pl.DataFrame, jobs: list[dict],
                cache: Path | None, log) -> pl.DataFrame:
    if cache is not None and cache.exists():
        return pl.read_parquet(cache)
    with tempfile.TemporaryDirectory(prefix="bisect-", dir=cache.parent if cache else None) as tmp:
        res = R.predict(root, jobs, Path(tmp), sha[:12], log)
        scored = R.scored_frame(inputs, jobs, res)
    if scored.height == 0:
        raise InputError(f"{ref}: predicted none of the measured rows")
    figs = accuracy_figures(scored, R.GROUP)
    if cache is not None:
        figs.write_parquet(cache)
    return figs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("guard", type=Path, help="a bench/regress.py --json report")
    ap.add_argument("refs", nargs="+", help="commits, oldest first ('.' = the working tree)")
    ap.add_argument("--all", action="store_true", help="trace every judged figure, not only the worse ones")
    ap.add_argument("--files", type=Path, nargs="+", help="measured files (default: the guard's)")
    ap.add_argument("--repo", type=Path, default=R.ROOT, help="the repository the REFs belong to")
    ap.add_argument("--workdir", type=Path,
                    default=Path(os.environ.get("TSBATCH_REGRESS_DIR", "/tmp/tsbatch-regress")))
    ap.add_argument("--json", type=Path, help="write the traced figures and their steps here")
    args = ap.parse_args(argv)
    try:
        return _main(args)
    except InputError as exc:
        print(f"regress_bisect.py: {exc}", file=sys.stderr)
        return 2


def _main(args) -> int:
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    if not args.guard.is_file():
        raise InputError(f"{args.guard}: no such guard report")
    report = json.loads(args.guard.read_text())
    tol = Tolerance(**{k: v for k, v in report.get("tolerance", {}).items()
                       if k in Tolerance.__dataclass_fields__})
    traced = [j for j in report.get("accuracy", [])
              if j.get("verdict") in (("worse", "better", "same") if args.all else ("worse",))]
    if not traced:
        print("nothing to trace: the guard report marks no figure worse")
        return 0
    shas = [None if r == "." else R.resolve_ref(r, args.repo) for r in args.refs]
    known = {p.resolve(): label for label, p in R.measured_files(R.data_root())}
    if args.files:
        for p in args.files:
            if not p.exists():
                raise InputError(f"{p}: no such measured file")
        # labelled as the guard labels them, so that the traced figures match
        files = [(known.get(p.resolve(), str(p)), p) for p in args.files]
    else:  # the guard's files that hold a traced figure
        wanted = {j["file"] for j in traced}
        files = [(label, p) for p, label in known.items() if label in wanted]
    tag = hashlib.sha256("\n".join(f"{label}={p.resolve()}" for label, p in files).encode()).hexdigest()[:10]
    inputs = R.load_inputs(files, None)
    (args.workdir / "bisect").mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bisect-in-", dir=args.workdir) as tmp:
        jobs = R.write_jobs(inputs, Path(tmp))
        figs = {}
        for ref, sha in zip(args.refs, shas):
            if sha is None:
                figs[ref] = _figures_of(ref, "working", R.ROOT, inputs, jobs, None, log)
            else:
                root = R.install_ref(sha, args.workdir, args.repo)
                figs[ref] = _figures_of(ref, sha, root, inputs, jobs,
                                        args.workdir / "bisect" / f"{sha}_{tag}.parquet", log)
    out = []
    for j in traced:
        f = j["figure"]
        vals = []
        for ref in args.refs:
            fr = figs[ref]
            for k in KEYS:
                fr = fr.filter(pl.col(k) == j[k]) if j.get(k) is not None else fr.filter(pl.col(k).is_null())
            v = fr[f][0] if fr.height else None
            vals.append(None if v is None else float(v))
        moved = steps(vals, list(args.refs), f, tol)
        name = f"{j['file']} {j['gpu']} {j['dtype']} {j['backend']} [{j['slice']}] {FIGURES[f][1]}"
        print(name)
        print("   " + "  ".join(f"{r}={'n/a' if v is None else f'{v:.3f}'}" for r, v in zip(args.refs, vals)))
        print("   moved at: " + ("; ".join(
            f"{s['ref']} {'+' if s['worse'] else '-'} ({s['before']:.3f} -> {s['after']:.3f})"
            for s in moved) or "no step of half a tolerance"))
        out.append({**{k: j.get(k) for k in KEYS}, "figure": f, "values": dict(zip(args.refs, vals)),
                    "steps": moved})
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
