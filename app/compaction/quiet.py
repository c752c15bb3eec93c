"""A conversation's replay while it stays under the trigger: a mark, not a copy of the state."""

from __future__ import annotations

from dataclasses import dataclass

from inflight.compaction.rendering import Plan
from inflight.compaction.replay_state import Replay
from inflight.compaction.unit_costs import UnitCosts
from inflight.compaction.units import UnitRoles

# How far a mark may run past its start (units): its costs are copied on every request, and a
# request crossing the trigger replays them again.
MAX_UNITS = 64


def quiet_plan(shape: UnitRoles, costs: UnitCosts, total: int) -> Plan:
    """The plan of a history none of whose prefixes crossed the trigger (or whose events found
    nothing to do): everything kept as it is, `total` tokens."""
    head = shape.head
    return Plan(
        units=shape.units,
        head=head,
        cut=head,
        dropped=frozenset(),
        truncated=frozenset(),
        pruned_before=head,
        cap=costs.cap,
        events=(),
        summarize=False,
        tokens_before=total,
        tokens_after=total,
        strict=shape.strict(len(shape.units)),
        pinned=shape.pinned,
        protect=costs.protect,
        shown=costs.shown,
    )


@dataclass(frozen=True, slots=True)
class Quiet:
    """The replay of a prefix nothing happened to: `start` (a pristine remembered replay), then
    the units after it (at least one), which cost `costs` as they are; `shape`: the prefix's
    roles.

    Most requests of a conversation are far from its window: their replay adds units and nothing
    happens to any of them. Remembering such a replay whole costs copies of its state (the running
    sums, the costs of every unit, their memo) on every request, which grow with the conversation. A
    mark holds instead the last whole replay remembered that nothing had happened to (`start`), with
    what the units after it cost as they are and the prefix's total.

    A request that extends a mark and is still under the trigger as a whole is quiet too: every
    prefix of it costs no more than it does (costs are never negative, and nothing stands in for a
    cut), so its replay would cross the trigger nowhere and end as it started — the plan
    `quiet_plan` gives, exactly. Its mark extends the last one by the units it adds. A request that
    crosses the trigger resumes `start` with the marked units' costs known (`resumed`) and replays
    on from there as from any remembered replay; so does one that would take a mark more than
    `MAX_UNITS` past its start, whose whole replay is remembered again.
    """

    start: Replay
    shape: UnitRoles
    costs: tuple[int, ...]
    before: int  # the prefix's tokens (the fixed ones included)

    @property
    def replayed(self) -> int:
        return self.start.replayed + len(self.costs)

    def resumed(self, shape: UnitRoles, costs: UnitCosts) -> Replay:
        """`start` resumed for a longer history (`shape`, priced by `costs`), the marked units'
        costs known to `costs`: replaying them again counts nothing."""
        first = self.start.replayed
        costs.memo.update({(first + i, 0, False): cost for i, cost in enumerate(self.costs)})
        return self.start.resumed(shape, costs)

    def learn(self, costs: UnitCosts) -> None:
        """`Replay.learn` for `start` (the marked units' costs are the mark's own)."""
        self.start.learn(costs)


def still_quiet(
    state: Replay | Quiet, shape: UnitRoles, costs: UnitCosts, trigger: int, keep: bool
) -> tuple[Plan, Quiet | None] | None:
    """The plan of a history (`shape`) that extends `state`'s prefix and is under `trigger` as
    a whole, and its mark before its last unit when `keep` (where a later request resumes, as
    the replay keeps), unless `state` is that already; None when the history is not quiet, or
    not cheaply so."""
    start = state.start if isinstance(state, Quiet) else state
    if not start.pristine:
        return None
    n = len(shape.units)
    if n - start.replayed > MAX_UNITS:
        return None
    marked = state.costs if isinstance(state, Quiet) else ()
    added = [costs.render(i, 0, False) for i in range(state.replayed, n)]
    total = state.before + sum(added)
    if total > trigger or not added:
        # the replay goes on with `costs`, and remembers them before the last unit, which a
        # later request may have grown: its price must not be among them
        costs.memo.pop((n - 1, 0, False), None)
        return None
    mark = None
    if keep and len(added) > 1:  # (one unit added: `state` itself stands for the prefix)
        mark = Quiet(start, shape.prefix(n - 1), marked + tuple(added[:-1]), total - added[-1])
    return quiet_plan(shape, costs, total), mark
