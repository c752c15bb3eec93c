"""Faults through real servers: an upstream that refuses, resets mid-body, stalls, sends broken
SSE or huge bodies, and clients that leave at every stage. Never a 500 from the proxy, never a
hang, and no upstream connection left checked out of the pool afterwards."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from inflight.factory import create_app
from tests.conftest import make_settings
from tests.support.servers import serve

pytestmark = pytest.mark.e2e
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
HUGE = (
    b'{"id": "x", "choices": [{"index": 0, "message": {"role": "assistant", "content": "'
    + b"y" * 8_000_000
    + b'"}}]}'
)


async def broken_sse(request: Request) -> Response:
    async def events() -> AsyncIterator[bytes]:
        yield b'data: {"choices": [{"index": 0, "delta": {"content": "a"}}]}\n\n'
        yield b"data: {not json\n\n"
        yield b"garbage line without a field\n\n"
        yield b"data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


async def reset_mid_body(request: Request) -> Response:
    stream = orjson.loads(await request.body()).get("stream") is True

    async def body() -> AsyncIterator[bytes]:
        yield b'data: {"choices": []}\n\n' if stream else b'{"id": "x", "choices": ['
        raise RuntimeError("connection reset by the upstream")

    return StreamingResponse(
        body(), media_type="text/event-stream" if stream else "application/json"
    )


async def stall(request: Request) -> Response:
    await asyncio.sleep(30)
    return Response(b"{}")


async def huge(request: Request) -> Response:
    return Response(HUGE, media_type="application/json")


async def malformed_json(request: Request) -> Response:
    return Response(b'{"choices": [', media_type="application/json")


async def slow_stream(request: Request) -> Response:
    async def events() -> AsyncIterator[bytes]:
        for i in range(1000):
            yield f'data: {{"choices": [{{"index": 0, "delta": {{"content": "{i}"}}}}]}}\n\n'.encode()
            await asyncio.sleep(0.01)

    return StreamingResponse(events(), media_type="text/event-stream")


ROUTES = {
    "broken-sse": broken_sse,
    "reset": reset_mid_body,
    "stall": stall,
    "huge": huge,
    "malformed": malformed_json,
    "slow-stream": slow_stream,
}


def faulty_upstream() -> Starlette:
    async def chat(request: Request) -> Response:
        body = orjson.loads(await request.body())
        return await ROUTES[body["model"]](request)

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/files", reset_mid_body, methods=["POST"]),
        ]
    )


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    with serve(faulty_upstream()) as url:
        yield url + "/v1"


@pytest.fixture
def proxy(tmp_path: Path, upstream: str) -> Iterator[tuple[str, Any]]:
    app = create_app(make_settings(tmp_path, upstream_url=upstream, upstream_read_timeout=1.0))
    with serve(app) as url:
        yield url, app


def pool_idle(app: Any) -> bool:
    """No upstream connection is checked out (every response was closed), in any pool."""
    upstream = app.state.inflight.upstream
    pools = [transport._pool for transport in upstream.pools]
    return not any(upstream._loads) and all(
        not pool._requests and all(c.is_idle() or c.is_closed() for c in pool.connections)
        for pool in pools
    )


def wait_pool_idle(app: Any) -> None:
    for _ in range(200):
        if pool_idle(app):
            return
        import time

        time.sleep(0.01)
    raise AssertionError("an upstream connection was leaked")


def test_broken_sse_is_relayed_as_sent(proxy: tuple[str, Any]) -> None:
    url, app = proxy
    with httpx.Client(timeout=10) as c:
        r = c.post(
            url + "/v1/chat/completions", json={**CHAT, "model": "broken-sse", "stream": True}
        )
    assert r.status_code == 200
    assert b"data: {not json" in r.content
    assert r.content.endswith(b"data: [DONE]\n\n")
    wait_pool_idle(app)


@pytest.mark.parametrize("stream", [False, True])
def test_reset_mid_body(proxy: tuple[str, Any], stream: bool) -> None:
    url, app = proxy
    with httpx.Client(timeout=10) as c:
        r = c.post(url + "/v1/chat/completions", json={**CHAT, "model": "reset", "stream": stream})
    if stream:  # a stream that started: it ends with an SSE error frame
        assert b"event: error" in r.content
    else:
        assert r.status_code == 502
        assert r.json()["error"]["code"] == "upstream_unavailable"
    wait_pool_idle(app)


def test_stall_before_headers_is_504(proxy: tuple[str, Any]) -> None:
    url, app = proxy
    with httpx.Client(timeout=10) as c:
        r = c.post(url + "/v1/chat/completions", json={**CHAT, "model": "stall"})
    assert r.status_code == 504
    assert r.json()["error"]["code"] == "upstream_timeout"
    wait_pool_idle(app)


def test_huge_and_malformed_answers_are_relayed(proxy: tuple[str, Any]) -> None:
    url, app = proxy
    with httpx.Client(timeout=30) as c:
        big = c.post(url + "/v1/chat/completions", json={**CHAT, "model": "huge"})
        bad = c.post(url + "/v1/chat/completions", json={**CHAT, "model": "malformed"})
    assert big.status_code == 200
    assert big.content == HUGE
    assert bad.status_code == 200
    assert bad.content == b'{"choices": ['
    wait_pool_idle(app)


def test_refused_connection_is_502(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connections are refused
        app = create_app(make_settings(tmp_path, upstream_url=f"http://127.0.0.1:{port}/v1"))
        with serve(app) as url, httpx.Client(timeout=10) as c:
            r = c.post(url + "/v1/chat/completions", json=CHAT)
            stream = c.post(url + "/v1/chat/completions", json={**CHAT, "stream": True})
    assert r.status_code == 502
    assert stream.status_code == 502


@pytest.mark.parametrize("stage", ["before-response", "mid-stream", "slow-reader"])
def test_client_leaving_at_every_stage_frees_the_upstream(
    proxy: tuple[str, Any], stage: str
) -> None:
    url, app = proxy
    body = {
        **CHAT,
        "model": "slow-stream" if stage != "before-response" else "stall",
        "stream": True,
    }
    with httpx.Client(timeout=httpx.Timeout(10, read=0.3)) as c:
        try:
            with c.stream("POST", url + "/v1/chat/completions", json=body) as r:
                for n, _ in enumerate(r.iter_raw()):
                    if stage == "mid-stream" and n == 3:
                        break
                    if stage == "slow-reader" and n == 1:
                        import time

                        time.sleep(0.5)  # a reader that stalls, then gives up
                        break
        except httpx.ReadTimeout:
            pass  # before-response: the client gave up while the upstream stalled
    wait_pool_idle(app)
    with httpx.Client(timeout=10) as c:  # and the proxy still serves
        assert c.get(url + "/healthz").status_code == 200


def test_passthrough_body_broken_mid_way_is_not_a_truncated_200(proxy: tuple[str, Any]) -> None:
    url, app = proxy
    with httpx.Client(timeout=10) as c, pytest.raises(httpx.RemoteProtocolError):
        c.post(url + "/v1/files", content=b'{"stream": false}')
    wait_pool_idle(app)
