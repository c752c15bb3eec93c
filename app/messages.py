"""Messages grouped into pair-safe units, the pinned head, and the checks strict servers make.

A unit is one plain message, or an assistant message with `tool_calls` together with the tool
messages right after it that answer it (by position: real transcripts reuse ids, so a global id
lookup would pair a result with the wrong call), or a legacy `function_call` with its
`role: "function"` answer. Compaction only ever keeps or drops whole units.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

UnitKind = Literal["message", "tool_round", "function_round", "orphan"]
HEAD_ROLES = frozenset({"system", "developer"})


@dataclass(frozen=True, slots=True)
class Unit:
    """Messages `[start, end)` of the list, kept or dropped together."""

    start: int
    end: int
    kind: UnitKind


def _calls(message: Mapping[str, Any]) -> list[Any]:
    calls = message.get("tool_calls")
    return calls if isinstance(calls, list) else []


def group_units(messages: Sequence[Mapping[str, Any]]) -> list[Unit]:
    units: list[Unit] = []
    i, n = 0, len(messages)
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
    while head < len(units) and messages[units[head].start].get("role") in HEAD_ROLES:
        head += 1
    return head


def check_pair_safety(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """Violations of what OpenAI enforces: tool results right after their call, all answered."""
    problems: list[str] = []
    i, n = 0, len(messages)
    while i < n:
        message = messages[i]
        role = message.get("role")
        if role == "assistant" and _calls(message):
            expected = [c.get("id") for c in _calls(message) if isinstance(c, dict)]
            j = i + 1
            answered: list[Any] = []
            while j < n and messages[j].get("role") == "tool":
                answered.append(messages[j].get("tool_call_id"))
                j += 1
            if sorted(map(str, answered)) != sorted(map(str, expected)):
                problems.append(f"messages[{i}]: tool_calls {expected} answered by {answered}")
            i = j
            continue
        if role == "assistant" and isinstance(message.get("function_call"), dict):
            if i + 1 >= n or messages[i + 1].get("role") != "function":
                problems.append(f"messages[{i}]: function_call without its function result")
                i += 1
            else:
                i += 2
            continue
        if role in ("tool", "function"):
            problems.append(f"messages[{i}]: {role} message without the call right before it")
        i += 1
    return problems


def is_strict_alternation(messages: Sequence[Mapping[str, Any]]) -> bool:
    """One optional leading system message, then user/assistant messages alternating, starting
    with user, with no tool messages (what Llama 2 / Mistral chat templates accept)."""
    rest = list(messages[1:] if messages and messages[0].get("role") == "system" else messages)
    if not rest:
        return False
    for k, message in enumerate(rest):
        expected = "user" if k % 2 == 0 else "assistant"
        if message.get("role") != expected or _calls(message) or "function_call" in message:
            return False
    return True


def role_order_problems(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """Why a strict chat template would reject these messages (empty when it accepts them)."""
    if is_strict_alternation(messages):
        return []
    return ["roles do not alternate system?/user/assistant/user/..."]
