"""The plan: a pure function of the message sequence, found by replaying the history in order.

For every prefix of the conversation (one more unit each step) the replay keeps the state a
request of that length would have been compacted with: the cut (units after the head that are
gone), middle-out drops, truncated units and the prune boundary. The state only changes at a
compaction event — when that prefix crosses threshold × budget — and then it changes enough
to come down to target × budget. So an append-only conversation produces forwarded prompts
that extend each other between events (upstream prompt caches stay hot), events are spaced by
at least (threshold − target) × budget tokens of growth, and any replica, after any restart,
computes the same plan for the same history (DESIGN.md §4.7).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.compaction.middle_out import drop_middle
from app.compaction.policy import Budget, StrategyName
from app.compaction.prune import MIN_SAVING_SHARE, PROTECT_SHARE, prune_unit
from app.compaction.trim import advance_cut
from app.compaction.truncate import cap_chars, truncate_unit
from app.messages import Unit, group_units, is_strict_alternation, pinned_head

MessageCounter = Callable[[Mapping[str, Any]], int]


@dataclass(frozen=True, slots=True)
class Plan:
    """What to keep and how, for the whole message list."""

    units: tuple[Unit, ...]
    head: int
    cut: int
    dropped: frozenset[int]
    truncated: frozenset[int]
    pruned_before: int
    cap: int
    events: tuple[int, ...]  # the cut after each event that moved it (rolling summaries)
    summarize: bool
    tokens_before: int
    tokens_after: int  # with the summary's reserved size when `summarize`
    strict: bool
    deep: frozenset[int] = frozenset()  # truncated units whose texts all share the cap (§3)

    @property
    def changed(self) -> bool:
        return bool(
            self.cut > self.head or self.dropped or self.truncated or self.pruned_before > self.head
        )


@dataclass(slots=True)
class _Costs:
    """Unit rendering and token cost under each transform, memoised."""

    messages: Sequence[Mapping[str, Any]]
    units: Sequence[Unit]
    count: MessageCounter
    cap: int
    _memo: dict[tuple[int, int, bool], tuple[list[Mapping[str, Any]], int]] = field(
        default_factory=dict
    )

    def render(self, i: int, truncated: int, pruned: bool) -> tuple[list[Mapping[str, Any]], int]:
        """Unit i and its cost; `truncated` is 0 (no), 1 (tool outputs) or 2 (deep)."""
        key = (i, truncated, pruned)
        found = self._memo.get(key)
        if found is not None:
            return found
        unit = self.units[i]
        out: list[Mapping[str, Any]] = list(self.messages[unit.start : unit.end])
        if truncated:
            cut = truncate_unit(out, self.cap, deep=truncated > 1)
            if all(a is b for a, b in zip(cut, out, strict=True)):  # nothing to cut: as is
                self._memo[key] = self.render(i, 0, pruned)
                return self._memo[key]
            out = cut
        if pruned and unit.kind in ("tool_round", "function_round"):
            out = prune_unit(out)
        result = (out, sum(self.count(m) for m in out))
        self._memo[key] = result
        return result

    def has_giant_output(self, i: int) -> bool:
        """Whether truncating unit i's tool outputs changes it and makes it cheaper."""
        return self.render(i, 1, False)[1] < self.render(i, 0, False)[1]


@dataclass(slots=True)
class _Replay:
    costs: _Costs
    pipeline: tuple[StrategyName, ...]
    budget: Budget
    head: int
    head_cost: int
    summary_tokens: int
    strict: bool
    first_roles: Sequence[Any]
    cut: int = 0
    dropped: set[int] = field(default_factory=set)
    truncated: set[int] = field(default_factory=set)
    deep: set[int] = field(default_factory=set)
    scanned: int = 0  # units before this were already checked for giant outputs
    pruned_before: int = 0
    events: list[int] = field(default_factory=list)

    @property
    def summarizing(self) -> bool:
        return "summarize" in self.pipeline

    def cost(self, i: int) -> int:
        if i in self.dropped or i < self.cut:
            return 0
        level = 2 if i in self.deep else int(i in self.truncated)
        return self.costs.render(i, level, i < self.pruned_before)[1]

    def view(self, k: int) -> int:
        summary = self.summary_tokens if self.summarizing and self.cut > self.head else 0
        return self.head_cost + summary + sum(self.cost(i) for i in range(self.cut, k))

    def valid_cut(self, position: int) -> bool:
        if not self.strict or position >= len(self.first_roles):
            return True
        role = self.first_roles[position]
        # The head ends with a user message: after it comes an assistant message (trim), or
        # the summary as an assistant message and then a user message (summarize).
        return bool(role == ("user" if self.summarizing else "assistant"))

    def pair_of(self, i: int) -> int | None:
        if self.first_roles[i] == "assistant":
            return i + 1
        return None

    def event(self, k: int, total: int) -> int:
        goal = self.budget.goal
        for strategy in self.pipeline:
            if total <= goal:
                break
            if strategy == "truncate":
                self._truncate(k)
            elif strategy == "prune":
                self._prune(k)
            elif strategy in ("trim", "summarize"):
                moved, _ = advance_cut(
                    self.cut,
                    k - 1,
                    total,
                    goal,
                    self.cost,
                    self.valid_cut,
                    self.summary_tokens if self.summarizing else 0,
                    self.cut > self.head,
                )
                if moved != self.cut:
                    self.cut = moved
                    self.events.append(moved)
            elif strategy == "middle-out":
                kept = [i for i in range(self.cut, k - 1) if i not in self.dropped]
                pair = self.pair_of if self.strict else None
                gone, _ = drop_middle(kept, total, goal, self.cost, pair)
                self.dropped |= gone
            total = self.view(k)
        return total

    def _truncate(self, k: int) -> None:
        for i in range(max(self.cut, self.scanned), k):
            if i not in self.dropped and self.costs.has_giant_output(i):
                self.truncated.add(i)
        self.scanned = k
        # Last resort (DESIGN.md §3): the units no cut can remove must fit the budget on their
        # own, so their assistant text and answered call arguments share the cap too.
        tail = range(self._uncuttable_from(k), k)
        summary = self.summary_tokens if self.summarizing else 0
        if self.head_cost + summary + sum(self.cost(i) for i in tail) <= self.budget.budget:
            return
        for i in tail:
            if i in self.dropped:
                continue
            if self.costs.render(i, 2, False)[1] < self.costs.render(i, 1, False)[1]:
                self.truncated.add(i)
                self.deep.add(i)

    def _uncuttable_from(self, k: int) -> int:
        """The first of the units no cut can remove: the last unit, and before it those no valid
        cut position separates from it (in a strict chat, the assistant message before the last
        user message). At most the span `advance_cut` walks anyway."""
        start = k - 1
        while start > self.cut and not self.valid_cut(start):
            start -= 1
        return start

    def _prune(self, k: int) -> None:
        protect = int(PROTECT_SHARE * self.budget.budget)
        protected = 0
        boundary = self.cut
        for i in range(k - 2, self.cut - 1, -1):  # the last unit (k-1) is always protected
            protected += self.cost(i)
            if protected > protect:
                boundary = i + 1
                break
        start = max(self.cut, self.pruned_before)
        if boundary <= start:
            return
        saving = sum(
            self.cost(i) - self.costs.render(i, i in self.truncated, True)[1]
            for i in range(start, boundary)
            if i not in self.dropped
        )
        if saving >= MIN_SAVING_SHARE * self.budget.budget:
            self.pruned_before = boundary


def plan(
    messages: Sequence[Mapping[str, Any]],
    pipeline: tuple[StrategyName, ...],
    budget: Budget,
    count: MessageCounter,
    fixed_tokens: int,
    summary_tokens: int = 0,
) -> Plan:
    """Replay the history unit by unit and return the plan for the whole list."""
    units = group_units(messages)
    head = pinned_head(messages, units)
    cap = cap_chars(budget.budget)
    costs = _Costs(messages, units, count, cap)
    head_cost = fixed_tokens + sum(costs.render(i, False, False)[1] for i in range(head))
    strict = is_strict_alternation(messages)
    replay = _Replay(
        costs=costs,
        pipeline=pipeline,
        budget=budget,
        head=head,
        head_cost=head_cost,
        summary_tokens=summary_tokens,
        strict=strict,
        first_roles=[messages[u.start].get("role") for u in units],
        cut=head,
        pruned_before=head,
    )
    total = head_cost
    before = head_cost
    for k in range(head + 1, len(units) + 1):
        added = replay.cost(k - 1)
        before += costs.render(k - 1, False, False)[1]
        total += added
        if total > budget.trigger and pipeline:
            total = replay.event(k, total)
    return Plan(
        units=tuple(units),
        head=head,
        cut=replay.cut,
        dropped=frozenset(replay.dropped),
        truncated=frozenset(replay.truncated),
        pruned_before=replay.pruned_before,
        cap=cap,
        events=tuple(replay.events),
        summarize=replay.summarizing and replay.cut > head,
        tokens_before=before,
        tokens_after=total,
        strict=strict,
        deep=frozenset(replay.deep),
    )


def render_span(
    messages: Sequence[Mapping[str, Any]], plan: Plan, start: int, end: int
) -> list[Mapping[str, Any]]:
    """Units `[start, end)` as the plan shows them (truncated, pruned), for a summary."""
    out: list[Mapping[str, Any]] = []
    for i in range(start, end):
        unit = plan.units[i]
        chunk: list[Mapping[str, Any]] = list(messages[unit.start : unit.end])
        if i in plan.truncated:
            chunk = truncate_unit(chunk, plan.cap, deep=i in plan.deep)
        if i < plan.pruned_before and unit.kind in ("tool_round", "function_round"):
            chunk = prune_unit(chunk)
        out.extend(chunk)
    return out


def render(messages: Sequence[Mapping[str, Any]], plan: Plan) -> list[Mapping[str, Any]]:
    """The kept messages (head, then the units after the cut), transformed as planned.

    A summary, when there is one, is inserted by the caller right after the head.
    """
    out: list[Mapping[str, Any]] = []
    for i, unit in enumerate(plan.units):
        if i < plan.head:
            out.extend(messages[unit.start : unit.end])
            continue
        if i < plan.cut or i in plan.dropped:
            continue
        chunk: list[Mapping[str, Any]] = list(messages[unit.start : unit.end])
        if i in plan.truncated:
            chunk = truncate_unit(chunk, plan.cap, deep=i in plan.deep)
        if i < plan.pruned_before and unit.kind in ("tool_round", "function_round"):
            chunk = prune_unit(chunk)
        out.extend(chunk)
    return out
