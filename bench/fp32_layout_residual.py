"""Median measured / predicted of the IEEE FP32 Triton rows of one GPU's
development file per configuration and operand layout (columns AcBc, AcBr,
ArBc, ArBr: A / B column- or row-major), and per layout the median and the
MAPE; optionally writes the scored rows (``time_ms``, ``pred`` in us, ``r`` =
measured / predicted, ``cfg``) to a Parquet file for per-problem analysis
(docs/gemm_accuracy.md "H100 IEEE FP32 A:row B:row residual, session 12").

    PYTHONPATH=$PWD python bench/fp32_layout_residual.py h100 [OUT.parquet]
"""
import sys

import numpy as np
import polars as pl

import tsbatch

gpu = sys.argv[1] if len(sys.argv) > 1 else "h100"
path = {"h100": "../shared/data/gemm/h100_triton_mm.parquet",
        "a100": "../shared/data/gemm/a100_triton_mm.parquet"}[gpu]
d = pl.read_parquet(path).filter((pl.col("dtype") == "float32") & ~pl.col("tf32")
                                 & (pl.col("backend") == "triton"))
cols = ["m", "n", "k", "dtype", "a_row_major", "b_row_major", "tf32", "block_m", "block_n",
        "block_k", "num_stages", "num_warps", "group_m"]
res = tsbatch.evaluate_table(d.select(cols), hw=gpu)
d = d.with_columns(pred=res["latency_us"], r=pl.col("time_ms") * 1000.0 / res["latency_us"])
d = d.with_columns(cfg=pl.format("{}x{}x{}/{}/{}", "block_m", "block_n", "block_k", "num_stages",
                                 "num_warps"),
                   lay=pl.format("A{}B{}", pl.when("a_row_major").then(pl.lit("r")).otherwise(pl.lit("c")),
                                 pl.when("b_row_major").then(pl.lit("r")).otherwise(pl.lit("c"))))
pd_ = d.select("cfg", "a_row_major", "b_row_major", "r").to_pandas()
pd_["lay"] = (np.where(pd_.a_row_major, "Ar", "Ac") + np.where(pd_.b_row_major, "Br", "Bc"))
print(pd_.groupby(["cfg", "lay"]).r.median().unstack("lay").round(3).to_string())
print(pd_.groupby("lay").r.agg(["median", lambda r: (abs(r - 1) / r).mean()]).round(3).to_string())
if len(sys.argv) > 2:
    d.write_parquet(sys.argv[2])
