"""uvicorn's httptools protocol with a header read deadline, for `inflight serve`.

h11 and httptools have no header timeout, and uvicorn's `timeout_keep_alive` only runs between
requests: a connection that opens and sends nothing, or half a request line, stays open for ever
(slowloris).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

logger = logging.getLogger(__name__)

SEND_BUFFER = 128 * 1024  # the kernel's send buffer per client connection (Linux doubles it)
WRITE_BUFFER_HIGH = 64 * 1024  # the transport's buffer past which sending waits for the client


class DeadlineProtocol(HttpToolsProtocol):
    """`HttpToolsProtocol` with the header deadline and the stall bound; both set by
    `with_deadlines`.

    A connection must finish a request's headers within `header_timeout` seconds of opening, or of
    the request's first byte, else it is closed; a client that reads nothing of a response for
    `stall_timeout` seconds is dropped (uvicorn's `close` would wait for it to read what is
    buffered: the connection would stay open). A response sent before its request's body was read in
    full (a 408 body timeout, a 413) closes the connection: what the client is still sending would
    otherwise be read as the next request, or keep it open. Each connection's send buffers are
    capped, so an unread response holds a bounded number of bytes.
    """

    header_timeout: float = 10.0
    stall_timeout: float = 60.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_deadline: asyncio.TimerHandle | None = None
        self._stalled: asyncio.TimerHandle | None = None

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._stalled is None:
            self._stalled = self.loop.call_later(self.stall_timeout, self._stall)

    def resume_writing(self) -> None:
        self._unstall()
        super().resume_writing()

    def _unstall(self) -> None:
        if self._stalled is not None:
            self._stalled.cancel()
            self._stalled = None

    def _stall(self) -> None:
        """The client has read nothing for `stall_timeout` s: drop the connection now (`close`
        would wait for it to read what is buffered); the app sees a disconnect."""
        self._stalled = None
        if not self.transport.is_closing() or self.flow.write_paused:
            logger.info("client read nothing for %s s: connection dropped", self.stall_timeout)
            sock = self.transport.get_extra_info("socket")
            if sock is not None:  # a reset: a close would wait for the client to read the rest
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.transport.abort()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        bound_send_buffers(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._unstall()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._header_deadline is None:
            self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        unread = self.cycle is not None and self.cycle.more_body
        super().on_response_complete()
        if unread and not self.transport.is_closing():
            self.transport.close()

    def _arm(self) -> None:
        self._disarm()
        self._header_deadline = self.loop.call_later(self.header_timeout, self._expired)

    def _disarm(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _expired(self) -> None:
        self._header_deadline = None
        if not self.transport.is_closing():
            logger.info(
                "no complete request headers within %s s: connection closed", self.header_timeout
            )
            self.transport.close()


def bound_send_buffers(transport: asyncio.Transport) -> None:
    """Cap what a connection's unread response may occupy: the kernel's send buffer (else
    autotuned up to `net.ipv4.tcp_wmem`'s 4 MiB per socket) and the transport's (uvicorn waits
    to send more past its high-water mark). A client that reads nothing then holds at most
    about `SEND_BUFFER` (doubled by Linux) + `WRITE_BUFFER_HIGH` + one chunk of the relay."""
    transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH)
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)


def with_deadlines(header_timeout: float, stall_timeout: float = 60.0) -> type[DeadlineProtocol]:
    """The protocol class to give uvicorn (`http=`), with these bounds."""
    bounds = {"header_timeout": header_timeout, "stall_timeout": stall_timeout}
    return type("DeadlineProtocol", (DeadlineProtocol,), bounds)
