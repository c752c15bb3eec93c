"""ASGI tier: restore on Anthropic's Messages API — the tool offered with an `input_schema`, the
model's `tool_use` answered with a `tool_result` in the next user message, JSON and stream, the
round cap, a client tool in the same turn; the client never sees the tool, usage is summed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from inflight.proxy.restore import MAX_ROUNDS, TOOL_NAME
from tests.asgi.test_restore_route import ANSWER, OUTPUT, RESTORE, SECRET, proxy
from tests.support.fake_restore_upstream import FIRST_REF, Call, Reply, ScriptedUpstream
from tests.support.fakes.anthropic import rule_violations

pytestmark = pytest.mark.anyio

BODY: dict[str, Any] = {
    "model": "claude-sonnet-4-5",
    "max_tokens": 256,
    "system": "You are helpful.",
    "messages": [
        {"role": "user", "content": "Read the log."},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_1", "name": "read_log", "input": {}}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": OUTPUT}],
        },
        {"role": "assistant", "content": "I have read the log."},
        {"role": "user", "content": "So, what is the vault code?"},
    ],
}


def offered(body: dict[str, Any]) -> bool:
    return any(t.get("name") == TOOL_NAME and "input_schema" in t for t in body.get("tools") or ())


def streamed(text: str) -> tuple[str, list[Any]]:
    """The text and the tool_use blocks of an Anthropic event stream."""
    events = [orjson.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
    assert events[-1]["type"] == "message_stop"
    assert [e["type"] for e in events].count("message_start") == 1
    words = [e["delta"].get("text", "") for e in events if e["type"] == "content_block_delta"]
    uses = [
        e["content_block"]
        for e in events
        if e["type"] == "content_block_start" and e["content_block"]["type"] == "tool_use"
    ]
    return "".join(words), uses


def assembled_usage(text: str) -> dict[str, Any]:
    """The usage a client assembles from an Anthropic stream: `message_start`'s, each count a
    `message_delta` states overwriting it (as the anthropic SDK does)."""
    events = [orjson.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
    (start,) = [e for e in events if e["type"] == "message_start"]
    usage = dict(start["message"]["usage"])
    for delta in (e for e in events if e["type"] == "message_delta"):
        usage.update({k: v for k, v in delta["usage"].items() if v is not None})
    return usage


@pytest.mark.parametrize("stream", [False, True])
async def test_one_restore_round_on_the_messages_api(tmp_path: Path, stream: bool) -> None:
    upstream = ScriptedUpstream([Reply(calls=(Call(TOOL_NAME, FIRST_REF),)), ANSWER])
    async with proxy(tmp_path, upstream) as (client, store):
        response = await client.post(
            "/v1/messages", json={**BODY, "stream": stream}, headers=RESTORE
        )
        (record,) = await store.written(1)
    assert response.status_code == 200, response.text
    first, second = upstream.bodies
    assert offered(first)
    assert SECRET not in orjson.dumps(first["messages"]).decode()
    turn, reply = second["messages"][-2:]
    assert turn["role"] == "assistant"
    assert [b["name"] for b in turn["content"] if b["type"] == "tool_use"] == [TOOL_NAME]
    (result,) = reply["content"]
    assert result["type"] == "tool_result"
    assert result["tool_use_id"] == turn["content"][-1]["id"]
    assert SECRET in result["content"]
    assert rule_violations(second) == []  # what Anthropic accepts: alternation, answered calls
    assert TOOL_NAME not in response.text
    if stream:
        text, uses = streamed(response.text)
        assert uses == []
        usage = assembled_usage(response.text)
    else:
        answer = response.json()
        text = answer["content"][0]["text"]
        usage = answer["usage"]
    assert usage["input_tokens"] == 1000 + 1001  # the client sees both rounds
    assert usage["output_tokens"] == 10 + 11
    assert text == ANSWER.text
    assert record.prompt_tokens == 2001  # both rounds, JSON and stream
    assert record.completion_tokens == 21


async def test_the_cap_and_a_client_tool_on_the_messages_api(tmp_path: Path) -> None:
    """The last round offers no tool; a client call in a restore turn is dropped, and the next
    answer's client call reaches the client."""
    search = Call("search", arguments='{"q": "vault"}')
    restore = Reply(calls=(Call(TOOL_NAME, FIRST_REF), search))
    upstream = ScriptedUpstream([restore] * (MAX_ROUNDS - 1) + [Reply(calls=(search,))])
    tools = [{"name": "search", "input_schema": {"type": "object"}}]
    async with proxy(tmp_path, upstream) as (client, _):
        response = await client.post(
            "/v1/messages", json={**BODY, "tools": tools, "stream": True}, headers=RESTORE
        )
    assert response.status_code == 200
    assert [offered(b) for b in upstream.bodies] == [True, True, False]
    assert upstream.bodies[-1]["tools"] == tools
    for body in upstream.bodies[1:]:
        assert rule_violations(body) == []
        turns = [m for m in body["messages"][len(BODY["messages"]) :] if m["role"] == "assistant"]
        assert all(b.get("name") != "search" for t in turns for b in t["content"])
    _, uses = streamed(response.text)
    assert [u["name"] for u in uses] == ["search"]
