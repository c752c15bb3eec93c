"""Usage stores: `open_store(url)` picks SQLite, PostgreSQL, or `none` (recording off) from
`INFLIGHT_DATABASE_URL`."""

from __future__ import annotations

from pathlib import Path

from inflight.usage.records import UsageStore
from inflight.usage.stores.spill import SpillFile


def open_store(url: str) -> UsageStore:
    if url == "none":
        from inflight.usage.stores.null import NullStore

        return NullStore()
    if url.startswith("sqlite:///"):
        from inflight.usage.stores.sqlite import SQLiteStore

        return SQLiteStore(url)
    if url.startswith(("postgresql://", "postgres://")):
        from inflight.usage.stores.postgres import PostgresStore

        return PostgresStore(url)
    raise ValueError(f"unsupported database URL scheme: {url.split(':', 1)[0]}")


def spill_file(database_url: str, configured: Path | None) -> SpillFile | None:
    """The spill file of the write queue (None when usage is not stored): `configured`, else
    `<file>.spill.jsonl` next to a SQLite file, else `./inflight-usage-spill.jsonl`."""
    if database_url == "none":
        return None
    if configured is not None:
        return SpillFile(configured)
    path = database_url.removeprefix("sqlite:///") if database_url.startswith("sqlite:") else ""
    if path and path != ":memory:":
        return SpillFile(Path(path).with_name(Path(path).name + ".spill.jsonl"))
    return SpillFile(Path("inflight-usage-spill.jsonl"))
