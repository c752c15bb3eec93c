"""Usage stores: `open_store(url)` picks SQLite, PostgreSQL, or `none` (recording off) from
`INFLIGHT_DATABASE_URL`."""

from __future__ import annotations

from app.usage.records import UsageStore


def open_store(url: str) -> UsageStore:
    if url == "none":
        from app.usage.stores.null import NullStore

        return NullStore()
    if url.startswith("sqlite:///"):
        from app.usage.stores.sqlite import SQLiteStore

        return SQLiteStore(url)
    if url.startswith(("postgresql://", "postgres://")):
        from app.usage.stores.postgres import PostgresStore

        return PostgresStore(url)
    raise ValueError(f"unsupported database URL scheme: {url.split(':', 1)[0]}")
