"""The usage table and its queries, shared by the SQLite and PostgreSQL stores."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from app.usage import UsageRecord

SCHEMA_VERSION = 1

COLUMNS = (
    "ts", "request_id", "kind", "model", "client_key_id", "stream", "status", "outcome",
    "latency_ms", "ttfb_ms", "prompt_tokens", "completion_tokens", "cached_tokens",
    "tokens_before", "tokens_after", "strategies", "context_limit",
)  # fmt: skip

CREATE = [
    """CREATE TABLE IF NOT EXISTS inflight_schema (version INTEGER NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS inflight_usage (
        ts DOUBLE PRECISION NOT NULL,
        request_id TEXT NOT NULL,
        kind TEXT NOT NULL,
        model TEXT NOT NULL,
        client_key_id TEXT,
        stream INTEGER NOT NULL,
        status INTEGER NOT NULL,
        outcome TEXT NOT NULL,
        latency_ms DOUBLE PRECISION NOT NULL,
        ttfb_ms DOUBLE PRECISION,
        prompt_tokens BIGINT,
        completion_tokens BIGINT,
        cached_tokens BIGINT,
        tokens_before BIGINT NOT NULL,
        tokens_after BIGINT NOT NULL,
        strategies TEXT NOT NULL,
        context_limit BIGINT
    )""",
    "CREATE INDEX IF NOT EXISTS inflight_usage_ts ON inflight_usage (ts)",
    "CREATE INDEX IF NOT EXISTS inflight_usage_model ON inflight_usage (model)",
]


def insert_sql(placeholder: str) -> str:
    values = ", ".join([placeholder] * len(COLUMNS))
    return f"INSERT INTO inflight_usage ({', '.join(COLUMNS)}) VALUES ({values})"


def rows(records: Sequence[UsageRecord]) -> list[tuple[Any, ...]]:
    return [
        (
            r.ts,
            r.request_id,
            r.kind,
            r.model,
            r.client_key_id,
            int(r.stream),
            r.status,
            r.outcome,
            r.latency_ms,
            r.ttfb_ms,
            r.prompt_tokens,
            r.completion_tokens,
            r.cached_tokens,
            r.tokens_before,
            r.tokens_after,
            ",".join(r.strategies),
            r.context_limit,
        )
        for r in records
    ]


TOTALS = """
SELECT model, kind, status, outcome, COUNT(*), COALESCE(SUM(prompt_tokens), 0),
       COALESCE(SUM(completion_tokens), 0), COALESCE(SUM(cached_tokens), 0),
       COALESCE(SUM(tokens_before - tokens_after), 0)
FROM inflight_usage GROUP BY model, kind, status, outcome
"""
STRATEGIES = """
SELECT strategies, COUNT(*) FROM inflight_usage WHERE kind = 'chat' AND strategies <> ''
GROUP BY strategies
"""
RECENT = """
SELECT model, tokens_after, context_limit FROM inflight_usage
WHERE kind = 'chat' AND context_limit IS NOT NULL ORDER BY ts DESC LIMIT 200
"""


def summarize(
    groups: Iterable[Sequence[Any]],
    strategies: Iterable[Sequence[Any]],
    recent: Iterable[Sequence[Any]],
) -> dict[str, Any]:
    """The JSON shape of `/stats` (and `inflight stats`) from the three queries above."""
    totals = {"requests": 0, "summary_calls": 0, "tokens_in": 0, "tokens_out": 0,
              "tokens_cached": 0, "tokens_saved": 0}  # fmt: skip
    by_status: dict[str, int] = {}
    by_outcome: dict[str, int] = {}
    models: dict[str, dict[str, Any]] = {}
    for model, kind, status, outcome, n, p, c, cached, saved in groups:
        entry = models.setdefault(
            model,
            {
                "requests": 0,
                "tokens_in": 0,
                "tokens_out": 0,
                "tokens_saved": 0,
                "summary_calls": 0,
                "summary_tokens": 0,
            },
        )
        if kind == "summary":
            totals["summary_calls"] += n
            entry["summary_calls"] += n
            entry["summary_tokens"] += int(p) + int(c)
        else:
            totals["requests"] += n
            entry["requests"] += n
            by_status[str(status)] = by_status.get(str(status), 0) + n
            by_outcome[outcome] = by_outcome.get(outcome, 0) + n
            entry["tokens_saved"] += int(saved)
            totals["tokens_saved"] += int(saved)
        totals["tokens_in"] += int(p)
        totals["tokens_out"] += int(c)
        totals["tokens_cached"] += int(cached)
        entry["tokens_in"] += int(p)
        entry["tokens_out"] += int(c)
    compactions: dict[str, int] = {}
    for names, n in strategies:
        for name in str(names).split(","):
            compactions[name] = compactions.get(name, 0) + n
    shares: dict[str, list[float]] = {}
    for model, after, limit in recent:
        if limit:
            shares.setdefault(model, []).append(after / limit)
    for model, values in shares.items():
        if model in models:
            models[model]["recent_window_share"] = round(sum(values) / len(values), 4)
    return {
        **totals,
        "by_status": by_status,
        "by_outcome": by_outcome,
        "compactions": compactions,
        "models": models,
    }
