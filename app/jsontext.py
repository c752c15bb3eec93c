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


def known_text(messages: Sequence[Mapping[str, Any]], text: bytes) -> None:
    """`text` is orjson's text of `messages` (cut from the body they were parsed from)."""
    with _lock:
        _recent.append((messages, text))


def messages_text(messages: Sequence[Mapping[str, Any]]) -> bytes | None:
    """`messages` as orjson's text of a list, or None when they are not plain JSON objects
    (dict subclasses and other mappings are not serialised)."""
    with _lock:
        for held, known in _recent:
            if held is messages:
                return known
    text: bytes | None
    try:
        text = orjson.dumps(list(messages), option=orjson.OPT_PASSTHROUGH_SUBCLASS)
    except TypeError:
        text = None
    with _lock:
        _recent.append((messages, text))
    return text
