"""The best legal order of a tile-action DAG, per row (TileSight Eq. 4-5).

An issue order ``σ`` (a topological order of one loop iteration's actions)
is list-scheduled: in ``σ``'s order each action starts when its in-iteration
predecessors have finished and every resource it uses is free, and holds
those resources for its duration. The makespan is the order's *chain*: the
time one issue stream needs for an iteration. The best order is the one with
the shortest chain; :func:`best_orders` finds it for a batch of rows, whose
action durations differ, over orders enumerated once per program
(:meth:`kernels_catalog.program.TileProgram.orders`). Asynchronous actions
(prefetched loads) have zero duration here: their cost enters the envelope's
resource and latency bounds.

Cost per row: ``O x A`` action steps (``O`` orders, ``A`` actions), each a
few comparisons over the action's resources (a bit mask).
"""

from __future__ import annotations

import numpy as np

from tsbatch.kernels._config import jit_serial
from tsbatch.kernels._threads import even_bounds, run_shares
from tsbatch.kernels.envelope import N_RES

__all__ = ["best_orders", "MAX_DAG_RESOURCES"]

#: resources a DAG's actions may use (bits of the resource masks)
MAX_DAG_RESOURCES = N_RES


@jit_serial
def _best_orders(dur, res_mask, pred_mask, orders, out_chain, out_best, lo, hi):
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
                start = 0.0
                pm = pred_mask[a]
                for b in range(n_act):
                    if (pm >> b) & 1 and finish[b] > start:
                        start = finish[b]
                rm = res_mask[a]
                for r in range(MAX_DAG_RESOURCES):
                    if (rm >> r) & 1 and free[r] > start:
                        start = free[r]
                end = start + dur[i, a]
                finish[a] = end
                for r in range(MAX_DAG_RESOURCES):
                    if (rm >> r) & 1:
                        free[r] = end
                if end > span:
                    span = end
                if span >= best:  # this order cannot win any more
                    break
            if span < best:
                best = span
                arg = o
        out_chain[i] = best
        out_best[i] = arg


def best_orders(dur: np.ndarray, res_mask: np.ndarray, pred_mask: np.ndarray,
                orders: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the shortest chain over ``orders`` and the index of the order
    that reaches it (the first such order on ties).

    ``dur`` ``(n, A)`` action durations; ``res_mask`` ``(A,)`` bit masks of the
    resources each action holds (bits below :data:`MAX_DAG_RESOURCES`);
    ``pred_mask`` ``(A,)`` bit masks of each action's predecessors;
    ``orders`` ``(O, A)`` action indices in issue order.
    """
    dur = np.ascontiguousarray(dur, dtype=np.float64)
    n = dur.shape[0]
    chain = np.empty(n, dtype=np.float64)
    best = np.empty(n, dtype=np.int64)
    if n == 0:
        return chain, best
    args = (dur, np.ascontiguousarray(res_mask, dtype=np.int64),
            np.ascontiguousarray(pred_mask, dtype=np.int64),
            np.ascontiguousarray(orders, dtype=np.int64), chain, best)
    run_shares(_best_orders, args, even_bounds(n))
    return chain, best
