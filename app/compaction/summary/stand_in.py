"""What stands for a cut span while its summary is not there (pending or failed): nothing but a
short, fixed note where the summary will go — and only where a message must stand there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from inflight.compaction.engine import CompactionResult
from inflight.compaction.inserted import OMITTED_NOTE
from inflight.compaction.policy import Budget
from inflight.compaction.unit_costs import MessageCounter
from inflight.strategies import StrategyName

OMITTED = OMITTED_NOTE


def omitted_note(result: CompactionResult) -> Mapping[str, Any] | None:
    """The note that holds the summary's place in `result`, if it needs one.

    The cut is the summarising plan's either way (DESIGN.md §12): when the summary lands, it
    replaces the note and nothing else changes (one prompt change). A summary that would be a
    message of its own stands between the head and a turn of the other role; leaving that place
    empty would make two messages of one role meet (§4.6), so the note takes it, with the same role.
    A summary folded into the head's user message needs no note: the head stays as it is.
    """
    plan = result.plan
    if not plan.summarize or plan.summary_role == "fold":
        return None
    return {"role": plan.summary_role, "content": OMITTED}


def without_summary(
    result: CompactionResult,
    pipeline: tuple[StrategyName, ...],
    reserved: int,
    budget: Budget,
    count: MessageCounter,
    *,
    marked: bool = False,
) -> CompactionResult:
    """`result` of a summarising plan rendered without its summary: the same cut, the note in
    the summary's place when it needs one, reported as `trim`, and without the tokens the plan
    reserved for the summary. `marked` (restore or pins on): the span marker or pinned text
    stands in its place already, its tokens counted; only what is reported changes."""
    applied = tuple(
        "trim" if name == "summarize" else name
        for name in pipeline
        if name in result.applied or name == "summarize"
    )
    if marked:
        return replace(result, applied=applied)
    after = result.tokens_after - reserved
    messages, sources = list(result.messages), list(result.sources)
    note = omitted_note(result)
    if note is not None:
        plan = result.plan
        head_end = plan.units[plan.head - 1].end if plan.head else 0
        messages.insert(head_end, note)
        sources.insert(head_end, None)
        after += count(note)
    return replace(
        result,
        messages=messages,
        sources=tuple(sources),
        applied=applied,
        tokens_after=after,
        messages_after=len(messages),
        over_budget=after > budget.budget,
    )
