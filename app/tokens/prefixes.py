"""The last request of a few conversations, as one JSON text with its messages' counts, so
that the next request of a conversation counts only the messages it adds."""

from __future__ import annotations

from array import array
from collections import OrderedDict
from dataclasses import dataclass, field

from inflight.jsontext import HistoryTexts
from inflight.tokens.calibration import Correction

PREFIX_SLOTS = 8  # conversations whose last request is remembered (each its bytes and counts)
PREFIX_BYTES = 32 * 1024 * 1024  # at most this many bytes of them in all


def counts() -> array[int]:
    """An empty array of counts or offsets (machine integers: copied as bytes)."""
    return array("q")


@dataclass(frozen=True, slots=True)
class Prefix:
    """A request's messages as one JSON text, where each message ends in it, and their raw
    counts, for one scope (encoding and model: images cost differ per model). Never changed
    once made: a request takes copies of its arrays."""

    scope: str
    text: bytes
    # ends[i]: the offset just after message i's JSON in `text`
    ends: array[int] = field(default_factory=counts)
    raw: array[int] = field(default_factory=counts)
    fix: Correction | None = None  # the correction `counted` holds the raw counts under
    counted: array[int] = field(default_factory=counts)  # of the leading messages (or fewer)

    def shared(self, scope: str, text: bytes, texts: HistoryTexts) -> int:
        """How many leading messages `text` (a request's messages as one JSON text) has
        byte-identical to this one's. Messages are objects, so an object that starts where
        one of these starts and agrees with it up to its closing brace is that message."""
        if (
            scope != self.scope
            or not self.ends
            or not texts.starts_with(text, self.text, self.ends[0])
        ):
            return 0
        if texts.starts_with(text, self.text, self.ends[-1]):
            return len(self.ends)  # the common case: the conversation went on
        low, high = 1, len(self.ends) - 1  # ends[low - 1] is shared; ends[high] is not
        while low <= high:
            mid = (low + high) // 2
            if texts.starts_with(text, self.text, self.ends[mid]):
                low = mid + 1
            else:
                high = mid - 1
        return low


class Prefixes:
    """The last requests of a few conversations, so the next one counts only what it adds.
    Bounded in entries and bytes; not thread-safe on its own (the counter's lock guards it)."""

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: OrderedDict[int, Prefix] = OrderedDict()

    def longest(self, scope: str, text: bytes, texts: HistoryTexts) -> tuple[Prefix | None, int]:
        best: tuple[Prefix | None, int] = (None, 0)
        for entry in self._entries.values():
            shared = entry.shared(scope, text, texts)
            if shared > best[1]:
                best = (entry, shared)
        return best

    def replace(self, old: Prefix | None, new: Prefix) -> None:
        """Remember `new`, in place of `old` when it extends it (a conversation keeps one
        slot; another conversation sharing only its first messages keeps its own)."""
        if old is not None:
            self._entries.pop(id(old), None)
        self._entries[id(new)] = new
        total = sum(len(e.text) for e in self._entries.values())
        while len(self._entries) > PREFIX_SLOTS or total > PREFIX_BYTES:
            _, dropped = self._entries.popitem(last=False)
            total -= len(dropped.text)
