"""Usage records and the write queue that keeps the request path off the disk."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from inflight.compaction.cost_mode import CutFor
from inflight.usage.ledger import LedgerRow, LedgerUpdate

if TYPE_CHECKING:
    from inflight.usage.stores.spill import SpillFile

logger = logging.getLogger(__name__)

Outcome = Literal["completed", "client_disconnected", "upstream_error", "rejected"]
Kind = Literal["chat", "summary", "passthrough"]
# Records from before routes were recorded were all chat completions.
LEGACY_ROUTE = "/v1/chat/completions"


def api_route(route: str | None) -> str:
    """The compacting route a `chat` record came by (`LEGACY_ROUTE` for one without)."""
    return route or LEGACY_ROUTE


def api_entry() -> dict[str, int]:
    """One API's line of `/stats` `apis`, before any request."""
    return {"requests": 0, "tokens_in": 0, "tokens_out": 0, "tokens_cached": 0}


def name_apis(stats: dict[str, Any], names: Mapping[str, str]) -> dict[str, Any]:
    """`stats` with its `apis` table keyed by API name (`names`: route -> name, from the API
    registry) instead of route, every named API present; a route no name knows keeps its own."""
    by_route: Mapping[str, dict[str, int]] = stats.get("apis", {})
    named = {name: api_entry() for name in names.values()}
    for route, entry in by_route.items():
        named[names.get(route, route)] = entry
    return {**stats, "apis": named}


@dataclass(frozen=True, slots=True)
class OneRound:
    """A request that took several upstream rounds (restore) as one round: the first round's
    prompt and cache counts, the last round's answer. The baseline prices one uncompacted
    round; the others are costs of inflight."""

    prompt_tokens: int | None
    cached_tokens: int | None
    cache_write_tokens: int | None
    completion_tokens: int | None


@dataclass(frozen=True, slots=True)
class UsageRecord:
    """One proxied request (or one summary call) as it ended.

    Every chat request the proxy answers becomes one — including those it refuses itself
    (`outcome="rejected"`) — each summary call one more (`kind="summary"`), and each request relayed
    by a passthrough route one (`kind="passthrough"`, counted apart from chat).
    """

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
    one_round: OneRound | None = None  # restore's rounds as one, until priced (not stored)
    # why compaction changed the request (DESIGN.md §16): to fit the window, or for cost only
    # (cost mode cut a history the window held); None: it changed nothing
    cut_for: CutFor | None = None
    # The record's own id (a request's summary calls share its `request_id`): a record written
    # twice (a retry after a lost acknowledgement, a spill replayed) is stored once.
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    # Not stored: the request's ledger row (`X-Compaction-Id`) and its plan's compaction events
    # (a new event, or the last one carried forward), for the realised net (DESIGN.md §16) ...
    ledger_id: str | None = None
    events: int = 0
    client: str = ""  # who sent it (`credentials.client_identity`): whose events it carries
    # ... and once priced, the update of the conversation's last event's row it makes
    realised: LedgerUpdate | None = None


Item = UsageRecord | LedgerRow | LedgerUpdate  # what the write queue carries


class UsageStore(Protocol):
    """Where usage records live (SQLite by default, PostgreSQL for several replicas)."""

    async def open(self) -> None: ...

    async def write_many(self, records: Sequence[UsageRecord]) -> None: ...

    async def totals(self) -> dict[str, Any]: ...

    async def activity(self, since: float, bucket: int, recent: int) -> dict[str, Any]:
        """`series`: usage in `bucket`-second buckets from `since`; `recent`: the last requests."""
        ...

    async def write_ledger(self, rows: Sequence[LedgerRow | LedgerUpdate]) -> None:
        """Insert ledger rows (one already there is left as it is), then apply the updates in
        order (one of a row not there changes nothing), and delete expired rows."""
        ...

    async def read_ledger(self, ledger_id: str, owner: str, now: float) -> bytes | None:
        """The JSON of the row with this id and owner that has not expired at `now`, its late
        fields (`LATE_FIELDS`) included."""
        ...

    async def ping(self) -> bool: ...

    async def close(self) -> None: ...


# A write that follows the last one this closely (seconds) waits as long for more records: a
# transaction per record costs far more CPU under concurrent clients than a batch
# (`python -m bench --only load`).
LINGER = 0.02


class UsageQueue:
    """`submit` never waits: records go to an in-memory queue, a background task writes them in
    batches, spills to a file what the store cannot take in time, and `close()` flushes what is left
    on shutdown.

    Batches records to the store in the background; loses nothing on a clean shutdown.

    While the store is down (a PostgreSQL restart, a locked or full disk) the writer keeps the
    batch in hand and retries with a capped backoff. With a `spill` file, a batch still failing
    after `spill_after` seconds (or sooner, once half of `max_pending` records wait behind it)
    is appended to the file with everything queued, and the file is written to the store again
    after the next write that succeeds (and when the writer starts): records wait in memory for
    at most about `spill_after` seconds, and an outage of any length loses none of them. Without
    a spill file an outage costs nothing as long as fewer than `max_pending` records arrive
    meanwhile. Past `max_pending` waiting, new records are counted in `dropped` rather than let
    memory grow without end. At shutdown the flush makes `retries` attempts per batch, spills
    what still fails, and counts in `failed` what could not even be spilled.

    Ledger rows (DESIGN.md §11) travel the same way; until one is written (or spilled),
    `unwritten` finds it, so a client reads its ledger on this replica the moment its response
    has been sent. Rows that keep originals (`INFLIGHT_LEDGER=full`) also count their bytes:
    past `max_ledger_bytes` waiting, new ones are dropped and counted too. Updates of ledger
    rows (`LedgerUpdate`, also carried by a record as its `realised`) follow their rows; until
    written, `pending_update` finds what they set.
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
        spill: SpillFile | None = None,
        spill_after: float = 10.0,
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
        self._spill = spill
        self._spill_after = spill_after
        self._crowd = max(1, max_pending // 2)  # this many waiting: spill without waiting more
        self._crowded = asyncio.Event()
        self._spilled = False  # the spill file may hold items to replay
        self._task: asyncio.Task[None] | None = None
        self._in_hand: list[Item] = []  # the batch being written, kept across retries
        self._unwritten: dict[str, LedgerRow] = {}  # ledger rows queued, not written yet
        # what the updates queued and not written yet set, per row, and how many they are
        self._updates: dict[str, tuple[LedgerUpdate, int]] = {}
        self._idle = asyncio.Event()  # set while no write is in flight
        self._idle.set()
        self.written = 0
        self.failed = 0
        self.dropped = 0
        self.spilled = 0  # items appended to the spill file
        self.replayed = 0  # items read back from it and written

    @property
    def depth(self) -> int:
        return self._queue.qsize() + len(self._in_hand)

    def unwritten(self, ledger_id: str) -> LedgerRow | None:
        """The ledger row with this id if it is queued and not written yet."""
        return self._unwritten.get(ledger_id)

    def pending_update(self, ledger_id: str) -> LedgerUpdate | None:
        """What the updates of this ledger row queued and not written yet set, if any."""
        held = self._updates.get(ledger_id)
        return None if held is None else held[0]

    def submit(self, record: Item) -> None:
        self._put(record)
        if isinstance(record, UsageRecord) and record.realised is not None:
            self._put(record.realised)  # after the record: its row's update

    def _put(self, record: Item) -> None:
        try:
            if isinstance(record, LedgerRow):
                self._hold(record)
            self._queue.put_nowait(record)
            if isinstance(record, LedgerUpdate):
                was, count = self._updates.get(record.id, (None, 0))
                self._updates[record.id] = (record.over(was), count + 1)
        except asyncio.QueueFull:
            if isinstance(record, LedgerRow):
                self._release([record])
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 10_000 == 0:
                logger.error("usage queue full: %d records dropped so far", self.dropped)
        if self._queue.qsize() >= self._crowd:
            self._crowded.set()

    def _hold(self, row: LedgerRow) -> None:
        size = row.size
        if size and self._ledger_bytes + size > self._max_ledger_bytes:
            raise asyncio.QueueFull  # the originals waiting to be written would pass the bound
        self._ledger_bytes += size
        self._unwritten[row.id] = row

    def _release(self, items: Sequence[Item]) -> None:
        """Forget ledger rows and updates written, spilled (or given up on)."""
        for item in items:
            if isinstance(item, LedgerRow) and self._unwritten.pop(item.id, None) is not None:
                self._ledger_bytes -= item.size
            elif isinstance(item, LedgerUpdate) and item.id in self._updates:
                update, count = self._updates[item.id]
                if count > 1:
                    self._updates[item.id] = (update, count - 1)
                else:
                    del self._updates[item.id]

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="inflight-usage-writer")

    async def _run(self) -> None:
        if self._spill is not None:  # a spill file left by an earlier run: written first
            self._spilled = await asyncio.to_thread(self._spill.pending)
            if self._spilled:
                await self._replay()
        while True:
            if not self._in_hand:
                first = await self._next(self._spill_after if self._spilled else None)
                if first is None:  # idle with a spill file: try it again
                    await self._replay()
                    continue
                self._in_hand = [first]  # in hand: `close` writes it
                if time.monotonic() - self._last_write < self._linger:
                    # under steady traffic: let the records of the next few ms join this batch
                    # (one transaction, one worker-thread hop for all of them)
                    await asyncio.sleep(self._linger)
                self._in_hand = self._drain(self._in_hand[0])
            await self._write_or_spill()
            self._last_write = time.monotonic()

    async def _next(self, within: float | None) -> Item | None:
        """The next queued item; None if none came `within` seconds."""
        try:
            return await asyncio.wait_for(self._queue.get(), within)
        except TimeoutError:
            return None

    def _drain(self, first: Item) -> list[Item]:
        batch = [first]
        while len(batch) < self._max_batch:
            try:
                batch.append(self._queue.get_nowait())
            except asyncio.QueueEmpty:
                break
        return batch

    def _take_all(self) -> list[Item]:
        items: list[Item] = []
        while not self._queue.empty():
            items.append(self._queue.get_nowait())
        return items

    async def _write_or_spill(self) -> None:
        """Write the batch in hand, retrying until it succeeds or, with a spill file, until it
        is time to spill it (and the queue behind it)."""
        attempt = 0
        spill_at = time.monotonic() + self._spill_after
        watch_crowd = True
        while not await self._attempt(attempt):
            attempt += 1
            if self._spill is not None:
                due = time.monotonic() >= spill_at or (watch_crowd and self._crowded.is_set())
                if due and await self._spill_held():
                    return
                if due:  # the spill file failed too: keep retrying, spill again later
                    spill_at = time.monotonic() + self._spill_after
                    watch_crowd = False
            delay = min(self._retry_delay * 2 ** (attempt - 1), self._max_backoff)
            if self._spill is not None:
                delay = min(delay, max(0.0, spill_at - time.monotonic()))
            await self._pause(delay, watch_crowd and self._spill is not None)
        if self._spilled:
            await self._replay()

    async def _pause(self, delay: float, crowd: bool) -> None:
        """Sleep `delay` seconds, or less if the queue gets crowded (when `crowd`)."""
        if not crowd:
            await asyncio.sleep(delay)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._crowded.wait(), delay)

    async def _attempt(self, failures: int) -> bool:
        """One attempt at writing the batch in hand (True: written)."""
        self._idle.clear()
        try:
            await self._write_items(self._in_hand)
        except Exception as exc:  # noqa: BLE001 - any store failure: retry, then spill or count it
            logger.warning(
                "usage write of %d records failed (attempt %d): %s",
                len(self._in_hand),
                failures + 1,
                exc,
            )
            return False
        else:
            self._in_hand = []
            return True
        finally:
            self._idle.set()

    async def _write(self, attempts: int) -> bool:
        """Write the batch in hand, at most `attempts` times."""
        for attempt in range(attempts):
            if await self._attempt(attempt):
                return True
            if attempt + 1 < attempts:
                await asyncio.sleep(min(self._retry_delay * 2**attempt, self._max_backoff))
        return False

    async def _write_items(self, items: Sequence[Item]) -> None:
        """Ledger rows and their updates first (idempotent: a retry after the records failed
        rewrites nothing), then the usage records (idempotent too, by their ids)."""
        rows = [item for item in items if not isinstance(item, UsageRecord)]
        records = [item for item in items if isinstance(item, UsageRecord)]
        if rows:
            await self._store.write_ledger(rows)
            self._release(rows)
        if records:
            await self._store.write_many(records)
        self.written += len(records)

    async def _spill_held(self) -> bool:
        """Append the batch in hand and everything queued to the spill file (True: done, and
        they survive the process from now on)."""
        assert self._spill is not None
        queued = self._take_all()
        items = self._in_hand + queued
        self._idle.clear()
        try:
            await asyncio.to_thread(self._spill.append, items)
        except OSError as exc:
            logger.error("cannot spill %d usage records: %s", len(items), exc)
            self._requeue(queued)
            return False
        finally:
            self._idle.set()
        logger.warning("usage store unavailable: %d records spilled", len(items))
        self._release(items)
        self.spilled += len(items)
        self._spilled = True
        self._in_hand = []
        self._crowded.clear()
        return True

    def _requeue(self, items: Sequence[Item]) -> None:
        for item in items:
            try:
                self._queue.put_nowait(item)
            except asyncio.QueueFull:
                self._release([item])
                self.dropped += 1

    async def _replay(self) -> bool:
        """Write what the spill file holds to the store (True: all of it, the file is gone)."""
        assert self._spill is not None
        spill = self._spill
        self._idle.clear()
        try:
            while (path := await asyncio.to_thread(spill.take)) is not None:
                batches = spill.batches(path, self._max_batch)
                try:
                    while (batch := await asyncio.to_thread(_next_batch, batches)) is not None:
                        await self._write_items(batch)
                        self.replayed += len(batch)
                finally:
                    batches.close()
                await asyncio.to_thread(spill.done, path)
                logger.info("usage spill file %s written to the store", path)
        except Exception as exc:  # noqa: BLE001 - the store failed again: the file stays
            logger.warning("usage spill file not replayed yet: %s", exc)
            return False
        finally:
            self._idle.set()
        self._spilled = False
        return True

    async def close(self) -> None:
        """Stop the writer and flush every queued record (a bounded number of attempts each,
        then the spill file)."""
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
            if await self._write(attempts=self._retries):
                continue
            if self._spill is not None and await self._spill_held():
                continue
            self.failed += len(self._in_hand)
            self._release(self._in_hand)
            logger.error(
                "dropped %d usage records after %d attempts", len(self._in_hand), self._retries
            )
            self._in_hand = []


def _next_batch(batches: Iterator[list[Item]]) -> list[Item] | None:
    return next(batches, None)
