"""The ledger of cuts: what one compacted request cut, kept for its client (DESIGN.md §11).

Nothing of a row is ever logged.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from inflight.errors import NotFound
from inflight.settings import LedgerMode
from inflight.usage.ledger_facts import Facts, FactsWork

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


# The fields a row gets after it was queued (`LedgerUpdate`), null until then: the references
# of the cut span kept in the forwarded prompt, behind a marker's ref, or in neither (DESIGN.md
# §14), and the realised net (USD) of the compaction event the row's request made, over the
# conversation's requests that followed it (DESIGN.md §16).
LATE_FIELDS = (
    "facts_retained", "facts_restorable", "facts_lost", "realised_net", "realised_turns",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class LedgerUpdate:
    """Late fields of one ledger row (None: not known by this update). Absolute values, never
    increments: writing an update again (a retry, a spill file replayed) changes nothing."""

    id: str
    facts_retained: int | None = None
    facts_restorable: int | None = None
    facts_lost: int | None = None
    realised_net: float | None = None
    realised_turns: int | None = None

    def values(self) -> tuple[int | float | None, ...]:
        return tuple(getattr(self, name) for name in LATE_FIELDS)

    def over(self, earlier: LedgerUpdate | None) -> LedgerUpdate:
        """This update on top of an `earlier` one of the same row (its values where this has
        none)."""
        if earlier is None:
            return self
        kept: dict[str, Any] = {
            name: getattr(earlier, name) for name in LATE_FIELDS if getattr(self, name) is None
        }
        return replace(self, **kept)

    def known(self) -> dict[str, Any]:
        """The fields this update sets."""
        return {
            name: getattr(self, name) for name in LATE_FIELDS if getattr(self, name) is not None
        }

    @classmethod
    def of_facts(cls, ledger_id: str, facts: Mapping[str, int]) -> LedgerUpdate:
        """From `facts_report`'s counts."""
        return cls(ledger_id, facts["retained"], facts["restorable"], facts["lost"])


def with_late_fields(document: bytes, update: LedgerUpdate | None) -> bytes:
    """A row's JSON `document` (an object without the late fields) with them added, null where
    `update` has none: spliced in, so that a row holding megabytes of originals is not parsed
    again."""
    known = update.known() if update is not None else {}
    late = orjson.dumps({name: known.get(name) for name in LATE_FIELDS})
    body = document.rstrip()
    if not body.endswith(b"}"):
        return document
    empty = body[:-1].rstrip().endswith(b"{")
    return body[:-1] + (b"" if empty else b",") + late[1:]


def overlaid(document: bytes, update: LedgerUpdate) -> bytes:
    """A row's JSON document with its late fields (already in it) set from `update` where it
    knows them (parsed again: for the moment between an update's queueing and its write)."""
    doc = orjson.loads(document)
    if isinstance(doc, dict):
        doc.update(update.known())
    return orjson.dumps(doc)


def ledger_mode(settings_mode: LedgerMode, database_url: str) -> LedgerMode:
    """The ledger is off when usage is not stored (`INFLIGHT_DATABASE_URL=none`)."""
    return LedgerMode.OFF if database_url == "none" else settings_mode


class Ledger:
    """Queues the rows of compacted requests and reads them back for their owner.

    A request whose compaction cut something gets a random id (`X-Compaction-Id`); its row — per cut
    message its position, role, tool, kind, tokens, sha256 and ref, and with `INFLIGHT_LEDGER=full`
    the original content — goes through the usage write queue to the usage store, with its owner and
    an expiry (`INFLIGHT_LEDGER_TTL`). `GET /v1/compaction/ledger/{id}` reads it back for the same
    owner only: the proxy key id when `INFLIGHT_API_KEYS` is set, else a hash of the credential the
    client sent, else none. An unknown id, an expired row and another owner's row are all the same
    404, so the route tells nothing about ids that are not yours.

    Readable as soon as the response has been sent: the row is queued when the response starts, and
    a read looks at the rows the queue has not written yet before it asks the store. What is
    known only later — the fates of the cut's references, the realised net of its compaction
    event — reaches the row as a `LedgerUpdate`.
    """

    def __init__(
        self,
        mode: LedgerMode,
        ttl: float,
        queue: UsageQueue,
        store: UsageStore,
        clock: Callable[[], float] = time.time,
        facts: FactsWork | None = None,
    ) -> None:
        self.mode = mode
        self._ttl = ttl
        self._queue = queue
        self._store = store
        self._clock = clock
        self.facts = facts if facts is not None else FactsWork(self._facts_done)

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

    def _facts_done(self, ledger_id: str, facts: Facts) -> None:
        self._queue.submit(LedgerUpdate.of_facts(ledger_id, facts))

    def record(self, exchange: Ledgered) -> None:
        """Queue the exchange's row, if it has one, and start working out the fates of its
        cut's references off the event loop (never waits)."""
        row = self.row_for(exchange)
        if row is None:
            return
        self._queue.submit(row)
        work = exchange.compacted.facts if exchange.compacted is not None else None
        if work is not None:
            self.facts.start(row.id, work)

    async def read(self, ledger_id: str, owner: str | None) -> bytes:
        """The row's JSON for its owner; `NotFound` for any other case, all alike."""
        now = self._clock()
        found: bytes | None = None
        if 0 < len(ledger_id) <= MAX_ID_LENGTH:
            pending = self._queue.unwritten(ledger_id)
            update = self._queue.pending_update(ledger_id)
            if pending is not None:
                mine = pending.owner == (owner or "") and pending.expires > now
                found = await asyncio.to_thread(_rendered, pending, update) if mine else None
            else:
                found = await self._store.read_ledger(ledger_id, owner or "", now)
                if found is not None and update is not None:
                    found = await asyncio.to_thread(overlaid, found, update)
        if found is None:
            raise NotFound("no compaction ledger with this id", param="id")
        return found

    async def aclose(self) -> None:
        """Stop the work on references still running or waiting (their rows keep null)."""
        await self.facts.aclose()


def _rendered(row: LedgerRow, update: LedgerUpdate | None) -> bytes:
    return with_late_fields(row.json(), update)
