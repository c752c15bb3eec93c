"""What one compaction did, as the proxy reports it: the `X-Compaction-*` headers and the
bodies of `POST /v1/compaction/preview` and `/count`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.compaction.engine import CompactionResult
from app.compaction.formats import Conversation
from app.compaction.summary.prompt import SummaryUsage
from app.usage.summary_stats import summary_outcome


@dataclass(frozen=True, slots=True)
class Preview:
    """The outcome of compacting one request, without forwarding it."""

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
        "summary": summary_outcome(result.applied, preview.summary_usage.calls, preview.fallback),
    }


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
