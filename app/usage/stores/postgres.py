"""PostgreSQL usage store, for several replicas sharing one database (`postgresql://…`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import psycopg

from app.pricing.report import add_costs
from app.usage.ledger import LedgerRow
from app.usage.records import UsageRecord
from app.usage.stores import sql


class PostgresStore:
    """One async connection, serialised by a lock; batches make that plenty."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._lock = asyncio.Lock()

    async def open(self) -> None:
        if self._conn is not None:
            return
        self._conn = await psycopg.AsyncConnection.connect(self._url, autocommit=True)
        async with self._lock, self._conn.transaction():
            # One replica at a time creates or migrates the schema.
            await self._conn.execute("SELECT pg_advisory_xact_lock(7241)")
            for statement in sql.CREATE:
                await self._conn.execute(statement)
            cursor = await self._conn.execute("SELECT MAX(version) FROM inflight_schema")
            row = await cursor.fetchone()
            version = row[0] if row is not None else None
            if version is None:
                await self._conn.execute(
                    "INSERT INTO inflight_schema (version) VALUES (%s)", (sql.SCHEMA_VERSION,)
                )
            for statement in sql.migrations_from(version or sql.SCHEMA_VERSION):
                await self._conn.execute(statement)
            await self._conn.execute(sql.delete_expired_sql("%s"), (time.time(),))

    def _connection(self) -> psycopg.AsyncConnection[Any]:
        if self._conn is None:
            raise RuntimeError("store not open")
        return self._conn

    async def write_many(self, records: Sequence[UsageRecord]) -> None:
        conn = self._connection()
        async with self._lock, conn.transaction(), conn.cursor() as cursor:
            await cursor.executemany(sql.insert_sql("%s"), sql.rows(records))

    async def write_ledger(self, rows: Sequence[LedgerRow]) -> None:
        values = await asyncio.to_thread(sql.ledger_rows, rows)  # full originals: MBs of JSON
        conn = self._connection()
        async with self._lock, conn.transaction(), conn.cursor() as cursor:
            await cursor.execute(sql.delete_expired_sql("%s"), (time.time(),))
            await cursor.executemany(sql.insert_ledger_sql("%s"), values)

    async def read_ledger(self, ledger_id: str, owner: str, now: float) -> bytes | None:
        conn = self._connection()
        async with self._lock:
            cursor = await conn.execute(sql.read_ledger_sql("%s"), (ledger_id, owner, now))
            found = await cursor.fetchone()
        return None if found is None else str(found[0]).encode()

    async def totals(self) -> dict[str, Any]:
        conn = self._connection()
        async with self._lock:
            groups = await (await conn.execute(sql.TOTALS)).fetchall()
            strategies = await (await conn.execute(sql.STRATEGIES)).fetchall()
            recent = await (await conn.execute(sql.RECENT)).fetchall()
            costs = await (await conn.execute(sql.COSTS)).fetchall()
        return add_costs(sql.summarize(groups, strategies, recent), costs)

    async def activity(self, since: float, bucket: int, recent: int) -> dict[str, Any]:
        conn = self._connection()
        series = sql.series_sql("%s", "FLOOR(ts / %s) * %s")
        latest = sql.RECENT_REQUESTS.format(placeholder="%s")
        async with self._lock:
            buckets = await (await conn.execute(series, (bucket, bucket, since))).fetchall()
            rows = await (await conn.execute(latest, (recent,))).fetchall()
        return sql.activity(buckets, rows)

    async def ping(self) -> bool:
        try:
            async with self._lock:
                await self._connection().execute("SELECT 1")
        except (psycopg.Error, RuntimeError):
            return False
        return True

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()
            self._conn = None
