"""A calibration that moves a little between compaction events moves no cut point (DESIGN.md
§4.7, issue 32): a conversation growing one request at a time, its upstream billing a few per
cent less (or a little more) from some request on, is forwarded byte for byte as with billing
that stays put — so between events each prompt extends the one before. The upstream bills the
proxy's own raw estimate times a rate: the fit follows the rate, nothing else moves it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache, partial
from typing import Any

import anyio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.replicas import MODEL, BillingUpstream, replay
from inflight.tokens.counter import ChatTokenCounter
from inflight.tokens.encodings import EncodingSet, load_encodings
from tests.unit.windows.test_replicas_plan import conversation


@cache
def encodings() -> EncodingSet:
    return load_encodings()


@dataclass
class Rated(BillingUpstream):
    """Bills `rate` times the proxy's raw estimate from its request `since` on, 1 before."""

    rate: float = 1.0
    since: int = 0
    counter: ChatTokenCounter = field(default_factory=lambda: ChatTokenCounter(encodings()))

    def billed(self, messages: Sequence[Mapping[str, Any]]) -> int:
        raw = self.counter.raw_request(MODEL, {"messages": list(messages)})
        return round(raw * (self.rate if self.served >= self.since else 1.0))


def forwarded(messages: list[dict[str, Any]], upstream: BillingUpstream) -> list[dict[str, Any]]:
    """The bodies one replica forwards for `messages` grown a request at a time."""
    options = {"limit": 2048, "upstream": upstream, "encodings": encodings()}
    return anyio.run(partial(replay, [messages], 1, "truncate,prune,trim", **options))[0]


def test_billing_a_few_per_cent_lower_between_events_moves_no_cut() -> None:
    messages = conversation([12, 30, 8, 25, 18, 40, 10, 22, 35, 15, 28, 9, 33, 20, 26, 14] * 2)
    still = forwarded(messages, Rated())
    lower = forwarded(messages, Rated(rate=0.96, since=8))
    assert len(still) == len(lower) > 20
    assert lower == still


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.integers(1, 40), min_size=8, max_size=30),
    rate=st.floats(0.95, 1.02),
    since=st.integers(1, 10),
)
def test_calibration_moving_within_the_band_forwards_the_same_bytes(
    sizes: list[int], rate: float, since: int
) -> None:
    messages = conversation(sizes)
    assert forwarded(messages, Rated(rate=rate, since=since)) == forwarded(messages, Rated())
