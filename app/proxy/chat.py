"""The chat completions service: read, compact, forward, relay, record."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx
import orjson
from starlette.requests import Request
from starlette.responses import Response

from app.errors import ProxyError, UpstreamTimeout, UpstreamUnavailable
from app.http.body import add_include_usage, parse_chat_body, read_body
from app.proxy.relay import RelayResponse, RelayResult, buffered_response
from app.proxy.sse_tap import SSETap, Usage
from app.proxy.upstream import Upstream, filter_request_headers, filter_response_headers, read_all
from app.settings import Settings

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class Exchange:
    """What one chat request turned into, for the response headers and the usage record."""

    model: str
    stream: bool
    raw: bytes
    body: dict[str, Any]
    forward: bytes
    client_key_id: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    status: int = 0
    usage: Usage | None = None
    outcome: str = "completed"
    ttfb: float | None = None
    started: float = field(default_factory=time.perf_counter)
    tokens_before: int = 0
    tokens_after: int = 0
    context_limit: int | None = None
    strategies: tuple[str, ...] = ()
    retried: bool = False
    request_headers: dict[str, str] = field(default_factory=dict)
    summary_usage: Any = None
    summary_model: str | None = None
    original: dict[str, Any] | None = None  # the body as the client sent it (for the baseline)


class Compactor(Protocol):
    """Turns a parsed request into what is forwarded (the compaction service implements it)."""

    async def prepare(self, headers: Mapping[str, str], exchange: Exchange, base_url: str) -> None:
        """Set `exchange.forward`, its body and report headers."""

    async def recover(self, exchange: Exchange, base_url: str, status: int, content: bytes) -> bool:
        """After an upstream overflow error: learn the window, recalibrate, recompact; True to
        retry once (only when the new body differs from the one that failed)."""


ExchangeHook = Callable[[Exchange], Awaitable[None]]


def usage_from_json(content: bytes) -> Usage | None:
    try:
        data = orjson.loads(content)
    except orjson.JSONDecodeError:
        return None
    return Usage.from_json(data.get("usage")) if isinstance(data, dict) else None


class ChatService:
    """Handles `POST /v1/chat/completions` end to end."""

    def __init__(
        self,
        settings: Settings,
        upstream: Upstream,
        *,
        compactor: Compactor | None = None,
        on_done: ExchangeHook | None = None,
    ) -> None:
        self._settings = settings
        self._upstream = upstream
        self._compactor = compactor
        self._on_done = on_done

    async def handle(self, request: Request, client_key_id: str | None = None) -> Response:
        started = time.perf_counter()
        try:
            raw = await read_body(request, self._settings.max_body_bytes)
            body = parse_chat_body(raw)
        except ProxyError as exc:
            await self.reject(exc, client_key_id, started)
            raise
        exchange = Exchange(
            model=body["model"],
            stream=body.get("stream") is True,
            raw=raw,
            body=body,
            forward=raw,
            client_key_id=client_key_id,
            started=started,
            original=body,
        )
        try:
            return await self._forward(request, exchange)
        except ProxyError as exc:
            if not exchange.status:  # not recorded yet: refused by the proxy, or upstream broke
                exchange.status = exc.status_code
                upstream_failed = isinstance(exc, UpstreamTimeout | UpstreamUnavailable)
                exchange.outcome = "upstream_error" if upstream_failed else "rejected"
                await self._finish(exchange)
            raise

    async def reject(
        self, error: ProxyError, client_key_id: str | None, started: float | None = None
    ) -> None:
        """Record a request refused before its body was read (401, 413, bad JSON or shape)."""
        await self._finish(
            Exchange(
                model="",
                stream=False,
                raw=b"",
                body={},
                forward=b"",
                client_key_id=client_key_id,
                status=error.status_code,
                outcome="rejected",
                started=started if started is not None else time.perf_counter(),
            )
        )

    async def _forward(self, request: Request, exchange: Exchange) -> Response:
        """Compact, send (retrying once after an overflow the compactor recovers), relay."""
        started = exchange.started
        route = self._upstream.route(exchange.model)
        if self._compactor is not None:
            await self._compactor.prepare(request.headers, exchange, route.base_url)
        headers = filter_request_headers(
            request.headers.items(), api_key=route.api_key, identity=True
        )
        url = self._upstream.url(route, "/chat/completions", request.url.query.encode())
        while True:
            forward, tap = self._with_usage_request(exchange)
            try:
                upstream = await self._upstream.send("POST", url, headers, forward)
            except (UpstreamTimeout, UpstreamUnavailable) as exc:
                exchange.status = exc.status_code
                exchange.outcome = "upstream_error"
                await self._finish(exchange)
                raise
            if upstream.status_code < 400 and tap is not None:
                return self._relay_stream(exchange, upstream, tap)
            content = await read_all(upstream)
            if (
                upstream.status_code >= 400
                and not exchange.retried
                and self._compactor is not None
                and await self._compactor.recover(
                    exchange, route.base_url, upstream.status_code, content
                )
            ):
                exchange.retried = True
                continue
            exchange.status = upstream.status_code
            exchange.ttfb = time.perf_counter() - started
            if upstream.status_code >= 400:
                exchange.outcome = "upstream_error"
            else:
                exchange.usage = usage_from_json(content)
            await self._finish(exchange)
            return buffered_response(
                content, upstream.status_code, self._response_headers(exchange, upstream)
            )

    @staticmethod
    def _with_usage_request(exchange: Exchange) -> tuple[bytes, SSETap | None]:
        """The bytes to send, asking for stream usage when the client did not (DESIGN.md §6)."""
        if not exchange.stream:
            return exchange.forward, None
        options = exchange.body.get("stream_options")
        wants_usage = isinstance(options, dict) and options.get("include_usage") is True
        forward = exchange.forward
        if not wants_usage:
            spliced = add_include_usage(forward, exchange.body)
            if spliced is None:
                patched = dict(exchange.body)
                extra = options if isinstance(options, dict) else {}
                patched["stream_options"] = {**extra, "include_usage": True}
                spliced = orjson.dumps(patched)
            forward = spliced
        return forward, SSETap(strip_usage_chunk=not wants_usage)

    @staticmethod
    def _response_headers(exchange: Exchange, upstream: httpx.Response) -> list[tuple[str, str]]:
        relayed = [
            (k, v)
            for k, v in filter_response_headers(upstream.headers)
            if k.lower() != "content-encoding"
        ]
        return relayed + list(exchange.headers.items())

    def _relay_stream(
        self, exchange: Exchange, upstream: httpx.Response, tap: SSETap
    ) -> RelayResponse:
        exchange.status = upstream.status_code

        async def on_end(result: RelayResult) -> None:
            exchange.outcome = result.outcome
            exchange.ttfb = result.ttfb
            exchange.usage = tap.usage
            await self._finish(exchange)

        return RelayResponse(
            upstream,
            status_code=upstream.status_code,
            headers=self._response_headers(exchange, upstream),
            tap=tap,
            started=exchange.started,
            on_end=on_end,
        )

    async def _finish(self, exchange: Exchange) -> None:
        if self._on_done is not None:
            await self._on_done(exchange)
