"""Quiet marks (app/compaction/quiet.py): while a conversation stays under the trigger, its
replay is remembered as a mark (the last pristine replay, and what the units after it cost)
instead of a copy of the whole state. Every plan is still the plan from scratch — quiet, at
the request that crosses the trigger, and after — each request counts only what it adds, and
a mark never runs more than `MAX_UNITS` past a whole replay."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import pytest

import inflight.compaction.quiet as quiet
from inflight.compaction.planner import plan
from inflight.compaction.policy import Budget
from inflight.compaction.quiet import Quiet
from inflight.compaction.replay_state import Replay
from inflight.compaction.replays import ReplayCache, Replays
from inflight.strategies import StrategyName
from tests.support.conversations import agent_session, simple_count

PIPELINES: list[tuple[StrategyName, ...]] = [
    ("truncate", "prune", "trim"),
    ("middle-out",),
    ("summarize",),
    ("truncate", "prune", "summarize"),
]


def _states(cache: ReplayCache[Any]) -> list[Any]:
    return [entry.state for entry in cache._entries.values()]


@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("max_units", [4, 64])
def test_a_conversation_growing_past_the_trigger_is_planned_as_from_scratch(
    monkeypatch: pytest.MonkeyPatch, pipeline: tuple[StrategyName, ...], max_units: int
) -> None:
    """One message a request, from far under the trigger to well past it: each plan equals a
    fresh replay's; quiet requests leave a mark (never more than `max_units` units past its
    whole replay) and count only their new units."""
    monkeypatch.setattr(quiet, "MAX_UNITS", max_units)
    messages = agent_session(150, words=40)
    budget = Budget(window=16_384, reserve=1024, threshold=0.8, target=0.5)
    summary_tokens = 300 if "summarize" in pipeline else 0
    cache: ReplayCache[Any] = ReplayCache()
    replays = Replays(cache, lambda: None)
    counted: list[Mapping[str, Any]] = []

    def count(message: Mapping[str, Any]) -> int:
        counted.append(message)
        return simple_count(message)

    kinds, compacted = [], 0
    for end in range(3, len(messages) + 1):
        request = copy.deepcopy(messages[:end])  # a new request's own objects
        counted.clear()
        got = plan(request, pipeline, budget, count, 50, summary_tokens, replays=replays)
        assert got == plan(request, pipeline, budget, simple_count, 50, summary_tokens)
        if end > 3 and not got.changed:  # quiet: none but the last two units' messages
            recounted = {id(m) for m in counted} & {id(m) for m in request[: end - 4]}
            assert not recounted, end
        (state,) = _states(cache)
        kinds.append(type(state))
        if isinstance(state, Quiet):
            assert got.tokens_before <= budget.trigger
            assert not got.changed
            assert state.start.pristine
            assert 0 < state.replayed - state.start.replayed <= max_units
        compacted += got.changed
    assert Quiet in kinds
    assert kinds.index(Replay, kinds.index(Quiet)) > 0  # a whole replay again after marks
    assert compacted  # it crossed the trigger, and was compacted from there on


def test_a_retry_and_a_branch_resume_a_mark_as_from_scratch() -> None:
    """Two conversations sharing their start, and retries without the last messages: marks are
    found by their messages like whole replays, and each plan is the plan from scratch."""
    base = agent_session(60, words=30)
    other = [*base[:40], {"role": "user", "content": "Now something else."}]
    other += agent_session(30, words=90)[2:]
    budget = Budget(window=8192, reserve=512, threshold=0.8, target=0.5)
    pipeline: tuple[StrategyName, ...] = ("truncate", "prune", "trim")
    replays = Replays(ReplayCache(), lambda: None)
    for end in range(20, 80):
        for messages, stop in ((base, end), (other, end), (base, max(3, end - 3))):
            request = copy.deepcopy(messages[: min(stop, len(messages))])
            got = plan(request, pipeline, budget, simple_count, 0, replays=replays)
            assert got == plan(request, pipeline, budget, simple_count, 0)
