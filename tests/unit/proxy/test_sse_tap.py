"""The SSE tap: usage and [DONE] read across arbitrary chunk boundaries; usage chunk cut."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inflight.apis.anthropic.events import EVENTS as ANTHROPIC_EVENTS
from inflight.apis.chat.events import EVENTS as CHAT_EVENTS
from inflight.apis.responses.events import EVENTS as RESPONSES_EVENTS
from inflight.proxy.sse_tap import EventReader, SSETap

CONTENT = b'data: {"id":"1","choices":[{"index":0,"delta":{"content":"hi"}}],"usage":null}\n\n'
USAGE = (
    b'data: {"id":"1","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":3,'
    b'"prompt_tokens_details":{"cached_tokens":4}}}\n\n'
)
DONE = b"data: [DONE]\n\n"
STREAM = CONTENT + CONTENT + USAGE + DONE


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces, last = [], 0
    for p in points:
        pieces.append(data[last:p])
        last = p
    pieces.append(data[last:])
    return [p for p in pieces if p]


def _run(tap: SSETap, pieces: list[bytes]) -> bytes:
    out = b"".join(tap.feed(p) for p in pieces)
    return out + tap.flush()


@settings(max_examples=300)
@given(st.lists(st.integers(min_value=0, max_value=10_000), max_size=12))
def test_observing_tap_is_byte_exact_and_reads_usage(cuts: list[int]) -> None:
    tap = SSETap(CHAT_EVENTS, strip_usage_chunk=False)
    assert _run(tap, _split(STREAM, cuts)) == STREAM
    assert tap.usage is not None
    assert (tap.usage.prompt_tokens, tap.usage.completion_tokens, tap.usage.cached_tokens) == (
        12,
        3,
        4,
    )
    assert tap.done


@settings(max_examples=300)
@given(st.lists(st.integers(min_value=0, max_value=10_000), max_size=12))
def test_stripping_tap_cuts_only_the_usage_chunk(cuts: list[int]) -> None:
    tap = SSETap(CHAT_EVENTS, strip_usage_chunk=True)
    assert _run(tap, _split(STREAM, cuts)) == CONTENT + CONTENT + DONE
    assert tap.usage is not None
    assert tap.usage.prompt_tokens == 12
    assert tap.done


def test_crlf_lines_and_usage_inside_a_content_chunk_are_kept() -> None:
    final = b'data: {"choices":[{"index":0,"delta":{}}],"usage":{"prompt_tokens":5}}\r\n\r\n'
    tap = SSETap(CHAT_EVENTS, strip_usage_chunk=True)
    assert _run(tap, [final, DONE]) == final + DONE
    assert tap.usage is not None
    assert tap.usage.prompt_tokens == 5


def test_stripping_tap_holds_at_most_one_partial_line() -> None:
    tap = SSETap(CHAT_EVENTS, strip_usage_chunk=True)
    assert tap.feed(CONTENT[:10]) == b""
    assert tap.feed(CONTENT[10:]) == CONTENT
    assert tap._partial == b""


def test_error_event_is_seen() -> None:
    tap = SSETap(CHAT_EVENTS)
    tap.feed(b'data: {"error": {"message": "overloaded"}}\n\n')
    assert tap.error == {"message": "overloaded"}
    assert not tap.done


RESPONSES_END = (
    b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta"}\n\n'
    b'event: response.completed\ndata: {"type":"response.completed","response":{}}\n\n'
)
ANTHROPIC_END = (
    b'event: message_delta\ndata: {"type":"message_delta","usage":{"output_tokens":3}}\n\n'
    b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
)


@settings(max_examples=200)
@given(
    st.sampled_from(
        [
            (STREAM, CHAT_EVENTS),
            (RESPONSES_END, RESPONSES_EVENTS),
            (ANTHROPIC_END, ANTHROPIC_EVENTS),
        ]
    ),
    st.integers(min_value=0, max_value=10_000),
    st.booleans(),
)
def test_done_once_the_final_event_has_been_read_and_not_before(
    case: tuple[bytes, EventReader], cut: int, strip: bool
) -> None:
    """`done` says the answer is complete: set by the final event's data line, never earlier."""
    stream, reader = case
    last_data = stream.rindex(b"data:")
    end_of_final = stream.index(b"\n", last_data) + 1
    cut %= len(stream) + 1
    tap = SSETap(reader, strip_usage_chunk=strip)
    tap.feed(stream[:cut])
    assert tap.done is (cut >= end_of_final)
    tap.feed(stream[cut:])
    assert tap.done


@pytest.mark.parametrize("reader", [CHAT_EVENTS, RESPONSES_EVENTS, ANTHROPIC_EVENTS])
def test_a_final_event_name_inside_content_is_not_the_end(reader: EventReader) -> None:
    tap = SSETap(reader)
    tap.feed(b'data: {"choices":[{"delta":{"content":"event: message_stop"}}]}\n\n')
    tap.feed(b'event: response.output_text.delta\ndata: {"text":"[DONE]"}\n\n')
    assert not tap.done
