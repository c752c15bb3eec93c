"""Anthropic Messages (`POST /v1/messages`): an `Api` through `MessagesFormat` (DESIGN.md §8).

Its own points: requests go to `INFLIGHT_ANTHROPIC_UPSTREAM_URL` (or the model's `models.toml`
upstream) with the key in `x-api-key`; the body is an object naming its model (what `messages`
holds is the adapter's to judge, and only when it must rewrite it); usage is in the JSON answer
and in a stream's `message_start` and `message_delta`, never asked for; the proxy's own errors
use Anthropic's envelope `{"type": "error", "error": {"type", "message"}}`.
"""

from __future__ import annotations

from typing import Any

from app.compaction.formats.messages import MessagesFormat
from app.errors import ProxyError
from app.http.body import check_model_rest
from app.proxy.api import Api
from app.proxy.responses import parse_responses_body
from app.proxy.restore_messages import MessagesDialect
from app.proxy.sse_tap import Usage

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
    """`error` in Anthropic's envelope (502 and anything unlisted is an `api_error`)."""
    kind = ERROR_TYPES.get(error.status_code, "api_error")
    return {"type": "error", "error": {"type": kind, "message": error.message}}


MESSAGES_API = Api(
    route="/v1/messages",
    upstream_path="/messages",
    wire=MessagesFormat(),
    parse_body=parse_responses_body,  # the same check: an object naming its model
    history="messages",
    check_rest=check_model_rest,
    usage=Usage.from_anthropic,
    error_body=anthropic_error_body,
    anthropic=True,
    restore=MessagesDialect(),
)
