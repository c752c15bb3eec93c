"""A conversation's next request parsed from its last one (app/proxy/reuse.py, issue 16): every
body is exactly what a full parse gives — for growing conversations, retries, edits, other
conversations sharing the first bytes, bodies that are not orjson's text, and broken rests —
and only the bytes the request adds are parsed."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import inflight.proxy.reuse as reuse
from inflight.errors import BadRequest
from inflight.proxy.body import check_chat_rest, parse_chat_body
from inflight.proxy.reuse import ParsedBodies
from tests.support.conversations import agent_session, conversations

pytestmark = pytest.mark.filterwarnings(
    "ignore:Generating overly large repr:hypothesis.errors.HypothesisWarning"
)


def text(body: dict[str, Any], style: str) -> bytes:
    """A client's bytes for `body`: orjson's (the SDKs'), Python's default json (spaces), or
    ASCII-escaped (`ensure_ascii`)."""
    if style == "orjson":
        return orjson.dumps(body)
    if style == "spaced":
        return json.dumps(body).encode()
    return json.dumps(body, separators=(",", ":"), ensure_ascii=True).encode()


def parse(bodies: ParsedBodies, raw: bytes, owner: bytes = b"a") -> tuple[dict[str, Any], int]:
    """As `ApiService._parse` does it: reused when it can be, else in full; remembered."""
    reused = bodies.parse(raw, owner)
    if reused is None:
        body = parse_chat_body(raw)
    else:
        check_chat_rest(reused)
        body = reused.body
        # the history's text, cut from the bytes: what serialising it gives
        assert reused.history_text(raw) == orjson.dumps(body["messages"])
        assert orjson.dumps(body) == raw  # taken only when the bytes are its canonical text
    bodies.remember(raw, body, owner, reused)
    return body, 0 if reused is None else reused.reused


# 80 large examples take a minute on a quiet 2-core machine: bounded at 300 s, not the default
@pytest.mark.timeout(300)
@given(conversations(), conversations(), st.data())
@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
    ],
)
def test_a_body_parsed_from_a_remembered_one_is_the_full_parse(
    first: list[dict[str, Any]], second: list[dict[str, Any]], data: st.DataObject
) -> None:
    """Two conversations (the second may start as the first does) grow in turn, a message or
    a few at a time, with retries (fewer messages), edits of an earlier message, keys before
    and after the history, and clients that do not send orjson's text. Every body is the full
    parse, and nothing remembered is changed."""
    bodies = ParsedBodies("messages", entries=data.draw(st.sampled_from([1, 2, 64])))
    second = [*first[: data.draw(st.integers(0, len(first)))], *second]
    lengths = [0, 0]
    reused_any = False
    while lengths[0] < len(first) or lengths[1] < len(second):
        which = data.draw(st.integers(0, 1))
        messages = (first, second)[which]
        if lengths[which] >= len(messages):
            continue
        step = data.draw(st.integers(-2, 3))  # a retry without the last few, or more
        lengths[which] = max(1, min(len(messages), lengths[which] + step))
        sent = [dict(m) for m in messages[: lengths[which]]]
        if data.draw(st.integers(0, 5)) == 0:  # an edit of an earlier message
            i = data.draw(st.integers(0, len(sent) - 1))
            sent[i] = {**sent[i], "content": "edited"}
        body: dict[str, Any] = {"model": "m", "messages": sent}
        if data.draw(st.booleans()):
            body = {"messages": sent, "model": "m", "stream": data.draw(st.booleans())}
        if data.draw(st.booleans()):
            body["tools"] = [{"type": "function", "function": {"name": "bash"}}]
        raw = text(body, data.draw(st.sampled_from(["orjson", "orjson", "spaced", "ascii"])))
        got, reused = parse(bodies, raw)
        assert got == orjson.loads(raw)
        assert list(got) == list(orjson.loads(raw))  # the keys in the same order
        reused_any = reused_any or reused > 0
    assert bodies.intact()


def test_a_growing_conversation_parses_only_what_it_adds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each request of a growing session reuses every message of the one before: what is
    parsed is the rest (its new messages and what follows them), never the history."""
    parsed: list[int] = []
    real = reuse.orjson.loads

    def loads(raw: bytes | str) -> Any:
        parsed.append(len(raw))
        return real(raw)

    monkeypatch.setattr(reuse.orjson, "loads", loads)
    bodies = ParsedBodies("messages")
    messages = agent_session(200, words=60)
    for end in range(300, 340):
        raw = orjson.dumps({"model": "m", "messages": messages[:end], "stream": True})
        parsed.clear()
        got, reused = parse(bodies, raw)
        assert got == real(raw)
        if end > 300:
            assert reused == end - 1
            assert parsed
            assert max(parsed) < 3_000 < len(raw) // 10


@pytest.mark.parametrize(
    ("rest", "message"),
    [
        (b',{"role":"user","content":"x"', "not valid JSON"),  # cut short
        (b',{"role":7,"content":"x"}', "messages[2].role must be a string"),
        (b',{"role":"user","content":' + b"[" * 70 + b"]" * 70 + b"}", "nested deeper"),
        (b',{"role":"tool","tool_calls":3}', "tool_calls must be an array of objects"),
    ],
)
def test_a_rest_that_is_wrong_is_refused_as_a_full_parse_refuses_it(
    rest: bytes, message: str
) -> None:
    bodies = ParsedBodies("messages")
    first = [{"role": "system", "content": "s" * 600}, {"role": "user", "content": "hi"}]
    raw = orjson.dumps({"model": "m", "messages": first})
    parse(bodies, raw)
    broken = raw[: -len(b"]}")] + rest + b"]}"
    with pytest.raises(BadRequest) as full:
        parse_chat_body(broken)
    assert message in full.value.message
    with pytest.raises(BadRequest) as reused:
        parse(bodies, broken)
    assert reused.value.message == full.value.message


def test_remembered_bodies_are_bounded() -> None:
    bodies = ParsedBodies("messages", entries=3, max_bytes=10**9)
    for i in range(10):
        raw = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": f"{i}" * 600}]})
        parse(bodies, raw)
    assert len(bodies) == 3
    small = ParsedBodies("messages", entries=100, max_bytes=20_000)
    for i in range(10):
        raw = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": f"{i}" * 2000}]})
        parse(small, raw)
    assert len(small) == 20_000 // (len(raw) * reuse.PARSED_FACTOR)
