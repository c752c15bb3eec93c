"""The Responses adapter (app/apis/responses/format.py): items to the planner's view and
back, and the seven invariants of DESIGN.md §4 in Responses terms, on generated item lists and
on the shipped transcripts converted to items."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson
import pytest
from hypothesis import given

from inflight.apis.responses.format import ResponsesConversation, ResponsesFormat
from inflight.compaction.engine import CompactionResult, compact
from inflight.compaction.inserted import SUMMARY_PREFIX
from inflight.errors import BadRequest
from inflight.strategies import StrategyName
from tests.support import load_traces
from tests.support.conversations import common_prefix, simple_count
from tests.support.responses_items import (
    follows_strict_rule,
    item_kind,
    item_lists,
    pair_problems,
    request_body,
    request_points,
)
from tests.unit.compaction.test_invariants import (
    ONE_REQUEST,
    PIPELINES,
    TURN_BY_TURN,
    WINDOWS,
    budget_for,
    summarized,
)

FORMAT = ResponsesFormat()
TRACES = load_traces()
Runner = Any  # (view messages, pipeline, window) -> CompactionResult


def plain(messages: Sequence[Mapping[str, Any]], pipeline: Any, window: int) -> CompactionResult:
    return compact(messages, pipeline, budget_for(window), simple_count, 0)


def with_summary(messages: Sequence[Mapping[str, Any]], _: Any, window: int) -> CompactionResult:
    return summarized(messages, window)


def forward(
    body: dict[str, Any], pipeline: Any, window: int, runner: Runner = plain
) -> tuple[dict[str, Any], CompactionResult, ResponsesConversation]:
    """What the proxy would forward for `body`: the view compacted, rendered back."""
    conversation = FORMAT.conversation(body)
    assert conversation.skip is None
    result = runner(conversation.messages, pipeline, window)
    if not result.applied:
        return body, result, conversation
    rendered = FORMAT.render(body, conversation, result.messages, result.sources)
    return rendered, result, conversation


def same_item(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """`b` is `a`, or `a` with only what compaction rewrites changed (an output, arguments)."""
    if a is b:
        return True
    rewritable = ("output", "arguments", "input", "action", "operation", "content")
    return {k: v for k, v in a.items() if k not in rewritable} == {
        k: v for k, v in b.items() if k not in rewritable
    }


def head_end(items: Sequence[Mapping[str, Any]]) -> int:
    """How many leading items are pinned: everything up to the last `compaction` item, else
    up to the first user message."""
    compaction = [k for k, i in enumerate(items) if item_kind(i) == "compaction"]
    if compaction:  # and the user message right after it
        after = items[compaction[-1] + 1 : compaction[-1] + 2]
        user = bool(after) and item_kind(after[0]) == "message" and after[0]["role"] == "user"
        return compaction[-1] + 1 + user
    first = next(
        (k for k, i in enumerate(items) if item_kind(i) == "message" and i["role"] == "user"),
        None,
    )
    if first is not None:
        return first + 1
    k = 0
    while k < len(items) and items[k].get("role") in ("system", "developer"):
        k += 1
    return k


def check(body: dict[str, Any], pipeline: Any, window: int, runner: Runner = plain) -> None:
    budget = budget_for(window)
    items = body["input"]
    out_body, result, conversation = forward(body, pipeline, window, runner)
    out = out_body["input"]
    # 1. pair safety, and a reasoning item stays right before what it preceded
    if not pair_problems(items):
        assert pair_problems(out) == []
    where = {id(item): k for k, item in enumerate(items)}
    for k, item in enumerate(out[:-1]):
        if item_kind(item) == "reasoning":
            assert same_item(items[where[id(item)] + 1], out[k + 1])
    check_reasoning_kept_with_its_item(items, origins(out_body, body, result, conversation))
    # 2. pinned head kept (instructions and the head items: the same objects; the summary may
    # be folded into the first user item as an extra part after its own content)
    assert out_body.get("instructions") is body.get("instructions")
    head = head_end(items)
    assert all(a is b for a, b in zip(out[: head - 1], items[: head - 1], strict=True))
    if head and out[head - 1] is not items[head - 1]:
        assert result.plan.summary_role == "fold"
        original = items[head - 1]["content"]
        parts = (
            [{"type": "input_text", "text": original}] if isinstance(original, str) else original
        )
        assert out[head - 1]["content"][:-1] == parts
    last = conversation.groups[-1]
    tail = out[len(out) - (last[-1] - last[0] + 1) :]
    assert all(
        same_item(items[i], o) for i, o in zip(range(last[0], last[-1] + 1), tail, strict=True)
    )
    # 3. no-op is exact
    if result.tokens_before <= budget.trigger:
        assert result.applied == ()
        assert out_body is body
    # 4. monotone and bounded; what is sent is what was counted
    assert result.tokens_after <= result.tokens_before
    if not result.over_budget:
        assert result.tokens_after <= budget.budget
    again = FORMAT.conversation(out_body)
    # (a cut may leave a user item right after a compaction item: the head then takes it in)
    absorbed = conversation.compacted_head and len(again.groups[0]) != len(conversation.groups[0])
    if (result.plan.summary_role != "fold" or "summarize" not in result.applied) and not absorbed:
        assert list(again.messages) == list(result.messages)
        assert sum(map(simple_count, again.messages)) == result.tokens_after
    # untouched items are the client's own objects, so they go out as the client's bytes (as
    # orjson writes them); an item equal to one received is never a copy
    forwarded = orjson.dumps(out_body)
    for item in out:
        if id(item) in where:
            assert orjson.dumps(item) in forwarded
        elif item in items:
            raise AssertionError(f"a copy of an untouched item: {item!r:.200}")
    # 5. idempotent
    second, twice, _ = forward(out_body, pipeline, window, runner)
    assert twice.applied == ()
    assert second["input"] == out
    # 6. role order kept
    if follows_strict_rule(items):
        assert follows_strict_rule(out)


def origins(
    out_body: Mapping[str, Any],
    body: Mapping[str, Any],
    result: CompactionResult,
    conversation: ResponsesConversation,
) -> list[int | None]:
    """For each forwarded item, the index of the received item it is (or rewrites); None for
    one the proxy made (the summary)."""
    if out_body is body:
        return list(range(len(body["input"])))
    found: list[int | None] = []
    items = body["input"]
    for source in result.sources:
        found.extend([None] if source is None else conversation.groups[source])
        folded = source == 0 and result.messages[0] is not conversation.messages[0]
        if folded and item_kind(items[conversation.groups[0][-1]]) == "compaction":
            found.append(None)  # the summary folded after a head's compaction item
    assert len(found) == len(out_body["input"])
    return found


def check_reasoning_kept_with_its_item(
    items: Sequence[Mapping[str, Any]], found: Sequence[int | None]
) -> None:
    """A reasoning item and the item right after it (whatever its type) are forwarded both,
    still adjacent, or neither."""
    for k, o in enumerate(found):
        if o is None:
            continue
        if item_kind(items[o]) == "reasoning" and o + 1 < len(items):
            assert found[k + 1 : k + 2] == [o + 1], f"input[{o}] lost what followed it"
        if o > 0 and item_kind(items[o - 1]) == "reasoning":
            assert found[k - 1 : k] == [o - 1], f"input[{o}] lost its reasoning item"


def check_cache_stability(
    body: dict[str, Any], pipeline: Any, window: int, runner: Runner = plain
) -> None:
    """7. successive requests extend the previous forwarded items except at events; events are
    spaced by (threshold − target) × budget tokens of growth."""
    budget = budget_for(window)
    items = body["input"]
    previous: list[Any] | None = None
    last_event: int | None = None
    for k in request_points(items):
        out_body, result, _ = forward({**body, "input": items[:k]}, pipeline, window, runner)
        out = out_body["input"]
        if previous is not None and common_prefix(previous, out) < len(previous):
            if last_event is not None:
                growth = result.tokens_before - last_event
                assert growth >= (budget.threshold - budget.target) * budget.budget - 1
            last_event = result.tokens_before if result.tokens_after <= budget.goal else None
        previous = out


ALL: dict[str, tuple[tuple[StrategyName, ...], Runner]] = {
    **{name: (pipeline, plain) for name, pipeline in PIPELINES.items()},
    "summarize-with-text": (("truncate", "prune", "summarize"), with_summary),
}


@pytest.mark.parametrize("name", list(ALL))
@ONE_REQUEST
@given(body=item_lists(), window=WINDOWS)
def test_invariants_on_generated_items(name: str, body: dict[str, Any], window: int) -> None:
    pipeline, runner = ALL[name]
    check(body, pipeline, window, runner)


@pytest.mark.parametrize("name", list(ALL))
@TURN_BY_TURN
@given(body=item_lists(), window=WINDOWS)
def test_cache_stability_on_generated_items(name: str, body: dict[str, Any], window: int) -> None:
    pipeline, runner = ALL[name]
    check_cache_stability(body, pipeline, window, runner)


@pytest.mark.parametrize("name", list(ALL))
@pytest.mark.parametrize("window", [8192, 32768])
def test_invariants_on_real_transcripts_as_items(name: str, window: int) -> None:
    pipeline, runner = ALL[name]
    for n, (_, messages) in enumerate(TRACES):
        body = request_body(messages, instructions=n % 2 == 0, typed=n % 3, reasoning=n % 2 == 1)
        items = body["input"]
        for k in [*request_points(items)[::7], len(items)]:
            check({**body, "input": items[:k]}, pipeline, window, runner)
        check_cache_stability(body, pipeline, window, runner)


# -- the adapter's own rules, one example each -----------------------------------------------


def call(call_id: str, name: str = "bash", kind: str = "function_call") -> dict[str, Any]:
    if kind == "custom_tool_call":
        return {"type": kind, "call_id": call_id, "name": name, "input": "x"}
    return {"type": kind, "call_id": call_id, "name": name, "arguments": "{}"}


def output(call_id: str, text: Any = "ok", kind: str = "function_call_output") -> dict[str, Any]:
    return {"type": kind, "call_id": call_id, "output": text}


USER = {"role": "user", "content": "go"}


def groups(items: list[dict[str, Any]]) -> list[tuple[int, ...]]:
    return list(FORMAT.conversation({"model": "m", "input": items}).groups)


def test_parallel_calls_and_their_outputs_are_one_round_matched_by_call_id() -> None:
    items = [USER, call("a"), call("b"), output("b"), output("a"), USER]
    conversation = FORMAT.conversation({"model": "m", "input": items})
    assert conversation.groups == ((0,), (1, 2), (3,), (4,), (5,))
    assistant = conversation.messages[1]
    assert [c["id"] for c in assistant["tool_calls"]] == ["a", "b"]
    assert [m["tool_call_id"] for m in conversation.messages[2:4]] == ["b", "a"]
    assert conversation.skip is None


def test_an_interleaved_round_stays_one_unit_while_a_call_is_unanswered() -> None:
    items = [USER, call("a"), call("b"), output("a"), call("c"), output("b"), output("c")]
    assert groups(items) == [(0,), (1, 2, 4), (3,), (5,), (6,)]
    # answered at once: two rounds
    assert groups([USER, call("a"), output("a"), call("b"), output("b")]) == [
        (0,), (1,), (2,), (3,), (4,),
    ]  # fmt: skip


def test_reused_ids_pair_within_their_round_only() -> None:
    items = [USER, call("a"), output("a"), USER, call("a"), output("a")]
    assert groups(items) == [(0,), (1,), (2,), (3,), (4,), (5,)]
    conversation = FORMAT.conversation({"model": "m", "input": items})
    kinds = [("tool_calls" in m, m["role"]) for m in conversation.messages]
    assert kinds[1] == (True, "assistant")
    assert kinds[4] == (True, "assistant")


def test_a_reasoning_item_goes_with_the_item_it_preceded_whatever_its_type() -> None:
    reasoning = {
        "type": "reasoning",
        "id": "rs",
        "summary": [{"type": "summary_text", "text": "t"}],
    }
    answer = {"role": "assistant", "content": "done"}
    search = {"type": "web_search_call", "id": "ws", "status": "completed",
              "action": {"type": "search", "query": "q"}}  # fmt: skip
    items = [USER, reasoning, call("a"), output("a"), reasoning, answer, reasoning, reasoning,
             search, reasoning, {"type": "item_reference", "id": "msg_1"}, reasoning, USER,
             reasoning]  # fmt: skip
    conversation = FORMAT.conversation({"model": "m", "input": items})
    assert conversation.groups == (
        (0,), (1, 2), (3,), (4, 5), (6, 7, 8), (9, 10), (11, 12), (13,),
    )  # fmt: skip
    assert conversation.messages[1]["reasoning_content"] == "t"
    assert conversation.messages[3] == {
        "role": "assistant",
        "content": "done",
        "reasoning_content": "t",
    }
    assert conversation.messages[4]["role"] == "web_search_call"
    assert conversation.messages[4]["reasoning_content"] == "t\nt"


def test_an_untyped_item_with_an_id_is_an_item_reference() -> None:
    """The SDK's `ItemReference` has an optional `type`: `{"id": ...}` alone is one (it was a
    400, "has neither a type nor a role")."""
    conversation = FORMAT.conversation({"model": "m", "input": [USER, {"id": "msg_1"}, USER]})
    assert conversation.messages[1]["role"] == "item_reference"
    with pytest.raises(BadRequest):
        FORMAT.conversation({"model": "m", "input": [USER, {"id": 7}]})


@pytest.mark.parametrize(
    ("kind", "answer"),
    [
        ("custom_tool_call", {"type": "custom_tool_call_output", "call_id": "a", "output": "o"}),
        ("local_shell_call", {"type": "local_shell_call_output", "id": "a", "output": "o"}),
        (
            "computer_call",
            {
                "type": "computer_call_output",
                "call_id": "a",
                "output": {"type": "computer_screenshot", "image_url": "data:image/png;base64,A"},
            },
        ),
        ("mcp_approval_request", {"type": "mcp_approval_response", "approval_request_id": "a",
                                  "approve": True}),
    ],
)  # fmt: skip
def test_other_call_kinds_pair_with_their_outputs(kind: str, answer: dict[str, Any]) -> None:
    the_call: dict[str, Any] = {"type": kind, "call_id": "a", "name": "n", "action": {"x": 1}}
    if kind == "mcp_approval_request":
        the_call = {"type": kind, "id": "a", "name": "n", "arguments": "{}", "server_label": "s"}
    conversation = FORMAT.conversation({"model": "m", "input": [USER, the_call, answer]})
    assert conversation.groups == ((0,), (1,), (2,))
    assert conversation.skip is None
    assert conversation.messages[2]["tool_call_id"] == "a"


def test_other_items_stand_alone_and_take_no_turn() -> None:
    search = {"type": "web_search_call", "id": "ws", "status": "completed",
              "action": {"type": "search", "query": "q"}}  # fmt: skip
    conversation = FORMAT.conversation({"model": "m", "input": [USER, search, USER]})
    assert conversation.groups == ((0,), (1,), (2,))
    assert conversation.messages[1]["role"] == "web_search_call"


def test_shorthand_and_typed_messages_and_their_parts() -> None:
    typed = {
        "type": "message",
        "role": "user",
        "content": [
            {"type": "input_text", "text": "look"},
            {"type": "input_image", "image_url": "https://x/y.png", "detail": "low"},
        ],
    }
    conversation = FORMAT.conversation(
        {"model": "m", "instructions": "be brief", "tools": [], "input": [typed, USER]}
    )
    assert conversation.messages[0] == {"role": "user", "content": typed["content"]}
    assert conversation.messages[0]["content"] is typed["content"]
    assert conversation.messages[1] == USER
    assert conversation.fixed == {"instructions": "be brief", "tools": []}


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ({"model": "m", "input": "hello"}, "input is a string"),
        ({"model": "m", "input": [USER], "previous_response_id": "r"}, "previous_response_id"),
        ({"model": "m", "input": [USER], "conversation": "conv_1"}, "conversation"),
        ({"model": "m", "input": [USER, output("a")]}, "orphan function_call_output at input[1]"),
        (
            {"model": "m", "input": [USER, call("a"), output("a"), output("a")]},
            "orphan function_call_output at input[3]",
        ),
        (
            {"model": "m", "input": [USER, call("a"), USER, output("a")]},
            "orphan function_call_output at input[3]",
        ),
    ],
)
def test_requests_forwarded_as_received(body: dict[str, Any], reason: str) -> None:
    skip = FORMAT.conversation(body).skip
    assert skip is not None
    assert reason in skip


@pytest.mark.parametrize(
    ("value", "param"),
    [
        (7, "input"),
        ({"role": "user"}, "input"),
        ([USER, "text"], "input[1]"),
        ([USER, {"content": "x"}], "input[1]"),
        ([{"type": 3}], "input[0].type"),
        ([{"type": "message", "content": "x"}], "input[0].role"),
        ([{"role": ["user"], "content": "x"}], "input[0].role"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(value: Any, param: str) -> None:
    with pytest.raises(BadRequest) as caught:
        FORMAT.conversation({"model": "m", "input": value})
    assert caught.value.param == param


def test_rendered_changes_keep_the_responses_shape() -> None:
    """A pruned or truncated output is its item with a new `output`; a summary is a message
    item; a summary folded into the first user item is an `input_text` part after its own."""
    big = "z" * 40_000
    items: list[dict[str, Any]] = [
        USER,
        *[x for k in range(12) for x in (call(f"c{k}"), output(f"c{k}", big))],
        {"role": "user", "content": "and now?"},
    ]
    body = {"model": "m", "input": items}
    out, result, _ = forward(body, ("truncate", "prune", "trim"), 16384)
    assert result.applied
    changed = [i for i in out["input"] if not any(i is j for j in items)]
    assert changed
    for item in changed:
        assert item["type"] == "function_call_output"
        assert set(item) == {"type", "call_id", "output"}
        assert isinstance(item["output"], str)
        assert len(item["output"]) < len(big)
    # an agent session that only calls tools since the first user item: the summary is folded
    rounds = [
        {**call(f"c{k}"), "arguments": orjson.dumps({"patch": "p" * 3000}).decode()}
        for k in range(40)
    ]
    items = [USER, *[x for k, c in enumerate(rounds) for x in (c, output(f"c{k}"))]]
    out, result, _ = forward({"model": "m", "input": items}, (), 16384, with_summary)
    assert "summarize" in result.applied
    assert result.plan.summary_role == "fold"
    folded = out["input"][0]
    assert folded["content"][0] == {"type": "input_text", "text": "go"}
    assert folded["content"][1]["type"] == "input_text"
    assert folded["content"][1]["text"].startswith(SUMMARY_PREFIX)
    # a chat: the summary is an assistant message item before the next user turn
    turns = [
        {"role": "assistant" if k % 2 == 0 else "user", "content": f"{k} " + "t" * 3000}
        for k in range(31)
    ]
    body = {"model": "m", "input": [USER, *turns]}
    out, result, _ = forward(body, (), 16384, with_summary)
    assert "summarize" in result.applied
    summary = out["input"][1]
    assert set(summary) == {"role", "content"}
    assert summary["role"] == "assistant"
    assert summary["content"].startswith(SUMMARY_PREFIX)
    assert out["input"][2]["role"] == "user"


def test_instructions_count_like_a_leading_system_message() -> None:
    """`instructions` are in every prompt: the counter's fixed part counts them (and a system
    prompt stands first, so templates add no default one)."""
    from inflight.tokens.counter import ChatTokenCounter, has_system
    from inflight.tokens.encodings import load_encodings

    counter = ChatTokenCounter(load_encodings())
    text = "You are a careful coding agent. Run the tests before you answer. " * 20
    bare = FORMAT.conversation({"model": "gpt-4.1", "input": [USER]})
    told = FORMAT.conversation({"model": "gpt-4.1", "instructions": text, "input": [USER]})
    extra = counter.count_fixed("gpt-4.1", told.fixed) - counter.count_fixed("gpt-4.1", bare.fixed)
    alone = counter.count_message("gpt-4.1", {"role": "system", "content": text})
    assert extra == alone
    assert has_system({**told.fixed, "messages": list(told.messages)})
    assert not has_system({**bare.fixed, "messages": list(bare.messages)})


def test_the_output_reserve_is_max_output_tokens() -> None:
    from inflight.windows.table import output_reserve

    body = {"model": "gpt-4.1", "input": [USER], "max_output_tokens": 300}
    assert output_reserve(body, 8192) == 300


@pytest.mark.parametrize("call_id", [{"a": 1}, [1, 2], 3.5, None, True])
def test_ids_of_any_json_type_pair_without_error(call_id: Any) -> None:
    """Client data: a `call_id` that is an object or a list is an id like any other."""
    items = [USER, call("x"), output("x"), {**call("x"), "call_id": call_id}]
    items.append({**output("x"), "call_id": call_id})
    conversation = FORMAT.conversation({"model": "m", "input": items})
    assert conversation.skip is None
    assert conversation.groups == ((0,), (1,), (2,), (3,), (4,))
    orphan = FORMAT.conversation({"model": "m", "input": [USER, {**output("x"), "call_id": [1]}]})
    assert orphan.skip is not None
