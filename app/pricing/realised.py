"""The realised net of each compaction event (DESIGN.md §16), from the usage that followed it."""

from __future__ import annotations

from dataclasses import dataclass

from inflight.lru import BoundedLRU
from inflight.pricing.cost import PER_MILLION, Billed
from inflight.pricing.table import ModelPrice
from inflight.usage.ledger import LedgerUpdate
from inflight.usage.records import UsageRecord

DIGITS = 9  # nano-dollars, as `/stats` rounds


@dataclass(frozen=True, slots=True)
class OpenEvent:
    """A conversation's last compaction event: its row, the events of its plan, the tokens it
    removed, and its realised net and the requests after it so far."""

    ledger_id: str
    events: int
    removed: int
    net: float
    turns: int

    def update(self) -> LedgerUpdate:
        return LedgerUpdate(
            self.ledger_id, realised_net=round(self.net, DIGITS), realised_turns=self.turns
        )


def rewrite_cost(price: ModelPrice, actual: Billed, baseline: Billed) -> float:
    """USD the request that made an event paid to write its compacted prompt again: its prompt
    tokens not read from the cache beyond the baseline's, each at the write price (the input
    price when it wrote nothing to the cache) less what reading it would have cost."""
    unread = max(0, actual.prompt) - actual.read
    would = max(0, baseline.prompt) - baseline.read
    rate = price.cache_write_rate if actual.written > 0 else price.input
    return max(0, unread - would) * max(0.0, rate - price.cache_read_rate) / PER_MILLION


def saving(price: ModelPrice, removed: int, actual: Billed) -> float:
    """USD a request after an event saved by not sending the `removed` tokens: at the
    cache-read price when it read from the cache, else at the input price."""
    rate = price.cache_read_rate if actual.read > 0 else price.input
    return removed * rate / PER_MILLION


class RealisedNets:
    """Client and conversation key → its last compaction event (at most `capacity`, least
    recent out).

    Per client and conversation (the baseline's key: model and pinned head) the last event's
    ledger row: the request that made it pays its realised rewrite — the prompt tokens it did
    not read from the cache beyond those its uncompacted baseline would not have read, at the
    write price (or the input price when it wrote nothing) less the cache-read price — and each
    later request that carries the same cut forward saves the tokens the event removed, at the
    cache-read price when that request read from the cache, else the input price, until the
    conversation's next event. In memory and bounded, like the baseline's prompts: only the
    requests this replica answers count, and a restart ends every count.
    """

    def __init__(self, capacity: int) -> None:
        self._events: BoundedLRU[bytes, OpenEvent] = BoundedLRU(capacity)

    def observe(
        self,
        key: bytes,
        record: UsageRecord,
        price: ModelPrice,
        actual: Billed,
        baseline: Billed,
    ) -> LedgerUpdate | None:
        """What a priced chat request of conversation `key` changes of its last event's row:
        a request with a ledger row and a plan of other events starts a new event; one that
        carries the last event forward (the same events, something removed) adds its saving.
        None: it changes nothing (not answered, no usage, nothing cut)."""
        if not 200 <= record.status < 300 or record.prompt_tokens is None:
            return None
        last = self._events.get(key)
        if record.ledger_id is not None and (last is None or record.events != last.events):
            removed = max(0, record.tokens_before - record.tokens_after)
            event = OpenEvent(
                record.ledger_id, record.events, removed, -rewrite_cost(price, actual, baseline), 0
            )
        elif last is not None and record.events == last.events:
            if record.tokens_before <= record.tokens_after:
                return None
            net = last.net + saving(price, last.removed, actual)
            event = OpenEvent(last.ledger_id, last.events, last.removed, net, last.turns + 1)
        else:
            return None
        self._events.put(key, event)
        return event.update()
