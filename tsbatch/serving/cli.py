"""``tsbatch serve explain | sweep | models``: the serving layer on the command line.

The commands only parse arguments and print; the work is :mod:`tsbatch.serving.api`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tsbatch.errors import InputError

__all__ = ["add_parser"]


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("serve", help="end-to-end LLM inference: explain or sweep "
                                            "deployments (model x system x parallel layout)",
                              description="Predict prefill, decode step, total time and "
                                          "tokens/s of LLM deployments from the kernel families.")
    sub = p.add_subparsers(dest="serve_command", required=True, metavar="SERVE_COMMAND")
    e = sub.add_parser("explain", help="per-op breakdown of one deployment")
    e.add_argument("--model", required=True, help="Hugging Face id, alias or config.json path "
                                                  "(tsbatch serve models lists the shipped ones)")
    e.add_argument("--system", required=True, help="hw/systems name or a GPU (tsbatch hw)")
    for k, d in (("tp", 1), ("pp", 1), ("ep", 1), ("dp", 1), ("batch", 1),
                 ("prompt-len", 1024), ("output-len", 128), ("chunk-tokens", 0),
                 ("prompt-len-rms", 0)):
        e.add_argument(f"--{k}", type=int, default=d)
    e.add_argument("--weights", default="bf16", help="bf16 or fp8")
    e.add_argument("--engine", default="vllm", help="engine profile: vllm or tuned")
    e.add_argument("--png", help="write the stacked-bar breakdown (prefill beside decode)")
    e.add_argument("--json", help="write the result row and op table as JSON")
    e.set_defaults(func=_explain)
    s = sub.add_parser("sweep", help="predict and rank the deployments of a sweep TOML")
    s.add_argument("sweep", help="serving sweep TOML, or a built-in name (serve_llm, "
                                 "serve_moe_mla)")
    s.add_argument("-o", "--output", required=True, help="ranked Parquet")
    s.add_argument("--rank-by", default=None,
                   help="tokens_per_s_per_gpu (default), tokens_per_s or decode_tokens_per_s")
    s.add_argument("--max-decode-step-ms", type=float, default=None,
                   help="rank only deployments whose median decode step is within this")
    s.add_argument("--top", type=int, default=10, help="rows printed (default 10)")
    s.add_argument("-q", "--quiet", action="store_true")
    s.set_defaults(func=_sweep)
    m = sub.add_parser("models", help="the shipped model configurations")
    m.set_defaults(func=_models)
    return p


def _explain(args) -> int:
    from tsbatch.serving.api import explain_deployment

    if args.png and not args.png.endswith(".png"):
        raise InputError(f"--png {args.png!r}: the picture is a PNG; give a name ending in .png")
    e = explain_deployment(args.model, args.system, tp=args.tp, pp=args.pp, ep=args.ep,
                           dp=args.dp, weights=args.weights, engine=args.engine,
                           batch=args.batch, prompt_len=args.prompt_len,
                           output_len=args.output_len, chunk_tokens=args.chunk_tokens,
                           prompt_len_rms=args.prompt_len_rms)
    print(e)
    if args.png and e.result["feasible"]:
        print(f"wrote {e.plot(args.png)}")
    if args.json:
        import json

        Path(args.json).write_text(json.dumps({"result": e.result, "ops": e.ops.to_dicts()},
                                              indent=1, default=str))
    return 0


def _sweep(args) -> int:
    import polars as pl

    from tsbatch.serving.api import sweep_deployments

    out = Path(args.output)
    if out.suffix != ".parquet":
        raise InputError(f"-o {args.output!r}: the ranked table is Parquet; give a name "
                         f"ending in .parquet")
    if not out.parent.exists():
        raise InputError(f"-o {args.output!r}: directory {str(out.parent)!r} does not exist")
    res = sweep_deployments(args.sweep, rank_by=args.rank_by,
                            max_decode_step_ms=args.max_decode_step_ms)
    import json

    import tsbatch
    from tsbatch.boundary.io import sha256_file, write_parquet
    from tsbatch.serving.deploy import _engines_file, engine_profiles

    meta = {"tsbatch.version": tsbatch.__version__,
            "tsbatch.family": "serving",
            "tsbatch.sweep": str(args.sweep),
            "tsbatch.engines": json.dumps(engine_profiles(), sort_keys=True, default=str),
            "tsbatch.engines_file_sha256": sha256_file(_engines_file())}
    write_parquet(res, out, meta)  # written whole or not at all
    if not args.quiet:
        ranked = res.filter(pl.col("rank").is_not_null())
        print(f"{res.height} deployments, {ranked.height} ranked; wrote {out}")
        with pl.Config(tbl_rows=args.top, tbl_cols=20, tbl_width_chars=200, float_precision=2):
            print(ranked.head(args.top).select(
                "rank", "model", "system", "tp", "pp", "ep", "weights", "batch", "prompt_len",
                "output_len", "prefill_ms", "decode_step_ms", "tokens_per_s_per_gpu"))
    return 0


def _models(args) -> int:
    from tsbatch.serving.models import list_models, load_model

    for name in list_models():
        m = load_model(name)
        print(f"{name:36s} {m.architecture:24s} {m.kind:5s} {m.params() / 1e9:7.1f}B  "
              f"layers {m.layers:3d}  hidden {m.hidden:5d}  heads {m.heads}/{m.kv_heads}"
              + (f"  experts {m.experts} top-{m.top_k}" if m.experts else ""))
    return 0


def main(argv=None) -> int:  # pragma: no cover - convenience
    p = argparse.ArgumentParser(prog="tsbatch")
    add_parser(p.add_subparsers(dest="command", required=True))
    args = p.parse_args(argv)
    try:
        return args.func(args)
    except InputError as exc:
        print(f"tsbatch: error: {exc}", file=sys.stderr)
        return 2
