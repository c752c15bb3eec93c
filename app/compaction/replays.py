"""Replays remembered by history prefix, so that request n+1 replays only the units it adds."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar

import orjson

from inflight.jsontext import HistoryTexts

ENTRIES = 64  # conversations (and plan inputs) whose last replay is remembered
MAX_BYTES = 64 * 1024 * 1024  # their JSON and state, in all
STATE_BYTES_PER_UNIT = 256  # what an entry's replay state holds per unit, roughly

S = TypeVar("S")


@dataclass(frozen=True, slots=True)
class Saved(Generic[S]):
    """The replay state after the messages whose JSON text is the first `length` bytes of
    `source` (the list's text without its closing bracket: `source` is the text of the request
    that remembered it, of which these messages are the leading ones), for the plan inputs
    `key`."""

    key: Hashable
    source: bytes
    length: int
    state: S
    size: int  # what it holds, counted against the cache's bound in bytes

    @property
    def text(self) -> bytes:
        """Its messages' JSON text (a copy: matching compares `source` in place)."""
        return self.source[: self.length]


class ReplayCache(Generic[S]):
    """The last replay of a few conversations, each under its plan inputs.

    The replay's state after a prefix depends on that prefix and on the plan's other inputs alone
    (DESIGN.md §4.7). So the state at the end of one request's replay is the state at that prefix
    for any later request that starts with the same messages and has the same inputs: that request
    resumes it, replays only its new units, and gets exactly the plan of a replay from the first
    message (tests/unit/compaction/test_replay_cache.py checks it on random growing conversations).

    An entry is keyed by every input of `plan()` but the messages and the count function, plus what
    the count function depends on besides the message (`Replays.counting`: the counter's model,
    encoding and calibration state, read before and after planning — a replay that saw it change is
    not kept). It is matched on the messages' JSON: a request's JSON starts with an entry's byte for
    byte exactly when its leading messages are the entry's (each is an object, which ends at its own
    closing brace). Bounded in entries and bytes, the least recently used first out; thread-safe
    (large plans run in worker threads).
    """

    def __init__(
        self,
        entries: int = ENTRIES,
        max_bytes: int = MAX_BYTES,
        texts: HistoryTexts | None = None,
    ) -> None:
        """`texts`: the app's (the counter's), so that what the body parser proved spares a
        comparison of the bytes; a cache of its own otherwise."""
        if entries < 1 or max_bytes < 1:
            raise ValueError("a replay cache needs room for at least one entry")
        self.texts = texts if texts is not None else HistoryTexts()
        self._entries: OrderedDict[int, Saved[S]] = OrderedDict()
        self._limit = entries
        self._max_bytes = max_bytes
        self._bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def size(self) -> int:
        """Bytes held (JSON and an estimate of the state)."""
        return self._bytes

    def find(self, key: Hashable, text: bytes) -> Saved[S] | None:
        """The entry for `key` whose messages are the longest prefix of those of `text` that at
        least one more message follows: a replay is remembered before a request's last unit,
        its units priced as ones more follow (protected outputs whole), so a request with
        exactly its messages ends in one of them and is not its continuation."""
        with self._lock:
            best: Saved[S] | None = None
            for entry in self._entries.values():
                if entry.key != key or (best is not None and entry.length <= best.length):
                    continue
                end = entry.length  # where `text` goes on with "," and the next message
                if text[end : end + 1] == b"," and self.texts.starts_with(text, entry.source, end):
                    best = entry
            if best is not None:
                self._entries.move_to_end(id(best))
            return best

    def covers(self, text: bytes, slack: int) -> bool:
        """Whether some entry's messages are the messages of `text` but at most `slack` bytes
        (whatever its plan inputs): what is left to replay is that little. The most recently
        used first: a conversation's own entry, whose text the body parser proved `text`
        extends (`starts_with`), answers before older ones whose bytes must be compared."""
        with self._lock:
            entries = list(reversed(self._entries.values()))
        return any(
            len(text) - e.length <= slack and self.texts.starts_with(text, e.source, e.length)
            for e in entries
        )

    def store(self, entry: Saved[S], replacing: Saved[S] | None = None) -> None:
        """Remember `entry`, in place of `replacing` (the entry it extends: a conversation
        keeps one entry per plan inputs); the least recently used go past the bounds."""
        with self._lock:
            if replacing is not None and self._entries.pop(id(replacing), None) is not None:
                self._bytes -= replacing.size
            self._entries[id(entry)] = entry
            self._bytes += entry.size
            while self._entries and (
                len(self._entries) > self._limit or self._bytes > self._max_bytes
            ):
                _, dropped = self._entries.popitem(last=False)
                self._bytes -= dropped.size


@dataclass(frozen=True, slots=True)
class Replays:
    """What `plan()` needs to remember replays: the cache, and what its count function answers
    with besides the message (the counter's model, encoding and calibration state)."""

    cache: ReplayCache[Any]
    counting: Callable[[], Hashable]
    keep: bool = True  # False: resume from the cache, never store in it (a what-if plan)

    def peeking(self) -> Replays:
        """The same cache, read only: for plans of a history the client has not sent (the next
        event's prediction), which must not stand for any real request's prefix."""
        return replace(self, keep=False)


@dataclass(slots=True)
class Recall:
    """One plan's use of the cache: the key and JSON of its messages, and the entry found."""

    replays: Replays
    key: Hashable
    counting: Hashable
    text: bytes
    found: Saved[Any] | None

    @classmethod
    def of(
        cls, replays: Replays | None, inputs: Hashable, messages: Sequence[Mapping[str, Any]]
    ) -> Recall | None:
        """What the cache holds for these inputs and messages (None: not cacheable)."""
        # the messages as one JSON text (how entries are matched), or None when they are not
        # plain JSON objects (such a plan is not remembered)
        text = replays.cache.texts.messages_text(messages) if replays is not None else None
        if replays is None or text is None:
            return None
        counting = replays.counting()
        key = (inputs, counting)
        return cls(replays, key, counting, text, replays.cache.find(key, text))

    def remember(self, state: Any, messages: Sequence[Mapping[str, Any]], end: int) -> None:
        """Keep `state` (no longer changed by anyone) as the replay of `messages[:end]`, unless
        the count function's state moved while planning."""
        if not self.replays.keep or self.replays.counting() != self.counting:
            return
        length = len(self.text) - len(orjson.dumps(list(messages[end:])))
        size = len(self.text) + STATE_BYTES_PER_UNIT * end
        self.replays.cache.store(Saved(self.key, self.text, length, state, size), self.found)
