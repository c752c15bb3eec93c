"""The exact-fact guard spends its bounded room on what the prompt would otherwise lack
(DESIGN.md §14): nothing the turns kept beside the summary hold, nothing another listed
identifier already contains."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from inflight.compaction.facts import FACTS_HEADING, SEPARATOR, facts_kept, guarded
from inflight.compaction.planner import plan
from inflight.compaction.summary.rolling import kept_text, summary_budget
from tests.support.conversations import simple_count
from tests.unit.compaction.test_facts_guard import SESSION as BASE_SESSION
from tests.unit.compaction.test_facts_guard import (
    SUMMARIZE,
    budget_for,
    guarded_summaries,
    summarized,
)


def count(text: str) -> int:
    return len(text) // 4 + 1


def listed(block: str) -> list[str]:
    return block.removeprefix(FACTS_HEADING + " ").split(SEPARATOR) if block else []


def test_an_identifier_inside_a_longer_listed_one_is_not_listed_again() -> None:
    span = [
        {"role": "user", "content": "ran pkg.load_data_v2 ok"},
        {"role": "user", "content": "then 'load_data_v2' failed"},
    ]
    # ranked first, the short one is listed, then the longer one that contains it takes its
    # place (the prompt holds both then)
    assert listed(facts_kept(span, "A summary.", 1000, count)) == ["pkg.load_data_v2"]


TOKENS = st.text(alphabet="abcdef0123456789_./#-: \"'`ENOTXYZ", max_size=400)


@settings(max_examples=80, deadline=None)
@given(spans=st.lists(TOKENS, min_size=1, max_size=6), bound=st.integers(0, 300))
def test_no_listed_identifier_holds_another_and_the_list_stays_bounded(
    spans: list[str], bound: int
) -> None:
    span = [{"role": "user", "content": text} for text in spans]
    text = guarded("S.", span, bound, count)
    if text == "S.":
        return
    assert count(text) <= bound
    names = listed(text.removeprefix("S.\n\n"))
    for one in names:
        assert not any(one in other for other in names if other != one)


def naming_older_files(n: int, message: dict[str, Any]) -> dict[str, Any]:
    """Step n//2's output names the file step n//2 - 12 read, too."""
    if message["role"] != "user":
        return message
    return {**message, "content": f"{message['content']} see src/billing/invoice_{n // 2 - 12}.py"}


# the turns kept after the cut name files of the span they follow
SESSION = BASE_SESSION[:2] + [naming_older_files(n, m) for n, m in enumerate(BASE_SESSION[2:])]


def test_the_guard_leaves_out_what_the_turns_kept_after_the_cut_hold() -> None:
    made = summarized(guarded_summaries(), SESSION, 4096)
    assert "summarize" in made.applied
    summary = next(str(m["content"]) for m in made.messages if FACTS_HEADING in str(m["content"]))
    facts = summary.split(FACTS_HEADING, 1)[1]
    rest = "\n".join(str(m["content"]) for m in made.messages if FACTS_HEADING not in str(m))
    kept_paths = {f"src/billing/invoice_{i}.py" for i in range(-12, 30)}
    held = {p for p in kept_paths if p in rest}
    assert held  # the kept turns name files the cut span read
    assert all(p not in facts for p in held)
    assert "load_invoice_" in facts  # the room goes to what the prompt lacks


def test_what_is_kept_beside_the_summary_is_read_from_the_messages_the_request_has() -> None:
    budget = budget_for(4096)
    reserved = summary_budget(budget.goal)
    # a plan of a longer history (an event predicted ahead) over the messages sent so far
    predicted = plan(SESSION, SUMMARIZE, budget, simple_count, 0, reserved)
    assert predicted.summarize
    sent = SESSION[: predicted.units[predicted.cut].end]
    text = kept_text(sent, predicted)
    assert "You are a coding agent." in text  # the head
    assert str(sent[-1]["content"]) in text
    assert str(SESSION[-1]["content"]) not in text  # not sent yet: not counted as kept
