"""Anthropic Messages (`POST /v1/messages`): an `Api` through `MessagesFormat` (DESIGN.md §8).

Its own points: `x-api-key` auth, usage read from the answer and never asked for, Anthropic's error
envelope, and context editing applied for an upstream that is not Anthropic's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import orjson

from inflight.apis.anthropic.context_edits import EditedBody, apply_edits
from inflight.apis.anthropic.events import EVENTS
from inflight.apis.anthropic.format import MessagesFormat
from inflight.apis.anthropic.restore import MessagesDialect
from inflight.errors import ProxyError
from inflight.proxy.api import Api
from inflight.proxy.body import check_model_rest, parse_streamable_body
from inflight.proxy.sse_tap import EventEdit, Usage
from inflight.settings import ContextEditsMode

# Anthropic's error types by status (https://docs.anthropic.com/en/api/errors).
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    504: "timeout_error",
}


def anthropic_error_body(error: ProxyError) -> dict[str, Any]:
    """`error` in Anthropic's envelope (502 and anything unlisted is an `api_error`).

    The envelope is `{"type": "error", "error": {"type", "message"}}`.
    """
    kind = ERROR_TYPES.get(error.status_code, "api_error")
    return {"type": "error", "error": {"type": kind, "message": error.message}}


ANTHROPIC_HOST = "api.anthropic.com"


class AnthropicContextEditing:
    """Anthropic's context editing (`context_management.edits`, beta
    `context-management-2025-06-27`) on a Messages upstream that is not Anthropic's API.

    DESIGN.md §13; the edits applied are reported on the answer: the JSON message, or a
    stream's `message_delta`.
    """

    def apply(
        self, body: dict[str, Any], base_url: str, mode: ContextEditsMode
    ) -> EditedBody | None:
        """`body` with its edits applied by the proxy, when they are the proxy's to apply:
        `proxy`, or `auto` and an upstream other than Anthropic's API. None: the body goes as
        it is (no edits asked, or the upstream applies them: then the field stays, and the
        Messages view counts the prompt as the edits will leave it)."""
        if "context_management" not in body or mode is ContextEditsMode.UPSTREAM:
            return None
        if mode is ContextEditsMode.AUTO and urlsplit(base_url).hostname == ANTHROPIC_HOST:
            return None
        return apply_edits(body)

    def answer(self, content: bytes, report: dict[str, Any]) -> bytes:
        """A JSON message with the `context_management` report added (what is not a JSON
        object, or already states one, as it came)."""
        try:
            message = orjson.loads(content)
        except orjson.JSONDecodeError:
            return content
        if not isinstance(message, dict) or message.get("context_management") is not None:
            return content
        return orjson.dumps({**message, "context_management": report})

    def stream(self, report: dict[str, Any], inner: EventEdit | None) -> EventEdit:
        return ReportEdits(report, inner)


@dataclass(slots=True)
class ReportEdits:
    """An `EventEdit` adding the `context_management` report to a stream's `message_delta`
    (where Anthropic states it); `inner` (restore's) sees each event first."""

    report: dict[str, Any]
    inner: EventEdit | None = None
    _inner_wants: bool = field(default=False)

    def wants(self, payload: bytes) -> bool:
        self._inner_wants = self.inner is not None and self.inner.wants(payload)
        return self._inner_wants or b"message_delta" in payload

    def apply(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        inner = self.inner if self._inner_wants else None
        events = inner.apply(event) if inner is not None else [event]
        return [
            {**e, "context_management": self.report}
            if e.get("type") == "message_delta" and e.get("context_management") is None
            else e
            for e in events
        ]


# Requests go to `INFLIGHT_ANTHROPIC_UPSTREAM_URL` (or the model's `models.toml` upstream) with the
# key in `x-api-key`; the body is an object naming its model (what `messages` holds is the adapter's
# to judge, and only when it must rewrite it); usage is in the JSON answer and in a stream's
# `message_start` and `message_delta`, never asked for.
API = Api(
    route="/v1/messages",
    upstream_path="/messages",
    wire=MessagesFormat(),
    events=EVENTS,
    parse_body=parse_streamable_body,
    check_rest=check_model_rest,
    usage=Usage.from_anthropic,
    error_body=anthropic_error_body,
    provider="anthropic",
    restore=MessagesDialect(),
    context_edits=AnthropicContextEditing(),
)
