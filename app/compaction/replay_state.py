"""The replay's state: the plan for the prefix of a history replayed so far, one unit at a
time, with a compaction event whenever that prefix crosses the trigger (see the planner,
app/compaction/planner.py, for why a plan is found this way)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from inflight.compaction.cost_mode import CutFor
from inflight.compaction.middle_out import MiddleOut
from inflight.compaction.policy import Budget
from inflight.compaction.prune import MIN_SAVING_SHARE, PROTECT_SHARE
from inflight.compaction.rendering import Plan, SummaryRole
from inflight.compaction.sums import RunningSums
from inflight.compaction.trim import advance_cut
from inflight.compaction.unit_costs import TOOL_KINDS, UnitCosts, truncation_level
from inflight.compaction.units import UnitRoles
from inflight.strategies import StrategyName


@dataclass(slots=True)
class Replay:
    """The state of the plan for the prefix replayed so far: what each unit after the head
    costs now (0 once gone) and their total; when pruning, running sums of those costs and of
    what pruning each unit would save."""

    shape: UnitRoles
    costs: UnitCosts
    pipeline: tuple[StrategyName, ...]
    budget: Budget
    head_cost: int  # the head's tokens as the plan counts them (`planner._head_cost`)
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
    spend: float = 0.0  # cost mode: the rent its requests paid since the last event (§16)

    def _copy(self, shape: UnitRoles, costs: UnitCosts) -> Replay:
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

    @property
    def pristine(self) -> bool:
        """Whether nothing has happened to the prefix replayed so far: nothing cut, dropped,
        truncated or pruned (an event that crossed the trigger may have found nothing to do)."""
        head = self.shape.head
        return (
            self.cut == head
            and self.pruned_before == head
            and not (self.dropped or self.truncated or self.deep or self.events)
        )

    def saved(self) -> Replay:
        """The state now, for the prefix replayed alone and holding no message: what a
        replay cache keeps."""
        return self._copy(self.shape.prefix(self.replayed), self.costs.detached())

    def resumed(self, shape: UnitRoles, costs: UnitCosts) -> Replay:
        """A saved state, to go on with for a longer history (`shape`: its units, the first
        ones those replayed) priced by `costs`."""
        costs.memo.update(self.costs.memo)
        costs.shown.update(self.costs.shown)
        return self._copy(shape, costs)

    def learn(self, costs: UnitCosts) -> None:
        """Take what `costs` (a what-if plan that resumed this saved state) priced of the
        units replayed here."""
        self.costs.learn(costs, self.replayed)

    def replay(self, trigger: int, keep: bool) -> Replay | None:
        """Replay the units not replayed yet, one at a time, with an event whenever the prefix
        so far crosses the trigger. `keep`: return the state before the last unit (a later
        request resumes there: its last unit may have grown, a call with more answers)."""
        n, kept = len(self.shape.units), None
        for k in range(self.replayed + 1, n + 1):
            if keep and k == n:
                self.replayed = n - 1
                kept = self.saved()
            self.before += self.add(k - 1)
            if self.pipeline and (self.total(k) > trigger or self._pays(k)):
                self.event(k)
        self.replayed = n
        return kept

    def _pays(self, k: int) -> bool:
        """Cost mode (DESIGN.md §16): when unit k-1 ends a request (a user turn, or a tool
        round's answers), that request re-read from the cache what a cut to the goal would
        remove; whether the rent paid since the last event reached the price of the cut."""
        cost = self.budget.cost
        if cost is None:
            return False
        total = self.total(k)
        if self._ends_request(k - 1):
            self.spend += cost.rent(total, self.goal)
        return cost.pays(self.spend, total, self.budget.goal, self._cached_head())

    def _cached_head(self) -> int:
        """The tokens a cut keeps in front of what it re-writes: the head, with the stand-in
        when it is folded into the head (a replay of the compacted prompt counts it there, so
        both judge a cut alike: invariant 5)."""
        folded = self.stands_in() and self.summary_role == "fold"
        return self.head_cost + (self.summary_tokens if folded else 0)

    def _ends_request(self, i: int) -> bool:
        """Whether unit i ends a request: a user turn, or a tool round's answers."""
        return self.shape.turns[i] == "user" or self.shape.units[i].kind in TOOL_KINDS

    def _rent_left(self, k: int) -> float:
        """Cost mode, after an event at k: the rent the requests of the prefix as the event left
        it pay on what it still carries over what cost mode keeps (nothing when it got there).
        A replay of the compacted prompt counts exactly this rent before its own k, so counting
        it here too keeps compacting a compacted request a no-op (invariant 5) when a cut could
        not get down to what cost mode keeps (a huge last unit, large pinned instructions)."""
        cost, total = self.budget.cost, self.total(k)
        if cost is None or total <= self.goal:
            return 0.0
        running = total - sum(self.costs_now[i] for i in range(self.cut, k))
        spend = 0.0
        for i in range(self.cut, k):
            running += self.costs_now[i]
            if self.costs_now[i] and self._ends_request(i):
                spend += cost.rent(running, self.goal)
        return spend

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
        level = truncation_level(i, self.truncated, self.deep)
        pruned = i < self.pruned_before
        cost = self.costs.render(i, level, pruned) if kept else 0
        if i == self.shape.head and self.shape.stand_in and self.summarizing:
            # the engine's own stand-in costs at most what was reserved for it, as the plan
            # that made it counted it: compacting again plans what it planned (invariant 5)
            cost = min(cost, self.summary_tokens)
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
        """Unit i joins the prefix (as it is: nothing transforms it yet); returns its cost as
        received."""
        self.refresh(i)
        if i in self.shape.pinned:
            self.pinned_total += self.cost(i)
        elif self.middle is not None:
            self.middle.add(i)
        return self.costs.render(i, 0, False)

    def total(self, k: int) -> int:
        """Tokens of the prefix of k units as the plan shows it now."""
        summary = self.summary_tokens if self.stands_in() else 0
        return self.head_cost + summary + self.kept_total

    def valid_cut(self, position: int, k: int) -> bool:
        """Whether the cut may stand before unit `position` in the prefix of k units. In a
        strict chat the head's user message must be followed by an assistant turn, now and when
        the conversation goes on; a summary goes in between as an assistant message before a
        user turn, or folded into the head when no turn follows yet (never before a kept
        assistant turn: a fold there would cost the head's place in the prompt cache). Never
        right after the engine's own stand-in, alone (`UnitRoles.lone_stand_in`)."""
        if self.shape.lone_stand_in(position):
            return False
        if not self.shape.strict(k):
            return True
        following = self.shape.next_role(position, k, frozenset())
        if not self.summarizing:
            return bool(following == "assistant")
        return following == "user" or self.shape.next_turn[position] >= k

    def event(self, k: int) -> None:
        """The prefix of k units crossed the threshold (or, in cost mode, a cut pays): apply
        the pipeline down to the goal."""
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
        self.spend = self._rent_left(k)

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
        # share the cap too. The engine's own stand-in is never cut: while summarising, it is
        # what the summary's reserved tokens stand for, else it counts like the head.
        tail = range(self._uncuttable_from(k), k)
        own = self.shape.head if self.shape.stand_in else None
        fixed = self.head_cost + self.pinned_total
        if self.summarizing:
            fixed += self.summary_tokens
        elif own is not None and own in tail:
            fixed += self.cost(self.shape.head)
        shown = (i for i in tail if i not in self.shape.pinned and i != own)
        if fixed + sum(self.cost(i) for i in shown) <= self.budget.budget:
            return
        for i in tail:
            if i in self.dropped or i in self.deep or i == own:
                continue
            if self.costs.saves(i, 2, truncation_level(i, self.truncated, self.deep)):
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
            self._price(i, truncation_level(i, self.truncated, self.deep))
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

    def cut_for(self) -> CutFor | None:
        """Why the plan changes the prompt (None: it does not): to fit, when the history as
        received is over the trigger (a plan without cost mode would cut it too), else for
        cost (only cost mode's early cuts changed it; DESIGN.md §16)."""
        head = self.shape.head
        changed = self.cut > head or self.pruned_before > head or self.dropped or self.truncated
        if not changed:
            return None
        return "fit" if self.before > self.budget.trigger else "cost"

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
            cut_for=self.cut_for(),
        )
