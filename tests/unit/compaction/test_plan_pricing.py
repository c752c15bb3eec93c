"""Shortcuts of the replay give exactly the replay's plan: what pruning would save is priced
only once `prune` first runs (a request under the threshold never renders pruned copies), and
a conversation under the trigger as a whole is not replayed at all."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inflight.compaction import planner, replay_state
from inflight.compaction.policy import Budget
from inflight.compaction.rendering import Plan
from inflight.strategies import StrategyName
from tests.support.conversations import conversations, simple_count

PIPELINES: list[tuple[StrategyName, ...]] = [
    (),
    ("truncate", "prune", "trim"),
    ("prune", "middle-out"),
    ("prune", "summarize"),
    ("prune",),
]


def eager_plan(messages: list[dict[str, Any]], pipeline: Any, budget: Budget) -> Plan:
    """The plan replayed in full, every unit priced when it joins the prefix (as before)."""
    original = replay_state.Replay.__init__

    def priced_up_front(self: replay_state.Replay, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self.priced = 1 << 40

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(replay_state.Replay, "__init__", priced_up_front)
        patch.setattr(planner, "_quiet", lambda *_: None)  # always replayed
        return planner.plan(messages, pipeline, budget, simple_count, 0, 50)


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(conversations(), st.sampled_from(PIPELINES), st.integers(600, 400_000))
def test_shortcuts_give_the_replayed_plan(
    messages: list[dict[str, Any]], pipeline: tuple[StrategyName, ...], window: int
) -> None:
    budget = Budget(window=window, reserve=window // 8, threshold=0.8, target=0.5)
    for k in range(1, len(messages) + 1):
        lazy = planner.plan(messages[:k], pipeline, budget, simple_count, 0, 50)
        assert lazy == eager_plan(messages[:k], pipeline, budget)
