"""Rendering the proxy's own errors as HTTP responses (the error tree itself is `inflight.errors`).

Each compacting API renders errors in its own envelope: its route's authentication dependency
(`inflight.http.state.api_client`) puts the API's `error_body` on `request.state`, and the handler
uses it; every other route answers in OpenAI's envelope.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from inflight.errors import ProxyError

logger = logging.getLogger(__name__)

ErrorBody = Callable[[ProxyError], dict[str, Any]]


def error_response(error: ProxyError, envelope: ErrorBody = ProxyError.body) -> Response:
    """`error` as a JSON response in `envelope` (OpenAI's by default), with its class's status."""
    return Response(
        orjson.dumps(envelope(error)), status_code=error.status_code, media_type="application/json"
    )


async def proxy_error_handler(request: Request, exc: Exception) -> Response:
    """Render any ProxyError (registered once in the factory), in the route's API envelope."""
    assert isinstance(exc, ProxyError)
    envelope: ErrorBody = getattr(request.state, "error_body", ProxyError.body)
    return error_response(exc, envelope)


async def unexpected_error_handler(request: Request, exc: Exception) -> Response:
    """Any other error: logged with its traceback, a 500 in OpenAI's envelope."""
    logger.exception("unexpected error on %s %s", request.method, request.url.path)
    return error_response(ProxyError("internal error in the proxy"))
