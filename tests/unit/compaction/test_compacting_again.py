"""Invariant 5 (DESIGN.md §4) where it is hardest to keep: the first compaction leaves the prompt
over the threshold — pinned content too large for the target, a summary longer than the tokens
reserved for it, a last unit only deep truncation can shrink — and compacting that output again
must still change nothing."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inflight.compaction.engine import CompactionResult, compact, marker_tokens
from inflight.compaction.policy import Budget
from inflight.strategies import StrategyName
from tests.support.conversations import conversations, simple_count, summary_in

BUDGET = Budget(window=4096, reserve=512, threshold=0.8, target=0.5)  # trigger 2867, goal 1792
RESERVED = 200  # the tokens the plan reserves for the summary
SUMMARIZE: tuple[StrategyName, ...] = ("truncate", "prune", "summarize")
_SLOW_IS_FINE = [HealthCheck.too_slow, HealthCheck.data_too_large]


def tool_round(i: int, output: str) -> list[dict[str, Any]]:
    call = {"id": f"c{i}", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": f"c{i}", "content": output},
    ]


def twice(
    messages: list[dict[str, Any]],
    pipeline: tuple[StrategyName, ...],
    budget: Budget = BUDGET,
    **options: Any,
) -> tuple[CompactionResult, CompactionResult]:
    """The compaction of `messages`, and that of its output with the same inputs."""
    first = compact(messages, pipeline, budget, simple_count, 0, **options)
    again = compact(list(first.messages), pipeline, budget, simple_count, 0, **options)
    return first, again


def assert_unchanged(again: CompactionResult, first: CompactionResult) -> None:
    assert again.applied == ()
    assert list(again.messages) == list(first.messages)


def long_summary(words: int = 260) -> str:
    """A summary longer than `RESERVED` tokens (the model may write its whole budget, and the
    prefix and the message come on top)."""
    return " ".join(f"fact{i}" for i in range(words))


def pinned_system_session() -> list[dict[str, Any]]:
    """A system prompt larger than the whole budget, then an agent's tool rounds with one large
    output, then the user's next question."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are an agent. " + "Rule. " * 3_000},
        {"role": "user", "content": "Fix the bug."},
    ]
    for i in range(6):
        messages += tool_round(i, ("x" if i != 2 else "y" * 9) * 1_500)
    messages += [
        {"role": "assistant", "content": "Done: the parser is fixed."},
        {"role": "user", "content": "Now the tests, please."},
    ]
    return messages


@pytest.mark.parametrize(
    "pipeline", [SUMMARIZE, ("truncate", "prune", "trim")], ids=["summarize", "auto"]
)
def test_a_huge_pinned_system_prompt_is_compacted_once(
    pipeline: tuple[StrategyName, ...],
) -> None:
    """The head alone is over the budget: the first compaction cuts what it can and stays over
    it; the summary it put after the head is not summarised again (nor cut for a new one)."""
    summary = long_summary() if "summarize" in pipeline else None
    first, again = twice(
        pinned_system_session(), pipeline, summary=summary, summary_tokens=RESERVED
    )
    assert first.over_budget
    assert first.applied[-1] in ("summarize", "trim")
    if summary is not None:
        assert summary_in(first.messages) is not None
        assert first.messages[2]["content"].endswith(summary)  # a message of its own
    assert_unchanged(again, first)


def test_a_summary_folded_into_the_head_past_its_reserve_is_not_summarised_again() -> None:
    """The first user message is the pinned giant and no turn follows the cut yet, so the
    summary is folded into it (§4.6). Longer than reserved, it takes the output over the
    threshold, where the plan (counting the reserve) was under it: compacted again, the head
    with the summary folded in is counted as the plan counted it, and nothing moves."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix it. " + "spec " * 1_600}]
    for i in range(3):  # these cross the threshold: the event cuts them
        messages += tool_round(i, "x" * 1_600)
    for i in range(3, 12):  # these do not, by the plan's count (with the summary's reserve)
        messages += tool_round(i, "x" * 100)
    first, again = twice(messages, SUMMARIZE, summary=long_summary(), summary_tokens=RESERVED)
    assert first.plan.summary_role == "fold"
    assert first.tokens_after > BUDGET.trigger >= first.plan.tokens_after
    assert len(first.messages) > 3  # the small rounds are kept: a second event would cut them
    assert_unchanged(again, first)


def test_a_marker_standing_alone_after_the_head_is_not_swapped_for_a_new_one() -> None:
    """Restore on: the marker that stands for what trim cut is never cut on its own."""
    first, again = twice(pinned_system_session(), ("trim",), restore=True)
    assert first.over_budget
    assert first.messages[2]["content"].startswith("[inflight removed ")
    assert_unchanged(again, first)


def test_a_last_unit_already_truncated_is_not_truncated_deeper_the_second_time() -> None:
    """A huge head, and a last tool round whose outputs only just fit the cap once cut: the
    first compaction cuts its long output and judges cutting its text and arguments too not
    worth it; the second, seeing one marker fewer to allow for (it was cut already), must judge
    the same (it judged differently, and cut deeper)."""

    def call(k: int, name: str, query: str) -> dict[str, Any]:
        arguments = f'{{"q": "{query}"}}'
        return {
            "id": f"c{k}",
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }

    messages = [
        {"role": "user", "content": "u" * 14_350},
        {"role": "assistant", "content": "a" * 2_080},
        {"role": "user", "content": "u" * 91},
        {"role": "assistant", "content": "h }b7pba",
         "tool_calls": [call(0, "bash", ""), call(1, "grep", "oj{1hola.")]},
        {"role": "tool", "tool_call_id": "c0", "content": "x" * 1_869},
        {"role": "tool", "tool_call_id": "c1", "content": "x" * 1_104},
    ]  # fmt: skip
    budget = Budget(window=2048, reserve=256, threshold=0.8, target=0.5)
    first, again = twice(messages, ("truncate",), budget, restore=True)
    assert first.applied == ("truncate",)
    assert first.tokens_after > budget.trigger
    assert_unchanged(again, first)


@st.composite
def heavy_heads(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Generated conversations whose pinned head (a system prompt, the first user message, an
    instruction later on) may be too large for the target, or for the budget."""
    messages = draw(conversations())
    size = draw(st.sampled_from([0, 4_000, 12_000, 40_000]))
    where = draw(st.sampled_from(["system", "user", "instruction"]))
    if where == "system":
        messages.insert(0, {"role": "system", "content": "S" * size})
    elif where == "user":
        first = next(i for i, m in enumerate(messages) if m["role"] == "user")
        content = messages[first]["content"]
        grown = content + "U" * size if isinstance(content, str) else content
        messages[first] = {**messages[first], "content": grown}
    else:
        at = draw(st.integers(1, len(messages)))
        if at == len(messages) or messages[at]["role"] not in ("tool", "function"):
            messages.insert(at, {"role": "system", "content": "From now on: " + "I" * size})
    return messages


@settings(max_examples=40, deadline=None, suppress_health_check=_SLOW_IS_FINE)
@given(
    messages=heavy_heads(),
    pipeline=st.sampled_from([SUMMARIZE, ("truncate", "prune", "trim"), ("middle-out",)]),
    window=st.sampled_from([2048, 4096, 8192]),
    restore=st.booleans(),
    overrun=st.sampled_from([-40, 0, 60]),
)
def test_compacting_a_compacted_request_changes_nothing(
    messages: list[dict[str, Any]],
    pipeline: tuple[StrategyName, ...],
    window: int,
    restore: bool,
    overrun: int,
) -> None:
    """Whatever the first compaction left (over the threshold or not), with summaries shorter
    or longer than their reserve."""
    budget = Budget(window=window, reserve=window // 8, threshold=0.8, target=0.5)
    options: dict[str, Any] = {"restore": restore}
    if "summarize" in pipeline:
        reserved = RESERVED + (marker_tokens(simple_count) if restore else 0)
        words = max(1, (4 * (RESERVED + overrun) - 100) // 6)
        options.update(summary=long_summary(words), summary_tokens=reserved)
    first, again = twice(messages, pipeline, budget, **options)
    assert_unchanged(again, first)
