"""Hostile field values for the three routes: a well-formed request of each API with one to three
fields (top level, or inside a message, item, part, tool call or tool) set to null, a number, a
string, an object, an array, a boolean or a huge int, sent through the proxy in front of a
`MockTransport` upstream; what comes back must be the upstream's answer or a 400 in the API's
envelope (shared by tests/asgi/test_hostile.py and `python -m bench.fuzz_fields`)."""

from __future__ import annotations

import copy
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import httpx
import orjson
from hypothesis import strategies as st

from inflight.factory import create_app
from tests.conftest import make_settings

Route = Literal["/v1/chat/completions", "/v1/responses", "/v1/messages"]
ROUTES: tuple[Route, ...] = ("/v1/chat/completions", "/v1/responses", "/v1/messages")
MARK = "upstream-answer-7f3a"  # in every answer the upstream gives
HUGE = 2**64 + 1
HOSTILE: list[Any] = [
    None, 0, -1, 2.5, HUGE, -(2**70), True, False, "", "hostile", {}, {"x": 1}, [], [1, "a"],
    [{}], [None],
]  # fmt: skip
# Fields the adapters read, set where they are missing too (at the top level or in a message).
FIELDS = (
    "tools", "tool_choice", "tool_call_id", "call_id", "content", "input", "system",
    "instructions", "max_tokens", "max_output_tokens", "max_completion_tokens", "messages",
    "role", "type", "stream", "model", "compaction", "metadata", "text", "tool_calls",
    "function", "arguments", "id", "name", "output", "summary", "tool_use_id", "parts",
    "previous_response_id", "stream_options", "thinking", "reasoning",
)  # fmt: skip

LOG = "log line with details\n" * 300
CHAT: dict[str, Any] = {
    "model": "gpt-4o-mini",
    "max_tokens": 64,
    "tool_choice": "auto",
    "metadata": {"session": "s"},
    "tools": [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}],
    "messages": [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": [{"type": "text", "text": "Read the logs. " * 20},
                                     {"type": "image_url", "image_url": {"url": "http://i/x.png"}}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{}"}},
            {"id": "c2", "type": "function", "function": {"name": "read", "arguments": "{\"a\":1}"}},
        ]},
        {"role": "tool", "tool_call_id": "c1", "content": LOG},
        {"role": "tool", "tool_call_id": "c2", "content": [{"type": "text", "text": LOG}]},
        {"role": "assistant", "content": "Both read. " * 30},
        {"role": "user", "content": "Now summarise them."},
    ],
}  # fmt: skip
RESPONSES: dict[str, Any] = {
    "model": "gpt-4.1",
    "instructions": "You are helpful.",
    "max_output_tokens": 64,
    "tool_choice": "auto",
    "metadata": {"session": "s"},
    "text": {"format": {"type": "text"}},
    "tools": [{"type": "function", "name": "read", "parameters": {"type": "object"}}],
    "input": [
        {"role": "user", "content": "Read the logs. " * 20},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "t"}]},
        {"type": "function_call", "call_id": "c1", "name": "read", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": LOG},
        {"type": "reasoning", "id": "rs_2", "summary": [], "encrypted_content": "e"},
        {"type": "web_search_call", "id": "ws_1", "status": "completed",
         "action": {"type": "search", "query": "q"}},
        {"type": "custom_tool_call", "call_id": "c2", "name": "patch", "input": "diff"},
        {"type": "custom_tool_call_output", "call_id": "c2",
         "output": [{"type": "input_text", "text": LOG}]},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "Both read. " * 30, "annotations": []}]},
        {"role": "user", "content": "Now summarise them."},
    ],
}  # fmt: skip
MESSAGES: dict[str, Any] = {
    "model": "claude-sonnet-4-5",
    "max_tokens": 64,
    "system": [{"type": "text", "text": "You are helpful."}],
    "metadata": {"user_id": "u"},
    "tool_choice": {"type": "auto"},
    "tools": [{"name": "read", "input_schema": {"type": "object"}}],
    "messages": [
        {"role": "user", "content": "Read the logs. " * 20},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "hm", "signature": "sig"},
            {"type": "text", "text": "Reading."},
            {"type": "tool_use", "id": "t1", "name": "read", "input": {}},
            {"type": "tool_use", "id": "t2", "name": "read", "input": {"a": 1}},
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": LOG},
            {"type": "tool_result", "tool_use_id": "t2",
             "content": [{"type": "text", "text": LOG}], "is_error": False},
        ]},
        {"role": "assistant", "content": "Both read. " * 30},
        {"role": "user", "content": [{"type": "text", "text": "Now summarise them."}]},
    ],
}  # fmt: skip
BASES: dict[Route, dict[str, Any]] = {
    "/v1/chat/completions": CHAT,
    "/v1/responses": RESPONSES,
    "/v1/messages": MESSAGES,
}

Path_ = tuple[str | int, ...]


def _paths(value: Any, at: Path_ = ()) -> Iterator[tuple[Path_, Any]]:
    """Every (path, value) below `value` (the root excluded)."""
    if isinstance(value, dict):
        children: Iterator[tuple[Any, Any]] = iter(value.items())
    else:
        children = enumerate(value) if isinstance(value, list) else iter(())
    for key, child in children:
        yield (*at, key), child
        yield from _paths(child, (*at, key))


def _containers(body: dict[str, Any]) -> list[Path_]:
    """The objects a missing field may be added to: the body, and every object in it."""
    return [(), *(p for p, v in _paths(body) if isinstance(v, dict))]


def _set(body: Any, path: Path_, value: Any) -> None:
    for key in path[:-1]:
        body = body[key]
    body[path[-1]] = value


@st.composite
def hostile_bodies(draw: st.DrawFn, route: Route, stream: bool) -> dict[str, Any]:
    """The route's well-formed body with one to three fields set to a hostile value."""
    body = copy.deepcopy(BASES[route])
    body["stream"] = stream
    for _ in range(draw(st.integers(1, 3))):
        value = copy.deepcopy(draw(st.sampled_from(HOSTILE)))
        if draw(st.integers(0, 3)) == 0:  # a field the body lacks (or has), in any object
            at = draw(st.sampled_from(_containers(body)))
            _set(body, (*at, draw(st.sampled_from(FIELDS))), value)
        else:
            path, _ = draw(st.sampled_from(list(_paths(body))))
            _set(body, path, value)
    return body


def _answer(route: str, stream: bool) -> httpx.Response:
    """The upstream's answer for `route`: a minimal completion, JSON or SSE, naming MARK."""
    if route.endswith("/chat/completions"):
        message = {"role": "assistant", "content": MARK}
        done = {"id": MARK, "object": "chat.completion", "created": 1, "model": "m",
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}  # fmt: skip
        chunk = {"id": MARK, "object": "chat.completion.chunk", "created": 1, "model": "m",
                 "choices": [{"index": 0, "delta": message, "finish_reason": "stop"}]}  # fmt: skip
        events = [b"data: " + orjson.dumps(chunk), b"data: [DONE]"]
    elif route.endswith("/responses"):
        done = {"id": MARK, "object": "response", "status": "completed", "model": "m",
                "output": [{"type": "message", "role": "assistant", "id": "msg_u",
                            "content": [{"type": "output_text", "text": MARK,
                                         "annotations": []}]}]}  # fmt: skip
        completed = {"type": "response.completed", "sequence_number": 0, "response": done}
        events = [b"event: response.completed\ndata: " + orjson.dumps(completed)]
    else:
        done = {"id": MARK, "type": "message", "role": "assistant", "model": "m",
                "content": [{"type": "text", "text": MARK}], "stop_reason": "end_turn"}  # fmt: skip
        start = {"type": "message_start", "message": {**done, "content": []}}
        events = [b"event: message_start\ndata: " + orjson.dumps(start),
                  b'event: message_stop\ndata: {"type": "message_stop"}']  # fmt: skip
    if not stream:
        return httpx.Response(200, json=done)
    sse = b"".join(e + b"\n\n" for e in events)
    return httpx.Response(200, content=sse, headers={"content-type": "text/event-stream"})


def upstream(request: httpx.Request) -> httpx.Response:
    """Answers every API's route; the summariser's requests too."""
    try:
        sent = orjson.loads(request.content)
    except orjson.JSONDecodeError:
        sent = {}
    stream = isinstance(sent, dict) and sent.get("stream") is True
    return _answer(request.url.path, stream)


@asynccontextmanager
async def fuzzed_proxy(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    """The proxy (every API's upstream the mock) and a client to it."""
    settings = make_settings(tmp_path, anthropic_upstream_url="http://upstream.test/v1")
    app = create_app(settings, transport=httpx.MockTransport(upstream))
    async with (
        app.router.lifespan_context(app),
        # an exception the app lets out is the 500 a server would answer, not a test crash
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app, raise_app_exceptions=False),
            base_url="http://p",
        ) as client,
    ):
        yield client


@dataclass(frozen=True, slots=True)
class Case:
    """One request of the fuzz: its route, body and switches."""

    route: Route
    body: dict[str, Any]
    restore: bool
    stream: bool
    limit: int

    def headers(self) -> dict[str, str]:
        headers = {
            "x-compaction-context-limit": str(self.limit),
            "content-type": "application/json",
        }
        if self.restore:
            headers["x-compaction-restore"] = "on"
        return headers


def problem(case: Case, response: httpx.Response) -> str | None:
    """What is wrong with the proxy's answer to `case`, or None: it must be the upstream's
    answer (forwarded) or a 400 in the route's error envelope."""
    if response.status_code == 200:
        if MARK not in response.text:
            return f"200 without the upstream's answer: {response.text[:300]}"
        if "event: error" in response.text:
            return f"a stream that ended in an error: {response.text[-300:]}"
        return None
    if response.status_code != 400:
        return f"{response.status_code}: {response.text[:300]}"
    try:
        error = response.json()
    except json.JSONDecodeError:
        return f"a 400 that is not JSON: {response.text[:300]}"
    if case.route == "/v1/messages":
        shaped = (
            isinstance(error, dict)
            and error.get("type") == "error"
            and isinstance(error.get("error"), dict)
            and {"type", "message"} <= set(error["error"])
        )
    else:
        shaped = (
            isinstance(error, dict)
            and isinstance(error.get("error"), dict)
            and {"message", "type", "param", "code"} <= set(error["error"])
        )
    return None if shaped else f"a 400 outside the route's envelope: {response.text[:300]}"


async def send(client: httpx.AsyncClient, case: Case) -> httpx.Response:
    """`case` sent as JSON text (the stdlib writes ints of any size; orjson would not)."""
    content = json.dumps(case.body).encode()
    return await client.post(case.route, content=content, headers=case.headers())


CONTEXT_LIMITS = (512, 1024, 2048, 8192)  # small windows: every compaction path runs


def cases(route: Route, restore: bool, stream: bool) -> st.SearchStrategy[Case]:
    """Requests of `route` with hostile fields, at a small window."""
    return st.builds(
        Case,
        route=st.just(route),
        body=hostile_bodies(route, stream),
        restore=st.just(restore),
        stream=st.just(stream),
        limit=st.sampled_from(CONTEXT_LIMITS),
    )


SWITCHES = [(route, restore, stream) for route in ROUTES for restore in (False, True)
            for stream in (False, True)]  # fmt: skip
