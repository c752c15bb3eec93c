"""Security: which credentials reach which upstream. The operator's keys go only to the
upstream they were configured for, a client's proxy key never leaves the proxy, and an
upstream key that replaces the client's replaces every credential header it sent."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from fastapi import FastAPI

from inflight.factory import create_app
from inflight.proxy.headers import filter_request_headers
from inflight.proxy.upstream import Upstream
from inflight.windows.table import ModelTable
from tests.conftest import make_settings
from tests.e2e.test_summarize import agent_log
from tests.support.fakes import FakeUpstream

pytestmark = pytest.mark.anyio

OPENAI_KEY = "sk-operator-openai-0001"
ANTHROPIC_KEY = "sk-operator-anthropic-0002"
PROXY_KEY = "proxy-key-0003"
CLIENT_KEY = "sk-client-own-0004"
ROUTED = """
[[model]]
pattern = "routed-*"
context_window = 8192
max_output = 1024
upstream = "http://other.test/v1"

[[model]]
pattern = "same-*"
context_window = 8192
max_output = 1024
upstream = "http://upstream.test/v1"
"""


@dataclass
class Seen:
    """Every request the proxy sent, to the fake OpenAI upstream (any host) or, for
    `anthropic.test`, to the fake Anthropic one."""

    openai: FakeUpstream = field(default_factory=FakeUpstream)
    anthropic: FakeUpstream = field(default_factory=FakeUpstream)
    requests: list[httpx.Request] = field(default_factory=list)

    def transport(self) -> httpx.AsyncBaseTransport:
        openai = httpx.ASGITransport(app=self.openai.app)
        anthropic = httpx.ASGITransport(app=self.anthropic.app)

        async def handle(request: httpx.Request) -> httpx.Response:
            await request.aread()
            self.requests.append(request)
            target = anthropic if request.url.host == "anthropic.test" else openai
            return await target.handle_async_request(request)

        return httpx.MockTransport(handle)

    def to(self, host: str) -> list[httpx.Request]:
        """The API calls (not window discovery's probes) sent to `host`."""
        apis = ("/chat/completions", "/responses", "/messages")
        return [r for r in self.requests if r.url.host == host and r.url.path.endswith(apis)]

    def operator_keys_went_to(self, host: str) -> bool:
        return any(
            OPENAI_KEY in v or ANTHROPIC_KEY in v
            for r in self.requests
            if r.url.host == host
            for v in self.values(r)
        )

    def values(self, request: httpx.Request) -> list[str]:
        return [v for _, v in request.headers.multi_items()]


@pytest.fixture
def seen() -> Seen:
    return Seen()


def _config(tmp_path: Path) -> Path:
    config = tmp_path / "config"
    config.mkdir()
    (config / "models.toml").write_text(ROUTED)
    return config


@pytest.fixture
async def app(tmp_path: Path, seen: Seen) -> AsyncIterator[FastAPI]:
    settings = make_settings(
        tmp_path,
        config_dir=_config(tmp_path),
        upstream_api_key=OPENAI_KEY,
        anthropic_upstream_url="http://anthropic.test/v1",
        anthropic_api_key=ANTHROPIC_KEY,
    )
    application = create_app(settings, transport=seen.transport())
    async with application.router.lifespan_context(application):
        yield application


def _client(app: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy")


def _chat(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}]}


def _messages(model: str) -> dict[str, Any]:
    return {"model": model, "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}


# -- models.toml routes never get the operator's default keys --------------------------------


async def test_a_routed_chat_model_without_api_key_env_gets_the_clients_key(
    app: FastAPI, seen: Seen
) -> None:
    async with _client(app) as client:
        response = await client.post(
            "/v1/chat/completions",
            json=_chat("routed-1"),
            headers={"authorization": f"Bearer {CLIENT_KEY}"},
        )
    assert response.status_code == 200, response.text
    (sent,) = seen.to("other.test")
    assert sent.headers["authorization"] == f"Bearer {CLIENT_KEY}"
    assert not seen.operator_keys_went_to("other.test")


async def test_a_routed_messages_model_without_api_key_env_gets_the_clients_key(
    app: FastAPI, seen: Seen
) -> None:
    async with _client(app) as client:
        await client.post(
            "/v1/messages", json=_messages("routed-1"), headers={"x-api-key": CLIENT_KEY}
        )
    (sent,) = seen.to("other.test")
    assert sent.headers.get("x-api-key") == CLIENT_KEY
    assert not seen.operator_keys_went_to("other.test")


async def test_a_route_to_the_default_upstream_itself_keeps_its_key(
    app: FastAPI, seen: Seen
) -> None:
    async with _client(app) as client:
        await client.post("/v1/chat/completions", json=_chat("same-1"))
    (sent,) = seen.to("upstream.test")
    assert sent.headers["authorization"] == f"Bearer {OPENAI_KEY}"


async def test_a_summary_model_routed_elsewhere_gets_the_clients_key_not_the_operators(
    app: FastAPI, seen: Seen
) -> None:
    """`X-Compaction-Summary-Model` names a model routed to another upstream: the summary call
    goes there with the client's credentials; the request itself still uses the operator's
    key on the default upstream."""
    seen.openai.context_window = 8192
    body = {"model": "fake-model", "messages": agent_log(60), "max_tokens": 256}
    async with _client(app) as client:
        response = await client.post(
            "/v1/chat/completions",
            content=orjson.dumps(body),
            headers={
                "authorization": f"Bearer {CLIENT_KEY}",
                "x-compaction-summary-model": "routed-summariser",
                "x-compaction-summary-wait": "true",
                "x-compaction-strategy": "summarize",
            },
        )
    assert response.status_code == 200, response.text
    summaries = seen.to("other.test")
    assert summaries, "no summary call reached the summary model's upstream"
    for sent in summaries:
        assert orjson.loads(sent.content)["model"] == "routed-summariser"
        assert sent.headers["authorization"] == f"Bearer {CLIENT_KEY}"
    assert not seen.operator_keys_went_to("other.test")
    chat = [r for r in seen.to("upstream.test") if r.url.path.endswith("/chat/completions")]
    assert chat
    assert all(r.headers["authorization"] == f"Bearer {OPENAI_KEY}" for r in chat)


def test_upstream_route_never_falls_back_to_the_default_key_for_another_upstream(
    tmp_path: Path,
) -> None:
    settings = make_settings(
        tmp_path, config_dir=_config(tmp_path), upstream_api_key=OPENAI_KEY,
        anthropic_api_key=ANTHROPIC_KEY,
    )  # fmt: skip
    upstream = Upstream(settings, routes=ModelTable.load(settings.config_file("models.toml")))
    assert upstream.route("routed-x").api_key is None
    assert upstream.route("routed-x", "anthropic").api_key is None
    assert upstream.route("same-x").api_key == OPENAI_KEY
    assert upstream.route("gpt-4o").api_key == OPENAI_KEY  # the default upstream's own
    assert upstream.route("claude-x", "anthropic").api_key == ANTHROPIC_KEY


# -- a substituted key replaces every credential header ----------------------------------------


@pytest.mark.parametrize("name", ["authorization", "x-api-key", "api-key"])
def test_a_substituted_openai_key_drops_every_client_credential(name: str) -> None:
    value = f"Bearer {CLIENT_KEY}" if name == "authorization" else CLIENT_KEY
    out = filter_request_headers([(name, value)], api_key=OPENAI_KEY, identity=False)
    assert out == [("authorization", f"Bearer {OPENAI_KEY}")]


@pytest.mark.parametrize("name", ["authorization", "x-api-key", "api-key"])
def test_a_substituted_anthropic_key_drops_every_client_credential(name: str) -> None:
    value = f"Bearer {CLIENT_KEY}" if name == "authorization" else CLIENT_KEY
    out = filter_request_headers(
        [(name, value)], api_key=ANTHROPIC_KEY, identity=False, key_header="x-api-key"
    )
    assert out == [("x-api-key", ANTHROPIC_KEY)]


# -- the client's proxy key never goes upstream --------------------------------------------------


async def _proxy_keyed_app(tmp_path: Path, seen: Seen, **settings: Any) -> FastAPI:
    return create_app(
        make_settings(
            tmp_path,
            api_keys=PROXY_KEY,
            anthropic_upstream_url="http://anthropic.test/v1",
            **settings,
        ),
        transport=seen.transport(),
    )


SENDS = [
    ("POST", "/v1/chat/completions", _chat("gpt-4o-mini")),
    ("POST", "/v1/responses", {"model": "gpt-4o-mini", "input": "hi"}),
    ("POST", "/v1/messages", _messages("claude-sonnet-4-5")),
    ("POST", "/v1/messages/count_tokens", _messages("claude-sonnet-4-5")),
    ("GET", "/v1/models", None),
]
HOW = [
    {"x-api-key": PROXY_KEY},
    {"authorization": f"Bearer {PROXY_KEY}"},
    {"x-api-key": PROXY_KEY, "authorization": f"Bearer {CLIENT_KEY}"},
    {"authorization": f"Bearer {PROXY_KEY}", "x-api-key": CLIENT_KEY, "api-key": PROXY_KEY},
]


@pytest.mark.parametrize("upstream_key", [OPENAI_KEY, None])
@pytest.mark.parametrize("headers", HOW)
@pytest.mark.parametrize(("method", "path", "body"), SENDS)
async def test_the_proxy_key_never_goes_upstream_in_any_header(
    tmp_path: Path,
    seen: Seen,
    method: str,
    path: str,
    body: Any,
    headers: dict[str, str],
    upstream_key: str | None,
) -> None:
    app = await _proxy_keyed_app(tmp_path, seen, upstream_api_key=upstream_key)
    async with _client(app) as client:
        response = await client.request(method, path, json=body, headers=headers)
    assert response.status_code != 401, response.text
    assert seen.requests, "nothing reached the upstream"
    for sent in seen.requests:  # window discovery's probes too
        assert not any(PROXY_KEY in v for v in seen.values(sent)), sent.headers
    (relayed,) = [r for r in seen.requests if r.url.path == path]
    sent_own = any(CLIENT_KEY in v for v in headers.values())
    if sent_own and (upstream_key is None or relayed.url.host == "anthropic.test"):
        assert any(CLIENT_KEY in v for v in seen.values(relayed))  # the client's own still goes


async def test_the_proxy_key_is_not_in_summary_calls(tmp_path: Path, seen: Seen) -> None:
    seen.openai.context_window = 8192
    app = await _proxy_keyed_app(tmp_path, seen, summary_wait=True)
    body = {"model": "fake-model", "messages": agent_log(60), "max_tokens": 256}
    async with app.router.lifespan_context(app), _client(app) as client:
        response = await client.post(
            "/v1/chat/completions",
            content=orjson.dumps(body),
            headers={"x-api-key": PROXY_KEY, "authorization": f"Bearer {CLIENT_KEY}"},
        )
    assert response.status_code == 200, response.text
    assert seen.openai.summary_calls >= 1
    for sent in seen.requests:
        assert not any(PROXY_KEY in v for v in seen.values(sent))
