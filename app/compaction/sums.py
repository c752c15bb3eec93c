"""Running sums over a conversation's units, in blocks."""

from __future__ import annotations

from bisect import bisect_left
from itertools import accumulate

SHIFT = 7  # blocks of 128 units


class RunningSums:
    """Non-negative integer values at positions 0..size-1, all 0 at first.

    The planner replays a history one unit at a time; when pruning it needs, at each compaction
    event, totals over ranges of units and the unit where a running total reaches a value. Values
    change a bounded number of times per unit and in O(1) each; a query costs O(√n) (a sum over
    block totals and one block), and only events query. So replaying n units stays near-linear.
    """

    __slots__ = ("_blocks", "_values")

    def __init__(self, size: int) -> None:
        self._values = [0] * size
        self._blocks = [0] * ((size >> SHIFT) + 1)

    def resized(self, size: int) -> RunningSums:
        """A copy for `size` positions: new ones hold 0, and those cut off must hold 0."""
        blocks = (size >> SHIFT) + 1
        copy = RunningSums(0)
        copy._values = self._values[:size] + [0] * (size - len(self._values))
        copy._blocks = self._blocks[:blocks] + [0] * (blocks - len(self._blocks))
        return copy

    def __getitem__(self, position: int) -> int:
        return self._values[position]

    def set(self, position: int, value: int) -> None:
        self._blocks[position >> SHIFT] += value - self._values[position]
        self._values[position] = value

    def prefix(self, end: int) -> int:
        """The sum of the values before `end`."""
        block = end >> SHIFT
        return sum(self._blocks[:block]) + sum(self._values[block << SHIFT : end])

    def range(self, start: int, end: int) -> int:
        return self.prefix(end) - self.prefix(start) if end > start else 0

    def search(self, target: int) -> int:
        """The smallest `end` with `prefix(end) >= target` (size + 1 when there is none)."""
        if target <= 0:
            return 0
        totals = list(accumulate(self._blocks))
        block = bisect_left(totals, target)
        if block == len(totals):
            return len(self._values) + 1
        start = block << SHIFT
        before = totals[block - 1] if block else 0
        inside = list(accumulate(self._values[start : start + (1 << SHIFT)], initial=before))
        return start + bisect_left(inside, target, 1)
