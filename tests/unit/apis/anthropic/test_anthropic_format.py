"""The Messages adapter (app/compaction/formats/messages*.py): DESIGN.md §4's invariants and
Anthropic's rules (§8) on generated conversations and on the shipped transcripts converted to
Messages form in Claude Code's shape; breakpoints moved, never added; thinking untouched; bad
bodies a 400 naming the field only when compaction must rewrite them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inflight.apis.anthropic.format import MessagesFormat
from inflight.apis.anthropic.rules import problems
from inflight.apis.anthropic.view import MessagesConversation, build_view
from inflight.compaction.engine import CompactionResult, compact
from inflight.compaction.inserted import SUMMARY_PREFIX
from inflight.compaction.policy import Budget
from inflight.errors import BadRequest
from inflight.strategies import StrategyName
from tests.support import load_traces, request_points
from tests.support.anthropic_conversations import anthropic_bodies, blocks, from_chat
from tests.support.conversations import simple_count
from tests.support.fakes.anthropic import all_blocks, rule_violations

FORMAT = MessagesFormat()
PIPELINES: dict[str, tuple[StrategyName, ...]] = {
    "truncate": ("truncate",),
    "prune": ("prune",),
    "trim": ("trim",),
    "middle-out": ("middle-out",),
    "auto": ("truncate", "prune", "trim"),
    "summarize": ("truncate", "prune", "summarize"),
}
WINDOWS = st.sampled_from([2048, 4096, 8192, 16384])
SUMMARY = "the agent read the files and ran the tests"
_SLOW_IS_FINE = [HealthCheck.too_slow, HealthCheck.data_too_large]
ONE_REQUEST = settings(max_examples=60, deadline=None, suppress_health_check=_SLOW_IS_FINE)


def budget_for(window: int) -> Budget:
    return Budget(window=window, reserve=window // 8, threshold=0.8, target=0.5)


def view_count(message: Mapping[str, Any]) -> int:
    """`simple_count`, with one text block costing what its text as a string costs, as the
    real counters count them (a summary goes into the view as a string and comes back from
    Anthropic's form as a text block: JSON length alone made the same prompt 6 tokens dearer
    the second time, past the trigger, and compacted again)."""
    content = message.get("content")
    if isinstance(content, list) and len(content) == 1 and isinstance(content[0], Mapping):
        block = content[0]
        if block.get("type") == "text" and set(block) == {"type", "text"}:
            message = {**message, "content": block["text"]}
    return simple_count(message)


def compacted(
    body: Mapping[str, Any], pipeline: tuple[StrategyName, ...], window: int
) -> tuple[dict[str, Any], CompactionResult, MessagesConversation]:
    """What the proxy forwards for `body`: the body itself when the plan changes nothing."""
    conversation = FORMAT.conversation(body)
    assert isinstance(conversation, MessagesConversation)
    summarizing = "summarize" in pipeline
    result = compact(
        conversation.messages,
        pipeline,
        budget_for(window),
        view_count,
        len(orjson.dumps(conversation.fixed)) // 4,
        summary=SUMMARY if summarizing else None,
        summary_tokens=40 if summarizing else 0,
    )
    if not result.plan.changed:
        return dict(body), result, conversation
    out = FORMAT.render(body, conversation, result.messages, result.sources)
    return out, result, conversation


def breakpoints(body: Mapping[str, Any]) -> int:
    return sum(1 for b in all_blocks(body) if isinstance(b, Mapping) and b.get("cache_control"))


def normalized(view: Sequence[Mapping[str, Any]]) -> list[Any]:
    """View messages with string content as one text part (how a summary renders back)."""
    out = []
    for message in view:
        content = message.get("content")
        if isinstance(content, str) and message.get("role") != "tool":
            message = {**message, "content": [{"type": "text", "text": content}]}
        out.append(message)
    return out


def without_breakpoint(block: Any) -> Any:
    if isinstance(block, Mapping):
        return {k: v for k, v in block.items() if k != "cache_control"}
    return block


def check_head(body: Mapping[str, Any], out: Mapping[str, Any]) -> None:
    """The first user message is kept: the same object, or its blocks unchanged (a moved
    breakpoint aside) with the summary folded in after them."""
    head, shown = body["messages"][0], out["messages"][0]
    if shown is head:
        return
    original, now = blocks(head), blocks(shown)
    assert [without_breakpoint(b) for b in now[: len(original)]] == [
        without_breakpoint(b) for b in original
    ]
    assert all(b["text"].startswith(SUMMARY_PREFIX) for b in now[len(original) :])


def check_thinking(body: Mapping[str, Any], out: Mapping[str, Any]) -> None:
    """Thinking blocks are the client's very objects, in their message, in order, leading their
    turn (after a `compaction` block, which the API puts first); the thinking of the turn the
    last message answers is always there."""
    originals = {
        id(b): b
        for m in body["messages"]
        for b in blocks(m)
        if b.get("type") in ("thinking", "redacted_thinking")
    }
    for message in out["messages"]:
        kinds = [b.get("type") for b in blocks(message) if b.get("type") != "compaction"]
        thoughts = [
            b for b in blocks(message) if b.get("type") in ("thinking", "redacted_thinking")
        ]
        assert all(id(b) in originals for b in thoughts)
        assert kinds[: len(thoughts)] == [b["type"] for b in thoughts]  # thinking leads its turn
    messages = body["messages"]
    if len(messages) >= 2 and any(b.get("type") == "tool_result" for b in blocks(messages[-1])):
        last_turn = [
            b for b in blocks(messages[-2]) if b.get("type") in ("thinking", "redacted_thinking")
        ]
        shown = [b for m in out["messages"] for b in blocks(m)]
        assert all(any(b is s for s in shown) for b in last_turn)


def check_untouched(
    body: Mapping[str, Any],
    out: Mapping[str, Any],
    result: CompactionResult,
    conversation: MessagesConversation,
) -> None:
    """Each kept message is the very object the client sent (byte-identical) unless something
    in it changed; only the summary is new."""
    if out["messages"] is body["messages"] or not result.plan.changed:
        return
    sources = result.sources
    kept = sorted({p[0] for s in sources if s is not None for p in conversation.pieces[s].paths()})
    rendered = [m for m in out["messages"] if not is_summary(m)]
    assert len(rendered) == len(kept)
    for message, index in zip(rendered, kept, strict=True):
        original = body["messages"][index]
        assert message is original or orjson.dumps(message) != orjson.dumps(original)


def is_summary(message: Mapping[str, Any]) -> bool:
    """A message the proxy inserted (the summary standing alone)."""
    content = message.get("content")
    first = content[0] if isinstance(content, list) and content else {}
    return message.get("role") == "assistant" and str(first.get("text", "")).startswith(
        SUMMARY_PREFIX
    )


def turns_only(body: Mapping[str, Any]) -> dict[str, Any]:
    """`body` without its `role: "system"` messages (instructions: they take no turn)."""
    return {**body, "messages": [m for m in body["messages"] if m.get("role") != "system"]}


def check_system_messages(body: Mapping[str, Any], out: Mapping[str, Any]) -> None:
    """`role: "system"` messages inside `messages` are pinned where they stand: every one is in
    the output, the very object sent, in order among the kept messages, never between a call
    and its answers."""
    sent = [m for m in body["messages"] if m.get("role") == "system"]
    shown = [m for m in out["messages"] if m.get("role") == "system"]
    assert len(shown) == len(sent)
    assert all(a is b for a, b in zip(shown, sent, strict=True))
    where = {id(m): i for i, m in enumerate(body["messages"])}
    order = [where[id(m)] for m in out["messages"] if id(m) in where]
    assert order == sorted(order)
    for before, message in zip(out["messages"], out["messages"][1:], strict=False):
        if message.get("role") == "system":
            assert not any(b.get("type") == "tool_use" for b in blocks(before))


def check_all(body: dict[str, Any], pipeline: tuple[StrategyName, ...], window: int) -> None:
    assert rule_violations(turns_only(body)) == []
    budget = budget_for(window)
    out, result, conversation = compacted(body, pipeline, window)
    assert rule_violations(turns_only(out)) == []  # Anthropic's rules, turns alternating
    check_system_messages(body, out)
    assert {k: v for k, v in out.items() if k != "messages"} == {
        k: v for k, v in body.items() if k != "messages"
    }
    assert out.get("system") is body.get("system")  # pinned: system and the first user message
    check_head(body, out)
    last_in, last_out = body["messages"][-1], out["messages"][-1]  # the last unit kept
    assert last_out is last_in or [b.get("type") for b in blocks(last_out)] == [
        b.get("type") for b in blocks(last_in)
    ]
    if result.tokens_before <= budget.trigger:  # no-op is exact
        assert result.applied == ()
        assert all(a is b for a, b in zip(out["messages"], body["messages"], strict=True))
    assert result.tokens_after <= result.tokens_before  # monotone and bounded
    if not result.over_budget:
        assert result.tokens_after <= budget.budget
    rebuilt, _ = build_view(out["messages"])  # the output is the plan's view, in Anthropic form
    assert normalized(rebuilt) == normalized(result.messages)
    check_untouched(body, out, result, conversation)
    check_thinking(body, out)
    assert breakpoints(out) <= breakpoints(body)  # moved, never added
    for message in (last_in,):
        marked = [b for b in blocks(message) if b.get("cache_control")]
        assert all(b.get("cache_control") for b in blocks(last_out)[-1:]) or not marked
    again, repeat, _ = compacted(out, pipeline, window)  # idempotent
    assert repeat.applied == ()
    assert again["messages"] == out["messages"]


@pytest.mark.parametrize("name", list(PIPELINES))
@ONE_REQUEST
@given(body=anthropic_bodies(), window=WINDOWS)
def test_invariants_and_anthropic_rules_on_generated_conversations(
    name: str, body: dict[str, Any], window: int
) -> None:
    check_all(body, PIPELINES[name], window)


def test_a_compacted_request_over_budget_is_not_summarized_again() -> None:
    compaction = {"type": "compaction", "content": None}
    call = {"type": "tool_use", "id": "toolu_a0", "name": "Bash", "input": {"command": "0"}}
    body = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 512,
        "messages": [
            {"role": "user", "content": "0"},
            {"role": "assistant", "content": [compaction, call]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_a0", "content": "x" * 10_000},
            ]},
            {"role": "assistant", "content": [{**call, "id": "toolu_a1"}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_a1", "content": "x"},
            ]},
            {"role": "assistant", "content": [{"type": "text", "text": "0r"}]},
            {"role": "user", "content": [{"type": "text", "text": "q" * 50}]},
        ],
    }  # fmt: skip
    pipeline = PIPELINES["summarize"]
    out, result, _ = compacted(body, pipeline, 2048)
    assert result.over_budget
    assert compacted(out, pipeline, 2048)[1].applied == ()


TRACES = load_traces()


@pytest.mark.parametrize("name", ["auto", "trim", "middle-out", "summarize"])
@pytest.mark.parametrize("window", [8192, 32768])
def test_invariants_and_anthropic_rules_on_real_transcripts(name: str, window: int) -> None:
    for _, chat in TRACES:
        for k in [*request_points(chat)[::9], len(chat)]:
            check_all(from_chat(chat[:k]), PIPELINES[name], window)


def stripped(messages: Sequence[Mapping[str, Any]]) -> list[bytes]:
    """Messages as bytes without their breakpoints (Claude Code moves its breakpoint to the
    newest message every request; what an upstream cache reuses is the content)."""
    return [
        orjson.dumps({**m, "content": [without_breakpoint(b) for b in blocks(m)]}) for m in messages
    ]


def check_cache_stability(
    chat: Sequence[Mapping[str, Any]], pipeline: tuple[StrategyName, ...], window: int
) -> int:
    """7. each forwarded prompt extends the previous one except at compaction events, and
    events are spaced by (threshold − target) × budget of growth; returns the events seen."""
    budget = budget_for(window)
    previous: list[bytes] | None = None
    last_event_before: int | None = None
    events = 0
    for k in request_points(chat):
        out, result, _ = compacted(from_chat(chat[:k]), pipeline, window)
        now = stripped(out["messages"])
        if previous is not None and now[: len(previous)] != previous:
            events += 1
            if last_event_before is not None:
                growth = result.tokens_before - last_event_before
                assert growth >= (budget.threshold - budget.target) * budget.budget - 1
            reached = result.tokens_after <= budget.goal
            last_event_before = result.tokens_before if reached else None
        previous = now
    return events


@pytest.mark.parametrize("name", ["auto", "summarize"])
@pytest.mark.parametrize("window", [8192, 32768])
def test_cache_stability_on_real_transcripts(name: str, window: int) -> None:
    events = sum(check_cache_stability(chat, PIPELINES[name], window) for _, chat in TRACES)
    assert events > 0  # the transcripts do cross the threshold


def test_untouched_request_renders_to_the_same_objects() -> None:
    body = from_chat(TRACES[0][1][:6])
    conversation = FORMAT.conversation(body)
    view = list(conversation.messages)
    out = FORMAT.render(body, conversation, view, list(range(len(view))))
    assert all(a is b for a, b in zip(out["messages"], body["messages"], strict=True))


def _round(k: int, size: int, **marks: Any) -> list[dict[str, Any]]:
    """A tool round; `marks` puts a breakpoint on `use`, `result` or `nested` (a block inside
    the result)."""
    mark = {"cache_control": {"type": "ephemeral"}}
    use = {"type": "tool_use", "id": f"t{k}", "name": "Read", "input": {"path": f"f{k}"}}
    result: dict[str, Any] = {"type": "tool_result", "tool_use_id": f"t{k}"}
    nested = {"type": "text", "text": f"{k} " + "z" * size, **(mark if "nested" in marks else {})}
    result["content"] = [nested]
    return [
        {"role": "assistant", "content": [{**use, **(mark if "use" in marks else {})}]},
        {"role": "user", "content": [{**result, **(mark if "result" in marks else {})}]},
    ]


def _body(*rounds: list[dict[str, Any]], head_mark: bool = False) -> dict[str, Any]:
    head: dict[str, Any] = {"type": "text", "text": "fix the bug"}
    if head_mark:
        head["cache_control"] = {"type": "ephemeral", "ttl": "1h"}
    messages = [{"role": "user", "content": [head]}]
    for r in rounds:
        messages.extend(r)
    return {"model": "claude-sonnet-4-5", "max_tokens": 256, "messages": messages}


def _marked(body: Mapping[str, Any]) -> list[tuple[int, str, Any]]:
    """(message index, block type, cache_control) of every breakpoint, in order."""
    return [
        (i, b.get("type"), b["cache_control"])
        for i, m in enumerate(body["messages"])
        for b in blocks(m)
        if b.get("cache_control")
    ]


def test_a_cut_breakpoint_moves_to_the_last_kept_block_before_it() -> None:
    body = _body(
        _round(0, 3000), _round(1, 3000, result=True), *(_round(k, 3000) for k in range(2, 9))
    )
    out, result, _ = compacted(body, ("trim",), 8192)
    assert result.plan.cut > result.plan.head + 2  # rounds 0 and 1 are gone
    assert _marked(out) == [(0, "text", {"type": "ephemeral"})]  # on the head's text block
    assert rule_violations(out) == []


def test_a_breakpoint_is_never_added_where_one_stands() -> None:
    body = _body(_round(0, 3000, use=True), *(_round(k, 3000) for k in range(1, 9)), head_mark=True)
    out, result, _ = compacted(body, ("trim",), 8192)
    assert result.plan.cut > result.plan.head
    assert _marked(out) == [(0, "text", {"type": "ephemeral", "ttl": "1h"})]  # the head's own


def test_a_summarized_breakpoint_moves_to_the_summary() -> None:
    def exchange(k: int) -> list[dict[str, Any]]:
        question: dict[str, Any] = {"type": "text", "text": f"and {k}?"}
        if k == 1:
            question["cache_control"] = {"type": "ephemeral"}
        return [
            {"role": "assistant", "content": [{"type": "text", "text": "r" * 3000}]},
            {"role": "user", "content": [question]},
        ]

    rounds = [exchange(k) for k in range(9)]
    out, result, _ = compacted(_body(*rounds), ("summarize",), 8192)
    assert result.plan.summarize
    assert result.plan.summary_role == "assistant"
    summary = out["messages"][1]
    assert summary["role"] == "assistant"
    assert summary["content"] == [
        {"type": "text", "text": SUMMARY_PREFIX + SUMMARY, "cache_control": {"type": "ephemeral"}}
    ]
    assert rule_violations(out) == []


def test_a_summary_before_an_assistant_turn_is_folded_into_the_first_user_message() -> None:
    body = _body(*(_round(k, 3000, result=True) if k == 1 else _round(k, 3000) for k in range(9)))
    out, result, _ = compacted(body, ("summarize",), 8192)
    assert result.plan.summary_role == "fold"
    head = out["messages"][0]
    assert head["content"][0] is body["messages"][0]["content"][0]
    assert head["content"][1]["text"] == SUMMARY_PREFIX + SUMMARY
    assert head["content"][1]["cache_control"] == {"type": "ephemeral"}  # moved from round 1
    assert out["messages"][1]["role"] == "assistant"
    assert rule_violations(out) == []


def test_a_pruned_results_nested_breakpoint_moves_to_the_result() -> None:
    rounds = [_round(0, 3000, nested=True), *(_round(k, 2500) for k in range(1, 10))]
    out, result, _ = compacted(_body(*rounds), ("prune",), 8192)
    assert result.applied == ("prune",)
    pruned = out["messages"][2]["content"][0]
    assert isinstance(pruned["content"], str)
    assert pruned["content"].startswith("[inflight pruned")
    assert pruned["cache_control"] == {"type": "ephemeral"}
    assert breakpoints(out) == 1


def test_thinking_stays_with_its_turn_untouched_when_its_unit_is_deeply_truncated() -> None:
    thought = {"type": "thinking", "thinking": "t" * 5000, "signature": "EqQBCkYIBxgCKkA"}
    redacted = {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix"}
    use = {"type": "tool_use", "id": "t9", "name": "Write", "input": {"text": "w" * 40_000}}
    last = [
        {
            "role": "assistant",
            "content": [thought, redacted, {"type": "text", "text": "a" * 30_000}, use],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "t9", "content": "ok"}],
        },
    ]
    body = _body(*(_round(k, 1000) for k in range(3)), last)
    out, result, _ = compacted(body, ("truncate", "trim"), 8192)
    assert result.plan.deep  # the last unit did not fit: its text and answered input were cut
    turn = out["messages"][-2]["content"]
    assert turn[0] is thought
    assert turn[1] is redacted
    assert len(turn[2]["text"]) < 30_000
    assert len(turn[3]["input"]["text"]) < 40_000
    assert rule_violations(out) == []


@pytest.mark.parametrize(
    ("change", "param"),
    [
        (lambda b: b.pop("max_tokens"), "max_tokens"),
        (
            lambda b: b["messages"][2]["content"].append(
                {"type": "tool_use", "id": "x", "name": "n", "input": {}}
            ),
            "messages.2.content.1.type",
        ),
        (
            lambda b: b["messages"][4]["content"].append(
                {"type": "tool_result", "tool_use_id": "nobody", "content": "?"}
            ),
            "messages.4.content.1.tool_use_id",
        ),
        (
            lambda b: b["messages"][0]["content"].append({"type": "thinking"}),
            "messages.0.content.1.type",
        ),
        (
            lambda b: b["messages"].insert(0, {"role": "assistant", "content": "hi"}),
            "messages.0.role",
        ),
        (lambda b: b["messages"][3].update(content=7), "messages.3.content"),
        (lambda b: b["messages"][5]["content"].append("text"), "messages.5.content.1"),
    ],
)
def test_a_bad_body_is_a_400_naming_the_field_only_when_it_must_be_rewritten(
    change: Any, param: str
) -> None:
    body = _body(*(_round(k, 3000) for k in range(9)))
    change(body)
    conversation = FORMAT.conversation(body)  # never raises: forwarded as sent when untouched
    result = compact(conversation.messages, ("trim",), budget_for(1 << 20), simple_count, 0)
    assert not result.plan.changed
    result = compact(conversation.messages, ("trim",), budget_for(8192), simple_count, 0)
    with pytest.raises(BadRequest) as caught:
        FORMAT.render(body, conversation, result.messages, result.sources)
    assert caught.value.param == param


def _exchange(k: int) -> list[dict[str, Any]]:
    return [
        {"role": "assistant", "content": [{"type": "text", "text": f"{k} " + "r" * 3000}]},
        {"role": "user", "content": f"and {k}?"},
    ]


@pytest.mark.parametrize("pipeline", [("trim",), ("middle-out",), ("summarize",)])
def test_system_messages_inside_messages_are_pinned_and_compacted_around(
    pipeline: tuple[StrategyName, ...],
) -> None:
    """Claude Code 2.1 sends a non-Claude model `role: "system"` messages inside `messages`
    (its agent-types listing at index 1, reminders later): the request was forwarded as
    received, never compacted; now it is compacted around them, turns still alternating."""
    listing = {"role": "system", "content": "Available agent types: " + "a" * 500}
    reminder = {"role": "system", "content": [{"type": "text", "text": "answer in French"}]}
    rounds = [_round(k, 3000) if k % 2 else _exchange(k) for k in range(12)]
    body = _body(*rounds)
    body["messages"][1:1] = [listing]
    body["messages"][8:8] = [reminder]  # after a user turn, before an assistant turn
    assert body["messages"][7]["role"] == "user"
    out, result, _ = compacted(body, pipeline, 8192)
    assert FORMAT.conversation(body).skip is None
    assert result.plan.changed
    assert len(out["messages"]) < len(body["messages"])
    assert out["messages"][0] is body["messages"][0]
    assert [m for m in out["messages"] if m["role"] == "system"] == [listing, reminder]
    check_all(body, pipeline, 8192)


def test_a_system_message_between_a_call_and_its_answers_is_a_400_when_rewritten() -> None:
    body = _body(*(_round(k, 3000) for k in range(9)))
    body["messages"].insert(2, {"role": "system", "content": "between"})
    conversation = FORMAT.conversation(body)
    result = compact(conversation.messages, ("trim",), budget_for(8192), simple_count, 0)
    with pytest.raises(BadRequest) as caught:
        FORMAT.render(body, conversation, result.messages, result.sources)
    assert caught.value.param == "messages.1.content.0"


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "type",
                    "role",
                    "content",
                    "text",
                    "id",
                    "tool_use_id",
                    "input",
                    "cache_control",
                    "x",
                ]
            ),
            inner,
            max_size=5,
        )
    ),
    max_leaves=30,
)
BLOCK_TYPES = st.sampled_from(
    ["text", "tool_use", "tool_result", "thinking", "image", "document", "zzz"]
)


@st.composite
def hostile_bodies(draw: st.DrawFn) -> dict[str, Any]:
    """Bodies of every shape, many almost valid."""
    block = st.fixed_dictionaries(
        {"type": BLOCK_TYPES},
        optional={
            "text": JSON,
            "id": JSON,
            "tool_use_id": JSON,
            "content": JSON,
            "input": JSON,
            "cache_control": JSON,
        },
    )
    message = st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "assistant", "tool", 3])},
        optional={
            "content": st.one_of(
                st.text(max_size=30), st.lists(st.one_of(block, JSON), max_size=4), JSON
            )
        },
    )
    body: dict[str, Any] = draw(
        st.dictionaries(st.sampled_from(["system", "tools", "max_tokens"]), JSON, max_size=3)
    )
    body["messages"] = draw(st.one_of(st.lists(st.one_of(message, JSON), max_size=8), JSON))
    return body


@settings(max_examples=300, deadline=None, suppress_health_check=_SLOW_IS_FINE)
@given(body=hostile_bodies(), window=st.sampled_from([64, 256, 4096]))
def test_any_body_has_a_view_and_renders_or_is_a_400(body: dict[str, Any], window: int) -> None:
    conversation = FORMAT.conversation(body)
    for name in ("auto", "middle-out"):
        result = compact(
            conversation.messages, PIPELINES[name], budget_for(window), simple_count, 0
        )
        if problems(body):  # a body Anthropic rejects cannot be rewritten: a 400 naming it
            with pytest.raises(BadRequest) as caught:
                FORMAT.render(body, conversation, result.messages, result.sources)
            assert caught.value.param == problems(body)[0].param
            continue
        out = FORMAT.render(body, conversation, result.messages, result.sources)
        assert rule_violations(out) == [] or rule_violations(body)
