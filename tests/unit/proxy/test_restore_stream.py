"""Restore on a stream, piece by piece: the kind of an answer from its first chunks, a streamed
tool call assembled, and the usage chunk the client sees summed over the rounds."""

from __future__ import annotations

from collections.abc import AsyncIterator

import orjson
import pytest

from inflight.apis.anthropic.events import EVENTS as ANTHROPIC_EVENTS
from inflight.apis.anthropic.restore import MessagesDialect
from inflight.apis.chat.events import EVENTS as CHAT_EVENTS
from inflight.apis.chat.restore import ChatDialect
from inflight.proxy.restore_stream import _events, _first_kind
from inflight.proxy.sse_tap import SSETap, Usage
from tests.support.fake_restore_upstream import sse

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
    tap = SSETap(CHAT_EVENTS, carry=Usage(100, 20))
    out = b"".join(tap.feed(p) for p in (TEXT, usage_line[:9], usage_line[9:])) + tap.flush()
    assert out.startswith(TEXT)  # every other line passes untouched
    summed = orjson.loads(out[len(TEXT) :].split(b"\n")[0][6:])
    assert summed["usage"] == {"prompt_tokens": 107, "completion_tokens": 23, "total_tokens": 130}
    assert tap.usage == Usage(107, 23)
    stripped = SSETap(CHAT_EVENTS, strip_usage_chunk=True, carry=Usage(100, 20))
    assert stripped.feed(TEXT + usage_line) == TEXT  # not asked for: still cut, still counted
    assert stripped.usage == Usage(107, 23)


def anthropic_event(name: str, data: dict[str, object]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


@pytest.mark.parametrize("full_delta", [False, True])
def test_an_anthropic_stream_states_the_sum_of_every_round(full_delta: bool) -> None:
    """`message_start` and each count `message_delta` states are summed with the earlier
    rounds, so the usage a client assembles (start, overwritten by what deltas state) is the
    sum; newer servers state every count in `message_delta`, older ones only `output_tokens`."""
    own = {"input_tokens": 7, "output_tokens": 1, "cache_read_input_tokens": 50}
    start = {"type": "message_start", "message": {"id": "m", "content": [], "usage": own}}
    final = {"output_tokens": 9, **({"input_tokens": 7, "cache_read_input_tokens": 50,
             "cache_creation_input_tokens": 0} if full_delta else {})}  # fmt: skip
    delta = {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": final}
    text = anthropic_event(
        "content_block_delta",
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "x"}},
    )
    stream = (
        anthropic_event("message_start", start)
        + text
        + anthropic_event("message_delta", delta)
        + anthropic_event("message_stop", {"type": "message_stop"})
    )
    # earlier rounds: 100 fresh + 20 cache reads + 30 cache writes in, 40 out
    tap = SSETap(ANTHROPIC_EVENTS, carry=Usage(150, 40, 20, 30))
    out = b"".join(tap.feed(stream[at : at + 5]) for at in range(0, len(stream), 5)) + tap.flush()
    assert text in out  # every other line passes untouched
    events = [orjson.loads(line[6:]) for line in out.splitlines() if line.startswith(b"data: ")]
    usage = dict(events[0]["message"]["usage"])
    assert usage == {
        "input_tokens": 107,
        "output_tokens": 41,
        "cache_read_input_tokens": 70,
        "cache_creation_input_tokens": 30,
    }
    usage.update({k: v for k, v in events[2]["usage"].items() if v is not None})
    assert usage == {
        "input_tokens": 107,
        "output_tokens": 49,
        "cache_read_input_tokens": 70,
        "cache_creation_input_tokens": 30,
    }
    assert tap.usage == Usage(107 + 70 + 30, 49, 70, 30)  # the record: the same sum


def test_dropped_calls_leave_a_well_formed_stream_however_it_is_cut() -> None:
    """A restore `tool_use` block after text, then a client's: its events go (with their
    `event:` lines), the client's block becomes index 1 — the same bytes whatever the chunks."""

    def block(index: int, start: dict[str, object], delta: dict[str, object]) -> bytes:
        return (
            anthropic_event(
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": start},
            )
            + anthropic_event(
                "content_block_delta",
                {"type": "content_block_delta", "index": index, "delta": delta},
            )
            + anthropic_event("content_block_stop", {"type": "content_block_stop", "index": index})
        )

    def use(name: str) -> dict[str, object]:
        return {"type": "tool_use", "id": f"t_{name}", "name": name, "input": {}}

    arguments = {"type": "input_json_delta", "partial_json": '{"ref": "abc"}'}
    stream = (
        anthropic_event("message_start", {"type": "message_start", "message": {"content": []}})
        + block(0, {"type": "text", "text": ""}, {"type": "text_delta", "text": "Let me see."})
        + block(1, use("inflight_restore"), arguments)
        + block(2, use("search"), arguments)
        + anthropic_event(
            "message_delta", {"type": "message_delta", "delta": {"stop_reason": "tool_use"}}
        )
        + anthropic_event("message_stop", {"type": "message_stop"})
    )
    outputs = set()
    for size in (1, 7, len(stream)):
        tap = SSETap(ANTHROPIC_EVENTS, edit=MessagesDialect().stray())
        pieces = [stream[at : at + size] for at in range(0, len(stream), size)]
        outputs.add(b"".join(tap.feed(p) for p in pieces) + tap.flush())
    (out,) = outputs
    assert b"inflight_restore" not in out
    lines = out.split(b"\n")
    names = [line[7:] for line in lines if line.startswith(b"event: ")]
    events = [orjson.loads(line[6:]) for line in lines if line.startswith(b"data: ")]
    assert names == [e["type"].encode() for e in events]  # every data line has its event line
    assert b"\n\n\n" not in out
    assert [e.get("index") for e in events if "index" in e] == [0, 0, 0, 1, 1, 1]
    assert events[4]["content_block"]["name"] == "search"
    assert events[-2]["delta"]["stop_reason"] == "tool_use"  # a client call is left
