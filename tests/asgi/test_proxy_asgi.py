"""ASGI tier: status codes, errors, headers and non-streaming bodies through the proxy."""

from __future__ import annotations

import os
import traceback
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from fastapi import FastAPI

from inflight.factory import create_app
from tests.conftest import make_settings
from tests.support.fakes import FakeUpstream
from tests.support.servers import WatchedStore

pytestmark = pytest.mark.anyio

CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}


def assert_openai_error(response: httpx.Response, status: int, code: str | None = None) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    if code is not None:
        assert error["code"] == code


async def _app_with(tmp_path: Path, transport: httpx.AsyncBaseTransport, **kw: Any) -> FastAPI:
    return create_app(make_settings(tmp_path, **kw), transport=transport)


async def test_untouched_request_arrives_byte_identical(
    client: httpx.AsyncClient, fake: FakeUpstream
) -> None:
    raw = b'{ "messages": [ {"role":"user","content":"hi \\u00e9 <|endoftext|>"} ],\n "model":"m", "x_unknown": {"keep": [1, 2.50]} }'
    response = await client.post(
        "/v1/chat/completions", content=raw, headers={"content-type": "application/json"}
    )
    assert response.status_code == 200
    assert fake.chat_requests[0].body == raw


async def test_json_answer_relayed_with_status(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == "Hello there"


async def test_bad_json_is_400(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/chat/completions", content=b"{not json")
    assert_openai_error(response, 400, "invalid_json")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ([1, 2], None),
        ({"messages": [{"role": "user", "content": "x"}]}, "model"),
        ({"model": "m", "messages": []}, "messages"),
        ({"model": "m", "messages": "hello"}, "messages"),
        ({"model": "m", "messages": [{"content": "x"}]}, "messages[0].role"),
        ({"model": "m", "messages": ["x"]}, "messages[0]"),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}, "stream"),
    ],
)
async def test_bad_shape_is_400_naming_the_field(
    client: httpx.AsyncClient, body: Any, param: str | None
) -> None:
    response = await client.post("/v1/chat/completions", content=orjson.dumps(body))
    assert_openai_error(response, 400)
    assert response.json()["error"]["param"] == param


async def test_deep_nesting_is_400(client: httpx.AsyncClient) -> None:
    deep: Any = "x"
    for _ in range(200):
        deep = [deep]
    body = {"model": "m", "messages": [{"role": "user", "content": deep}]}
    response = await client.post("/v1/chat/completions", content=orjson.dumps(body))
    assert_openai_error(response, 400)


async def test_missing_or_wrong_key_is_401_and_never_echoed(
    tmp_path: Path, fake: FakeUpstream
) -> None:
    app = await _app_with(
        tmp_path, httpx.ASGITransport(app=fake.app), api_keys="sk-proxy-1,sk-proxy-2"
    )
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://p") as c:
        missing = await c.post("/v1/chat/completions", json=CHAT)
        wrong = await c.post(
            "/v1/chat/completions", json=CHAT, headers={"authorization": "Bearer sk-guess"}
        )
        models = await c.get("/v1/models", headers={"authorization": "Bearer sk-guess"})
        ok = await c.post(
            "/v1/chat/completions", json=CHAT, headers={"authorization": "Bearer sk-proxy-2"}
        )
    assert_openai_error(missing, 401, "invalid_api_key")
    assert_openai_error(wrong, 401, "invalid_api_key")
    assert_openai_error(models, 401, "invalid_api_key")
    assert "sk-guess" not in wrong.text
    assert ok.status_code == 200
    assert "authorization" not in fake.chat_requests[-1].headers  # a proxy key stays here


async def test_upstream_key_replaces_client_authorization(
    tmp_path: Path, fake: FakeUpstream
) -> None:
    app = await _app_with(
        tmp_path, httpx.ASGITransport(app=fake.app), upstream_api_key="sk-upstream"
    )
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://p") as c:
        await c.post("/v1/chat/completions", json=CHAT, headers={"authorization": "Bearer sk-c"})
        await c.get("/v1/models", headers={"authorization": "Bearer sk-c"})
    assert len(fake.requests) >= 2
    assert {r.headers["authorization"] for r in fake.requests} == {"Bearer sk-upstream"}


async def test_body_over_limit_is_413_from_content_length(
    tmp_path: Path, fake: FakeUpstream
) -> None:
    app = await _app_with(tmp_path, httpx.ASGITransport(app=fake.app), max_body_bytes=1000)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://p") as c:
        big = {"model": "m", "messages": [{"role": "user", "content": "x" * 2000}]}
        response = await c.post("/v1/chat/completions", json=big)
        passthrough = await c.post("/v1/embeddings", content=b"x" * 5000)
    assert_openai_error(response, 413, "payload_too_large")
    assert_openai_error(passthrough, 413, "payload_too_large")
    assert fake.requests == []


async def test_body_over_limit_is_413_while_streaming_without_reading_it_all(
    tmp_path: Path, fake: FakeUpstream
) -> None:
    app = await _app_with(tmp_path, httpx.ASGITransport(app=fake.app), max_body_bytes=1000)
    pulled = 0

    async def body() -> Any:  # no Content-Length: chunked upload
        nonlocal pulled
        for _ in range(1000):
            pulled += 1
            yield b"y" * 100

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://p") as c:
        response = await c.post("/v1/chat/completions", content=body())
    assert_openai_error(response, 413)
    assert fake.requests == []


async def test_unreachable_upstream_is_502_naming_it_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    app = await _app_with(
        tmp_path, httpx.MockTransport(refuse), upstream_url="http://u:pw@upstream.test:8000/v1"
    )
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://p") as c:
        chat = await c.post("/v1/chat/completions?key=secret", json=CHAT)
        models = await c.get("/v1/models")
    assert_openai_error(chat, 502, "upstream_unavailable")
    assert_openai_error(models, 502, "upstream_unavailable")
    where = "http://upstream.test:8000/v1/chat/completions"  # no credentials, no query
    assert chat.json()["error"]["message"] == f"upstream {where} unreachable (ConnectError)"
    assert "http://upstream.test:8000/v1/models" in models.json()["error"]["message"]
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert f"upstream {where} unreachable: ConnectError: connection refused" in warnings
    assert not any("pw" in w or "secret" in w for w in warnings)


async def test_broken_upstream_body_is_502(tmp_path: Path) -> None:
    def reset(request: httpx.Request) -> httpx.Response:
        raise httpx.RemoteProtocolError("peer closed connection", request=request)

    app = await _app_with(tmp_path, httpx.MockTransport(reset))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://p") as c:
        response = await c.post("/v1/chat/completions", json=CHAT)
    assert_openai_error(response, 502)


async def test_upstream_timeout_is_504(tmp_path: Path) -> None:
    def stall(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    app = await _app_with(tmp_path, httpx.MockTransport(stall))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://p") as c:
        chat = await c.post("/v1/chat/completions", json=CHAT)
        other = await c.get("/v1/models")
    assert_openai_error(chat, 504, "upstream_timeout")
    assert_openai_error(other, 504, "upstream_timeout")
    assert "upstream http://upstream.test/v1/chat/completions timed out" in chat.text


@pytest.mark.parametrize("status", [400, 401, 404, 429, 500, 503])
async def test_upstream_errors_relayed_verbatim(
    client: httpx.AsyncClient, fake: FakeUpstream, status: int
) -> None:
    body = b'{"error": {"message": "nope", "type": "x", "code": "y"}, "extra": 1}'
    fake.error = (status, body, {"retry-after": "7"})
    for stream in (False, True):
        response = await client.post("/v1/chat/completions", json={**CHAT, "stream": stream})
        assert response.status_code == status
        assert response.content == body
        assert response.headers["retry-after"] == "7"


async def test_passthrough_keeps_method_path_query_body(
    client: httpx.AsyncClient, fake: FakeUpstream
) -> None:
    response = await client.post(
        "/v1/embeddings?api-version=2024-01-01&x=%20y",
        content=b'{"input": "abc", "model": "e"}',
        headers={"x-custom": "1", "connection": "keep-alive, x-hop", "x-hop": "secret"},
    )
    assert response.status_code == 200
    assert response.json() == {
        "method": "POST",
        "path": "/v1/embeddings",
        "query": "api-version=2024-01-01&x=%20y",
        "size": 30,
    }
    assert response.headers["x-upstream"] == "yes"
    rec = fake.requests[-1]
    assert rec.body == b'{"input": "abc", "model": "e"}'
    assert rec.headers["x-custom"] == "1"
    assert "x-hop" not in rec.headers
    assert "connection" not in rec.headers or rec.headers["connection"] != "keep-alive, x-hop"
    for method in ("GET", "DELETE", "PUT"):
        r = await client.request(method, "/v1/files/abc")
        assert r.json()["method"] == method


async def test_compaction_headers_are_not_forwarded(
    client: httpx.AsyncClient, fake: FakeUpstream
) -> None:
    await client.post("/v1/chat/completions", json=CHAT, headers={"x-compaction-strategy": "none"})
    assert not any(k.startswith("x-compaction") for k in fake.chat_requests[0].headers)


async def test_unknown_route_is_openai_shaped_404(client: httpx.AsyncClient) -> None:
    assert_openai_error(await client.get("/nope"), 404)


async def test_health_and_ready(client: httpx.AsyncClient) -> None:
    assert (await client.get("/healthz")).json() == {"status": "ok"}
    ready = await client.get("/readyz")
    assert ready.status_code == 200


async def test_not_ready_when_upstream_unreachable(tmp_path: Path) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    app = await _app_with(tmp_path, httpx.MockTransport(refuse))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://p") as c:
        assert (await c.get("/readyz")).status_code == 503


async def test_every_request_answered_is_recorded_with_its_status_and_outcome(
    tmp_path: Path, fake: FakeUpstream
) -> None:
    """What the proxy refuses itself (400, 401, 413) is in the usage table and `/stats` as
    `rejected`; passthrough routes (a stored response, the models) are counted apart."""
    store = WatchedStore()
    app = create_app(
        make_settings(tmp_path, api_keys="k1", max_body_bytes=2000),
        transport=httpx.ASGITransport(app=fake.app),
        store=store,
    )
    key = {"authorization": "Bearer k1"}
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://p") as c,
    ):
        sent = [
            await c.post("/v1/chat/completions", json={**CHAT, "messages": []}, headers=key),
            await c.post("/v1/chat/completions", json={"messages": CHAT["messages"]}, headers=key),
            await c.post(
                "/v1/chat/completions", json=CHAT, headers={**key, "x-compaction-strategy": "x"}
            ),
            await c.post("/v1/chat/completions", json=CHAT),
            await c.post("/v1/chat/completions", content=b"x" * 3000, headers=key),
            await c.post("/v1/chat/completions", json={**CHAT, "stream": True}, headers=key),
            await c.get("/v1/responses/resp_1", headers=key),
            await c.get("/v1/models", headers=key),
        ]
        assert [r.status_code for r in sent] == [400, 400, 400, 401, 413, 200, 200, 200]
        records = await store.written(8)
        stats = (await c.get("/stats", headers=key)).json()
    chat = sorted((r.status, r.outcome, r.model) for r in records if r.kind == "chat")
    assert chat == [
        (200, "completed", "gpt-4o-mini"),
        (400, "rejected", ""),
        (400, "rejected", ""),
        (400, "rejected", "gpt-4o-mini"),  # the bad header: the body was read by then
        (401, "rejected", ""),
        (413, "rejected", ""),
    ]
    assert stats["requests"] == 6
    assert stats["by_outcome"] == {"completed": 1, "rejected": 5}
    assert stats["by_status"] == {"200": 1, "400": 3, "401": 1, "413": 1}
    assert list(stats["models"]) == ["gpt-4o-mini"]
    assert stats["passthrough"] == {
        "requests": 2,
        "by_status": {"200": 2},
        "by_outcome": {"completed": 2},
        "routes": {"/v1/responses": 1, "/v1/models": 1},
    }


APP_DIR = Path(__file__).resolve().parents[2] / "app"


class _WatchedEnviron(dict[str, str]):
    """`os.environ` during requests: records every variable read."""

    def __init__(self, values: dict[str, str]) -> None:
        super().__init__(values)
        self.read: list[str] = []

    def __getitem__(self, key: str) -> str:
        self._note(key)
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        self._note(key)
        return super().get(key, default)

    def _note(self, key: str) -> None:
        caller = traceback.extract_stack(limit=3)[0]  # who called `get` / `[]`
        if Path(caller.filename).is_relative_to(APP_DIR):  # the proxy's own reads, not libraries'
            self.read.append(f"{key} <- {caller.filename}:{caller.lineno}")


async def test_settings_and_keys_are_read_once_not_per_request(
    tmp_path: Path, fake: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The environment is read at startup: a per-model upstream key included (issue 14)."""
    (tmp_path / "models.toml").write_text(
        '[[model]]\npattern = "routed-*"\ncontext_window = 4096\nmax_output = 512\n'
        'upstream = "http://upstream.test/v1"\napi_key_env = "ROUTED_KEY"\n'
    )
    monkeypatch.setenv("ROUTED_KEY", "sk-at-startup")
    app = create_app(
        make_settings(tmp_path, config_dir=tmp_path), transport=httpx.ASGITransport(app=fake.app)
    )
    watched = _WatchedEnviron({**os.environ, "ROUTED_KEY": "sk-changed-later"})
    async with app.router.lifespan_context(app):
        monkeypatch.setattr(os, "environ", watched)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://proxy.test") as client:
            for model in ("routed-qwen", "gpt-4o-mini"):
                response = await client.post("/v1/chat/completions", json={**CHAT, "model": model})
                assert response.status_code == 200, response.text
    assert watched.read == []
    assert fake.chat_requests[0].headers["authorization"] == "Bearer sk-at-startup"
