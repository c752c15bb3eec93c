"""Every other `/v1/*` route: method, path, query, headers and body relayed unchanged.

Each relayed request is recorded (`kind="passthrough"`, by API: `/v1/responses`, `/v1/models`…)
with its status and outcome, apart from the chat counters since its body is never read.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import Response

from inflight.errors import ProxyError, UpstreamTimeout, UpstreamUnavailable
from inflight.proxy.body import ClientGone, limited_stream
from inflight.proxy.headers import filter_request_headers, filter_response_headers
from inflight.proxy.recording import passthrough_record, passthrough_route
from inflight.proxy.relay import RelayResponse, RelayResult
from inflight.proxy.upstream import KEY_HEADERS, Provider, Upstream
from inflight.settings import Settings
from inflight.usage.records import Outcome, UsageRecord

Recorder = Callable[[UsageRecord], None]


def _has_body(request: Request) -> bool:
    length = request.headers.get("content-length")
    if length is not None:
        return length.strip() not in ("", "0")
    return "transfer-encoding" in request.headers


def _outcome_of(error: ProxyError) -> Outcome:
    """How a request that failed before its answer came ends: the upstream's failure, the
    client's hang-up during its upload, or a refusal (a body too large or too slow, a path)."""
    if isinstance(error, UpstreamTimeout | UpstreamUnavailable):
        return "upstream_error"
    return "client_disconnected" if isinstance(error, ClientGone) else "rejected"


class PassthroughService:
    """Streams the request body up and the response body down, byte for byte."""

    def __init__(
        self, settings: Settings, upstream: Upstream, *, record: Recorder | None = None
    ) -> None:
        self._settings = settings
        self._upstream = upstream
        self._record = record

    async def handle(
        self,
        request: Request,
        v1_path: str,
        client_key_id: str | None = None,
        provider: Provider = "openai",
    ) -> Response:
        """Relay to `provider`'s default upstream (Anthropic's for its API beside
        `/v1/messages`, e.g. `count_tokens`), its key in that provider's header."""
        started = time.perf_counter()
        route = self._upstream.provider_route(provider)
        headers = filter_request_headers(
            request.headers.items(),
            api_key=route.api_key,
            identity=False,
            key_header=KEY_HEADERS[provider],
        )
        settings = self._settings
        content = (
            limited_stream(request, settings.max_body_bytes, settings.body_read_timeout)
            if _has_body(request)
            else None
        )
        url = self._upstream.url(route, v1_path, request.scope.get("query_string", b""))
        api = passthrough_route(v1_path)
        try:
            upstream = await self._upstream.send(request.method, url, headers, content)
        except ProxyError as exc:
            self._done(api, exc.status_code, _outcome_of(exc), started, None, client_key_id)
            raise
        status = upstream.status_code

        async def on_end(result: RelayResult) -> None:
            ended: Outcome = "upstream_error" if status >= 400 else result.outcome
            self._done(api, status, ended, started, result.ttfb, client_key_id)

        return RelayResponse(
            upstream,
            status_code=status,
            headers=filter_response_headers(upstream.headers),
            raw=True,
            started=started,
            on_end=on_end,
            stall_timeout=self._settings.client_stall_timeout,
        )

    def _done(
        self,
        api: str,
        status: int,
        outcome: Outcome,
        started: float,
        ttfb: float | None,
        client_key_id: str | None,
    ) -> None:
        if self._record is None:
            return
        self._record(
            passthrough_record(
                api,
                status=status,
                outcome=outcome,
                started=started,
                ttfb=ttfb,
                client_key_id=client_key_id,
            )
        )
