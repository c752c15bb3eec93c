"""The request depth limit, checked at C speed on the parsed value (orjson's indented text):
exactly the walk over the parsed value, whatever the strings hold (brackets, quotes,
backslashes, newlines followed by spaces) and however the client spaced its JSON."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inflight.errors import BadRequest
from inflight.proxy.body import MAX_JSON_DEPTH, deeper_than, parse_chat_body


def reference_depth(value: Any) -> int:
    """The depth as the parsed-value walk counted it: top level 1, each value inside a
    container one level below it."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, level = stack.pop()
        deepest = max(deepest, level)
        if isinstance(item, dict):
            stack.extend((v, level + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, level + 1) for v in item)
    return deepest


TRICKY = st.text(alphabet=st.sampled_from('[]{}"\\/,:ab \n\t\u00e9\u2028'), max_size=12)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | TRICKY
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TRICKY, inner, max_size=4),
    max_leaves=30,
)


def encodings(value: Any) -> list[bytes]:
    """The same value as different clients write it."""
    return [
        orjson.dumps(value),
        json.dumps(value).encode(),
        json.dumps(value, indent=2, ensure_ascii=False).encode(),
        json.dumps(value, separators=(",", ":"), ensure_ascii=True).encode(),
    ]


@settings(max_examples=400, deadline=None)
@given(VALUES, st.integers(min_value=1, max_value=9))
def test_the_check_agrees_with_the_walk(value: Any, limit: int) -> None:
    expected = reference_depth(value) > limit
    assert deeper_than(value, limit) is expected
    for raw in encodings(value):  # as parsed from what a client sends, however spaced
        assert deeper_than(orjson.loads(raw), limit) is expected, raw


@pytest.mark.parametrize("limit", [1, 2, 8, MAX_JSON_DEPTH])
def test_newlines_and_spaces_inside_strings_do_not_count(limit: int) -> None:
    text = "\n" + " " * (2 * limit + 10) + "x\r\n\t" + " " * 300
    value = {"a": text, "b": [text, {text: text}]}
    assert reference_depth(value) == 4
    assert deeper_than(value, limit) is (limit < 4)


def test_past_orjsons_own_recursion_limit_is_too_deep() -> None:
    value: Any = 1
    for _ in range(600):
        value = [value]
    assert deeper_than(value, MAX_JSON_DEPTH)


def chain(depth: int, leaf: Any) -> Any:
    """`leaf` inside `depth - 1` alternating containers, as the `x` of a chat body."""
    value = leaf
    for i in range(depth - 1):
        value = [value] if i % 2 else {"k": value}
    return value


@pytest.mark.parametrize("leaf", [1, [], {}, "[[[{{{", '\\"]]'])
def test_the_documented_limit_is_64_levels(leaf: Any) -> None:
    """The body is level 1, its fields level 2: a value at level 64 passes, one below fails."""
    value = chain(MAX_JSON_DEPTH - 1, leaf)
    ok = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "x": value}
    assert reference_depth(ok) == MAX_JSON_DEPTH
    assert parse_chat_body(orjson.dumps(ok))["x"] == value
    deeper = {**ok, "x": [value]}
    with pytest.raises(BadRequest, match="nested deeper than 64 levels"):
        parse_chat_body(orjson.dumps(deeper))


def test_brackets_and_escaped_quotes_in_strings_do_not_count() -> None:
    text = '\\"' + "[{" * 500 + '\\\\"' + "]}" * 3
    body = {"model": "m", "messages": [{"role": "user", "content": text}]}
    raw = orjson.dumps(body)
    assert raw.count(b"[") > 500
    assert parse_chat_body(raw)["messages"][0]["content"] == text
