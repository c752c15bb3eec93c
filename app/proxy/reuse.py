"""A conversation's next request parsed from its last one: only the bytes it adds.

Bodies whose bytes are orjson's text of their parse are remembered per client (a hash of its
credentials and route); that client's next body reuses the history items it shares byte for
byte and is taken only when its bytes provably are orjson's text of the result (`ParsedBodies`).
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
    """One remembered body: whose it is, its bytes, what they parse to, and where each history
    item ends (computed on first use; None: not canonical, never reusable)."""

    owner: bytes
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
    """Remembered parses of one API's bodies, whose history is the array under `key`.

    Agents send the whole conversation on every request, so request n+1 starts with the bytes
    of request n; parsing all of it again is the largest cost the proxy adds to a long
    conversation. A remembered body is reusable only when its bytes are exactly
    `orjson.dumps` of its parse (canonical: no spaces, no duplicate keys, no trailing commas,
    UTF-8 unescaped: what the SDKs, httpx and `JSON.stringify` send); then where each history
    item ends is known. A new body of the same owner that starts with its bytes up to the end
    of item k is parsed as: its keys before the array and those k items from the remembered
    body (byte-identical and canonical there), the rest (`{"key":[` + the bytes after item k)
    parsed now. That is taken only when the new bytes are orjson's text of the result, shown
    without serialising it (`_combined`); anything else is parsed in full. Equal to
    `orjson.loads` on every input: tests/unit/proxy/test_reuse_differential.py checks it.

    Remembered bodies are found by their owner (`inflight.proxy.body.body_owner`: a hash of the
    client's credentials and route, so nothing one client sent is reused for another) and
    first bytes, among the few sharing
    them by the longest match; bounded in bodies and bytes, least recently used first out.
    Reused items are the very objects parsed before: nothing may change a parsed body in place.
    """

    def __init__(self, key: str, entries: int = ENTRIES, max_bytes: int = MAX_BYTES) -> None:
        self._key = self.key = key
        self._opening = b"{" + orjson.dumps(key) + b":["
        self._entries: OrderedDict[int, _Body] = OrderedDict()
        self._by_probe: dict[tuple[bytes, bytes], list[_Body]] = {}
        self._limit = entries
        self._max_bytes = max_bytes
        self._bytes = 0
        self._lock = threading.Lock()
        self.reused = 0  # bodies parsed from a remembered one

    def __len__(self) -> int:
        return len(self._entries)

    def parse(self, raw: bytes, owner: bytes) -> Reused | None:
        """`raw`, sent by `owner`, parsed from a remembered body of the same owner it extends,
        or None (parse it in full): whenever the result could differ from `orjson.loads(raw)`,
        and for a rest that is not valid JSON (the full parse says what is wrong)."""
        with self._lock:
            candidates = list(self._by_probe.get((owner, raw[:PROBE]), ()))
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
        rest = self._rest(raw[rest_at:])
        if rest is None:
            return None
        body = self._combined(entry, k, rest, comma=rest_at > end)
        if body is None:
            return None
        with self._lock:
            self._touch(entry)
            self.reused += 1
        ends = entry.ends[:k]
        ends.extend(_item_ends(rest[self._key], rest_at, orjson.dumps))
        return Reused(body, k, rest, ends, entry.opened, entry)

    def _rest(self, tail: bytes) -> dict[str, Any] | None:
        """The bytes after the last item reused, completed into an object (`{"key":[` +
        `tail`) and parsed, when that is orjson's text of an object with the array under
        `key` (then no key repeats in it, and the array's key comes first)."""
        text = self._opening + tail
        try:
            rest = orjson.loads(text)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(rest, dict) or not isinstance(rest.get(self._key), list):
            return None
        return rest if orjson.dumps(rest) == text else None

    def _combined(
        self, entry: _Body, k: int, rest: dict[str, Any], *, comma: bool
    ) -> dict[str, Any] | None:
        """The body of bytes that are `entry`'s up to the end of its history's item k, then
        (after a `comma`, or none) the text of `rest` without its `{"key":[`; or None unless
        those bytes are exactly `orjson.dumps` of it, so they parse to it.

        Why that holds: `entry`'s bytes are orjson's text of its body, `{B"key":[I0,…,Ik-1`
        up to there (B: its keys before the array, each `"name":value,`); the rest's text is
        `{"key":[` + `N0,…]` (its new items N, maybe none) + `,A}` or `}` (A: its keys after
        the array, none of them `key`). The new bytes are then `{B"key":[I0,…,Ik-1` + comma
        + `N0,…],A}`: orjson's text of {B, key: I[:k] + N, A} exactly when the comma is there
        if and only if N is not empty (`…,]`: a trailing comma, invalid), and no name of A is
        one of B (a repeated key: orjson keeps one)."""
        new = rest[self._key]
        if comma != bool(new):
            return None
        body: dict[str, Any] = {}
        for name, value in entry.body.items():  # the keys before the array, then the array
            if name == self._key:
                break
            body[name] = value
        if any(name in body for name in rest if name != self._key):
            return None
        body[self._key] = entry.body[self._key][:k] + new
        for name, value in rest.items():
            if name != self._key:
                body[name] = value
        return body

    def remember(
        self, raw: bytes, body: dict[str, Any], owner: bytes, reused: Reused | None = None
    ) -> None:
        """Keep `body` (parsed from `raw`, sent by `owner`, checked) for that owner's requests
        that extend it. Whether its bytes are canonical and where its items end are worked out
        when first needed, or are known from `reused` when it was parsed so (proven there)."""
        items = body.get(self._key)
        if not isinstance(items, list) or not items or len(raw) < PROBE:
            return
        if reused is not None and reused.entry.owner != owner:
            raise ValueError("a body parsed from another owner's is remembered for this one")
        entry = _Body(owner, raw, body, size=len(raw) * PARSED_FACTOR)
        extended = None
        if reused is not None:
            entry.ends, entry.opened, entry.checked = reused.ends, reused.opened, True
            extended = reused.entry if reused.reused == len(reused.entry.ends or ()) else None
        with self._lock:
            if extended is not None:  # a conversation keeps its last request (not a branch)
                self._drop(extended)
            self._entries[id(entry)] = entry
            self._bytes += entry.size
            same = self._by_probe.setdefault((owner, raw[:PROBE]), [])
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
        probe = (entry.owner, entry.raw[:PROBE])
        same = self._by_probe.get(probe, [])
        if entry in same:
            same.remove(entry)
        if not same:
            self._by_probe.pop(probe, None)


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
