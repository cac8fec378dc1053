"""Cold and warm start of ``tsbatch evaluate`` on a 1,000-row candidate file.

    python bench/startup.py [--hw h100] [--repeats 3]

Cold: a fresh, empty numba cache directory (every kernel compiles). Warm: the
same cache directory again (kernels load from the cache). Each run is a new
process, as a user or an autotuner would start it. Prints seconds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hw", default="h100")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from throughput import build_candidates

    tmp = Path(tempfile.mkdtemp(prefix="tsbatch-startup-"))
    src = tmp / "c.parquet"
    build_candidates(1000).write_parquet(src)
    exe = [sys.executable, "-m", "tsbatch.cli", "evaluate", str(src), "--hw", args.hw,
           "-o", str(tmp / "o.parquet"), "-q"]

    def run(cache: Path) -> float:
        env = dict(os.environ, NUMBA_CACHE_DIR=str(cache))
        t = time.perf_counter()
        subprocess.run(exe, env=env, check=True, capture_output=True)
        return time.perf_counter() - t

    colds, warms = [], []
    for i in range(args.repeats):
        cache = tmp / f"cache{i}"
        cache.mkdir()
        colds.append(run(cache))
        warms.append(run(cache))
    print(f"cold start (fresh numba cache): median {statistics.median(colds):6.2f} s  {colds}")
    print(f"warm start (cached kernels):    median {statistics.median(warms):6.2f} s  {warms}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
