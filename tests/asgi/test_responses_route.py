"""`POST /v1/responses` through the app (ASGI, a fake upstream that enforces the Responses pairing
rule and a window, and respx): compaction, byte-exact forwarding, streams, usage records,
requests forwarded as received, bad input, overflow recovery, preview and count."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import respx
from fastapi import FastAPI

from inflight.factory import create_app
from inflight.settings import Settings
from tests.asgi.test_proxy_asgi import assert_openai_error
from tests.conftest import make_settings
from tests.support import load_traces
from tests.support.fakes import FakeUpstream
from tests.support.fakes.responses import input_tokens
from tests.support.responses_items import pair_problems, request_body
from tests.support.servers import WatchedStore

pytestmark = pytest.mark.anyio

USER = {"role": "user", "content": "Fix the failing test."}


def agent_items(rounds: int = 30, size: int = 2000) -> list[dict[str, Any]]:
    """A coding session as items: the task, then rounds of reasoning, a call and its output."""
    items: list[dict[str, Any]] = [USER]
    for i in range(rounds):
        summary = [{"type": "summary_text", "text": f"step {i}: look around"}]
        items += [
            {"type": "reasoning", "id": f"rs_{i}", "summary": summary, "encrypted_content": "e"},
            {"type": "function_call", "id": f"fc_{i}", "call_id": f"call_{i % 3}",
             "name": "bash", "arguments": orjson.dumps({"cmd": f"cat f{i}"}).decode()},
            {"type": "function_call_output", "call_id": f"call_{i % 3}",
             "output": f"out {i} " + "data " * size},
        ]  # fmt: skip
    return items


@pytest.fixture
def fake() -> FakeUpstream:
    return FakeUpstream()


@pytest.fixture
def store() -> WatchedStore:
    return WatchedStore()


@pytest.fixture
async def app(
    settings: Settings, fake: FakeUpstream, store: WatchedStore
) -> AsyncIterator[FastAPI]:
    application = create_app(settings, transport=httpx.ASGITransport(app=fake.app), store=store)
    async with application.router.lifespan_context(application):
        yield application


async def post(client: httpx.AsyncClient, body: Any, **headers: str) -> httpx.Response:
    content = body if isinstance(body, bytes) else orjson.dumps(body)
    return await client.post("/v1/responses", content=content, headers=headers)


async def test_a_request_that_fits_goes_up_byte_for_byte(
    client: httpx.AsyncClient, fake: FakeUpstream, store: WatchedStore
) -> None:
    raw = (
        b'{ "input": [ {"role": "user", "content": [{"type": "input_text", "text": "hi"}]} ],'
        b'  "model":"gpt-4.1",  "instructions" : "Be brief.", "x_client": {"keep": true} }'
    )
    response = await post(client, raw)
    assert response.status_code == 200, response.text
    assert response.json()["output"][0]["content"][0]["text"] == "Hello there"
    assert fake.responses_requests[0].body == raw
    assert response.headers["x-compaction-applied"] == "none"
    before = int(response.headers["x-compaction-tokens-before"])
    assert before == int(response.headers["x-compaction-tokens-after"]) > 0
    [record] = await store.written(1)
    assert (record.kind, record.route, record.model, record.status) == (
        "chat", "/v1/responses", "gpt-4.1", 200,
    )  # fmt: skip
    assert record.prompt_tokens == input_tokens(orjson.loads(raw))
    assert record.completion_tokens == 2
    assert record.tokens_before == before


async def test_an_agent_session_over_the_window_is_compacted_and_accepted(
    client: httpx.AsyncClient, fake: FakeUpstream, store: WatchedStore
) -> None:
    fake.context_window = 8192
    body = {"model": "gpt-4.1", "instructions": "You are a coding agent.", "input": agent_items()}
    # wait mode: no summary of the next event's span is started ahead (its usage record)
    headers = {"X-Compaction-Context-Limit": "8192", "X-Compaction-Summary-Wait": "true"}
    response = await post(client, body, **headers)
    assert response.status_code == 200, (response.text, fake.rejected)
    assert fake.rejected == []
    applied = response.headers["x-compaction-applied"].split(",")
    assert "trim" in applied or "prune" in applied
    before = int(response.headers["x-compaction-tokens-before"])
    after = int(response.headers["x-compaction-tokens-after"])
    assert after < before
    sent = fake.responses_requests[-1]
    forwarded = sent.json()
    assert forwarded["instructions"] == body["instructions"]
    assert forwarded["input"][0] == USER
    assert pair_problems(forwarded["input"]) == []
    assert forwarded["input"][-3:] == body["input"][-3:]  # the last round, as it was
    untouched = [item for item in forwarded["input"] if item in body["input"]]
    for item in untouched:
        assert orjson.dumps(item) in sent.body
    assert int(response.headers["x-compaction-messages-after"]) <= int(
        response.headers["x-compaction-messages-before"]
    )
    [record] = await store.written(1)
    assert record.tokens_before == before
    assert record.tokens_after == after
    assert record.strategies == tuple(applied)


async def test_the_stream_is_relayed_as_it_came_and_usage_read_from_response_completed(
    client: httpx.AsyncClient, fake: FakeUpstream, store: WatchedStore
) -> None:
    fake.reply_text = "one two three"
    fake.cached_tokens = 5
    body = {"model": "gpt-4.1", "input": [USER], "stream": True}
    async with client.stream("POST", "/v1/responses", content=orjson.dumps(body)) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["x-compaction-applied"] == "none"
        streamed = b"".join([chunk async for chunk in response.aiter_raw()])
    events = [line[7:] for line in streamed.split(b"\n") if line.startswith(b"event: ")]
    assert events[0] == b"response.created"
    assert events[-1] == b"response.completed"
    assert events.count(b"response.output_text.delta") == 3
    forwarded = fake.responses_requests[0].json()
    assert "stream_options" not in forwarded  # the Responses API reports usage unasked
    [record] = await store.written(1)
    assert record.stream
    assert record.outcome == "completed"
    assert (record.prompt_tokens, record.completion_tokens, record.cached_tokens) == (
        input_tokens(body), 3, 5,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("input_or_body", "reason"),
    [
        ({"input": "a plain prompt " * 3000}, "input is a string"),
        ({"input": agent_items(), "previous_response_id": "resp_1"}, "previous_response_id"),
        (
            {
                "input": [
                    *agent_items(),
                    {"type": "function_call_output", "call_id": "x", "output": "late"},
                ]
            },
            "orphan function_call_output",
        ),
    ],
)
async def test_what_the_proxy_cannot_see_whole_is_forwarded_as_received(
    client: httpx.AsyncClient,
    fake: FakeUpstream,
    input_or_body: dict[str, Any],
    reason: str,
) -> None:
    raw = orjson.dumps({"model": "gpt-4.1", **input_or_body})
    response = await post(client, raw, **{"X-Compaction-Context-Limit": "8192"})
    assert response.status_code in (200, 400), response.text  # the fake's pairing rule may refuse
    assert fake.responses_requests[0].body == raw
    assert response.headers["x-compaction-applied"] == "none"
    assert reason in response.headers["x-compaction-skipped"]


@pytest.mark.parametrize(
    ("value", "param"),
    [
        (42, "input"),
        ({"role": "user", "content": "hi"}, "input"),
        ([USER, "hi"], "input[1]"),
        ([USER, {"content": "no role, no type"}], "input[1]"),
        ([{"type": ["message"]}], "input[0].type"),
    ],
)
async def test_bad_input_is_an_openai_400_naming_the_field(
    client: httpx.AsyncClient,
    fake: FakeUpstream,
    store: WatchedStore,
    value: Any,
    param: str,
) -> None:
    response = await post(client, {"model": "gpt-4.1", "input": value})
    assert_openai_error(response, 400)
    assert response.json()["error"]["param"] == param
    assert fake.responses_requests == []
    [record] = await store.written(1)
    assert (record.route, record.status, record.outcome) == ("/v1/responses", 400, "rejected")


@pytest.mark.parametrize("style", ["openai", "vllm"])
async def test_an_overflow_is_compacted_and_retried_once_before_any_byte(
    client: httpx.AsyncClient, fake: FakeUpstream, style: Any
) -> None:
    """The upstream's window is smaller than the table says. vLLM states it; the Responses API
    does not (it only says the input exceeds the window), so what was sent bounds it."""
    fake.context_window = 12_000
    fake.overflow_style = style
    body = {"model": "gpt-4.1", "input": agent_items(rounds=16, size=900)}
    assert input_tokens(body) > 12_000
    response = await post(client, body)
    assert response.status_code == 200, response.text
    assert len(fake.rejected) == 1
    assert len(fake.responses_requests) == 2
    retried = fake.responses_requests[1].json()
    assert pair_problems(retried["input"]) == []
    assert input_tokens(retried) <= 12_000
    assert response.headers["x-compaction-applied"] != "none"
    # the next request is compacted before it is sent: the window was learned
    again = await post(client, body)
    assert again.status_code == 200
    assert len(fake.rejected) == 1


async def test_an_overflow_a_stream_reports_after_it_started_teaches_the_next_request(
    client: httpx.AsyncClient, fake: FakeUpstream
) -> None:
    """OpenAI reports a too-long input in a stream as an `error` event after `response.created`:
    too late to retry (bytes went out), so it is relayed — and the bound it sets holds for the
    next request, which is compacted before it is sent."""
    fake.context_window = 12_000
    fake.overflow_in_stream = True
    body = {"model": "gpt-4.1", "input": agent_items(rounds=16, size=900), "stream": True}
    async with client.stream("POST", "/v1/responses", content=orjson.dumps(body)) as response:
        assert response.status_code == 200
        streamed = b"".join([chunk async for chunk in response.aiter_raw()])
    assert b"context_length_exceeded" in streamed
    assert len(fake.responses_requests) == 1  # no retry after bytes went out
    async with client.stream("POST", "/v1/responses", content=orjson.dumps(body)) as again:
        assert again.status_code == 200
        assert again.headers["x-compaction-applied"] != "none"
        streamed = b"".join([chunk async for chunk in again.aiter_raw()])
    assert streamed.rstrip().split(b"\n")[-2] == b"event: response.completed"
    assert len(fake.rejected) == 1


async def test_stats_count_responses_requests_apart(
    client: httpx.AsyncClient, store: WatchedStore
) -> None:
    await post(client, {"model": "gpt-4.1", "input": [USER]})
    await post(client, {"model": "gpt-4.1", "input": 7})
    await client.post(
        "/v1/chat/completions",
        json={"model": "gpt-4.1", "messages": [{"role": "user", "content": "x"}]},
    )
    await store.written(3)
    stats = (await client.get("/stats")).json()
    assert stats["apis"]["responses"]["requests"] == 2
    assert stats["apis"]["chat"]["requests"] == 1
    assert stats["apis"]["responses"]["tokens_in"] == input_tokens({"input": [USER]})


@pytest.mark.parametrize("how", ["header", "detected"])
async def test_preview_and_count_take_a_responses_body(client: httpx.AsyncClient, how: str) -> None:
    body = {"model": "gpt-4.1", "instructions": "Be an agent.", "input": agent_items()}
    headers = {"X-Compaction-Context-Limit": "8192"}
    if how == "header":
        headers["X-Compaction-Format"] = "responses"
    preview = await client.post(
        "/v1/compaction/preview", content=orjson.dumps(body), headers=headers
    )
    assert preview.status_code == 200, preview.text
    shown = preview.json()
    assert shown["input"][0] == USER
    assert pair_problems(shown["input"]) == []
    assert shown["input"] != body["input"]
    assert shown["report"]["applied"]
    assert shown["report"]["tokens_after"] < shown["report"]["tokens_before"]
    count = await client.post("/v1/compaction/count", content=orjson.dumps(body), headers=headers)
    assert count.status_code == 200
    assert count.json()["prompt_tokens"] == shown["report"]["tokens_before"]


async def test_preview_of_a_responses_body_names_a_bad_item(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v1/compaction/preview",
        json={"model": "gpt-4.1", "input": [USER, 3]},
        headers={"X-Compaction-Format": "responses"},
    )
    assert_openai_error(response, 400)
    assert response.json()["error"]["param"] == "input[1]"


async def test_calibration_learns_from_input_tokens(
    client: httpx.AsyncClient, fake: FakeUpstream, app: FastAPI
) -> None:
    """The upstream counts twice what the estimate says: after a few responses the estimate
    for the same request moves toward it."""
    body = {"model": "llama-3.1-8b", "input": request_body(load_traces()[0][1][:12])["input"]}
    first = await post(client, body)
    estimate = int(first.headers["x-compaction-tokens-before"])
    fake.prompt_tokens = 2 * estimate
    for _ in range(6):
        await post(client, body)
    later = int((await post(client, body)).headers["x-compaction-tokens-before"])
    assert later > estimate * 1.2


@respx.mock
async def test_upstream_errors_are_relayed_unchanged(tmp_path: Path) -> None:
    """An upstream error that is not an overflow is relayed with its status and body (respx
    stands for the upstream: the app's own pooled client, no transport injected)."""
    error = {"error": {"message": "Invalid 'tools[0].name'", "type": "invalid_request_error",
                       "param": "tools[0].name", "code": "invalid_value"}}  # fmt: skip
    route = respx.post("http://upstream.test/v1/responses").mock(
        return_value=httpx.Response(400, json=error, headers={"x-request-id": "req_1"})
    )
    app = create_app(make_settings(tmp_path, database_url="none"))
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://p") as c,
    ):
        response = await c.post("/v1/responses", json={"model": "gpt-4.1", "input": [USER]})
    assert response.status_code == 400
    assert response.json() == error
    assert response.headers["x-request-id"] == "req_1"
    assert route.call_count == 1
