"""The exact-fact guard in rolling summaries (DESIGN.md §14): a summary ends with the span's
identifiers the model's text lost, within the summary's budget, the same text for the same
span and answer, and a summarised conversation stays cache-stable (invariant 7) with it on."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inflight.compaction.engine import CompactionResult, compact
from inflight.compaction.facts import FACTS_HEADING
from inflight.compaction.planner import plan
from inflight.compaction.policy import Budget
from inflight.compaction.summary.cache import MemoryCache, SummaryFlight
from inflight.compaction.summary.prompt import SummaryPrompt
from inflight.compaction.summary.rolling import Summaries, SummaryJob, summary_budget
from inflight.compaction.units import check_pair_safety
from tests.support.conversations import conversations, follows_strict_rule, simple_count
from tests.unit.compaction.test_invariants import SUMMARIZE, budget_for, check_cache_stability

PROMPT = SummaryPrompt.load(Path(__file__).resolve().parents[3] / "config" / "summary_prompt.md")


def count_text(text: str) -> int:
    return len(text) // 4 + 1


async def forgetful(body: dict[str, Any]) -> tuple[int, bytes]:
    """A summariser that keeps the gist and no identifier: a function of its prompt."""
    prompt = body["messages"][0]["content"]
    text = f"The work went on ({len(prompt)} characters of it)."
    answer = {"choices": [{"message": {"role": "assistant", "content": text}}]}
    return 200, orjson.dumps(answer)


def summarized(
    summaries: Summaries, messages: Sequence[Mapping[str, Any]], window: int
) -> CompactionResult:
    """`summarize` as the service runs it in wait mode, the summary made by `summaries`."""
    budget = budget_for(window)
    reserved = summary_budget(budget.goal)
    the_plan = plan(messages, SUMMARIZE, budget, simple_count, 0, reserved)
    given_ = {"summary_tokens": reserved, "planned": the_plan}
    if not the_plan.summarize:
        return compact(messages, SUMMARIZE, budget, simple_count, 0, summary="", **given_)
    job = SummaryJob(messages, the_plan, "m", forgetful, reserved, 100_000, count_text)
    text = anyio.run(summaries.summary_for, job)
    return compact(messages, SUMMARIZE, budget, simple_count, 0, summary=text, **given_)


def guarded_summaries() -> Summaries:
    return Summaries(PROMPT, SummaryFlight(MemoryCache()), guard=True)


SESSION = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Fix the crash in /srv/billing/config_417.yaml (ticket OPS-4127)."},
    *[
        m
        for i in range(30)
        for m in (
            {"role": "assistant", "content": f"Step {i}: reading src/billing/invoice_{i}.py"},
            {
                "role": "user",
                "content": f"Output {i}: KeyError in load_invoice_{i}() after 250ms; "
                + "filler text " * 60,
            },
        )
    ],
]


def test_a_summary_ends_with_the_identifiers_the_model_lost_within_its_budget() -> None:
    window = 4096
    made = summarized(guarded_summaries(), SESSION, window)
    assert "summarize" in made.applied
    text = next(str(m["content"]) for m in made.messages if "The work went on" in str(m["content"]))
    assert FACTS_HEADING in text
    facts = text.split(FACTS_HEADING, 1)[1]
    assert "load_invoice_0" in facts  # only the cut turns name it
    for kept in ("KeyError", "250ms"):  # every turn names them: the kept ones hold them
        assert kept not in facts
        assert kept in str(made.messages[-1]["content"])
    reserved = summary_budget(budget_for(window).goal)
    summary = text.split("\n\n", 1)[1]  # after the summary prefix
    assert count_text(summary) <= reserved


def test_without_the_guard_the_model_text_is_all() -> None:
    made = summarized(Summaries(PROMPT, SummaryFlight(MemoryCache()), guard=False), SESSION, 4096)
    assert "summarize" in made.applied
    assert FACTS_HEADING not in orjson.dumps(made.messages).decode()


def test_the_same_span_and_answer_give_the_same_summary_on_any_replica() -> None:
    one = summarized(guarded_summaries(), SESSION, 4096)
    two = summarized(guarded_summaries(), SESSION, 4096)  # a fresh cache: made again
    assert one.messages == two.messages


def test_the_model_is_asked_for_less_than_the_summary_budget_when_the_guard_is_on() -> None:
    asked: list[int] = []

    async def complete(body: dict[str, Any]) -> tuple[int, bytes]:
        asked.append(body["max_tokens"])
        return await forgetful(body)

    budget: Budget = budget_for(4096)
    reserved = summary_budget(budget.goal)
    the_plan = plan(SESSION, SUMMARIZE, budget, simple_count, 0, reserved)
    job = SummaryJob(SESSION, the_plan, "m", complete, reserved, 100_000, count_text)
    anyio.run(guarded_summaries().summary_for, job)
    assert asked
    assert all(0 < n < reserved for n in asked)


SLOW = [HealthCheck.too_slow, HealthCheck.data_too_large]


@settings(max_examples=20, deadline=None, suppress_health_check=SLOW)
@given(messages=conversations(), window=st.sampled_from([2048, 4096, 8192]))
def test_summaries_with_the_guard_keep_the_prompt_cache_stable(
    messages: list[dict[str, Any]], window: int
) -> None:
    """7. between events each forwarded prompt extends the previous one, the guarded summary
    included; events are spaced as the plan promises. 1, 4, 6 hold too."""
    summaries = guarded_summaries()
    check_cache_stability(messages, SUMMARIZE, window, lambda m, _, w: summarized(summaries, m, w))
    result = summarized(summaries, messages, window)
    assert check_pair_safety(result.messages) == []
    assert result.tokens_after <= result.tokens_before
    if not result.over_budget:
        assert result.tokens_after <= budget_for(window).budget
    if follows_strict_rule(messages):
        assert follows_strict_rule(result.messages)
