"""A request's messages as one JSON text, serialised once however many parts ask for it.

The counter (its per-conversation prefix memo), the replay cache (its prefix match) and the
choice of where planning runs each read the whole history as orjson's text: three
serialisations of a 2,000-message history per request (about 0.1 ms each). The last list
serialised is kept, with the text, and recognised by identity (a list held here keeps its id);
request message lists are never changed in place. One, not a few: holding the previous
requests' histories alive made counting and planning of the next ones slower than the
serialisations saved (2,000 messages: count + plan 0.64 ms holding one, 1.4 ms holding eight),
and concurrent requests that take turns only serialise again, as every part did before.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

RECENT = 1  # lists kept

_recent: deque[tuple[Sequence[Any], bytes | None]] = deque(maxlen=RECENT)
_lock = threading.Lock()
# What the body parser proved of the last text it cut: it starts with so many bytes of each
# of a few earlier histories' texts (the bodies' bytes were compared up to there; a text
# that extends one that extends another extends both). The parts that match a history
# against those they remember ask `starts_with`, and need not compare the same bytes again:
# each comparison reads the whole history, 0.2 MB at 600 messages.
CHAIN = 8  # earlier texts known per text
# (the last text cut, {id(earlier text): (that text, bytes shared)}), or nothing
_extends: deque[tuple[bytes, dict[int, tuple[bytes, int]]]] = deque(maxlen=1)


def known_text(
    messages: Sequence[Mapping[str, Any]],
    text: bytes,
    extends: tuple[bytes, int] | None = None,
) -> None:
    """`text` is orjson's text of `messages` (cut from the body they were parsed from);
    `extends`: an earlier text and how many of its leading bytes `text` is known to share."""
    with _lock:
        _recent.append((messages, text))
        last = _extends.pop() if _extends else None
        if extends is None:
            return
        earlier, shared = extends
        chain = {id(earlier): (earlier, shared)}
        if last is not None and last[0] is earlier:
            for key, (source, length) in list(last[1].items())[: CHAIN - 1]:
                chain.setdefault(key, (source, min(length, shared)))
        _extends.append((text, chain))


def _held(messages: Sequence[Mapping[str, Any]]) -> tuple[Sequence[Any], bytes | None] | None:
    """The (list, text) kept for `messages` when it is the list last serialised."""
    with _lock:
        return next((entry for entry in _recent if entry[0] is messages), None)


def text_of(messages: Sequence[Mapping[str, Any]]) -> bytes | None:
    """The text of `messages` when it is known (the list is the one last serialised)."""
    held = _held(messages)
    return held[1] if held is not None else None


def starts_with(text: bytes, source: bytes, length: int) -> bool:
    """Whether `text` starts with the first `length` bytes of `source`: from what the body
    parser proved when it covers them, else by comparing the bytes (in place)."""
    if length > len(source) or length > len(text):
        return False
    with _lock:  # planning threads ask while the event loop's parser tells
        known = _extends[0] if _extends else None
    if known is not None and known[0] is text:
        found = known[1].get(id(source))
        if found is not None and found[0] is source and found[1] >= length:
            return True
    return text.startswith(memoryview(source)[:length])


def messages_text(messages: Sequence[Mapping[str, Any]]) -> bytes | None:
    """`messages` as orjson's text of a list, or None when they are not plain JSON objects
    (dict subclasses and other mappings are not serialised)."""
    held = _held(messages)
    if held is not None:
        return held[1]
    text: bytes | None
    try:
        text = orjson.dumps(list(messages), option=orjson.OPT_PASSTHROUGH_SUBCLASS)
    except TypeError:
        text = None
    with _lock:
        _recent.append((messages, text))
    return text
