"""The ledger's rows in the usage store (SQLite, a real PostgreSQL), the write queue that carries
them, and `Ledger.read`: owner, expiry, read-your-writes before the row is written."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest

from inflight.compaction.cuts import Cut
from inflight.errors import NotFound
from inflight.settings import LedgerMode
from inflight.usage.ledger import Ledger, LedgerRow
from inflight.usage.records import UsageQueue, UsageRecord, UsageStore
from inflight.usage.stores import open_store
from inflight.usage.stores.sql import SCHEMA_VERSION
from inflight.usage.stores.sqlite import SQLiteStore
from tests.e2e.test_usage import record
from tests.support.pg_server import postgres_url

pytestmark = pytest.mark.anyio
NOW = 1_800_000_000.0


def row(ledger_id: str, owner: str = "k1", expires: float = NOW + 60, **doc: Any) -> LedgerRow:
    return LedgerRow(ledger_id, owner, NOW, expires, {"id": ledger_id, "cuts": [], **doc})


async def check_ledger_rows(store: UsageStore) -> None:
    await store.open()
    try:
        await store.write_ledger([row("a", content="x" * 10_000), row("b", owner="")])
        found = await store.read_ledger("a", "k1", NOW)
        assert found is not None
        assert orjson.loads(found)["content"] == "x" * 10_000
        assert await store.read_ledger("a", "k2", NOW) is None  # another owner
        assert await store.read_ledger("a", "", NOW) is None  # no credential
        assert await store.read_ledger("b", "", NOW) is not None  # no credential, its own
        assert await store.read_ledger("nope", "k1", NOW) is None
        assert await store.read_ledger("a", "k1", NOW + 61) is None  # expired: never returned
        # written again (a batch retried after its usage records failed): the first one stays
        await store.write_ledger([row("a", content="changed")])
        again = await store.read_ledger("a", "k1", NOW)
        assert again is not None
        assert orjson.loads(again)["content"] == "x" * 10_000
    finally:
        await store.close()


async def test_sqlite_ledger_rows(tmp_path: Path) -> None:
    await check_ledger_rows(open_store(f"sqlite:///{tmp_path / 'u.db'}"))


async def test_expired_rows_are_deleted_on_write_and_at_open(tmp_path: Path) -> None:
    path = tmp_path / "u.db"
    store = open_store(f"sqlite:///{path}")
    await store.open()
    await store.write_ledger([row("old", expires=1.0), row("older", expires=2.0)])

    def ids() -> list[str]:
        with sqlite3.connect(path) as conn:
            return sorted(r[0] for r in conn.execute("SELECT id FROM inflight_ledger"))

    assert ids() == ["old", "older"]  # expired, but never returned (test_sqlite_ledger_rows)
    with sqlite3.connect(path) as conn:
        conn.execute(
            "INSERT INTO inflight_ledger (id, owner, created, expires, document) VALUES ('stale', 'k1', 0, 1, '{}')"
        )
    await store.write_ledger([row("new")])  # each write deletes what has expired
    assert ids() == ["new"]
    await store.close()
    with sqlite3.connect(path) as conn:
        conn.execute(
            "INSERT INTO inflight_ledger (id, owner, created, expires, document) VALUES ('stale', 'k1', 0, 1, '{}')"
        )
    reopened = open_store(f"sqlite:///{path}")
    await reopened.open()
    assert ids() == ["new"]
    await reopened.close()


async def test_a_version_3_store_gains_the_ledger_table(tmp_path: Path) -> None:
    path = tmp_path / "u.db"
    store = open_store(f"sqlite:///{path}")
    await store.open()
    await store.close()
    with sqlite3.connect(path) as conn:  # as version 3 left it: no ledger, no record ids
        conn.execute("DROP TABLE inflight_ledger")
        conn.execute("DROP INDEX inflight_usage_id")
        conn.execute("ALTER TABLE inflight_usage DROP COLUMN id")
        conn.execute("ALTER TABLE inflight_usage DROP COLUMN cut_for")
        conn.execute("UPDATE inflight_schema SET version = 3")
    await check_ledger_rows(open_store(f"sqlite:///{path}"))
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT version FROM inflight_schema").fetchone()[0] == SCHEMA_VERSION


@pytest.fixture(scope="module")
def pg() -> Iterator[str]:
    with postgres_url() as url:
        yield url


async def fresh_postgres(url: str) -> None:
    """The database at `url` with the current schema and no rows."""
    import psycopg

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute("DROP TABLE IF EXISTS inflight_usage, inflight_schema, inflight_ledger")
    first = open_store(url)
    await first.open()
    await first.close()


@pytest.mark.postgres
async def test_postgres_ledger_rows_and_migration(pg: str) -> None:
    import psycopg

    await fresh_postgres(pg)
    async with await psycopg.AsyncConnection.connect(pg, autocommit=True) as conn:
        await conn.execute("DROP TABLE inflight_ledger")  # as version 3 left it
        await conn.execute("ALTER TABLE inflight_usage DROP COLUMN id")  # (its index too)
        await conn.execute("ALTER TABLE inflight_usage DROP COLUMN cut_for")
        await conn.execute("UPDATE inflight_schema SET version = 3")
    await check_ledger_rows(open_store(pg))
    async with await psycopg.AsyncConnection.connect(pg, autocommit=True) as conn:
        cursor = await conn.execute("SELECT version FROM inflight_schema")
        assert (await cursor.fetchone()) == (SCHEMA_VERSION,)
        await conn.execute(
            "INSERT INTO inflight_ledger (id, owner, created, expires, document) VALUES ('stale', 'k1', 0, 1, '{}')"
        )
    store = open_store(pg)
    await store.open()  # deletes what expired
    try:
        await store.write_ledger([row("c")])
        async with await psycopg.AsyncConnection.connect(pg, autocommit=True) as conn:
            cursor = await conn.execute("SELECT id FROM inflight_ledger ORDER BY id")
            assert [r[0] for r in await cursor.fetchall()] == ["a", "b", "c"]
    finally:
        await store.close()


class GatedStore(SQLiteStore):
    """Ledger writes wait for `gate`; `wrote` is set after each one."""

    def __init__(self) -> None:
        super().__init__("sqlite:///:memory:")
        self.gate = asyncio.Event()
        self.entered = asyncio.Event()
        self.wrote = asyncio.Event()
        self.fail_records = 0

    async def write_ledger(self, rows: Sequence[LedgerRow]) -> None:
        self.entered.set()
        await self.gate.wait()
        await super().write_ledger(rows)
        self.wrote.set()

    async def write_many(self, records: Sequence[UsageRecord]) -> None:
        if self.fail_records:
            self.fail_records -= 1
            raise sqlite3.OperationalError("disk I/O error")
        await super().write_many(records)


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


async def test_a_row_is_read_before_it_is_written_then_from_the_store() -> None:
    store = GatedStore()
    await store.open()
    queue = UsageQueue(store, retry_delay=0.001)
    await queue.start()
    clock = Clock()
    ledger = Ledger(LedgerMode.META, 60.0, queue, store, clock)
    try:
        queue.submit(row("r1"))
        with anyio.fail_after(5):
            await store.entered.wait()  # the writer took it and waits on the gate
        assert orjson.loads(await ledger.read("r1", "k1"))["id"] == "r1"  # not written yet
        with pytest.raises(NotFound):
            await ledger.read("r1", "k2")
        with pytest.raises(NotFound):
            await ledger.read("r1", None)
        clock.now = NOW + 61
        with pytest.raises(NotFound):  # expired, even unwritten
            await ledger.read("r1", "k1")
        clock.now = NOW
        store.gate.set()
        with anyio.fail_after(5):
            await store.wrote.wait()
        assert queue.unwritten("r1") is None
        assert orjson.loads(await ledger.read("r1", "k1"))["id"] == "r1"  # from the store
        clock.now = NOW + 61
        with pytest.raises(NotFound):
            await ledger.read("r1", "k1")
    finally:
        store.gate.set()
        await queue.close()
        await store.close()


async def test_records_failing_after_the_rows_were_written_lose_and_double_nothing() -> None:
    store = GatedStore()
    store.gate.set()
    store.fail_records = 2
    await store.open()
    queue = UsageQueue(store, retry_delay=0.001, max_backoff=0.002)
    queue.submit(row("r1"))
    queue.submit(record(1))
    await queue.start()
    await queue.close()
    assert queue.written == 1
    assert queue.failed == 0
    assert await store.read_ledger("r1", "k1", NOW) is not None
    assert (await store.totals())["requests"] == 1
    await store.close()


async def test_a_full_queue_keeps_no_row_it_dropped() -> None:
    store = GatedStore()
    queue = UsageQueue(store, max_pending=1)  # not started: nothing leaves the queue
    queue.submit(row("kept"))
    queue.submit(row("dropped"))
    assert queue.dropped == 1
    assert queue.unwritten("kept") is not None
    assert queue.unwritten("dropped") is None


async def test_ids_longer_than_any_issued_are_not_looked_up() -> None:
    class Refuses(GatedStore):
        async def read_ledger(self, ledger_id: str, owner: str, now: float) -> bytes | None:
            raise AssertionError("looked up")

    store = Refuses()
    ledger = Ledger(LedgerMode.META, 60.0, UsageQueue(store), store)
    for ledger_id in ("", "x" * 65):
        with pytest.raises(NotFound):
            await ledger.read(ledger_id, "k1")


def held(ledger_id: str, size: int) -> LedgerRow:
    """A `full` row holding `size` bytes of original content."""
    content = "x" * size
    cut = Cut(1, (1,), "tool", "read", "trimmed", 3, content, "0" * 64, "r" * 12, size=size)
    return LedgerRow(ledger_id, "k1", NOW, NOW + 60, {"id": ledger_id}, (cut,), full=True)


async def test_originals_waiting_to_be_written_are_bounded_in_bytes() -> None:
    store = GatedStore()
    await store.open()
    queue = UsageQueue(store, max_ledger_bytes=1000)
    queue.submit(held("a", 600))
    queue.submit(held("b", 600))  # would hold 1,200 bytes: dropped and counted
    queue.submit(row("meta"))  # holds no content: always taken
    assert queue.dropped == 1
    assert queue.unwritten("b") is None
    assert queue.unwritten("meta") is not None
    await queue.start()
    store.gate.set()
    with anyio.fail_after(5):
        await store.wrote.wait()
    queue.submit(held("c", 900))  # "a" was written: its bytes are free again
    assert queue.unwritten("c") is not None
    await queue.close()
    assert orjson.loads(await store.read_ledger("c", "k1", NOW) or b"{}")["cuts"][0]["content"]
    await store.close()
