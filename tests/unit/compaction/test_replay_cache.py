"""The replay cache (app/compaction/replays.py): a plan resumed from a remembered history prefix
is exactly the plan replayed from the first message — for growing conversations, across
calibration changes and evictions — and a growing conversation replays only what it adds."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from itertools import pairwise
from typing import Any
from unittest.mock import patch

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import inflight.compaction.quiet as quiet
from inflight.compaction.planner import plan
from inflight.compaction.policy import Budget
from inflight.compaction.rendering import render
from inflight.compaction.replays import ReplayCache, Replays
from inflight.compaction.summary.ahead import next_event
from inflight.compaction.summary.rolling import summary_budget
from inflight.compaction.units import UnitRoles
from inflight.strategies import StrategyName
from inflight.tokens.counter import ChatTokenCounter, Counted, count_within
from inflight.tokens.encodings import load_encodings
from tests.support.conversations import agent_session, conversations, simple_count

# Hypothesis warns when it prints a falsifying example whose repr is huge (these conversations
# carry tool outputs of tens of kB). The warnings-as-errors filter turns that warning into an
# exception in Hypothesis's final replay of the failure, before the test body draws anything, so
# a real failure was reported as FlakyStrategyDefinition ("the second run stopped drawing
# earlier") with the assertion hidden.
pytestmark = pytest.mark.filterwarnings(
    "ignore:Generating overly large repr:hypothesis.errors.HypothesisWarning"
)

PIPELINES: list[tuple[StrategyName, ...]] = [
    ("truncate",),
    ("prune",),
    ("trim",),
    ("middle-out",),
    ("summarize",),
    ("truncate", "prune", "trim"),
    ("truncate", "prune", "summarize"),
    ("truncate", "middle-out"),
]
GROWING = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
    ],
)


class Calibrated:
    """A count function with a calibration state, as the real counter has: a factor on
    content and tokens per message, which the test moves between requests."""

    def __init__(self) -> None:
        self.factor, self.per_message = 1.0, 0

    def count(self, message: Mapping[str, Any]) -> int:
        return int(self.factor * simple_count(message)) + self.per_message

    def state(self) -> tuple[float, int]:
        return self.factor, self.per_message


def _budget(window: int) -> Budget:
    return Budget(window=window, reserve=window // 8, threshold=0.8, target=0.5)


@given(
    conversations(),
    conversations(),
    st.sampled_from(PIPELINES),
    st.sampled_from([2048, 4096, 8192]),
    st.sampled_from([1, 2, 64]),
    st.data(),
)
@GROWING
def test_a_plan_resumed_from_the_cache_is_the_plan_from_scratch(
    first: list[dict[str, Any]],
    second: list[dict[str, Any]],
    pipeline: tuple[StrategyName, ...],
    window: int,
    entries: int,
    data: st.DataObject,
) -> None:
    """Two conversations grow side by side, a message or a few at a time (so a request may end
    in a call whose answers come with the next one), a request sometimes sent again without its
    last messages (a retry), the second conversation maybe starting as the first does; between
    requests the calibration may move, and with one or two entries the cache evicts.
    Every request's plan is the plan computed from scratch, and renders the same messages
    (the cache keeps pruned units as rendered; predictions of the next event add to it)."""
    counter = Calibrated()
    replays = Replays(ReplayCache(entries=entries), counter.state)
    budget = _budget(window)
    summary_tokens = summary_budget(budget.goal) if "summarize" in pipeline else 0
    fixed = data.draw(st.integers(0, 300))
    # issue 20's inputs: protected tools (the generated tool names), restore's span marker
    protect = data.draw(st.sampled_from([frozenset(), frozenset({"bash", "lookup"})]))
    marked = data.draw(st.booleans())
    if marked and not summary_tokens:
        summary_tokens = 40
    options: dict[str, Any] = {"protect": protect, "marked": marked}
    # the second may branch off the first (an edit or a retry): the same leading messages, so
    # a request of one may stop exactly where a replay of the other was remembered
    second = [*first[: data.draw(st.integers(0, len(first)))], *second]
    lengths = [0, 0]
    # quiet marks (app/compaction/quiet.py) go back to a whole replay every few units, or 64
    marks = patch.object(quiet, "MAX_UNITS", data.draw(st.sampled_from([1, 3, 64])))
    marks.start()
    try:
        _grow(first, second, lengths, data, counter, replays, budget, pipeline, fixed,
              summary_tokens, options)  # fmt: skip
    finally:
        marks.stop()


def _grow(
    first: list[dict[str, Any]],
    second: list[dict[str, Any]],
    lengths: list[int],
    data: st.DataObject,
    counter: Calibrated,
    replays: Replays,
    budget: Budget,
    pipeline: tuple[StrategyName, ...],
    fixed: int,
    summary_tokens: int,
    options: dict[str, Any],
) -> None:
    while lengths[0] < len(first) or lengths[1] < len(second):
        which = data.draw(st.integers(0, 1))
        messages = (first, second)[which]
        if lengths[which] >= len(messages):
            continue
        lengths[which] = min(len(messages), lengths[which] + data.draw(st.integers(1, 3)))
        if data.draw(st.integers(0, 4)) == 0:  # a recalibration
            counter.factor = data.draw(st.sampled_from([0.5, 0.9, 1.0, 1.3, 2.0]))
            counter.per_message = data.draw(st.integers(0, 4))
        ends = [lengths[which]]
        if data.draw(st.integers(0, 3)) == 3:  # then a retry without the last message or few
            ends.append(max(1, lengths[which] - data.draw(st.integers(1, 3))))
        for end in ends:
            request = copy.deepcopy(messages[:end])  # a new request's own objects
            got = plan(
                request, pipeline, budget, counter.count, fixed, summary_tokens,
                replays=replays, **options,
            )  # fmt: skip
            fresh = plan(request, pipeline, budget, counter.count, fixed, summary_tokens, **options)
            assert got == fresh
            # rendered from the pruned units the cache kept: what a fresh render gives
            assert render(request, got) == render(request, fresh)
            if data.draw(st.booleans()):  # the next event predicted (it teaches the cache)

                def replan(history: Any, cost: Any) -> Any:
                    return plan(
                        history, pipeline, budget, cost, fixed, summary_tokens,
                        replays=replays.peeking(), **options,
                    )  # fmt: skip

                next_event(request, got, replan, budget.trigger, counter.count)


@given(conversations(), st.data())
@settings(max_examples=200, deadline=None)
def test_roles_of_a_prefix_extended_are_the_roles_of_the_whole(
    messages: list[dict[str, Any]], data: st.DataObject
) -> None:
    whole = UnitRoles.of(messages)
    k = data.draw(st.integers(whole.head, len(whole.units)))
    prefix = whole.prefix(k)
    assert prefix == UnitRoles.of(messages[: whole.units[k - 1].end if k else 0])
    extended = prefix.extended(messages)
    assert extended is None or extended == whole
    if k and whole.head_user:  # None only when the prefix's last unit grew
        assert extended == whole or whole.units[k - 1] != prefix.units[k - 1]


@pytest.mark.parametrize("window", [1_000_000, 8192])
def test_a_growing_conversation_counts_only_what_it_adds(window: int) -> None:
    """Request n+1 renders and counts only its new units and the one before them (whose
    answers may have grown), under the threshold and over it; a compaction event (the cut
    moves) prices what it may prune, still far from the whole history, and so does the request
    after it (it resumes before the last unit, where the event happened)."""
    messages = agent_session(300)
    counted: list[Mapping[str, Any]] = []

    def count(message: Mapping[str, Any]) -> int:
        counted.append(message)
        return simple_count(message)

    replays = Replays(ReplayCache(), lambda: None)
    pipeline: tuple[StrategyName, ...] = ("truncate", "prune", "trim")
    plan(copy.deepcopy(messages[:500]), pipeline, _budget(window), count, 0, replays=replays)
    per_request, events = [], []
    for end in range(502, 602, 2):
        counted.clear()
        request = copy.deepcopy(messages[:end])
        got = plan(request, pipeline, _budget(window), count, 0, replays=replays)
        per_request.append(len(counted))
        events.append(got.events)
        assert got == plan(request, pipeline, _budget(window), simple_count, 0)
    moved = sum(a != b for a, b in pairwise(events))
    assert sum(n > 4 for n in per_request) <= 2 * moved + 1, per_request
    assert max(per_request) < 100, per_request


def test_a_compacted_conversation_renders_only_what_it_adds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Over the threshold every request is rendered compacted, its old tool rounds pruned:
    request n+1 takes the pruned rounds its replay kept instead of pruning each again, so it
    prunes only a few units (the new ones, and all of them at an event), and renders exactly
    what a fresh plan renders."""
    import inflight.compaction.unit_costs as unit_costs

    pruned: list[int] = []
    real = unit_costs.prune_unit

    def counting(*args: Any, **kwargs: Any) -> Any:
        pruned.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(unit_costs, "prune_unit", counting)
    messages = agent_session(300)
    replays = Replays(ReplayCache(), lambda: None)
    pipeline: tuple[StrategyName, ...] = ("truncate", "prune", "trim")
    budget = _budget(16_384)
    plan(copy.deepcopy(messages[:400]), pipeline, budget, simple_count, 0, replays=replays)
    per_request, events = [], []
    for end in range(402, 482, 2):
        request = copy.deepcopy(messages[:end])
        pruned.clear()
        got = plan(request, pipeline, budget, simple_count, 0, replays=replays)
        shown = render(request, got)
        per_request.append(len(pruned))
        events.append(got.events)
        assert got.pruned_before > 50  # most of the history is shown pruned
        assert shown == render(request, plan(request, pipeline, budget, simple_count, 0))
    moved = sum(a != b for a, b in pairwise(events))
    assert sum(n > 6 for n in per_request) <= 2 * moved + 1, per_request


def test_a_calibration_change_is_never_served_a_stale_replay() -> None:
    """With the real counter: after the correction moves, the next plan is the one a fresh
    replay gives with the new counts (the counter's state is part of the key)."""
    counter = ChatTokenCounter(load_encodings())
    model = "qwen2.5-coder"  # heuristic counting: calibrated by the upstream's counts
    messages = agent_session(120)
    cache: ReplayCache[Any] = ReplayCache()
    replays = Replays(cache, lambda: counter.counting(model))
    budget = _budget(16_384)
    pipeline: tuple[StrategyName, ...] = ("truncate", "prune", "trim")

    def planned(request: list[dict[str, Any]], remembered: bool) -> Any:
        memo = Counted()
        count = lambda m: count_within(counter, model, request, memo, m)  # noqa: E731
        return plan(request, pipeline, budget, count, 0, replays=replays if remembered else None)

    first = planned(copy.deepcopy(messages[:200]), True)
    sent = {"model": model, "messages": messages[:200]}
    counter.observe(model, sent, int(first.tokens_before * 1.6), overflowed=True)
    request = copy.deepcopy(messages[:202])
    got = planned(request, True)
    assert got == planned(copy.deepcopy(request), False)
    assert got.tokens_before > first.tokens_before * 1.4  # the new calibration counted


def test_the_cache_is_bounded_in_entries_and_bytes() -> None:
    pipeline: tuple[StrategyName, ...] = ("trim",)
    few = ReplayCache[Any](entries=3)
    small = ReplayCache[Any](max_bytes=200_000)
    for cache in (few, small):
        replays = Replays(cache, lambda: None)
        for i in range(10):
            messages = agent_session(40)
            messages[1] = {"role": "user", "content": f"Task {i}."}  # ten conversations
            plan(messages, pipeline, _budget(8192), simple_count, 0, replays=replays)
    assert len(few) == 3
    assert 0 < small.size <= 200_000
    assert len(small) < 10
    with pytest.raises(ValueError, match="at least one entry"):
        ReplayCache[Any](entries=0)


def test_a_request_that_stops_where_a_remembered_replay_does_is_planned_as_its_own() -> None:
    """A replay is remembered before a request's last unit, with its units priced as ones more
    follow (a protected tool's output kept whole). A request with exactly those messages — a
    branch of the conversation, or a retry without its last message — ends in one of them,
    which the plan prices as the last unit (its protected outputs cut too): it must not resume
    that replay, which has nothing left to replay for it."""
    call = {"id": "c0", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
    branch: list[dict[str, Any]] = [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": "Fix the bug."},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c0", "content": "log line " * 4000},
    ]
    replays = Replays(ReplayCache(), lambda: None)
    budget = _budget(8192)
    pipeline: tuple[StrategyName, ...] = ("truncate",)
    bash = frozenset({"bash"})

    def planned(messages: list[dict[str, Any]], remembered: bool) -> Any:
        cache = replays if remembered else None
        return plan(messages, pipeline, budget, simple_count, 0, protect=bash, replays=cache)

    longer = [*copy.deepcopy(branch), {"role": "user", "content": "And the tests?"}]
    planned(longer, True)  # remembered before its last unit: `branch`, the output kept whole
    want = planned(branch, False)
    assert want.truncated == {2}  # the last unit's protected output is cut
    assert planned(copy.deepcopy(branch), True) == want
    # the remembered replay still serves what extends it
    resumed = [*copy.deepcopy(longer), {"role": "assistant", "content": "Done."}]
    assert planned(resumed, True) == planned(resumed, False)
