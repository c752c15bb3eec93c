"""PostgreSQL usage store, for several replicas sharing one database (`postgresql://…`)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import psycopg

from inflight.errors import StoreUnavailable
from inflight.usage.costs import add_costs
from inflight.usage.ledger import LedgerRow, LedgerUpdate
from inflight.usage.records import UsageRecord
from inflight.usage.stores import sql

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT = 5  # seconds; a database that does not answer is unavailable, not awaited

# What a lost or refused connection raises (a restart, a network cut, a server shutting down).
LOST = (psycopg.OperationalError, psycopg.InterfaceError)


class PostgresStore:
    """`postgresql://…` or `postgres://…`.

    One connection, serialised by a lock (batches make that plenty), opened again (and the schema
    created, the first time) on the next call after it broke or could not be made: a database down
    at startup or restarted costs the calls made while it is down (a 503 for a read, a retry then
    the spill file for the write queue), never the store itself or the proxy's start.
    """

    def __init__(self, url: str) -> None:
        self._url = url
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._opened = False
        self._schema = False  # created or migrated by this process
        self._lock = asyncio.Lock()

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        return await psycopg.AsyncConnection.connect(
            self._url, autocommit=True, connect_timeout=CONNECT_TIMEOUT
        )

    async def open(self) -> None:
        """Connect and create or migrate the schema now if the database answers. One that is
        down (or not answering within `CONNECT_TIMEOUT`) is not awaited: the proxy starts, the
        first call that finds it back connects and creates the schema (until then reads raise
        `StoreUnavailable`, the write queue retries and spills, `/readyz` says not ready). libpq
        tells a refused login from a server that is down only in its message's text, so a
        wrong URL is reported the same way, not as a startup error."""
        if self._opened:
            return
        self._opened = True
        try:
            async with self._session():
                pass
        except StoreUnavailable as exc:
            logger.warning(
                "usage store unreachable at startup, connecting later: %s", exc.__cause__
            )

    async def _reach(self) -> psycopg.AsyncConnection[Any]:
        """A new connection; the first one made by this process creates or migrates the schema."""
        conn = await self._connect()
        if self._schema:
            return conn
        try:
            await self._create_schema(conn)
        except BaseException:
            await conn.close()
            raise
        self._schema = True
        return conn

    async def _create_schema(self, conn: psycopg.AsyncConnection[Any]) -> None:
        async with conn.transaction():
            # One replica at a time creates or migrates the schema.
            await conn.execute("SELECT pg_advisory_xact_lock(7241)")
            for statement in sql.CREATE:
                await conn.execute(statement)
            cursor = await conn.execute("SELECT MAX(version) FROM inflight_schema")
            row = await cursor.fetchone()
            version = row[0] if row is not None else None
            if version is None:
                await conn.execute(
                    "INSERT INTO inflight_schema (version) VALUES (%s)", (sql.SCHEMA_VERSION,)
                )
            for statement in [*sql.migrations_from(version or sql.SCHEMA_VERSION), *sql.INDEXES]:
                await conn.execute(statement)
            await conn.execute(sql.delete_expired_sql("%s"), (time.time(),))

    @asynccontextmanager
    async def _session(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """The connection, alone (opened again if it broke); a lost connection is dropped and
        the call raises `StoreUnavailable`."""
        if not self._opened:
            raise RuntimeError("store not open")
        async with self._lock:
            try:
                if self._conn is None or self._conn.closed or self._conn.broken:
                    await self._discard()
                    self._conn = await self._reach()
                yield self._conn
            except LOST as exc:
                await self._discard()
                raise StoreUnavailable("the usage store is unavailable") from exc

    async def _discard(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.closed:
            await conn.close()

    async def write_many(self, records: Sequence[UsageRecord]) -> None:
        async with self._session() as conn, conn.transaction(), conn.cursor() as cursor:
            await cursor.executemany(sql.insert_sql("%s"), sql.rows(records))

    async def write_ledger(self, rows: Sequence[LedgerRow | LedgerUpdate]) -> None:
        inserts = sql.ledger_inserts(rows)
        values = await asyncio.to_thread(sql.ledger_rows, inserts)  # full originals: MBs of JSON
        updates = sql.ledger_updates(rows)
        async with self._session() as conn, conn.transaction(), conn.cursor() as cursor:
            await cursor.execute(sql.delete_expired_sql("%s"), (time.time(),))
            if values:
                await cursor.executemany(sql.insert_ledger_sql("%s"), values)
            if updates:
                await cursor.executemany(sql.update_ledger_sql("%s"), updates)

    async def read_ledger(self, ledger_id: str, owner: str, now: float) -> bytes | None:
        async with self._session() as conn:
            cursor = await conn.execute(sql.read_ledger_sql("%s"), (ledger_id, owner, now))
            found = await cursor.fetchone()
        return None if found is None else sql.ledger_document(found)

    async def totals(self) -> dict[str, Any]:
        async with self._session() as conn:
            groups = await (await conn.execute(sql.TOTALS)).fetchall()
            strategies = await (await conn.execute(sql.STRATEGIES)).fetchall()
            recent = await (await conn.execute(sql.RECENT)).fetchall()
            costs = await (await conn.execute(sql.COSTS)).fetchall()
            ledger = await (await conn.execute(sql.LEDGER_TOTALS)).fetchone()
        return sql.add_ledger(add_costs(sql.summarize(groups, strategies, recent), costs), ledger)

    async def activity(self, since: float, bucket: int, recent: int) -> dict[str, Any]:
        series = sql.series_sql("%s", "FLOOR(ts / %s) * %s")
        latest = sql.RECENT_REQUESTS.format(placeholder="%s")
        async with self._session() as conn:
            buckets = await (await conn.execute(series, (bucket, bucket, since))).fetchall()
            rows = await (await conn.execute(latest, (recent,))).fetchall()
        return sql.activity(buckets, rows)

    async def ping(self) -> bool:
        try:
            async with self._session() as conn:
                await conn.execute("SELECT 1")
        except (psycopg.Error, StoreUnavailable, RuntimeError):
            return False
        return True

    async def close(self) -> None:
        async with self._lock:
            await self._discard()
        self._opened = False
