"""The next event's prediction resumes the request's replay read-only (issue 16): it is the plan
a replay from the first message gives, it leaves the cache as it was, and it does not count
the history again — the request's own plan has just counted it."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import pytest

from inflight.compaction.planner import plan
from inflight.compaction.policy import Budget
from inflight.compaction.replays import ReplayCache, Replays
from inflight.compaction.summary.ahead import next_event
from inflight.compaction.summary.rolling import summary_budget
from inflight.strategies import StrategyName
from tests.support.conversations import agent_session, simple_count


@pytest.mark.parametrize("marked", [False, True])
@pytest.mark.parametrize("end", [150, 231, 260, 301])
def test_the_prediction_from_the_cache_is_the_prediction_from_scratch(
    end: int, marked: bool
) -> None:
    pipeline: tuple[StrategyName, ...] = ("truncate", "prune", "summarize")
    budget = Budget(window=16_384, reserve=1024, threshold=0.8, target=0.5)
    size = summary_budget(budget.goal) + (40 if marked else 0)
    protect = frozenset({"bash"}) if marked else frozenset()
    cache: ReplayCache[Any] = ReplayCache()
    replays = Replays(cache, lambda: None)
    messages = agent_session(200, words=60)
    counted: list[Mapping[str, Any]] = []

    def count(message: Mapping[str, Any]) -> int:
        counted.append(message)
        return simple_count(message)

    def replan(peek: Replays | None) -> Any:
        def planned(history: Any, cost: Any) -> Any:
            return plan(
                history, pipeline, budget, cost, 30, size,
                protect=protect, marked=marked, replays=peek,
            )  # fmt: skip

        return planned

    for k in range(end - 6, end + 1, 2):  # the session so far, remembered
        request = copy.deepcopy(messages[:k])
        current = plan(
            request, pipeline, budget, count, 30, size,
            protect=protect, marked=marked, replays=replays,
        )  # fmt: skip
    held = [(entry.key, entry.text) for entry in cache._entries.values()]
    counted.clear()
    peeked = next_event(request, current, replan(replays.peeking()), budget.trigger, count)
    assert [(entry.key, entry.text) for entry in cache._entries.values()] == held
    # the history is not counted again (an event may still price pruned copies of old rounds)
    peeked_counts = len(counted)
    counted.clear()
    fresh = next_event(request, current, replan(None), budget.trigger, count)
    assert peeked == fresh
    assert peeked_counts <= len(counted) - len(request) + 4, (peeked_counts, len(counted))
