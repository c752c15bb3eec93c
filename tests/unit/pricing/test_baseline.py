"""The "without inflight" baseline: the actual cost whenever compaction removed nothing, one
uncompacted round (never restore's extra rounds) when it did, and a saving that may be negative."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inflight.pricing.cost import Billed, baseline_billed
from inflight.pricing.meter import CostMeter
from inflight.pricing.table import BaselineRules, PriceTable
from inflight.proxy.recording import one_round
from inflight.proxy.sse_tap import Usage
from inflight.usage.records import UsageRecord

CONFIG = Path(__file__).resolve().parents[3] / "config"


@pytest.fixture(scope="module")
def meter() -> CostMeter:
    return CostMeter(PriceTable.load(CONFIG / "prices.toml"))


def record(model: str, usage: Usage, before: int = 0, after: int = 0) -> UsageRecord:
    return UsageRecord(
        ts=time.time(), request_id="r", kind="chat", model=model, client_key_id=None,
        stream=False, status=200, outcome="completed", latency_ms=1.0, ttfb_ms=None,
        prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens,
        cached_tokens=usage.cached_tokens, cache_write_tokens=usage.cache_write_tokens,
        tokens_before=before, tokens_after=after, strategies=(), context_limit=None,
        one_round=one_round(usage),
    )  # fmt: skip


def chat(*turns: str) -> dict[str, object]:
    roles = ["system", "user", "assistant"]
    messages = [{"role": roles[min(i, 1) if i < 2 else 2 - i % 2], "content": t}
                for i, t in enumerate(turns)]  # fmt: skip
    return {"model": "m", "messages": messages}


def test_an_untouched_gpt_4o_request_with_cache_hits_costs_its_baseline(meter: CostMeter) -> None:
    usage = Usage(prompt_tokens=10_000, completion_tokens=500, cached_tokens=4_096)
    priced = meter.priced(record("gpt-4o", usage), chat("sys", "hi"))
    assert priced.cost == pytest.approx(0.02488)
    assert priced.baseline_cost == pytest.approx(priced.cost)  # was $0.03000: all uncached


def test_untouched_claude_requests_with_cache_reads_and_writes_cost_their_baseline(
    meter: CostMeter,
) -> None:
    usage = Usage(25_000, 150, cached_tokens=20_000, cache_write_tokens=4_000)
    body = chat("sys", "hi")
    first = meter.priced(record("claude-sonnet-4-5", usage), body)
    assert first.cost == pytest.approx(0.02625)
    assert first.baseline_cost == pytest.approx(first.cost)  # was $0.0915: a $0.065 "saving"
    again = meter.priced(record("claude-sonnet-4-5", usage), body)
    assert again.baseline_cost == pytest.approx(again.cost)  # was below its cost


def test_restore_rounds_are_costs_of_inflight_not_of_the_baseline(meter: CostMeter) -> None:
    # 4,000 of 10,000 tokens cut; the model restored them in a second round: that cost more
    first, second = Usage(6_000, 20), Usage(10_100, 300)
    usage = first.plus(second)
    priced = meter.priced(record("gpt-4o", usage, before=10_000, after=6_000), None)
    assert priced.baseline_cost == pytest.approx(0.028)  # 10,000 in, the last answer's 300 out
    assert priced.cost is not None
    assert priced.baseline_cost is not None
    assert priced.cost - priced.baseline_cost > 0  # a negative saving, shown as one


def test_a_json_answer_stating_every_rounds_sum_keeps_the_rounds_apart() -> None:
    earlier = Usage(6_000, 20, 0)
    stated = Usage(16_100, 320, 0)  # what the final JSON answer says: the sum
    usage = earlier.plus(stated.after(earlier))
    assert usage == stated
    assert one_round(usage) is not None
    assert (usage.rounds[0].prompt_tokens, usage.rounds[-1].completion_tokens) == (6_000, 300)


def test_a_compaction_with_a_warm_cache_bills_the_removed_part_as_cache_reads() -> None:
    """No previous prompt known (a restart): the actual request read from the cache, so the
    uncompacted one would have read the removed (older) part too."""
    price = PriceTable.load(CONFIG / "prices.toml").lookup("gpt-4o")
    assert price is not None
    actual = Billed(prompt=6_000, cached=2_048, completion=100)
    baseline = baseline_billed(price, BaselineRules(), actual, removed=4_000, reusable=0)
    assert (baseline.prompt, baseline.cached) == (10_000, 6_016)  # 6,048 in 128-token steps
    cold = baseline_billed(price, BaselineRules(), Billed(6_000, completion=100), 4_000, 0)
    assert (cold.prompt, cold.cached) == (10_000, 0)


@settings(max_examples=200, deadline=None)
@given(
    prompt=st.integers(1, 10**6),
    cached=st.integers(0, 10**6),
    written=st.integers(0, 10**6),
    completion=st.integers(0, 10**5),
    reusable=st.integers(0, 10**6),
)
def test_nothing_removed_means_the_baseline_is_the_request(
    prompt: int, cached: int, written: int, completion: int, reusable: int
) -> None:
    table = PriceTable.load(CONFIG / "prices.toml")
    for model in ("gpt-4o", "claude-sonnet-4-5"):
        price = table.lookup(model)
        assert price is not None
        actual = Billed(prompt, cached, written, completion)
        assert baseline_billed(price, table.baseline, actual, 0, reusable) == actual
