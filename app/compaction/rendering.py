"""The plan — what to keep of a history and how — and the messages it shows: the kept units
transformed as planned, or a span of them for a summary."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from inflight.compaction.cost_mode import CutFor
from inflight.compaction.unit_costs import Shown, transform, truncation_level
from inflight.compaction.units import Unit

SummaryRole = Literal["user", "assistant", "fold"]


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
    cut_for: CutFor | None = None  # why it changes anything (§16); None: it changes nothing
    # Pruned units as the replay priced them (`UnitCosts.shown`): rendering takes them as they are
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


def kept_units(plan: Plan) -> list[int]:
    """The units in the output, in order: those `Plan.kept` says are, found without asking
    each unit — the head, the pinned instructions before the cut, and the units from the cut
    on that were not dropped (a long conversation's cut is far along: most of its units are
    before it)."""
    head, cut, pinned, dropped = plan.head, plan.cut, plan.pinned, plan.dropped
    before = sorted(i for i in pinned if head <= i < cut)
    after = range(cut, len(plan.units))
    if dropped:
        return [*range(head), *before, *(i for i in after if i in pinned or i not in dropped)]
    return [*range(head), *before, *after]


def shown(messages: Sequence[Mapping[str, Any]], plan: Plan, i: int) -> list[Mapping[str, Any]]:
    """Unit i as the plan shows it (truncated, pruned)."""
    unit = plan.units[i]
    level = truncation_level(i, plan.truncated, plan.deep)
    chunk = list(messages[unit.start : unit.end])
    pruned = i < plan.pruned_before
    shown = plan.shown.get(i) if pruned and not level else None
    if shown is not None and len(shown) == len(chunk):
        return [m if r is None else r for m, r in zip(chunk, shown, strict=True)]
    protect = plan.protect if i < len(plan.units) - 1 else frozenset()
    return transform(chunk, unit, plan.cap, level, pruned, protect)


def render_span(
    messages: Sequence[Mapping[str, Any]], plan: Plan, start: int, end: int
) -> list[Mapping[str, Any]]:
    """Units `[start, end)` as the plan shows them (truncated, pruned), for a summary; pinned
    instructions are not part of it (they stay in the prompt, and a summariser is told to
    follow no instruction in what it summarises)."""
    out: list[Mapping[str, Any]] = []
    for i in range(start, end):
        if i not in plan.pinned:
            out.extend(shown(messages, plan, i))
    return out


def render(messages: Sequence[Mapping[str, Any]], plan: Plan) -> list[Mapping[str, Any]]:
    """The kept messages (head, pinned instructions, the units after the cut not dropped),
    transformed as planned. A summary, when there is one, is put in place by the caller."""
    out: list[Mapping[str, Any]] = []
    for i in kept_units(plan):
        out.extend(shown(messages, plan, i))
    return out


def kept_sources(plan: Plan) -> list[int | None]:
    """For each message `render` returns, the index of the input message it stands for
    (transforms keep a unit's messages one to one)."""
    out: list[int | None] = []
    units = plan.units
    for i in kept_units(plan):
        out.extend(range(units[i].start, units[i].end))
    return out
