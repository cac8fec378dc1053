"""The best legal order of a tile-action DAG, per row (TileSight Eq. 4-5).

An issue order ``σ`` (a topological order of one loop iteration's actions)
is list-scheduled: in ``σ``'s order each action becomes ready when its
in-iteration predecessors have finished; its work on each of its resources
(a *use*: the tensor cores, the FMA pipe, the SFUs, ...) starts as soon as
the action is ready and that resource is free, holds the resource for the
use's own duration, and the action finishes with its last use. A warp
issues one instruction stream, but the instructions of one action go to
different pipes and interleave there (instruction-level parallelism): the
rescale's multiplies do not wait behind the exponentials' SFU work, only
behind earlier work on the FMA pipe. The makespan is the order's *chain*:
the time one issue stream needs for an iteration. The best order is the one
with the shortest chain; :func:`best_orders` finds it for a batch of rows,
whose use durations differ, over orders enumerated once per program
(:meth:`kernels_catalog.program.TileProgram.orders`). Asynchronous actions
(prefetched loads) have no uses here: their cost enters the envelope's
resource and latency bounds. A use of zero duration neither waits nor
holds its resource.

Cost per row: ``O x U`` use steps (``O`` orders, ``U`` uses over the
actions), each a few comparisons.
"""

from __future__ import annotations

import numpy as np

from tsbatch.kernels._config import jit_serial
from tsbatch.kernels._threads import even_bounds, run_shares
from tsbatch.kernels.envelope import N_RES

__all__ = ["best_orders", "MAX_DAG_RESOURCES"]

#: resources a DAG's actions may use (indices below this)
MAX_DAG_RESOURCES = N_RES


@jit_serial
def _best_orders(udur, use_ptr, use_res, pred_mask, orders, out_chain, out_best, lo, hi):
    n_ord = orders.shape[0]
    n_act = orders.shape[1]
    finish = np.empty(n_act, dtype=np.float64)
    free = np.empty(MAX_DAG_RESOURCES, dtype=np.float64)
    for i in range(lo, hi):
        best = np.inf
        arg = 0
        for o in range(n_ord):
            for r in range(MAX_DAG_RESOURCES):
                free[r] = 0.0
            span = 0.0
            for s in range(n_act):
                a = orders[o, s]
                ready = 0.0
                pm = pred_mask[a]
                for b in range(n_act):
                    if (pm >> b) & 1 and finish[b] > ready:
                        ready = finish[b]
                end = ready
                for u in range(use_ptr[a], use_ptr[a + 1]):
                    d = udur[i, u]
                    if d <= 0.0:
                        continue
                    r = use_res[u]
                    st = free[r] if free[r] > ready else ready
                    e = st + d
                    free[r] = e
                    if e > end:
                        end = e
                finish[a] = end
                if end > span:
                    span = end
                if span >= best:  # this order cannot win any more
                    break
            if span < best:
                best = span
                arg = o
        out_chain[i] = best
        out_best[i] = arg


def best_orders(udur: np.ndarray, use_ptr: np.ndarray, use_res: np.ndarray,
                pred_mask: np.ndarray, orders: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the shortest chain over ``orders`` and the index of the order
    that reaches it (the first such order on ties).

    ``udur`` ``(n, U)`` durations of the uses, grouped by action: action
    ``a``'s uses are ``use_ptr[a]:use_ptr[a + 1]`` (``use_ptr`` ``(A + 1,)``),
    on resources ``use_res`` ``(U,)`` (below :data:`MAX_DAG_RESOURCES`);
    ``pred_mask`` ``(A,)`` bit masks of each action's predecessors;
    ``orders`` ``(O, A)`` action indices in issue order.
    """
    udur = np.ascontiguousarray(udur, dtype=np.float64)
    use_ptr = np.ascontiguousarray(use_ptr, dtype=np.int64)
    use_res = np.ascontiguousarray(use_res, dtype=np.int64)
    n = udur.shape[0]
    if use_ptr.shape[0] != orders.shape[1] + 1 or udur.shape[1] != use_res.shape[0] \
            or (use_ptr.shape[0] and use_ptr[-1] != use_res.shape[0]):
        raise ValueError("best_orders: use_ptr must have one entry per action plus one, "
                         "ending at the number of uses (udur's columns, use_res)")
    if use_res.size and (use_res.min() < 0 or use_res.max() >= MAX_DAG_RESOURCES):
        raise ValueError(f"best_orders: resources must be in [0, {MAX_DAG_RESOURCES})")
    chain = np.empty(n, dtype=np.float64)
    best = np.empty(n, dtype=np.int64)
    if n == 0:
        return chain, best
    args = (udur, use_ptr, use_res, np.ascontiguousarray(pred_mask, dtype=np.int64),
            np.ascontiguousarray(orders, dtype=np.int64), chain, best)
    run_shares(_best_orders, args, even_bounds(n))
    return chain, best
