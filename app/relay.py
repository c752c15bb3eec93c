"""A streaming response that relays upstream bytes and always closes the upstream response.

Starlette's `StreamingResponse` gives no guarantee that the upstream is closed when the client
goes away while we wait on the upstream, so this class owns that boundary: it races the byte pump
against `http.disconnect`, and every ending (completion, client disconnect, upstream error)
runs the same `finally` that closes the upstream response and reports the outcome once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

import anyio
import httpx
from starlette.background import BackgroundTask
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from app.errors import UpstreamTimeout, UpstreamUnavailable
from app.sse_tap import SSETap

logger = logging.getLogger(__name__)

Outcome = Literal["completed", "client_disconnected", "upstream_error"]


class UpstreamBodyBroken(Exception):
    """Raised to the ASGI server so it aborts a plain (non-SSE) body the upstream broke."""


@dataclass(frozen=True, slots=True)
class RelayResult:
    """How a relayed stream ended."""

    outcome: Outcome
    ttfb: float | None
    bytes_sent: int


def buffered_response(content: bytes, status_code: int, headers: list[tuple[str, str]]) -> Response:
    """A complete body with the upstream's headers kept as a list (repeated names survive)."""
    response = Response(content, status_code=status_code)
    response.raw_headers = [
        (k.encode("latin-1"), v.encode("latin-1"))
        for k, v in headers
        if k.lower() != "content-length"
    ] + [(b"content-length", str(len(content)).encode())]
    return response


class RelayResponse(Response):
    """ASGI response: status and headers now, then the upstream body chunk by chunk."""

    background: BackgroundTask | None = None

    def __init__(
        self,
        upstream: httpx.Response,
        *,
        status_code: int,
        headers: list[tuple[str, str]],
        tap: SSETap | None = None,
        raw: bool = False,
        started: float | None = None,
        on_end: Callable[[RelayResult], Awaitable[None]] | None = None,
    ) -> None:
        self.upstream = upstream
        self.status_code = status_code
        self.relay_headers = headers
        self.raw_headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers]
        self.tap = tap
        self.raw = raw
        self.started = started if started is not None else time.perf_counter()
        self.on_end = on_end
        self._sse = any(
            k.lower() == "content-type" and "text/event-stream" in v for k, v in headers
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        outcome: Outcome = "completed"
        ttfb: float | None = None
        sent = 0
        finished = False
        broken: Exception | None = None
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": self.status_code,
                    "headers": self.raw_headers,
                }
            )
            async with anyio.create_task_group() as tg:

                async def watch_disconnect() -> None:
                    nonlocal outcome
                    while True:
                        message = await receive()
                        if message["type"] == "http.disconnect":
                            if not finished:  # a disconnect after the last byte is normal
                                outcome = "client_disconnected"
                            tg.cancel_scope.cancel()
                            return

                tg.start_soon(watch_disconnect)
                try:
                    chunks = self.upstream.aiter_raw() if self.raw else self.upstream.aiter_bytes()
                    async for chunk in chunks:
                        out = self.tap.feed(chunk) if self.tap is not None else chunk
                        if out:
                            if ttfb is None:
                                ttfb = time.perf_counter() - self.started
                            await send(
                                {"type": "http.response.body", "body": out, "more_body": True}
                            )
                            sent += len(out)
                    tail = self.tap.flush() if self.tap is not None else b""
                    await send({"type": "http.response.body", "body": tail, "more_body": False})
                    finished = True
                except (httpx.HTTPError, UpstreamTimeout, UpstreamUnavailable) as exc:
                    outcome = "upstream_error"
                    logger.warning("upstream stream broke: %s", type(exc).__name__)
                    if self._sse:
                        await self._send_error(send, exc)
                    else:
                        broken = exc
                except OSError:
                    outcome = "client_disconnected"
                tg.cancel_scope.cancel()
            if broken is not None:
                # A plain body cannot carry an error once started: abort the connection so the
                # client sees an incomplete response, never a silently truncated 200.
                raise UpstreamBodyBroken("upstream broke mid-body") from broken
        finally:
            with anyio.CancelScope(shield=True):
                await self.upstream.aclose()
                if self.on_end is not None:
                    await self.on_end(RelayResult(outcome, ttfb, sent))

    async def _send_error(self, send: Send, exc: Exception) -> None:
        error: UpstreamTimeout | UpstreamUnavailable = (
            UpstreamTimeout("upstream stream timed out")
            if isinstance(exc, httpx.TimeoutException)
            else UpstreamUnavailable(f"upstream stream broke ({type(exc).__name__})")
        )
        try:
            await send(
                {"type": "http.response.body", "body": error.sse_frame(), "more_body": False}
            )
        except OSError:
            return
