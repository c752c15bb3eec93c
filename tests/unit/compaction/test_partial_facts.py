"""A partial stand-in keeps the facts of what it does not cover (DESIGN.md §12, §14): the
summary of a prefix standing for a longer span gets the guard's list for the units between
the prefix's end and the cut, since its own guard left them out while they were kept turns."""

from __future__ import annotations

import re

import pytest

from inflight.compaction.facts import FACTS_HEADING, identifiers
from inflight.compaction.planner import plan
from inflight.compaction.summary.rolling import SummaryJob, gap_guard, summary_budget
from tests.support.conversations import planted, simple_count
from tests.unit.compaction.test_invariants import budget_for

FACT = re.compile(r"FACT-[0-9a-f]{6}")


def count_text(text: str) -> int:
    return len(text) // 4 + 1


async def never(body: object) -> tuple[int, bytes]:
    raise AssertionError("no summary call: the guard works on text alone")


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("the order ORD-7f3k2 shipped", ["ORD-7f3k2"]),
        ("invoice INV-2024abc9 is due", ["INV-2024abc9"]),
        ("see PROJ-1234", ["PROJ-1234"]),
        ("remember FACT-0a0009.", ["FACT-0a0009"]),
        ("BUG-abcd UTF-8 COVID-19 GPT-4o X-Compaction-Id", []),
    ],
)
def test_ids_with_letters_and_digits_after_the_dash_are_identifiers(
    text: str, found: list[str]
) -> None:
    assert [i.text for i in identifiers(text)] == found


def test_a_prefix_summary_standing_for_the_span_lists_the_facts_it_does_not_cover() -> None:
    messages, facts = planted(3, rounds=24)
    budget = budget_for(3000)
    reserved = summary_budget(budget.goal)
    the_plan = plan(messages, ("summarize",), budget, simple_count, 0, reserved)
    assert the_plan.summarize
    job = SummaryJob(messages, the_plan, "m", never, reserved, 100_000, count_text)
    end = the_plan.head + 2  # the prefix's summary covers the first two units of the span
    covered = {f for m in messages[: the_plan.units[end].start] for f in FACT.findall(str(m))}
    gap = {
        f
        for m in messages[the_plan.units[end].start : the_plan.units[the_plan.cut].start]
        for f in FACT.findall(str(m))
    }
    assert gap, "the span past the prefix holds planted facts"
    text = gap_guard("Summary of the start.", job, end)
    assert text.startswith("Summary of the start.")
    assert FACTS_HEADING in text
    assert gap <= set(FACT.findall(text))  # every fact of what the prefix does not cover
    assert not (covered - gap) & set(FACT.findall(text))  # the prefix's own: its summary's job
    assert count_text(text) <= reserved
    assert gap_guard("Summary of the start.", job, end) == text  # deterministic
    assert set(facts) >= gap
