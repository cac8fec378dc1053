"""Full ranking through workload buckets on disk (tsbatch.engine.bucket_rank) equals
``rank(evaluate(all rows))`` row for row, whatever the bucket size and the
record batches."""

from __future__ import annotations

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from test_screen import WL, _same, ranked_inputs
from tsbatch.front.cli import main
from tsbatch.engine.bucket_rank import BUCKET_COL, BucketRanker, bucket_map
from tsbatch.engine.evaluate import evaluate, resolve_hw
from tsbatch.engine.rank import rank
from tsbatch.engine.screen import COUNT_COL, workload_counts


def test_bucket_map_cuts_contiguous_runs_and_never_splits_a_workload():
    counts = pl.DataFrame({"w": [3, 1, 2, 4], COUNT_COL: [5, 2, 2, 9]})
    got = bucket_map(counts, ["w"], max_rows=4)
    # sorted w = 1 (2 rows), 2 (2), 3 (5), 4 (9): [1, 2] fill 4; 3 and 4 exceed alone
    assert got["w"].to_list() == [1, 2, 3, 4]
    assert got[BUCKET_COL].to_list() == [0, 0, 1, 2]
    with pytest.raises(ValueError, match="max_rows"):
        bucket_map(counts, ["w"], max_rows=0)


@settings(max_examples=10, deadline=None)
@given(df=ranked_inputs(max_workloads=4), batch=st.integers(3, 40), max_rows=st.integers(1, 60),
       top=st.sampled_from([1.0, 0.3]))
def test_bucketed_rank_equals_full_rank(df, batch, max_rows, top):
    hw = resolve_hw("h100")
    want = rank(evaluate(df, hw), WL, top)
    with BucketRanker(WL, workload_counts(df, WL), max_rows=max_rows) as br:
        for a in range(0, df.height, batch):
            br.add(evaluate(df.slice(a, batch), hw))
        got = pl.concat(list(br.ranked(top)), how="vertical_relaxed") if df.height else want
        spill = br.dir
    _same(got, want)
    assert not spill.exists()  # the spill folder is removed


@settings(max_examples=5, deadline=None)
@given(df=ranked_inputs(max_workloads=3))
def test_cli_rank_without_top_streams_buckets_and_matches(tmp_path_factory, df):
    tmp_path = tmp_path_factory.mktemp("rank")
    src = tmp_path / "c.parquet"
    df.write_parquet(src)
    out = tmp_path / "r.parquet"
    assert main(["evaluate", str(src), "--hw", "h100", "--rank", "--batch-rows", "5",
                 "--rank-bucket-rows", "7", "-o", str(out), "-q"]) == 0
    _same(pl.read_parquet(out), rank(evaluate(pl.read_parquet(src), "h100"), WL, 1.0))


def test_cli_rejects_a_nonpositive_bucket(tmp_path, capsys):
    src = tmp_path / "c.parquet"
    pl.DataFrame({"m": [64]}).write_parquet(src)
    rc = main(["evaluate", str(src), "--hw", "h100", "--rank", "--rank-bucket-rows", "0",
               "-o", str(tmp_path / "o.parquet")])
    assert rc != 0 and "--rank-bucket-rows" in capsys.readouterr().err
