"""ASGI tier: restore on, a client field of the wrong type is never a 500. `tools: null` means
no tools (the proxy's tool is offered alone); `tools` of any other non-list type is forwarded
as received, without the tool (the upstream judges it); a `tool_choice` of any type is
forwarded as received; a history that is no list is not restored."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from inflight.proxy.restore import TOOL_NAME
from tests.asgi.test_restore_route import ANSWER, RESTORE, proxy
from tests.support.fake_restore_upstream import FIRST_REF, Call, Reply, ScriptedUpstream
from tests.unit.proxy.test_restore_stray import BODIES, seen

pytestmark = pytest.mark.anyio

CALLING = Reply(calls=(Call(TOOL_NAME, FIRST_REF),))
WRONG: list[Any] = [5, True, "x", {"type": "function"}, 1.5]


def names(tools: Any) -> list[Any]:
    """The names of the forwarded tools (chat's nested under `function`)."""
    return [t.get("name") or t.get("function", {}).get("name") for t in tools]


async def send(tmp_path: Path, route: str, body: dict[str, Any], replies: list[Reply]) -> Any:
    upstream = ScriptedUpstream(replies)
    async with proxy(tmp_path, upstream) as (client, store):
        response = await client.post(route, json=body, headers=RESTORE)
        await store.written(1)
    assert response.status_code < 500, response.text
    return response, upstream


@pytest.mark.parametrize("route", list(BODIES))
@pytest.mark.parametrize("stream", [False, True])
async def test_null_tools_offer_the_restore_tool_alone(
    tmp_path: Path, route: str, stream: bool
) -> None:
    body = {**BODIES[route], "tools": None, "stream": stream}
    response, upstream = await send(tmp_path, route, body, [CALLING, ANSWER])
    assert response.status_code == 200
    first, second = upstream.bodies
    assert names(first["tools"]) == [TOOL_NAME]
    assert second["tools"] == first["tools"]
    text, calls, _ = seen(route, stream, response.text)
    assert (text.strip(), calls) == (ANSWER.text, [])
    assert TOOL_NAME not in response.text


@pytest.mark.parametrize("route", list(BODIES))
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("tools", WRONG)
async def test_tools_of_another_type_are_forwarded_as_received(
    tmp_path: Path, route: str, stream: bool, tools: Any
) -> None:
    body = {**BODIES[route], "tools": tools, "stream": stream}
    response, upstream = await send(tmp_path, route, body, [ANSWER])
    (forwarded,) = upstream.bodies
    assert forwarded["tools"] == tools
    assert response.status_code == 200


@pytest.mark.parametrize("route", list(BODIES))
@pytest.mark.parametrize("choice", [None, 5, "x", [], {}, {"type": 5}, {"type": "function"}])
async def test_a_tool_choice_of_any_type_is_forwarded_as_received(
    tmp_path: Path, route: str, choice: Any
) -> None:
    body = {**BODIES[route], "tool_choice": choice}
    response, upstream = await send(tmp_path, route, body, [CALLING, ANSWER])
    assert response.status_code == 200
    assert upstream.bodies[0]["tool_choice"] == choice
    assert TOOL_NAME in names(upstream.bodies[0]["tools"])


@pytest.mark.parametrize("route", list(BODIES))
@pytest.mark.parametrize("field", ["instructions", "system"])
@pytest.mark.parametrize("value", [None, 5, [], {}, [5]])
async def test_instructions_and_system_of_any_type_are_no_500(
    tmp_path: Path, route: str, field: str, value: Any
) -> None:
    body = {**BODIES[route], field: value, "stream": True}
    await send(tmp_path, route, body, [CALLING, ANSWER])
