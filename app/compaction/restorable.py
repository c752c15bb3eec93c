"""What `inflight_restore` can hand back: every ref a plan's markers (and the ledger) carry, mapped
to the original.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from inflight.compaction.prune import tool_names
from inflight.compaction.refs import ref_for
from inflight.compaction.rendering import Plan, kept_units
from inflight.compaction.truncate import unit_texts
from inflight.compaction.unit_costs import TOOL_KINDS


def removed_positions(plan: Plan) -> list[int]:
    """Positions of the messages the plan cut or dropped (the span a summary or marker names)."""
    return [
        p
        for i, unit in enumerate(plan.units)
        if not plan.kept(i)
        for p in range(unit.start, unit.end)
    ]


def span_ref(plan: Plan, messages: Sequence[Mapping[str, Any]]) -> str | None:
    """The ref of what the plan cut or dropped: its first position and its messages as
    canonical JSON (part `span`); None when nothing was."""
    removed = removed_positions(plan)
    if not removed:
        return None
    return ref_for(removed[0], [messages[p] for p in removed], "span")


def as_text(content: Any) -> str:
    """A message content as plain text: a string as is, text parts joined, anything else as
    JSON."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(p, dict) and isinstance(p.get("text"), str) for p in content
    ):
        return "\n".join(p["text"] for p in content)
    return orjson.dumps(content).decode()


def transcript(messages: Sequence[Mapping[str, Any]], positions: Sequence[int]) -> str:
    """The messages at `positions`, one block each: position, role (tool name or call id),
    content, and the calls an assistant message makes."""
    blocks: list[str] = []
    for position in positions:
        message = messages[position]
        role = str(message.get("role", "?"))
        if role == "tool" and message.get("tool_call_id") is not None:
            role += f" ({message['tool_call_id']})"
        block = f"#{position} {role}: {as_text(message.get('content'))}"
        for key in ("tool_calls", "function_call"):
            if message.get(key):
                block += f"\n{key}: {orjson.dumps(message[key]).decode()}"
        blocks.append(block)
    return "\n\n".join(blocks)


def _unit_refs(
    messages: Sequence[Mapping[str, Any]], the_plan: Plan, i: int, out: dict[str, str]
) -> None:
    """The refs the markers of kept unit i carry (truncated texts, pruned outputs)."""
    unit = the_plan.units[i]
    chunk = list(messages[unit.start : unit.end])
    protect = the_plan.protect if i < len(the_plan.units) - 1 else frozenset()
    if i in the_plan.truncated:
        deep = i in the_plan.deep
        found = unit_texts(chunk, deep=deep, start=unit.start, protect=protect)
        for position, part, text in found:
            out[ref_for(position, text, part)] = text
        for position in {position for position, _, _ in found}:
            _whole(messages, position, out)
    if i < the_plan.pruned_before and unit.kind in TOOL_KINDS:
        names = tool_names(chunk)
        for offset in range(1, len(chunk)):
            if names[offset - 1] not in protect:
                content = chunk[offset].get("content")
                out[ref_for(unit.start + offset, content)] = as_text(content)


def restorable(messages: Sequence[Mapping[str, Any]], the_plan: Plan) -> dict[str, str]:
    """Every ref the plan's markers carry (and the span marker, restoring; and the ledger's
    per-message refs), mapped to the original text it stands for. `messages` are those the
    plan was made for.

    Restore stores nothing (DESIGN.md §11): the client resends its whole history, so the refs of a
    request's markers resolve against the messages of that very request. The plan's transforms are
    replayed to name every cut thing the way its marker does (app/compaction/refs.py) — a truncated
    text, a pruned output, the span cut or dropped — and the original is returned as text.
    """
    out: dict[str, str] = {}
    for i in kept_units(the_plan):
        if i in the_plan.truncated or i < the_plan.pruned_before:
            _unit_refs(messages, the_plan, i, out)
    removed = removed_positions(the_plan)
    ref = span_ref(the_plan, messages)
    if ref is not None:
        out[ref] = transcript(messages, removed)
    for position in removed:
        _whole(messages, position, out)
    return out


def _whole(messages: Sequence[Mapping[str, Any]], position: int, out: dict[str, str]) -> None:
    """The ref of a cut message's whole content (the ledger's `ref`, app/compaction/cuts.py),
    so a ref read from the ledger resolves too."""
    content = messages[position].get("content")
    out.setdefault(ref_for(position, content), as_text(content))
