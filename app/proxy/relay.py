"""A streaming response that relays upstream bytes and always closes the upstream response."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import anyio
import httpx
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from inflight.errors import ProxyError, UpstreamTimeout, UpstreamUnavailable
from inflight.proxy.sse_tap import SSETap
from inflight.proxy.upstream import public_url, translate
from inflight.usage.records import Outcome

logger = logging.getLogger(__name__)


class UpstreamBodyBroken(Exception):
    """Raised to the ASGI server so it aborts a plain (non-SSE) body the upstream broke."""


class ClientStalled(Exception):
    """The client accepted nothing for the relay's `stall_timeout` seconds."""


@dataclass(frozen=True, slots=True)
class RelayResult:
    """How a relayed stream ended."""

    outcome: Outcome
    ttfb: float | None
    bytes_sent: int
    unsent: int = 0  # bytes read from the upstream the client never accepted (one chunk at most)


class BufferedResponse(Response):
    """A complete body; `after` runs once the body is handed to the server (or sending it
    failed): what is left to do for the exchange — its usage record, calibrating the counter —
    does not delay the answer."""

    def __init__(
        self,
        content: bytes,
        status_code: int,
        after: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        super().__init__(content, status_code=status_code)
        self.after = after

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if self.after is not None:
                await self.after()


def buffered_response(
    content: bytes,
    status_code: int,
    headers: list[tuple[str, str]],
    after: Callable[[], Awaitable[None]] | None = None,
) -> Response:
    """A complete body with the upstream's headers kept as a list (repeated names survive);
    `after`: see `BufferedResponse`."""
    response = BufferedResponse(content, status_code, after)
    response.raw_headers = [
        (k.encode("latin-1"), v.encode("latin-1"))
        for k, v in headers
        if k.lower() != "content-length"
    ] + [(b"content-length", str(len(content)).encode())]
    return response


class RelayResponse(Response):
    """ASGI response: status and headers now, then the upstream body chunk by chunk.

    A `Response` (FastAPI returns those as they are) whose `__call__` relays instead of sending
    a body; its headers are a list, so repeated names (`Set-Cookie`) survive.

    Starlette's `StreamingResponse` gives no guarantee that the upstream is closed when the client
    goes away while we wait on the upstream, so this class owns that boundary: it races the byte
    pump against `http.disconnect`, and every ending (completion, client disconnect, upstream error)
    runs the same `finally` that closes the upstream response and reports the outcome once.

    A client that reads nothing gets backpressure: the server's `send` waits while its write buffer
    is full, so at most one chunk is held here and the upstream is read no faster than the client
    reads. A client that accepts nothing for `stall_timeout` seconds is cut off
    (`client_disconnected`) and the upstream closed, so a reader that never reads holds neither
    memory nor an upstream.

    A stream whose final event (`data: [DONE]`, as the SSE tap sees it) reached the client is
    `completed` even when the client hangs up before the upstream closes: the openai SDK and
    langchain close the connection right after `[DONE]`, and some upstreams linger before closing.
    With `before_final` (replicas publishing what the answer taught), the last event of the chunk
    holding the final event waits for it; the bytes before it go first.
    """

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
        error_frame: Callable[[ProxyError], bytes] = ProxyError.sse_frame,
        held: tuple[bytes, AsyncIterator[bytes]] | None = None,
        stall_timeout: float | None = None,
        before_final: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        super().__init__(status_code=status_code)
        self.before_final = before_final  # awaited once, before the final SSE event is sent
        self.stall_timeout = stall_timeout  # seconds a client may accept nothing (None: forever)
        # restore read the body's first bytes to learn its kind: those go first, then the rest
        self.held = held
        self.upstream = upstream
        self.raw_headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers]
        self.tap = tap
        self.raw = raw
        self.started = started if started is not None else time.perf_counter()
        self.on_end = on_end
        self.error_frame = error_frame
        self._sse = any(
            k.lower() == "content-type" and "text/event-stream" in v for k, v in headers
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        progress = _Progress()
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
                tg.start_soon(_watch_disconnect, receive, progress, tg.cancel_scope)
                broken = await self._pump(send, progress)
                tg.cancel_scope.cancel()
            if broken is not None:
                # A plain body cannot carry an error once started: abort the connection so the
                # client sees an incomplete response, never a silently truncated 200.
                raise UpstreamBodyBroken("upstream broke mid-body") from broken
        finally:
            with anyio.CancelScope(shield=True):
                await self.upstream.aclose()
                if self.on_end is not None:
                    sent, unsent = progress.sent, progress.pending
                    await self.on_end(RelayResult(progress.outcome, progress.ttfb, sent, unsent))

    async def _pump(self, send: Send, progress: _Progress) -> Exception | None:
        """Relay the body; returns the upstream failure a plain body must abort with."""
        waiting = self.before_final
        try:
            chunks = self._chunks()
            async for chunk in chunks:
                out = self.tap.feed(chunk) if self.tap is not None else chunk
                if out:
                    if progress.ttfb is None:
                        progress.ttfb = time.perf_counter() - self.started
                    if waiting is not None and self.tap is not None and self.tap.done:
                        out, waiting = await self._hold_final(send, out, progress, waiting), None
                    await self._send_body(send, out, progress, more=True)
                    progress.finished = self.tap is not None and self.tap.done
            tail = self.tap.flush() if self.tap is not None else b""
            if waiting is not None and self.tap is not None and self.tap.done and tail:
                tail = await self._hold_final(send, tail, progress, waiting)
            await self._send_body(send, tail, progress, more=False)
            progress.finished = True
        except ClientStalled:
            logger.info(
                "client read nothing for %s s after %d bytes: stream cut off",
                self.stall_timeout,
                progress.sent,
            )
            if not progress.finished:
                progress.outcome = "client_disconnected"
        except (httpx.HTTPError, UpstreamTimeout, UpstreamUnavailable) as exc:
            if progress.finished:  # the answer is complete; only the upstream's close failed
                where = public_url(self.upstream.request.url)
                logger.info("upstream %s broke after the final event: %s", where, exc)
                await _end_body(send)
                return None
            progress.outcome = "upstream_error"
            error = (
                translate(exc, self.upstream.request.url, "stream")
                if isinstance(exc, httpx.HTTPError)
                else exc
            )
            if not self._sse:
                return error
            await self._send_error(send, error)
        except OSError:
            if not progress.finished:
                progress.outcome = "client_disconnected"
        return None

    async def _hold_final(
        self, send: Send, out: bytes, progress: _Progress, before: Callable[[], Awaitable[None]]
    ) -> bytes:
        """Send `out` up to its last event (the final one), await `before`; the rest to send."""
        body = out.rstrip(b"\r\n")
        lf, crlf = body.rfind(b"\n\n"), body.rfind(b"\r\n\r\n")
        cut = max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)
        if cut:
            await self._send_body(send, out[:cut], progress, more=True)
        await before()
        return out[cut:]

    async def _send_body(self, send: Send, body: bytes, progress: _Progress, *, more: bool) -> None:
        """Hand `body` to the server, which waits while the client is not reading; raises
        `ClientStalled` when it has waited `stall_timeout` seconds."""
        progress.pending = len(body)
        with anyio.move_on_after(self.stall_timeout) as waiting:
            await send({"type": "http.response.body", "body": body, "more_body": more})
        if waiting.cancelled_caught:
            raise ClientStalled
        progress.pending = 0
        progress.sent += len(body)

    async def _chunks(self) -> AsyncIterator[bytes]:
        """The upstream body's chunks (after the bytes already read, when held)."""
        if self.held is None:
            source = self.upstream.aiter_raw() if self.raw else self.upstream.aiter_bytes()
        else:
            head, source = self.held
            if head:
                yield head
        async for chunk in source:
            yield chunk

    async def _send_error(self, send: Send, error: ProxyError) -> None:
        """End an SSE stream that already started with `error` as its last event."""
        try:
            await send(
                {"type": "http.response.body", "body": self.error_frame(error), "more_body": False}
            )
        except OSError:
            return


@dataclass(slots=True)
class _Progress:
    """How far a relay got (shared by the byte pump and the disconnect watcher)."""

    outcome: Outcome = "completed"
    ttfb: float | None = None
    sent: int = 0
    pending: int = 0  # bytes handed to the server's `send` and not accepted yet (one chunk)
    finished: bool = False  # the last byte was sent, or the final SSE event reached the client


async def _watch_disconnect(
    receive: Receive, progress: _Progress, scope: anyio.CancelScope
) -> None:
    """Stop the relay when the client hangs up; before the end, that is a disconnect."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            if not progress.finished:
                progress.outcome = "client_disconnected"
            scope.cancel()
            return


async def _end_body(send: Send) -> None:
    try:
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    except OSError:
        return
