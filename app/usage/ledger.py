"""The ledger of cuts: what one compacted request cut, kept for its client (DESIGN.md §11).

A request whose compaction cut something gets a random id (`X-Compaction-Id`); its row — per
cut message its position, role, tool, kind, tokens, sha256 and ref, and with
`INFLIGHT_LEDGER=full` the original content — goes through the usage write queue to the usage
store, with its owner and an expiry (`INFLIGHT_LEDGER_TTL`). `GET /v1/compaction/ledger/{id}`
reads it back for the same owner only: the proxy key id when `INFLIGHT_API_KEYS` is set, else a
hash of the credential the client sent, else none. An unknown id, an expired row and another
owner's row are all the same 404, so the route tells nothing about ids that are not yours.

Readable as soon as the response has been sent: the row is queued when the response starts,
and a read looks at the rows the queue has not written yet before it asks the store. Nothing
of a row is ever logged.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from inflight.errors import NotFound
from inflight.settings import LedgerMode

if TYPE_CHECKING:
    from inflight.compaction.compacted import Compacted
    from inflight.compaction.cuts import Cut
    from inflight.usage.records import UsageQueue, UsageStore


class Ledgered(Protocol):
    """What a row is made of: one answered request (the proxy's exchange)."""

    @property
    def compacted(self) -> Compacted | None: ...
    @property
    def route(self) -> str: ...
    @property
    def model(self) -> str: ...
    @property
    def client_key_id(self) -> str | None: ...

MAX_ID_LENGTH = 64  # ids are 22 characters; a longer one is not looked up


@dataclass(frozen=True, slots=True)
class LedgerRow:
    """One compacted request's ledger row: what `GET` returns, and who may read it."""

    id: str
    owner: str  # the client key id, or "" for a client that sent no credential
    created: float  # Unix time
    expires: float
    summary: dict[str, Any]  # the document without its cuts
    cuts: tuple[Cut, ...] = ()
    full: bool = False  # the cuts' original contents too

    @property
    def size(self) -> int:
        """Bytes of original content the row holds (0 without `full`)."""
        return sum(cut.size for cut in self.cuts)

    def json(self) -> bytes:
        """The JSON document, built only here — in the writer's thread or the reader's, never
        on the request path (thousands of cuts take milliseconds)."""
        cuts = [cut.document(self.full) for cut in self.cuts]
        return orjson.dumps({**self.summary, "cuts": cuts})


def ledger_mode(settings_mode: LedgerMode, database_url: str) -> LedgerMode:
    """The ledger is off when usage is not stored (`INFLIGHT_DATABASE_URL=none`)."""
    return LedgerMode.OFF if database_url == "none" else settings_mode


class Ledger:
    """Queues the rows of compacted requests and reads them back for their owner."""

    def __init__(
        self,
        mode: LedgerMode,
        ttl: float,
        queue: UsageQueue,
        store: UsageStore,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.mode = mode
        self._ttl = ttl
        self._queue = queue
        self._store = store
        self._clock = clock

    def row_for(self, exchange: Ledgered) -> LedgerRow | None:
        """The row of an exchange whose request was compacted with cuts (None: no row)."""
        compacted = exchange.compacted
        if self.mode is LedgerMode.OFF or compacted is None or compacted.ledger_id is None:
            return None
        now = self._clock()
        summary = {
            "id": compacted.ledger_id,
            "object": "compaction.ledger",
            "created": now,
            "expires": now + self._ttl,
            "mode": str(self.mode),
            "route": exchange.route,
            "model": exchange.model,
            "applied": list(compacted.strategies),
            "tokens_before": compacted.tokens_before,
            "tokens_after": compacted.tokens_after,
            "context_limit": compacted.context_limit,
            "economics": compacted.economics,
        }
        owner = exchange.client_key_id or ""
        full = self.mode is LedgerMode.FULL
        expires = now + self._ttl
        return LedgerRow(compacted.ledger_id, owner, now, expires, summary, compacted.cuts, full)

    def record(self, exchange: Ledgered) -> None:
        """Queue the exchange's row, if it has one (never waits)."""
        row = self.row_for(exchange)
        if row is not None:
            self._queue.submit(row)

    async def read(self, ledger_id: str, owner: str | None) -> bytes:
        """The row's JSON for its owner; `NotFound` for any other case, all alike."""
        now = self._clock()
        found: bytes | None = None
        if 0 < len(ledger_id) <= MAX_ID_LENGTH:
            pending = self._queue.unwritten(ledger_id)
            if pending is not None:
                mine = pending.owner == (owner or "") and pending.expires > now
                found = await asyncio.to_thread(pending.json) if mine else None
            else:
                found = await self._store.read_ledger(ledger_id, owner or "", now)
        if found is None:
            raise NotFound("no compaction ledger with this id", param="id")
        return found
