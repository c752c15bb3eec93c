"""Summaries under sustained load (DESIGN.md §12): on a one-slot upstream that is never idle —
requests back to back, or sixteen sessions at once — background summaries still happen after
their bounded wait and the planted facts reach the prompt; each summary is asked through the
API of the request it serves, in the shape its model accepts, on strict fakes."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from itertools import pairwise
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import httpx
import orjson
import pytest
from fastapi import FastAPI
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from inflight.compaction.summary.background import BackgroundSummaries
from inflight.factory import create_app
from inflight.proxy.completers import reasoning_model
from inflight.proxy.slots import UpstreamSlots
from tests.conftest import make_settings
from tests.support.conversations import planted

pytestmark = pytest.mark.anyio
FACT = re.compile(r"FACT-[0-9a-f]{6}")
LIMIT = "3000"  # the window every session is compacted for


class OneSlotUpstream:
    """A chat upstream that serves one request at a time (llama.cpp with one slot: `/props`
    says so), slowly; a summary repeats every fact of its transcript and previous summary."""

    def __init__(self, answer: float = 0.03, summary: float = 0.08) -> None:
        self.answer, self.summary = answer, summary
        self.slot = asyncio.Lock()
        self.forwarded: dict[str, list[list[dict[str, Any]]]] = {}  # session -> prompts
        self.summary_calls = 0
        self.props_asked = 0
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/props", self._props, methods=["GET"]),
                Route("/v1/models", self._models, methods=["GET"]),
            ]
        )

    async def _props(self, request: Request) -> Response:
        self.props_asked += 1
        return JSONResponse({"total_slots": 1})

    async def _models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "local", "max_model_len": 32768}]})

    async def _chat(self, request: Request) -> Response:
        body = orjson.loads(await request.body())
        messages = body["messages"]
        async with self.slot:
            last = str(messages[-1].get("content", ""))
            if "<transcript>" in last:
                self.summary_calls += 1
                await anyio.sleep(self.summary)
                text = "Summary. Facts: " + ", ".join(dict.fromkeys(FACT.findall(last)))
                return JSONResponse(_completion(text))
            await anyio.sleep(self.answer)
            found = re.search(r"Session \d+", orjson.dumps(messages[1]).decode())
            session = found.group(0) if found else "?"  # a summary may be folded in beside it
            self.forwarded.setdefault(session, []).append(messages)
            return JSONResponse(_completion("ok", roughly(messages)))


def _completion(text: str, prompt: int = 100) -> dict[str, Any]:
    return {
        "id": "c",
        "object": "chat.completion",
        "model": "local",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": prompt, "completion_tokens": 10, "total_tokens": prompt + 10},
    }


def roughly(messages: Any) -> int:
    """A prompt's tokens as an upstream would bill them (about four bytes a token)."""
    return len(orjson.dumps(messages)) // 4


@pytest.fixture
async def proxy(tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    async with AsyncExitStack() as stack:

        async def open_one(upstream: Any, **overrides: Any) -> tuple[FastAPI, httpx.AsyncClient]:
            settings = make_settings(tmp_path, **overrides)
            app = create_app(settings, transport=httpx.ASGITransport(app=upstream.app))
            await stack.enter_async_context(app.router.lifespan_context(app))
            client = httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://p", timeout=60
            )
            await stack.enter_async_context(client)
            return app, client

        yield open_one


async def replay(client: httpx.AsyncClient, messages: list[dict[str, Any]]) -> int:
    """Send every request of the transcript back to back (each right after the previous
    answer); returns how many needed a summary for their cut."""
    needed = 0
    for k in range(3, len(messages) + 1, 2):  # after each tool output
        body = {"model": "local", "messages": messages[:k], "max_tokens": 200}
        response = await client.post(
            "/v1/chat/completions",
            content=orjson.dumps(body),
            headers={"X-Compaction-Strategy": "summarize", "X-Compaction-Context-Limit": LIMIT},
        )
        assert response.status_code == 200, response.text
        needed += "x-compaction-summary" in response.headers
    return needed


def background_of(app: FastAPI) -> BackgroundSummaries:
    background = app.state.inflight.compactor.background
    assert isinstance(background, BackgroundSummaries)
    return background


def prompt_changes(prompts: list[list[dict[str, Any]]]) -> int:
    """Requests whose forwarded prompt does not extend the previous one (events, and summaries
    landing after theirs)."""
    return sum(1 for before, after in pairwise(prompts) if after[: len(before)] != before)


async def test_back_to_back_requests_on_a_one_slot_upstream_keep_every_planted_fact(
    proxy: Callable[..., Any],
) -> None:
    """The replay that used to make 0 summary calls (every event fell back to trim): the
    upstream is never idle for long, so summaries run after their bounded wait."""
    # seconds scaled down from a local model's (answers of seconds, a wait of two)
    upstream = OneSlotUpstream(answer=0.1, summary=0.1)
    app, client = await proxy(upstream, summary_idle_wait=0.15)
    messages, facts = planted(0)
    needed = await replay(client, messages)
    last = orjson.dumps(upstream.forwarded["Session 0"][-1]).decode()
    assert needed > 0
    assert upstream.summary_calls > 0
    assert [f for f in facts if f not in last] == []
    counts = background_of(app).counts
    assert counts.made > 0
    assert upstream.props_asked == 1  # the slots were asked once, not per summary
    stats = (await client.get("/stats")).json()["summaries"]
    started = stats["background"]["started"]
    assert sum(started.values()) == counts.made + counts.failed + counts.running
    assert stats["stand_ins"].get("summary", 0) > 0
    metrics = (await client.get("/metrics")).text
    assert "inflight_summary_stand_ins_total" in metrics
    assert "inflight_summary_background_starts_total" in metrics


async def test_sixteen_concurrent_sessions_keep_their_facts_with_summary_calls_bounded(
    proxy: Callable[..., Any],
) -> None:
    upstream = OneSlotUpstream(answer=0.005, summary=0.01)
    _, client = await proxy(upstream, summary_idle_wait=0.05, summary_concurrency=2)
    sessions = [planted(s, rounds=24) for s in range(16)]
    with anyio.fail_after(120):
        async with anyio.create_task_group() as tg:
            for messages, _ in sessions:
                tg.start_soon(replay, client, messages)
    changes = 0
    for s, (_, facts) in enumerate(sessions):
        prompts = upstream.forwarded[f"Session {s}"]
        last = orjson.dumps(prompts[-1]).decode()
        assert [f for f in facts if f not in last] == [], f"session {s}"
        changes += prompt_changes(prompts)
    # Each prompt change (an event, or its summary landing) is paid for by a bounded number of
    # calls: the span's own summary and the spans predicted ahead of the next event.
    assert 0 < upstream.summary_calls <= 3 * changes, (upstream.summary_calls, changes)


async def test_a_client_request_waits_at_most_one_summary_on_a_one_slot_upstream(
    proxy: Callable[..., Any],
) -> None:
    """A summary that runs after its bounded wait holds the one slot for one call at most:
    no client request waits longer than its own answer plus one summary call."""
    upstream = OneSlotUpstream(answer=0.02, summary=0.3)
    _, client = await proxy(upstream, summary_idle_wait=0.1)
    messages, _ = planted(1)
    slowest = 0.0
    for k in range(3, len(messages) + 1, 2):
        body = {"model": "local", "messages": messages[:k], "max_tokens": 200}
        started = anyio.current_time()
        response = await client.post(
            "/v1/chat/completions",
            content=orjson.dumps(body),
            headers={"X-Compaction-Strategy": "summarize", "X-Compaction-Context-Limit": LIMIT},
        )
        assert response.status_code == 200
        slowest = max(slowest, anyio.current_time() - started)
    assert upstream.summary_calls > 0
    # bound: its own answer, one summary call (concurrency 1), and generous scheduling slack
    assert slowest < upstream.answer + upstream.summary + 1.0


async def test_slots_are_configured_or_read_from_llama_cpp_props() -> None:
    asked: list[str] = []

    class Fetcher:
        def __init__(self, payload: Any) -> None:
            self.payload = payload

        async def fetch_json(self, method: str, url: str, json: Any | None = None) -> Any | None:
            asked.append(url)
            return self.payload

    assert await UpstreamSlots(Fetcher({"total_slots": 1})).gated("http://h:8080/v1")
    assert asked == ["http://h:8080/props"]
    one = UpstreamSlots(Fetcher({"total_slots": 1}))
    assert await one.gated("http://h:8080/v1")
    assert await one.gated("http://h:8080/v1/")
    assert len(asked) == 2  # remembered per server
    assert not await UpstreamSlots(Fetcher({"total_slots": 4})).gated("http://h/v1")
    assert not await UpstreamSlots(Fetcher(None)).gated("http://api.openai.com/v1")  # hosted
    assert not await UpstreamSlots(Fetcher({"total_slots": True})).gated("http://h2/v1")
    before = len(asked)
    assert await UpstreamSlots(Fetcher({"total_slots": 8}), configured=1).gated("http://h/v1")
    assert len(asked) == before  # the operator's setting wins, nothing asked


# --- each summary asked through its request's API, in its model's shape ---------------------


class StrictOpenAI:
    """OpenAI as strict as it is: a Responses-only model (`gpt-5-codex`) is refused on chat;
    reasoning models refuse `temperature` and chat's `max_tokens`; Anthropic's Messages API
    on `/v1/messages`. Summaries echo the facts of their transcript."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/responses", self._responses, methods=["POST"]),
                Route("/v1/messages", self._messages, methods=["POST"]),
                Route("/v1/models", lambda r: JSONResponse({"data": []}), methods=["GET"]),
            ]
        )

    @staticmethod
    def _bad(message: str, status: int = 400) -> Response:
        error = {"message": message, "type": "invalid_request_error", "code": None}
        return JSONResponse({"error": error}, status_code=status)

    async def _chat(self, request: Request) -> Response:
        body = orjson.loads(await request.body())
        self.calls.append(("chat", body))
        model = body["model"]
        if model.endswith("-codex"):
            return self._bad("This model is only supported in v1/responses", 404)
        if reasoning_model(model) and "temperature" in body:
            return self._bad("Unsupported parameter: 'temperature'")
        if reasoning_model(model) and "max_tokens" in body:
            return self._bad("Unsupported parameter: 'max_tokens'")
        text = _summary_of(str(body["messages"][-1]["content"]))
        return JSONResponse(_completion(text, roughly(body["messages"])))

    async def _responses(self, request: Request) -> Response:
        body = orjson.loads(await request.body())
        self.calls.append(("responses", body))
        if reasoning_model(body["model"]) and "temperature" in body:
            return self._bad("Unsupported parameter: 'temperature'")
        last = body["input"][-1]
        content = last.get("content")
        text = _summary_of(content if isinstance(content, str) else orjson.dumps(content).decode())
        output = [
            {
                "type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        ]  # fmt: skip
        usage = {"input_tokens": roughly(body["input"]), "output_tokens": 10}
        return JSONResponse(
            {"id": "resp_1", "object": "response", "status": "completed", "model": body["model"],
             "output": output, "usage": usage}
        )  # fmt: skip

    async def _messages(self, request: Request) -> Response:
        body = orjson.loads(await request.body())
        self.calls.append(("messages", body))
        text = _summary_of(orjson.dumps(body["messages"][-1]["content"]).decode())
        return JSONResponse(
            {"id": "msg_1", "type": "message", "role": "assistant", "model": body["model"],
             "content": [{"type": "text", "text": text}], "stop_reason": "end_turn",
             "usage": {"input_tokens": roughly(body["messages"]), "output_tokens": 10}}
        )  # fmt: skip


def _summary_of(transcript: str) -> str:
    if "<transcript>" not in transcript:
        return "ok"
    return "Summary. Facts: " + ", ".join(dict.fromkeys(FACT.findall(transcript)))


def responses_session(rounds: int = 16) -> tuple[list[dict[str, Any]], list[str]]:
    facts = [f"FACT-{i:06x}" for i in range(6)]
    items: list[dict[str, Any]] = [{"role": "user", "content": "Fix the parser."}]
    for i in range(rounds):
        fact = f" remember {facts[i]}." if i < len(facts) else ""
        items.append(
            {"type": "function_call", "call_id": f"c{i}", "name": "shell", "arguments": "{}"}
        )
        items.append(
            {"type": "function_call_output", "call_id": f"c{i}",
             "output": f"out {i}{fact} " + "line " * 150}
        )  # fmt: skip
    return items, facts


async def test_a_responses_request_s_summary_is_asked_on_responses_in_the_reasoning_shape(
    proxy: Callable[..., Any],
) -> None:
    strict = StrictOpenAI()
    _, client = await proxy(strict, upstream_url="http://upstream.test/v1")
    items, facts = responses_session()
    body = {"model": "gpt-5-codex", "input": items, "max_output_tokens": 200}
    response = await client.post(
        "/v1/responses",
        content=orjson.dumps(body),
        headers={
            "X-Compaction-Strategy": "summarize", "X-Compaction-Context-Limit": LIMIT,
            "X-Compaction-Summary-Wait": "true", "Authorization": "Bearer sk-test",
        },
    )  # fmt: skip
    assert response.status_code == 200, response.text
    assert response.headers["x-compaction-summary"] == "ready"
    summaries = [b for api, b in strict.calls if "input" in b and len(b["input"]) == 1]
    assert summaries, strict.calls
    assert all(api == "responses" for api, _ in strict.calls)  # never chat for this model
    first = summaries[0]
    assert "temperature" not in first
    assert first["store"] is False
    assert first["max_output_tokens"] > 0
    forwarded = orjson.dumps(strict.calls[-1][1]["input"]).decode()
    assert [f for f in facts if f not in forwarded] == []


async def test_a_messages_request_s_summary_is_asked_on_messages(
    proxy: Callable[..., Any],
) -> None:
    strict = StrictOpenAI()
    _, client = await proxy(strict, anthropic_upstream_url="http://anthropic.test/v1")
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix the parser."}]
    facts = [f"FACT-{i:06x}" for i in range(6)]
    for i in range(16):
        fact = f" remember {facts[i]}." if i < len(facts) else ""
        messages.append(
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": f"t{i}", "name": "bash", "input": {"cmd": str(i)}}
            ]}
        )  # fmt: skip
        messages.append(
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": f"t{i}",
                 "content": f"out {i}{fact} " + "line " * 150}
            ]}
        )  # fmt: skip
    body = {"model": "claude-sonnet-4-5", "max_tokens": 200, "messages": messages}
    response = await client.post(
        "/v1/messages",
        content=orjson.dumps(body),
        headers={
            "X-Compaction-Strategy": "summarize", "X-Compaction-Context-Limit": LIMIT,
            "X-Compaction-Summary-Wait": "true", "x-api-key": "sk-ant-test",
        },
    )  # fmt: skip
    assert response.status_code == 200, response.text
    assert response.headers["x-compaction-summary"] == "ready"
    assert {api for api, _ in strict.calls} == {"messages"}
    forwarded = orjson.dumps(strict.calls[-1][1]).decode()
    assert [f for f in facts if f not in forwarded] == []


async def test_a_shape_the_upstream_rejects_is_logged_once_and_not_sent_again(
    proxy: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    """A chat model whose upstream rejects `temperature` (its name says nothing): the first
    summary call is refused, retried at once in the reasoning shape, and from then on only
    that shape is sent — the rejection logged once, with the upstream's message, and counted."""
    strict = StrictOpenAI()
    _, client = await proxy(strict)
    messages, facts = planted(3, rounds=18)
    strict_model = "my-local-model"  # its name says nothing: the first shape is the classic one
    assert not reasoning_model(strict_model)

    async def chat(request: Request) -> Response:
        body = orjson.loads(await request.body())
        strict.calls.append(("chat", body))
        if "temperature" in body:
            return strict._bad("Unsupported parameter: 'temperature' is not supported")
        text = _summary_of(str(body["messages"][-1]["content"]))
        return JSONResponse(_completion(text, roughly(body["messages"])))

    strict.app.router.routes[0] = Route("/v1/chat/completions", chat, methods=["POST"])
    caplog.set_level(logging.WARNING, logger="inflight.proxy.completers")
    for k in (len(messages) - 10, len(messages)):
        body = {"model": strict_model, "messages": messages[:k], "max_tokens": 200}
        response = await client.post(
            "/v1/chat/completions",
            content=orjson.dumps(body),
            headers={
                "X-Compaction-Strategy": "summarize", "X-Compaction-Context-Limit": LIMIT,
                "X-Compaction-Summary-Wait": "true",
            },
        )  # fmt: skip
        assert response.status_code == 200, response.text
        assert response.headers["x-compaction-summary"] in ("ready", "cached")
    summary_calls = [b for _, b in strict.calls if "<transcript>" in str(b["messages"][-1])]
    rejected = [b for b in summary_calls if "temperature" in b]
    assert len(rejected) == 1  # one refusal, never the same shape again
    assert all("max_completion_tokens" in b for b in summary_calls if "temperature" not in b)
    warnings = [r for r in caplog.records if "rejected" in r.getMessage()]
    assert len(warnings) == 1
    assert "temperature" in warnings[0].getMessage()
    stats = (await client.get("/stats")).json()["summaries"]
    assert stats["failures"].get("rejected_shape") == 1
    forwarded = orjson.dumps(strict.calls[-1][1]["messages"]).decode()
    assert [f for f in facts if f not in forwarded] == []


async def test_summary_slots_go_to_the_oldest_wait_first_and_survive_cancellation() -> None:
    """A summary superseded by its conversation's longer one keeps its conversation's place in
    the line (its `since`); a cancelled waiter never loses a slot."""
    from inflight.compaction.summary.background import _Slots

    slots = _Slots(1)
    order: list[str] = []
    release = anyio.Event()

    async def hold() -> None:
        async with slots.taken(0.0):
            await release.wait()

    async def take(name: str, since: float) -> None:
        async with slots.taken(since):
            order.append(name)

    async with anyio.create_task_group() as tg:
        tg.start_soon(hold)
        await anyio.lowlevel.checkpoint()
        tg.start_soon(take, "late", 30.0)
        tg.start_soon(take, "early", 10.0)
        cancelled = anyio.CancelScope()

        async def doomed() -> None:
            with cancelled:
                await take("doomed", 1.0)

        tg.start_soon(doomed)
        await anyio.sleep(0.01)
        cancelled.cancel()  # the oldest waiter leaves the line before its turn
        await anyio.sleep(0.01)
        release.set()
    assert order == ["early", "late"]
    async with anyio.create_task_group() as tg:  # the slot came back: free again
        tg.start_soon(take, "after", 0.0)
    assert order[-1] == "after"
