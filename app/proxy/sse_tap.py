"""Incremental SSE reader for relayed streams: reads usage, the final event and errors."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import orjson


@dataclass(frozen=True, slots=True)
class Prefill:
    """How fast the upstream read the part of a prompt it did not have cached: llama.cpp's
    `timings` (`prompt_n` tokens at `prompt_per_second`)."""

    tokens: int
    per_second: float

    @classmethod
    def of(cls, timings: Any) -> Prefill | None:
        """From a `timings` object; None without a positive count and a finite positive rate."""
        if not isinstance(timings, dict):
            return None
        tokens, rate = int_or_none(timings.get("prompt_n")), timings.get("prompt_per_second")
        if tokens is None or tokens <= 0 or isinstance(rate, bool):
            return None
        if not isinstance(rate, int | float) or not math.isfinite(rate) or rate <= 0:
            return None
        return cls(tokens, float(rate))


@dataclass(slots=True)
class Usage:
    """Token usage as the upstream reported it."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    cache_write_tokens: int | None = None  # Anthropic's cache writes (part of the prompt)
    # each round's usage when this is the sum of several (restore's, by `plus`), in order
    rounds: tuple[Usage, ...] = field(default=(), compare=False, repr=False)
    # one answer's prefill speed, when the upstream states it (llama.cpp's `timings`)
    prefill: Prefill | None = field(default=None, compare=False, repr=False)

    @classmethod
    def from_json(cls, usage: Any) -> Usage | None:
        if not isinstance(usage, dict):
            return None
        if "prompt_tokens" not in usage and "input_tokens" in usage:
            return cls.from_responses(usage)
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        return cls(
            int_or_none(usage.get("prompt_tokens")),
            int_or_none(usage.get("completion_tokens")),
            int_or_none(cached),
        )

    @classmethod
    def from_responses(cls, usage: dict[str, Any]) -> Usage:
        """OpenAI Responses API usage: `input_tokens` (cached ones included), `output_tokens`."""
        details = usage.get("input_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        return cls(
            int_or_none(usage.get("input_tokens")),
            int_or_none(usage.get("output_tokens")),
            int_or_none(cached),
        )

    @classmethod
    def from_anthropic(cls, usage: Any) -> Usage | None:
        """Anthropic Messages usage: the prompt is `input_tokens` (what missed the cache) plus
        `cache_read_input_tokens` plus `cache_creation_input_tokens`."""
        if not isinstance(usage, dict):
            return None
        fresh = int_or_none(usage.get("input_tokens"))
        read = int_or_none(usage.get("cache_read_input_tokens"))
        written = int_or_none(usage.get("cache_creation_input_tokens"))
        parts = [n for n in (fresh, read, written) if n is not None]
        return cls(
            sum(parts) if parts else None,
            int_or_none(usage.get("output_tokens")),
            read,
            written,
        )

    def plus(self, other: Usage | None) -> Usage:
        """The sum of two requests' usage (restore's rounds); a count neither knows stays
        unknown."""
        if other is None:
            return self

        def add(a: int | None, b: int | None) -> int | None:
            return None if a is None and b is None else (a or 0) + (b or 0)

        return Usage(
            add(self.prompt_tokens, other.prompt_tokens),
            add(self.completion_tokens, other.completion_tokens),
            add(self.cached_tokens, other.cached_tokens),
            add(self.cache_write_tokens, other.cache_write_tokens),
            (self.rounds or (self,)) + (other.rounds or (other,)),
        )

    def after(self, earlier: Usage) -> Usage:
        """The last round of this sum (a JSON answer states every round's usage at once):
        what it counts beyond `earlier`, the rounds before it."""

        def less(a: int | None, b: int | None) -> int | None:
            return None if a is None else max(0, a - (b or 0))

        return Usage(
            less(self.prompt_tokens, earlier.prompt_tokens),
            less(self.completion_tokens, earlier.completion_tokens),
            less(self.cached_tokens, earlier.cached_tokens),
            less(self.cache_write_tokens, earlier.cache_write_tokens),
        )

    def as_chat(self, original: Any) -> dict[str, Any]:
        """A chat `usage` object: `original` (the upstream's, other fields kept) with these
        counts."""
        out = dict(original) if isinstance(original, dict) else {}
        prompt, completion = self.prompt_tokens or 0, self.completion_tokens or 0
        out.update(
            prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion
        )
        details = out.get("prompt_tokens_details")
        if self.cached_tokens is not None and isinstance(details, dict):
            out["prompt_tokens_details"] = {**details, "cached_tokens": self.cached_tokens}
        return out

    def as_responses(self, original: Any) -> dict[str, Any]:
        """A Responses `usage` object: `original` (other fields kept) with these counts."""
        out = dict(original) if isinstance(original, dict) else {}
        prompt, completion = self.prompt_tokens or 0, self.completion_tokens or 0
        out.update(input_tokens=prompt, output_tokens=completion, total_tokens=prompt + completion)
        details = out.get("input_tokens_details")
        if self.cached_tokens is not None and isinstance(details, dict):
            out["input_tokens_details"] = {**details, "cached_tokens": self.cached_tokens}
        return out

    def updated(self, later: Usage) -> Usage:
        """This usage with what a later report states (a stream's `message_delta`)."""
        return Usage(
            _first(later.prompt_tokens, self.prompt_tokens),
            _first(later.completion_tokens, self.completion_tokens),
            _first(later.cached_tokens, self.cached_tokens),
            _first(later.cache_write_tokens, self.cache_write_tokens),
        )


def without_tool(holder: Any, name: str) -> dict[str, Any] | None:
    """`holder` (a Responses response object) without the tool `name` in its echoed `tools`;
    None when it has no such tool."""
    tools = holder.get("tools") if isinstance(holder, dict) else None
    if not isinstance(tools, list):
        return None
    kept = [t for t in tools if not (isinstance(t, dict) and t.get("name") == name)]
    return None if len(kept) == len(tools) else {**holder, "tools": kept}


def _first(*values: int | None) -> int | None:
    return next((v for v in values if v is not None), None)


class EventEdit(Protocol):
    """Changes a stream's events as they pass (restore drops its tool's calls)."""

    def wants(self, payload: bytes) -> bool:
        """Whether an event's data (unparsed) may need a change: only those are parsed."""
        ...

    def apply(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        """The events to send instead of `event` (`[event]`, the same object: unchanged;
        `[]`: dropped)."""
        ...


@dataclass(frozen=True, slots=True)
class Read:
    """What one parsed event of a stream states (`EventReader.read`)."""

    usage: Usage | None = None  # the stream's own usage so far, when this event states some
    error: Any = None  # the error it reports, if any
    shown: dict[str, Any] | None = None  # the event stating `carry` plus its usage (None: as is)
    usage_only: bool = False  # chat's usage-only chunk (cut when the proxy asked for it)


class EventReader(Protocol):
    """How one API's stream states its usage, its errors and its end (each API's `events.py`
    under app/apis/): the tap hands it the events that may carry usage or an error."""

    @property
    def final_events(self) -> frozenset[bytes]:
        """The `event:` names whose data line ends the answer."""
        ...

    def read(self, event: dict[str, Any], own: Usage | None, carry: Usage | None) -> Read:
        """What `event` states, given the stream's own usage so far and restore's `carry`."""
        ...


def int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(slots=True)
class SSETap:
    """Feed it upstream chunks; it returns the bytes to send to the client.

    It sees the upstream's bytes chunk by chunk and holds at most one partial line. Only lines that
    can carry usage or an error are parsed (chat's usage chunk; the response object of a Responses
    `response.completed` or `response.failed`, or its `error` event; Anthropic's `message_start` and
    `message_delta`, whose usage adds up, and its `error` event); everything else passes through
    untouched. When the proxy itself asked the upstream for usage (the client did not), the
    usage-only chunk is cut out of what the client sees. Restore's earlier rounds (`carry`) are
    added to the usage the client sees: those lines are re-encoded. The final event is chat's `data:
    [DONE]`, or the data line of a Responses (`response.completed`, `response.failed`,
    `response.incomplete`) or Anthropic (`message_stop`) final event: once it has been read the
    answer is complete. `error` holds the error a stream reported (its record is then an upstream
    error, whatever usage came before). llama.cpp's `timings` (on its usage chunk, or the last one)
    give the answer's prefill speed, kept with the usage (`Usage.prefill`).
    """

    reader: EventReader  # the API's: what its events state
    strip_usage_chunk: bool = False
    # restore's earlier rounds: added to the usage read, and the chat usage chunk the client
    # sees states the sum (the chunk is re-encoded; every other line passes untouched)
    carry: Usage | None = None
    # restore on the Responses API: its tool, taken out of every response object an event
    # echoes (those lines are re-encoded; the others pass untouched)
    hide_tool: str | None = None
    # restore: drops its tool's calls from the events (an `event:` line goes with its data)
    edit: EventEdit | None = None
    usage: Usage | None = None
    done: bool = False
    error: Any = None
    _partial: bytes = b""
    _skip_blank: bool = field(default=False)
    _final_next: bool = False  # an `event:` line named a final event; its data line ends it
    _rewritten: bytes | None = None  # the line `_observe` just read, with the summed usage
    _own: Usage | None = None  # an Anthropic stream's usage so far, without `carry`
    _event_line: bytes = b""  # with `edit`: an `event:` line held until its data is read
    _prefill: Prefill | None = None  # llama.cpp's `timings`, once read

    @property
    def _rebuild(self) -> bool:
        """Whether lines are rewritten (else every chunk passes as it came)."""
        return (
            self.strip_usage_chunk
            or self.carry is not None
            or self.hide_tool is not None
            or self.edit is not None
        )

    def feed(self, chunk: bytes) -> bytes:
        data = self._partial + chunk
        cut = data.rfind(b"\n") + 1
        complete, self._partial = data[:cut], data[cut:]
        rebuild = self._rebuild
        if not complete:
            return b"" if rebuild else chunk
        if not rebuild:
            for line in complete.splitlines():
                self._observe(line)
            return chunk
        out = bytearray()
        for line in complete.splitlines(keepends=True):
            stripped = line.rstrip(b"\r\n")
            if self._skip_blank and not stripped:
                self._skip_blank = False
                continue
            self._skip_blank = False
            if self.edit is not None:
                if stripped.startswith(b"event:"):
                    self._observe(stripped)
                    self._event_line = line
                    continue
                held, self._event_line = self._event_line, b""
                edited = self._edited(self.edit, held, stripped, line[len(stripped) :])
                if edited is not None:
                    out += edited
                    continue
                out += held
            if self._observe(stripped) and self.strip_usage_chunk:
                self._skip_blank = True
                self._rewritten = None
                continue
            if self._rewritten is not None:
                line, self._rewritten = self._rewritten + line[len(stripped) :], None
            out += line
        return bytes(out)

    def flush(self) -> bytes:
        """What is left at the end of the stream (a last line without newline)."""
        rest, self._partial = self._partial, b""
        held, self._event_line = self._event_line, b""
        if rest:
            self._observe(rest.rstrip(b"\r"))
            if self._rewritten is not None:
                rest, self._rewritten = self._rewritten, None
        return held + rest if self._rebuild else b""

    def _edited(self, edit: EventEdit, held: bytes, line: bytes, ending: bytes) -> bytes | None:
        """What to send for the data `line` (after the `event:` line `held`, if any) when
        `edit` changes its event; None when it does not."""
        if not line.startswith(b"data:") or not edit.wants(line[5:]):
            return None
        try:
            event = orjson.loads(line[5:])
        except orjson.JSONDecodeError:
            return None
        if not isinstance(event, dict):
            return None
        events = edit.apply(event)
        if len(events) == 1 and events[0] is event:
            return None
        if not events:  # dropped, with its `event:` line and the blank line that ends it
            self._skip_blank = True
            return b""
        out = bytearray()
        for k, each in enumerate(events):
            data = b"data: " + orjson.dumps(each)
            if self._observe(data) and self.strip_usage_chunk:
                self._rewritten = None
                continue
            if self._rewritten is not None:
                data, self._rewritten = self._rewritten, None
            if held:
                out += b"event: " + str(each.get("type", "")).encode() + b"\n"
            out += data + (ending if k == len(events) - 1 else b"\n\n")
        return bytes(out)

    def _hide(self, payload: bytes) -> None:
        """Take the hidden tool out of the response object an event line carries."""
        try:
            event = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return
        response = event.get("response") if isinstance(event, dict) else None
        shown = without_tool(response, self.hide_tool or "")
        if shown is None:
            return
        usage = Usage.from_json(shown.get("usage"))
        if self.carry is not None and usage is not None:  # the response states every round's
            shown["usage"] = self.carry.plus(usage).as_responses(shown.get("usage"))
        self._rewritten = b"data: " + orjson.dumps({**event, "response": shown})

    def _observe(self, line: bytes) -> bool:
        """Read one line; True when it is the usage-only chunk (to cut when stripping)."""
        if line.startswith(b"event:"):
            self._final_next = line[6:].strip() in self.reader.final_events
            return False
        if not line.startswith(b"data:"):
            return False
        payload = line[5:].strip()
        if self.hide_tool is not None and self.hide_tool.encode() in payload:
            self._hide(payload)
        if payload == b"[DONE]" or self._final_next:
            self.done = True
            if payload == b"[DONE]":
                return False
        if b'"usage"' not in payload and b'"error"' not in payload and b'"timings"' not in payload:
            return False
        try:
            event = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return False
        if not isinstance(event, dict):
            return False
        usage_only = self._read_usage(event)
        self._timings(event)
        return usage_only

    def _timings(self, event: dict[str, Any]) -> None:
        """Keep the answer's prefill speed with its usage (llama.cpp puts `timings` on the
        usage chunk, or on the last chunk when no usage was asked for)."""
        prefill = Prefill.of(event.get("timings")) or self._prefill
        self._prefill = prefill
        if prefill is not None and self.usage is not None and self.carry is None:
            self.usage = replace(self.usage, prefill=prefill)

    def _read_usage(self, event: dict[str, Any]) -> bool:
        """Read the usage or error of one parsed event; True for chat's usage-only chunk."""
        read = self.reader.read(event, self._own, self.carry)
        if read.error is not None:
            self.error = read.error
        if read.usage is not None:
            self._own = read.usage
            self.usage = read.usage if self.carry is None else self.carry.plus(read.usage)
        if read.shown is not None and self._rewritten is None:  # the client sees the sum
            self._rewritten = b"data: " + orjson.dumps(read.shown)
        return read.usage_only
