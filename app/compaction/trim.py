"""`trim` (and the cut `summarize` replaces): drop the oldest whole units after the head.

The cut only moves forward, only to positions that keep strict role order when the input had
it, and never past the last unit.
"""

from __future__ import annotations

from collections.abc import Callable


def advance_cut(
    cut: int,
    last: int,
    total: int,
    goal: int,
    cost: Callable[[int], int],
    valid: Callable[[int], bool],
    summary_cost: int,
    summary_present: bool,
) -> tuple[int, int]:
    """Move the cut forward until `total` ≤ `goal` (or as far as allowed).

    `cost(i)` is the current cost of unit i (0 when already dropped); `summary_cost` is added
    once the cut first moves when the span is to be summarised. Returns (cut, total).
    """
    best_cut, best_total = cut, total
    running = total
    position = cut
    while position < last:
        running -= cost(position)
        position += 1
        candidate = running + (summary_cost if not summary_present else 0)
        if valid(position):
            best_cut, best_total = position, candidate
            if candidate <= goal:
                break
    if best_total >= total:
        return cut, total  # a summary would cost what it replaces: moving gains nothing
    return best_cut, best_total
