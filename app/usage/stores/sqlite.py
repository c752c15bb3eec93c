"""SQLite usage store (the default): one file, WAL, blocking calls kept off the event loop."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Sequence
from typing import Any

from inflight.errors import StoreUnavailable
from inflight.usage.costs import add_costs
from inflight.usage.ledger import LedgerRow, LedgerUpdate
from inflight.usage.records import UsageRecord
from inflight.usage.stores import sql


class SQLiteStore:
    """`sqlite:///relative.db`, `sqlite:////absolute.db` or `sqlite:///:memory:`."""

    def __init__(self, url: str) -> None:
        path = url.removeprefix("sqlite:///")
        self._path = path or ":memory:"
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()

    def _open(self) -> None:
        if self._conn is not None:
            return
        conn = sqlite3.connect(self._path, check_same_thread=False, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA busy_timeout=5000")
        conn.execute("BEGIN IMMEDIATE")  # one process at a time creates or migrates the schema
        try:
            for statement in sql.CREATE:
                conn.execute(statement)
            row = conn.execute("SELECT MAX(version) FROM inflight_schema").fetchone()
            if row[0] is None:
                conn.execute(
                    "INSERT INTO inflight_schema (version) VALUES (?)", (sql.SCHEMA_VERSION,)
                )
            for statement in [*sql.migrations_from(row[0] or sql.SCHEMA_VERSION), *sql.INDEXES]:
                conn.execute(statement)
            conn.execute(sql.delete_expired_sql("?"), (time.time(),))
            conn.execute("COMMIT")
        except sqlite3.Error:
            conn.execute("ROLLBACK")
            conn.close()
            raise
        self._conn = conn

    async def open(self) -> None:
        await asyncio.to_thread(self._open)

    def _run(self, work: Any) -> Any:
        with self._lock:
            assert self._conn is not None, "store not open"
            try:
                return work(self._conn)
            except sqlite3.OperationalError as exc:  # locked, full, I/O error: not the request
                raise StoreUnavailable(f"the usage store is unavailable: {exc}") from exc

    async def write_many(self, records: Sequence[UsageRecord]) -> None:
        def write(conn: sqlite3.Connection) -> None:
            with conn:
                conn.execute("BEGIN")
                conn.executemany(sql.insert_sql("?"), sql.rows(records))

        await asyncio.to_thread(self._run, write)

    async def write_ledger(self, rows: Sequence[LedgerRow | LedgerUpdate]) -> None:
        def write(conn: sqlite3.Connection) -> None:
            values = sql.ledger_rows(sql.ledger_inserts(rows))
            with conn:
                conn.execute("BEGIN")
                conn.execute(sql.delete_expired_sql("?"), (time.time(),))
                conn.executemany(sql.insert_ledger_sql("?"), values)
                conn.executemany(sql.update_ledger_sql("?"), sql.ledger_updates(rows))

        await asyncio.to_thread(self._run, write)

    async def read_ledger(self, ledger_id: str, owner: str, now: float) -> bytes | None:
        def read(conn: sqlite3.Connection) -> bytes | None:
            found = conn.execute(sql.read_ledger_sql("?"), (ledger_id, owner, now)).fetchone()
            return None if found is None else sql.ledger_document(found)

        result: bytes | None = await asyncio.to_thread(self._run, read)
        return result

    async def totals(self) -> dict[str, Any]:
        def read(conn: sqlite3.Connection) -> dict[str, Any]:
            stats = sql.summarize(
                conn.execute(sql.TOTALS).fetchall(),
                conn.execute(sql.STRATEGIES).fetchall(),
                conn.execute(sql.RECENT).fetchall(),
            )
            add_costs(stats, conn.execute(sql.COSTS).fetchall())
            return sql.add_ledger(stats, conn.execute(sql.LEDGER_TOTALS).fetchone())

        result: dict[str, Any] = await asyncio.to_thread(self._run, read)
        return result

    async def activity(self, since: float, bucket: int, recent: int) -> dict[str, Any]:
        def read(conn: sqlite3.Connection) -> dict[str, Any]:
            series = sql.series_sql("?", "CAST(ts / ? AS INTEGER) * ?")
            return sql.activity(
                conn.execute(series, (bucket, bucket, since)).fetchall(),
                conn.execute(sql.RECENT_REQUESTS.format(placeholder="?"), (recent,)).fetchall(),
            )

        result: dict[str, Any] = await asyncio.to_thread(self._run, read)
        return result

    async def ping(self) -> bool:
        def probe(conn: sqlite3.Connection) -> bool:
            return bool(conn.execute("SELECT 1").fetchone() == (1,))

        try:
            return bool(await asyncio.to_thread(self._run, probe))
        except (sqlite3.Error, StoreUnavailable, AssertionError):
            return False

    async def close(self) -> None:
        def shut() -> None:
            with self._lock:
                if self._conn is not None:
                    self._conn.close()
                    self._conn = None

        await asyncio.to_thread(shut)
