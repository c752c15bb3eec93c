"""ASGI tier: the restore loop (DESIGN.md §11) against a scripted upstream that calls
`inflight_restore` — JSON and stream, one and several rounds, the round cap, mixed with a
client tool, an unknown ref; the client never sees the tool, and every round's usage counts."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from inflight.factory import create_app
from inflight.proxy.restore import MAX_ROUNDS, TOOL_NAME
from tests.conftest import make_settings
from tests.support.fake_restore_upstream import FIRST_REF, Call, Reply, ScriptedUpstream
from tests.support.servers import WatchedStore

pytestmark = pytest.mark.anyio

SECRET = "the vault code is 4471-KESTREL"
# A tool output too long for the 8k window: its middle (with the secret) is truncated away.
OUTPUT = "log line " * 500 + SECRET + " " + "more log " * 6000
CHAT: dict[str, Any] = {
    "model": "gpt-4o-mini",
    "messages": [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "Read the log and tell me the vault code."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "read_log", "arguments": "{}"},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": OUTPUT},
        {"role": "user", "content": "So, what is the vault code?"},
    ],
}
RESTORE = {"x-compaction-restore": "on", "x-compaction-context-limit": "8192"}
ANSWER = Reply(text="The code is 4471-KESTREL")


@asynccontextmanager
async def proxy(
    tmp_path: Path, upstream: ScriptedUpstream, **settings: Any
) -> AsyncIterator[tuple[httpx.AsyncClient, WatchedStore]]:
    """The proxy in front of `upstream` (every API's upstream), its client and usage store."""
    store = WatchedStore()
    settings.setdefault("anthropic_upstream_url", "http://upstream.test/v1")
    app = create_app(
        make_settings(tmp_path, **settings),
        transport=upstream.transport(),
        store=store,
    )
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://p") as client,
    ):
        yield client, store


def offered(body: dict[str, Any]) -> bool:
    return any(t["function"]["name"] == TOOL_NAME for t in body.get("tools") or ())


def stream_events(text: str) -> list[Any]:
    lines = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    assert lines.count("[DONE]") == 1
    return [orjson.loads(line) for line in lines[:-1]]


def streamed_text(events: list[Any]) -> str:
    return "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])


def streamed_calls(events: list[Any]) -> list[Any]:
    return [
        call
        for e in events
        if e["choices"]
        for call in e["choices"][0]["delta"].get("tool_calls") or ()
    ]


@pytest.mark.parametrize("stream", [False, True])
async def test_one_restore_round_reads_the_cut_text_and_the_client_sees_only_the_answer(
    tmp_path: Path, stream: bool
) -> None:
    upstream = ScriptedUpstream([Reply(calls=(Call(TOOL_NAME, FIRST_REF),)), ANSWER])
    body = {**CHAT, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    async with proxy(tmp_path, upstream) as (client, store):
        response = await client.post("/v1/chat/completions", json=body, headers=RESTORE)
        assert response.status_code == 200, response.text
        (record,) = await store.written(1)
        stats = (await client.get("/stats")).json()
    first, second = upstream.bodies
    assert offered(first)
    assert offered(second)
    assert SECRET not in orjson.dumps(first["messages"]).decode()  # truncated away...
    restored = second["messages"][-1]
    assert restored["role"] == "tool"
    assert SECRET in restored["content"]
    call = second["messages"][-2]["tool_calls"][0]
    assert call["function"]["name"] == TOOL_NAME
    assert restored["tool_call_id"] == call["id"]
    assert second["messages"][:-2] == first["messages"]  # the prefix stays byte-stable
    assert response.headers["x-compaction-restore-calls"] == "1"
    assert response.headers["x-compaction-restore-rounds"] == "2"
    assert TOOL_NAME not in response.text  # the client never sees the tool or the call
    if stream:
        events = stream_events(response.text)
        assert streamed_text(events).strip() == ANSWER.text
        (usage,) = [e["usage"] for e in events if e.get("usage")]
    else:
        message = response.json()["choices"][0]["message"]
        assert message["content"] == ANSWER.text
        assert "tool_calls" not in message
        usage = response.json()["usage"]
    # the usage the client gets and the one record are the sum of both rounds
    assert usage["prompt_tokens"] == 1000 + 1001
    assert usage["completion_tokens"] == 10 + 11
    assert usage["total_tokens"] == 2001 + 21
    assert (record.prompt_tokens, record.completion_tokens) == (2001, 21)
    assert stats["tokens_in"] == 2001
    assert stats["tokens_out"] == 21


@pytest.mark.parametrize("stream", [False, True])
async def test_rounds_stop_at_the_cap_and_the_last_round_offers_no_tool(
    tmp_path: Path, stream: bool
) -> None:
    restore = Reply(calls=(Call(TOOL_NAME, FIRST_REF),))
    upstream = ScriptedUpstream([restore] * (MAX_ROUNDS - 1) + [ANSWER])
    async with proxy(tmp_path, upstream) as (client, store):
        response = await client.post(
            "/v1/chat/completions", json={**CHAT, "stream": stream}, headers=RESTORE
        )
        (record,) = await store.written(1)
    assert response.status_code == 200
    assert len(upstream.bodies) == MAX_ROUNDS == 3
    assert [offered(b) for b in upstream.bodies] == [True, True, False]
    assert "tools" not in upstream.bodies[-1]  # the client sent none: none are sent
    last = upstream.bodies[-1]["messages"]
    assert [m["role"] for m in last[-4:]] == ["assistant", "tool", "assistant", "tool"]
    assert record.prompt_tokens == 1000 + 1001 + 1002
    text = streamed_text(stream_events(response.text)) if stream else response.text
    assert ANSWER.text in text
    assert TOOL_NAME not in response.text


@pytest.mark.parametrize("stream", [False, True])
async def test_a_restore_call_mixed_with_a_client_tool_is_resolved_first(
    tmp_path: Path, stream: bool
) -> None:
    """The proxy answers its own call; the client's call of that turn is not returned (the
    model re-issues it after reading), and the next answer's client call reaches the client."""
    search = Call("search", arguments='{"q": "vault"}')
    upstream = ScriptedUpstream(
        [Reply(calls=(Call(TOOL_NAME, FIRST_REF), search)), Reply(calls=(search,))]
    )
    tools = [{"type": "function", "function": {"name": "search", "parameters": {}}}]
    body = {**CHAT, "tools": tools, "stream": stream}
    async with proxy(tmp_path, upstream) as (client, _):
        response = await client.post("/v1/chat/completions", json=body, headers=RESTORE)
    assert response.status_code == 200
    first, second = upstream.bodies
    assert first["tools"] == [*tools, first["tools"][-1]]
    assert offered(first)
    turn = second["messages"][-2]
    assert [c["function"]["name"] for c in turn["tool_calls"]] == [TOOL_NAME]
    if stream:
        calls = streamed_calls(stream_events(response.text))
        assert [c["function"].get("name") for c in calls if c.get("id")] == ["search"]
    else:
        (call,) = response.json()["choices"][0]["message"]["tool_calls"]
        assert call["function"] == {"name": "search", "arguments": '{"q": "vault"}'}
    assert TOOL_NAME not in response.text


@pytest.mark.parametrize("stream", [False, True])
async def test_an_unknown_ref_gets_a_tool_answer_not_an_error(tmp_path: Path, stream: bool) -> None:
    upstream = ScriptedUpstream([Reply(calls=(Call(TOOL_NAME, "nosuchref99"),)), ANSWER])
    async with proxy(tmp_path, upstream) as (client, _):
        response = await client.post(
            "/v1/chat/completions", json={**CHAT, "stream": stream}, headers=RESTORE
        )
    assert response.status_code == 200
    answer = upstream.bodies[1]["messages"][-1]["content"]
    assert "no cut text has the ref 'nosuchref99'" in answer


async def test_a_text_stream_is_relayed_after_one_look(tmp_path: Path) -> None:
    upstream = ScriptedUpstream([ANSWER])
    async with proxy(tmp_path, upstream) as (client, store):
        response = await client.post(
            "/v1/chat/completions", json={**CHAT, "stream": True}, headers=RESTORE
        )
        (record,) = await store.written(1)
    assert len(upstream.bodies) == 1
    assert offered(upstream.bodies[0])
    events = stream_events(response.text)
    assert streamed_text(events).strip() == ANSWER.text
    assert not [e for e in events if e.get("usage")]  # the client did not ask for usage
    assert record.prompt_tokens == 1000
    assert "x-compaction-restore-calls" not in response.headers


@pytest.mark.parametrize(
    ("extra", "headers"),
    [
        ({}, {"x-compaction-context-limit": "8192"}),  # restore off
        ({"tool_choice": "none"}, RESTORE),  # the client forbids tools
        ({"messages": CHAT["messages"][:2]}, RESTORE),  # nothing cut: no marker
    ],
)
async def test_no_tool_is_offered_without_restore_a_marker_or_leave(
    tmp_path: Path, extra: dict[str, Any], headers: dict[str, str]
) -> None:
    upstream = ScriptedUpstream([ANSWER])
    raw = orjson.dumps({**CHAT, **extra})
    async with proxy(tmp_path, upstream) as (client, _):
        response = await client.post("/v1/chat/completions", content=raw, headers=headers)
    assert response.status_code == 200
    (sent,) = upstream.bodies
    assert not offered(sent)
    if len(sent["messages"]) == 2:  # under the threshold: forwarded exactly as received
        assert upstream.raw == [raw]


async def test_restore_on_by_setting_and_a_cut_answer_says_so(tmp_path: Path) -> None:
    """INFLIGHT_RESTORE turns it on; an original longer than the room left is cut, and the
    tool answer says how much is not shown."""
    huge = "x" * 400_000
    messages = [*CHAT["messages"][:3], {"role": "tool", "tool_call_id": "c1", "content": huge}]
    messages.append(CHAT["messages"][4])
    upstream = ScriptedUpstream([Reply(calls=(Call(TOOL_NAME, FIRST_REF),)), ANSWER])
    async with proxy(tmp_path, upstream, restore=True, context_limit=8192) as (client, _):
        response = await client.post("/v1/chat/completions", json={**CHAT, "messages": messages})
    assert response.status_code == 200
    answer = upstream.bodies[1]["messages"][-1]["content"]
    assert "chars not shown]" in answer
    assert len(answer) < 8192 * 3


async def test_the_summed_usage_of_several_rounds_does_not_calibrate_the_counter(
    tmp_path: Path,
) -> None:
    """Restore's usage is the sum of several prompts: the counter must not learn from it (a
    single round's usage, tool definition included, still calibrates)."""
    count_body = {"model": "gpt-4o-mini", "messages": CHAT["messages"]}

    async def counted(client: httpx.AsyncClient) -> int:
        response = await client.post("/v1/compaction/count", json=count_body)
        return int(response.json()["prompt_tokens"])

    restore = Reply(calls=(Call(TOOL_NAME, FIRST_REF),))
    upstream = ScriptedUpstream([restore, ANSWER, ANSWER])
    async with proxy(tmp_path, upstream) as (client, store):
        before = await counted(client)
        await client.post("/v1/chat/completions", json=CHAT, headers=RESTORE)  # 2 rounds
        await store.written(1)
        assert await counted(client) == before
        await client.post("/v1/chat/completions", json=CHAT, headers=RESTORE)  # 1 round
        await store.written(2)
        assert await counted(client) != before
