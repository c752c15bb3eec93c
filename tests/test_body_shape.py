"""The message-shape check of a chat body (app/http/body.py): the fast path built from type
sets answers exactly as the per-message walk it short-cuts — the same 400 naming the same
first bad message, or the body — on generated message lists, well-formed and not."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.errors import BadRequest
from app.http.body import parse_chat_body

VALUES = st.one_of(st.none(), st.integers(-99, 99), st.text(max_size=5), st.just([]), st.just({}))
CONTENT = st.one_of(st.none(), st.text(max_size=5), st.just([{"type": "text", "text": "x"}]))
CALLS = st.one_of(
    st.none(),
    st.just([]),
    st.lists(st.just({"id": "c", "type": "function"}), min_size=1, max_size=2),
    st.lists(st.one_of(st.just({"id": "c"}), VALUES), min_size=1, max_size=2),
    VALUES,
)


@st.composite
def message(draw: st.DrawFn) -> Any:
    if draw(st.integers(0, 12)) == 0:
        return draw(VALUES)  # not an object at all
    out: dict[str, Any] = {}
    if draw(st.integers(0, 12)):
        out["role"] = (
            draw(st.sampled_from(["user", "assistant", "tool"]))
            if draw(st.integers(0, 8))
            else draw(VALUES)
        )
    if draw(st.booleans()):
        out["content"] = draw(CONTENT) if draw(st.integers(0, 8)) else draw(VALUES)
    if draw(st.booleans()):
        out["tool_calls"] = draw(CALLS)
    return out


def walk(messages: list[Any]) -> tuple[str, str] | None:
    """The oracle: the per-message walk, as it was before the fast path."""
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            return f"messages[{i}] must be an object", f"messages[{i}]"
        if not isinstance(m.get("role"), str):
            return f"messages[{i}].role must be a string", f"messages[{i}].role"
        content = m.get("content")
        if content is not None and not isinstance(content, (str, list)):
            return (
                f"messages[{i}].content must be a string, an array of parts, or null",
                f"messages[{i}].content",
            )
        calls = m.get("tool_calls")
        if calls is not None and not (
            isinstance(calls, list) and all(isinstance(c, dict) for c in calls)
        ):
            return (
                f"messages[{i}].tool_calls must be an array of objects",
                f"messages[{i}].tool_calls",
            )
    return None


@given(st.lists(message(), min_size=1, max_size=12))
@settings(max_examples=400, deadline=None)
def test_the_fast_check_answers_as_the_walk(messages: list[Any]) -> None:
    raw = orjson.dumps({"model": "m", "messages": messages})
    expected = walk(messages)
    if expected is None:
        assert parse_chat_body(raw)["messages"] == messages
        return
    with pytest.raises(BadRequest) as caught:
        parse_chat_body(raw)
    assert (str(caught.value), caught.value.param) == expected
