"""The compacting APIs' routes served ahead of FastAPI's router (app/http/hot.py): the same
answers as through the router — success, the API's error envelope, a 500 for a bug (and the
error raised to the server) — with FastAPI's middleware stack never entered for them, and
everything else (other methods, other paths) still routed by FastAPI."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from inflight.proxy.service import ApiService
from tests.support.fakes import FakeUpstream

pytestmark = pytest.mark.anyio
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
MESSAGES = {"model": "claude-x", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}


class _Stack:
    """Counts the requests that enter FastAPI's middleware stack."""

    def __init__(self, app: FastAPI) -> None:
        self.inner, self.paths = app.middleware_stack, []
        assert self.inner is not None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.paths.append(scope.get("path"))
        assert self.inner is not None
        await self.inner(scope, receive, send)


@pytest.fixture
async def stack(app: FastAPI, client: httpx.AsyncClient) -> _Stack:
    await client.get("/healthz")  # FastAPI builds its stack on the first request
    spy = _Stack(app)
    app.middleware_stack = spy  # type: ignore[assignment]
    return spy


async def test_the_hot_routes_bypass_the_stack_and_the_rest_do_not(
    client: httpx.AsyncClient, stack: _Stack, fake: FakeUpstream
) -> None:
    answer = await client.post("/v1/chat/completions", json=CHAT)
    assert answer.status_code == 200
    assert answer.json()["choices"][0]["message"]["content"] == "Hello there"
    assert "x-compaction-tokens-before" in answer.headers
    stream = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert stream.status_code == 200
    assert stream.text.rstrip().endswith("data: [DONE]")
    assert stack.paths == []
    assert (await client.get("/healthz")).status_code == 200
    await client.get("/v1/chat/completions")  # another method: the router's (passthrough)
    await client.post("/v1/chat/completions/", json=CHAT)  # another path
    assert stack.paths == ["/healthz", "/v1/chat/completions", "/v1/chat/completions/"]


@pytest.mark.parametrize(
    ("path", "body", "envelope"),
    [
        ("/v1/chat/completions", CHAT, "error"),
        ("/v1/responses", {"model": "m", "input": "hi"}, "error"),
        ("/v1/messages", MESSAGES, "anthropic"),
    ],
)
async def test_errors_render_in_the_api_envelope(
    client: httpx.AsyncClient, stack: _Stack, path: str, body: dict[str, Any], envelope: str
) -> None:
    """A refused request (bad JSON, a missing model) in the API's own envelope, as through the
    router's exception handlers."""
    bad = await client.post(
        path, content=b"{not json", headers={"content-type": "application/json"}
    )
    assert bad.status_code == 400
    if envelope == "anthropic":
        assert bad.json()["type"] == "error"
        assert bad.json()["error"]["type"] == "invalid_request_error"
    else:
        assert bad.json()["error"]["message"]
    missing = await client.post(path, json={k: v for k, v in body.items() if k != "model"})
    assert missing.status_code == 400
    assert stack.paths == []


async def test_a_bug_is_a_500_and_reaches_the_server(
    app: FastAPI, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An unexpected error in a hot route: logged, a 500 in OpenAI's envelope, and raised to the
    server afterwards (as Starlette's ServerErrorMiddleware does)."""

    async def broken(self: ApiService, *args: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr(ApiService, "handle", broken)
    quiet = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=quiet, base_url="http://proxy.test") as client:
        answer = await client.post("/v1/chat/completions", json=CHAT)
    assert answer.status_code == 500
    assert answer.json()["error"]["message"] == "internal error in the proxy"
    assert "unexpected error on POST /v1/chat/completions" in caplog.text
    loud = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=loud, base_url="http://proxy.test") as client:
        with pytest.raises(RuntimeError, match="a bug"):
            await client.post("/v1/chat/completions", json=CHAT)


async def test_the_query_string_goes_upstream_as_sent(
    client: httpx.AsyncClient, fake: FakeUpstream
) -> None:
    """Azure-style `?api-version=…` on a compacting route reaches the upstream byte for byte."""
    answer = await client.post("/v1/chat/completions?api-version=2024-01-01&x=%20y", json=CHAT)
    assert answer.status_code == 200
    assert fake.requests[-1].path == "/v1/chat/completions"
    assert fake.requests[-1].query == "api-version=2024-01-01&x=%20y"
