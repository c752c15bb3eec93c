"""Every other `/v1/*` route: method, path, query, headers and body relayed unchanged."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from app.body import limited_stream
from app.relay import RelayResponse
from app.settings import Settings
from app.upstream import Upstream, filter_request_headers, filter_response_headers


def _has_body(request: Request) -> bool:
    length = request.headers.get("content-length")
    if length is not None:
        return length.strip() not in ("", "0")
    return "transfer-encoding" in request.headers


class PassthroughService:
    """Streams the request body up and the response body down, byte for byte."""

    def __init__(self, settings: Settings, upstream: Upstream) -> None:
        self._settings = settings
        self._upstream = upstream

    async def handle(self, request: Request, v1_path: str) -> Response:
        route = self._upstream.default_route
        headers = filter_request_headers(
            request.headers.items(), api_key=route.api_key, identity=False
        )
        content = (
            limited_stream(request, self._settings.max_body_bytes) if _has_body(request) else None
        )
        url = self._upstream.url(route, v1_path, request.url.query.encode())
        upstream = await self._upstream.send(request.method, url, headers, content)
        return RelayResponse(
            upstream,
            status_code=upstream.status_code,
            headers=filter_response_headers(upstream.headers),
            raw=True,
        )
