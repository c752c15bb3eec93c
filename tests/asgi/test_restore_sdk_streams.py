"""ASGI tier through the official SDKs' stream helpers: what restore relays is what the SDKs
accumulate. A round of 11 or more blocks is passed back upstream in index order (not string
order); with thinking on, the signed thinking of the rounds before comes first in the client's
turn; a Responses stream that lost a restore call numbers its events contiguously."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from inflight.apis.anthropic.restore import MessagesDialect
from inflight.apis.chat.restore import ChatDialect
from inflight.compaction.refs import REF_SUFFIX_RE
from inflight.factory import create_app
from inflight.proxy.restore import MAX_ROUNDS, NO_ANSWER, TOOL_NAME
from tests.asgi.test_restore_route import ANSWER, CHAT, RESTORE
from tests.conftest import make_settings
from tests.support.fake_restore_upstream import FIRST_REF, Call, Reply, ScriptedUpstream
from tests.support.servers import WatchedStore
from tests.unit.apis.anthropic.test_restore_messages import BODY as MESSAGES
from tests.unit.proxy.test_restore_stray import (
    BODIES,
    CALLING,
    MESSAGES_TOOLS,
    RESTORE_CALL,
    SEARCH,
)

pytestmark = pytest.mark.anyio

MODEL = "claude-sonnet-4-6"  # the anthropic SDK warns on deprecated names
MANY = Reply(calls=(Call(TOOL_NAME, FIRST_REF),) * 11)  # indices 0..10 in one answer


@asynccontextmanager
async def sdks(
    tmp_path: Path, upstream: Any
) -> AsyncIterator[tuple[openai.AsyncOpenAI, anthropic.AsyncAnthropic]]:
    """The official async clients, pointed at the proxy (ASGI) in front of `upstream` (the
    anthropic SDK speaks through its own httpx2)."""
    settings = make_settings(tmp_path, anthropic_upstream_url="http://upstream.test/v1")
    transport = httpx.ASGITransport(app=upstream.app)
    app = create_app(settings, transport=transport, store=WatchedStore())
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app)) as client,
        httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app)) as client2,
    ):
        oai = openai.AsyncOpenAI(
            base_url="http://p/v1", api_key="sk", http_client=client, default_headers=RESTORE
        )
        claude = anthropic.AsyncAnthropic(
            base_url="http://p", api_key="sk", http_client=client2, default_headers=RESTORE
        )
        yield oai, claude


def ids_in_order(ids: list[str]) -> None:
    assert ids == [f"call_0_{n}" for n in range(11)]


async def test_a_chat_round_of_eleven_calls_goes_back_in_index_order(tmp_path: Path) -> None:
    upstream = ScriptedUpstream([MANY, ANSWER])
    async with (
        sdks(tmp_path, upstream) as (oai, _),
        oai.chat.completions.stream(**CHAT) as events,
    ):
        final = await events.get_final_completion()
    assert (final.choices[0].message.content or "").strip() == ANSWER.text
    messages = upstream.bodies[1]["messages"][len(CHAT["messages"]) :]
    ids_in_order([c["id"] for c in messages[0]["tool_calls"]])
    ids_in_order([m["tool_call_id"] for m in messages[1:]])


async def test_a_messages_round_of_eleven_blocks_goes_back_in_index_order(tmp_path: Path) -> None:
    upstream = ScriptedUpstream([MANY, ANSWER])
    async with (
        sdks(tmp_path, upstream) as (_, claude),
        claude.messages.stream(**{**MESSAGES, "model": MODEL}) as events,
    ):
        final = await events.get_final_message()
    assert [b.type for b in final.content] == ["text"]
    turn, replies = upstream.bodies[1]["messages"][-2:]
    ids_in_order([b["id"] for b in turn["content"]])
    ids_in_order([b["tool_use_id"] for b in replies["content"]])


def test_assembled_parts_keep_their_index_order() -> None:
    """A malformed index (a string, an object) is no error, and numbers sort as numbers."""
    chat = [
        {"choices": [{"delta": {"tool_calls": [{"index": k, "id": f"c{k}"}]}}]}
        for k in (10, 2, "x", [1], 0)
    ]
    calls = ChatDialect().assemble(chat)["choices"][0]["message"]["tool_calls"]
    assert [c["id"] for c in calls] == ["c0", "c2", "c10", "c[1]", "cx"]
    blocks = [
        {"type": "content_block_start", "index": k, "content_block": {"type": "text", "text": k}}
        for k in (10, 2, 0)
    ]
    assert [b["text"] for b in MessagesDialect().assemble(blocks)["content"]] == [0, 2, 10]


# --- thinking on: the signed thinking before a restore call leads the client's turn ---------

THOUGHT = {"type": "thinking", "thinking": "The log was cut; read it.", "signature": "sig-1"}
REDACTED = {"type": "redacted_thinking", "data": "opaque-2"}
LOOKUP = {"type": "tool_use", "id": "toolu_s", "name": "search", "input": {"q": "vault"}}
TEXT = {"type": "text", "text": "The code is 4471-KESTREL"}


class ThinkingUpstream:
    """An Anthropic upstream with thinking on: round 1 thinks (signed) and calls
    `inflight_restore` with the first ref of the request; round 2 answers `last`."""

    def __init__(self, last: list[dict[str, Any]]) -> None:
        self.last = last
        self.bodies: list[dict[str, Any]] = []
        self.app = Starlette(routes=[Route("/v1/messages", self._messages, methods=["POST"])])

    async def _messages(self, request: Request) -> Response:
        body = orjson.loads(await request.body())
        k = len(self.bodies)
        self.bodies.append(body)
        if k == 0:
            found = REF_SUFFIX_RE.search(orjson.dumps(body["messages"]).decode())
            ref = found.group(1) if found else "none"
            call = {"type": "tool_use", "id": "toolu_r", "name": TOOL_NAME, "input": {"ref": ref}}
            blocks = [THOUGHT, REDACTED, call]
        else:
            blocks = self.last
        uses = any(b["type"] == "tool_use" for b in blocks)
        message = {"id": f"msg_{k}", "type": "message", "role": "assistant", "model": MODEL,
                   "content": blocks, "stop_reason": "tool_use" if uses else "end_turn",
                   "stop_sequence": None,
                   "usage": {"input_tokens": 1000 + k, "output_tokens": 10 + k}}  # fmt: skip
        if not body.get("stream"):
            return JSONResponse(message)
        return StreamingResponse(_events(message), media_type="text/event-stream")


async def _events(message: dict[str, Any]) -> AsyncIterator[bytes]:
    """Anthropic's events for `message`: each block started empty, its deltas, stopped."""

    def event(data: dict[str, Any]) -> bytes:
        return b"event: " + data["type"].encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"

    yield event({"type": "message_start", "message": {**message, "content": []}})
    for at, block in enumerate(message["content"]):
        kind, deltas = block["type"], []
        empty = dict(block)
        if kind == "thinking":
            empty = {**block, "thinking": "", "signature": ""}
            deltas = [{"type": "thinking_delta", "thinking": block["thinking"]},
                      {"type": "signature_delta", "signature": block["signature"]}]  # fmt: skip
        elif kind == "text":
            empty = {**block, "text": ""}
            deltas = [{"type": "text_delta", "text": block["text"]}]
        elif kind == "tool_use":
            empty = {**block, "input": {}}
            deltas = [{"type": "input_json_delta", "partial_json": orjson.dumps(block["input"])}]
            deltas[0]["partial_json"] = deltas[0]["partial_json"].decode()
        yield event({"type": "content_block_start", "index": at, "content_block": empty})
        for delta in deltas:
            yield event({"type": "content_block_delta", "index": at, "delta": delta})
        yield event({"type": "content_block_stop", "index": at})
    done = {"stop_reason": message["stop_reason"], "stop_sequence": None}
    yield event({"type": "message_delta", "delta": done, "usage": message["usage"]})
    yield event({"type": "message_stop"})


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("last", [[LOOKUP], [TEXT], [THOUGHT | {"signature": "sig-3"}, LOOKUP]])
async def test_the_signed_thinking_before_a_restore_call_leads_the_clients_turn(
    tmp_path: Path, stream: bool, last: list[dict[str, Any]]
) -> None:
    upstream = ThinkingUpstream(last)
    body = {**MESSAGES, "model": MODEL, "tools": MESSAGES_TOOLS,
            "thinking": {"type": "enabled", "budget_tokens": 1024}, "max_tokens": 2048}  # fmt: skip
    async with sdks(tmp_path, upstream) as (_, claude):
        if stream:
            async with claude.messages.stream(**body) as events:
                final = await events.get_final_message()
        else:
            final = await claude.messages.create(**body)
    assert len(upstream.bodies) == 2
    turn = upstream.bodies[1]["messages"][-2]
    assert turn["content"][:2] == [THOUGHT, REDACTED]  # the proxy's round 2 passed them back
    seen = [b.model_dump(exclude_none=True) for b in final.content]
    # the client's turn, sent back with its next request, begins with the signed thinking
    assert seen == [THOUGHT, REDACTED, *last]
    assert TOOL_NAME not in orjson.dumps(seen).decode()
    assert final.stop_reason == ("tool_use" if last[-1] is LOOKUP else "end_turn")


# --- a Responses stream that lost a restore call: contiguous sequence numbers ---------------


@pytest.mark.parametrize(
    ("replies", "calls"),
    [
        ([CALLING] * MAX_ROUNDS, []),  # nothing but stray calls: a NO_ANSWER item is added
        ([CALLING] * (MAX_ROUNDS - 1) + [Reply(calls=(RESTORE_CALL, SEARCH))], ["search"]),
        ([Reply(text="Let me look that up.", calls=(RESTORE_CALL, SEARCH))], ["search"]),
    ],
    ids=["no answer", "beside a client call", "after text"],
)
async def test_a_responses_stream_without_its_restore_calls_numbers_events_contiguously(
    tmp_path: Path, replies: list[Reply], calls: list[str]
) -> None:
    upstream = ScriptedUpstream(replies)
    async with (
        sdks(tmp_path, upstream) as (oai, _),
        oai.responses.stream(**BODIES["/v1/responses"]) as events,
    ):
        numbers = [event.sequence_number async for event in events]
        final = await events.get_final_response()
    assert numbers == list(range(len(numbers)))
    assert [i.name for i in final.output if i.type == "function_call"] == calls
    if not calls:
        assert final.output_text == NO_ANSWER
