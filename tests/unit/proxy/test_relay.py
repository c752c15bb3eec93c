"""The relay: a proper `Response` whose ASGI call streams the upstream body, keeps repeated
headers, reports how it ended once, and ends a broken SSE stream with the API's error event."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import orjson
import pytest

from inflight.errors import ProxyError
from inflight.proxy.relay import RelayResponse, RelayResult

pytestmark = pytest.mark.anyio


class _Body(httpx.AsyncByteStream):
    def __init__(self, chunks: list[bytes], error: Exception | None = None) -> None:
        self.chunks = chunks
        self.error = error
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk
        if self.error is not None:
            raise self.error

    async def aclose(self) -> None:
        self.closed = True


async def relay(response: RelayResponse) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []
    never = anyio.Event()

    async def receive() -> dict[str, Any]:
        await never.wait()  # the client never hangs up
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    with anyio.fail_after(5):
        await response({"type": "http"}, receive, send)
    return sent


def anthropic_error(error: ProxyError) -> dict[str, Any]:
    return {"type": "error", "error": {"type": "api_error", "message": error.message}}


async def test_relays_the_body_with_repeated_headers() -> None:
    request = httpx.Request("POST", "http://u/v1/x")
    body = _Body([b"one ", b"two"])
    upstream = httpx.Response(200, stream=body, request=request)
    ended: list[RelayResult] = []

    async def on_end(result: RelayResult) -> None:
        ended.append(result)

    headers = [("set-cookie", "a=1"), ("set-cookie", "b=2"), ("content-type", "text/plain")]
    response = RelayResponse(upstream, status_code=201, headers=headers, on_end=on_end)
    assert isinstance(response.body, bytes)  # a whole Response: its __init__ ran
    assert response.background is None
    sent = await relay(response)
    assert sent[0]["status"] == 201
    assert [v for k, v in sent[0]["headers"] if k == b"set-cookie"] == [b"a=1", b"b=2"]
    assert b"".join(m.get("body", b"") for m in sent[1:]) == b"one two"
    assert body.closed
    assert [r.outcome for r in ended] == ["completed"]


async def test_a_broken_stream_ends_with_the_apis_error_event() -> None:
    request = httpx.Request("POST", "http://u/v1/messages")
    body = _Body([b"event: ping\ndata: {}\n\n"], httpx.ReadError("reset", request=request))
    upstream = httpx.Response(200, stream=body, request=request)
    ended: list[RelayResult] = []

    async def on_end(result: RelayResult) -> None:
        ended.append(result)

    def frame(error: ProxyError) -> bytes:
        return b"event: error\ndata: " + orjson.dumps(anthropic_error(error)) + b"\n\n"

    response = RelayResponse(
        upstream,
        status_code=200,
        headers=[("content-type", "text/event-stream")],
        on_end=on_end,
        error_frame=frame,
    )
    sent = await relay(response)
    last = sent[-1]["body"]
    assert last.startswith(b"event: error\ndata: ")
    event = orjson.loads(last.split(b"data: ", 1)[1])
    assert event["type"] == "error"
    assert event["error"]["message"] == "upstream http://u/v1/messages stream broke (ReadError)"
    assert [r.outcome for r in ended] == ["upstream_error"]
    assert body.closed
