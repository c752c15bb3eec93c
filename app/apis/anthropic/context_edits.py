"""Anthropic context editing (`context_management.edits`), applied by the proxy (DESIGN.md §13).

Applied for an upstream that ignores the field (llama.cpp, vLLM, Ollama), reported as
`applied_edits`; only simulated for one that applies them (`upstream_sees`), so compaction
counts what they will leave.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from inflight.apis.anthropic.rules import block_type, blocks_of, turns_of
from inflight.errors import BadRequest
from inflight.tokens.heuristic import heuristic_tokens

CONTEXT_MANAGEMENT_BETA = "context-management-2025-06-27"
CLEAR_TOOL_USES = "clear_tool_uses_20250919"
CLEAR_THINKING = "clear_thinking_20251015"
PLACEHOLDER = "[tool result cleared to save context]"
THINKING = frozenset({"thinking", "redacted_thinking"})
DEFAULT_TRIGGER = 100_000  # input tokens
DEFAULT_KEEP_TOOL_USES = 3
DEFAULT_KEEP_THINKING_TURNS = 1

TriggerKind = Literal["input_tokens", "tool_uses"]


@dataclass(frozen=True, slots=True)
class ClearToolUses:
    """`clear_tool_uses_20250919` with its defaults filled in."""

    trigger: tuple[TriggerKind, int] = ("input_tokens", DEFAULT_TRIGGER)
    keep: int = DEFAULT_KEEP_TOOL_USES
    clear_at_least: int = 0
    exclude_tools: frozenset[str] = frozenset()
    clear_inputs: bool | frozenset[str] = False  # True: every cleared use's input; a set: those

    def clears_input(self, name: Any) -> bool:
        if isinstance(self.clear_inputs, bool):
            return self.clear_inputs
        return name in self.clear_inputs


@dataclass(frozen=True, slots=True)
class ClearThinking:
    """`clear_thinking_20251015`: keep the thinking of the last `keep` assistant turns that
    have some (None: all)."""

    keep: int | None = DEFAULT_KEEP_THINKING_TURNS


Edit = ClearToolUses | ClearThinking


@dataclass(frozen=True, slots=True)
class EditedBody:
    """A body with the edits applied, without `context_management`, and what Anthropic would
    report in `context_management.applied_edits`."""

    body: dict[str, Any]
    applied: tuple[dict[str, Any], ...]

    def report(self) -> dict[str, Any]:
        """The response's `context_management` value."""
        return {"applied_edits": list(self.applied)}


def _bad(param: str, message: str) -> BadRequest:
    return BadRequest(f"{param}: {message}", param=param)


def _count(value: Any, where: str, kinds: tuple[str, ...]) -> tuple[str, int]:
    """A `{type, value}` object whose type is one of `kinds` and value a non-negative int."""
    if not isinstance(value, Mapping) or value.get("type") not in kinds:
        raise _bad(where, f"must be an object with type {' or '.join(kinds)}")
    number = value.get("value")
    if isinstance(number, bool) or not isinstance(number, int) or number < 0:
        raise _bad(f"{where}.value", "must be a non-negative integer")
    return str(value["type"]), number


def _names(value: Any, where: str) -> frozenset[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _bad(where, "must be a list of tool names")
    return frozenset(value)


def _tool_uses(edit: Mapping[str, Any], where: str) -> ClearToolUses:
    parsed = ClearToolUses()
    if edit.get("trigger") is not None:
        kind, value = _count(edit["trigger"], f"{where}.trigger", ("input_tokens", "tool_uses"))
        parsed = ClearToolUses(
            trigger=("tool_uses" if kind == "tool_uses" else "input_tokens", value)
        )
    keep = parsed.keep
    if edit.get("keep") is not None:
        keep = _count(edit["keep"], f"{where}.keep", ("tool_uses",))[1]
    least = 0
    if edit.get("clear_at_least") is not None:
        least = _count(edit["clear_at_least"], f"{where}.clear_at_least", ("input_tokens",))[1]
    excluded = frozenset[str]()
    if edit.get("exclude_tools") is not None:
        excluded = _names(edit["exclude_tools"], f"{where}.exclude_tools")
    inputs: bool | frozenset[str] = False
    raw = edit.get("clear_tool_inputs")
    if isinstance(raw, bool):
        inputs = raw
    elif raw is not None:
        inputs = _names(raw, f"{where}.clear_tool_inputs")
    return ClearToolUses(parsed.trigger, keep, least, excluded, inputs)


def _thinking(edit: Mapping[str, Any], where: str) -> ClearThinking:
    keep = edit.get("keep")
    if keep is None:
        return ClearThinking()
    if keep == "all" or (isinstance(keep, Mapping) and keep.get("type") == "all"):
        return ClearThinking(keep=None)
    return ClearThinking(keep=_count(keep, f"{where}.keep", ("thinking_turns",))[1])


def requested_edits(body: Mapping[str, Any]) -> tuple[Edit, ...] | None:
    """The edits `body` asks for (None: it has no `context_management`); a 400 naming the
    field when one is malformed. Edits the proxy does not apply (`compact_20260112`: inflight
    compacts instead) are left out."""
    if "context_management" not in body:
        return None
    config = body["context_management"]
    if config is None:
        return ()
    if not isinstance(config, Mapping):
        raise _bad("context_management", "must be an object")
    edits = config.get("edits", [])
    if not isinstance(edits, list):
        raise _bad("context_management.edits", "must be a list")
    out: list[Edit] = []
    for k, edit in enumerate(edits):
        where = f"context_management.edits.{k}"
        kind = edit.get("type") if isinstance(edit, Mapping) else None
        if not isinstance(kind, str):
            raise _bad(f"{where}.type", "each edit needs a type")
        if kind == CLEAR_TOOL_USES:
            out.append(_tool_uses(edit, where))
        elif kind == CLEAR_THINKING:
            out.append(_thinking(edit, where))
    return tuple(out)


def _strings(value: Any) -> Iterator[str]:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, Mapping):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def tokens(value: Any) -> int:
    """The heuristic tokens of every string in a JSON value (no calibration: decisions must
    not move when the counter learns)."""
    return sum(heuristic_tokens(s) for s in _strings(value))


@dataclass(frozen=True, slots=True)
class _Use:
    """One tool use with its result: where both are, and what clearing it saves."""

    turn: int  # the assistant turn it is in
    call: tuple[int, int]  # (message, block) of the `tool_use`
    result: tuple[int, int]  # (message, block) of its `tool_result`
    name: Any
    saves: int  # tokens the result's content costs over the placeholder's
    saves_input: int  # tokens its input costs over `{}`


def _uses(messages: Sequence[Any]) -> list[_Use]:
    """The tool uses answered in the user turn right after their assistant turn, in order."""
    turns = turns_of(messages)
    found: list[_Use] = []
    for t, (role, indices) in enumerate(turns):
        if role != "assistant" or t + 1 >= len(turns) or turns[t + 1][0] != "user":
            continue
        results: dict[Any, tuple[int, int, Any]] = {}
        for i in turns[t + 1][1]:
            for j, block in enumerate(blocks_of(messages[i])):
                if block_type(block) == "tool_result" and isinstance(block.get("tool_use_id"), str):
                    results.setdefault(block["tool_use_id"], (i, j, block))
        for i in indices:
            for j, block in enumerate(blocks_of(messages[i])):
                use = block_type(block) == "tool_use" and isinstance(block.get("id"), str)
                answer = results.get(block["id"]) if use else None
                if answer is None:
                    continue
                saves = max(0, tokens(answer[2].get("content")) - heuristic_tokens(PLACEHOLDER))
                found.append(
                    _Use(
                        t, (i, j), answer[:2], block.get("name"), saves, tokens(block.get("input"))
                    )
                )
    return found


def _user_turn_ends(messages: Sequence[Any]) -> list[int]:
    """The message index just past each user turn: where a request of the session could end."""
    ends = [indices[-1] + 1 for role, indices in turns_of(messages) if role == "user"]
    if not ends or ends[-1] != len(messages):
        ends.append(len(messages))
    return ends


def _message_tokens(message: Any) -> int:
    """A message's heuristic tokens, thinking left out (Anthropic drops earlier turns'
    thinking from the prompt, so it never counts towards a trigger)."""
    if not isinstance(message, Mapping):
        return tokens(message)
    return sum(tokens(b) for b in blocks_of(message) if block_type(b) not in THINKING)


def cleared_uses(edit: ClearToolUses, messages: Sequence[Any], fixed_tokens: int = 0) -> list[int]:
    """The indices (into the history's answered tool uses, in order) that `edit` clears: the
    history replayed one user turn at a time, a clearing decided whenever the prompt as edited
    so far crosses the trigger and at least `clear_at_least` tokens can go."""
    uses = _uses(messages)
    cost = [_message_tokens(m) for m in messages]
    cleared: list[int] = []
    done: set[int] = set()
    total, at, seen = fixed_tokens, 0, 0
    for end in _user_turn_ends(messages):
        total += sum(cost[at:end])
        at = end
        while seen < len(uses) and uses[seen].result[0] < end:
            seen += 1
        live = [k for k in range(seen) if k not in done]
        kind, value = edit.trigger
        over = len(live) > value if kind == "tool_uses" else total > value
        if not over:
            continue
        eligible = [k for k in range(seen) if uses[k].name not in edit.exclude_tools]
        kept = set(eligible[max(0, len(eligible) - edit.keep) :]) if edit.keep else set()
        batch = [k for k in eligible if k not in done and k not in kept]
        gain = sum(_saving(edit, uses[k]) for k in batch)
        if not batch or gain < edit.clear_at_least:
            continue
        cleared.extend(batch)
        done.update(batch)
        total -= gain
    return sorted(cleared)


def _saving(edit: ClearToolUses, use: _Use) -> int:
    return use.saves + (use.saves_input if edit.clears_input(use.name) else 0)


def thinking_turns(edit: ClearThinking, messages: Sequence[Any]) -> list[int]:
    """The assistant turns whose thinking `edit` clears: all but the last `keep` turns that
    have thinking."""
    if edit.keep is None:
        return []
    with_thinking = [
        t
        for t, (role, indices) in enumerate(turns_of(messages))
        if role == "assistant"
        and any(block_type(b) in THINKING for i in indices for b in blocks_of(messages[i]))
    ]
    return with_thinking[: max(0, len(with_thinking) - edit.keep)]


@dataclass(slots=True)
class _Editing:
    """The history being edited: messages copied only where a block changes. `in_place`: a
    cleared thinking block stays as an empty block of its type, so every block keeps its index
    (the simulation's messages are read by paths into the body as sent)."""

    messages: list[Any]
    in_place: bool = False

    def block(self, i: int, j: int, block: Any) -> None:
        message = self.messages[i]
        content = list(message["content"])
        content[j] = block
        self.messages[i] = {**message, "content": content}

    def drop_thinking(self, indices: Sequence[int]) -> int:
        """Take the thinking blocks out of these messages; returns the tokens removed."""
        removed = 0
        for i in indices:
            message = self.messages[i]
            if not isinstance(message, Mapping) or not isinstance(message.get("content"), list):
                continue
            content = message["content"]
            if not any(block_type(b) in THINKING for b in content):
                continue
            if self.in_place:
                kept = [
                    {"type": block_type(b)} if block_type(b) in THINKING else b for b in content
                ]
            else:
                kept = [b for b in content if block_type(b) not in THINKING]
            removed += sum(tokens(b) for b in content if block_type(b) in THINKING)
            self.messages[i] = {**message, "content": kept}
        return removed


def _apply_tool_uses(
    edit: ClearToolUses, editing: _Editing, fixed_tokens: int
) -> dict[str, Any] | None:
    uses = _uses(editing.messages)
    chosen = cleared_uses(edit, editing.messages, fixed_tokens)
    if not chosen:
        return None
    for k in chosen:
        use = uses[k]
        i, j = use.result
        editing.block(i, j, {**blocks_of(editing.messages[i])[j], "content": PLACEHOLDER})
        if edit.clears_input(use.name):
            i, j = use.call
            editing.block(i, j, {**blocks_of(editing.messages[i])[j], "input": {}})
    return {
        "type": CLEAR_TOOL_USES,
        "cleared_tool_uses": len(chosen),
        "cleared_input_tokens": sum(_saving(edit, uses[k]) for k in chosen),
    }


def _apply_thinking(edit: ClearThinking, editing: _Editing) -> dict[str, Any] | None:
    turns = turns_of(editing.messages)
    chosen = thinking_turns(edit, editing.messages)
    if not chosen:
        return None
    removed = sum(editing.drop_thinking(turns[t][1]) for t in chosen)
    return {
        "type": CLEAR_THINKING,
        "cleared_thinking_turns": len(chosen),
        "cleared_input_tokens": removed,
    }


def _edited(
    body: Mapping[str, Any], messages: list[Any], edits: Sequence[Edit], in_place: bool
) -> tuple[list[Any], list[dict[str, Any]]]:
    """`messages` with `edits` applied in the order listed, and what each one cleared."""
    editing = _Editing(list(messages), in_place)
    fixed = tokens(body.get("system")) + tokens(body.get("tools"))
    applied: list[dict[str, Any]] = []
    for edit in edits:
        if isinstance(edit, ClearToolUses):
            done = _apply_tool_uses(edit, editing, fixed)
        else:
            done = _apply_thinking(edit, editing)
        if done is not None:
            applied.append(done)
    return editing.messages, applied


def apply_edits(body: Mapping[str, Any]) -> EditedBody | None:
    """`body` with its requested edits applied and `context_management` taken out (None: it
    asks for none). Edits apply in the order listed; untouched messages stay the very
    objects.

    Decisions are a pure function of the history, made as if it had grown one user turn at a time:
    the trigger is measured on the prompt as edited so far, so a clearing brings it back under the
    trigger and the next requests share their prefix until it is crossed again (`clear_at_least`
    holds a clearing back until it is worth a cache break). Token counts are the uncalibrated
    heuristic, so calibration never moves a decision. Anthropic decides on each request alone:
    whenever it clears, it clears at least what this replay does, so the simulation's prompt is
    never smaller than the one Anthropic's edits leave.
    """
    edits = requested_edits(body)
    if edits is None:
        return None
    rest = {k: v for k, v in body.items() if k != "context_management"}
    messages = body.get("messages")
    if not edits or not isinstance(messages, list):
        return EditedBody(rest, ())
    edited, applied = _edited(body, messages, edits, in_place=False)
    if not applied:
        return EditedBody(rest, ())
    return EditedBody({**rest, "messages": edited}, tuple(applied))


def upstream_sees(body: Mapping[str, Any]) -> list[Any] | None:
    """The `messages` of a body that still carries `context_management` — one going to an
    upstream that applies the edits itself (Anthropic's API) — as those edits will leave them:
    what compaction counts, so that it cuts only what is over budget after them. Every block
    keeps its index (a cleared thinking block stands as an empty one), so paths into the body
    as sent still hold. None: no edit that clears anything, or a field Anthropic will reject
    (then it says why)."""
    try:
        edits = requested_edits(body)
    except BadRequest:
        return None
    messages = body.get("messages")
    if not edits or not isinstance(messages, list):
        return None
    edited, applied = _edited(body, messages, edits, in_place=True)
    return edited if applied else None
