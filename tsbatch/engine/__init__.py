"""The engine: the evaluation driver, screening, ranking, pruning, bucket ranking, the pipeline and sweeps."""
