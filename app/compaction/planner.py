"""The plan: a pure function of the message sequence, found by replaying the history in order.

For every prefix of the conversation (one more unit each step) the replay keeps the state a
request of that length would have been compacted with: the cut (units after the head that are
gone), middle-out drops, truncated units and the prune boundary. The state only changes at a
compaction event — when that prefix crosses threshold × budget — and then it changes enough
to come down to target × budget. So an append-only conversation produces forwarded prompts
that extend each other between events (upstream prompt caches stay hot), events are spaced by
at least (threshold − target) × budget tokens of growth, and any replica, after any restart,
computes the same plan for the same history (DESIGN.md §4.7).

Every decision at a prefix looks only at that prefix — whether the chat follows strict role
order too (§4.6), so a later message never changes how the history was compacted. System and
developer messages after the head are instructions: kept where they stand, never cut, dropped
or summarised (§3). Each unit changes state a bounded number of times, each change is O(1),
and what an event looks up costs at most O(√n) (running sums, a pointer to the middle), so a
replay of n units is near-linear however many events it has.

The state after a prefix depends on that prefix alone, so with a replay cache
(app/compaction/replays.py) the next request of a conversation resumes where the last one's
replay stood before its last unit and replays only what it adds: the same plan, exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from app.compaction.middle_out import MiddleOut
from app.compaction.policy import Budget, StrategyName
from app.compaction.prune import MIN_SAVING_SHARE, PROTECT_SHARE, prune_unit
from app.compaction.replays import Recall, Replays
from app.compaction.sums import RunningSums
from app.compaction.trim import advance_cut
from app.compaction.truncate import cap_chars, truncate_unit
from app.compaction.units import Unit, UnitRoles

MessageCounter = Callable[[Mapping[str, Any]], int]
# A pruned unit as the plan shows it, message by message: None where it is the client's own
# message, else what stands for it (a placeholder of ours): see `_Costs.shown`.
Shown = tuple[Mapping[str, Any] | None, ...]
SummaryRole = Literal["user", "assistant", "fold"]
TOOL_KINDS = ("tool_round", "function_round")


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
    pinned: frozenset[int] = frozenset()  # system/developer units after the head: always kept
    # Where a summary goes: a message of this role right after the head, or "fold": an extra
    # text part of the head's user message (when neither role fits between its neighbours).
    summary_role: SummaryRole = "assistant"
    protect: frozenset[str] = frozenset()  # tools whose outputs only the last unit may cut (§11)
    # Restore on (§11): one marker stands for what was cut or dropped, placed like a summary,
    # its tokens reserved like a summary's.
    marker: bool = False
    # Pruned units as the replay priced them (`_Costs.shown`): rendering takes them as they are
    # instead of pruning each unit again. Not part of what the plan is.
    shown: Mapping[int, Shown] = field(default_factory=dict, compare=False, repr=False)

    @property
    def changed(self) -> bool:
        return bool(
            self.cut > self.head or self.dropped or self.truncated or self.pruned_before > self.head
        )

    def kept(self, i: int) -> bool:
        """Whether unit i is in the output (transformed or not)."""
        if i < self.head or i in self.pinned:
            return True
        return i >= self.cut and i not in self.dropped


def _truncation_level(i: int, truncated: AbstractSet[int], deep: AbstractSet[int]) -> int:
    """How unit i is truncated: 0 not, 1 its tool outputs, 2 deep (every text shares the cap)."""
    return 2 if i in deep else int(i in truncated)


def _transform(
    chunk: list[Mapping[str, Any]],
    unit: Unit,
    cap: int,
    level: int,
    pruned: bool,
    protect: AbstractSet[str],
) -> list[Mapping[str, Any]]:
    """A unit's messages truncated (`level` 1: tool outputs, 2: deep) and pruned as planned,
    the outputs of `protect`ed tools left whole (the caller passes none for the last unit)."""
    original = chunk
    if level:
        chunk = truncate_unit(chunk, cap, deep=level > 1, start=unit.start, protect=protect)
    if pruned and unit.kind in TOOL_KINDS:
        chunk = prune_unit(chunk, unit.start, protect, original)
    return chunk


@dataclass(slots=True)
class _Costs:
    """The token cost of each unit under each transform, memoised."""

    messages: Sequence[Mapping[str, Any]]
    units: Sequence[Unit]
    count: MessageCounter
    cap: int
    protect: frozenset[str] = frozenset()
    memo: dict[tuple[int, int, bool], int] = field(default_factory=dict)
    # Each unit priced pruned (and not truncated), as it renders: a pure function of the unit
    # and its place, kept with the memo so that a request resuming a replay renders the units
    # it pruned before without pruning them again. Only our placeholders are held.
    shown: dict[int, Shown] = field(default_factory=dict)

    def render(self, i: int, truncated: int, pruned: bool) -> int:
        """Unit i's cost; `truncated` is 0 (no), 1 (tool outputs) or 2 (deep)."""
        key = (i, truncated, pruned)
        found = self.memo.get(key)
        if found is not None:
            return found
        unit = self.units[i]
        chunk = list(self.messages[unit.start : unit.end])
        protect = self.protect if i < len(self.units) - 1 else frozenset()
        out = _transform(chunk, unit, self.cap, truncated, pruned, protect)
        if truncated and all(a is b for a, b in zip(out, chunk, strict=True)):
            cost = self.render(i, 0, pruned)  # nothing to cut: as is
        else:
            cost = self.count(out[0]) if len(out) == 1 else sum(map(self.count, out))
            if pruned and not truncated:
                self.shown[i] = tuple(
                    None if a is b else a for a, b in zip(out, chunk, strict=True)
                )
        self.memo[key] = cost
        return cost

    def detached(self) -> _Costs:
        """A copy of the costs known so far, holding no message (what a remembered replay
        keeps)."""
        return replace(
            self,
            messages=(),
            units=(),
            count=_uncounted,
            memo=dict(self.memo),
            shown=dict(self.shown),
        )

    def learn(self, other: _Costs, units: int) -> None:
        """Take what `other` priced of the first `units` units, which this one prices the same
        (a remembered replay, from a what-if plan that resumed it: the next event's
        prediction prices every unit at its event, and the next one need not again). One
        `dict.update`, atomic for other threads resuming from this memo meanwhile."""
        self.memo.update({key: cost for key, cost in other.memo.items() if key[0] < units})
        self.shown.update({i: shown for i, shown in other.shown.items() if i < units})

    def has_giant_output(self, i: int) -> bool:
        """Whether truncating unit i's tool outputs changes it and makes it cheaper."""
        if self.units[i].kind == "message":
            return False  # a user, assistant or system message: tool outputs are what is cut
        return self.render(i, 1, False) < self.render(i, 0, False)


def _uncounted(message: Mapping[str, Any]) -> int:
    raise RuntimeError("a remembered replay counts nothing: it is resumed with a count")


@dataclass(slots=True)
class _Replay:
    """The state of the plan for the prefix replayed so far: what each unit after the head
    costs now (0 once gone) and their total; when pruning, running sums of those costs and of
    what pruning each unit would save."""

    shape: UnitRoles
    costs: _Costs
    pipeline: tuple[StrategyName, ...]
    budget: Budget
    head_cost: int
    summary_tokens: int
    costs_now: list[int]
    sums: RunningSums | None  # when pruning
    savings: RunningSums | None  # when pruning
    middle: MiddleOut | None  # when dropping from the middle
    cut: int
    pruned_before: int
    scanned: int  # units before this were already checked for giant outputs
    dropped: set[int] = field(default_factory=set)
    truncated: set[int] = field(default_factory=set)
    deep: set[int] = field(default_factory=set)
    events: list[int] = field(default_factory=list)
    summary_role: SummaryRole = "assistant"
    marked: bool = False  # restore on: a marker stands for what is cut (reserved like a summary)
    goal: int = 0  # the budget's goal, computed once
    kept_total: int = 0  # the cost of the units after the head replayed so far
    pinned_total: int = 0  # the part of it that pinned instructions cost
    saving_total: int = 0  # what pruning every unit not pruned yet would save (when pruning)
    priced: int = 0  # units before this have their savings up to date (when pruning)
    replayed: int = 0  # the prefix replayed so far, in units
    before: int = 0  # its tokens as received

    def _copy(self, shape: UnitRoles, costs: _Costs) -> _Replay:
        """This state for `shape`'s units (those replayed are the same), priced by `costs`;
        nothing in it is shared with this one."""
        n = len(shape.units)
        return replace(
            self,
            shape=shape,
            costs=costs,
            costs_now=self.costs_now[:n] + [0] * (n - len(self.costs_now)),
            sums=None if self.sums is None else self.sums.resized(n),
            savings=None if self.savings is None else self.savings.resized(n),
            middle=None if self.middle is None else self.middle.resized(n),
            dropped=set(self.dropped),
            truncated=set(self.truncated),
            deep=set(self.deep),
            events=list(self.events),
        )

    def saved(self) -> _Replay:
        """The state now, for the prefix replayed alone and holding no message: what a
        replay cache keeps."""
        return self._copy(self.shape.prefix(self.replayed), self.costs.detached())

    def resumed(self, shape: UnitRoles, costs: _Costs) -> _Replay:
        """A saved state, to go on with for a longer history (`shape`: its units, the first
        ones those replayed) priced by `costs`."""
        costs.memo.update(self.costs.memo)
        costs.shown.update(self.costs.shown)
        return self._copy(shape, costs)

    def replay(self, trigger: int, keep: bool) -> _Replay | None:
        """Replay the units not replayed yet, one at a time, with an event whenever the prefix
        so far crosses the trigger. `keep`: return the state before the last unit (a later
        request resumes there: its last unit may have grown, a call with more answers)."""
        n, kept = len(self.shape.units), None
        for k in range(self.replayed + 1, n + 1):
            if keep and k == n:
                self.replayed = n - 1
                kept = self.saved()
            self.before += self.add(k - 1)
            if self.pipeline and self.total(k) > trigger:
                self.event(k)
        self.replayed = n
        return kept

    @property
    def summarizing(self) -> bool:
        """Whether something stands for the cut (a summary, or restore's marker)."""
        return "summarize" in self.pipeline or self.marked

    def stands_in(self) -> bool:
        """Whether the stand-in is in the prompt now (its tokens counted)."""
        if not self.summarizing:
            return False
        return self.cut > self.shape.head or (self.marked and bool(self.dropped))

    def cost(self, i: int) -> int:
        return self.costs_now[i]

    def _kept(self, i: int) -> bool:
        return i in self.shape.pinned or (i >= self.cut and i not in self.dropped)

    def refresh(self, i: int) -> None:
        """Bring unit i's running sums up to date with its state."""
        kept = self._kept(i)
        level = _truncation_level(i, self.truncated, self.deep)
        pruned = i < self.pruned_before
        cost = self.costs.render(i, level, pruned) if kept else 0
        self.kept_total += cost - self.costs_now[i]
        self.costs_now[i] = cost
        if self.sums is not None:
            self.sums.set(i, cost)
        if i < self.priced:
            self._price(i, level)

    def _price(self, i: int, level: int) -> None:
        """Bring what pruning unit i would save up to date with its state. Only `_prune` reads
        these, so they are priced when it first runs (pricing renders a pruned copy of every
        tool round: a request under the threshold never pays for it)."""
        if self.savings is None:
            return
        saving = 0
        if self._kept(i) and i >= self.pruned_before and self.shape.units[i].kind in TOOL_KINDS:
            saving = self.cost(i) - self.costs.render(i, level, True)
        self.saving_total += saving - self.savings[i]
        self.savings.set(i, saving)

    def add(self, i: int) -> int:
        """Unit i joins the prefix (as it is: nothing transforms it yet); returns its cost."""
        self.refresh(i)
        cost = self.cost(i)
        if i in self.shape.pinned:
            self.pinned_total += cost
        elif self.middle is not None:
            self.middle.add(i)
        return cost

    def total(self, k: int) -> int:
        """Tokens of the prefix of k units as the plan shows it now."""
        summary = self.summary_tokens if self.stands_in() else 0
        return self.head_cost + summary + self.kept_total

    def valid_cut(self, position: int, k: int) -> bool:
        """Whether the cut may stand before unit `position` in the prefix of k units. In a
        strict chat the head's user message must be followed by an assistant turn, now and when
        the conversation goes on; a summary goes in between as an assistant message before a
        user turn, or folded into the head when no turn follows yet (never before a kept
        assistant turn: a fold there would cost the head's place in the prompt cache)."""
        if not self.shape.strict(k):
            return True
        following = self.shape.next_role(position, k, frozenset())
        if not self.summarizing:
            return bool(following == "assistant")
        return following == "user" or self.shape.next_turn[position] >= k

    def event(self, k: int) -> None:
        """The prefix of k units crossed the threshold: apply the pipeline down to the goal."""
        before = (self.cut, len(self.dropped))
        for strategy in self.pipeline:
            if self.total(k) <= self.goal:
                break
            if strategy == "truncate":
                self._truncate(k)
            elif strategy == "prune":
                self._prune(k)
            else:
                self._dropping(k, strategy)
        if self.summarizing and (self.cut, len(self.dropped)) != before:
            self.summary_role = self._summary_role(k)

    def _dropping(self, k: int, strategy: StrategyName) -> None:
        """`middle-out`, or `trim` for any other strategy. With a stand-in (a summary or
        restore's marker), a drop that gains nothing — what it removes costs no more than the
        stand-in that then takes its place, as when a compacted request is compacted again and
        the only unit left to drop is the stand-in itself — is undone (invariant 5)."""
        drop = self._middle_out if strategy == "middle-out" else self._trim
        if not self.summarizing:
            drop(k)
            return
        total, cut, dropped, events = self.total(k), self.cut, set(self.dropped), len(self.events)
        middle = None if self.middle is None else self.middle.resized(len(self.shape.units))
        drop(k)
        if self.total(k) < total:
            return
        touched = set(range(cut, self.cut)) | (self.dropped - dropped)
        self.cut, self.dropped, self.middle = cut, dropped, middle
        del self.events[events:]
        for i in sorted(touched):
            self.refresh(i)

    def _summary_role(self, k: int) -> SummaryRole:
        """Where the summary goes, decided when the kept units change: it must not meet a
        message of its own role. After the head's user message and before an assistant turn
        (kept, or next in strict order) neither role fits, so it is folded into the head."""
        following = self.shape.next_role(self.cut, k, self.dropped)
        if following == "user":
            return "assistant"
        return "fold" if self.shape.head_user else "user"

    def _truncate(self, k: int) -> None:
        for i in range(max(self.cut, self.scanned), k):
            if i not in self.dropped and i not in self.truncated and self.costs.has_giant_output(i):
                self.truncated.add(i)
                self.refresh(i)
        self.scanned = k
        # Last resort (DESIGN.md §3): the units no cut can remove must fit the budget with the
        # head and the pinned instructions, so their assistant text and answered call arguments
        # share the cap too.
        tail = range(self._uncuttable_from(k), k)
        fixed = self.head_cost + self.pinned_total
        fixed += self.summary_tokens if self.summarizing else 0
        if (
            fixed + sum(self.cost(i) for i in tail if i not in self.shape.pinned)
            <= self.budget.budget
        ):
            return
        for i in tail:
            if i in self.dropped or i in self.deep:
                continue
            if self.costs.render(i, 2, False) < self.costs.render(i, 1, False):
                self.truncated.add(i)
                self.deep.add(i)
                self.refresh(i)

    def _uncuttable_from(self, k: int) -> int:
        """The first of the units no cut can remove: the last unit, and before it those no valid
        cut position separates from it (in a strict chat, the assistant message before the last
        user message)."""
        start = k - 1
        while start > self.cut and not self.valid_cut(start, k):
            start -= 1
        return start

    def _prune(self, k: int) -> None:
        if self.sums is None or self.savings is None:
            return
        for i in range(self.priced, k):
            self._price(i, _truncation_level(i, self.truncated, self.deep))
        self.priced = max(self.priced, k)
        least = MIN_SAVING_SHARE * self.budget.budget
        if self.saving_total - self.savings[k - 1] < least:
            return  # not worth it even without protecting anything (the last unit always is)
        # The most recent units worth PROTECT_SHARE of the budget keep their outputs (the last
        # one always): the boundary stands after the last unit i with units i..k-2 over it.
        protect = int(PROTECT_SHARE * self.budget.budget)
        boundary = max(self.cut, self.sums.search(self.sums.prefix(k - 1) - protect))
        start = max(self.cut, self.pruned_before)
        if boundary <= start:
            return
        if self.savings.range(start, boundary) < least:
            return
        self.pruned_before = boundary
        for i in range(start, boundary):
            self.refresh(i)

    def _trim(self, k: int) -> None:
        moved, _ = advance_cut(
            self.cut,
            k - 1,
            self.total(k),
            self.goal,
            lambda i: 0 if i in self.shape.pinned else self.cost(i),
            lambda position: self.valid_cut(position, k),
            self.summary_tokens if self.summarizing else 0,
            self.stands_in(),
        )
        if moved == self.cut:
            return
        old, self.cut = self.cut, moved
        self.events.append(moved)
        for i in range(old, moved):
            if i in self.shape.pinned:
                continue
            if self.middle is not None and i not in self.dropped:
                self.middle.remove(i)
            self.refresh(i)

    def _middle_out(self, k: int) -> None:
        if self.middle is None:
            return
        strict = self.shape.strict(k)
        for unit in self.middle.walk(k - 1):
            if self.total(k) <= self.goal:
                break
            if unit in self.dropped:
                continue
            for member in self._partners(unit, k) if strict else (unit,):
                self.dropped.add(member)
                self.middle.remove(member)
                self.refresh(member)

    def _partners(self, unit: int, k: int) -> tuple[int, ...]:
        """What goes with `unit` in a strict chat so that turns keep alternating: a tool round
        alone; an assistant turn with the user turn after it (both before the last unit); a
        user turn only with its assistant turn (nothing, when met on its own)."""
        turn = self.shape.turns[unit]
        if turn is None:
            return (unit,)
        partner = self.shape.next_turn[unit + 1]
        if turn != "assistant" or partner >= k - 1 or partner in self.dropped:
            return ()
        return (unit, partner)

    def result(self) -> Plan:
        n = len(self.shape.units)
        return Plan(
            units=self.shape.units,
            head=self.shape.head,
            cut=self.cut,
            dropped=frozenset(self.dropped),
            truncated=frozenset(self.truncated),
            pruned_before=self.pruned_before,
            cap=self.costs.cap,
            events=tuple(self.events),
            summarize="summarize" in self.pipeline and self.cut > self.shape.head,
            tokens_before=self.before,
            tokens_after=self.total(n),
            strict=self.shape.strict(n),
            deep=frozenset(self.deep),
            pinned=self.shape.pinned,
            summary_role=self.summary_role,
            protect=self.costs.protect,
            marker=self.marked and self.stands_in(),
            shown=self.costs.shown,
        )


def _quiet(shape: UnitRoles, costs: _Costs, head_cost: int, trigger: int) -> Plan | None:
    """The plan of a conversation that is under the trigger as a whole, without replaying it:
    every unit costs >= 0, so no shorter prefix crosses the trigger either, and the replay
    would end where it starts (nothing cut, dropped, truncated or pruned). None otherwise."""
    n, head = len(shape.units), shape.head
    total = head_cost + sum(costs.render(i, 0, False) for i in range(head, n))
    if total > trigger:
        return None
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
        strict=shape.strict(n),
        pinned=shape.pinned,
        protect=costs.protect,
    )


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
    (the plan is exactly the one a replay from the first message gives), and is remembered."""
    inputs = tuple(sorted((k, v) for k, v in locals().items() if k not in UNKEYED))
    recall = Recall.of(replays, inputs, messages)
    saved: _Replay | None = recall.found.state if recall and recall.found else None
    extended = saved.shape.extended(messages) if saved is not None else None
    shape = extended or UnitRoles.of(messages)
    n, head = len(shape.units), shape.head
    costs = _Costs(messages, shape.units, count, cap_chars(budget.budget), protect)
    if saved is not None and extended is not None:
        replay = saved.resumed(extended, costs)
    else:
        head_cost = fixed_tokens + sum(costs.render(i, 0, False) for i in range(head))
        quiet = None if recall is not None else _quiet(shape, costs, head_cost, budget.trigger)
        if quiet is not None:
            return quiet
        replay = _Replay(
            shape=shape,
            costs=costs,
            pipeline=pipeline,
            budget=budget,
            head_cost=head_cost,
            summary_tokens=summary_tokens,
            costs_now=[0] * n,
            sums=RunningSums(n) if "prune" in pipeline else None,
            savings=RunningSums(n) if "prune" in pipeline else None,
            middle=MiddleOut(n) if "middle-out" in pipeline else None,
            cut=head,
            pruned_before=head,
            scanned=head,
            goal=budget.goal,
            marked=marked,
            replayed=head,
            before=head_cost,
        )
    # A history with no user message yet is not kept: its head may still move.
    keep = recall is not None and recall.replays.keep and shape.head_user
    kept = replay.replay(budget.trigger, keep)
    if recall is not None and kept is not None:
        recall.remember(kept, messages, shape.units[-1].start)
    elif saved is not None and recall is not None and not recall.replays.keep:
        saved.costs.learn(costs, saved.replayed)
    return replay.result()


def _shown(messages: Sequence[Mapping[str, Any]], plan: Plan, i: int) -> list[Mapping[str, Any]]:
    """Unit i as the plan shows it (truncated, pruned)."""
    unit = plan.units[i]
    level = _truncation_level(i, plan.truncated, plan.deep)
    chunk = list(messages[unit.start : unit.end])
    pruned = i < plan.pruned_before
    shown = plan.shown.get(i) if pruned and not level else None
    if shown is not None and len(shown) == len(chunk):
        return [m if r is None else r for m, r in zip(chunk, shown, strict=True)]
    protect = plan.protect if i < len(plan.units) - 1 else frozenset()
    return _transform(chunk, unit, plan.cap, level, pruned, protect)


def render_span(
    messages: Sequence[Mapping[str, Any]], plan: Plan, start: int, end: int
) -> list[Mapping[str, Any]]:
    """Units `[start, end)` as the plan shows them (truncated, pruned), for a summary; pinned
    instructions are not part of it (they stay in the prompt, and a summariser is told to
    follow no instruction in what it summarises)."""
    out: list[Mapping[str, Any]] = []
    for i in range(start, end):
        if i not in plan.pinned:
            out.extend(_shown(messages, plan, i))
    return out


def render(messages: Sequence[Mapping[str, Any]], plan: Plan) -> list[Mapping[str, Any]]:
    """The kept messages (head, pinned instructions, the units after the cut not dropped),
    transformed as planned. A summary, when there is one, is put in place by the caller."""
    out: list[Mapping[str, Any]] = []
    for i in range(len(plan.units)):
        if plan.kept(i):
            out.extend(_shown(messages, plan, i))
    return out


def kept_sources(plan: Plan) -> list[int | None]:
    """For each message `render` returns, the index of the input message it stands for
    (transforms keep a unit's messages one to one)."""
    out: list[int | None] = []
    for i, unit in enumerate(plan.units):
        if plan.kept(i):
            out.extend(range(unit.start, unit.end))
    return out
