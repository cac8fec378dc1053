"""Fuzz the whole command line (evaluate, sweep, explain, accuracy) in-process.

Generated candidate tables (wrong types, nulls, NaN and infinities, zero and
huge sizes, unicode and empty strings, empty tables, zero rows, duplicate and
extra columns, truncated or garbage files, every input format) and generated
arguments (explain's and sweep's options, sweep files) are run through
``tsbatch.front.cli.main(argv)``. Each case is checked for:

- a crash: an exception other than ``SystemExit``, or an exit status other
  than 0 and 2 (a traceback on stderr counts too);
- a half-written output: on exit 2 the ``-o`` path (or a temporary sibling of
  it) exists;
- a contract break: an output row that is neither feasible with a finite,
  positive ``latency_us`` nor infeasible with a non-empty ``infeasible_reason``
  (evaluate's and sweep's output files, explain's ``--json`` row).

On demand (prints the counts; exit 1 if any is non-zero)::

    python bench/fuzz_cli.py --cases 100000 [--seed 0] [--log /tmp/fuzz.log]

``tests/test_fuzz_cli.py`` runs a few hundred cases of the same strategies.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import polars as pl  # noqa: E402
import pyarrow as pa  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

#: a valid row of every family the fuzz builds tables for (its required columns)
BASE = {
    "gemm": dict(m=4096, n=4096, k=4096, dtype="float16", block_m=128, block_n=128,
                 block_k=64, num_stages=4, num_warps=8),
    "attention": dict(batch=1, heads=32, seq_len=4096, head_dim=128, dtype="float16",
                      block_m=128, block_n=64, num_stages=3, num_warps=8),
    "attention_fa3": dict(batch=1, heads=32, seq_len=4096, head_dim=128, dtype="bfloat16"),
    "flash_decoding": dict(batch=8, heads=32, seq_len_kv=8192, head_dim=128, dtype="float16"),
    "gemm_epilogue": dict(m=4096, n=4096, k=4096, dtype="float16", block_m=128, block_n=128,
                          block_k=64, num_stages=4, num_warps=8),
    "mla_decode": dict(batch=8, heads=128, seq_len_kv=4096, dtype="bfloat16"),
    "moe_grouped_gemm": dict(tokens=4096, experts=8, top_k=2, hidden=4096, ffn=14336,
                             dtype="bfloat16", block_m=64, block_n=128, block_k=64,
                             num_stages=3, num_warps=4),
    "rowwise": dict(op="rmsnorm", rows=4096, hidden=4096, dtype="bfloat16"),
    "collective": dict(system="dgx_h100", collective="all_reduce", num_gpus=8,
                       gpus_per_node=8, bytes=1 << 24, algorithm="ring", protocol="simple",
                       channels=16),
    "ag_gemm": dict(system="dgx_h100", num_gpus=8, gpus_per_node=8, algorithm="ring",
                    protocol="simple", m=8192, n=4096, k=4096, dtype="bfloat16", block_m=128,
                    block_n=128, block_k=64, num_stages=4, num_warps=8),
}
FAMILIES = tuple(BASE)
GPUS = ("h100", "a100", "h200", "b200", "nope-gpu")
SWEEPS = ("tiny",)

HUGE = (2 ** 31 - 1, 2 ** 31, 2 ** 32, 2 ** 40, 2 ** 53 + 1, 2 ** 62, 2 ** 63 - 1)
SIZES = st.one_of(
    st.sampled_from((0, 1, 2, 3, 7, 8, 15, 16, 24, 31, 32, 48, 64, 100, 128, 256, 4096, -1,
                     -(2 ** 63))),
    st.sampled_from(HUGE),
    st.integers(1, 1 << 16),
    st.integers(-(2 ** 63), 2 ** 63 - 1),
)
FLOATS = st.one_of(st.sampled_from((math.nan, math.inf, -math.inf, 0.0, -0.0, 1.5, 4096.0,
                                    1e308, -1e-300)),
                   st.floats(allow_nan=True, allow_infinity=True))
TEXTS = st.one_of(st.sampled_from(("", " ", "float16", "bfloat16", "float32", "float8",
                                   "FLOAT16", "float16 ", "triton", "cublas", "ñ中🙂", "\x00",
                                   "persistent", "zorder", "nan", "1")),
                  st.text(max_size=8))
COLUMN_NAMES = st.one_of(st.sampled_from(("latency_us", "feasible", "rank", "", "ñ",
                                          "infeasible_reason", "label", "gpu", "backend",
                                          "split_k", "group_m", "raster", "tf32")),
                         st.text(min_size=1, max_size=6))
FORMATS = ("parquet", "parquet", "parquet", "arrow", "feather", "csv", "ndjson", "jsonl",
           "truncated", "garbage", "empty", "unknown_ext")


@st.composite
def column_values(draw, kind: str, n: int):
    """``(values, arrow type)`` of one column of ``n`` rows of the given kind."""
    if kind == "int":
        vals = [draw(SIZES) for _ in range(n)]
        return vals, pa.int64()
    if kind == "uint":
        return [draw(st.integers(0, 2 ** 64 - 1)) for _ in range(n)], pa.uint64()
    if kind == "float":
        return [draw(FLOATS) for _ in range(n)], pa.float64()
    if kind == "str":
        return [draw(TEXTS) for _ in range(n)], pa.string()
    if kind == "bool":
        return [draw(st.booleans()) for _ in range(n)], pa.bool_()
    if kind == "null":
        return [None] * n, pa.null()
    if kind == "list":
        return [[draw(st.integers(-5, 5))] for _ in range(n)], pa.list_(pa.int64())
    raise ValueError(kind)


def _arrow_value(v, typ):
    return v


@st.composite
def tables(draw, family: str):
    """A candidate table as a pyarrow Table (may have duplicate column names)."""
    base = dict(BASE[family])
    n = draw(st.sampled_from((0, 1, 1, 2, 3, 5)))
    broken = draw(st.integers(0, 2)) == 0  # else well-typed, only the values vary
    cols: list[tuple[str, list, pa.DataType]] = []
    for name, v in base.items():
        if broken and draw(st.integers(0, 15)) == 0:
            continue  # a required column missing
        if isinstance(v, bool):
            kind = "bool"
        elif isinstance(v, int):
            kind = "int"
        else:
            kind = "str"
        mutate = draw(st.integers(0 if broken else 1, 9))
        if mutate == 0:  # wrong type
            kind2 = draw(st.sampled_from(("int", "uint", "float", "str", "bool", "null", "list")))
            vals, typ = draw(column_values(kind2, n))
        elif mutate <= 3 and kind == "int":  # extreme sizes in some rows
            vals = [draw(SIZES) if draw(st.booleans()) else v for _ in range(n)]
            typ = pa.int64()
        elif mutate == 4 and kind == "str" and broken:
            vals = [draw(TEXTS) if draw(st.booleans()) else v for _ in range(n)]
            typ = pa.string()
        else:
            vals = [v] * n
            typ = {"bool": pa.bool_(), "int": pa.int64(), "str": pa.string()}[kind]
        if broken and typ != pa.null() and n and draw(st.integers(0, 4)) == 0:  # nulls
            vals = [None if draw(st.booleans()) else x for x in vals]
        cols.append((name, vals, typ))
    # optional columns of the family, sometimes
    from tsbatch.engine.evaluate import FAMILIES as FAMS

    fam = FAMS[family]
    for c in fam.columns:
        if c.required or draw(st.integers(0, 3)) != 0:
            continue
        kind = {"int": "int", "float": "float", "str": "str", "bool": "bool"}[c.kind]
        if not broken and kind == "int":
            vals, typ = [draw(st.one_of(st.integers(1, 64), SIZES)) for _ in range(n)], pa.int64()
        elif not broken and kind == "float":
            vals, typ = [draw(st.floats(0.0, 4.0)) for _ in range(n)], pa.float64()
        elif kind == "str" and c.choices and (not broken or draw(st.booleans())):
            vals = [draw(st.sampled_from(c.choices)) for _ in range(n)]
            typ = pa.string()
        else:
            vals, typ = draw(column_values(kind, n))
        cols.append((c.name, vals, typ))
    # extra columns (unknown names, result names), sometimes duplicates
    for _ in range(draw(st.integers(0, 2))):
        kind = draw(st.sampled_from(("int", "float", "str", "bool", "null", "list")))
        vals, typ = draw(column_values(kind, n))
        name = draw(COLUMN_NAMES) if broken else "extra_" + draw(st.text(max_size=4))
        cols.append((name, vals, typ))
    if broken and cols and draw(st.integers(0, 6)) == 0:
        name, vals, typ = cols[draw(st.integers(0, len(cols) - 1))]
        cols.append((name, list(vals), typ))
    if broken and draw(st.integers(0, 15)) == 0:
        cols = []  # no columns at all
    names = [c[0] for c in cols]
    if not broken and len(set(names)) < len(names):
        cols = [c for i, c in enumerate(cols) if c[0] not in names[:i]]
    arrays = [pa.array(vals, type=typ) for _, vals, typ in cols]
    return pa.Table.from_arrays(arrays, names=[c[0] for c in cols]) if cols else pa.table({})


def write_table(table: pa.Table, fmt: str, path: Path, seed: int) -> Path:
    """Write ``table`` as ``fmt``; returns the path used (its extension names the format)."""
    import pyarrow.csv as pcsv
    import pyarrow.feather as feather
    import pyarrow.parquet as pq

    if fmt in ("parquet", "truncated", "unknown_ext"):
        p = path.with_suffix({"parquet": ".parquet", "truncated": ".parquet",
                              "unknown_ext": ".dat"}[fmt])
        pq.write_table(table, p)
        if fmt == "truncated":
            data = p.read_bytes()
            cut = (seed % max(len(data) - 1, 1)) + 1 if len(data) > 1 else 0
            p.write_bytes(data[:cut])
        return p
    if fmt in ("arrow", "feather"):
        p = path.with_suffix("." + fmt)
        feather.write_feather(table, p, compression="uncompressed")
        return p
    if fmt == "csv":
        p = path.with_suffix(".csv")
        try:
            pcsv.write_csv(table, p)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):  # nested columns
            p.write_text(",".join(table.column_names) + "\n")
        return p
    if fmt in ("ndjson", "jsonl"):
        p = path.with_suffix("." + fmt)
        names = table.column_names
        lines = []
        for row in zip(*[table.column(i).to_pylist() for i in range(table.num_columns)]):
            parts = []
            for k, v in zip(names, row):
                if isinstance(v, float) and not math.isfinite(v):
                    v = None if math.isnan(v) else (1e400 if v > 0 else -1e400)
                parts.append(f"{json.dumps(k)}: {json.dumps(v)}")
            lines.append("{" + ", ".join(parts) + "}")
        p.write_text("\n".join(lines) + ("\n" if lines else ""))
        return p
    if fmt == "garbage":
        p = path.with_suffix(".parquet")
        p.write_bytes(np.random.default_rng(seed).bytes(seed % 300))
        return p
    if fmt == "empty":
        p = path.with_suffix(draw_ext(seed))
        p.write_bytes(b"")
        return p
    raise ValueError(fmt)


def draw_ext(seed: int) -> str:
    return (".parquet", ".csv", ".arrow", ".ndjson")[seed % 4]


SWEEP_AXES = {
    "gemm": {"workload": ("m", "n", "k", "dtype"),
             "schedule": ("block_m", "block_n", "block_k", "num_stages", "num_warps")},
    "attention": {"workload": ("batch", "heads", "seq_len", "head_dim", "dtype"),
                  "schedule": ("block_m", "block_n", "num_stages", "num_warps")},
    "rowwise": {"workload": ("op", "rows", "hidden", "dtype"), "schedule": ("threads", "vec")},
}


@st.composite
def sweep_file(draw) -> str:
    """A small sweep TOML (or a broken one)."""
    fam = draw(st.sampled_from(tuple(SWEEP_AXES)))
    base = BASE[fam]
    lines = ["[sweep]", f'name = "fz"', f'family = "{fam}"', "", "[workload]"]

    def axis(name):
        v = base.get(name, 64)
        if isinstance(v, str):
            vals = [json.dumps(v)] + ([json.dumps(draw(TEXTS))] if draw(st.integers(0, 4)) == 0
                                      else [])
        else:
            vals = [str(v)] + [str(draw(SIZES)) for _ in range(draw(st.integers(0, 2)))]
        if draw(st.integers(0, 20)) == 0:
            return f"{name} = []"
        if draw(st.integers(0, 20)) == 0:
            return f"{name} = {vals[0]}"  # not a list
        return f"{name} = [{', '.join(vals)}]"

    for name in SWEEP_AXES[fam]["workload"]:
        if draw(st.integers(0, 25)):
            lines.append(axis(name))
    lines += ["", "[schedule]"]
    for name in SWEEP_AXES[fam]["schedule"]:
        if draw(st.integers(0, 25)):
            lines.append(axis(name))
    if draw(st.booleans()):
        rule = draw(st.sampled_from(("block_m <= 2 * m", "m > 0", "nonsense ((", "",
                                     "block_n >= 16", "1 = 1")))
        lines += ["", "[rules]", f"valid = [{json.dumps(rule)}]"]
    text = "\n".join(lines) + "\n"
    if draw(st.integers(0, 25)) == 0:
        text = text[: draw(st.integers(0, len(text)))]  # truncated TOML
    return text


TOPS = st.sampled_from(("5%", "50%", "100%", "0%", "0", "1", "-1", "abc", "200%", "1e309",
                        "nan", "0.5", "", "%"))
INTS = st.one_of(st.sampled_from((0, 1, 2, -1, 3, 1 << 20, 2 ** 63)), st.integers(-3, 40))


@st.composite
def cases(draw):
    """One CLI case: ``{"cmd", ...}``."""
    cmd = draw(st.sampled_from(("evaluate",) * 6 + ("explain",) * 2 + ("sweep", "accuracy")))
    case: dict = {"cmd": cmd, "hw": draw(st.sampled_from(GPUS[:2] * 12 + GPUS[2:]))}
    if cmd in ("evaluate", "accuracy") or (cmd == "explain" and draw(st.integers(0, 3)) == 0):
        fam = draw(st.sampled_from(FAMILIES))
        case["family"] = fam
        case["table"] = draw(tables(fam))
        case["format"] = draw(st.sampled_from(FORMATS if draw(st.integers(0, 2)) == 0
                                              else FORMATS[:8]))
        case["seed"] = draw(st.integers(0, 10 ** 6))
    if cmd == "evaluate":
        case["family_arg"] = draw(st.sampled_from((None,) * 8 + (case["family"], "gemm",
                                                                 "nope")))
        case["rank"] = draw(st.sampled_from((None, None, "--rank", "top")))
        case["top"] = draw(TOPS)
        case["batch_rows"] = draw(st.sampled_from((None, None, 1, 2, 0)))
        case["out"] = draw(st.sampled_from(("out.parquet",) * 6 + ("out.csv",) * 3
                                           + ("missing_dir/out.parquet", ".")))
        case["quiet"] = draw(st.booleans())
    elif cmd == "explain":
        if "table" not in case:
            fam = draw(st.sampled_from(("gemm",) * 4 + FAMILIES[1:8]))
            case["family"] = fam
            if fam == "gemm" and draw(st.booleans()):
                opts = {}
                for c in ("m", "n", "k", "block_m", "block_n", "block_k", "num_stages",
                          "num_warps", "group_m", "split_k"):
                    if draw(st.integers(0, 12)):
                        v = BASE["gemm"].get(c, 8)
                        opts[c] = draw(SIZES) if draw(st.integers(0, 3)) == 0 else v
                case["opts"] = opts
                case["dtype"] = draw(st.sampled_from(("float16", "float32", "float8", "bfloat16",
                                                      "int8", "")))
                case["raster"] = draw(st.sampled_from(("grouped", "row", "col", "zorder",
                                                       "persistent", "diagonal")))
            else:
                assigns = []
                for k, v in BASE[fam].items():
                    if draw(st.integers(0, 15)) == 0:
                        continue
                    if isinstance(v, int) and draw(st.integers(0, 3)) == 0:
                        v = draw(st.one_of(SIZES, TEXTS, FLOATS))
                    elif isinstance(v, str) and draw(st.integers(0, 5)) == 0:
                        v = draw(TEXTS)
                    assigns.append(f"{k}={v}")
                if draw(st.integers(0, 10)) == 0:
                    assigns.append(draw(st.sampled_from(("nonsense", "=", "x=1", "block-m=64"))))
                case["assign"] = assigns
        else:
            case["row"] = draw(st.sampled_from((0, 0, 1, -1, 99)))
        case["json"] = draw(st.booleans())
    elif cmd == "sweep":
        case["sweep"] = draw(st.one_of(st.sampled_from(SWEEPS + ("nope",)), sweep_file()))
        case["top"] = draw(TOPS)
        case["wave_samples"] = draw(st.sampled_from((None, None, None, 2, 1, 0, -4)))
        case["k_samples"] = draw(st.sampled_from((None, None, None, 1, 0, -1)))
        case["chunk_rows"] = draw(st.sampled_from((None, None, 1, 0, -1, 7)))
        case["out"] = draw(st.sampled_from(("out.parquet", "out.parquet", "out.csv",
                                            "missing_dir/out.parquet")))
    elif cmd == "accuracy":
        # measured tables need a time column; add one sometimes
        t = case["table"]
        if draw(st.integers(0, 2)) and t.num_rows >= 0:
            col = draw(st.sampled_from(("time_us", "latency_us", "runtime_us", "time_ms")))
            vals, typ = draw(column_values(draw(st.sampled_from(("float", "float", "int",
                                                                 "str"))), t.num_rows))
            case["table"] = t.append_column(col, pa.array(vals, type=typ))
        case["limit"] = draw(st.sampled_from((None, None, 1, 0, -1)))
        case["json_out"] = draw(st.booleans())
    return case


# --------------------------------------------------------------------------- running
def _argv(case: dict, d: Path) -> tuple[list[str], Path | None]:
    """The argv of ``case`` (files written under ``d``) and its output path."""
    cmd = case["cmd"]
    hw = ["--hw", case["hw"]]
    src = None
    if "table" in case:
        src = write_table(case["table"], case["format"], d / "cand", case["seed"])
    if cmd == "evaluate":
        out = d / case["out"]
        argv = ["evaluate", str(src), *hw, "-o", str(out)]
        if case["family_arg"]:
            argv += ["--family", case["family_arg"]]
        if case["rank"] == "--rank":
            argv.append("--rank")
        elif case["rank"] == "top":
            argv += ["--top", case["top"]]
        if case["batch_rows"] is not None:
            argv += ["--batch-rows", str(case["batch_rows"])]
        if case["quiet"]:
            argv.append("-q")
        return argv, out
    if cmd == "explain":
        argv = ["explain", *hw]
        if case.get("json"):
            argv.append("--json")
        fam = case["family"]
        if src is not None:
            argv += ["--family", fam, "--candidates", str(src), "--row", str(case["row"])]
        elif "opts" in case:
            for k, v in case["opts"].items():
                argv += [f"--{k.replace('_', '-')}", str(v)]
            argv += ["--dtype", case["dtype"], "--raster", case["raster"]]
        else:
            argv += ["--family", fam, *case["assign"]]
        return argv, None
    if cmd == "sweep":
        sw = case["sweep"]
        if sw not in SWEEPS + ("nope",):
            p = d / "sweep.toml"
            p.write_text(sw)
            sw = str(p)
        out = d / case["out"]
        argv = ["sweep", sw, *hw, "--top", case["top"], "-o", str(out), "-q"]
        for flag, key in (("--wave-samples", "wave_samples"), ("--k-samples", "k_samples"),
                          ("--chunk-rows", "chunk_rows")):
            if case[key] is not None:
                argv += [flag, str(case[key])]
        return argv, out
    if cmd == "accuracy":
        argv = ["accuracy", str(src)]
        if case["hw"] != "nope-gpu" or True:
            argv += hw
        if case["limit"] is not None:
            argv += ["--limit-problems", str(case["limit"])]
        out = None
        if case["json_out"]:
            out = d / "acc.json"
            argv += ["--json", str(out)]
        return argv, out
    raise ValueError(cmd)


def _read_output(out: Path) -> pl.DataFrame:
    if out.suffix == ".csv":
        return pl.read_csv(out, infer_schema_length=None)
    return pl.read_parquet(out)


def contract_breaks(df: pl.DataFrame) -> int:
    """Rows that are neither feasible with a finite positive latency nor infeasible
    with a reason."""
    if df.height == 0:
        return 0
    if "feasible" not in df.columns or "latency_us" not in df.columns:
        return df.height
    feas = df.get_column("feasible").cast(pl.Boolean, strict=False)
    lat = df.get_column("latency_us").cast(pl.Float64, strict=False)
    reason = (df.get_column("infeasible_reason").cast(pl.String).fill_null("")
              if "infeasible_reason" in df.columns else pl.repeat("", df.height, eager=True))
    ok_f = feas.fill_null(False) & lat.is_finite().fill_null(False) & (lat > 0).fill_null(False)
    ok_i = (~feas.fill_null(True)) & (reason.str.strip_chars() != "")
    return int((~(ok_f | ok_i)).sum())


#: a file the next case's argv and inputs are written to before it runs (--trace)
TRACE = None


def run_case(case: dict) -> dict:
    """Run one case in-process; returns ``{"rc", "crash", "half", "breaks", "err"}``."""
    from tsbatch.front.cli import main

    with tempfile.TemporaryDirectory(prefix="fz_case_") as tmp:
        d = Path(tmp)
        res = {"rc": None, "crash": False, "half": False, "breaks": 0, "err": ""}
        try:
            argv, out = _argv(case, d)
        except Exception:  # the case could not be written: not the CLI's fault
            res["rc"] = "skip"
            return res
        if TRACE is not None:  # the case about to run, for a crash that kills the process
            TRACE.seek(0)
            TRACE.truncate()
            TRACE.write(json.dumps(argv) + "\n")
            for p in sorted(d.iterdir()):
                if p.is_file():
                    TRACE.write(f"{p.name}: {p.read_bytes()[:4000]!r}\n")
            TRACE.flush()
        so, se = io.StringIO(), io.StringIO()
        try:
            with contextlib.redirect_stdout(so), contextlib.redirect_stderr(se):
                rc = main(argv)
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
        except BaseException as exc:  # noqa: BLE001 - a crash is what we look for
            if isinstance(exc, KeyboardInterrupt):
                raise
            res["crash"] = True
            res["err"] = "".join(traceback.format_exception(exc))[-3000:]
            rc = None
        res["rc"] = rc
        res["argv"] = argv
        if rc not in (0, 2) and not res["crash"]:
            res["crash"] = True
            res["err"] = f"exit status {rc}: {se.getvalue()[-2000:]}"
        if "Traceback" in se.getvalue():
            res["crash"] = True
            res["err"] = se.getvalue()[-3000:]
        if rc == 2 and out is not None and case["cmd"] in ("evaluate", "sweep"):
            left = [p.name for p in out.parent.glob(f".{out.name}.tmp-*")] \
                if out.parent.is_dir() else []
            if (out.exists() and not out.is_dir()) or left:
                res["half"] = True
                res["err"] = f"exit 2 left {out if out.exists() else left}: {se.getvalue()}"
        if rc == 0 and case["cmd"] in ("evaluate", "sweep") and out is not None:
            try:
                res["breaks"] = contract_breaks(_read_output(out))
            except Exception as exc:  # noqa: BLE001
                res["half"] = True
                res["err"] = f"unreadable output: {exc}"
        if rc == 0 and case["cmd"] == "explain" and case.get("json"):
            try:
                row = json.loads(so.getvalue())
                res["breaks"] = contract_breaks(pl.DataFrame(
                    {"feasible": [row.get("feasible")],
                     "latency_us": [row.get("latency_us")],
                     "infeasible_reason": [row.get("infeasible_reason")]},
                    schema={"feasible": pl.Boolean, "latency_us": pl.Float64,
                            "infeasible_reason": pl.String}, strict=False))
            except Exception as exc:  # noqa: BLE001
                res["breaks"] = 1
                res["err"] = f"explain --json printed no row: {exc}"
        if res["breaks"] and not res["err"]:
            res["err"] = f"{res['breaks']} rows break the contract"
        return res


class Tally:
    """Counts of cases and of each kind of failure, with the first few failures."""

    def __init__(self, keep: int = 20):
        self.counts: Counter = Counter()
        self.failures: list = []
        self.keep = keep

    def add(self, case: dict, res: dict) -> bool:
        c = self.counts
        c["cases"] += 1
        c[f"cmd_{case['cmd']}"] += 1
        c[f"rc_{res['rc']}"] += 1
        bad = res["crash"] or res["half"] or res["breaks"]
        c["crashes"] += int(res["crash"])
        c["half_written"] += int(res["half"])
        c["contract_breaks"] += int(bool(res["breaks"]))
        c["contract_break_rows"] += int(res["breaks"])
        if bad and len(self.failures) < self.keep:
            self.failures.append((res.get("argv"), res["err"]))
        return bool(bad)

    def summary(self) -> str:
        c = self.counts
        head = (f"cases {c['cases']}: crashes {c['crashes']}, half-written outputs "
                f"{c['half_written']}, contract breaks {c['contract_breaks']} "
                f"({c['contract_break_rows']} rows)")
        detail = ", ".join(f"{k} {v}" for k, v in sorted(c.items())
                           if k.startswith(("cmd_", "rc_")))
        return head + "\n  " + detail


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log", default=None, help="append failures here")
    ap.add_argument("--every", type=int, default=1000, help="print progress every N cases")
    ap.add_argument("--trace", default=None,
                    help="write each case's argv and input files here before it runs")
    a = ap.parse_args(argv)
    global TRACE
    if a.trace:
        TRACE = open(a.trace, "w")

    from hypothesis import HealthCheck, Phase, given, seed, settings

    tally = Tally()
    t0 = time.perf_counter()
    log = open(a.log, "a") if a.log else None

    @seed(a.seed)
    @settings(max_examples=a.cases, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck), derandomize=False)
    @given(cases())
    def run(case):
        res = run_case(case)
        if tally.add(case, res) and log:
            log.write(f"--- {res.get('argv')}\n{res['err']}\n")
            log.flush()
        n = tally.counts["cases"]
        if n % a.every == 0:
            print(f"[{time.perf_counter() - t0:,.0f} s] {tally.summary()}", flush=True)

    run()
    dt = time.perf_counter() - t0
    print(f"done in {dt:,.0f} s ({tally.counts['cases'] / max(dt, 1e-9):.1f} cases/s)")
    print(tally.summary())
    for argv_, err in tally.failures[:5]:
        print("FAIL", argv_, "\n", err[-1500:])
    c = tally.counts
    return 1 if (c["crashes"] or c["half_written"] or c["contract_breaks"]) else 0


if __name__ == "__main__":
    os.environ.setdefault("TSBATCH_BOUND_THREADS", "1")
    sys.exit(main())
