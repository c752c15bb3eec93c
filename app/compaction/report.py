"""What one compaction did, as the proxy reports it: the `X-Compaction-*` headers and the
bodies of `POST /v1/compaction/preview` and `/count`."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from inflight.compaction.cost_mode import Economics
from inflight.compaction.engine import CompactionResult
from inflight.compaction.facts import fate, identifier_set, message_text, whole_positions
from inflight.compaction.refs import REF_SUFFIX_RE
from inflight.compaction.summary.prompt import SummaryUsage
from inflight.compaction.summary.stats import summary_outcome
from inflight.compaction.wire import Conversation

logger = logging.getLogger(__name__)

# What stood for a compaction event's cut span (DESIGN.md §12): `ready` — made for this request,
# which waited for it; `cached` — made before; `pending` — being made in the background, the
# request served without it; `failed` — it failed recently (backed off), served without it.
SummaryState = Literal["ready", "pending", "cached", "failed"]


@dataclass(frozen=True, slots=True)
class Deferred:
    """Work a request leaves for later (background summaries, summaries ahead of the next
    event, a quiet request's plan for the cache), started by one call: `run`. A piece that
    fails is logged and never stops the others, nor costs the request its answer."""

    work: tuple[Callable[[], object], ...] = ()

    def run(self) -> None:
        for start in self.work:
            try:
                start()
            except Exception:  # logged: work for later must not fail the request it came with
                logger.exception("deferred work failed")


@dataclass(frozen=True, slots=True, kw_only=True)
class Preview:
    """The outcome of compacting one request, without forwarding it (built with keywords)."""

    body: dict[str, Any]  # the request without its control keys
    forwarded: dict[str, Any]  # what goes upstream: `body` with the compacted history rendered
    conversation: Conversation  # the planner's view of `body`
    result: CompactionResult
    window: int
    limit_source: str
    reserve: int
    changed_body: bool
    exact: bool
    encoding: str | None
    summary_usage: SummaryUsage
    fallback: str | None
    summary_model: str
    error: str | None = None  # compaction itself failed: what the request got instead, and why
    summary_state: SummaryState | None = None  # when the request's event needed a summary
    starts: Deferred = field(default_factory=Deferred)  # the background summaries it starts
    after: Deferred = field(default_factory=Deferred)  # what starts once its answer is on its way
    # a partial stand-in (app/compaction/summary/partial.py): the share of the cut span's
    # tokens its summary covers
    summary_covers: float | None = None
    economics: Economics | None = None  # what the cut costs and saves (DESIGN.md §16)

    def start_background(self) -> None:
        """Start the background summaries this request asked for (once)."""
        self.starts.run()

    @property
    def changed(self) -> bool:
        """Whether the forwarded body differs from the one received (else its bytes go up)."""
        return self.changed_body or bool(self.result.applied)


def report_headers(preview: Preview) -> dict[str, str]:
    """The `X-Compaction-*` response headers (DESIGN.md §2)."""
    result = preview.result
    headers = {
        "X-Compaction-Applied": ",".join(result.applied) or "none",
        "X-Compaction-Tokens-Before": str(result.tokens_before),
        "X-Compaction-Tokens-After": str(result.tokens_after),
        "X-Compaction-Context-Limit": str(preview.window),
        "X-Compaction-Messages-Before": str(result.messages_before),
        "X-Compaction-Messages-After": str(result.messages_after),
    }
    if result.over_budget:
        headers["X-Compaction-Over-Budget"] = "true"
    usage = preview.summary_usage
    if usage.calls:
        headers["X-Compaction-Summary-Calls"] = str(usage.calls)
        headers["X-Compaction-Summary-Prompt-Tokens"] = str(usage.prompt_tokens)
        headers["X-Compaction-Summary-Completion-Tokens"] = str(usage.completion_tokens)
    if preview.summary_state is not None:
        headers["X-Compaction-Summary"] = preview.summary_state
    if preview.fallback is not None:
        headers["X-Compaction-Summary-Fallback"] = preview.fallback[:200]
    if preview.error is not None:
        headers["X-Compaction-Fallback"] = preview.error[:200]
    if preview.conversation.skip is not None:  # why it was forwarded as received
        headers["X-Compaction-Skipped"] = preview.conversation.skip[:200]
    return headers


def preview_report(preview: Preview) -> dict[str, Any]:
    """The `report` object of `POST /v1/compaction/preview`."""
    result = preview.result
    plan = result.plan
    return {
        "applied": list(result.applied),
        "tokens_before": result.tokens_before,
        "tokens_after": result.tokens_after,
        "messages_before": result.messages_before,
        "messages_after": result.messages_after,
        "context_limit": preview.window,
        "limit_source": preview.limit_source,
        "output_reserve": preview.reserve,
        "budget": preview.window - preview.reserve,
        "over_budget": result.over_budget,
        "exact": preview.exact,
        "encoding": preview.encoding,
        "pinned_head_units": plan.head,
        "units": len(plan.units),
        "compaction_events": len(plan.events),
        "summary": _summary(preview),
        "facts": facts_report(preview),
        "economics": None if preview.economics is None else preview.economics.as_dict(),
    }


def facts_report(preview: Preview) -> dict[str, int]:
    """What became of the identifiers of what this request's compaction cut (DESIGN.md §14):
    the distinct ones of the messages not forwarded whole, and how many of them are retained
    in the forwarded prompt, restorable behind a marker's ref, or lost. (Which of them the
    conversation will use again is not known yet: the bench and `simulate --retention`
    score those.)"""
    result = preview.result
    messages = preview.conversation.messages
    counts = {"references": 0, "retained": 0, "restorable": 0, "lost": 0}
    if not result.applied:
        return counts
    whole = whole_positions(messages, result.messages, result.sources)
    cut = [m for p, m in enumerate(messages) if p not in whole]
    references = sorted(set().union(*(identifier_set(message_text(m)) for m in cut)))
    prompt = "\n".join(message_text(m) for m in result.messages)
    named = REF_SUFFIX_RE.findall(prompt)
    for reference in references:
        counts[fate(reference, prompt, result.refs, named)] += 1
    counts["references"] = len(references)
    return counts


def _summary(preview: Preview) -> dict[str, Any]:
    """The preview's `summary` object: what this request's summary was (`summary_outcome`,
    `pending` while it is made in the background), its `X-Compaction-Summary` `state`, and
    `partial` when the summary of a prefix of the span stands in (the share it covers)."""
    result, state = preview.result, preview.summary_state
    outcome = summary_outcome(result.applied, preview.summary_usage.calls, preview.fallback)
    if state == "pending":
        outcome["status"] = "pending"
    if state is not None:
        outcome["state"] = state
    if preview.summary_covers is not None:
        outcome["partial"] = {"covers": round(preview.summary_covers, 4)}
    return outcome


def count_report(preview: Preview, model: str) -> dict[str, Any]:
    """The body of `POST /v1/compaction/count` (tokens of the request as received)."""
    tokens = preview.result.tokens_before
    budget = max(1, preview.window - preview.reserve)
    return {
        "model": model,
        "prompt_tokens": tokens,
        "context_limit": preview.window,
        "limit_source": preview.limit_source,
        "output_reserve": preview.reserve,
        "usage_ratio": round(tokens / budget, 4),
        "exact": preview.exact,
        "encoding": preview.encoding,
    }
