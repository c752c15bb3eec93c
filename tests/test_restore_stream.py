"""Restore on a stream, piece by piece: the kind of an answer from its first chunks, a streamed
tool call assembled, and the usage chunk the client sees summed over the rounds."""

from __future__ import annotations

from collections.abc import AsyncIterator

import orjson
import pytest

from app.proxy.restore_chat import ChatDialect
from app.proxy.restore_stream import _events, _first_kind
from app.proxy.sse_tap import SSETap, Usage
from tests.fake_restore_upstream import sse

pytestmark = pytest.mark.anyio
CHAT = ChatDialect()


def chunk(delta: dict[str, object], finish: str | None = None) -> bytes:
    return sse({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


async def pieces(data: bytes, size: int) -> AsyncIterator[bytes]:
    for at in range(0, len(data), size):
        yield data[at : at + size]


TEXT = chunk({"role": "assistant", "content": ""}) + chunk({"content": "Hi"}) + chunk({}, "stop")
CALL = (
    chunk({"role": "assistant", "content": None})
    + chunk({"tool_calls": [{"index": 0, "id": "a", "function": {"name": "inflight_restore"}}]})
    + chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"ref"'}}]})
    + chunk({"tool_calls": [{"index": 0, "function": {"arguments": ': "abc123"}'}}]})
    + chunk({"tool_calls": [{"index": 1, "id": "b", "function": {"name": "search"}}]})
    + chunk({}, "tool_calls")
    + sse({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}})
    + b"data: [DONE]\n\n"
)


@pytest.mark.parametrize("size", [1, 7, 10_000])
async def test_the_kind_is_known_from_the_first_telling_chunk(size: int) -> None:
    kind, head = await _first_kind(pieces(TEXT, size), CHAT)
    assert kind == "text"
    assert TEXT.startswith(head)
    assert b'"Hi"' in head  # an empty first content says nothing: read on to the text
    kind, head = await _first_kind(pieces(CALL, size), CHAT)
    assert kind == "tools"
    assert b"inflight_restore" in head
    assert b'"ref"' not in head or size > len(CALL) // 2  # stopped early when chunks allow


async def test_a_body_that_ends_or_is_no_chat_stream_is_text() -> None:
    assert (await _first_kind(pieces(b"data: [DONE]\n\n", 3), CHAT))[0] == "text"
    assert (await _first_kind(pieces(b"not an event stream", 3), CHAT))[0] == "text"


def test_streamed_calls_are_assembled_with_their_usage() -> None:
    answer = CHAT.assemble(_events(CALL))
    assert answer["choices"][0]["message"]["tool_calls"] == [
        {
            "type": "function",
            "id": "a",
            "function": {"name": "inflight_restore", "arguments": '{"ref": "abc123"}'},
        },
        {"type": "function", "id": "b", "function": {"name": "search", "arguments": ""}},
    ]
    assert CHAT.usage(answer) == Usage(5, 2)
    assert [c["id"] for c in CHAT.calls(answer)] == ["a"]  # only the proxy's own


def test_the_usage_chunk_states_the_sum_of_every_round() -> None:
    usage_line = sse(
        {"id": "x", "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3}}
    )
    tap = SSETap(carry=Usage(100, 20))
    out = b"".join(tap.feed(p) for p in (TEXT, usage_line[:9], usage_line[9:])) + tap.flush()
    assert out.startswith(TEXT)  # every other line passes untouched
    summed = orjson.loads(out[len(TEXT) :].split(b"\n")[0][6:])
    assert summed["usage"] == {"prompt_tokens": 107, "completion_tokens": 23, "total_tokens": 130}
    assert tap.usage == Usage(107, 23)
    stripped = SSETap(strip_usage_chunk=True, carry=Usage(100, 20))
    assert stripped.feed(TEXT + usage_line) == TEXT  # not asked for: still cut, still counted
    assert stripped.usage == Usage(107, 23)
