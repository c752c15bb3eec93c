"""Messages grouped into pair-safe units, the pinned head, and the checks strict servers make.

Compaction only ever keeps or drops whole units; the strict role order is DESIGN.md §4.6.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from inflight.compaction.inserted import is_inserted

UnitKind = Literal["message", "tool_round", "function_round", "orphan"]
HEAD_ROLES = frozenset({"system", "developer"})
TURNS = ("user", "assistant")


@dataclass(frozen=True, slots=True)
class Unit:
    """Messages `[start, end)` of the list, kept or dropped together.

    One plain message, or an assistant message with `tool_calls` together with the tool messages
    right after it that answer it (by position: real transcripts reuse ids, so a global id lookup
    would pair a result with the wrong call), or a legacy `function_call` with its `role:
    "function"` answer.
    """

    start: int
    end: int
    kind: UnitKind


def _calls(message: Mapping[str, Any]) -> list[Any]:
    calls = message.get("tool_calls")
    return calls if isinstance(calls, list) else []


def group_units(messages: Sequence[Mapping[str, Any]], start: int = 0) -> list[Unit]:
    """The units of `messages[start:]` (`start` must begin a unit), with list offsets."""
    units: list[Unit] = []
    i, n = start, len(messages)
    while i < n:
        message = messages[i]
        role = message.get("role")
        if role == "assistant" and _calls(message):
            j = i + 1
            while j < n and messages[j].get("role") == "tool":
                j += 1
            units.append(Unit(i, j, "tool_round"))
        elif role == "assistant" and isinstance(message.get("function_call"), dict):
            j = i + 1
            if j < n and messages[j].get("role") == "function":
                j += 1
            units.append(Unit(i, j, "function_round"))
        elif role in ("tool", "function"):
            j = i + 1
            units.append(Unit(i, j, "orphan"))
        else:
            j = i + 1
            units.append(Unit(i, j, "message"))
        i = j
    return units


def pinned_head(messages: Sequence[Mapping[str, Any]], units: Sequence[Unit]) -> int:
    """How many leading units are pinned: system/developer messages and the first user message
    (with anything before it)."""
    first_user = next(
        (k for k, u in enumerate(units) if messages[u.start].get("role") == "user"), None
    )
    if first_user is not None:
        return first_user + 1
    head = 0
    while head < len(units) and _role(messages[units[head].start]) in HEAD_ROLES:
        head += 1
    return head


def head_end(messages: Sequence[Mapping[str, Any]]) -> int:
    """Where the pinned head ends (`pinned_head`, in messages), found without grouping the
    rest: just after the first user message (a user message is a unit of its own), or when
    there is none, after the leading system and developer messages."""
    for i, message in enumerate(messages):
        if message.get("role") == "user":
            return i + 1
    head = 0
    while head < len(messages) and _role(messages[head]) in HEAD_ROLES:
        head += 1
    return head


def _stands_in(messages: Sequence[Mapping[str, Any]], units: Sequence[Unit], head: int) -> bool:
    """Whether the unit right after the head (where the engine puts what stands for a cut) is
    a message the engine inserted."""
    if head >= len(units) or units[head].kind != "message":
        return False
    return is_inserted(messages[units[head].start])


def _role(message: Mapping[str, Any]) -> str | None:
    role = message.get("role")
    return role if isinstance(role, str) else None


def check_pair_safety(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """Violations of what OpenAI enforces: tool results right after their call, all answered."""
    problems: list[str] = []
    for unit in group_units(messages):
        message = messages[unit.start]
        if unit.kind == "tool_round":
            expected = [c.get("id") for c in _calls(message) if isinstance(c, dict)]
            answered = [messages[j].get("tool_call_id") for j in range(unit.start + 1, unit.end)]
            if sorted(map(str, answered)) != sorted(map(str, expected)):
                problems.append(
                    f"messages[{unit.start}]: tool_calls {expected} answered by {answered}"
                )
        elif unit.kind == "function_round" and unit.end - unit.start == 1:
            problems.append(f"messages[{unit.start}]: function_call without its function result")
        elif unit.kind == "orphan":
            role = message.get("role")
            problems.append(
                f"messages[{unit.start}]: {role} message without the call right before it"
            )
    return problems


def spoken_role(message: Mapping[str, Any]) -> Any:
    """The role strict chat templates check order on: None for tool results and for assistant
    messages that carry calls (the Mistral v0.3 / Mixtral templates skip both)."""
    role = message.get("role")
    if role in ("tool", "function"):
        return None
    if role == "assistant" and (_calls(message) or isinstance(message.get("function_call"), dict)):
        return None
    return role


def strict_prefix(messages: Sequence[Mapping[str, Any]], *, planning: bool = False) -> int:
    """How many leading messages follow the strict rule (DESIGN.md §4.6): one optional leading
    system message, then — ignoring tool results and assistant calls — user and assistant
    alternating, starting with user. Once broken, no longer prefix follows it. `planning`: what
    the planner keeps, where a system or developer message after the first user message is an
    instruction pinned where it stands (§3) that takes no turn, so the turns around it keep
    alternating (Anthropic's rule, for the system messages Claude Code puts in `messages`)."""
    start = 1 if messages and messages[0].get("role") == "system" else 0
    return _strict_from(messages, start, planning=planning)


def _strict_from(
    messages: Sequence[Mapping[str, Any]],
    start: int,
    expected: Any = "user",
    *,
    spoken: bool = False,
    planning: bool = False,
) -> int:
    """`strict_prefix` for messages that follow the rule up to `start`, where `expected` speaks
    next (`spoken`: a user message came before `start`)."""
    for i in range(start, len(messages)):
        role = spoken_role(messages[i])
        if role is None or (planning and spoken and role in HEAD_ROLES):
            continue
        if role != expected:
            return i
        expected = "assistant" if expected == "user" else "user"
        spoken = True
    return len(messages)


def is_strict_alternation(messages: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the messages follow the strict rule with at least one user message (what
    Llama 2 / Mistral / Mixtral chat templates accept)."""
    return strict_prefix(messages) == len(messages) and any(
        spoken_role(m) == "user" for m in messages
    )


def _next_turns(turns: Sequence[Any], start: int) -> list[int]:
    """For each unit from `start` on (and one past the end), the first unit at or after it
    that takes a turn (`len(turns)`: none)."""
    n = len(turns)
    out = [n] * (n - start + 1)
    for i in range(n - 1, start - 1, -1):
        out[i - start] = i if turns[i] is not None else out[i - start + 1]
    return out


def _last_turns(turns: Sequence[Any], before: Any) -> list[Any]:
    """After each of `turns`, the role of the last unit so far that took a turn (`before`:
    the one before them)."""
    out: list[Any] = []
    for turn in turns:
        before = turn if turn is not None else before
        out.append(before)
    return out


@dataclass(frozen=True, slots=True)
class UnitRoles:
    """The roles of a message list's units that compaction must respect, found once."""

    units: tuple[Unit, ...]
    head: int
    turns: tuple[Any, ...]  # "user"/"assistant" for a unit that takes a turn, else None
    next_turn: tuple[int, ...]  # the first unit at or after i that takes a turn (n: none)
    last_turn: tuple[Any, ...]  # the role of the last unit before k that took a turn
    pinned: frozenset[int]
    strict_units: int  # how many leading units follow the strict rule
    head_user: bool  # the head ends with the first user message
    strict_end: int = 0  # how many leading messages follow the strict rule
    # the unit right after the head is a message the engine inserted where it cut (a summary, a
    # span marker, a note): the request was compacted before
    stand_in: bool = False

    @classmethod
    def of(cls, messages: Sequence[Mapping[str, Any]]) -> UnitRoles:
        units = tuple(group_units(messages))
        head = pinned_head(messages, units)
        roles = [spoken_role(messages[u.start]) for u in units]
        turns = tuple(r if r in TURNS else None for r in roles)
        strict_end = strict_prefix(messages, planning=True)
        return cls(
            units=units,
            head=head,
            turns=turns,
            next_turn=tuple(_next_turns(turns, 0)),
            last_turn=(None, *_last_turns(turns, None)),
            pinned=frozenset(i for i in range(head, len(units)) if roles[i] in HEAD_ROLES),
            strict_units=sum(1 for u in units if u.end <= strict_end),
            head_user=head > 0 and roles[head - 1] == "user",
            strict_end=strict_end,
            stand_in=_stands_in(messages, units, head),
        )

    def prefix(self, k: int) -> UnitRoles:
        """The roles of the first k units' messages (k at least the head)."""
        end = self.units[k - 1].end if k else 0
        found = bisect_left(self.next_turn, k, 0, k)  # from here on: no turn before k
        return UnitRoles(
            units=self.units[:k],
            head=self.head,
            turns=self.turns[:k],
            next_turn=self.next_turn[:found] + (k,) * (k + 1 - found),
            last_turn=self.last_turn[: k + 1],
            pinned=frozenset(i for i in self.pinned if i < k),
            strict_units=min(self.strict_units, k),
            head_user=self.head_user,
            strict_end=min(self.strict_end, end),
            stand_in=self.stand_in and k > self.head,
        )

    def extended(self, messages: Sequence[Mapping[str, Any]]) -> UnitRoles | None:
        """`of(messages)` for a list whose leading messages are those these roles were found
        for, grouping only the rest. None when that cannot be exact: the last unit grows with
        the new messages (a tool result joins its call), or the head may still move (no user
        message yet)."""
        if not self.units or not self.head_user:
            return None
        last = self.units[-1]
        tail = group_units(messages, last.start)
        if tail[0] != last:
            return None
        k, end = len(self.units), last.end
        roles = [spoken_role(messages[u.start]) for u in tail[1:]]
        turns = self.turns + tuple(r if r in TURNS else None for r in roles)
        added = _next_turns(turns, k)  # from unit k on: the first turn at or after it
        kept = bisect_left(self.next_turn, k, 0, k)  # before: those that found no turn yet
        strict_end, strict_units = self.strict_end, self.strict_units
        if strict_end >= end:  # the strict rule held to the end: it goes on from there
            expected = "assistant" if self.last_turn[k] == "user" else "user"
            strict_end = _strict_from(messages, end, expected, spoken=True, planning=True)
            strict_units = k + sum(1 for u in tail[1:] if u.end <= strict_end)
        units = self.units + tuple(tail[1:])
        return UnitRoles(
            units=units,
            head=self.head,
            turns=turns,
            next_turn=self.next_turn[:kept] + (added[0],) * (k - kept) + tuple(added),
            last_turn=self.last_turn + tuple(_last_turns(turns[k:], self.last_turn[k])),
            pinned=self.pinned.union(k + i for i, r in enumerate(roles) if r in HEAD_ROLES),
            strict_units=strict_units,
            head_user=True,
            strict_end=strict_end,
            stand_in=self.stand_in if k > self.head else _stands_in(messages, units, self.head),
        )

    def lone_stand_in(self, position: int) -> bool:
        """Whether a cut before unit `position` (from the head on) would remove the engine's
        own stand-in and nothing of the client's (pinned instructions stay where they stand).
        Such a cut gains nothing real — a new stand-in for the old one, a summary of the
        summary — so no cut stands there: compacting a compacted request changes nothing, also
        when it could not get down to the target (DESIGN.md §4.5)."""
        if not self.stand_in or position <= self.head:
            return False
        return all(i in self.pinned for i in range(self.head + 1, position))

    def strict(self, k: int) -> bool:
        """Whether the prefix of k units follows the strict rule (DESIGN.md §4.6)."""
        return self.head_user and k <= self.strict_units

    def next_role(self, position: int, k: int, skip: frozenset[int] | set[int]) -> Any:
        """The role of the first unit at or after `position` (of the first k, not in `skip`)
        that takes a turn; when none has yet, the role that comes next in strict order."""
        q = self.next_turn[position]
        while q < k and q in skip:
            q = self.next_turn[q + 1]
        if q < k:
            return self.turns[q]
        return "user" if self.last_turn[k] == "assistant" else "assistant"
