"""What a Messages stream states: usage in `message_start`, completed by each `message_delta`,
errors in an `error` event, its end (`message_stop`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inflight.proxy.sse_tap import Read, Usage, int_or_none

ANTHROPIC_COUNTS = (
    "input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"
)  # fmt: skip


def anthropic_counts(usage: Usage) -> tuple[int, int, int, int]:
    """`usage` as Anthropic's four counts, in `ANTHROPIC_COUNTS` order."""
    read, written = usage.cached_tokens or 0, usage.cache_write_tokens or 0
    fresh = (usage.prompt_tokens or 0) - read - written
    return fresh, usage.completion_tokens or 0, read, written


def anthropic_summed(event: dict[str, Any], carry: Usage) -> dict[str, Any]:
    """An Anthropic `message_start` or `message_delta` event stating `carry` (restore's earlier
    rounds) plus its own usage. Each count the event states becomes the sum; `message_start`
    also states the cache counts `carry` has and it does not. Clients overwrite the usage of
    `message_start` with each count a `message_delta` states (the anthropic SDK does), so the
    message they assemble states the sum of every round."""
    start = event.get("type") == "message_start"
    holder = event.get("message") if start else event
    if not isinstance(holder, dict) or not isinstance(holder.get("usage"), dict):
        return event
    usage = dict(holder["usage"])
    for key, earlier in zip(ANTHROPIC_COUNTS, anthropic_counts(carry), strict=True):
        own = int_or_none(usage.get(key))
        if own is not None or (start and earlier):
            usage[key] = (own or 0) + earlier
    holder = {**holder, "usage": usage}
    return {**event, "message": holder} if start else holder


@dataclass(frozen=True, slots=True)
class AnthropicEvents:
    """Anthropic's events: the usage of `message_start` (inside the message) adds up with what
    each `message_delta` states (output tokens; on newer servers the prompt's parts too)."""

    final_events: frozenset[bytes] = frozenset({b"message_stop"})

    def read(self, event: dict[str, Any], own: Usage | None, carry: Usage | None) -> Read:
        kind = event.get("type")
        if kind not in ("message_start", "message_delta"):
            error = event.get("error") or (event if kind == "error" else None)
            return Read(error=error)
        holder = event.get("message") if kind == "message_start" else event
        usage = Usage.from_anthropic(holder.get("usage") if isinstance(holder, dict) else None)
        if usage is not None and own is not None:
            usage = own.updated(usage)
        # the client's view states every round's usage (restore's earlier rounds in `carry`)
        shown = anthropic_summed(event, carry) if carry is not None else None
        return Read(usage=usage, shown=shown)


EVENTS = AnthropicEvents()
