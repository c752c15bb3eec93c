"""ASGI tier: restore on OpenAI's Responses API — the tool offered as a flat `function` tool, a
`function_call` answered with a `function_call_output` item (with the reasoning item passed
back), JSON and stream; the API echoes `tools`, so the client's view of every response object
is scrubbed of the proxy's tool, and usage is summed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from inflight.proxy.restore import TOOL_NAME
from tests.asgi.test_restore_route import ANSWER, CHAT, RESTORE, SECRET, proxy
from tests.support.fake_restore_upstream import FIRST_REF, Call, Reply, ScriptedUpstream
from tests.support.fakes.responses import pairing_problem

pytestmark = pytest.mark.anyio

CLIENT_TOOLS = [{"type": "function", "name": "search", "parameters": {"type": "object"}}]
BODY: dict[str, Any] = {
    "model": "gpt-4o-mini",
    "instructions": "You are helpful.",
    "tools": CLIENT_TOOLS,
    "input": [
        {"role": "user", "content": "Read the log and tell me the vault code."},
        {"type": "function_call", "call_id": "c1", "name": "read_log", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": CHAT["messages"][3]["content"]},
        {"role": "user", "content": "So, what is the vault code?"},
    ],
}


def offered(body: dict[str, Any]) -> bool:
    return any(t.get("name") == TOOL_NAME for t in body.get("tools") or ())


@pytest.mark.parametrize("stream", [False, True])
async def test_one_restore_round_on_the_responses_api(tmp_path: Path, stream: bool) -> None:
    upstream = ScriptedUpstream([Reply(calls=(Call(TOOL_NAME, FIRST_REF),)), ANSWER])
    async with proxy(tmp_path, upstream) as (client, store):
        response = await client.post(
            "/v1/responses", json={**BODY, "stream": stream}, headers=RESTORE
        )
        (record,) = await store.written(1)
    assert response.status_code == 200, response.text
    first, second = upstream.bodies
    assert offered(first)
    assert first["tools"][:-1] == CLIENT_TOOLS
    assert SECRET not in orjson.dumps(first["input"]).decode()
    added = second["input"][len(first["input"]) :]
    assert [i["type"] for i in added] == ["reasoning", "function_call", "function_call_output"]
    assert added[2]["call_id"] == added[1]["call_id"]
    assert SECRET in added[2]["output"]
    assert pairing_problem(second["input"]) is None
    assert TOOL_NAME not in response.text  # not even in the echoed `tools`
    if stream:
        events = [orjson.loads(x[6:]) for x in response.text.splitlines() if x.startswith("data: ")]
        assert events[0]["response"]["tools"] == CLIENT_TOOLS
        final = events[-1]["response"]
        text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    else:
        final = response.json()
        text = final["output"][1]["content"][0]["text"]
    assert final["tools"] == CLIENT_TOOLS
    assert final["usage"]["input_tokens"] == 1000 + 1001  # the client sees both rounds
    assert final["usage"]["total_tokens"] == 2001 + 21
    assert text == ANSWER.text
    assert record.prompt_tokens == 2001
    assert record.completion_tokens == 21


@pytest.mark.parametrize("stream", [False, True])
async def test_an_answer_without_a_call_hides_the_offered_tool(
    tmp_path: Path, stream: bool
) -> None:
    upstream = ScriptedUpstream([ANSWER])
    async with proxy(tmp_path, upstream) as (client, store):
        response = await client.post(
            "/v1/responses", json={**BODY, "stream": stream}, headers=RESTORE
        )
        (record,) = await store.written(1)
    assert response.status_code == 200
    assert offered(upstream.bodies[0])
    assert TOOL_NAME not in response.text
    assert record.prompt_tokens == 1000
    final = response.json() if not stream else orjson.loads(response.text.split("data: ")[-1])
    tools = final["tools"] if not stream else final["response"]["tools"]
    assert tools == CLIENT_TOOLS


@pytest.mark.parametrize("stream", [False, True])
async def test_the_last_round_states_every_rounds_usage(tmp_path: Path, stream: bool) -> None:
    """The last round offers no tool, so its response objects echo none to hide: their usage
    is still the sum of every round."""
    calling = Reply(calls=(Call(TOOL_NAME, FIRST_REF),))
    upstream = ScriptedUpstream([calling, calling, ANSWER])
    async with proxy(tmp_path, upstream) as (client, store):
        response = await client.post(
            "/v1/responses", json={**BODY, "stream": stream}, headers=RESTORE
        )
        (record,) = await store.written(1)
    assert response.status_code == 200
    assert not offered(upstream.bodies[-1])
    if stream:
        events = [orjson.loads(x[6:]) for x in response.text.splitlines() if x.startswith("data: ")]
        final = events[-1]["response"]
    else:
        final = response.json()
    assert final["usage"]["input_tokens"] == 1000 + 1001 + 1002
    assert final["usage"]["output_tokens"] == 10 + 11 + 12
    assert record.prompt_tokens == 3003
