"""A request's messages as one JSON text, serialised once however many parts ask for it."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

RECENT = 1  # lists kept
CHAIN = 8  # earlier texts whose shared bytes are known per text


class HistoryTexts:
    """The last history serialised and what the body parser proved of it; thread-safe (the
    event loop's parser tells while planning threads ask). One per app: the counter owns it,
    and the parser, the replay cache and the choice of where planning runs share it.

    The counter (its per-conversation prefix memo), the replay cache (its prefix match) and the
    choice of where planning runs each read the whole history as orjson's text: three serialisations
    of a long history per request. The last list serialised is kept, with the text, and recognised
    by identity (a list held here keeps its id); request message lists are never changed in place.
    One, not a few: holding the previous requests' histories alive made counting and planning of the
    next ones slower than the serialisations saved, and concurrent requests that take turns only
    serialise again, as every part did before.
    """

    def __init__(self) -> None:
        self._recent: deque[tuple[Sequence[Any], bytes | None]] = deque(maxlen=RECENT)
        # What the body parser proved of the last text it cut: it starts with so many bytes
        # of each of a few earlier histories' texts (the bodies' bytes were compared up to
        # there; a text that extends one that extends another extends both). The parts that
        # match a history against those they remember ask `starts_with`, and need not compare
        # the same bytes again: each comparison reads the whole history, 0.2 MB at 600
        # messages. (The last text cut, {id(earlier text): (that text, bytes shared)}.)
        self._proof: tuple[bytes, dict[int, tuple[bytes, int]]] | None = None
        self._lock = threading.Lock()

    def known(
        self,
        messages: Sequence[Mapping[str, Any]],
        text: bytes,
        extends: tuple[bytes, int] | None = None,
    ) -> None:
        """`text` is orjson's text of `messages` (cut from the body they were parsed from);
        `extends`: an earlier text and how many of its leading bytes `text` is known to
        share."""
        with self._lock:
            self._recent.append((messages, text))
            last, self._proof = self._proof, None
            if extends is None:
                return
            earlier, shared = extends
            chain = {id(earlier): (earlier, shared)}
            if last is not None and last[0] is earlier:
                for key, (source, length) in list(last[1].items())[: CHAIN - 1]:
                    chain.setdefault(key, (source, min(length, shared)))
            self._proof = (text, chain)

    def _held(
        self, messages: Sequence[Mapping[str, Any]]
    ) -> tuple[Sequence[Any], bytes | None] | None:
        """The (list, text) kept for `messages` when it is the list last serialised."""
        with self._lock:
            return next((entry for entry in self._recent if entry[0] is messages), None)

    def text_of(self, messages: Sequence[Mapping[str, Any]]) -> bytes | None:
        """The text of `messages` when it is known (the list is the one last serialised)."""
        held = self._held(messages)
        return held[1] if held is not None else None

    def starts_with(self, text: bytes, source: bytes, length: int) -> bool:
        """Whether `text` starts with the first `length` bytes of `source`: from what the body
        parser proved when it covers them, else by comparing the bytes (in place)."""
        if length > len(source) or length > len(text):
            return False
        if source is text:  # asked again of the same request (calibrating on its answer)
            return True
        with self._lock:
            known = self._proof
        if known is not None and known[0] is text:
            found = known[1].get(id(source))
            if found is not None and found[0] is source and found[1] >= length:
                return True
        return text.startswith(memoryview(source)[:length])

    def messages_text(self, messages: Sequence[Mapping[str, Any]]) -> bytes | None:
        """`messages` as orjson's text of a list, or None when they are not plain JSON objects
        (dict subclasses and other mappings are not serialised)."""
        held = self._held(messages)
        if held is not None:
            return held[1]
        text: bytes | None
        try:
            text = orjson.dumps(list(messages), option=orjson.OPT_PASSTHROUGH_SUBCLASS)
        except TypeError:
            text = None
        with self._lock:
            self._recent.append((messages, text))
        return text
