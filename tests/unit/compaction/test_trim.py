"""`advance_cut`, trim's one step: against a brute-force reference, and its edge cases."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from inflight.compaction.trim import advance_cut


def _reference(
    cut: int,
    costs: list[int],
    total: int,
    goal: int,
    valid: set[int],
    summary_cost: int,
    summary_present: bool,
) -> tuple[int, int]:
    """The first allowed position whose total fits; else the furthest allowed one; and no move
    at all when moving would not make the prompt smaller."""
    extra = 0 if summary_present else summary_cost
    allowed = [p for p in range(cut + 1, len(costs) + 1) if p in valid]
    totals = {p: total - sum(costs[cut:p]) + extra for p in allowed}
    fitting = [p for p in allowed if totals[p] <= goal]
    best = fitting[0] if fitting else (allowed[-1] if allowed else None)
    if best is None or totals[best] >= total:
        return cut, total
    return best, totals[best]


@given(
    costs=st.lists(st.integers(0, 50), min_size=1, max_size=12),
    cut=st.integers(0, 11),
    goal=st.integers(0, 400),
    valid=st.sets(st.integers(0, 12)),
    summary_cost=st.integers(0, 60),
    summary_present=st.booleans(),
)
def test_matches_the_reference(
    costs: list[int],
    cut: int,
    goal: int,
    valid: set[int],
    summary_cost: int,
    summary_present: bool,
) -> None:
    cut = min(cut, len(costs))
    total = sum(costs[cut:]) + 7  # the head and the fixed parts cost something too
    got = advance_cut(
        cut,
        len(costs),
        total,
        goal,
        lambda i: costs[i],
        lambda p: p in valid,
        summary_cost,
        summary_present,
    )
    assert got == _reference(cut, costs, total, goal, valid, summary_cost, summary_present)
    assert cut <= got[0] <= len(costs)
    assert got[1] <= total


def test_stops_at_the_first_allowed_position_that_fits() -> None:
    costs = [10, 10, 10, 10]
    cut, total = advance_cut(0, 4, 45, 30, costs.__getitem__, lambda p: True, 0, False)
    assert (cut, total) == (2, 25)


def test_skips_positions_that_break_role_order() -> None:
    costs = [10, 10, 10, 10]
    cut, total = advance_cut(0, 4, 45, 30, costs.__getitem__, lambda p: p == 3, 0, False)
    assert (cut, total) == (3, 15)


def test_a_summary_that_costs_what_it_replaces_moves_nothing() -> None:
    costs = [10, 10]
    assert advance_cut(0, 2, 25, 0, costs.__getitem__, lambda p: True, 20, False) == (0, 25)
    # once the summary is in the prompt, moving the cut no longer adds its cost
    assert advance_cut(0, 2, 25, 0, costs.__getitem__, lambda p: True, 20, True) == (2, 5)
