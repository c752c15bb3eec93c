"""Strict role order (DESIGN.md §4.6) in tool-using chats, decided per prefix (§4.7), kept by
every strategy including a summary's placement; later system messages are pinned (§3).

Regression tests for issue 12, defects 3, 4, 5 and 7, with the examples of the issue."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inflight.compaction.engine import CompactionResult, compact
from inflight.compaction.inserted import SUMMARY_PREFIX
from inflight.compaction.planner import plan
from inflight.compaction.policy import Budget
from inflight.compaction.rendering import render_span
from inflight.compaction.unit_costs import MessageCounter
from inflight.compaction.units import is_strict_alternation
from inflight.strategies import StrategyName
from inflight.tokens.counter import ChatTokenCounter
from inflight.tokens.encodings import load_encodings
from inflight.windows.table import output_reserve
from tests.support import load_traces, request_points
from tests.support.conversations import (
    conversations,
    follows_strict_rule,
    simple_count,
    strict_agent_conversation,
    summary_text,
)

SUMMARY = "the user asked about the weather; the tools answered"
PIPELINES: dict[str, tuple[StrategyName, ...]] = {
    "trim": ("trim",),
    "middle-out": ("middle-out",),
    "auto": ("truncate", "prune", "trim"),
}


def budget(window: int) -> Budget:
    """The budget the proxy uses for `window` when the request names no max_tokens."""
    return Budget(window, output_reserve({}, window), 0.8, 0.5)


def call(name: str, call_id: str = "call_1") -> dict[str, Any]:
    fn = {"name": name, "arguments": "{}"}
    return {"role": "assistant", "content": None, "tool_calls": [{"id": call_id, "function": fn}]}


def tool(content: str, call_id: str = "call_1") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def say(role: str, content: str) -> dict[str, Any]:
    return {"role": role, "content": content}


@pytest.fixture(scope="module")
def count() -> MessageCounter:
    """o200k counts, as the proxy makes them for `gpt-4o` (the issue's examples used them)."""
    counter = ChatTokenCounter(load_encodings())
    return lambda message: counter.count_message("gpt-4o", message)


def run(
    count: MessageCounter,
    messages: Sequence[Mapping[str, Any]],
    pipeline: tuple[StrategyName, ...],
    window: int,
    summary: str | None = None,
) -> CompactionResult:
    """`compact` as the compaction service runs it (the summary's size reserved when given)."""
    reserved = 128 if summary is not None else 0
    return compact(
        messages, pipeline, budget(window), count, 3,
        summary=summary, summary_tokens=reserved,
    )  # fmt: skip


def roles(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    return [str(m["role"]) + ("(calls)" if m.get("tool_calls") else "") for m in messages]


WEATHER = [
    say("system", "You are a weather bot."),
    say("user", "weather in Paris?"),
    call("get_weather"),
    tool("18C, sunny"),
    say("assistant", "It is 18C and sunny. " + "word " * 400),
    say("user", "Thanks. And tomorrow?"),
]


def test_the_rule_ignores_tool_messages_and_calls() -> None:
    assert is_strict_alternation(WEATHER)
    assert is_strict_alternation([*WEATHER[:4], call("read"), tool("x")])
    assert not is_strict_alternation([*WEATHER[:2], say("user", "again")])
    assert not is_strict_alternation([*WEATHER[:3], tool("x"), say("user", "then?")])
    assert not is_strict_alternation([say("system", "a"), say("system", "b"), say("user", "c")])
    assert not is_strict_alternation([say("system", "a"), say("assistant", "b")])


@pytest.mark.parametrize("name", list(PIPELINES))
def test_tool_calls_do_not_break_strict_order(count: MessageCounter, name: str) -> None:
    """Defect 3: trim, middle-out and auto turned this into `S, U, U` at a 1,024 window."""
    result = run(count, WEATHER, PIPELINES[name], 1024)
    assert follows_strict_rule(result.messages), roles(result.messages)
    assert result.messages[:2] == WEATHER[:2]
    assert result.messages[-1] == WEATHER[-1]


AGENT = [
    say("system", "You are a coding agent."),
    say("user", "Make the tests pass."),
    call("read_file"),
    tool("line " * 400),
    call("run_tests", "call_2"),
    tool("2 passed", "call_2"),
]


def test_summary_in_an_agent_session_is_folded_into_the_task(count: MessageCounter) -> None:
    """Defect 3: the summary went in as a `user` message after the pinned user message
    (`S U U(summary) A T`). Here the next turn in strict order is the agent's answer (an
    assistant message), so neither role fits: the summary joins the task as a text part."""
    result = run(count, AGENT, ("summarize",), 1024, summary=SUMMARY)
    out = result.messages
    assert "summarize" in result.applied
    assert follows_strict_rule(out), roles(out)
    assert roles(out) == ["system", "user", "assistant(calls)", "tool"]
    folded = out[1]
    assert folded["content"][0] == {"type": "text", "text": AGENT[1]["content"]}
    assert summary_text(folded) == SUMMARY_PREFIX + SUMMARY
    assert {k: v for k, v in folded.items() if k != "content"} == {"role": "user"}
    assert result.tokens_after == sum(count(m) for m in out) + 3
    # The agent answers in plain text next: still strict, and the prompt only grew.
    final = say("assistant", "All tests pass.")
    later = run(count, [*AGENT, final, say("user", "Thanks!")], ("summarize",), 1024, SUMMARY)
    assert later.messages[: len(out)] == out
    assert follows_strict_rule(later.messages), roles(later.messages)


def test_summary_before_a_user_turn_is_an_assistant_message(count: MessageCounter) -> None:
    messages = [
        say("system", "You are a coding agent."),
        say("user", "Why do the tests fail?"),
        call("read_file"),
        tool("line " * 400),
        say("assistant", "The parser drops the last token. " + "word " * 300),
        say("user", "Fix it. " + "word " * 150),
        call("edit_file"),
        tool("ok"),
    ]
    result = run(count, messages, ("summarize",), 2048, summary=SUMMARY)
    out = result.messages
    assert roles(out) == ["system", "user", "assistant", "user", "assistant(calls)", "tool"]
    assert out[:2] == messages[:2]
    assert summary_text(out[2]) == SUMMARY_PREFIX + SUMMARY


def test_summary_does_not_fold_when_a_cut_before_a_user_turn_exists(
    count: MessageCounter,
) -> None:
    """A summary could fold in front of a kept assistant answer, but the cut goes on to the
    next user turn instead: the head stays as it was (its place in the prompt cache too)."""
    messages = [
        say("system", "You are a coding agent."),
        say("user", "Why do the tests fail?"),
        call("read_file"),
        tool("line " * 1200),
        say("assistant", "The parser drops the last token."),
        say("user", "Fix it."),
    ]
    result = run(count, messages, ("summarize",), 2048, summary=SUMMARY)
    out = result.messages
    assert "summarize" in result.applied
    assert roles(out) == ["system", "user", "assistant", "user"]
    assert out[:2] == messages[:2]
    assert summary_text(out[2]) == SUMMARY_PREFIX + SUMMARY
    assert result.tokens_after == sum(count(m) for m in out) + 3
    again = run(count, out, ("summarize",), 2048, summary=SUMMARY)
    assert again.applied == ()


def test_strict_order_is_decided_per_prefix(count: MessageCounter) -> None:
    """Defect 4: appending a tool call made an old user message reappear (`S U A U` became
    `S U U …`): the strict decision was made over the whole conversation."""
    history = [
        say("system", "Be brief."),
        say("user", "Q0"),
        say("assistant", "word " * 200),
        say("user", "word " * 150),
        say("assistant", "word " * 100),
        say("user", "word " * 50),
        say("assistant", "word " * 200),
        say("user", "word " * 150),
    ]
    later = [call("get_time"), tool("12:00"), say("assistant", "It is noon."), say("user", "ok")]
    before = run(count, history, ("trim",), 2048)
    after = run(count, [*history, *later], ("trim",), 2048)
    assert roles(before.messages) == ["system", "user", "assistant", "user"]
    assert after.messages[: len(before.messages)] == before.messages
    assert follows_strict_rule(after.messages), roles(after.messages)
    # A later message that breaks the rule does not change the plan for the history either.
    broken = run(count, [*history, *later, say("user", "hello?")], ("trim",), 2048)
    assert broken.messages[: len(before.messages)] == before.messages


def test_middle_out_then_summarize_places_the_summary_by_what_is_kept(
    count: MessageCounter,
) -> None:
    """Defect 5: the summary's role came from the unit at the cut even when middle-out had
    dropped it (`S U A(summary) A U`)."""
    words = [20, 300, 300, 300, 20, 20, 20, 300]
    messages = [say("system", "s"), say("user", "Q0")]
    messages += [
        say("assistant" if k % 2 == 0 else "user", "word " * n) for k, n in enumerate(words)
    ]
    result = run(count, messages, ("middle-out", "summarize"), 2048, summary=SUMMARY)
    assert follows_strict_rule(result.messages), roles(result.messages)
    assert any(summary_text(m) for m in result.messages)


FRENCH = say("system", "From now on, answer only in French.")
LYON = [
    say("system", "You are a travel guide."),
    say("user", "Hi"),
    say("assistant", "Hello! " + "word " * 40),
    FRENCH,
    say("user", "word " * 300),
    say("assistant", "word " * 100),
    say("user", "And Lyon?"),
]


@pytest.mark.parametrize("name", [*PIPELINES, "summarize"])
def test_later_system_messages_are_kept_where_they_stand(count: MessageCounter, name: str) -> None:
    """Defect 7: only leading system messages were pinned; the French instruction was lost."""
    pipeline = PIPELINES.get(name, ("summarize",))
    result = run(count, LYON, pipeline, 1024, summary=SUMMARY if name == "summarize" else None)
    assert result.applied
    out = result.messages
    assert any(m is FRENCH for m in out)
    assert out[0] == LYON[0]
    assert out[1] == LYON[1] or out[1]["content"][0] == {"type": "text", "text": "Hi"}
    assert out[-1] == LYON[-1]
    kept = [m for m in out if m in LYON]
    assert kept == [m for m in LYON if m in kept]  # in their original order


def test_a_later_system_message_is_never_handed_to_the_summariser(count: MessageCounter) -> None:
    the_plan = plan(LYON, ("summarize",), budget(1024), count, 3, 128)
    assert the_plan.summarize
    assert the_plan.cut > 3
    span = render_span(LYON, the_plan, the_plan.head, the_plan.cut)
    assert FRENCH not in span
    assert span
    assert all(m["role"] != "system" for m in span)


# Invariant 6 as a property: generated tool-calling chats in strict order, and the shipped
# transcripts, at every request of the conversation, through every strategy that can cut.
ROLE_PIPELINES: dict[str, tuple[StrategyName, ...]] = {
    **PIPELINES,
    "summarize": ("truncate", "prune", "summarize"),
    "middle-out,summarize": ("middle-out", "summarize"),
    "trim,middle-out": ("trim", "middle-out"),
}
SMALL_WINDOWS = st.sampled_from([1024, 2048, 4096])
TRACES = load_traces()


def compacted(
    messages: Sequence[Mapping[str, Any]], pipeline: tuple[StrategyName, ...], window: int
) -> list[Mapping[str, Any]]:
    """The forwarded messages, with a summary in place when the pipeline summarises."""
    summary = "what happened so far" if "summarize" in pipeline else None
    reserved = 128 if summary is not None else 0
    result = compact(
        messages, pipeline, budget(window), simple_count, 0,
        summary=summary, summary_tokens=reserved,
    )  # fmt: skip
    return result.messages


def check_role_order(
    messages: Sequence[Mapping[str, Any]], pipeline: tuple[StrategyName, ...], window: int
) -> None:
    """At every request point of a strict chat, the forwarded messages are strict too."""
    assert follows_strict_rule(messages)
    for k in request_points(messages):
        out = compacted(messages[:k], pipeline, window)
        assert follows_strict_rule(out), (k, roles(out))


@pytest.mark.parametrize("name", list(ROLE_PIPELINES))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages=strict_agent_conversation(), window=SMALL_WINDOWS)
def test_role_order_on_generated_tool_calling_chats(
    name: str, messages: list[dict[str, Any]], window: int
) -> None:
    check_role_order(messages, ROLE_PIPELINES[name], window)


@pytest.mark.parametrize("name", list(ROLE_PIPELINES))
def test_role_order_on_the_shipped_transcripts(name: str) -> None:
    strict = [(trace, messages) for trace, messages in TRACES if follows_strict_rule(messages)]
    assert len(strict) >= 4  # the agent transcripts alternate once tool calls are ignored
    for _, messages in strict:
        check_role_order(messages, ROLE_PIPELINES[name], 4096)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages=conversations(), window=SMALL_WINDOWS, tail=st.sampled_from(["user", "assistant"]))
def test_the_plan_of_a_prefix_ignores_later_messages(
    messages: list[dict[str, Any]], window: int, tail: str
) -> None:
    """Defect 4 as a property: messages appended after a prefix — here ones that break strict
    order — leave the plan for that prefix as it was, unless they cross the threshold."""
    later = [say(tail, "?"), say(tail, "?")]
    for pipeline in (("trim",), ("middle-out",), ("truncate", "prune", "trim")):
        shorter = plan(messages, pipeline, budget(window), simple_count, 0)
        longer = plan([*messages, *later], pipeline, budget(window), simple_count, 0)
        if shorter.tokens_after + sum(simple_count(m) for m in later) > budget(window).trigger:
            continue  # the longer request is a compaction event of its own
        assert (shorter.cut, shorter.dropped, shorter.truncated, shorter.pruned_before) == (
            longer.cut,
            longer.dropped,
            longer.truncated,
            longer.pruned_before,
        )
