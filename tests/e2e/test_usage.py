"""Usage: the write queue, the SQLite and (real) PostgreSQL stores, metrics and the stats view."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest

from inflight.cli.stats_table import bar, percent, render_stats
from inflight.usage.labels import ModelLabels
from inflight.usage.metrics import Metrics
from inflight.usage.records import UsageQueue, UsageRecord, UsageStore
from inflight.usage.stores import open_store
from inflight.usage.stores.sql import SCHEMA_VERSION
from tests.support.pg_server import postgres_url

pytestmark = pytest.mark.anyio


def record(i: int, **kw: Any) -> UsageRecord:
    values: dict[str, Any] = {
        "ts": time.time(), "request_id": f"r{i}", "kind": "chat", "model": f"m{i % 3}",
        "client_key_id": "abc", "stream": i % 2 == 0, "status": 200, "outcome": "completed",
        "latency_ms": 12.5, "ttfb_ms": 3.0, "prompt_tokens": 100 + i, "completion_tokens": 10,
        "cached_tokens": 5, "tokens_before": 200 + i, "tokens_after": 100 + i,
        "strategies": ("prune", "trim") if i % 4 == 0 else (), "context_limit": 8192,
    }  # fmt: skip
    values.update(kw)
    return UsageRecord(**values)


class FlakyStore:
    """Slow, and failing every third write: the queue must retry and lose nothing."""

    def __init__(self) -> None:
        self.rows: list[UsageRecord] = []
        self.calls = 0
        self.gate = asyncio.Event()
        self.entered = asyncio.Event()  # set once a write has started

    async def open(self) -> None: ...

    async def write_many(self, records: Sequence[UsageRecord]) -> None:
        self.calls += 1
        self.entered.set()
        await self.gate.wait()
        if self.calls % 3 == 0:
            raise OSError("disk hiccup")
        self.rows.extend(records)

    async def totals(self) -> dict[str, Any]:
        return {}

    async def ping(self) -> bool:
        return True

    async def close(self) -> None: ...


async def test_queue_never_blocks_and_loses_nothing() -> None:
    store = FlakyStore()
    queue = UsageQueue(store, max_batch=100, retry_delay=0.001)
    await queue.start()
    for i in range(3000):
        queue.submit(record(i))  # the store is blocked on its gate: submit must not wait
    assert queue.depth >= 2900
    store.gate.set()
    await queue.close()
    assert sorted(r.request_id for r in store.rows) == sorted(f"r{i}" for i in range(3000))
    assert queue.written == 3000
    assert queue.failed == 0


class DownStore(FlakyStore):
    """A store that is down for its first `outage` writes (a PostgreSQL restart)."""

    def __init__(self, outage: int, expected: int) -> None:
        super().__init__()
        self.outage = outage
        self.expected = expected
        self.all_written = asyncio.Event()

    async def write_many(self, records: Sequence[UsageRecord]) -> None:
        self.calls += 1
        if self.calls <= self.outage:
            raise OSError("connection refused")
        self.rows.extend(records)
        if len(self.rows) >= self.expected:
            self.all_written.set()


async def test_an_outage_longer_than_the_retries_loses_nothing() -> None:
    """The writer keeps its batch through 20 failed writes (more than `retries`), and records
    submitted meanwhile wait in the queue; once the store is back, all of them are written."""
    store = DownStore(outage=20, expected=500)
    queue = UsageQueue(store, max_batch=50, retries=5, retry_delay=0.001, max_backoff=0.002)
    await queue.start()
    for i in range(500):
        queue.submit(record(i))
    with anyio.fail_after(10):
        await store.all_written.wait()
    await queue.close()
    assert store.calls > 20
    assert sorted(r.request_id for r in store.rows) == sorted(f"r{i}" for i in range(500))
    assert (queue.failed, queue.dropped, queue.depth) == (0, 0, 0)


async def test_a_full_queue_drops_and_counts_instead_of_growing() -> None:
    store = FlakyStore()  # blocked on its gate: nothing leaves the queue
    queue = UsageQueue(store, max_batch=10, max_pending=100)
    await queue.start()
    queue.submit(record(0))
    with anyio.fail_after(5):
        await store.entered.wait()  # the writer holds record 0, blocked in the store
    for i in range(1, 150):
        queue.submit(record(i))
    assert queue.depth == 101
    assert queue.dropped == 149 - 100
    store.gate.set()
    await queue.close()
    assert len(store.rows) == 101
    assert queue.written == 101


async def check_store(store: UsageStore) -> None:
    await store.open()
    await store.open()  # idempotent schema creation
    try:
        records = [record(i) for i in range(1000)]
        records.append(
            record(1000, kind="summary", strategies=("summarize",), tokens_before=0, tokens_after=0)
        )
        records.append(record(1001, status=502, outcome="upstream_error", prompt_tokens=None))
        started = time.perf_counter()
        await store.write_many(records)
        elapsed = time.perf_counter() - started
        totals = await store.totals()
        chats = [r for r in records if r.kind == "chat"]
        assert totals["requests"] == len(chats)
        assert totals["summary_calls"] == 1
        assert totals["tokens_in"] == sum(r.prompt_tokens or 0 for r in records)
        assert totals["tokens_out"] == sum(r.completion_tokens or 0 for r in records)
        assert totals["tokens_saved"] == sum(r.tokens_before - r.tokens_after for r in chats)
        assert totals["by_status"] == {"200": 1000, "502": 1}
        assert totals["by_outcome"] == {"completed": 1000, "upstream_error": 1}
        assert totals["compactions"] == {"prune": 250, "trim": 250}
        assert sum(m["requests"] for m in totals["models"].values()) == len(chats)
        assert 0 < totals["models"]["m0"]["recent_window_share"] < 1
        assert await store.ping()
        assert elapsed < 30
    finally:
        await store.close()


async def test_sqlite_store(tmp_path: Path) -> None:
    await check_store(open_store(f"sqlite:///{tmp_path / 'usage.db'}"))


async def check_absurd_counts_are_written(store: UsageStore) -> None:
    """An upstream reporting an absurd usage number (past 64 bits) must not make the batch
    unwritable, nor the sums of /stats overflow."""
    await store.open()
    try:
        huge = 10**30
        absurd = [record(i, model="m", prompt_tokens=huge, completion_tokens=huge) for i in (0, 3)]
        await store.write_many([*absurd, record(2)])
        totals = await store.totals()
        assert totals["requests"] == 3
        assert totals["tokens_in"] == 2 * 10**12 + 102
    finally:
        await store.close()


async def test_sqlite_store_clamps_absurd_counts(tmp_path: Path) -> None:
    await check_absurd_counts_are_written(open_store(f"sqlite:///{tmp_path / 'usage.db'}"))


@pytest.mark.postgres
async def test_postgres_store_clamps_absurd_counts(pg: str) -> None:
    import psycopg

    async with await psycopg.AsyncConnection.connect(pg, autocommit=True) as conn:
        await conn.execute("DROP TABLE IF EXISTS inflight_usage, inflight_schema")
    await check_absurd_counts_are_written(open_store(pg))


@pytest.fixture(scope="module")
def pg() -> Iterator[str]:
    with postgres_url() as url:
        yield url


@pytest.mark.postgres
async def test_postgres_store(pg: str) -> None:
    import psycopg

    async with await psycopg.AsyncConnection.connect(pg, autocommit=True) as conn:
        await conn.execute("DROP TABLE IF EXISTS inflight_usage, inflight_schema")
    await check_store(open_store(pg))


@pytest.mark.postgres
async def test_two_postgres_writers_share_one_table(pg: str) -> None:
    import psycopg

    async with await psycopg.AsyncConnection.connect(pg, autocommit=True) as conn:
        await conn.execute("DROP TABLE IF EXISTS inflight_usage, inflight_schema")
    one, two = open_store(pg), open_store(pg)
    await asyncio.gather(one.open(), two.open())
    try:
        await asyncio.gather(
            one.write_many([record(i) for i in range(300)]),
            two.write_many([record(i) for i in range(300, 500)]),
        )
        assert (await one.totals())["requests"] == 500
        assert (await two.totals())["requests"] == 500
    finally:
        await one.close()
        await two.close()


# The table as schema version 1 created it (no `route`): a store must upgrade it in place.
V1_TABLE = """CREATE TABLE inflight_usage (
    ts DOUBLE PRECISION NOT NULL, request_id TEXT NOT NULL, kind TEXT NOT NULL,
    model TEXT NOT NULL, client_key_id TEXT, stream INTEGER NOT NULL, status INTEGER NOT NULL,
    outcome TEXT NOT NULL, latency_ms DOUBLE PRECISION NOT NULL, ttfb_ms DOUBLE PRECISION,
    prompt_tokens BIGINT, completion_tokens BIGINT, cached_tokens BIGINT,
    tokens_before BIGINT NOT NULL, tokens_after BIGINT NOT NULL, strategies TEXT NOT NULL,
    context_limit BIGINT)"""
V1_ROW = (
    "INSERT INTO inflight_usage VALUES "
    "(1.0, 'old', 'chat', 'm', NULL, 0, 200, 'completed', 1.0, NULL, 10, 1, 0, 20, 10, '', 8192)"
)


async def check_upgrade(store: UsageStore, version: Any) -> None:
    """An old table keeps its rows and gains the new columns; opening twice is harmless."""
    await store.open()
    await store.open()
    try:
        await store.write_many([record(1, route="/v1/chat/completions")])
        totals = await store.totals()
        assert totals["requests"] == 2
        assert totals["tokens_saved"] == 10 + 100
        assert await version() == SCHEMA_VERSION
    finally:
        await store.close()


async def test_sqlite_store_upgrades_a_version_1_table(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE inflight_schema (version INTEGER NOT NULL)")
        conn.execute("INSERT INTO inflight_schema VALUES (1)")
        conn.execute(V1_TABLE)
        conn.execute(V1_ROW)

    async def version() -> int:
        with sqlite3.connect(path) as conn:
            return int(conn.execute("SELECT version FROM inflight_schema").fetchone()[0])

    await check_upgrade(open_store(f"sqlite:///{path}"), version)


@pytest.mark.postgres
async def test_postgres_store_upgrades_a_version_1_table(pg: str) -> None:
    import psycopg

    async with await psycopg.AsyncConnection.connect(pg, autocommit=True) as conn:
        await conn.execute("DROP TABLE IF EXISTS inflight_usage, inflight_schema")
        await conn.execute("CREATE TABLE inflight_schema (version INTEGER NOT NULL)")
        await conn.execute("INSERT INTO inflight_schema VALUES (1)")
        await conn.execute(V1_TABLE)
        await conn.execute(V1_ROW)

    async def version() -> int:
        async with await psycopg.AsyncConnection.connect(pg, autocommit=True) as conn:
            row = await (await conn.execute("SELECT version FROM inflight_schema")).fetchone()
            assert row is not None
            return int(row[0])

    await check_upgrade(open_store(pg), version)


def test_unknown_database_scheme_is_an_error() -> None:
    with pytest.raises(ValueError, match="mysql"):
        open_store("mysql://x")


def test_metrics_render_the_series() -> None:
    # a calibration factor is a series only for a model with a label of its own (configured,
    # priced, or among the top seen): here configured
    metrics = Metrics(lambda: 7, lambda: {"llama-3": 1.12}, labels=ModelLabels(("llama-3",), 20))
    metrics.observe(record(0))
    metrics.observe(record(1, status=502, outcome="upstream_error"))
    metrics.observe(record(2, kind="summary"))
    metrics.observe(record(3, kind="passthrough", model="", route="/v1/responses"))
    metrics.observe(record(5, status=400, outcome="rejected", model="", tokens_before=0))
    text = metrics.render().decode()
    for series in (
        'inflight_requests_total{model="m0",status="200",stream="true"} 1.0',
        'inflight_tokens_total{kind="prompt",model="m0"} 100.0',
        'inflight_tokens_saved_total{model="m0"} 100.0',
        'inflight_compactions_total{strategy="prune"} 1.0',
        'inflight_upstream_errors_total{status="502"} 1.0',
        'inflight_summary_calls_total{model="m2"} 1.0',
        'inflight_passthrough_requests_total{route="/v1/responses",status="200"} 1.0',
        'inflight_requests_total{model="",status="400",stream="false"} 1.0',
        "inflight_usage_queue_depth 7.0",
        'inflight_calibration_factor{model="llama-3"} 1.12',
        "inflight_request_latency_seconds_bucket",
        "inflight_ttfb_seconds_bucket",
    ):
        assert series in text, series


def test_bar() -> None:
    assert bar(0, 10, 8) == " " * 8
    assert bar(10, 10, 8) == "█" * 8
    assert bar(5, 10, 8) == "████    "
    assert bar(1, 16, 2) == "▏ "
    assert bar(1, 0, 3) == "   "


def test_render_stats_is_exact() -> None:
    stats = {
        "requests": 10, "summary_calls": 1, "tokens_in": 3000, "tokens_out": 200,
        "tokens_cached": 1000, "tokens_saved": 1000, "tokens_estimated_before": 4000,
        "by_outcome": {"completed": 8, "rejected": 2},
        "passthrough": {"requests": 3, "routes": {"/v1/responses": 2, "/v1/models": 1}},
        "models": {
            "gpt-4o": {"requests": 6, "tokens_in": 2000, "recent_window_share": 0.5},
            "llama": {"requests": 4, "tokens_in": 1000, "recent_window_share": 15.49},
        },
        "compactions": {"trim": 4, "prune": 2},
        "summaries": {"calls": 5, "failures": {"timeout": 1, "http_500": 2},
                      "fallbacks": {"deadline": 1}},
        "calibration": {"llama": 1.1},
    }  # fmt: skip
    text = render_stats(stats, width=60)
    assert text.splitlines() == [
        "inflight usage",
        "=" * 60,
        "requests                 10   summary calls 1",
        "outcomes         completed 8, rejected 2",
        "passthrough               3   /v1/responses 2, /v1/models 1",
        "tokens in              3.0k   cached 1.0k",
        "tokens out              200",
        # estimate against estimate: 1,000 of the 4,000 estimated before compaction
        "saved (estimate)       1.0k   ██▌        25% of 4.0k est. before",
        "",
        "model                        requests  tokens in  share of tokens in",
        "gpt-4o                              6       2.0k  ██████████",
        "llama                               4       1.0k  █████     ",
        "",
        "window used by recent requests (after compaction)",
        "  gpt-4o                     █████      50%",
        "  llama                      ██████████ >999%",
        "",
        "compactions by strategy",
        "  trim                       ██████████ 4",
        "  prune                      █████      2",
        "",
        "summary calls since start 5",
        "  failed           3   http_500 2, timeout 1",
        "  fell back        1   deadline 1",
        "",
        "token calibration factors",
        "  llama                      ×1.100",
    ]


@pytest.mark.parametrize(
    ("share", "shown"),
    [(0.0, "0%"), (0.994, "99%"), (1.5, "150%"), (9.99, "999%"), (18.9, ">999%")],
)
def test_percent_is_capped(share: float, shown: str) -> None:
    assert percent(share) == shown


async def test_window_share_and_savings_count_only_what_the_upstream_accepted(
    tmp_path: Path,
) -> None:
    """A 5 MB prompt the upstream refused must not move `recent_window_share` (it made it 18.9),
    and `saved_share` compares the proxy's estimates before and after, never a real count."""

    def refused(before: int, after: int) -> dict[str, Any]:
        return {"model": "m", "status": 400, "prompt_tokens": None, "tokens_before": before,
                "tokens_after": after}  # fmt: skip

    store = open_store(f"sqlite:///{tmp_path / 'usage.db'}")
    await store.open()
    try:
        await store.write_many(
            [
                record(0, model="m", tokens_before=8000, tokens_after=4000, prompt_tokens=3000),
                record(1, model="m", tokens_before=2000, tokens_after=2000, prompt_tokens=1500),
                # Refused by the upstream, then by the proxy itself (never forwarded).
                record(2, outcome="upstream_error", **refused(before=1_300_000, after=1_300_000)),
                record(3, outcome="rejected", context_limit=None, **refused(9000, 3000)),
            ]
        )
        totals = await store.totals()
    finally:
        await store.close()
    model = totals["models"]["m"]
    assert model["recent_window_share"] == round((4000 / 8192 + 2000 / 8192) / 2, 4)
    # Saved: 4,000 of 8,000 + 2,000 + 1,300,000 estimated; the request the proxy itself
    # rejected was never forwarded, so nothing was saved on it.
    assert totals["tokens_saved"] == model["tokens_saved"] == 4000
    assert totals["tokens_estimated_before"] == 1_310_000
    assert totals["saved_share"] == model["saved_share"] == round(4000 / 1_310_000, 4)
    assert totals["by_outcome"] == {"completed": 2, "upstream_error": 1, "rejected": 1}


async def test_recording_can_be_turned_off() -> None:
    store = open_store("none")
    await store.open()
    await store.write_many([record(1)])
    assert (await store.totals())["requests"] == 0
    assert await store.ping()
    await store.close()


class BatchStore(FlakyStore):
    """Records each write's batch and when it came (never fails)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate.set()
        self.batches: list[tuple[float, int]] = []
        self.wrote = asyncio.Event()

    async def write_many(self, records: Sequence[UsageRecord]) -> None:
        self.batches.append((time.monotonic(), len(records)))
        self.rows.extend(records)
        self.wrote.set()

    async def holding(self, count: int) -> None:
        """Until `count` records are written (bounded)."""
        with anyio.fail_after(5):
            while len(self.rows) < count:
                self.wrote.clear()
                await self.wrote.wait()


async def test_steady_traffic_is_written_in_batches_and_a_lone_record_at_once() -> None:
    """A record after a quiet spell is written at once; records that keep coming wait the
    linger for the ones behind them, so a transaction carries many; `close` writes what the
    writer held while it waited."""
    store = BatchStore()
    queue = UsageQueue(store, linger=0.05)
    await queue.start()
    sent = time.monotonic()
    queue.submit(record(0))
    await store.holding(1)
    assert store.batches[0][0] - sent < 0.04  # no linger after a quiet spell
    for i in range(1, 201):  # a request every ~1 ms
        queue.submit(record(i))
        await asyncio.sleep(0.001)
    await store.holding(201)
    assert len(store.batches) <= 12, store.batches  # about 1 per 50 ms, not 1 per record
    queue.submit(record(201))  # the writer takes it and lingers (it wrote a moment ago)
    await asyncio.sleep(0.01)
    assert queue.depth == 1
    await queue.close()
    assert sorted(int(r.request_id[1:]) for r in store.rows) == list(range(202))
