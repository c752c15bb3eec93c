"""Slow and vanishing clients against a real uvicorn server run as `inflight serve` runs it:
slowloris headers and bodies are cut off after their timeouts, a client that hangs up mid-upload
is recorded quietly as `client_disconnected`, and a stream nobody reads is cut off with its
upstream closed, having held at most one chunk."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import httpx
import orjson
import pytest
import uvicorn

from inflight.factory import create_app
from inflight.http.protocol import with_deadlines
from inflight.proxy.relay import RelayResponse, RelayResult
from tests.conftest import make_settings
from tests.support.list_store import ListStore

CHUNK = b"data: " + b"x" * 16_378 + b"\n\n"  # 16 KiB a chunk, for ever
BODY = orjson.dumps(
    {"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "Hi"}]}
)


class EndlessUpstream(httpx.AsyncByteStream):
    """An SSE upstream that never ends: counts the bytes it gave and whether it was closed."""

    def __init__(self) -> None:
        self.given = 0
        self.closed = threading.Event()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while not self.closed.is_set():
            self.given += len(CHUNK)
            yield CHUNK
            await anyio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        self.closed.set()

    def transport(self) -> httpx.MockTransport:
        def answer(request: httpx.Request) -> httpx.Response:
            if not request.url.path.endswith("/chat/completions"):  # window discovery
                return httpx.Response(404)
            headers = {"content-type": "text/event-stream"}
            return httpx.Response(200, headers=headers, stream=self)

        return httpx.MockTransport(answer)


@contextmanager
def serve(app: Any, header_timeout: float) -> Iterator[tuple[str, int]]:
    """`app` on a real uvicorn with `inflight serve`'s protocol, on 127.0.0.1:0."""
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=0,
        log_level="warning",
        lifespan="on",
        http=with_deadlines(header_timeout),
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert thread.is_alive(), "uvicorn did not start"
        assert time.monotonic() < deadline, "uvicorn did not start in time"
        time.sleep(0.01)
    try:
        yield "127.0.0.1", server.servers[0].sockets[0].getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(10)


def closed_within(sock: socket.socket, seconds: float) -> bytes:
    """Everything the server sent until it closed the connection (fails past `seconds`)."""
    sock.settimeout(seconds)
    received = b""
    while True:
        data = sock.recv(65536)
        if not data:
            return received
        received += data


@pytest.fixture
def store() -> ListStore:
    return ListStore()


@pytest.fixture
def upstream() -> EndlessUpstream:
    return EndlessUpstream()


@pytest.fixture
def address(
    tmp_path: Path, store: ListStore, upstream: EndlessUpstream
) -> Iterator[tuple[str, int]]:
    settings = make_settings(tmp_path, body_read_timeout=0.5, client_stall_timeout=0.5)
    app = create_app(settings, transport=upstream.transport(), store=store)  # type: ignore[arg-type]
    with serve(app, header_timeout=0.5) as address:
        yield address


def headers(length: int) -> bytes:
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % length
    )


@pytest.mark.parametrize("sent", [b"", b"POST /v1/chat/completions HTTP/1.1\r\nHost: pro"])
def test_a_connection_without_complete_headers_is_closed(
    address: tuple[str, int], sent: bytes
) -> None:
    with socket.create_connection(address) as sock:
        sock.sendall(sent)
        started = time.monotonic()
        assert closed_within(sock, 5) == b""
        assert time.monotonic() - started < 4


def test_a_body_that_stops_arriving_gets_408_and_the_connection_closes(
    address: tuple[str, int], store: ListStore
) -> None:
    with socket.create_connection(address) as sock:
        sock.sendall(headers(len(BODY)) + BODY[:10])
        answer = closed_within(sock, 5)
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert b"request_timeout" in answer
    (record,) = store.wait_for(1)
    assert (record.status, record.outcome) == (408, "rejected")


def test_a_client_hanging_up_mid_upload_is_recorded_quietly(
    address: tuple[str, int], store: ListStore, caplog: pytest.LogCaptureFixture
) -> None:
    with socket.create_connection(address) as sock:
        sock.sendall(headers(len(BODY)) + BODY[:10])
    (record,) = store.wait_for(1)
    assert record.outcome == "client_disconnected"
    assert "Exception in ASGI application" not in caplog.text
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]


def test_a_stream_nobody_reads_is_cut_off_and_its_upstream_closed(
    address: tuple[str, int], store: ListStore, upstream: EndlessUpstream
) -> None:
    with socket.create_connection(address) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(headers(len(BODY)) + BODY)  # and never reads
        assert upstream.closed.wait(10), "the upstream of an unread stream stays open"
        (record,) = store.wait_for(1)
        assert record.outcome == "client_disconnected"
        given = upstream.given
        time.sleep(0)
    # backpressure: what the upstream gave is what the sockets' buffers hold, not a growing heap
    assert given < 16 * 1024 * 1024
    assert upstream.given == given


@pytest.mark.anyio
async def test_the_relay_holds_at_most_one_chunk_for_a_client_that_never_reads() -> None:
    upstream = EndlessUpstream()
    async with httpx.AsyncClient(transport=upstream.transport()) as client:
        request = client.build_request("POST", "http://upstream.test/v1/chat/completions")
        response = await client.send(request, stream=True)
        ended: list[RelayResult] = []

        async def on_end(result: RelayResult) -> None:
            ended.append(result)

        relay = RelayResponse(
            response,
            status_code=200,
            headers=[("content-type", "text/event-stream")],
            on_end=on_end,
            stall_timeout=0.2,
        )
        accepted = 0

        async def send(message: Any) -> None:  # a client that takes 3 chunks, then nothing
            nonlocal accepted
            if message["type"] == "http.response.body":
                if accepted >= 3 * len(CHUNK):
                    await anyio.sleep_forever()
                accepted += len(message["body"])

        async def receive() -> Any:
            await anyio.sleep_forever()

        with anyio.fail_after(5):
            await relay({"type": "http"}, receive, send)
    (result,) = ended
    assert result.outcome == "client_disconnected"
    assert result.bytes_sent == accepted == 3 * len(CHUNK)
    assert result.unsent == len(CHUNK)  # the one chunk the client never took
    assert upstream.given == accepted + result.unsent  # nothing read ahead of the client
    assert upstream.closed.is_set()


def test_a_stream_nobody_reads_holds_a_bounded_number_of_bytes(
    address: tuple[str, int], store: ListStore, upstream: EndlessUpstream
) -> None:
    """The kernel's send buffer and the transport's are capped (`bound_send_buffers`): what
    the upstream gave before the cut-off is those buffers, the client's small receive buffer
    and one chunk, not the megabytes a send buffer autotunes to."""
    with socket.create_connection(address) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(headers(len(BODY)) + BODY)  # and never reads
        assert upstream.closed.wait(10), "the upstream of an unread stream stays open"
        store.wait_for(1)
    assert upstream.given < 1024 * 1024
