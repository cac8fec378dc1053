"""Grid search of two named per-GPU constants (iter_overhead_cycles, mem_latency_us).

    python bench/calibrate_constants.py h100 0,30,60,100 0.4,0.8,1.2

Evaluates a random 80-problem subsample (seed 1) of the fp16/bf16 Triton rows
of ../shared/data/gemm/<gpu>_triton_mm.parquet for every pair of values and
prints MAPE, median predicted/measured ratio and mean within-problem Spearman.
The values chosen are written by hand into hw/<gpu>.toml [calibration] with
this provenance. Nothing else is fitted.
"""
import os
import polars as pl, numpy as np, dataclasses, sys, itertools
from tsbatch.evaluate import evaluate
from tsbatch.hw import get_hw
g=sys.argv[1]
d=pl.read_parquet(os.path.join(os.environ.get('TSBATCH_SHARED_DATA', '../shared/data'), 'gemm', f'{g}_triton_mm.parquet')).filter(pl.col.time_ms.is_finite(), pl.col.dtype!='float32', pl.col.backend=='triton')
keys=['m','n','k','dtype','a_row_major','b_row_major','tf32','backend','block_m','block_n','block_k','num_stages','num_warps','group_m']
d=d.group_by(keys).agg(pl.col.time_ms.median())
probs=d.select('m','n','k','dtype').unique().sample(n=min(80, d.select('m','n','k','dtype').unique().height), seed=1)
d=d.join(probs,on=['m','n','k','dtype'])
hw0=get_hw(g)
grid=[float(x) for x in sys.argv[2].split(',')]
lats=[float(x) for x in sys.argv[3].split(',')]
for ov, lat in itertools.product(grid, lats):
    cal=dict(hw0.calibration); cal['iter_overhead_cycles']=ov; cal['mem_latency_us']=lat
    hw=dataclasses.replace(hw0, calibration=cal)
    r=evaluate(d,hw).filter(pl.col.feasible).with_columns(pred=pl.col.latency_us/1000)
    r=r.with_columns(ape=(pl.col.pred-pl.col.time_ms).abs()/pl.col.time_ms, lr=(pl.col.pred/pl.col.time_ms).log())
    sp=r.group_by('m','n','k','dtype').agg(pl.corr('pred','time_ms',method='spearman').alias('s'),pl.len()).filter(pl.col.len>=5)['s'].mean()
    print(g, ov, lat, 'mape', round(r['ape'].mean()*100,1), 'medratio', round(float(np.exp(r['lr'].median())),3), 'spearman', round(sp,3), flush=True)
