"""The usage table and its queries, shared by the SQLite and PostgreSQL stores."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from inflight.usage.costs import DIGITS
from inflight.usage.ledger import LATE_FIELDS, LedgerRow, LedgerUpdate, with_late_fields
from inflight.usage.records import UsageRecord, api_entry, api_route

SCHEMA_VERSION = 7

COLUMNS = (
    "ts", "request_id", "kind", "model", "client_key_id", "stream", "status", "outcome",
    "latency_ms", "ttfb_ms", "prompt_tokens", "completion_tokens", "cached_tokens",
    "tokens_before", "tokens_after", "strategies", "context_limit", "route",
    "cache_write_tokens", "cost", "baseline_cost", "id", "cut_for",
)  # fmt: skip

CREATE_LEDGER = [
    """CREATE TABLE IF NOT EXISTS inflight_ledger (
        id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        created DOUBLE PRECISION NOT NULL,
        expires DOUBLE PRECISION NOT NULL,
        document TEXT NOT NULL,
        facts_retained BIGINT,
        facts_restorable BIGINT,
        facts_lost BIGINT,
        realised_net DOUBLE PRECISION,
        realised_turns BIGINT
    )""",
    "CREATE INDEX IF NOT EXISTS inflight_ledger_expires ON inflight_ledger (expires)",
]
# The ledger table as version 4 made it, and the late fields version 7 adds to it (a store older
# than version 4 has no ledger table: `CREATE` has just made it whole).
LEDGER_V4 = [
    """CREATE TABLE IF NOT EXISTS inflight_ledger (
        id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        created DOUBLE PRECISION NOT NULL,
        expires DOUBLE PRECISION NOT NULL,
        document TEXT NOT NULL
    )""",
    CREATE_LEDGER[1],
]
LEDGER_V7 = [
    "ALTER TABLE inflight_ledger ADD COLUMN facts_retained BIGINT",
    "ALTER TABLE inflight_ledger ADD COLUMN facts_restorable BIGINT",
    "ALTER TABLE inflight_ledger ADD COLUMN facts_lost BIGINT",
    "ALTER TABLE inflight_ledger ADD COLUMN realised_net DOUBLE PRECISION",
    "ALTER TABLE inflight_ledger ADD COLUMN realised_turns BIGINT",
]
LEDGER_SINCE = 4  # the version that added the ledger table
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
        context_limit BIGINT,
        route TEXT,
        cache_write_tokens BIGINT,
        cost DOUBLE PRECISION,
        baseline_cost DOUBLE PRECISION,
        id TEXT,
        cut_for TEXT
    )""",
    "CREATE INDEX IF NOT EXISTS inflight_usage_ts ON inflight_usage (ts)",
    "CREATE INDEX IF NOT EXISTS inflight_usage_model ON inflight_usage (model)",
    *CREATE_LEDGER,
]


# Statements that bring a table of schema version N-1 to version N (run in order, in one
# transaction, by the one process that holds the store's migration lock).
MIGRATIONS: dict[int, list[str]] = {
    2: ["ALTER TABLE inflight_usage ADD COLUMN route TEXT"],
    3: [
        "ALTER TABLE inflight_usage ADD COLUMN cache_write_tokens BIGINT",
        "ALTER TABLE inflight_usage ADD COLUMN cost DOUBLE PRECISION",
        "ALTER TABLE inflight_usage ADD COLUMN baseline_cost DOUBLE PRECISION",
    ],
    4: LEDGER_V4,
    5: ["ALTER TABLE inflight_usage ADD COLUMN id TEXT"],
    6: ["ALTER TABLE inflight_usage ADD COLUMN cut_for TEXT"],
    7: LEDGER_V7,
}
# Run after the migrations (a table older than version 5 has no `id` column before them). Rows
# from before version 5 have a NULL id, which a unique index allows any number of times.
INDEXES = ["CREATE UNIQUE INDEX IF NOT EXISTS inflight_usage_id ON inflight_usage (id)"]


def migrations_from(version: int) -> list[str]:
    """The statements that bring a table at `version` to `SCHEMA_VERSION` (the version row's
    update included).

    Schema versions: 1 had no `route`; 2 adds `route` (the client's route: `/v1/chat/completions`
    for chat records, `/v1/<api>` for passthrough records, empty for summary calls); 3 adds
    `cache_write_tokens`, `cost` and `baseline_cost` (USD, DESIGN.md §9; NULL: unpriced model); 4
    adds the `inflight_ledger` table (DESIGN.md §11: one row per compacted request, its JSON
    document, its owner and expiry); 5 adds `id`, each record's own id under a unique index, so a
    batch written again (a retry after a lost acknowledgement, a spill file replayed) adds nothing;
    6 adds `cut_for` (`fit` or `cost`: why compaction changed the request, DESIGN.md §16);
    7 adds the ledger's late fields (`LATE_FIELDS`): `facts_retained`, `facts_restorable`,
    `facts_lost` (DESIGN.md §14), `realised_net` and `realised_turns` (§16), null until known.
    """
    statements = [
        sql
        for v in sorted(MIGRATIONS)
        if v > version and not (MIGRATIONS[v] is LEDGER_V7 and version < LEDGER_SINCE)
        for sql in MIGRATIONS[v]
    ]
    if version < SCHEMA_VERSION:
        statements.append(f"UPDATE inflight_schema SET version = {SCHEMA_VERSION}")
    return statements


def insert_sql(placeholder: str) -> str:
    """Insert a record; one whose id is already there (written before) is skipped."""
    values = ", ".join([placeholder] * len(COLUMNS))
    return (
        f"INSERT INTO inflight_usage ({', '.join(COLUMNS)}) VALUES ({values}) "
        "ON CONFLICT (id) DO NOTHING"
    )


def insert_ledger_sql(placeholder: str) -> str:
    """Insert a ledger row; a row already there (a batch written again after a failure) stays."""
    values = ", ".join([placeholder] * 5)
    return (
        "INSERT INTO inflight_ledger (id, owner, created, expires, document) "
        f"VALUES ({values}) ON CONFLICT (id) DO NOTHING"
    )


def delete_expired_sql(placeholder: str) -> str:
    return f"DELETE FROM inflight_ledger WHERE expires <= {placeholder}"


def read_ledger_sql(placeholder: str) -> str:
    return (
        f"SELECT document, {', '.join(LATE_FIELDS)} FROM inflight_ledger "
        f"WHERE id = {placeholder} AND owner = {placeholder} AND expires > {placeholder}"
    )


def update_ledger_sql(placeholder: str) -> str:
    """Set the late fields an update knows (a NULL parameter keeps the column as it is)."""
    sets = ", ".join(f"{name} = COALESCE({placeholder}, {name})" for name in LATE_FIELDS)
    return f"UPDATE inflight_ledger SET {sets} WHERE id = {placeholder}"


def ledger_document(found: Sequence[Any]) -> bytes:
    """The JSON of a row `read_ledger_sql` found, its late fields added."""
    document, *late = found
    known = {k: v for k, v in zip(LATE_FIELDS, late, strict=True) if v is not None}
    update = LedgerUpdate("", **known) if known else None
    return with_late_fields(str(document).encode(), update)


def ledger_rows(rows: Sequence[LedgerRow]) -> list[tuple[str, str, float, float, str]]:
    return [(r.id, r.owner, r.created, r.expires, r.json().decode()) for r in rows]


def ledger_updates(items: Sequence[LedgerRow | LedgerUpdate]) -> list[tuple[Any, ...]]:
    """The parameters of `update_ledger_sql` for the updates among `items`, in order."""
    return [(*u.values(), u.id) for u in items if isinstance(u, LedgerUpdate)]


def ledger_inserts(items: Sequence[LedgerRow | LedgerUpdate]) -> list[LedgerRow]:
    return [r for r in items if isinstance(r, LedgerRow)]


# A token count no request reaches (10^12). Counts are clamped to it so that an upstream that
# reports an absurd usage number can neither make a batch unwritable nor overflow the 64-bit
# sums of /stats (millions of such records would still fit).
MAX_COUNT = 10**12


def _int(value: int | None) -> int | None:
    return None if value is None else max(-MAX_COUNT, min(MAX_COUNT, value))


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
            _int(r.prompt_tokens),
            _int(r.completion_tokens),
            _int(r.cached_tokens),
            _int(r.tokens_before),
            _int(r.tokens_after),
            ",".join(r.strategies),
            _int(r.context_limit),
            r.route,
            _int(r.cache_write_tokens),
            r.cost,
            r.baseline_cost,
            r.id,
            r.cut_for,
        )
        for r in records
    ]


TOTALS = """
SELECT model, kind, status, outcome, COALESCE(route, ''), COUNT(*),
       COALESCE(SUM(prompt_tokens), 0), COALESCE(SUM(completion_tokens), 0),
       COALESCE(SUM(cached_tokens), 0), COALESCE(SUM(tokens_before - tokens_after), 0),
       COALESCE(SUM(tokens_before), 0), COALESCE(SUM(cache_write_tokens), 0)
FROM inflight_usage GROUP BY model, kind, status, outcome, COALESCE(route, '')
"""
STRATEGIES = """
SELECT strategies, COUNT(*) FROM inflight_usage WHERE kind = 'chat' AND strategies <> ''
GROUP BY strategies
"""
# Only requests the upstream accepted: a rejected giant prompt says nothing about the window
# that the requests which went through use.
RECENT = """
SELECT model, tokens_after, context_limit FROM inflight_usage
WHERE kind = 'chat' AND context_limit IS NOT NULL AND status >= 200 AND status < 300
ORDER BY ts DESC LIMIT 200
"""

# Dollars by model, kind and why compaction cut (DESIGN.md §9, §16): USD, USD, requests with
# no price.
COSTS = """
SELECT model, kind, COALESCE(SUM(cost), 0), COALESCE(SUM(baseline_cost), 0),
       SUM(CASE WHEN cost IS NULL THEN 1 ELSE 0 END), COALESCE(cut_for, '')
FROM inflight_usage WHERE kind <> 'passthrough' GROUP BY model, kind, COALESCE(cut_for, '')
"""
# The ledger's late fields over the rows it keeps (DESIGN.md §14, §16).
LEDGER_TOTALS = """
SELECT COUNT(*), COUNT(facts_lost), COALESCE(SUM(facts_retained), 0),
       COALESCE(SUM(facts_restorable), 0), COALESCE(SUM(facts_lost), 0), COUNT(realised_turns),
       COALESCE(SUM(realised_turns), 0), COALESCE(SUM(realised_net), 0)
FROM inflight_ledger
"""
RECENT_REQUESTS = """
SELECT ts, model, tokens_before, tokens_after, strategies, latency_ms, status, outcome, stream,
       prompt_tokens, completion_tokens, cached_tokens, cost, baseline_cost
FROM inflight_usage WHERE kind = 'chat' ORDER BY ts DESC LIMIT {placeholder}
"""


def series_sql(placeholder: str, bucket_start: str) -> str:
    """Usage per time bucket from a start time; `bucket_start` is the dialect's expression of a
    record's bucket (parameters: bucket, bucket, since)."""
    return f"""
SELECT {bucket_start} AS bucket, kind, COUNT(*), COALESCE(SUM(prompt_tokens), 0),
       COALESCE(SUM(completion_tokens), 0), COALESCE(SUM(cached_tokens), 0),
       COALESCE(SUM(CASE WHEN outcome = 'rejected' THEN 0
                         ELSE tokens_before - tokens_after END), 0),
       COALESCE(SUM(cost), 0), COALESCE(SUM(baseline_cost), 0)
FROM inflight_usage WHERE ts >= {placeholder} AND kind <> 'passthrough'
GROUP BY bucket, kind ORDER BY bucket
"""


def activity(series: Iterable[Sequence[Any]], recent: Iterable[Sequence[Any]]) -> dict[str, Any]:
    """The JSON shape of `/stats/timeseries` from `series_sql` and `RECENT_REQUESTS` rows."""
    buckets: dict[int, dict[str, Any]] = {}
    for start, kind, n, p, c, cached, saved, cost, baseline in series:
        b = buckets.setdefault(int(start), {"ts": int(start), "requests": 0, "summary_calls": 0,
            "tokens_in": 0, "tokens_out": 0, "tokens_cached": 0, "tokens_saved": 0,
            "cost_actual": 0.0, "cost_baseline": 0.0})  # fmt: skip
        b["summary_calls" if kind == "summary" else "requests"] += n
        if kind != "summary":
            b["tokens_saved"] += int(saved)
        b["tokens_in"] += int(p)
        b["tokens_out"] += int(c)
        b["tokens_cached"] += int(cached)
        b["cost_actual"] += float(cost)
        b["cost_baseline"] += float(baseline)
    names = ("ts", "model", "tokens_before", "tokens_after", "strategies", "latency_ms",
             "status", "outcome", "stream", "prompt_tokens", "completion_tokens",
             "cached_tokens", "cost", "baseline_cost")  # fmt: skip
    rows = [dict(zip(names, row, strict=True)) for row in recent]
    for row in rows:
        row["strategies"] = [s for s in str(row["strategies"]).split(",") if s]
        row["stream"] = bool(row["stream"])
    return {"series": [buckets[k] for k in sorted(buckets)], "recent": rows}


def _model_entry() -> dict[str, Any]:
    return {
        "requests": 0,
        "tokens_in": 0,
        "tokens_out": 0,
        "tokens_saved": 0,
        "tokens_estimated_before": 0,
        "summary_calls": 0,
        "summary_tokens": 0,
    }


def _add_api(apis: dict[str, dict[str, int]], row: Sequence[Any]) -> None:
    route, n, p, c, cached = row[4:9]
    api = apis.setdefault(api_route(route), api_entry())
    api["requests"] += n
    api["tokens_in"] += int(p)
    api["tokens_out"] += int(c)
    api["tokens_cached"] += int(cached)


def _passthrough_entry() -> dict[str, Any]:
    return {"requests": 0, "by_status": {}, "by_outcome": {}, "routes": {}}


def _bump(counts: dict[str, int], key: str, n: int) -> None:
    counts[key] = counts.get(key, 0) + n


def _saved_share(saved: int, before: int) -> float:
    """Tokens removed by compaction over the tokens there were before it, both the proxy's own
    estimate (never the upstream's real count on one side and an estimate on the other)."""
    return round(saved / before, 4) if before > 0 else 0.0


def _add_chat(totals: dict[str, Any], entry: dict[str, Any] | None, row: Sequence[Any]) -> None:
    _model, _kind, status, outcome, _route, n, _p, _c, _cached, saved, before = row[:11]
    totals["requests"] += n
    _bump(totals["by_status"], str(status), n)
    _bump(totals["by_outcome"], outcome, n)
    if entry is not None:
        entry["requests"] += n
    if outcome == "rejected":  # never forwarded: nothing was saved on its way upstream
        return
    for target in (totals, entry):
        if target is not None:
            target["tokens_saved"] += int(saved)
            target["tokens_estimated_before"] += int(before)


def summarize(
    groups: Iterable[Sequence[Any]],
    strategies: Iterable[Sequence[Any]],
    recent: Iterable[Sequence[Any]],
) -> dict[str, Any]:
    """The JSON shape of `/stats` (and `inflight stats`) from the three queries above."""
    totals: dict[str, Any] = {"requests": 0, "summary_calls": 0, "tokens_in": 0,
        "tokens_out": 0, "tokens_cached": 0, "tokens_cache_write": 0, "tokens_saved": 0,
        "tokens_estimated_before": 0, "by_status": {}, "by_outcome": {}}  # fmt: skip
    models: dict[str, dict[str, Any]] = {}
    passthrough = _passthrough_entry()
    apis: dict[str, dict[str, int]] = {}  # by route: the edge names them (`name_apis`)
    for row in groups:
        model, kind, status, outcome, route, n, p, c, cached = row[:9]
        if kind == "passthrough":
            passthrough["requests"] += n
            _bump(passthrough["by_status"], str(status), n)
            _bump(passthrough["by_outcome"], outcome, n)
            _bump(passthrough["routes"], route, n)
            continue
        # A request refused before its body was read has no model: counted, but under no model.
        entry = models.setdefault(model, _model_entry()) if model else None
        if kind == "summary":
            totals["summary_calls"] += n
            if entry is not None:
                entry["summary_calls"] += n
                entry["summary_tokens"] += int(p) + int(c)
        else:
            _add_chat(totals, entry, row)
            _add_api(apis, row)
        totals["tokens_in"] += int(p)
        totals["tokens_out"] += int(c)
        totals["tokens_cached"] += int(cached)
        totals["tokens_cache_write"] += int(row[11]) if len(row) > 11 else 0  # (Anthropic)
        if entry is not None:
            entry["tokens_in"] += int(p)
            entry["tokens_out"] += int(c)
    for target in (totals, *models.values()):
        target["saved_share"] = _saved_share(
            target["tokens_saved"], target["tokens_estimated_before"]
        )
    _add_window_shares(models, recent)
    return {
        **totals,
        "compactions": _compactions(strategies),
        "models": models,
        "apis": apis,
        "passthrough": passthrough,
    }


def add_ledger(stats: dict[str, Any], totals: Sequence[Any] | None) -> dict[str, Any]:
    """Put `ledger` into `stats` (and `realised_net` into its total `cost`, after `add_costs`)
    from the `LEDGER_TOTALS` row: the references of the rows' cuts kept in the forwarded
    prompt, behind a marker's ref, or lost, and lost ones per row that has its facts; the
    realised net of the compaction events the rows' requests made, and the requests after
    them it covers."""
    rows, with_facts, retained, restorable, lost, events, turns, net = totals or (0,) * 8
    stats["ledger"] = {
        "rows": int(rows),
        "rows_with_facts": int(with_facts),
        "facts_retained": int(retained),
        "facts_restorable": int(restorable),
        "facts_lost": int(lost),
        "lost_per_event": round(int(lost) / int(with_facts), 2) if with_facts else 0.0,
        "realised_events": int(events),
        "realised_turns": int(turns),
        "realised_net": round(float(net), DIGITS),
    }
    if "cost" in stats:
        stats["cost"]["realised_net"] = stats["ledger"]["realised_net"]
    return stats


def _compactions(strategies: Iterable[Sequence[Any]]) -> dict[str, int]:
    compactions: dict[str, int] = {}
    for names, n in strategies:
        for name in str(names).split(","):
            _bump(compactions, name, n)
    return compactions


def _add_window_shares(models: dict[str, dict[str, Any]], recent: Iterable[Sequence[Any]]) -> None:
    """`recent_window_share`: the mean share of its window a model's recent accepted requests
    used after compaction (by the proxy's estimate, so it may exceed 1 when that is high)."""
    shares: dict[str, list[float]] = {}
    for model, after, limit in recent:
        if limit:
            shares.setdefault(model, []).append(after / limit)
    for model, values in shares.items():
        if model in models:
            models[model]["recent_window_share"] = round(sum(values) / len(values), 4)
