"""The upstream pool's error translation: one table maps every httpx failure to the proxy's
`UpstreamTimeout` (504) or `UpstreamUnavailable` (502), at every stage of an exchange."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from inflight.errors import UpstreamTimeout, UpstreamUnavailable
from inflight.proxy.upstream import POOL_SHARDS, Upstream, read_all, translate, upstream_errors
from tests.conftest import make_settings
from tests.support.servers import serve

pytestmark = pytest.mark.anyio
URL = "http://user:secret@upstream.test/v1/chat/completions?key=k"

FAILURES: list[tuple[type[httpx.HTTPError], type[Exception]]] = [
    (httpx.ConnectTimeout, UpstreamTimeout),
    (httpx.ReadTimeout, UpstreamTimeout),
    (httpx.PoolTimeout, UpstreamTimeout),
    (httpx.ConnectError, UpstreamUnavailable),
    (httpx.ReadError, UpstreamUnavailable),
    (httpx.RemoteProtocolError, UpstreamUnavailable),
    (httpx.DecodingError, UpstreamUnavailable),
]


@pytest.mark.parametrize(("raised", "expected"), FAILURES)
async def test_send_translates_every_httpx_failure(
    tmp_path: Path, raised: type[httpx.HTTPError], expected: type[Exception]
) -> None:
    def fail(request: httpx.Request) -> httpx.Response:
        raise raised("boom", request=request)

    upstream = Upstream(make_settings(tmp_path), transport=httpx.MockTransport(fail))
    with pytest.raises(expected) as caught:
        await upstream.send("POST", URL, [], b"{}")
    assert caught.value.message.startswith("upstream http://upstream.test/v1/chat/completions ")
    assert "secret" not in caught.value.message
    assert "key=k" not in caught.value.message
    await upstream.aclose()


class _Broken(httpx.AsyncByteStream):
    def __init__(self, error: httpx.HTTPError) -> None:
        self.error = error
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield b'{"partial'
        raise self.error

    async def aclose(self) -> None:
        self.closed = True


@pytest.mark.parametrize(("raised", "expected"), FAILURES)
async def test_reading_the_answer_translates_and_closes(
    raised: type[httpx.HTTPError], expected: type[Exception]
) -> None:
    request = httpx.Request("POST", URL)
    stream = _Broken(raised("boom", request=request))
    response = httpx.Response(200, stream=stream, request=request)
    with pytest.raises(expected, match="while"):
        await read_all(response)
    assert stream.closed


def test_other_errors_pass_through() -> None:
    with (
        pytest.raises(ValueError, match="not an upstream failure"),
        upstream_errors(URL, "connect"),
    ):
        raise ValueError("not an upstream failure")


def test_the_stage_names_what_broke() -> None:
    request = httpx.Request("GET", URL)
    error = translate(httpx.ReadError("reset", request=request), URL, "stream")
    assert (
        error.message
        == "upstream http://upstream.test/v1/chat/completions stream broke (ReadError)"
    )


HEADER_SETS: list[list[tuple[str, str]]] = [
    [],
    [("authorization", "Bearer k"), ("content-type", "application/json")],
    [("User-Agent", "OpenAI/Python 1.99"), ("Accept-Encoding", "identity"), ("x-a", "1")],
    [("accept", "text/event-stream"), ("x-dup", "1"), ("x-dup", "2"), ("connection", "close")],
]


@pytest.mark.parametrize("headers", HEADER_SETS)
@pytest.mark.parametrize("deadline", [None, 7.5])
async def test_send_sends_what_the_pooled_client_would(
    tmp_path: Path, headers: list[tuple[str, str]], deadline: float | None
) -> None:
    """`send` skips `AsyncClient.send` (no auth, redirects, cookies or hooks to run) but the
    upstream gets the very request the client would build: its default headers unless the
    client's replace them, the same order, body, timeouts; and the response carries it."""
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, content=b"{}")

    upstream = Upstream(make_settings(tmp_path), transport=httpx.MockTransport(answer))
    response = await upstream.send("POST", URL, headers, b'{"a":1}', deadline=deadline)
    assert await read_all(response) == b"{}"
    assert response.request is seen[0]
    timeout = upstream.client.timeout if deadline is None else httpx.Timeout(deadline)
    built = upstream.client.build_request("POST", URL, headers=headers, content=b'{"a":1}')
    assert seen[0].headers.raw == built.headers.raw
    assert (seen[0].method, seen[0].url, seen[0].content) == (built.method, built.url, b'{"a":1}')
    assert seen[0].extensions["timeout"] == timeout.as_dict()
    await upstream.aclose()


# -- connection pools: a request goes to the least busy ------------------------------------


def _slow_upstream() -> Any:
    """A real server whose answers are two chunks 0.2 s apart: requests stay in flight."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    async def answer(request: Request) -> StreamingResponse:
        async def chunks() -> AsyncIterator[bytes]:
            yield b"one "
            await anyio.sleep(0.2)
            yield b"two"

        return StreamingResponse(chunks(), media_type="text/plain")

    return Starlette(routes=[Route("/v1/slow", answer, methods=["POST"])])


def _connections(pool: httpx.AsyncBaseTransport) -> int:
    assert isinstance(pool, httpx.AsyncHTTPTransport)
    return len(pool._pool.connections)


async def test_requests_in_turn_reuse_the_first_pool(tmp_path: Path) -> None:
    """Sequential traffic takes the first pool every time: one connection, reused, as with a
    single pool; the others open none."""
    with serve(_slow_upstream()) as url:
        upstream = Upstream(make_settings(tmp_path))
        assert len(upstream.pools) == POOL_SHARDS
        contexts = {id(p._pool._ssl_context) for p in upstream.pools}  # type: ignore[attr-defined]
        assert len(contexts) == 1  # one TLS context (the CA bundle loaded once)
        try:
            for _ in range(5):
                answer = await upstream.send("POST", url + "/v1/slow", [], b"{}")
                assert await read_all(answer) == b"one two"
            assert [_connections(p) for p in upstream.pools] == [1] + [0] * (POOL_SHARDS - 1)
            assert upstream._loads == [0] * POOL_SHARDS
        finally:
            await upstream.aclose()


async def test_concurrent_requests_spread_over_the_pools_and_are_released(tmp_path: Path) -> None:
    """Requests in flight at once go to the least busy pool, so each pool holds its share;
    every one is released when its response is closed, read to the end or not, or failed."""
    with serve(_slow_upstream()) as url:
        upstream = Upstream(make_settings(tmp_path))
        try:
            answers = [
                await upstream.send("POST", url + "/v1/slow", [], b"{}")
                for _ in range(2 * POOL_SHARDS + 3)
            ]
            assert sorted(upstream._loads) == [2] * (POOL_SHARDS - 3) + [3] * 3
            assert all(_connections(p) >= 2 for p in upstream.pools)
            assert not upstream.idle(url + "/v1")
            for answer in answers[:POOL_SHARDS]:
                assert await read_all(answer) == b"one two"
            for answer in answers[POOL_SHARDS:]:
                await answer.aclose()  # closed unread: released too
            assert upstream._loads == [0] * POOL_SHARDS
            assert upstream.idle(url + "/v1")
            with pytest.raises(UpstreamUnavailable):  # refused: released at once
                await upstream.send("POST", "http://127.0.0.1:9/v1/slow", [], b"{}")
            assert upstream._loads == [0] * POOL_SHARDS
        finally:
            await upstream.aclose()
    for pool in upstream.pools:
        assert isinstance(pool, httpx.AsyncHTTPTransport)
        assert not pool._pool.connections  # closed with the proxy
