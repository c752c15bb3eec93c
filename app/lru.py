"""A bounded map that forgets its least recently used entry first.

Every cache keyed by something a client chooses (model names, conversation keys, summary
hashes) is bounded, and all of them evict the same way: this one class.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class BoundedLRU(Generic[K, V]):
    """At most `capacity` entries; reading or writing an entry makes it the most recent."""

    __slots__ = ("_capacity", "_data")

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"an LRU needs room for at least one entry, not {capacity}")
        self._capacity = capacity
        self._data: OrderedDict[K, V] = OrderedDict()

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

    def get(self, key: K) -> V | None:
        """The value of `key` (now the most recent), or None when absent."""
        try:
            return self[key]
        except KeyError:  # absent, or evicted by another thread between the two steps
            return None

    def put(self, key: K, value: V) -> None:
        """Insert or replace; the oldest entries go when the map is over capacity."""
        self._data[key] = value
        self._data.move_to_end(key)
        while len(self._data) > self._capacity:
            self._data.popitem(last=False)

    def pop(self, key: K) -> V | None:
        return self._data.pop(key, None)

    def items(self) -> Iterator[tuple[K, V]]:
        return iter(list(self._data.items()))
