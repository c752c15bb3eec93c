"""Token counting for chat requests: tiktoken where exact, a calibrated heuristic elsewhere.

The parts: raw counts of a message and of the rest of the prompt (raw_counts.py, images in
images.py), the last requests remembered (prefixes.py), calibration (calibration.py); this module
puts them together per request and per conversation.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, Protocol

import orjson

from inflight.jsontext import HistoryTexts
from inflight.tokens.calibration import (
    EXACT_BOUNDS,
    HEURISTIC_BOUNDS,
    Calibration,
    Correction,
    Observation,
)
from inflight.tokens.encodings import EncodingSet, bare_model
from inflight.tokens.prefixes import Prefix, Prefixes
from inflight.tokens.raw_counts import ModelEncodings, RawCounter


class TokenCounter(Protocol):
    """What the rest of the app needs from token counting."""

    texts: HistoryTexts  # the last history serialised (shared with who else reads it)

    def count_message(self, model: str, message: Mapping[str, Any]) -> int: ...

    def count_messages(
        self, model: str, messages: Sequence[Mapping[str, Any]]
    ) -> Sequence[int]: ...

    def count_fixed(self, model: str, body: Mapping[str, Any]) -> int: ...

    def count_request(self, model: str, body: Mapping[str, Any]) -> int: ...

    def count_text(self, model: str, text: str) -> int: ...

    def encoding_name(self, model: str) -> str | None: ...

    def is_exact(self, model: str) -> bool: ...

    def observe(
        self,
        model: str,
        sent: Mapping[str, Any],
        actual: int,
        *,
        overflowed: bool = False,
        client: str = "",
    ) -> None: ...

    def guessed_tokens(self, model: str, body: Mapping[str, Any]) -> int: ...

    def calibration_factors(self) -> dict[str, float]: ...

    def counting(self, model: str) -> Hashable: ...


class ChatTokenCounter(RawCounter):
    """The counter used by the proxy: exact where tiktoken knows the family, else heuristic.

    Thread-safe; all state (the per-message LRU, per-model encodings, calibration, the last
    history serialised: `texts`, which the app's other readers of histories share) is this
    instance's.

    Counts follow OpenAI's accounting (3 tokens per message, 1 per name, 3 to prime the reply), with
    tool calls, tool definitions, `response_format` schemas, images by `detail` and the reasoning
    fields clients send back. Only `encode_ordinary` is used: user text may contain `<|endoftext|>`
    and must be counted as text. Every model is corrected by the upstream's own prompt tokens
    (app/tokens/calibration.py).
    """

    def __init__(
        self,
        encodings: EncodingSet,
        model_table: ModelEncodings | None = None,
        cache_size: int = 50_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`clock`: the calibration's (wall time where replicas share it, their clocks one)."""
        super().__init__(encodings, model_table, cache_size)
        self._calibration = Calibration(clock=clock)
        self._prefixes = Prefixes()
        self.texts = HistoryTexts()

    # -- raw counts of a conversation (its last request remembered) ----------------------------
    def raw_messages(
        self, encoding: str | None, messages: Sequence[Mapping[str, Any]], model: str = ""
    ) -> Sequence[int]:
        """`raw_message` of each message. The leading messages byte-identical (as orjson
        writes them) to the last request of the same conversation take its counts: one
        serialisation of the whole list and a few prefix comparisons, not a key per message."""
        return self._counts(encoding, messages, model, None)

    def _counts(
        self,
        encoding: str | None,
        messages: Sequence[Mapping[str, Any]],
        model: str,
        fix: Correction | None,
    ) -> Sequence[int]:
        """Raw counts (`fix` None) or counts calibrated with `fix`, taking those of the leading
        messages the conversation's last request had (calibrated too when `fix` is the same).

        The remembered counts are machine-integer arrays, taken over by a copy of their bytes:
        a list or tuple of them would touch each count's object on every request, and on a
        loaded machine each touch of a long history's objects is a cache miss."""
        # dict subclasses and other mappings are not serialised: counted one by one
        text = self.texts.messages_text(messages) or b""
        if not text:
            each = [self.raw_message(encoding, m, model) for m in messages]
            if fix is None:
                return each
            return [_whole(fix.content * r + fix.per_message) for r in each]
        scope = f"{encoding or '~'}|{bare_model(model)}"
        calibrated = fix is not None
        with self._lock:
            known, shared = self._prefixes.longest(scope, text, self.texts)
        entry = Prefix(scope, text) if known is None else known
        ends, raw = entry.ends[:shared], entry.raw[:shared]
        added = messages[shared:]
        for message in added:
            data = orjson.dumps(message)  # the bytes it has in `text`
            ends.append((ends[-1] if ends else 0) + 1 + len(data))
            raw.append(self._raw(encoding, message, model, data))
        if fix is None:  # raw counts: the calibrated ones known stay, for the next request
            fix, counted, changed = entry.fix, entry.counted[:shared], False
        else:
            reused = min(shared, len(entry.counted)) if fix == entry.fix else 0
            counted = entry.counted[:reused]
            counted.extend(_whole(fix.content * r + fix.per_message) for r in raw[reused:])
            changed = reused < len(raw)
        if added or changed:
            extended = known if known is not None and shared == len(known.ends) else None
            new = Prefix(scope, text, ends, raw, fix, counted)
            with self._lock:
                self._prefixes.replace(extended, new)
        return raw if not calibrated else counted

    def raw_request(self, model: str, body: Mapping[str, Any]) -> int:
        """Uncalibrated tokens of a whole request body."""
        encoding = self.encoding_name(model)
        counted = _messages_of(body)
        return self.raw_fixed(encoding, body) + sum(self.raw_messages(encoding, counted, model))

    # -- calibrated counts (the protocol) ----------------------------------------------------
    def _correction(self, model: str) -> Correction:
        return self._calibration.correction(model)

    def count_message(self, model: str, message: Mapping[str, Any]) -> int:
        raw = self.raw_message(self.encoding_name(model), message, model)
        fix = self._correction(model)
        return _whole(fix.content * raw + fix.per_message)

    def count_messages(self, model: str, messages: Sequence[Mapping[str, Any]]) -> Sequence[int]:
        """`count_message` of each message, counting only what the conversation added."""
        return self._counts(self.encoding_name(model), messages, model, self._correction(model))

    def count_fixed(self, model: str, body: Mapping[str, Any]) -> int:
        """The prompt outside the messages, with the template's cost per request."""
        raw = self.raw_fixed(self.encoding_name(model), body)
        fix = self._correction(model)
        default_system = 0.0 if has_system(body) else fix.without_system
        preamble = fix.with_tools if has_tools(body) else 0.0
        # each message adds `per_message`; `per_request` already holds the first one's
        fixed = fix.per_request - fix.per_message + default_system + preamble
        return _whole(fix.content * raw + fixed)

    def count_request(self, model: str, body: Mapping[str, Any]) -> int:
        """sum(count_message) + count_fixed."""
        return self.count_fixed(model, body) + sum(self.count_messages(model, _messages_of(body)))

    def count_text(self, model: str, text: str) -> int:
        """Tokens of plain text for `model` (calibrated content, no framing)."""
        return _whole(self._text(self.encoding_name(model), text) * self._correction(model).content)

    # -- calibration -------------------------------------------------------------------------
    def observe(
        self,
        model: str,
        sent: Mapping[str, Any],
        actual: int,
        *,
        overflowed: bool = False,
        client: str = "",
    ) -> None:
        """Calibrate on the upstream's count (`actual`) of the request body `sent` (recounted
        raw, cheap through the cache), for `client` (its identity: one client's requests move
        the correction every client's counts use only so far). `overflowed`: the count came from
        an overflow error, so the correction applies at once and counts this body at least that
        big. A body with guessed parts (images, documents, files, audio) teaches nothing: what
        the upstream made of them is not told apart from what it made of the text."""
        if self.raw_guessed(model, sent):
            return
        observation = Observation(
            raw=float(self.raw_request(model, sent)),
            messages=len(_messages_of(sent)),
            actual=float(actual),
            system=has_system(sent),
            tools=has_tools(sent),
        )
        bounds = EXACT_BOUNDS if self.is_exact(model) else HEURISTIC_BOUNDS
        self._calibration.observe(model, observation, bounds, overflowed=overflowed, client=client)

    def guessed_tokens(self, model: str, body: Mapping[str, Any]) -> int:
        """How many tokens of `body`'s count are guessed, not measured (`raw_guessed`,
        calibrated)."""
        return _whole(self.raw_guessed(model, body) * self._correction(model).content)

    def counting(self, model: str) -> Hashable:
        """What `model`'s counts depend on besides the message: the encoding and the
        calibration state (a remembered plan is keyed by it, app/compaction/replays.py)."""
        return (model, self.encoding_name(model), *self._calibration.state(model))

    @property
    def calibrated(self) -> Calibration:
        """The calibration itself (replicas share its state: app/windows/shared.py)."""
        return self._calibration

    def calibration_factors(self) -> dict[str, float]:
        """The per-model factor on content learned so far (for /stats and /metrics)."""
        return {m: c.content for m, c in self._calibration.corrections().items()}

    def calibration(self) -> dict[str, dict[str, float]]:
        """The whole per-model correction: factor on content, tokens per message, per request,
        per request without a system message and with tools (for /stats)."""
        return {m: c.as_dict() for m, c in self._calibration.corrections().items()}


def _messages_of(body: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The body's messages that are objects (all of them, checked at C speed, as a rule)."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return []
    if set(map(type, messages)) <= {dict}:
        return messages
    return [m for m in messages if isinstance(m, Mapping)]


def has_system(body: Mapping[str, Any]) -> bool:
    """True when the request opens with a system prompt — a system (or developer) message, or
    top-level `instructions` (Responses) or `system` (Messages): templates such as Qwen's
    insert a default system prompt otherwise."""
    if body.get("instructions") or body.get("system"):  # Responses, Messages
        return True
    messages = body.get("messages")
    first = messages[0] if isinstance(messages, list) and messages else None
    return isinstance(first, Mapping) and first.get("role") in ("system", "developer")


def has_tools(body: Mapping[str, Any]) -> bool:
    """True when the request defines tools (templates put a tool-use preamble before them)."""
    return any(isinstance(body.get(k), list) and body[k] for k in ("tools", "functions"))


def _whole(tokens: float) -> int:
    """A calibrated count in whole tokens, never negative. Rounded to the nearest: rounding
    each message up would add half a token per message on average, a bias that grows with
    the conversation (and that calibration, fitted on unrounded sums, would not see)."""
    return max(0, math.floor(tokens + 0.5))


class Counted:
    """A request's counts: its messages' for `count_within`, all of them counted at once on
    first use, then found by the message's identity, and its fixed part's. Messages are
    indexed from the newest back, a widening stretch at a time, as lookups need: a
    conversation's next request mostly looks up the few messages it added, and indexing all
    of them cost more than its plan."""

    __slots__ = ("counts", "fixed", "ids", "start")

    def __init__(self) -> None:
        self.counts: Sequence[int] | None = None
        self.fixed: int | None = None  # `count_fixed` of the request, once counted
        self.ids: dict[int, int] = {}  # id of a message -> its index
        self.start = 0  # messages from here on are indexed

    def index_of(
        self, messages: Sequence[Mapping[str, Any]], message: Mapping[str, Any]
    ) -> int | None:
        """Where `message` (the object) is in `messages`; None when it is not there."""
        found = self.ids.get(id(message))
        while found is None and self.start > 0:
            begin = max(0, self.start - max(16, len(self.ids)))
            stretch = range(begin, self.start)
            self.ids.update(zip(map(id, messages[begin : self.start]), stretch, strict=True))
            self.start = begin
            found = self.ids.get(id(message))
        return found


def count_within(
    counter: TokenCounter,
    model: str,
    messages: Sequence[Mapping[str, Any]],
    memo: Counted,
    message: Mapping[str, Any],
) -> int:
    """`count_message` of `message`, one of a request's `messages` or a copy made of one. The
    first call counts all of `messages` at once (`count_messages`: only what the conversation
    added since its last request) into `memo`, whose messages are found by identity: whoever
    holds `memo` holds `messages` too, so while it lives no other object can have one of
    their ids. A copy is counted on its own."""
    counts = counts_within(counter, model, messages, memo)
    found = memo.index_of(messages, message)
    return counter.count_message(model, message) if found is None else counts[found]


def counts_within(
    counter: TokenCounter, model: str, messages: Sequence[Mapping[str, Any]], memo: Counted
) -> Sequence[int]:
    """`count_message` of each of a request's `messages`, counted into `memo` on first use
    (`count_messages`: only what the conversation added since its last request)."""
    if memo.counts is None:
        memo.counts = counter.count_messages(model, messages)
        memo.start = len(messages)
    return memo.counts
