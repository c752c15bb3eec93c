"""`POST /v1/messages` through the app (ASGI, a fake Anthropic upstream that enforces the API's
rules and a window, and respx): byte-exact forwarding, compaction that keeps the rules and the
breakpoints, streams, usage with cache reads and writes, the upstream and its key, overflow
recovery, summaries asked of Anthropic, errors in Anthropic's envelope, count_tokens."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import respx
from fastapi import FastAPI
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from inflight.factory import create_app
from inflight.proxy.upstream import Upstream
from inflight.settings import Settings
from tests.conftest import make_settings
from tests.support import load_traces
from tests.support.anthropic_conversations import from_chat
from tests.support.fakes import FakeUpstream
from tests.support.fakes.anthropic import SUMMARY_REPLY, all_blocks, prompt_tokens, rule_violations
from tests.support.servers import WatchedStore

pytestmark = pytest.mark.anyio

ANTHROPIC = "http://anthropic.test/v1"
PROMPT = (Path(__file__).resolve().parents[2] / "config" / "summary_prompt.md").read_text()
HEADERS = {"x-api-key": "sk-ant-client", "anthropic-version": "2023-06-01"}
SMALL = {
    "model": "claude-sonnet-4-5",
    "max_tokens": 64,
    "messages": [{"role": "user", "content": "Hello"}],
}


def output(i: int, size: int) -> str:
    """A tool output of about `size` chars that reads like one (numbers, words, paths)."""
    return f"out {i}\n" + "\n".join(
        f"src/mod{j}.py:{j * 7} value={i * j}" for j in range(size // 24)
    )


def agent_body(rounds: int = 30, size: int = 3000) -> dict[str, Any]:
    """A Claude Code session: the task, then tool rounds with large results; breakpoints on the
    system prompt and on the last user message."""
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "Fix the failing test."}]}
    ]
    for i in range(rounds):
        messages += [
            {"role": "assistant", "content": [
                {"type": "text", "text": f"step {i}"},
                {"type": "tool_use", "id": f"toolu_{i}", "name": "Bash", "input": {"command": f"cat f{i}"}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": output(i, size)},
            ]},
        ]  # fmt: skip
    messages[-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}
    system = [
        {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}
    ]
    return {
        "model": "claude-sonnet-4-5",
        "max_tokens": 1024,
        "system": system,
        "messages": messages,
    }


@pytest.fixture
def fake() -> FakeUpstream:
    return FakeUpstream()


@pytest.fixture
def store() -> WatchedStore:
    return WatchedStore()


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return make_settings(tmp_path, anthropic_upstream_url=ANTHROPIC)


@pytest.fixture
async def app(
    settings: Settings, fake: FakeUpstream, store: WatchedStore
) -> AsyncIterator[FastAPI]:
    application = create_app(settings, transport=httpx.ASGITransport(app=fake.app), store=store)
    async with application.router.lifespan_context(application):
        yield application


async def post(client: httpx.AsyncClient, body: Any, **headers: str) -> httpx.Response:
    content = body if isinstance(body, bytes) else orjson.dumps(body)
    return await client.post("/v1/messages", content=content, headers={**HEADERS, **headers})


def assert_anthropic_error(response: httpx.Response, status: int, kind: str) -> str:
    assert response.status_code == status, response.text
    data = response.json()
    assert data["type"] == "error"
    assert set(data["error"]) == {"type", "message"}
    assert data["error"]["type"] == kind
    message: str = data["error"]["message"]
    assert message
    return message


async def test_a_request_that_fits_goes_up_byte_for_byte_with_its_headers(
    client: httpx.AsyncClient, fake: FakeUpstream, store: WatchedStore
) -> None:
    raw = b'{ "model":"claude-sonnet-4-5", "max_tokens": 64,\n "messages":[{"role":"user","content":"Hi"}], "x_new": 1}'
    fake.cached_tokens, fake.cache_write_tokens = 10, 5
    response = await post(client, raw, **{"anthropic-beta": "prompt-caching-2024-07-31"})
    assert response.status_code == 200, response.text
    assert response.json()["content"][0]["text"] == "Hello from Claude"
    assert response.headers["x-compaction-applied"] == "none"
    assert response.headers["x-compaction-context-limit"] == "200000"
    sent = fake.messages_requests[0]
    assert sent.body == raw
    assert sent.headers["x-api-key"] == "sk-ant-client"
    assert sent.headers["anthropic-version"] == "2023-06-01"
    assert sent.headers["anthropic-beta"] == "prompt-caching-2024-07-31"
    (record,) = await store.written(1)
    assert record.route == "/v1/messages"
    assert record.cached_tokens == 10
    assert record.cache_write_tokens == 5
    assert record.prompt_tokens == fake_prompt(fake)  # input + cache reads + cache writes
    assert record.completion_tokens == 3


async def test_a_long_session_is_compacted_within_anthropics_rules(
    client: httpx.AsyncClient, fake: FakeUpstream
) -> None:
    body = agent_body()
    response = await post(client, body, **{"x-compaction-context-limit": "16000"})
    assert response.status_code == 200, response.text
    assert response.headers["x-compaction-applied"] != "none"
    assert int(response.headers["x-compaction-tokens-after"]) < int(
        response.headers["x-compaction-tokens-before"]
    )
    sent = fake.messages_requests[0].json()
    assert fake.rejected == []
    assert rule_violations(sent) == []
    assert sent["system"] == body["system"]
    assert sent["messages"][0] == body["messages"][0]
    assert sent["messages"][-1] == body["messages"][-1]  # with its breakpoint
    marked = [b for b in all_blocks(sent) if b.get("cache_control")]
    assert 2 <= len(marked) <= 2  # the two Claude Code breakpoints, none added


async def test_a_stream_is_relayed_and_its_usage_recorded(
    client: httpx.AsyncClient, fake: FakeUpstream, store: WatchedStore
) -> None:
    fake.cached_tokens, fake.cache_write_tokens = 3, 2
    body = {**SMALL, "stream": True}
    response = await post(client, body)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    text = response.text
    for event in ("message_start", "content_block_delta", "ping", "message_delta", "message_stop"):
        assert f"event: {event}" in text
    (record,) = await store.written(1)
    assert record.outcome == "completed"
    assert record.stream
    assert (record.cached_tokens, record.cache_write_tokens, record.completion_tokens) == (3, 2, 3)
    assert record.prompt_tokens == fake_prompt(fake)


def fake_prompt(fake: FakeUpstream) -> int:
    return prompt_tokens(fake.messages_requests[-1].json())


async def test_the_configured_key_replaces_the_clients(tmp_path: Path, fake: FakeUpstream) -> None:
    settings = make_settings(
        tmp_path, anthropic_upstream_url=ANTHROPIC, anthropic_api_key="sk-ant-operator"
    )
    app = create_app(settings, transport=httpx.ASGITransport(app=fake.app))
    async with app.router.lifespan_context(app), _client(app) as client:
        response = await post(client, SMALL, authorization="Bearer oauth-token")
    assert response.status_code == 200
    sent = fake.messages_requests[0].headers
    assert sent["x-api-key"] == "sk-ant-operator"
    assert "authorization" not in sent


def _client(app: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy.test")


@pytest.mark.parametrize("where", ["x-api-key", "authorization"])
async def test_proxy_keys_are_accepted_in_x_api_key_or_bearer(
    tmp_path: Path, fake: FakeUpstream, where: str
) -> None:
    settings = make_settings(tmp_path, anthropic_upstream_url=ANTHROPIC, api_keys="proxy-key")
    app = create_app(settings, transport=httpx.ASGITransport(app=fake.app))
    value = "proxy-key" if where == "x-api-key" else "Bearer proxy-key"
    async with app.router.lifespan_context(app), _client(app) as client:
        ok = await client.post("/v1/messages", json=SMALL, headers={where: value})
        refused = await client.post("/v1/messages", json=SMALL, headers={where: "nope"})
        missing = await client.post("/v1/messages", json=SMALL)
        chat = await client.post("/v1/chat/completions", json={}, headers={where: "nope"})
    assert ok.status_code == 200, ok.text
    assert_anthropic_error(refused, 401, "authentication_error")
    assert_anthropic_error(missing, 401, "authentication_error")
    assert chat.status_code == 401
    assert chat.json()["error"]["code"] == "invalid_api_key"  # OpenAI's envelope there


async def test_errors_the_proxy_makes_are_in_anthropics_envelope(
    tmp_path: Path, client: httpx.AsyncClient
) -> None:
    assert_anthropic_error(await post(client, b"{nope"), 400, "invalid_request_error")
    assert_anthropic_error(await post(client, {"messages": []}), 400, "invalid_request_error")
    settings = make_settings(tmp_path, anthropic_upstream_url=ANTHROPIC, max_body_bytes=100)
    app = create_app(settings, transport=httpx.ASGITransport(app=FakeUpstream().app))
    async with app.router.lifespan_context(app), _client(app) as small:
        too_big = await post(small, agent_body(rounds=2))
    assert_anthropic_error(too_big, 413, "request_too_large")


@pytest.mark.parametrize(
    ("failure", "status", "kind"),
    [
        (httpx.ConnectError("refused"), 502, "api_error"),
        (httpx.ReadTimeout("slow"), 504, "timeout_error"),
    ],
)
async def test_an_unreachable_or_slow_upstream_is_an_anthropic_error(
    tmp_path: Path, failure: Exception, status: int, kind: str
) -> None:
    settings = make_settings(tmp_path, anthropic_upstream_url=ANTHROPIC)
    with respx.mock(assert_all_called=False) as mock:
        mock.post(f"{ANTHROPIC}/messages").mock(side_effect=failure)
        mock.route().respond(404)
        app = create_app(settings)
        async with app.router.lifespan_context(app), _client(app) as client:
            response = await post(client, SMALL)
    message = assert_anthropic_error(response, status, kind)
    assert "anthropic.test" in message


async def test_upstream_errors_are_relayed_as_they_are(
    client: httpx.AsyncClient, fake: FakeUpstream
) -> None:
    error = b'{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}'
    fake.error = (529, error, {})
    response = await post(client, SMALL)
    assert response.status_code == 529
    assert response.content == error


async def test_a_model_routed_in_the_table_goes_to_its_upstream(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.mkdir()
    (config / "models.toml").write_text(
        '[[model]]\npattern = "claude-local*"\ncontext_window = 8192\nmax_output = 512\n'
        'upstream = "http://llama.test/v1"\n'
    )
    (config / "summary_prompt.md").write_text(PROMPT)
    settings = make_settings(tmp_path, anthropic_upstream_url=ANTHROPIC, config_dir=config)
    with respx.mock(assert_all_called=False) as mock:
        local = mock.post("http://llama.test/v1/messages").respond(json={"content": []})
        mock.route().respond(404)
        app = create_app(settings)
        async with app.router.lifespan_context(app), _client(app) as client:
            response = await post(client, {**SMALL, "model": "claude-local-q4"})
    assert response.status_code == 200
    assert local.called


async def test_an_overflow_teaches_the_window_and_the_request_is_retried_once(
    client: httpx.AsyncClient, fake: FakeUpstream, store: WatchedStore
) -> None:
    fake.context_window = 30_000  # the table says 200k
    response = await post(client, agent_body(rounds=40))
    assert response.status_code == 200, response.text
    first, retry = fake.messages_requests
    assert fake.rejected[0].startswith("prompt is too long")
    assert len(retry.body) < len(first.body)
    assert response.headers["x-compaction-context-limit"] == "30000"
    assert rule_violations(retry.json()) == []
    (record,) = await store.written(1)
    assert record.status == 200


async def test_summaries_are_asked_of_the_anthropic_upstream_with_the_clients_key(
    client: httpx.AsyncClient, fake: FakeUpstream
) -> None:
    body = agent_body()
    body["messages"].append({"role": "assistant", "content": "Done."})
    body["messages"].append({"role": "user", "content": "Now explain."})
    response = await post(
        client,
        body,
        **{
            "x-compaction-context-limit": "16000",
            "x-compaction-strategy": "summarize",
            "x-compaction-summary-wait": "true",  # made for this request, with its key
        },
    )
    assert response.status_code == 200, response.text
    assert response.headers["x-compaction-applied"] == "summarize"
    assert response.headers["x-compaction-summary"] == "ready"
    (summary_call,) = fake.summary_requests
    assert summary_call.headers["x-api-key"] == "sk-ant-client"
    assert summary_call.headers["anthropic-version"] == "2023-06-01"
    sent = fake.messages_requests[0].json()
    assert rule_violations(sent) == []
    texts = [
        b.get("text", "") for m in sent["messages"] for b in m["content"] if isinstance(b, dict)
    ]
    assert any(SUMMARY_REPLY in t for t in texts)


async def test_the_1m_beta_unlocks_the_1m_window(client: httpx.AsyncClient) -> None:
    response = await post(client, SMALL, **{"anthropic-beta": "context-1m-2025-08-07"})
    assert response.headers["x-compaction-context-limit"] == "1000000"


async def test_a_bad_body_is_forwarded_when_it_fits_and_a_400_naming_the_field_when_it_must_be_compacted(
    client: httpx.AsyncClient, fake: FakeUpstream
) -> None:
    small = {**SMALL, "messages": [{"role": "user", "content": [{"type": "tool_use", "id": "x"}]}]}
    forwarded = await post(client, small)
    assert forwarded.status_code == 400  # the upstream's own verdict, relayed
    assert fake.messages_requests[-1].json() == small
    body = agent_body()
    body["messages"][4]["content"].append({"type": "tool_use", "id": "t", "name": "n", "input": {}})
    count = len(fake.requests)
    refused = await post(client, body, **{"x-compaction-context-limit": "16000"})
    message = assert_anthropic_error(refused, 400, "invalid_request_error")
    assert message.startswith("messages.4.content.1.type: ")
    assert len(fake.requests) == count  # never sent
    no_max = {k: v for k, v in agent_body().items() if k != "max_tokens"}
    refused = await post(client, no_max, **{"x-compaction-context-limit": "16000"})
    assert "max_tokens" in assert_anthropic_error(refused, 400, "invalid_request_error")


async def test_count_tokens_passes_through_to_the_anthropic_upstream(
    tmp_path: Path, fake: FakeUpstream
) -> None:
    settings = make_settings(
        tmp_path, anthropic_upstream_url=ANTHROPIC, anthropic_api_key="sk-ant-operator"
    )
    app = create_app(settings, transport=httpx.ASGITransport(app=fake.app))
    raw = orjson.dumps(SMALL)
    async with app.router.lifespan_context(app), _client(app) as client:
        response = await client.post("/v1/messages/count_tokens", content=raw, headers=HEADERS)
    assert response.status_code == 200
    assert response.json() == {
        "input_tokens": len(
            orjson.dumps({"system": None, "tools": None, "messages": SMALL["messages"]})
        )
        // 4
    }
    (sent,) = fake.requests
    assert sent.path == "/v1/messages/count_tokens"
    assert sent.body == raw
    assert sent.headers["x-api-key"] == "sk-ant-operator"


async def test_stats_count_the_messages_api(
    client: httpx.AsyncClient, fake: FakeUpstream, store: WatchedStore
) -> None:
    fake.cached_tokens, fake.cache_write_tokens = 10, 2
    await post(client, SMALL)
    await store.written(1)
    stats = (await client.get("/stats")).json()
    assert stats["apis"]["messages"]["requests"] == 1
    assert stats["apis"]["messages"]["tokens_cached"] == 10
    assert stats["tokens_cache_write"] == 2
    metrics = (await client.get("/metrics")).text
    assert 'inflight_tokens_total{kind="cache_write",model="claude-sonnet-4-5"} 2.0' in metrics


async def test_a_shipped_transcript_in_claude_codes_shape_is_accepted_turn_after_turn(
    client: httpx.AsyncClient, fake: FakeUpstream
) -> None:
    _, chat = load_traces()[1]
    for k in (40, 120, len(chat)):
        body = from_chat(chat[:k])
        response = await post(client, body, **{"x-compaction-context-limit": "20000"})
        assert response.status_code == 200, response.text
    assert fake.rejected == []


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(["type", "role", "content", "text", "id", "tool_use_id"]),
            inner,
            max_size=4,
        )
    ),
    max_leaves=20,
)


@hypothesis_settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(messages=JSON, limit=st.sampled_from(["64", "100000"]))
async def test_no_body_is_a_500(client: httpx.AsyncClient, messages: Any, limit: str) -> None:
    body = {"model": "claude-sonnet-4-5", "max_tokens": 16, "messages": messages}
    response = await post(client, body, **{"x-compaction-context-limit": limit})
    assert response.status_code < 500, response.text


async def test_discovery_probes_carry_the_default_key_to_its_own_origin_only(
    tmp_path: Path,
) -> None:
    """Regression: window discovery for a Messages request probes the Anthropic upstream, and
    the OpenAI upstream's key went along with every probe."""
    settings = make_settings(
        tmp_path, anthropic_upstream_url=ANTHROPIC, upstream_api_key="sk-openai-secret"
    )
    with respx.mock(assert_all_called=False) as mock:
        probe = mock.get(url__regex=r".*").respond(json={"data": []})
        upstream = Upstream(settings)
        try:
            await upstream.fetch_json("GET", "http://anthropic.test/v1/models")
            await upstream.fetch_json("GET", "http://upstream.test/props")
        finally:
            await upstream.aclose()
    anthropic_probe, own_probe = (call.request for call in probe.calls)
    assert "authorization" not in anthropic_probe.headers
    assert own_probe.headers["authorization"] == "Bearer sk-openai-secret"


@pytest.mark.parametrize(
    "how",
    [
        {"x-compaction-format": "messages"},
        {"anthropic-version": "2023-06-01"},  # detected by the header
        {},  # detected by the top-level system and the tool_use blocks
    ],
)
async def test_preview_and_count_accept_messages_bodies(
    client: httpx.AsyncClient, fake: FakeUpstream, how: dict[str, str]
) -> None:
    body = agent_body()
    limit = {"x-compaction-context-limit": "16000", **how}
    preview = await client.post("/v1/compaction/preview", json=body, headers=limit)
    assert preview.status_code == 200, preview.text
    data = preview.json()
    assert data["report"]["applied"]
    assert rule_violations({**body, "messages": data["messages"]}) == []
    assert data["messages"][0] == body["messages"][0]
    count = await client.post("/v1/compaction/count", json=body, headers=limit)
    assert count.status_code == 200, count.text
    counted = count.json()
    assert counted["model"] == "claude-sonnet-4-5"
    assert counted["context_limit"] == 16000
    assert counted["exact"] is False  # Claude: the calibrated heuristic
    assert counted["prompt_tokens"] > 16000
    assert fake.requests == []  # nothing forwarded


async def test_a_mid_conversation_system_message_is_pinned_and_compacted_around(
    client: httpx.AsyncClient, fake: FakeUpstream
) -> None:
    """(Claude Code sends a non-Claude model such messages; they were forwarded as received.)"""
    body = agent_body()
    terse = {"role": "system", "content": "From now on, be terse."}
    body["messages"].insert(3, terse)
    response = await post(client, orjson.dumps(body), **{"x-compaction-context-limit": "16000"})
    assert response.headers["x-compaction-applied"] != "none"
    assert "x-compaction-skipped" not in response.headers
    forwarded = fake.requests[-1].json()["messages"]
    assert forwarded != body["messages"]
    assert [m for m in forwarded if m["role"] == "system"] == [terse]


async def test_other_methods_and_paths_go_to_the_anthropic_upstream(tmp_path: Path) -> None:
    settings = make_settings(
        tmp_path, anthropic_upstream_url=ANTHROPIC, anthropic_api_key="sk-ant-operator"
    )
    with respx.mock(assert_all_called=False) as mock:
        anthropic = mock.route(host="anthropic.test").respond(405)
        openai = mock.route(host="upstream.test").respond(200)
        app = create_app(settings)
        async with app.router.lifespan_context(app), _client(app) as client:
            other = await client.get("/v1/messages", headers=HEADERS)
            batches = await client.get("/v1/messages/batches?limit=2", headers=HEADERS)
            schema = (await client.get("/openapi.json")).json()
    assert other.status_code == 405
    assert batches.status_code == 405
    sent = [call.request for call in anthropic.calls]
    assert [str(r.url) for r in sent] == [
        f"{ANTHROPIC}/messages",
        f"{ANTHROPIC}/messages/batches?limit=2",
    ]
    assert all(r.headers["x-api-key"] == "sk-ant-operator" for r in sent)
    assert not openai.calls
    assert "/v1/messages" not in schema["paths"]


async def test_the_claude_heuristic_is_calibrated_on_the_whole_prompt_anthropic_reports(
    client: httpx.AsyncClient, fake: FakeUpstream, store: WatchedStore
) -> None:
    """Usage's prompt is input + cache reads + cache writes, and that is what the heuristic is
    fitted to: with most of each prompt read from the cache, the fit still follows the fake's
    whole count (fitted to `input_tokens` alone it would learn a prompt a fraction as big)."""
    fake.cached_tokens, fake.cache_write_tokens = 4_000, 1_000
    for k in range(4):
        await post(client, agent_body(rounds=8 + k), **{"x-compaction-strategy": "none"})
    records = await store.written(4)
    sent = [prompt_tokens(r.json()) for r in fake.messages_requests]
    assert sorted(r.prompt_tokens or 0 for r in records) == sorted(sent)
    assert all(r.cached_tokens == 4_000 and r.cache_write_tokens == 1_000 for r in records)
    stats = (await client.get("/stats")).json()
    assert "claude-sonnet-4-5" in stats["calibration"]
    estimate = int(
        (await client.post("/v1/compaction/count", json=agent_body(rounds=11))).json()[
            "prompt_tokens"
        ]
    )
    assert estimate > 2 * (sent[-1] - 5_000)  # nowhere near the uncached part alone
