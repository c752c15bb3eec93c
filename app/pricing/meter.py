"""`CostMeter`: prices each usage record as it is made, actual and uncompacted baseline."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from inflight.pricing.cost import Billed, baseline_billed, dollars
from inflight.pricing.history import PromptHistory, conversation_items, conversation_key
from inflight.pricing.realised import RealisedNets
from inflight.pricing.table import ModelPrice, PriceTable
from inflight.usage.ledger import LedgerUpdate
from inflight.usage.records import UsageRecord


@dataclass(frozen=True, slots=True)
class Costs:
    """USD of one record; both None when its model is unpriced."""

    actual: float | None
    baseline: float | None


UNPRICED = Costs(None, None)


def billed_of(record: UsageRecord) -> Billed:
    """The record's tokens by billing category."""
    prompt = record.prompt_tokens
    if prompt is None and record.outcome == "client_disconnected":
        prompt = record.tokens_after
    return Billed(
        prompt=prompt or 0,
        cached=record.cached_tokens or 0,
        cache_write=record.cache_write_tokens or 0,
        completion=record.completion_tokens or 0,
    )


def one_round_of(record: UsageRecord, billed: Billed) -> Billed:
    """The record's tokens as one upstream round (restore's rounds: the first's prompt, the
    last's answer), the round the baseline prices."""
    one = record.one_round
    if one is None:
        return billed
    return Billed(
        prompt=one.prompt_tokens or 0,
        cached=one.cached_tokens or 0,
        cache_write=one.cache_write_tokens or 0,
        completion=one.completion_tokens or 0,
    )


class CostMeter:
    """Prices records against a `PriceTable`, remembering prompts for the baseline.

    One per app (built in `create_app`); it owns the bounded `PromptHistory` the baseline needs.
    Summary calls cost what they cost and have no baseline (the uncompacted request makes none);
    restore's extra rounds are in the actual cost only (the baseline prices one round). A record
    without upstream usage costs nothing, except a stream the client abandoned: the upstream read
    its prompt, so that is priced from the proxy's own count of what was sent. It also keeps
    the realised net of each conversation's last compaction event (`RealisedNets`): a priced
    chat record carries the update of that event's ledger row as its `realised`.
    """

    def __init__(self, table: PriceTable) -> None:
        self.table = table
        self._history = PromptHistory(table.baseline.conversations)
        self._realised = RealisedNets(table.baseline.conversations)

    def priced(self, record: UsageRecord, body: Mapping[str, Any] | None) -> UsageRecord:
        """`record` with its `cost` and `baseline_cost` (passthrough records stay unpriced), and
        the update of its conversation's last compaction event's ledger row, if any."""
        if record.kind == "passthrough":
            return record
        costs, realised = self._costs(record, body)
        return replace(
            record,
            cost=costs.actual,
            baseline_cost=costs.baseline,
            one_round=None,
            realised=realised,
        )

    def costs(self, record: UsageRecord, body: Mapping[str, Any] | None) -> Costs:
        """`body` is the request as the client sent it (before compaction), if there is one."""
        return self._costs(record, body)[0]

    def _costs(
        self, record: UsageRecord, body: Mapping[str, Any] | None
    ) -> tuple[Costs, LedgerUpdate | None]:
        price = self.table.lookup(record.model)
        if price is None:
            return UNPRICED, None
        billed = billed_of(record)
        actual = dollars(price, billed)
        removed = record.tokens_before - record.tokens_after
        if record.kind != "chat" or billed.prompt == 0:
            return Costs(actual, 0.0 if record.kind != "chat" else actual), None
        one = one_round_of(record, billed)
        key, baseline = self._baseline(price, record, one, body)
        realised = None
        if key is not None:
            # per client too: one client's requests never carry another's event forward
            whose = key + b"\0" + record.client.encode()
            realised = self._realised.observe(whose, record, price, one, baseline)
        return Costs(actual, actual if removed <= 0 else dollars(price, baseline)), realised

    def _baseline(
        self,
        price: ModelPrice,
        record: UsageRecord,
        billed: Billed,
        body: Mapping[str, Any] | None,
    ) -> tuple[bytes | None, Billed]:
        """The conversation's key (None without a history) and the uncompacted baseline."""
        rules = self.table.baseline
        removed = max(0, record.tokens_before - record.tokens_after)
        items = conversation_items(body) if body is not None else None
        if body is None or items is None:
            return None, baseline_billed(price, rules, billed, removed, 0)
        key = conversation_key(record.model, body, items)
        prompt = billed.prompt + removed
        ttl = rules.ttl(price.caching)
        reusable = self._history.observe(key, items, prompt, record.ts, ttl)
        return key, baseline_billed(price, rules, billed, removed, reusable)
