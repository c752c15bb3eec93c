"""An `Api` plugs into `ApiService` with no branch: its own body check, upstream path and error
envelope (the proxy's own errors on its route, before and after the body is read)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from starlette.responses import Response

from inflight.apis.chat.api import API as CHAT_API
from inflight.errors import ProxyError
from inflight.factory import create_app
from inflight.http.state import AppState, api_client
from inflight.proxy.api import Api
from inflight.proxy.body import parse_chat_body
from inflight.proxy.service import ApiService
from tests.conftest import make_settings
from tests.support.fakes import FakeUpstream

pytestmark = pytest.mark.anyio
KEY = {"authorization": "Bearer k1"}
CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}


def own_envelope(error: ProxyError) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error.error_type, "message": error.message}}


def strict_body(raw: bytes) -> dict[str, Any]:
    body = parse_chat_body(raw)
    if "temperature" in body:
        from inflight.errors import BadRequest

        raise BadRequest("no temperature here", param="temperature")
    return body


@pytest.fixture
async def client(tmp_path: Path, fake: FakeUpstream) -> AsyncIterator[httpx.AsyncClient]:
    app: FastAPI = create_app(
        make_settings(tmp_path, api_keys="k1"), transport=httpx.ASGITransport(app=fake.app)
    )
    state: AppState = app.state.inflight
    api = Api(
        route="/custom",
        upstream_path="/chat/completions",
        wire=CHAT_API.wire,
        events=CHAT_API.events,
        parse_body=strict_body,
        error_body=own_envelope,
    )
    service = ApiService(state.settings, state.upstream, api, state.compactor)

    @app.post("/custom", response_model=None)
    async def custom(request: Request) -> Response:
        return await service.handle(request, await api_client(request, service))

    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://p") as c,
    ):
        yield c


async def test_an_api_renders_the_proxys_errors_in_its_envelope(client: httpx.AsyncClient) -> None:
    unauthorized = await client.post("/custom", json=CHAT)
    assert unauthorized.status_code == 401
    assert unauthorized.json()["type"] == "error"
    refused = await client.post("/custom", json={**CHAT, "temperature": 1}, headers=KEY)
    assert refused.status_code == 400
    assert refused.json() == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "no temperature here"},
    }
    # chat completions keeps OpenAI's envelope
    chat = await client.post("/v1/chat/completions", json={**CHAT, "messages": []}, headers=KEY)
    assert set(chat.json()["error"]) == {"message", "type", "param", "code"}


async def test_an_api_is_forwarded_to_its_upstream_path(
    client: httpx.AsyncClient, fake: FakeUpstream
) -> None:
    response = await client.post("/custom", json=CHAT, headers=KEY)
    assert response.status_code == 200
    assert response.headers["x-compaction-applied"] == "none"
    assert len(fake.chat_requests) == 1
