"""ASGI tier: calls to `inflight_restore` the proxy does not answer never reach the client. The
last round does not offer the tool, but a model may still call it (hosted models call tools
seen earlier in the conversation); a streamed answer that starts with text is relayed as it
comes, calls and all. Those calls are dropped — JSON and stream, every API — the client's own
calls kept (renumbered in streams), the stop reason fixed, and an answer that was nothing but
such calls becomes `NO_ANSWER`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from inflight.proxy.restore import MAX_ROUNDS, NO_ANSWER, TOOL_NAME
from tests.asgi.test_restore_route import ANSWER, CHAT, RESTORE, proxy
from tests.support.fake_restore_upstream import FIRST_REF, Call, Reply, ScriptedUpstream
from tests.unit.apis.anthropic.test_restore_messages import BODY as MESSAGES
from tests.unit.apis.responses.test_restore_responses import BODY as RESPONSES

pytestmark = pytest.mark.anyio

RESTORE_CALL = Call(TOOL_NAME, FIRST_REF)
SEARCH = Call("search", arguments='{"q": "vault"}')
CALLING = Reply(calls=(RESTORE_CALL,))
CHAT_TOOLS = [{"type": "function", "function": {"name": "search", "parameters": {}}}]
MESSAGES_TOOLS = [{"name": "search", "input_schema": {"type": "object"}}]
BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {**CHAT, "tools": CHAT_TOOLS},
    "/v1/messages": {**MESSAGES, "tools": MESSAGES_TOOLS},
    "/v1/responses": RESPONSES,  # its client tools include `search`
}


def data_events(text: str) -> list[dict[str, Any]]:
    lines = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    return [orjson.loads(line) for line in lines if line != "[DONE]"]


def seen(route: str, stream: bool, text: str) -> tuple[str, list[str], str | None]:
    """What the client reads: the answer's text, the names of the calls, the stop reason —
    checking on the way that a stream's indices are whole (from 0, no gaps)."""
    if not stream:
        answer = orjson.loads(text)
        if route == "/v1/chat/completions":
            choice = answer["choices"][0]
            calls = choice["message"].get("tool_calls") or []
            names = [c["function"]["name"] for c in calls]
            return choice["message"]["content"] or "", names, choice["finish_reason"]
        if route == "/v1/messages":
            blocks = answer["content"]
            words = "".join(b["text"] for b in blocks if b["type"] == "text")
            names = [b["name"] for b in blocks if b["type"] == "tool_use"]
            return words, names, answer["stop_reason"]
        items = answer["output"]
        words = "".join(c["text"] for i in items if i["type"] == "message" for c in i["content"])
        return words, [i["name"] for i in items if i["type"] == "function_call"], None
    events = data_events(text)
    if route == "/v1/chat/completions":
        deltas = [(e["choices"][0]["delta"], e["choices"][0]) for e in events if e["choices"]]
        words = "".join(d.get("content") or "" for d, _ in deltas)
        pieces = [p for d, _ in deltas for p in d.get("tool_calls") or ()]
        firsts = [p for p in pieces if p.get("id")]
        assert [p["index"] for p in firsts] == list(range(len(firsts)))
        assert {p["index"] for p in pieces} <= set(range(len(firsts)))
        finish = [c["finish_reason"] for _, c in deltas if c.get("finish_reason")]
        return words, [p["function"]["name"] for p in firsts], finish[-1]
    if route == "/v1/messages":
        starts = [e for e in events if e["type"] == "content_block_start"]
        assert [e["index"] for e in starts] == list(range(len(starts)))
        indices = {e["index"] for e in events if "index" in e}
        assert indices == set(range(len(starts)))
        words = "".join(
            e["delta"].get("text", "") for e in events if e["type"] == "content_block_delta"
        )
        names = [
            e["content_block"]["name"] for e in starts if e["content_block"]["type"] == "tool_use"
        ]
        (stop,) = [e["delta"]["stop_reason"] for e in events if e["type"] == "message_delta"]
        return words, names, stop
    added = [e for e in events if e["type"] == "response.output_item.added"]
    assert [e["output_index"] for e in added] == list(range(len(added)))
    assert {e["output_index"] for e in events if "output_index" in e} == set(range(len(added)))
    (completed,) = [e["response"] for e in events if e["type"] == "response.completed"]
    assert [i["type"] for i in completed["output"]] == [e["item"]["type"] for e in added]
    words = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    if not words:  # an item added whole (NO_ANSWER)
        words = "".join(
            c["text"] for i in completed["output"] if i["type"] == "message" for c in i["content"]
        )
    names = [i["name"] for i in completed["output"] if i["type"] == "function_call"]
    return words, names, None


STOPS = {"/v1/chat/completions": ("stop", "tool_calls"), "/v1/messages": ("end_turn", "tool_use")}


async def ask(tmp_path: Path, route: str, stream: bool, replies: list[Reply]) -> tuple[Any, Any]:
    upstream = ScriptedUpstream(replies)
    async with proxy(tmp_path, upstream) as (client, store):
        response = await client.post(
            route, json={**BODIES[route], "stream": stream}, headers=RESTORE
        )
        (record,) = await store.written(1)
    assert response.status_code == 200, response.text
    assert TOOL_NAME not in response.text
    assert record.outcome == "completed"
    return response, upstream


@pytest.mark.parametrize("route", list(BODIES))
@pytest.mark.parametrize("stream", [False, True])
async def test_a_stray_call_on_the_last_round_is_dropped(
    tmp_path: Path, route: str, stream: bool
) -> None:
    last = Reply(text=ANSWER.text, calls=(RESTORE_CALL,))
    response, upstream = await ask(tmp_path, route, stream, [CALLING] * (MAX_ROUNDS - 1) + [last])
    assert len(upstream.bodies) == MAX_ROUNDS
    text, names, stop = seen(route, stream, response.text)
    assert (text.strip(), names) == (ANSWER.text, [])
    assert stop in (None, STOPS.get(route, ("",))[0])


@pytest.mark.parametrize("route", list(BODIES))
@pytest.mark.parametrize("stream", [False, True])
async def test_a_last_round_of_nothing_but_stray_calls_says_so(
    tmp_path: Path, route: str, stream: bool
) -> None:
    response, upstream = await ask(tmp_path, route, stream, [CALLING] * MAX_ROUNDS)
    assert len(upstream.bodies) == MAX_ROUNDS
    text, names, stop = seen(route, stream, response.text)
    assert (text.strip(), names) == (NO_ANSWER, [])
    assert stop in (None, STOPS.get(route, ("",))[0])


@pytest.mark.parametrize("route", list(BODIES))
@pytest.mark.parametrize("stream", [False, True])
async def test_a_stray_call_beside_a_client_call_keeps_the_client_call(
    tmp_path: Path, route: str, stream: bool
) -> None:
    last = Reply(calls=(RESTORE_CALL, SEARCH))
    response, _ = await ask(tmp_path, route, stream, [CALLING] * (MAX_ROUNDS - 1) + [last])
    text, names, stop = seen(route, stream, response.text)
    assert (text.strip(), names) == ("", ["search"])
    assert stop in (None, STOPS.get(route, ("", ""))[1])


@pytest.mark.parametrize("route", list(BODIES))
async def test_a_stream_that_starts_with_text_never_shows_a_restore_call(
    tmp_path: Path, route: str
) -> None:
    """A streamed answer is relayed from its first text on, so a restore call after that text
    cannot be answered any more: it is dropped, and the client's call after it renumbered."""
    first = Reply(text="Let me look that up.", calls=(RESTORE_CALL, SEARCH))
    response, upstream = await ask(tmp_path, route, True, [first, ANSWER])
    assert len(upstream.bodies) == 1
    text, names, stop = seen(route, True, response.text)
    assert (text.strip(), names) == ("Let me look that up.", ["search"])
    assert stop in (None, STOPS.get(route, ("", ""))[1])


def test_the_docs_quote_the_no_answer_text() -> None:
    docs = (Path(__file__).resolve().parents[3] / "docs" / "nothing-lost.md").read_text()
    assert f"`{NO_ANSWER}`" in docs
