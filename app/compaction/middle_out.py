"""`middle-out`: drop whole units from the middle of the conversation, keeping head and tail."""

from __future__ import annotations

from collections.abc import Iterator

NONE = -1


class MiddleOut:
    """The units middle-out may still drop (after the cut, not dropped), in order.

    Units are removed from the centre outwards (OpenRouter's transform, made pair-safe). The planner
    decides which unit may go (in a strict chat an assistant message only together with the user
    message after it, so roles keep alternating); this class keeps the units that are still
    candidates linked in order, with a pointer to their middle that moves only as far as the list
    changes, so a whole replay costs O(n) here however many events it has.
    """

    __slots__ = ("_before", "_centre", "_count", "_last", "_next", "_prev")

    def __init__(self, size: int) -> None:
        self._prev = [NONE] * size
        self._next = [NONE] * size
        self._last = NONE
        self._count = 0
        self._centre = NONE  # a candidate, with `_before` candidates before it
        self._before = 0

    def resized(self, size: int) -> MiddleOut:
        """A copy for `size` units: new ones are not candidates yet, and those cut off must
        not be."""
        copy = MiddleOut(0)
        copy._prev = self._prev[:size] + [NONE] * (size - len(self._prev))
        copy._next = self._next[:size] + [NONE] * (size - len(self._next))
        copy._last, copy._count = self._last, self._count
        copy._centre, copy._before = self._centre, self._before
        return copy

    def add(self, unit: int) -> None:
        """Make `unit` (after every unit added so far) a candidate."""
        self._prev[unit] = self._last
        if self._last != NONE:
            self._next[self._last] = unit
        self._last = unit
        self._count += 1
        if self._centre == NONE:
            self._centre, self._before = unit, 0

    def remove(self, unit: int) -> None:
        """`unit` is no longer a candidate. Its own links stay, so a walk standing on it goes
        on; a walk may still yield a unit removed after the walk passed its neighbour, so
        callers skip units they already dropped."""
        before, after = self._prev[unit], self._next[unit]
        if unit == self._centre:
            if after != NONE:
                self._centre = after
            else:
                self._centre, self._before = before, max(0, self._before - 1)
        elif unit < self._centre:
            self._before -= 1
        if before != NONE:
            self._next[before] = after
        if after != NONE:
            self._prev[after] = before
        else:
            self._last = before
        self._count -= 1

    def _seek(self, index: int) -> int:
        """The candidate with `index` candidates before it."""
        while self._before < index:
            self._centre = self._next[self._centre]
            self._before += 1
        while self._before > index:
            self._centre = self._prev[self._centre]
            self._before -= 1
        return self._centre

    def walk(self, end: int) -> Iterator[int]:
        """The candidates before `end`: the centre first, then alternately the next one to its
        left and to its right."""
        count = self._count - (1 if self._last != NONE and self._last >= end else 0)
        if count <= 0:
            return
        centre = self._seek(count // 2)
        yield centre
        left, right = self._prev[centre], self._next[centre]
        leftwards = True
        while True:
            can_left, can_right = left != NONE, right != NONE and right < end
            if not can_left and not can_right:
                return
            if can_left and (leftwards or not can_right):
                yield left
                left = self._prev[left]
            else:
                yield right
                right = self._next[right]
            leftwards = not leftwards
