"""`INFLIGHT_DATABASE_URL=none`: usage is not stored (metrics still count it)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from inflight.usage.costs import add_costs
from inflight.usage.ledger import LedgerRow, LedgerUpdate
from inflight.usage.records import UsageRecord
from inflight.usage.stores.sql import activity, add_ledger, summarize


class NullStore:
    """Discards records; `/stats` then shows zero totals."""

    async def open(self) -> None:
        return None

    async def write_many(self, records: Sequence[UsageRecord]) -> None:
        return None

    async def write_ledger(self, rows: Sequence[LedgerRow | LedgerUpdate]) -> None:
        return None  # the ledger is off with this store (`ledger_mode`)

    async def read_ledger(self, ledger_id: str, owner: str, now: float) -> bytes | None:
        return None

    async def totals(self) -> dict[str, Any]:
        return add_ledger(add_costs(summarize([], [], []), []), None)

    async def activity(self, since: float, bucket: int, recent: int) -> dict[str, Any]:
        return activity([], [])

    async def ping(self) -> bool:
        return True

    async def close(self) -> None:
        return None
