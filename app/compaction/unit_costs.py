"""A unit's transforms as a plan applies them (tool outputs truncated, old rounds pruned) and
the token cost of each unit under each transform, memoised: what the replay prices."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from typing import Any

from inflight.compaction.prune import prune_unit
from inflight.compaction.refs import REF_LENGTH
from inflight.compaction.truncate import truncate_unit, unshared_markers
from inflight.compaction.units import Unit

MessageCounter = Callable[[Mapping[str, Any]], int]
# A pruned unit as the plan shows it, message by message: None where it is the client's own
# message, else what stands for it (a placeholder of ours): see `UnitCosts.shown`.
Shown = tuple[Mapping[str, Any] | None, ...]
TOOL_KINDS = ("tool_round", "function_round")
# The most tokens one marker's ref can count more or less than another's: its hex digits, and
# the space before them that a tokenizer may join to them or not.
REF_SLACK = REF_LENGTH + 1


def truncation_level(i: int, truncated: AbstractSet[int], deep: AbstractSet[int]) -> int:
    """How unit i is truncated: 0 not, 1 its tool outputs, 2 deep (every text shares the cap)."""
    return 2 if i in deep else int(i in truncated)


def transform(
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
class UnitCosts:
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
        unit, chunk, protect = self._unit(i)
        out = transform(chunk, unit, self.cap, truncated, pruned, protect)
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

    def _unit(self, i: int) -> tuple[Unit, list[Mapping[str, Any]], frozenset[str]]:
        """Unit i, its messages, and the tools whose outputs it keeps (none in the last unit)."""
        unit = self.units[i]
        protect = self.protect if i < len(self.units) - 1 else frozenset()
        return unit, list(self.messages[unit.start : unit.end]), protect

    def detached(self) -> UnitCosts:
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

    def learn(self, other: UnitCosts, units: int) -> None:
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
        return self.saves(i, 1, 0)

    def saves(self, i: int, level: int, than: int) -> bool:
        """Whether unit i costs fewer tokens truncated at `level` than at `than`, decided the
        same wherever the unit stands (invariant 5: compacting the output again, where the
        unit has moved, must decide the same).

        A marker's ref hashes the text's position, and its hex digits tokenize differently
        from one position to the next. So the unit is priced with refs of a fixed position
        and must save more than the most that the refs can move, `REF_SLACK` tokens per
        marker the two renderings do not share (one both carry counts alike in both): then it
        saves at its own position too (invariant 4). Only a unit near that line is priced
        twice: one far from it is decided by its cost where it stands.
        """
        gain = self.render(i, than, False) - self.render(i, level, False)
        if gain <= 0:
            return False
        unit, chunk, protect = self._unit(i)
        here = [transform(chunk, unit, self.cap, k, False, protect) for k in (level, than)]
        slack = REF_SLACK * unshared_markers(*here)
        if gain > 2 * slack:
            return True
        fixed = replace(unit, start=0)
        level_cost, than_cost = (
            sum(map(self.count, transform(chunk, fixed, self.cap, k, False, protect)))
            for k in (level, than)
        )
        return than_cost - level_cost > slack


def _uncounted(message: Mapping[str, Any]) -> int:
    raise RuntimeError("a remembered replay counts nothing: it is resumed with a count")
