"""`prune`: old tool outputs replaced by a short, stable placeholder (tool name and size).

The most recent tool outputs are protected (a token budget that scales with the window), and a
prune that would save little is skipped. Outputs of protected tools (DESIGN.md §11) are never
pruned. Each placeholder ends with the ref of the output it replaced (app/compaction/refs.py).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

from inflight.compaction.refs import REF_LENGTH, ref_for, ref_suffix

PLACEHOLDER = "[inflight pruned an old output of {name}: {size} chars {ref}]"
_PLACEHOLDER_RE = re.compile(
    rf"\[inflight pruned an old output of .*: \d+ chars \(ref: [0-9a-f]{{{REF_LENGTH}}}\)\]",
    re.DOTALL,
)
PROTECT_SHARE = 0.25
MIN_SAVING_SHARE = 0.05


def is_placeholder(content: Any) -> bool:
    """Whether `content` is exactly a placeholder this module writes (not just starts like one)."""
    return isinstance(content, str) and _PLACEHOLDER_RE.fullmatch(content) is not None


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


def _call_names(first: Mapping[str, Any]) -> list[str]:
    names: list[str] = []
    calls = first.get("tool_calls")
    if isinstance(calls, list):
        for call in calls:
            fn = call.get("function") if isinstance(call, dict) else None
            names.append(str(fn.get("name")) if isinstance(fn, dict) else "tool")
    legacy = first.get("function_call")
    if isinstance(legacy, dict):
        names.append(str(legacy.get("name", "function")))
    return names


def _call_ids(first: Mapping[str, Any]) -> list[Any]:
    calls = first.get("tool_calls")
    if not isinstance(calls, list):
        return []
    return [call.get("id") if isinstance(call, dict) else None for call in calls]


def answered_calls(unit_messages: Sequence[Mapping[str, Any]]) -> list[int | None]:
    """For each message after the first of a tool unit, the index of the call it answers.

    Matched by `tool_call_id` within the unit when the calls' ids are distinct strings and the
    answers name distinct calls among them (by strings too); otherwise by position (real
    transcripts reuse and omit ids). None when the position has no call.
    """
    answers = unit_messages[1:]
    ids = _call_ids(unit_messages[0])
    calls = len(_call_names(unit_messages[0]))
    by_position: list[int | None] = [k if k < calls else None for k in range(len(answers))]
    if not ids or not all(isinstance(i, str) for i in ids) or len(set(ids)) != len(ids):
        return by_position
    index = {call_id: k for k, call_id in enumerate(ids)}
    named = [m.get("tool_call_id") for m in answers]
    if not all(isinstance(n, str) and n in index for n in named):
        return by_position  # an id of another type (client data: an object, a list) names none
    if any(c > 1 for c in Counter(named).values()):
        return by_position
    return [index[n] for n in named]


def tool_names(unit_messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """The function name answered by each message after the first of a tool unit."""
    names = _call_names(unit_messages[0])
    return [names[k] if k is not None else "tool" for k in answered_calls(unit_messages)]


def prune_message(
    message: Mapping[str, Any], name: str, position: int, original: Any = None
) -> Mapping[str, Any]:
    """The tool message (at `position` in the history) with its content replaced by a
    placeholder describing `original` (the client's content, when truncation changed it
    before; else the message's own); the same object when already pruned."""
    if message.get("role") not in ("tool", "function"):
        return message
    content = message.get("content")
    if is_placeholder(content) or _size(content) == 0:
        return message
    original = content if original is None else original
    ref = ref_suffix(ref_for(position, original))
    return {**message, "content": PLACEHOLDER.format(name=name, size=_size(original), ref=ref)}


def prune_unit(
    unit_messages: Sequence[Mapping[str, Any]],
    start: int = 0,
    protect: AbstractSet[str] = frozenset(),
    originals: Sequence[Mapping[str, Any]] | None = None,
) -> list[Mapping[str, Any]]:
    """The tool unit (its first message at `start` in the history) with its outputs pruned,
    except those of `protect`ed tools. `originals`: the unit as the client sent it, when
    truncation already changed it (placeholders describe and name the originals)."""
    names = tool_names(unit_messages)
    source = unit_messages if originals is None else originals
    out: list[Mapping[str, Any]] = [unit_messages[0]]
    for offset, (message, name) in enumerate(zip(unit_messages[1:], names, strict=True), 1):
        if name in protect:
            out.append(message)
            continue
        original = source[offset].get("content")
        out.append(prune_message(message, name, start + offset, original))
    return out
