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


def chain(durations, resources, preds, order) -> float:
    """The list schedule of ``order``: each action starts when its predecessors
    are done and each of its resources is free, and holds them for its duration."""
    finish = {}
    free = {}
    for a in order:
        start = max([finish[p] for p in preds[a]] + [free.get(r, 0.0) for r in resources[a]]
                    + [0.0])
        end = start + durations[a]
        finish[a] = end
        for r in resources[a]:
            free[r] = end
    return max(finish.values(), default=0.0)


def best_order(durations, resources, preds, orders) -> tuple[float, int]:
    """The shortest chain over ``orders`` and the first order reaching it."""
    best, arg = float("inf"), 0
    for k, o in enumerate(orders):
        c = chain(durations, resources, preds, o)
        if c < best:
            best, arg = c, k
    return best, arg
