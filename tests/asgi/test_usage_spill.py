"""Nothing lost while the store is down (DESIGN.md §6): the write queue spills what the store
refuses past its bound to a JSON-lines file and writes it when the store is back (or at the
next start), each record once (idempotent inserts by record id); `/stats` answers 503."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path

import anyio
import httpx
import orjson
import pytest

from inflight.factory import create_app
from inflight.usage.records import Item, UsageQueue
from inflight.usage.stores.spill import SpillFile
from inflight.usage.stores.sqlite import SQLiteStore
from tests.conftest import make_settings
from tests.e2e.test_ledger_store import NOW, row
from tests.e2e.test_usage import record

pytestmark = pytest.mark.anyio


class WatchedSpill(SpillFile):
    """A spill file a test can wait on: items appended, replays finished."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.lines = 0
        self.replayed = threading.Event()
        self._appended = threading.Condition()

    def append(self, items: Sequence[Item]) -> None:
        super().append(items)
        with self._appended:
            self.lines += len(items)
            self._appended.notify_all()

    def done(self, path: Path) -> None:
        super().done(path)
        self.replayed.set()

    async def holds(self, count: int) -> None:
        def wait() -> None:
            with self._appended:
                assert self._appended.wait_for(lambda: self.lines >= count, 5), self.lines

        await anyio.to_thread.run_sync(wait)

    async def written(self) -> None:
        assert await anyio.to_thread.run_sync(self.replayed.wait, 5), "not replayed"


async def set_max_pages(store: SQLiteStore, pages: int) -> None:
    """A full disk, or room again: SQLite refuses to grow the file past `pages`."""
    await anyio.to_thread.run_sync(
        store._run, lambda conn: conn.execute(f"PRAGMA max_page_count = {pages}")
    )


async def count(store: SQLiteStore, sql: str) -> int:
    found = await anyio.to_thread.run_sync(store._run, lambda conn: conn.execute(sql).fetchone())
    return int(found[0])


async def test_a_full_disk_spills_and_the_file_is_written_once_the_store_takes_it(
    tmp_path: Path,
) -> None:
    store = SQLiteStore(f"sqlite:///{tmp_path / 'u.db'}")
    await store.open()
    spill = WatchedSpill(tmp_path / "spill.jsonl")
    queue = UsageQueue(store, spill=spill, spill_after=0.05, retry_delay=0.001, max_backoff=0.01)
    pages = await count(store, "PRAGMA page_count")
    await set_max_pages(store, pages)  # full: no insert finds a page
    await queue.start()
    for i in range(300):
        queue.submit(record(i))
    queue.submit(row("l1", content="x" * 5000))
    await spill.holds(301)
    assert queue.depth == 0  # nothing waits in memory: a kill now loses none of them
    assert queue.unwritten("l1") is None  # in the file now, not in memory
    assert await count(store, "SELECT COUNT(*) FROM inflight_usage") == 0
    await set_max_pages(store, 1_000_000)  # room again
    queue.submit(record(300))  # the next write succeeds, then the file is written
    await spill.written()
    await queue.close()
    assert await count(store, "SELECT COUNT(*) FROM inflight_usage") == 301
    assert await count(store, "SELECT COUNT(DISTINCT request_id) FROM inflight_usage") == 301
    ledger = await store.read_ledger("l1", "k1", NOW)
    assert ledger is not None
    assert orjson.loads(ledger)["content"] == "x" * 5000  # the document as it was rendered
    assert (queue.failed, queue.dropped, queue.spilled, queue.replayed) == (0, 0, 301, 301)
    assert not spill.pending()
    await store.close()


async def test_a_spill_file_left_by_a_killed_process_is_written_at_start(tmp_path: Path) -> None:
    """Also the `.replay` file of a replay cut short, whose records may be in the store already,
    and a last line cut short by the kill."""
    records = [record(i) for i in range(10)]
    spill = WatchedSpill(tmp_path / "spill.jsonl")
    store = SQLiteStore(f"sqlite:///{tmp_path / 'u.db'}")
    await store.open()
    await store.write_many(records[:3])  # a replay that got this far before the kill
    SpillFile(tmp_path / "spill.jsonl").append(records[:6])
    assert spill.take() == spill.replaying
    SpillFile(tmp_path / "spill.jsonl").append(records[6:])
    with spill.path.open("ab") as f:
        f.write(b'{"usage": {"ts": 1')  # an append the kill cut short
    queue = UsageQueue(store, spill=spill)
    await queue.start()
    await spill.written()
    await queue.close()
    ids = await anyio.to_thread.run_sync(
        store._run, lambda conn: conn.execute("SELECT request_id FROM inflight_usage").fetchall()
    )
    assert sorted(r[0] for r in ids) == sorted(r.request_id for r in records)
    assert queue.replayed == 10
    assert not spill.pending()
    await store.close()


async def test_a_record_written_twice_is_stored_once(tmp_path: Path) -> None:
    """A retry after a lost acknowledgement, a spill file replayed twice."""
    store = SQLiteStore(f"sqlite:///{tmp_path / 'u.db'}")
    await store.open()
    records = [record(i) for i in range(5)]
    await store.write_many(records)
    await store.write_many(records)
    assert (await store.totals())["requests"] == 5
    await store.close()


async def test_stats_answer_503_when_the_store_cannot_be_read(tmp_path: Path) -> None:
    app = create_app(make_settings(tmp_path))
    async with app.router.lifespan_context(app):
        # any SQLite error at read time (a locked or unreadable file) stands for the others
        with sqlite3.connect(tmp_path / "usage.db") as conn:
            conn.execute("DROP TABLE inflight_usage")
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as client:
            stats = await client.get("/stats")
    assert stats.status_code == 503
    assert stats.json()["error"]["code"] == "store_unavailable"
