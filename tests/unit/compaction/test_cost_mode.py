"""Cost mode (DESIGN.md §16): the ski-rental decision, and invariants 3, 5 and 7 with it on."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inflight.compaction.cost_mode import CostRule, economics
from inflight.compaction.engine import CompactionResult, compact
from inflight.compaction.planner import plan
from inflight.compaction.policy import Budget, parse_controls
from inflight.compaction.replays import ReplayCache, Replays
from inflight.compaction.report import preview_report
from inflight.compaction.service import CompactionService
from inflight.factory import cache_rates
from inflight.pricing.table import PriceTable
from inflight.strategies import StrategyName
from inflight.tokens.counter import ChatTokenCounter
from inflight.tokens.encodings import load_encodings
from inflight.windows.registry import WindowRegistry
from inflight.windows.table import ModelTable
from tests.conftest import make_settings
from tests.support import request_points
from tests.support.conversations import common_prefix, conversations, simple_count

ANTHROPIC = CostRule.priced(0.30, 3.75, 0)  # Claude Sonnet, USD per 1M tokens
OPENAI = CostRule.priced(0.50, 2.00, 0)  # gpt-4.1: a cached read at a quarter, no premium
NO_CACHE = CostRule.priced(2.00, 2.00, 0)  # no discount: every cut pays at once
RULES = {"anthropic": ANTHROPIC, "openai": OPENAI, "no-cache": NO_CACHE}
AUTO: tuple[StrategyName, ...] = ("truncate", "prune", "trim")
CONFIG = Path(__file__).resolve().parents[3] / "config"
SLOW_IS_FINE = [HealthCheck.too_slow, HealthCheck.data_too_large]


def budget(window: int, rule: CostRule | None, floor: int) -> Budget:
    cost = None if rule is None else CostRule(rule.read, rule.rewrite, floor, rule.unit)
    return Budget(window=window, reserve=window // 8, threshold=0.8, target=0.5, cost=cost)


def session(rounds: int, size: int) -> list[dict[str, Any]]:
    """A coding session: a head, then tool rounds of `size` characters of output each."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "fix the failing test"},
    ]
    for i in range(rounds):
        call = {"id": f"c{i}", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": f"{i} " + "x" * size})
    return messages


def run(messages: Sequence[Mapping[str, Any]], b: Budget) -> CompactionResult:
    return compact(messages, AUTO, b, simple_count, 0)


def first_event(messages: list[dict[str, Any]], b: Budget) -> int | None:
    """The first request point whose request is compacted."""
    for k in request_points(messages):
        if run(messages[:k], b).applied:
            return k
    return None


def ski_rental_point(messages: list[dict[str, Any]], b: Budget) -> int | None:
    """Where the rule says the first cut pays, computed by hand from the request points."""
    assert b.cost is not None
    rule, kept = b.cost, b.cost.kept(b.goal)
    head = sum(simple_count(m) for m in messages[:2])
    spend = 0.0
    for k in request_points(messages):
        total = sum(simple_count(m) for m in messages[:k])
        if total > b.trigger:
            return None
        spend += max(0, total - kept) * rule.read
        if total > rule.calm(b.goal) and spend >= (kept - head) * rule.rewrite:
            return k
    return None


def test_a_session_under_the_threshold_is_compacted_where_the_rent_reaches_the_cut() -> None:
    messages = session(60, 400)  # ~103 tokens a round, ~6.2k in all: never over the trigger
    b = budget(65_536, ANTHROPIC, 1024)
    assert run(messages, budget(65_536, None, 1024)).applied == ()  # cost mode off: nothing
    expected = ski_rental_point(messages, b)
    assert expected is not None
    assert first_event(messages, b) == expected
    # at the point before it, the rent had not paid for the cut yet
    points = request_points(messages)
    assert run(messages[: points[points.index(expected) - 1]], b).applied == ()
    result = run(messages[:expected], b)
    assert result.tokens_after <= 1024


def test_never_compacts_a_prompt_at_or_under_the_floor() -> None:
    messages = session(60, 400)
    total = sum(simple_count(m) for m in messages)
    b = budget(65_536, NO_CACHE, total)  # every cut would pay at once: the floor alone stops it
    assert first_event(messages, b) is None


def test_never_compacts_when_what_would_be_removed_is_small() -> None:
    messages = session(60, 400)
    total = sum(simple_count(m) for m in messages)
    rule = CostRule(NO_CACHE.read, NO_CACHE.rewrite, total - 200)  # over the floor by 200 only
    assert rule.least_removed(rule.kept(10**9)) > 200
    b = Budget(window=65_536, reserve=8192, threshold=0.8, target=0.5, cost=rule)
    assert first_event(messages, b) is None


def test_a_cache_that_costs_nothing_to_read_is_never_compacted_early() -> None:
    messages = session(60, 400)
    b = budget(65_536, CostRule.priced(0.0, 3.75, 0), 1024)
    assert first_event(messages, b) is None


def test_cheaper_rewrites_pay_sooner() -> None:
    messages = session(60, 400)
    points = [first_event(messages, budget(65_536, RULES[n], 1024)) for n in RULES]
    assert None not in points
    anthropic, openai, no_cache = points
    assert no_cache is not None
    assert openai is not None
    assert anthropic is not None
    assert no_cache <= openai <= anthropic


def test_the_decision_is_a_pure_function_of_the_history_and_the_prices() -> None:
    """Replicas: one that plans every request from the first message, and two that remember
    replays and see the conversation's requests in different orders, plan alike."""
    messages = session(60, 400)
    b = budget(65_536, OPENAI, 1024)
    points = request_points(messages)
    fresh = [plan(messages[:k], AUTO, b, simple_count, 0) for k in points]
    one = Replays(ReplayCache(), lambda: 0)
    two = Replays(ReplayCache(), lambda: 0)
    by_one = [plan(messages[:k], AUTO, b, simple_count, 0, replays=one) for k in points]
    by_two = {k: plan(messages[:k], AUTO, b, simple_count, 0, replays=two) for k in points[1::2]}
    by_two |= {k: plan(messages[:k], AUTO, b, simple_count, 0, replays=two) for k in points[::2]}
    assert any(p.events for p in fresh)
    assert fresh == by_one == [by_two[k] for k in points]


def test_the_request_controls_it() -> None:
    controls, _ = parse_controls({"x-compaction-for-cost": "on"}, {"model": "m"})
    assert controls.for_cost is True
    controls, forwarded = parse_controls({}, {"model": "m", "compaction": {"for_cost": False}})
    assert controls.for_cost is False
    assert forwarded == {"model": "m"}
    assert parse_controls({}, {"model": "m"})[0].for_cost is None


def test_economics_of_a_cut() -> None:
    cut = economics(ANTHROPIC, 100_000, 30_000, 10_000)
    assert cut.removed == 70_000
    assert abs(cut.saving_per_request - 70_000 * 0.30e-6) < 1e-12
    assert abs(cut.rewrite_cost - 20_000 * 3.45e-6) < 1e-12
    assert cut.break_even_requests is not None
    assert 3 < cut.break_even_requests < 4
    assert economics(CostRule.prefill(1000.0, 0), 2000, 1000, 0).unit == "s"


def call(name: str, call_id: str) -> dict[str, Any]:
    function = {"name": name, "arguments": "{}"}
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": call_id, "type": "function", "function": function}
    ]}  # fmt: skip


def answer(call_id: str, size: int) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": "x" * size}


def test_a_cut_short_of_what_cost_mode_keeps_is_not_cut_again() -> None:
    """Invariant 5 when an event cannot get down to the floor: a tool output over the trigger
    is truncated as the last unit and the prompt stays over the floor. Compacting the output
    again must not cut it further (it did: the output's replay counted the rent its event's
    request paid on the excess, the first replay did not)."""
    text = "look at the log " * 5
    messages = [
        {"role": "user", "content": text},
        call("bash", "c0"),
        answer("c0", 10_000),
        {"role": "assistant", "content": "answer 0"},
        {"role": "user", "content": text},
    ]
    b = budget(2048, ANTHROPIC, 102)
    at_the_event = run(messages[:3], b)
    assert at_the_event.applied == ("truncate",)
    assert at_the_event.tokens_after > 102  # short of what cost mode keeps
    for k in (3, 5):
        result = run(messages[:k], b)
        again = run(result.messages, b)
        assert again.applied == ()
        assert again.messages == result.messages


def test_a_folded_marker_counts_as_head_for_the_price_of_the_next_cut() -> None:
    """Invariant 5 with restore: the marker folded into the head's user message is part of the
    compacted request's head, so the first replay prices the next cut with it too."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are an agent. "},
        {"role": "user", "content": [{"type": "text", "text": "x" * 120}]},
        {"role": "assistant", "content": None, "function_call": {"name": "f", "arguments": "{}"}},
        {"role": "function", "name": "f", "content": ""},
    ]
    for i, size in enumerate((0, 400, 0, 0, 0)):
        messages += [call("bash", f"c{i}"), answer(f"c{i}", size)]
    b = budget(2048, ANTHROPIC, 102)
    result = compact(messages, AUTO, b, simple_count, 0, restore=True)
    assert result.applied == ("trim",)
    assert result.plan.summary_role == "fold"
    again = compact(result.messages, AUTO, b, simple_count, 0, restore=True)
    assert again.applied == ()
    assert again.messages == result.messages


# -- invariants 3, 5 and 7 with cost mode on (DESIGN.md §4), on generated conversations --------

WINDOWS = st.sampled_from([2048, 4096, 8192, 16384])
FLOORS = st.sampled_from([0.05, 0.1, 0.25, 0.45])  # the floor, as a share of the window
PROPERTY = settings(max_examples=40, deadline=None, suppress_health_check=SLOW_IS_FINE)


def rule_budget(window: int, name: str, share: float) -> Budget:
    return budget(window, RULES[name], int(share * window))


@PROPERTY
@given(
    messages=conversations(),
    window=WINDOWS,
    name=st.sampled_from(list(RULES)),
    share=FLOORS,
    restore=st.booleans(),
)
def test_compacting_a_compacted_request_changes_nothing(
    messages: list[dict[str, Any]], window: int, name: str, share: float, restore: bool
) -> None:
    b = rule_budget(window, name, share)
    result = compact(messages, AUTO, b, simple_count, 0, restore=restore)
    if result.tokens_before <= b.calm:  # 3. no-op is exact
        assert result.applied == ()
    assert b.cost is not None
    again = compact(result.messages, AUTO, b, simple_count, 0, restore=restore)
    assert again.applied == ()
    assert again.messages == result.messages


@PROPERTY
@given(
    messages=conversations(),
    window=WINDOWS,
    name=st.sampled_from(list(RULES)),
    share=FLOORS,
)
def test_requests_share_prefixes_between_spaced_events(
    messages: list[dict[str, Any]], window: int, name: str, share: float
) -> None:
    """7. Successive requests extend the previous output except at events; an event brings the
    prompt to what cost mode keeps, and the next comes after at least the least an early event
    removes (or the threshold band) of growth."""
    b = rule_budget(window, name, share)
    assert b.cost is not None
    kept = b.cost.kept(b.goal)
    spacing = min(b.cost.least_removed(kept), (b.threshold - b.target) * b.budget)
    previous: list[Any] | None = None
    last_event_before: int | None = None
    for k in request_points(messages):
        result = run(messages[:k], b)
        out = list(result.messages)
        if previous is not None and common_prefix(previous, out) < len(previous):
            if last_event_before is not None:
                assert result.tokens_before - last_event_before >= spacing - 1
            reached = result.plan.tokens_after <= kept
            last_event_before = result.tokens_before if reached else None
        previous = out


# -- the service: controls, prices and the report --------------------------------------------


def cost_service(tmp_path: Path, **overrides: Any) -> CompactionService:
    table = ModelTable.load(CONFIG / "models.toml")
    counter = ChatTokenCounter(load_encodings(), table)
    settings = make_settings(tmp_path, cost_min_prompt=2000, **overrides)
    prices = PriceTable.load(CONFIG / "prices.toml")
    return CompactionService(
        settings, counter, WindowRegistry(table, None), cache_rates=cache_rates(prices)
    )


def long_session() -> list[dict[str, Any]]:
    """Far under a 200k window's threshold, long enough that a cut pays at Sonnet's prices."""
    return session(150, 400)


@pytest.mark.anyio
async def test_the_header_turns_cost_mode_on_and_the_report_shows_the_cut(
    tmp_path: Path,
) -> None:
    service = cost_service(tmp_path)
    body = {"model": "claude-sonnet-4-5", "messages": long_session()}
    limit = {"x-compaction-context-limit": "200000"}
    off = await service.plan(limit, body, "http://u/v1")
    assert off.result.applied == ()
    on = await service.plan({**limit, "x-compaction-for-cost": "on"}, body, "http://u/v1")
    assert on.result.applied
    assert on.result.tokens_after <= 2500  # cut to the floor, then grown by less than a quarter
    report = preview_report(on)["economics"]
    assert report["unit"] == "usd"
    assert report["tokens_removed"] == on.result.tokens_before - on.result.tokens_after
    assert report["saving_per_request"] > 0
    assert report["rewrite_cost"] > 0
    assert preview_report(off)["economics"] is None


@pytest.mark.anyio
async def test_the_setting_turns_it_on_and_the_body_key_off(tmp_path: Path) -> None:
    service = cost_service(tmp_path, compact_for_cost=True)
    limit = {"x-compaction-context-limit": "200000"}
    body: dict[str, Any] = {"model": "claude-sonnet-4-5", "messages": long_session()}
    assert (await service.plan(limit, body, "http://u/v1")).result.applied
    body["compaction"] = {"for_cost": "off"}
    assert (await service.plan(limit, body, "http://u/v1")).result.applied == ()


@pytest.mark.anyio
async def test_a_local_model_is_judged_on_prefill_time(tmp_path: Path) -> None:
    body = {"model": "my-local-model", "messages": long_session()}
    headers = {"x-compaction-context-limit": "200000", "x-compaction-for-cost": "on"}
    unpriced = cost_service(tmp_path)
    assert (await unpriced.plan(headers, body, "http://u/v1")).result.applied == ()
    local = cost_service(tmp_path, prefill_rate=2000.0)
    preview = await local.plan(headers, body, "http://u/v1")
    assert preview.result.applied
    assert preview_report(preview)["economics"]["unit"] == "s"
