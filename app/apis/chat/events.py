"""What a chat completions stream states: usage in its usage chunk, errors, its end (`[DONE]`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inflight.proxy.sse_tap import Read, Usage


@dataclass(frozen=True, slots=True)
class ChatEvents:
    """Chat's chunks: usage on the last one (`stream_options.include_usage`; alone, without
    `choices`, in OpenAI's), an `error` object on a failed one; `data: [DONE]` ends it."""

    final_events: frozenset[bytes] = frozenset()

    def read(self, event: dict[str, Any], own: Usage | None, carry: Usage | None) -> Read:
        error = event.get("error") or (event if event.get("type") == "error" else None)
        usage = Usage.from_json(event.get("usage"))
        if usage is None:
            return Read(error=error)
        shown = None
        if carry is not None:  # the usage chunk states every round's sum
            shown = {**event, "usage": carry.plus(usage).as_chat(event.get("usage"))}
        usage_only = not event.get("choices") and "type" not in event
        return Read(usage=usage, error=error, shown=shown, usage_only=usage_only)


EVENTS = ChatEvents()
