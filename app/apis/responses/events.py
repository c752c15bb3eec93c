"""What a Responses stream states: usage in the response object of `response.completed`,
errors in `response.failed` or an `error` event, its end (a final `response.*` event)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inflight.proxy.sse_tap import Read, Usage

FINAL = frozenset({b"response.completed", b"response.failed", b"response.incomplete"})


@dataclass(frozen=True, slots=True)
class ResponsesEvents:
    """The Responses API's events, each carrying the response object or itself an error."""

    final_events: frozenset[bytes] = FINAL

    def read(self, event: dict[str, Any], own: Usage | None, carry: Usage | None) -> Read:
        response = event.get("response")
        inner = response if isinstance(response, dict) else event
        error = inner.get("error") or (event if event.get("type") == "error" else None)
        usage = Usage.from_json(inner.get("usage"))
        if usage is None:
            return Read(error=error)
        shown = None
        if carry is not None and inner is not event:  # the response object states the sum
            stated = {**inner, "usage": carry.plus(usage).as_responses(inner.get("usage"))}
            shown = {**event, "response": stated}
        return Read(usage=usage, error=error, shown=shown)


EVENTS = ResponsesEvents()
