"""Turning a finished exchange into usage records: a chat request (one, plus one per summary
call), or a request relayed by a passthrough route."""

from __future__ import annotations

import time
import uuid

from inflight.compaction.summary.prompt import SummaryUsage
from inflight.proxy.api import Exchange
from inflight.proxy.sse_tap import Usage
from inflight.usage.records import OneRound, Outcome, UsageRecord

# Passthrough requests are counted per API (the first path segment after `/v1`); any other
# segment is `other`, so a client inventing paths cannot grow the stats or the metric labels.
PASSTHROUGH_APIS = frozenset(
    {
        "assistants", "audio", "batches", "completions", "embeddings", "files", "fine_tuning",
        "images", "messages", "models", "moderations", "responses", "threads", "uploads",
        "vector_stores",
    }
)  # fmt: skip


def passthrough_route(v1_path: str) -> str:
    """`/v1/<api>` for a path after `/v1` (`/responses/abc` -> `/v1/responses`)."""
    api = v1_path.lstrip("/").split("/", 1)[0]
    return f"/v1/{api if api in PASSTHROUGH_APIS else 'other'}"


def passthrough_record(
    route: str,
    *,
    status: int,
    outcome: Outcome,
    started: float,
    ttfb: float | None,
    client_key_id: str | None,
) -> UsageRecord:
    """One request a passthrough route relayed (its body is not read: no model, no tokens)."""
    return UsageRecord(
        ts=time.time(),
        request_id=uuid.uuid4().hex,
        kind="passthrough",
        model="",
        client_key_id=client_key_id,
        stream=False,
        status=status,
        outcome=outcome,
        latency_ms=(time.perf_counter() - started) * 1000,
        ttfb_ms=ttfb * 1000 if ttfb is not None else None,
        prompt_tokens=None,
        completion_tokens=None,
        cached_tokens=None,
        tokens_before=0,
        tokens_after=0,
        strategies=(),
        context_limit=None,
        route=route,
    )


def records_for(exchange: Exchange) -> list[UsageRecord]:
    now = time.time()
    request_id = uuid.uuid4().hex
    usage = exchange.usage
    compacted = exchange.compacted
    records = [
        UsageRecord(
            ts=now,
            request_id=request_id,
            kind="chat",
            model=exchange.model,
            client_key_id=exchange.client_key_id,
            stream=exchange.stream,
            status=exchange.status,
            outcome=exchange.outcome,
            latency_ms=(time.perf_counter() - exchange.started) * 1000,
            ttfb_ms=exchange.ttfb * 1000 if exchange.ttfb is not None else None,
            prompt_tokens=usage.prompt_tokens if usage else None,
            completion_tokens=usage.completion_tokens if usage else None,
            cached_tokens=usage.cached_tokens if usage else None,
            cache_write_tokens=usage.cache_write_tokens if usage else None,
            tokens_before=compacted.tokens_before if compacted is not None else 0,
            tokens_after=compacted.tokens_after if compacted is not None else 0,
            strategies=compacted.strategies if compacted is not None else (),
            context_limit=compacted.context_limit if compacted is not None else None,
            route=exchange.route,
            one_round=one_round(usage),
            cut_for=compacted.cut_for if compacted is not None else None,
            ledger_id=compacted.ledger_id if compacted is not None else None,
            events=compacted.events if compacted is not None else 0,
            client=compacted.client if compacted is not None else "",
        )
    ]
    if compacted is not None:
        model = compacted.summary_model or exchange.model
        summary = compacted.summary_usage
        records += summary_records(summary, model, exchange.client_key_id, request_id, now)
    return records


def one_round(usage: Usage | None) -> OneRound | None:
    """Restore's rounds as one (the first's prompt, the last's answer); None for one round."""
    if usage is None or len(usage.rounds) < 2:
        return None
    first, last = usage.rounds[0], usage.rounds[-1]
    return OneRound(
        first.prompt_tokens, first.cached_tokens, first.cache_write_tokens, last.completion_tokens
    )


def summary_records(
    usage: SummaryUsage,
    model: str,
    client_key_id: str | None,
    request_id: str | None = None,
    ts: float | None = None,
) -> list[UsageRecord]:
    """One `kind="summary"` record per summary call of `usage` (a request's own, with its
    `request_id`; or a background summary's, with a new one)."""
    request_id = request_id or uuid.uuid4().hex
    now = time.time() if ts is None else ts
    return [
        UsageRecord(
            ts=now,
            request_id=request_id,
            kind="summary",
            model=model,
            client_key_id=client_key_id,
            stream=False,
            status=200,
            outcome="completed",
            latency_ms=0.0,
            ttfb_ms=None,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cached_tokens=None,
            tokens_before=0,
            tokens_after=0,
            strategies=("summarize",),
            context_limit=None,
        )
        for prompt_tokens, completion_tokens in usage.each
    ]
