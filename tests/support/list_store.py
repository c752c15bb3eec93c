"""A usage store that keeps records in a list (no database), which a test thread can wait on."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from inflight.usage.records import UsageRecord


class ListStore:
    """Keeps the records it is given; `wait_for` waits (bounded) until enough have come."""

    def __init__(self) -> None:
        self.records: list[UsageRecord] = []
        self._written = threading.Condition()

    async def open(self) -> None:
        return None

    async def write_many(self, records: Sequence[UsageRecord]) -> None:
        with self._written:
            self.records.extend(records)
            self._written.notify_all()

    async def write_ledger(self, rows: Any) -> None:
        return None

    async def totals(self) -> dict[str, Any]:
        return {}

    async def ping(self) -> bool:
        return True

    async def close(self) -> None:
        return None

    def wait_for(self, count: int, timeout: float = 10.0) -> list[UsageRecord]:
        with self._written:
            if not self._written.wait_for(lambda: len(self.records) >= count, timeout):
                raise AssertionError(f"{len(self.records)} usage records, expected {count}")
            return list(self.records)
