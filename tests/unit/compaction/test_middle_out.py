"""`middle-out` at scale: the walk from the middle, the running sums, and a replay that stays
near-linear on huge histories (issue 12, defect 6: 16,000 messages took 23 s, 99,999 tiny ones
63 s, all of it blocking the event loop)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from inflight.compaction.engine import compact
from inflight.compaction.middle_out import MiddleOut
from inflight.compaction.policy import Budget
from inflight.compaction.sums import RunningSums
from inflight.compaction.units import check_pair_safety
from inflight.strategies import StrategyName
from tests.support.conversations import follows_strict_rule, simple_count

CPU_SECONDS = 8.0  # generous: the replay takes about a second here; quadratic took 23 s and more


def middle_order(kept: Sequence[int]) -> list[int]:
    """The reference order: the centre, then alternately left and right of it."""
    centre = len(kept) // 2
    order = [kept[centre]]
    for offset in range(1, len(kept)):
        order += [kept[i] for i in (centre - offset, centre + offset) if 0 <= i < len(kept)]
    return order


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 59)), max_size=120), st.integers(0, 60))
def test_the_walk_starts_in_the_middle_and_goes_outwards(
    operations: list[tuple[bool, int]], end: int
) -> None:
    size = 60
    middle = MiddleOut(size)
    live: list[int] = []
    added = 0
    for add, unit in operations:  # units join in order; any candidate may leave
        if add and added < size:
            middle.add(added)
            live.append(added)
            added += 1
        elif not add and unit in live:
            middle.remove(unit)
            live.remove(unit)
    # the walk is over the candidates before `end`, where only the last one may be past it
    end = max(end, live[-2] + 1) if len(live) > 1 else end
    before = [u for u in live if u < end]
    assert list(middle.walk(end)) == (middle_order(before) if before else [])


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 499), st.integers(0, 50)), max_size=200))
def test_running_sums_agree_with_plain_sums(changes: list[tuple[int, int]]) -> None:
    sums = RunningSums(500)
    values = [0] * 500
    for position, value in changes:
        sums.set(position, value)
        values[position] = value
        assert sums.prefix(position) == sum(values[:position])
    total = sum(values)
    for target in (0, 1, total // 3, total, total + 1):
        expected = next((e for e in range(501) if sum(values[:e]) >= target), 501)
        assert sums.search(target) == expected


def chat(size: int, text: str) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}]
    for i in range(size - 1):
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": f"{i} {text}"})
    return messages


def cpu_seconds(messages: Sequence[Mapping[str, Any]], pipeline: tuple[StrategyName, ...]) -> float:
    counts = {id(m): simple_count(m) for m in messages}  # the planner alone, not the counter
    start = time.process_time()
    result = compact(messages, pipeline, Budget(1024, 512, 0.8, 0.5), lambda m: counts[id(m)], 3)
    elapsed = time.process_time() - start
    assert result.applied == pipeline[-1:]
    assert check_pair_safety(result.messages) == []
    assert follows_strict_rule(result.messages)
    return elapsed


def test_middle_out_on_16000_messages_and_100000_tiny_ones_is_near_linear() -> None:
    """The issue's sizes at a 1,024-token window; CPU time, so other processes do not count."""
    big = chat(16_000, "word " * 75)  # 6.6 MB
    tiny = chat(100_000, "")
    for pipeline in (("middle-out",), ("truncate", "middle-out")):
        assert cpu_seconds(big, pipeline) < CPU_SECONDS
        assert cpu_seconds(tiny, pipeline) < CPU_SECONDS
