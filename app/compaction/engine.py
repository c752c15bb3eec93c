"""`compact`: plan, render, and report — the synchronous entry point of the pure core.

`summarize` needs the upstream, so here it plans the cut a summary would replace; the async
summary layer swaps in the summary text, and on any failure re-plans with `trim`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.compaction.planner import MessageCounter, Plan, kept_sources, plan, render
from app.compaction.policy import Budget, StrategyName
from app.compaction.replays import Replays

SUMMARY_PREFIX = "[Summary of the earlier conversation, written by inflight to fit the context]\n\n"


@dataclass(frozen=True, slots=True)
class CompactionResult:
    """The compacted messages and what it took (for headers, usage and the preview)."""

    messages: list[Mapping[str, Any]]
    applied: tuple[StrategyName, ...]
    tokens_before: int
    tokens_after: int
    messages_before: int
    messages_after: int
    over_budget: bool
    plan: Plan
    # per output message, the index of the input message it came from (the same object when
    # untouched, else a transformed copy); None for a summary inserted as a message of its own
    sources: tuple[int | None, ...]


def _parts(content: Any) -> list[Any]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return list(content) if isinstance(content, list) else []


def summary_message(plan: Plan, messages: Sequence[Mapping[str, Any]], text: str) -> dict[str, Any]:
    """The message that carries the summary, placed as the plan says (DESIGN.md §4.6): a new
    message of the plan's summary role, to stand right after the head; or, folded, the head's
    user message with the summary as an extra text part after its own, unchanged content."""
    content = SUMMARY_PREFIX + text
    if plan.summary_role != "fold":
        return {"role": plan.summary_role, "content": content}
    host = messages[plan.units[plan.head - 1].end - 1]
    return {**host, "content": [*_parts(host.get("content")), {"type": "text", "text": content}]}


def with_summary(
    out: list[Mapping[str, Any]],
    plan: Plan,
    messages: Sequence[Mapping[str, Any]],
    text: str,
    count: MessageCounter,
    sources: list[int | None] | None = None,
) -> int:
    """Put the summary in `out` (rendered from `plan`, with its `sources` kept in step);
    returns the tokens it adds."""
    head_end = plan.units[plan.head - 1].end if plan.head else 0
    message = summary_message(plan, messages, text)
    if plan.summary_role == "fold":
        host = out[head_end - 1]
        out[head_end - 1] = message
        return count(message) - count(host)
    out.insert(head_end, message)
    if sources is not None:
        sources.insert(head_end, None)
    return count(message)


def _applied(plan: Plan, pipeline: tuple[StrategyName, ...]) -> tuple[StrategyName, ...]:
    did: dict[StrategyName, bool] = {
        "truncate": bool(plan.truncated),
        "prune": plan.pruned_before > plan.head,
        "trim": plan.cut > plan.head and not plan.summarize,
        "summarize": plan.cut > plan.head and plan.summarize,
        "middle-out": bool(plan.dropped),
    }
    return tuple(name for name in pipeline if did[name])


def compact(
    messages: Sequence[Mapping[str, Any]],
    pipeline: tuple[StrategyName, ...],
    budget: Budget,
    count: MessageCounter,
    fixed_tokens: int,
    *,
    summary: str | None = None,
    summary_tokens: int = 0,
    planned: Plan | None = None,
    replays: Replays | None = None,
) -> CompactionResult:
    """Compact `messages` for `budget`. Unchanged messages are the same objects.

    Without a `summary` text, `summarize` in the pipeline acts as `trim` (the pure fallback).
    `planned` reuses a plan already computed for exactly these arguments; `replays` remembers
    replays by history prefix (the plan is the same with or without).
    """
    if summary is None:
        pipeline = tuple("trim" if s == "summarize" else s for s in pipeline)
    the_plan = planned or plan(
        messages, pipeline, budget, count, fixed_tokens, summary_tokens, replays=replays
    )
    if not the_plan.changed:
        return CompactionResult(
            list(messages),
            (),
            the_plan.tokens_before,
            the_plan.tokens_before,
            len(messages),
            len(messages),
            the_plan.tokens_before > budget.budget,
            the_plan,
            tuple(range(len(messages))),
        )
    out = render(messages, the_plan)
    sources = kept_sources(the_plan)
    after = the_plan.tokens_after
    if the_plan.summarize and summary is not None:
        added = with_summary(out, the_plan, messages, summary, count, sources)
        after = after - summary_tokens + added
    return CompactionResult(
        out,
        _applied(the_plan, pipeline),
        the_plan.tokens_before,
        after,
        len(messages),
        len(out),
        after > budget.budget,
        the_plan,
        tuple(sources),
    )
