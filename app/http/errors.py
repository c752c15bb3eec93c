"""Rendering the proxy's own errors as HTTP responses (the error tree itself is `app.errors`)."""

from __future__ import annotations

import orjson
from starlette.requests import Request
from starlette.responses import Response

from app.errors import ProxyError


def error_response(error: ProxyError) -> Response:
    """`error` as a JSON response in OpenAI's envelope, with its class's status."""
    return Response(
        orjson.dumps(error.body()), status_code=error.status_code, media_type="application/json"
    )


async def proxy_error_handler(request: Request, exc: Exception) -> Response:
    """Render any ProxyError (registered once in the factory)."""
    assert isinstance(exc, ProxyError)
    return error_response(exc)
