"""Usage records and the write queue that keeps the request path off the disk.

Every chat request the proxy answers becomes one `UsageRecord` — including those it refuses
itself (`outcome="rejected"`) — each summary call one more (`kind="summary"`), and each request
relayed by a passthrough route one (`kind="passthrough"`, counted apart from chat).
`UsageQueue.submit` never waits: records go to an in-memory queue, a background task writes
them in batches, and `close()` flushes what is left on shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from app.usage.ledger import LedgerRow

logger = logging.getLogger(__name__)

Outcome = Literal["completed", "client_disconnected", "upstream_error", "rejected"]
Kind = Literal["chat", "summary", "passthrough"]
# The compacting routes (a `chat` record's route says which API it spoke); records from before
# routes were recorded were all chat completions.
API_ROUTES = {
    "/v1/chat/completions": "chat",
    "/v1/responses": "responses",
    "/v1/messages": "messages",
}
APIS = tuple(API_ROUTES.values())


def api_of(route: str | None) -> str:
    """`chat`, `responses` or `messages`: the API a client request on a compacting route spoke."""
    return API_ROUTES.get(route or "", "chat")


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
    route: str | None = None  # the client's route (`/v1/chat/completions`, `/v1/responses`…)
    cache_write_tokens: int | None = None  # prompt tokens written to the cache (Anthropic)
    cost: float | None = None  # USD at list price (DESIGN.md §9); None: the model is unpriced
    baseline_cost: float | None = None  # USD the same request would have cost uncompacted


Item = UsageRecord | LedgerRow  # what the write queue carries


class UsageStore(Protocol):
    """Where usage records live (SQLite by default, PostgreSQL for several replicas)."""

    async def open(self) -> None: ...

    async def write_many(self, records: Sequence[UsageRecord]) -> None: ...

    async def totals(self) -> dict[str, Any]: ...

    async def activity(self, since: float, bucket: int, recent: int) -> dict[str, Any]:
        """`series`: usage in `bucket`-second buckets from `since`; `recent`: the last requests."""
        ...

    async def write_ledger(self, rows: Sequence[LedgerRow]) -> None:
        """Insert ledger rows (one already there is left as it is) and delete expired ones."""
        ...

    async def read_ledger(self, ledger_id: str, owner: str, now: float) -> bytes | None:
        """The JSON of the row with this id and owner that has not expired at `now`."""
        ...

    async def ping(self) -> bool: ...

    async def close(self) -> None: ...


# A write that follows the last one this closely (seconds) waits as long for more records: a
# transaction per record cost 0.3 ms of CPU per request at 64 concurrent clients on SQLite
# (`python -m bench --only load`), a batch a few µs per record.
LINGER = 0.02


class UsageQueue:
    """Batches records to the store in the background; loses nothing on a clean shutdown.

    While the store is down (a PostgreSQL restart, a locked disk) the writer keeps the batch in
    hand and retries with a capped backoff, so an outage costs no records as long as fewer than
    `max_pending` requests arrive meanwhile; past that, new records are counted in `dropped`
    rather than let memory grow without end. At shutdown the flush makes `retries` attempts per
    batch and counts what still fails in `failed`.

    Ledger rows (DESIGN.md §11) travel the same way; until one is written, `unwritten` finds it,
    so a client reads its ledger on this replica the moment its response has been sent. Rows
    that keep originals (`INFLIGHT_LEDGER=full`) also count their bytes: past
    `max_ledger_bytes` waiting, new ones are dropped and counted too.
    """

    def __init__(
        self,
        store: UsageStore,
        *,
        max_batch: int = 500,
        max_pending: int = 200_000,
        retries: int = 5,
        retry_delay: float = 0.2,
        max_backoff: float = 5.0,
        max_ledger_bytes: int = 256 * 1024 * 1024,
        linger: float = LINGER,
    ) -> None:
        self._store = store
        self._linger = linger
        self._last_write = float("-inf")
        self._max_ledger_bytes = max_ledger_bytes
        self._ledger_bytes = 0  # original contents held by the unwritten ledger rows
        self._queue: asyncio.Queue[Item] = asyncio.Queue(maxsize=max_pending)
        self._max_batch = max_batch
        self._retries = retries
        self._retry_delay = retry_delay
        self._max_backoff = max_backoff
        self._task: asyncio.Task[None] | None = None
        self._in_hand: list[Item] = []  # the batch being written, kept across retries
        self._unwritten: dict[str, LedgerRow] = {}  # ledger rows queued, not written yet
        self._idle = asyncio.Event()  # set while no write is in flight
        self._idle.set()
        self.written = 0
        self.failed = 0
        self.dropped = 0

    @property
    def depth(self) -> int:
        return self._queue.qsize() + len(self._in_hand)

    def unwritten(self, ledger_id: str) -> LedgerRow | None:
        """The ledger row with this id if it is queued and not written yet."""
        return self._unwritten.get(ledger_id)

    def submit(self, record: Item) -> None:
        try:
            if isinstance(record, LedgerRow):
                self._hold(record)
            self._queue.put_nowait(record)
        except asyncio.QueueFull:
            if isinstance(record, LedgerRow):
                self._release([record])
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 10_000 == 0:
                logger.error("usage queue full: %d records dropped so far", self.dropped)

    def _hold(self, row: LedgerRow) -> None:
        size = row.size
        if size and self._ledger_bytes + size > self._max_ledger_bytes:
            raise asyncio.QueueFull  # the originals waiting to be written would pass the bound
        self._ledger_bytes += size
        self._unwritten[row.id] = row

    def _release(self, items: Sequence[Item]) -> None:
        """Forget ledger rows written (or given up on)."""
        for item in items:
            if isinstance(item, LedgerRow) and self._unwritten.pop(item.id, None) is not None:
                self._ledger_bytes -= item.size

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="inflight-usage-writer")

    async def _run(self) -> None:
        while True:
            if not self._in_hand:
                self._in_hand = [await self._queue.get()]  # in hand: `close` writes it
                if time.monotonic() - self._last_write < self._linger:
                    # under steady traffic: let the records of the next few ms join this batch
                    # (one transaction, one worker-thread hop for all of them)
                    await asyncio.sleep(self._linger)
                self._in_hand = self._drain(self._in_hand[0])
            await self._write(attempts=None)
            self._last_write = time.monotonic()

    def _drain(self, first: Item) -> list[Item]:
        batch = [first]
        while len(batch) < self._max_batch:
            try:
                batch.append(self._queue.get_nowait())
            except asyncio.QueueEmpty:
                break
        return batch

    async def _write(self, attempts: int | None) -> bool:
        """Write the batch in hand: until it succeeds (`attempts=None`) or `attempts` times."""
        attempt = 0
        while True:
            self._idle.clear()
            try:
                await self._write_batch()
            except Exception as exc:  # noqa: BLE001 - any store failure: retry, then count it
                attempt += 1
                logger.warning(
                    "usage write of %d records failed (attempt %d): %s",
                    len(self._in_hand),
                    attempt,
                    exc,
                )
                if attempts is not None and attempt >= attempts:
                    return False
                await asyncio.sleep(min(self._retry_delay * 2 ** (attempt - 1), self._max_backoff))
            else:
                self._in_hand = []
                return True
            finally:
                self._idle.set()

    async def _write_batch(self) -> None:
        """Ledger rows first (idempotent: a retry after the records failed rewrites nothing),
        then the usage records."""
        rows = [item for item in self._in_hand if isinstance(item, LedgerRow)]
        records = [item for item in self._in_hand if not isinstance(item, LedgerRow)]
        if rows:
            await self._store.write_ledger(rows)
            self._release(rows)
        if records:
            await self._store.write_many(records)
        self.written += len(records)

    async def close(self) -> None:
        """Stop the writer and flush every queued record (a bounded number of attempts each)."""
        if self._task is not None:
            # A write in flight may finish in its thread even if cancelled: let it end first,
            # or its batch would be written twice (bounded: a hung store gets 30 s).
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), timeout=30)
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        while self._in_hand or not self._queue.empty():
            if not self._in_hand:
                self._in_hand = self._drain(self._queue.get_nowait())
            if not await self._write(attempts=self._retries):
                self.failed += len(self._in_hand)
                self._release(self._in_hand)
                logger.error(
                    "dropped %d usage records after %d attempts", len(self._in_hand), self._retries
                )
                self._in_hand = []
