"""Usage records and the write queue that keeps the request path off the disk.

Every proxied chat request becomes one `UsageRecord` (and each summary call one more, with
`kind="summary"`). `UsageQueue.submit` never waits: records go to an in-memory queue, a
background task writes them in batches, and `close()` flushes what is left on shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

logger = logging.getLogger(__name__)

Outcome = Literal["completed", "client_disconnected", "upstream_error"]
Kind = Literal["chat", "summary"]


@dataclass(frozen=True, slots=True)
class UsageRecord:
    """One proxied request (or one summary call) as it ended."""

    ts: float
    request_id: str
    kind: Kind
    model: str
    client_key_id: str | None
    stream: bool
    status: int
    outcome: Outcome
    latency_ms: float
    ttfb_ms: float | None
    prompt_tokens: int | None
    completion_tokens: int | None
    cached_tokens: int | None
    tokens_before: int
    tokens_after: int
    strategies: tuple[str, ...]
    context_limit: int | None


class UsageStore(Protocol):
    """Where usage records live (SQLite by default, PostgreSQL for several replicas)."""

    async def open(self) -> None: ...

    async def write_many(self, records: Sequence[UsageRecord]) -> None: ...

    async def totals(self) -> dict[str, Any]: ...

    async def ping(self) -> bool: ...

    async def close(self) -> None: ...


class UsageQueue:
    """Batches records to the store in the background; loses nothing on a clean shutdown."""

    def __init__(
        self,
        store: UsageStore,
        *,
        max_batch: int = 500,
        retries: int = 5,
        retry_delay: float = 0.2,
    ) -> None:
        self._store = store
        self._queue: asyncio.Queue[UsageRecord] = asyncio.Queue()
        self._max_batch = max_batch
        self._retries = retries
        self._retry_delay = retry_delay
        self._task: asyncio.Task[None] | None = None
        self.written = 0
        self.failed = 0

    @property
    def depth(self) -> int:
        return self._queue.qsize()

    def submit(self, record: UsageRecord) -> None:
        self._queue.put_nowait(record)

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="inflight-usage-writer")

    async def _run(self) -> None:
        while True:
            first = await self._queue.get()
            await self._write(self._drain(first))

    def _drain(self, first: UsageRecord) -> list[UsageRecord]:
        batch = [first]
        while len(batch) < self._max_batch:
            try:
                batch.append(self._queue.get_nowait())
            except asyncio.QueueEmpty:
                break
        return batch

    async def _write(self, batch: list[UsageRecord]) -> None:
        for attempt in range(self._retries):
            try:
                await self._store.write_many(batch)
            except Exception as exc:  # noqa: BLE001 - any store failure: retry, then count it
                logger.warning(
                    "usage write of %d records failed (attempt %d): %s",
                    len(batch),
                    attempt + 1,
                    exc,
                )
                await asyncio.sleep(self._retry_delay * (attempt + 1))
            else:
                self.written += len(batch)
                return
        self.failed += len(batch)
        logger.error("dropped %d usage records after %d attempts", len(batch), self._retries)

    async def close(self) -> None:
        """Stop the writer and flush every queued record."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        while not self._queue.empty():
            await self._write(self._drain(self._queue.get_nowait()))
