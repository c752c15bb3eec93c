"""ASGI tier: a Codex-style Responses session (reasoning before a web search, an answer,
reasoning before a function call and its output, ten times) compacted through
`/v1/responses`: every reasoning item is forwarded with the item it preceded, or neither is."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from itertools import pairwise
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from inflight.factory import create_app
from tests.conftest import make_settings

pytestmark = pytest.mark.anyio


def codex_session(lines: int, rounds: int = 10) -> dict[str, Any]:
    """reasoning → web_search_call → message → reasoning → function_call →
    function_call_output, `rounds` times after a user message; every item has an id."""
    text = [{"type": "input_text", "text": "Research and fix the bug."}]
    items: list[dict[str, Any]] = [{"type": "message", "id": "msg_u", "role": "user",
                                    "content": text}]  # fmt: skip
    for k in range(rounds):
        found = [{"type": "output_text", "text": f"Found {k}: " + "details " * 20,
                  "annotations": []}]  # fmt: skip
        items += [
            {"type": "reasoning", "id": f"rs_ws{k}", "encrypted_content": "gAAAA" + "x" * 40,
             "summary": [{"type": "summary_text", "text": f"I should search for clue {k}."}]},
            {"type": "web_search_call", "id": f"ws_{k}", "status": "completed",
             "action": {"type": "search", "query": f"query number {k}"}},
            {"type": "message", "id": f"msg_{k}", "role": "assistant", "status": "completed",
             "content": found},
            {"type": "reasoning", "id": f"rs_fc{k}", "encrypted_content": "gAAAA" + "y" * 40,
             "summary": [{"type": "summary_text", "text": f"Now run the tool {k}."}]},
            {"type": "function_call", "id": f"fc_{k}", "call_id": f"call_{k}", "name": "shell",
             "arguments": orjson.dumps({"cmd": f"ls -la /src/{k}"}).decode()},
            {"type": "function_call_output", "id": f"fco_{k}", "call_id": f"call_{k}",
             "output": "file listing line\n" * lines},
        ]  # fmt: skip
    return {"model": "gpt-5-codex", "input": items}


def separated(received: list[dict[str, Any]], forwarded: list[dict[str, Any]]) -> list[str]:
    """Each forwarded reasoning item not followed by the item that followed it, and each
    forwarded item whose reasoning item was not forwarded right before it."""
    after = {a["id"]: b["id"] for a, b in pairwise(received)}
    reasoned = {b["id"]: a["id"] for a, b in pairwise(received) if a["type"] == "reasoning"}
    ids = [item.get("id") for item in forwarded]
    problems: list[str] = []
    for k, item in enumerate(forwarded):
        following = ids[k + 1] if k + 1 < len(ids) else None
        if item.get("type") == "reasoning" and following != after.get(item["id"]):
            problems.append(f"{item['id']} then {following}")
        if item.get("id") in reasoned and (k == 0 or ids[k - 1] != reasoned[item["id"]]):
            problems.append(f"{item['id']} without {reasoned[item['id']]}")
    return problems


@asynccontextmanager
async def proxy(tmp_path: Path, forwarded: list[Any]) -> AsyncIterator[httpx.AsyncClient]:
    """The proxy in front of an upstream that records each Responses body it gets."""

    def upstream(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/responses"):
            forwarded.append(orjson.loads(request.content))
            return httpx.Response(200, json={"id": "resp_1", "object": "response",
                                             "status": "completed", "output": []})  # fmt: skip
        return httpx.Response(404, json={"error": {"message": "no such route"}})

    app = create_app(make_settings(tmp_path), transport=httpx.MockTransport(upstream))
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://p") as client,
    ):
        yield client


# (output lines, window, strategy): where each strategy separated a reasoning item from the
# item it preceded before reasoning joined a unit with any item (middle-out forwarded
# `rs_ws4` then `rs_ws7`; trim and summarize kept a web search whose reasoning was cut)
CASES = [
    (130, 5500, "middle-out"),
    (140, 5500, "middle-out"),
    (160, 5500, "middle-out"),
    (60, 3500, "middle-out"),
    (100, 3000, "trim"),
    (100, 5000, "summarize"),
]


@pytest.mark.parametrize(("lines", "window", "strategy"), CASES)
async def test_reasoning_is_forwarded_with_the_item_it_preceded(
    tmp_path: Path, lines: int, window: int, strategy: str
) -> None:
    forwarded: list[Any] = []
    body = codex_session(lines)
    headers = {"X-Compaction-Context-Limit": str(window), "X-Compaction-Strategy": strategy}
    async with proxy(tmp_path, forwarded) as client:
        response = await client.post("/v1/responses", json=body, headers=headers)
    assert response.status_code == 200, response.text
    # the client's request (a summary request, if any, is another body)
    (sent,) = [b for b in forwarded if b["input"] and b["input"][0].get("id") == "msg_u"]
    assert len(sent["input"]) < len(body["input"])  # compacted
    assert separated(body["input"], sent["input"]) == []
