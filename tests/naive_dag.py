"""Plain-Python twins of the family engine's kernels and order enumeration."""

from __future__ import annotations

import itertools


def is_topological(order, preds) -> bool:
    seen = set()
    for a in order:
        if any(p not in seen for p in preds[a]):
            return False
        seen.add(a)
    return True


def brute_force_orders(preds) -> list[tuple[int, ...]]:
    """Every permutation that respects the predecessor lists (n! of them tried)."""
    n = len(preds)
    return [p for p in itertools.permutations(range(n)) if is_topological(p, preds)]


def chain(uses, preds, order) -> float:
    """The list schedule of ``order``. ``uses[a]`` lists action ``a``'s
    ``(resource, duration)`` pairs: each use starts when the action's
    predecessors are done and its resource is free, and holds that resource
    for its own duration; the action ends with its last use. A use of zero
    duration neither waits nor holds."""
    finish = {}
    free = {}
    for a in order:
        ready = max([finish[p] for p in preds[a]] + [0.0])
        end = ready
        for r, d in uses[a]:
            if d <= 0.0:
                continue
            e = max(ready, free.get(r, 0.0)) + d
            free[r] = e
            end = max(end, e)
        finish[a] = end
    return max(finish.values(), default=0.0)


def best_order(uses, preds, orders) -> tuple[float, int]:
    """The shortest chain over ``orders`` and the first order reaching it."""
    best, arg = float("inf"), 0
    for k, o in enumerate(orders):
        c = chain(uses, preds, o)
        if c < best:
            best, arg = c, k
    return best, arg
