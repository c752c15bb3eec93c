"""A conversation's next request parsed from its last one: only the bytes it adds.

Agents send the whole conversation on every request, so request n+1 starts with the bytes of
request n's history. Parsing all of it again is the largest cost the proxy adds to a long
conversation (2,000 messages: about 2 ms), and the one part of its own work that could not be
incremental. So a body's parse is remembered with where each item of its history array
(`messages`, or `input` for the Responses API) ends in its bytes; a later body that starts with
the same bytes up to the end of item k takes the first k items as they were parsed and parses
only the rest. The rest is the bytes after item k, completed into a JSON object
(`{"messages":[` + rest): its new items and the keys after the array.

Where items end is known only when the bytes are orjson's compact text of what they parse to
(no spaces, keys in order, UTF-8 unescaped: what the openai and anthropic SDKs, httpx and
`JSON.stringify` send); other bodies are parsed in full, every time. The rest must be that text
too, so the body is exactly the one a full parse gives (tests/test_reuse.py checks it on random
bodies and edits). Reused items are the very objects parsed before, shared by the requests of a
conversation: nothing may change a parsed body in place (the tests check that too).

Bounded in bodies and bytes, least recently used first out; a body is found by its first bytes,
and among the few sharing them, by the longest match.
"""

from __future__ import annotations

import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

ENTRIES = 64  # conversations remembered
MAX_BYTES = 64 * 1024 * 1024  # their bodies, counted at 4x their bytes (the parsed objects)
PARSED_FACTOR = 4
PROBE = 512  # the leading bytes a body is found by
PER_PROBE = 8  # bodies kept with the same leading bytes (conversations of one agent)


@dataclass(slots=True)
class _Body:
    """One remembered body: its bytes, what they parse to, and where each history item ends
    (computed on first use; None: not canonical, never reusable)."""

    raw: bytes
    body: dict[str, Any]
    ends: array[int] | None = None
    checked: bool = False
    size: int = field(default=0)
    opened: int = 0  # where the history's first item starts (right after its `[`)


@dataclass(frozen=True, slots=True)
class Reused:
    """A body parsed from a remembered one: `body` (a new dict; its first `reused` history
    items are the remembered objects) and `rest`, the part parsed now, as an object with the
    new items under the array's key and the keys that follow the array."""

    body: dict[str, Any]
    reused: int
    rest: dict[str, Any]
    ends: array[int]  # where every item of the new bytes' history ends
    opened: int  # where its first item starts (right after its `[`)
    entry: _Body  # the remembered body it extends

    def history_text(self, raw: bytes) -> bytes:
        """The history array's JSON text (orjson's text of it), cut from `raw`."""
        return raw[self.opened - 1 : self.ends[-1] + 1]


class ParsedBodies:
    """Remembered parses of one API's bodies, whose history is the array under `key`."""

    def __init__(self, key: str, entries: int = ENTRIES, max_bytes: int = MAX_BYTES) -> None:
        self._key = self.key = key
        self._opening = b"{" + orjson.dumps(key) + b":["
        self._entries: OrderedDict[int, _Body] = OrderedDict()
        self._by_probe: dict[bytes, list[_Body]] = {}
        self._limit = entries
        self._max_bytes = max_bytes
        self._bytes = 0
        self._lock = threading.Lock()
        self.reused = 0  # bodies parsed from a remembered one

    def __len__(self) -> int:
        return len(self._entries)

    def parse(self, raw: bytes) -> Reused | None:
        """`raw` parsed from the remembered body it extends, or None (parse it in full). A
        rest that is not valid JSON is None too: the full parse says what is wrong."""
        with self._lock:
            candidates = list(self._by_probe.get(raw[:PROBE], ()))
        best: tuple[_Body, int] | None = None
        for entry in candidates:  # the most recent first
            ends = self._ends(entry)
            if not ends:
                continue
            k = _matching(raw, entry.raw, ends)
            if k and (best is None or k > best[1]):
                best = (entry, k)
            if k == len(ends):
                break  # all of it: the conversation's last request
        if best is None:
            return None
        entry, k = best
        assert entry.ends is not None
        end = entry.ends[k - 1]
        rest_at = end + 1 if raw[end : end + 1] == b"," else end
        rest_text = self._opening + raw[rest_at:]
        try:
            rest = orjson.loads(rest_text)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(rest, dict) or not isinstance(rest.get(self._key), list):
            return None
        if orjson.dumps(rest) != rest_text:  # not canonical: where it ends is not known
            return None
        with self._lock:
            self._touch(entry)
            self.reused += 1
        items = entry.body[self._key]
        body: dict[str, Any] = {}
        for name, value in entry.body.items():  # the keys before the array, then the array
            if name == self._key:
                break
            body[name] = value
        body[self._key] = items[:k] + rest[self._key]
        for name, value in rest.items():
            if name != self._key:
                body[name] = value
        ends = entry.ends[:k]
        ends.extend(_item_ends(rest[self._key], rest_at, orjson.dumps))
        return Reused(body, k, rest, ends, entry.opened, entry)

    def remember(self, raw: bytes, body: dict[str, Any], reused: Reused | None = None) -> None:
        """Keep `body` (parsed from `raw`, checked) for the requests that extend it. Where its
        items end is worked out when first needed, from `reused`'s when it was parsed so."""
        items = body.get(self._key)
        if not isinstance(items, list) or not items or len(raw) < PROBE:
            return
        entry = _Body(raw, body, size=len(raw) * PARSED_FACTOR)
        extended = None
        if reused is not None:
            entry.ends, entry.opened, entry.checked = reused.ends, reused.opened, True
            extended = reused.entry if reused.reused == len(reused.entry.ends or ()) else None
        with self._lock:
            if extended is not None:  # a conversation keeps its last request (not a branch)
                self._drop(extended)
            self._entries[id(entry)] = entry
            self._bytes += entry.size
            same = self._by_probe.setdefault(raw[:PROBE], [])
            same.insert(0, entry)
            if len(same) > PER_PROBE:
                self._drop(same[-1])
            while self._entries and (
                len(self._entries) > self._limit or self._bytes > self._max_bytes
            ):
                self._drop(next(iter(self._entries.values())))

    def intact(self) -> bool:
        """Whether every remembered body still is what its bytes parse to (nothing changed a
        shared object in place): for the tests."""
        with self._lock:
            entries = list(self._entries.values())
        return all(orjson.loads(e.raw) == e.body for e in entries)

    def _ends(self, entry: _Body) -> array[int] | None:
        """Where each item of `entry`'s history ends in its bytes (once: None when its bytes
        are not orjson's text of its body)."""
        if not entry.checked:
            entry.checked = True
            try:
                if orjson.dumps(entry.body) != entry.raw:
                    return None
            except TypeError:
                return None
            before: dict[str, Any] = {}
            for name, value in entry.body.items():
                if name == self._key:
                    break
                before[name] = value
            entry.opened = len(orjson.dumps({**before, self._key: []})) - 2  # `{…,"key":[]}`
            entry.ends = _item_ends(entry.body[self._key], entry.opened, orjson.dumps)
        return entry.ends

    def _touch(self, entry: _Body) -> None:
        if id(entry) in self._entries:
            self._entries.move_to_end(id(entry))

    def _drop(self, entry: _Body) -> None:
        if self._entries.pop(id(entry), None) is None:
            return
        self._bytes -= entry.size
        same = self._by_probe.get(entry.raw[:PROBE], [])
        if entry in same:
            same.remove(entry)
        if not same:
            self._by_probe.pop(entry.raw[:PROBE], None)


def _item_ends(items: list[Any], start: int, dumps: Callable[[Any], bytes]) -> array[int]:
    """Where each of `items` ends, their canonical texts laid out from `start`, one comma
    between two (machine integers: the next request copies them as bytes, touching no
    object per item)."""
    ends, position = array("q"), start
    for item in items:
        position += len(dumps(item))
        ends.append(position)
        position += 1
    return ends


def _matching(raw: bytes, old: bytes, ends: array[int]) -> int:
    """How many leading items of `old` (ending at `ends`) `raw` starts with, byte for byte,
    followed by another item or the array's end."""

    view = memoryview(old)  # compared in place: no copy of either

    def same(k: int) -> bool:
        end = ends[k - 1]
        return raw[end : end + 1] in (b",", b"]") and raw.startswith(view[:end])

    n = len(ends)
    if same(n):
        return n
    low, high = 0, n - 1  # same(low) holds (0: nothing), same(high + 1) does not
    while low < high:
        middle = (low + high + 1) // 2
        if same(middle):
            low = middle
        else:
            high = middle - 1
    return low
