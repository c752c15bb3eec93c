"""Golden answers: `/openapi.json` and the answers (and forwarded bytes) of a fixed set of
requests over the three APIs, compared with `tests/data/golden.json` so a refactor that moves
code changes nothing on the wire. After an intended change, rewrite it with
`INFLIGHT_TEST_GOLDEN_WRITE=1 pytest tests/asgi/test_golden.py` and review the diff."""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from inflight.factory import create_app
from tests.conftest import make_settings
from tests.support import DATA
from tests.support.fakes import FakeUpstream

pytestmark = pytest.mark.anyio

GOLDEN = DATA / "golden.json"
ANTHROPIC_HEADERS = {"x-api-key": "sk-ant-client", "anthropic-version": "2023-06-01"}
# What differs from run to run, not from code to code: dates, random ids, timings.
VOLATILE_HEADERS = frozenset({"date", "x-compaction-id", "server-timing", "x-request-id"})
VOLATILE_TEXT = (
    (re.compile(r"cmp_[0-9A-Za-z_-]{8,}"), "cmp_<id>"),
    (re.compile(r'"(started|created|ts|time|timestamp|uptime_s|at)":\s*[0-9.]+'), r'"\1":0'),
)


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    path: str
    body: Any = None  # JSON value, or bytes sent as they are
    method: str = "POST"
    headers: dict[str, str] = field(default_factory=dict)


def _tool_rounds(rounds: int, size: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."}]
    messages.append({"role": "user", "content": "Fix the failing test in src/app.py."})
    for i in range(rounds):
        call = {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": "shell", "arguments": json.dumps({"cmd": f"cat f{i}.py"})},
        }
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{i}",
             "content": f"f{i}.py:\n" + f"def fn_{i}(x):\n    return x * {i}\n" * size},
        ]  # fmt: skip
    messages.append({"role": "user", "content": "Now run the tests."})
    return messages


def _responses_input(rounds: int, size: int) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = [{"role": "user", "content": "Fix the bug in src/app.py."}]
    for i in range(rounds):
        items += [
            {"type": "function_call", "call_id": f"call_{i}", "name": "shell",
             "arguments": json.dumps({"cmd": f"cat f{i}.py"})},
            {"type": "function_call_output", "call_id": f"call_{i}",
             "output": f"out {i} " + "data line\n" * size},
        ]  # fmt: skip
    return items


def _messages(rounds: int, size: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix the failing test."}]
    for i in range(rounds):
        messages += [
            {"role": "assistant", "content": [
                {"type": "text", "text": f"step {i}"},
                {"type": "tool_use", "id": f"toolu_{i}", "name": "Bash",
                 "input": {"command": f"cat f{i}"}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": f"toolu_{i}",
                 "content": f"out {i}\n" + "src/mod.py:1 value=2\n" * size},
            ]},
        ]  # fmt: skip
    return messages


def _cases() -> list[Case]:
    chat = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hi"}]}
    long_chat = {"model": "gpt-4o-mini", "messages": _tool_rounds(40, 60), "max_tokens": 256}
    responses = {"model": "gpt-4o-mini", "input": "Hi"}
    long_responses = {"model": "gpt-4o-mini", "input": _responses_input(40, 150)}
    messages = {"model": "claude-sonnet-4-5", "max_tokens": 64, "messages": [
        {"role": "user", "content": "Hello"}]}  # fmt: skip
    long_messages = {"model": "claude-sonnet-4-5", "max_tokens": 1024,
                     "messages": [*_messages(40, 120), {"role": "assistant", "content": "ok"},
                                  {"role": "user", "content": "go on"}]}  # fmt: skip
    small_window = {"X-Compaction-Context-Limit": "8192"}
    ant = ANTHROPIC_HEADERS
    return [
        Case("healthz", "/healthz", method="GET"),
        Case("openapi", "/openapi.json", method="GET"),
        Case("chat", "/v1/chat/completions", chat),
        Case("chat-stream", "/v1/chat/completions", {**chat, "stream": True}),
        Case(
            "chat-stream-usage",
            "/v1/chat/completions",
            {**chat, "stream": True, "stream_options": {"include_usage": True}},
        ),
        Case("chat-compacted", "/v1/chat/completions", long_chat, headers=small_window),
        Case(
            "chat-truncate",
            "/v1/chat/completions",
            long_chat,
            headers={**small_window, "X-Compaction-Strategy": "truncate"},
        ),
        Case(
            "chat-prune",
            "/v1/chat/completions",
            long_chat,
            headers={**small_window, "X-Compaction-Strategy": "prune"},
        ),
        Case("chat-none", "/v1/chat/completions", chat, headers={"X-Compaction-Strategy": "none"}),
        Case("chat-bad-json", "/v1/chat/completions", b'{"model": "x", "messages": ['),
        Case("chat-no-messages", "/v1/chat/completions", {"model": "x"}),
        Case("chat-messages-not-list", "/v1/chat/completions", {"model": "x", "messages": 5}),
        Case(
            "chat-bad-strategy",
            "/v1/chat/completions",
            chat,
            headers={"X-Compaction-Strategy": "nope"},
        ),
        Case(
            "chat-too-long-error",
            "/v1/chat/completions",
            long_chat,
            headers={
                "X-Compaction-Context-Limit": "300",
                "X-Compaction-Strategy": "off",
                "X-Compaction-On-Overflow": "error",
            },
        ),
        Case("responses", "/v1/responses", responses),
        Case("responses-stream", "/v1/responses", {**responses, "stream": True}),
        Case("responses-compacted", "/v1/responses", long_responses, headers=small_window),
        Case("responses-bad", "/v1/responses", {"model": "x", "input": 5}),
        Case("messages", "/v1/messages", messages, headers=ant),
        Case("messages-stream", "/v1/messages", {**messages, "stream": True}, headers=ant),
        Case("messages-compacted", "/v1/messages", long_messages, headers={**ant, **small_window}),
        Case("messages-bad", "/v1/messages", {"model": "x", "max_tokens": 5}, headers=ant),
        Case("preview-chat", "/v1/compaction/preview", long_chat, headers=small_window),
        Case(
            "preview-messages",
            "/v1/compaction/preview",
            long_messages,
            headers={**ant, **small_window},
        ),
        Case("count-chat", "/v1/compaction/count", long_chat),
        Case(
            "count-responses",
            "/v1/compaction/count",
            long_responses,
            headers={"X-Compaction-Format": "responses"},
        ),
        Case("passthrough-models", "/v1/models", method="GET"),
        Case("passthrough-traversal", "/v1/%2e%2e/%2e%2e/x", method="GET"),
        Case("not-found", "/nope", method="GET"),
        Case("method-not-allowed", "/v1/chat/completions", method="GET"),
    ]


def _forwarded(fake: FakeUpstream) -> list[bytes]:
    """The bodies of the client requests forwarded so far (not probes, not summaries, which
    run in the background and land whenever they land)."""
    bodies = [r.body for r in fake.requests if r.method == "POST"]
    return [b for b in bodies if b"<transcript>" not in b]


@pytest.fixture
async def proxy(tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, FakeUpstream]]:
    fake = FakeUpstream()  # behind both the OpenAI and the Anthropic upstream URL
    settings = make_settings(tmp_path, anthropic_upstream_url="http://anthropic.test/v1")
    application = create_app(settings, transport=httpx.ASGITransport(app=fake.app))
    async with application.router.lifespan_context(application):
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://proxy.test") as c:
            yield c, fake


def _normal(text: str) -> str:
    for pattern, replacement in VOLATILE_TEXT:
        text = pattern.sub(replacement, text)
    return text


async def _answer(client: httpx.AsyncClient, fake: FakeUpstream, case: Case) -> dict[str, Any]:
    content = case.body if isinstance(case.body, bytes | None) else orjson.dumps(case.body)
    before = len(_forwarded(fake))
    response = await client.request(case.method, case.path, content=content, headers=case.headers)
    forwarded = _forwarded(fake)[before:]
    headers = sorted(
        (k, _normal(v)) for k, v in response.headers.items() if k not in VOLATILE_HEADERS
    )
    return {
        "status": response.status_code,
        "headers": [list(h) for h in headers],
        "body": _normal(response.text),
        "forwarded": [hashlib.sha256(b).hexdigest()[:16] for b in forwarded],
    }


async def test_every_answer_and_forwarded_body_is_as_recorded(
    proxy: tuple[httpx.AsyncClient, FakeUpstream],
) -> None:
    client, fake = proxy
    got = {case.name: await _answer(client, fake, case) for case in _cases()}
    if os.environ.get("INFLIGHT_TEST_GOLDEN_WRITE") == "1":
        GOLDEN.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n", "utf-8")
    want = json.loads(GOLDEN.read_text("utf-8"))
    assert sorted(got) == sorted(want)
    for name, answer in got.items():
        assert answer == want[name], name
