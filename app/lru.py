"""A bounded map that forgets its least recently used entry first.

Every cache keyed by something a client chooses (model names, conversation keys, summary
hashes) is bounded, and all of them evict the same way: this one class. Bounded in entries and,
given a `weigh` function, in bytes too (a client-chosen key or value can be any size).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")

ENTRY_OVERHEAD = 200  # bytes an entry costs besides its key and value (node, tuple, objects)


def weigh_strings(key: object, value: object) -> int:
    """Bytes of an entry whose key and value are strings, bytes or tuples of them (and small
    numbers): their lengths plus `ENTRY_OVERHEAD`."""
    return ENTRY_OVERHEAD + _length(key) + _length(value)


def _length(item: object) -> int:
    if isinstance(item, str | bytes):
        return len(item)
    if isinstance(item, tuple):
        return sum(_length(part) + 8 for part in item)
    return 8


class BoundedLRU(Generic[K, V]):
    """At most `capacity` entries (and, with `weigh`, at most `max_bytes` of what `weigh`
    says they hold); reading or writing an entry makes it the most recent. An entry heavier
    than `max_bytes` on its own is not kept."""

    __slots__ = ("_bytes", "_capacity", "_data", "_max_bytes", "_weigh", "_weights")

    def __init__(
        self,
        capacity: int,
        max_bytes: int | None = None,
        weigh: Callable[[K, V], int] | None = None,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"an LRU needs room for at least one entry, not {capacity}")
        if (max_bytes is None) != (weigh is None) or (max_bytes is not None and max_bytes < 1):
            raise ValueError("a byte bound needs both a positive max_bytes and weigh")
        self._capacity = capacity
        self._data: OrderedDict[K, V] = OrderedDict()
        self._max_bytes = max_bytes
        self._weigh = weigh
        self._weights: dict[K, int] = {}
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def __iter__(self) -> Iterator[K]:
        return iter(self._data)

    def __getitem__(self, key: K) -> V:
        value = self._data[key]
        self._data.move_to_end(key)
        return value

    @property
    def size(self) -> int:
        """Bytes held, as `weigh` says (0 without one)."""
        return self._bytes

    def get(self, key: K) -> V | None:
        """The value of `key` (now the most recent), or None when absent."""
        try:
            return self[key]
        except KeyError:  # absent, or evicted by another thread between the two steps
            return None

    def put(self, key: K, value: V) -> None:
        """Insert or replace; the oldest entries go when the map is over its bounds."""
        self.pop(key)
        if self._weigh is not None and self._max_bytes is not None:
            weight = self._weigh(key, value)
            if weight > self._max_bytes:
                return
            self._weights[key] = weight
            self._bytes += weight
        self._data[key] = value
        while len(self._data) > self._capacity or (
            self._max_bytes is not None and self._bytes > self._max_bytes
        ):
            oldest, _ = self._data.popitem(last=False)
            self._bytes -= self._weights.pop(oldest, 0)

    def pop(self, key: K) -> V | None:
        self._bytes -= self._weights.pop(key, 0)
        return self._data.pop(key, None)

    def items(self) -> Iterator[tuple[K, V]]:
        return iter(list(self._data.items()))
