"""A passthrough route's slow or vanishing uploads, against a real uvicorn server run as
`inflight serve` runs it: a body that stops arriving gets the compacting routes' 408 after
`INFLIGHT_BODY_READ_TIMEOUT` (the connection closed), and a client that hangs up mid-upload is
recorded as `client_disconnected`, as on the compacting routes."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from inflight.factory import create_app
from tests.conftest import make_settings
from tests.e2e.test_slow_clients import closed_within, headers, serve
from tests.support.list_store import ListStore

BODY = b'{"purpose": "batch", "file": "' + b"x" * 4000 + b'"}'


class Answer(httpx.AsyncByteStream):
    """A response body streamed as a real upstream's is (not read in advance)."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self._data


async def answer(request: httpx.Request) -> httpx.Response:
    """An upstream that reads the whole body it is sent, then says how long it was."""
    body = await request.aread()
    return httpx.Response(200, stream=Answer(b'{"received":%d}' % len(body)))


@pytest.fixture
def store() -> ListStore:
    return ListStore()


@pytest.fixture
def address(tmp_path: Path, store: ListStore) -> Iterator[tuple[str, int]]:
    """The proxy (body read timeout 0.5 s) in front of an upstream that reads every body."""
    app = create_app(
        make_settings(tmp_path, body_read_timeout=0.5),
        transport=httpx.MockTransport(answer),
        store=store,  # type: ignore[arg-type]
    )
    with serve(app, header_timeout=5) as found:
        yield found


def head(length: int) -> bytes:
    """A passthrough route's request head (`test_slow_clients`' own, on `/v1/files`)."""
    return headers(length).replace(b"/v1/chat/completions", b"/v1/files", 1)


def test_a_whole_body_is_relayed(address: tuple[str, int], store: ListStore) -> None:
    with socket.create_connection(address) as sock:
        sock.sendall(head(len(BODY)) + BODY)
        sock.shutdown(socket.SHUT_WR)
        answer = closed_within(sock, 5)
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert b'{"received":%d}' % len(BODY) in answer
    (record,) = store.wait_for(1)
    assert (record.kind, record.status, record.outcome) == ("passthrough", 200, "completed")


def test_a_body_that_stops_arriving_gets_408_and_the_connection_closes(
    address: tuple[str, int], store: ListStore
) -> None:
    with socket.create_connection(address) as sock:
        sock.sendall(head(len(BODY)) + BODY[:10])  # and nothing more
        answer = closed_within(sock, 5)
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert b"request_timeout" in answer
    (record,) = store.wait_for(1)
    assert (record.kind, record.status, record.outcome) == ("passthrough", 408, "rejected")


def test_a_client_hanging_up_mid_upload_is_recorded_as_disconnected(
    address: tuple[str, int], store: ListStore, caplog: pytest.LogCaptureFixture
) -> None:
    with socket.create_connection(address) as sock:
        sock.sendall(head(len(BODY)) + BODY[:10])
    (record,) = store.wait_for(1)
    assert (record.kind, record.status, record.outcome) == (
        "passthrough",
        499,
        "client_disconnected",
    )
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]
