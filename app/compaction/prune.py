"""`prune`: old tool outputs replaced by a short, stable placeholder (tool name and size).

The most recent tool outputs are protected (a token budget that scales with the window), and a
prune that would save little is skipped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

PLACEHOLDER = "[inflight pruned an old output of {name}: {size} chars]"
PROTECT_SHARE = 0.25
MIN_SAVING_SHARE = 0.05


def is_placeholder(content: Any) -> bool:
    return isinstance(content, str) and content.startswith("[inflight pruned an old output of ")


def _size(content: Any) -> int:
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(
            len(p["text"])
            for p in content
            if isinstance(p, dict) and isinstance(p.get("text"), str)
        )
    return 0


def tool_names(unit_messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """The function name answered by each message of a tool unit (by position in the unit)."""
    first = unit_messages[0]
    calls = first.get("tool_calls")
    names: list[str] = []
    if isinstance(calls, list):
        for call in calls:
            fn = call.get("function") if isinstance(call, dict) else None
            names.append(str(fn.get("name")) if isinstance(fn, dict) else "tool")
    legacy = first.get("function_call")
    if isinstance(legacy, dict):
        names.append(str(legacy.get("name", "function")))
    return names


def prune_message(message: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    """The tool message with its content replaced; the same object when already pruned."""
    if message.get("role") not in ("tool", "function"):
        return message
    content = message.get("content")
    if is_placeholder(content) or _size(content) == 0:
        return message
    return {**message, "content": PLACEHOLDER.format(name=name, size=_size(content))}


def prune_unit(unit_messages: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    names = tool_names(unit_messages)
    out: list[Mapping[str, Any]] = [unit_messages[0]]
    for position, message in enumerate(unit_messages[1:]):
        name = names[position] if position < len(names) else "tool"
        out.append(prune_message(message, name))
    return out
