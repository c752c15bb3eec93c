"""The plan: a pure function of the message sequence, found by replaying the history in order.

The parts: the replay's state and its events (replay_state.py), what each unit costs under each
transform (unit_costs.py), the plan and the messages it renders (rendering.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from inflight.compaction.inserted import unfolded
from inflight.compaction.middle_out import MiddleOut
from inflight.compaction.policy import Budget
from inflight.compaction.quiet import Quiet, quiet_plan, still_quiet
from inflight.compaction.rendering import Plan
from inflight.compaction.replay_state import Replay
from inflight.compaction.replays import Recall, Replays
from inflight.compaction.sums import RunningSums
from inflight.compaction.truncate import cap_chars
from inflight.compaction.unit_costs import MessageCounter, UnitCosts
from inflight.compaction.units import UnitRoles
from inflight.strategies import StrategyName


def _quiet(shape: UnitRoles, costs: UnitCosts, head_cost: int, trigger: int) -> Plan | None:
    """The plan of a conversation that is under the trigger as a whole, without replaying it:
    every unit costs >= 0, so no shorter prefix crosses the trigger either, and the replay
    would end where it starts (nothing cut, dropped, truncated or pruned). None otherwise."""
    n, head = len(shape.units), shape.head
    total = head_cost + sum(costs.render(i, 0, False) for i in range(head, n))
    return quiet_plan(shape, costs, total) if total <= trigger else None


# The arguments of `plan()` that are not part of a remembered replay's key: every other one is
# (whatever its name), so that a new input cannot be left out of it.
UNKEYED = frozenset({"messages", "count", "replays"})


def plan(
    messages: Sequence[Mapping[str, Any]],
    pipeline: tuple[StrategyName, ...],
    budget: Budget,
    count: MessageCounter,
    fixed_tokens: int,
    summary_tokens: int = 0,
    *,
    protect: frozenset[str] = frozenset(),
    marked: bool = False,
    replays: Replays | None = None,
) -> Plan:
    """Replay the history unit by unit and return the plan for the whole list. `protect`: tools
    whose outputs only the last unit may prune or truncate; `marked`: a marker of
    `summary_tokens` stands for what is cut (restore on), placed like a summary. With
    `replays`, the replay resumes from the longest history prefix remembered for the same inputs
    (the plan is exactly the one a replay from the first message gives), and is remembered.

    For every prefix of the conversation (one more unit each step) the replay keeps the state a
    request of that length would have been compacted with: the cut (units after the head that are
    gone), middle-out drops, truncated units and the prune boundary. The state only changes at a
    compaction event — when that prefix crosses threshold × budget — and then it changes enough to
    come down to target × budget. So an append-only conversation produces forwarded prompts that
    extend each other between events (upstream prompt caches stay hot), events are spaced by at
    least (threshold − target) × budget tokens of growth, and any replica, after any restart,
    computes the same plan for the same history (DESIGN.md §4.7).

    Every decision at a prefix looks only at that prefix — whether the chat follows strict role
    order too (§4.6), so a later message never changes how the history was compacted. System and
    developer messages after the head are instructions: kept where they stand, never cut, dropped or
    summarised (§3). Each unit changes state a bounded number of times, each change is O(1), and
    what an event looks up costs at most O(√n) (running sums, a pointer to the middle), so a replay
    of n units is near-linear however many events it has. The state after a prefix depends on that
    prefix alone, which is what lets the replay cache (app/compaction/replays.py) resume it.
    """
    inputs = tuple(sorted((k, v) for k, v in locals().items() if k not in UNKEYED))
    recall = Recall.of(replays, inputs, messages)
    saved: Replay | Quiet | None = recall.found.state if recall and recall.found else None
    extended = saved.shape.extended(messages) if saved is not None else None
    shape = extended or UnitRoles.of(messages)
    head = shape.head
    costs = UnitCosts(messages, shape.units, count, cap_chars(budget.budget), protect)
    # A history with no user message yet is not kept: its head may still move.
    keep = recall is not None and recall.replays.keep and shape.head_user
    if saved is not None and extended is not None:
        calm = still_quiet(saved, extended, costs, budget.calm, keep)
        if calm is not None:  # under the trigger since a pristine replay: only a mark is kept
            the_plan, mark = calm
            if recall is not None and mark is not None:
                recall.remember(mark, messages, shape.units[-1].start)
            return the_plan
        replay = saved.resumed(extended, costs)
    else:
        before = fixed_tokens + sum(costs.render(i, 0, False) for i in range(head))
        quiet = None if recall is not None else _quiet(shape, costs, before, budget.calm)
        if quiet is not None:
            return quiet
        replay = _first(shape, costs, pipeline, budget, before, summary_tokens, marked)
    kept = replay.replay(budget.trigger, keep)
    if recall is not None and kept is not None:
        recall.remember(kept, messages, shape.units[-1].start)
    elif saved is not None and recall is not None and not recall.replays.keep:
        saved.learn(costs)
    return replay.result()


def _head_cost(shape: UnitRoles, costs: UnitCosts, before: int, summary_tokens: int) -> int:
    """The head's cost as a summarising plan counts it: `before` (as received), but what the
    engine folded into its user message in place of a cut span costs at most the tokens reserved
    for it — what the plan that folded it counted it at — so that compacting a compacted request
    plans what the first compaction planned (DESIGN.md §4.5)."""
    if not shape.head_user:
        return before
    host = shape.units[shape.head - 1]  # the first user message, a unit of its own
    bare = unfolded(costs.messages[host.start])
    if bare is None:
        return before
    folded = costs.render(shape.head - 1, 0, False) - costs.count(bare)
    return before - max(0, folded - summary_tokens)


def _first(
    shape: UnitRoles,
    costs: UnitCosts,
    pipeline: tuple[StrategyName, ...],
    budget: Budget,
    before: int,
    summary_tokens: int,
    marked: bool,
) -> Replay:
    """The replay of a history from its first unit after the head (`before`: what the head
    costs as received): nothing replayed yet."""
    n, head = len(shape.units), shape.head
    summarizing = "summarize" in pipeline or marked
    return Replay(
        shape=shape,
        costs=costs,
        pipeline=pipeline,
        budget=budget,
        head_cost=_head_cost(shape, costs, before, summary_tokens) if summarizing else before,
        summary_tokens=summary_tokens,
        costs_now=[0] * n,
        sums=RunningSums(n) if "prune" in pipeline else None,
        savings=RunningSums(n) if "prune" in pipeline else None,
        middle=MiddleOut(n) if "middle-out" in pipeline else None,
        cut=head,
        pruned_before=head,
        scanned=head,
        goal=budget.goal if budget.cost is None else budget.cost.kept(budget.goal),
        marked=marked,
        replayed=head,
        before=before,
    )
