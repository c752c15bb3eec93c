"""`prune`: placeholders name the tool each output answers, matched by id within the unit."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inflight.compaction.prune import (
    PLACEHOLDER,
    answered_calls,
    is_placeholder,
    prune_unit,
    tool_names,
)
from inflight.compaction.refs import ref_for, ref_suffix


def unit(calls: list[tuple[Any, str]], answers: list[Any]) -> list[dict[str, Any]]:
    first: dict[str, Any] = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": cid, "type": "function", "function": {"name": name, "arguments": "{}"}}
            for cid, name in calls
        ],
    }
    tools = [
        {"role": "tool", "tool_call_id": a, "content": f"output of {a} " * 50} for a in answers
    ]
    return [first, *tools]


def test_outputs_answered_out_of_order_are_named_by_their_call() -> None:
    messages = unit([("call_a", "search"), ("call_b", "delete_file")], ["call_b", "call_a"])
    assert tool_names(messages) == ["delete_file", "search"]
    pruned = prune_unit(messages)
    assert pruned[1]["content"].startswith("[inflight pruned an old output of delete_file:")
    assert pruned[2]["content"].startswith("[inflight pruned an old output of search:")
    assert [m["tool_call_id"] for m in pruned[1:]] == ["call_b", "call_a"]


def test_missing_or_repeated_ids_fall_back_to_position() -> None:
    calls = [("call_1", "search"), ("call_1", "delete_file")]  # transcripts reuse ids
    assert tool_names(unit(calls, ["call_1", "call_1"])) == ["search", "delete_file"]
    calls = [(None, "search"), (None, "delete_file")]
    assert tool_names(unit(calls, [None, None])) == ["search", "delete_file"]
    calls = [("a", "search"), ("b", "delete_file")]
    assert tool_names(unit(calls, ["b", "b"])) == ["search", "delete_file"]  # one id answered twice
    assert tool_names(unit(calls, ["x", "a"])) == ["search", "delete_file"]  # an unknown id
    assert answered_calls(unit([("a", "search")], ["a", "a"])) == [0, None]  # more answers


@pytest.mark.parametrize("named", [{"id": "a"}, ["a"], [], {}, 7, True])
def test_an_answer_id_that_is_not_a_string_names_no_call(named: Any) -> None:
    """A `tool_call_id` of another JSON type is client data: it pairs by position, never a
    TypeError (an object or a list was looked up in a dict: a 500 from the ledger's cuts)."""
    calls = [("a", "search"), ("b", "delete_file")]
    assert answered_calls(unit(calls, [named, "a"])) == [0, 1]
    assert tool_names(unit(calls, ["b", named])) == ["search", "delete_file"]
    assert is_placeholder(prune_unit(unit(calls, [named, named]))[1]["content"])


def test_a_placeholder_lookalike_in_content_is_still_pruned() -> None:
    messages = unit([("a", "fetch")], ["a"])
    messages[1]["content"] = "[inflight pruned an old output of x: 3 chars] and then " + "y" * 5000
    assert not is_placeholder(messages[1]["content"])
    pruned = prune_unit(messages)
    assert is_placeholder(pruned[1]["content"])
    assert prune_unit(pruned)[1] is pruned[1]  # the proxy's own placeholder is never redone


@settings(max_examples=200, deadline=None)
@given(
    order=st.permutations(range(4)),
    names=st.lists(
        st.sampled_from(["search", "read", "bash", "delete_file"]), min_size=4, max_size=4
    ),
)
def test_placeholders_follow_ids_in_any_answer_order(order: list[int], names: list[str]) -> None:
    calls = [(f"call_{k}", names[k]) for k in range(4)]
    messages = unit(calls, [f"call_{k}" for k in order])
    for position, (message, k) in enumerate(zip(prune_unit(messages)[1:], order, strict=True), 1):
        output = f"output of call_{k} " * 50
        ref = ref_suffix(ref_for(position, output))
        assert message["content"] == PLACEHOLDER.format(name=names[k], size=len(output), ref=ref)
