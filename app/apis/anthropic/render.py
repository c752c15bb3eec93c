"""Anthropic Messages: a compacted view rendered back into `messages` (DESIGN.md §8)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from inflight.apis.anthropic.rules import block_type, blocks_of, turns_of
from inflight.apis.anthropic.view import THINKING, MessagesConversation, Path, Piece

Blocks = list[tuple[Path | None, Any]]  # (where the block came from; None: written here, block)


@dataclass(slots=True)
class _Out:
    """One output message being assembled."""

    role: Any
    source: Mapping[str, Any] | None  # the input message it renders; None: inserted
    blocks: Blocks
    changed: bool

    def message(self) -> Mapping[str, Any]:
        if not self.changed and self.source is not None:
            return self.source
        blocks = [b for _, b in self.blocks]
        if self.source is None:
            return {"role": self.role, "content": blocks}
        if len(self.blocks) == 1:
            origin, block = self.blocks[0]
            if origin is not None and origin[-1] == -1 and not block.get("cache_control"):
                return {**self.source, "content": block["text"]}  # a string stays a string
        return {**self.source, "content": blocks}


def _text_blocks(content: Any) -> list[Any]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    parts = content if isinstance(content, list) else []
    return [
        {"type": "text", "text": p["text"]}
        for p in parts
        if isinstance(p, Mapping) and isinstance(p.get("text"), str)
    ]


def _block_at(messages: Sequence[Mapping[str, Any]], path: Path) -> Any:
    return blocks_of(messages[path[0]])[max(path[1], 0)]


def _result_block(block: Mapping[str, Any], before: Any, after: Any) -> dict[str, Any]:
    """The `tool_result` with the content a strategy left (nested blocks kept where equal)."""
    nested = block.get("content")
    if not isinstance(after, list) or not isinstance(before, list) or not isinstance(nested, list):
        return {**block, "content": after}
    content = [
        original if part is old else {**original, "text": part.get("text")}
        for original, old, part in zip(nested, before, after, strict=False)
    ]
    return {**block, "content": content}


def _call_block(block: Mapping[str, Any], call: Any) -> Mapping[str, Any]:
    """The `tool_use` with the input a deep truncation left (kept when it is no JSON object)."""
    function = call.get("function") if isinstance(call, Mapping) else None
    arguments = function.get("arguments") if isinstance(function, Mapping) else None
    try:
        value = orjson.loads(arguments) if isinstance(arguments, str) else None
    except orjson.JSONDecodeError:
        value = None
    return {**block, "input": value} if isinstance(value, dict) else block


def _changes(
    messages: Sequence[Mapping[str, Any]], piece: Piece, old: Mapping[str, Any], new: Any
) -> tuple[dict[Path, Any], list[Any]]:
    """The blocks a strategy rewrote (by path) and the text blocks it appended (a fold)."""
    changed: dict[Path, Any] = {}
    if piece.kind == "result":
        path = piece.parts[0]
        changed[path] = _result_block(_block_at(messages, path), old["content"], new.get("content"))
        return changed, []
    content = new.get("content")
    parts = content if isinstance(content, list) else _text_blocks(content)
    for path, before, after in zip(piece.parts, old["content"], parts, strict=False):
        if after is not before and after != before:
            block = _block_at(messages, path)
            text = after.get("text") if isinstance(after, Mapping) else None
            if isinstance(block, Mapping) and isinstance(text, str) and "text" in block:
                changed[path] = {**block, "text": text}
    for path, before, after in zip(
        piece.calls, old.get("tool_calls", []), new.get("tool_calls") or [], strict=False
    ):
        if after is not before and after != before:  # (a re-encoding may copy an equal call)
            changed[path] = _call_block(_block_at(messages, path), after)
    return changed, _text_blocks(parts[len(piece.parts) :])


@dataclass(slots=True)
class _Assembly:
    """The output messages, built turn by turn from the pieces the plan kept."""

    messages: Sequence[Mapping[str, Any]]
    conversation: MessagesConversation
    outs: list[_Out]
    present: set[Path]
    changed: dict[Path, Any]
    appended: dict[int, list[Any]]

    def turn(self, indices: Sequence[int]) -> None:
        for i in indices:
            message = self.messages[i]
            paths: list[Path] = (
                [(i, -1)]
                if isinstance(message.get("content"), str)
                else [(i, j) for j in range(len(blocks_of(message)))]
            )
            originals = blocks_of(message)
            kept: Blocks = [
                (p, self.changed.get(p, originals[max(p[1], 0)]))
                for p in paths
                if p in self.present
            ]
            extra = self.appended.get(i, [])
            kept.extend((None, b) for b in extra)
            if not kept:
                continue
            touched = len(kept) != len(paths) or any(p in self.changed for p in paths)
            self.outs.append(_Out(message.get("role"), message, kept, touched or bool(extra)))


def _assemble(
    messages: Sequence[Mapping[str, Any]],
    conversation: MessagesConversation,
    view: Sequence[Mapping[str, Any]],
    sources: Sequence[int | None],
) -> list[_Out]:
    pieces = conversation.pieces
    present = {p for s in sources if s is not None for p in pieces[s].paths()}
    changed: dict[Path, Any] = {}
    appended: dict[int, list[Any]] = {}
    for message, source in zip(view, sources, strict=True):
        if source is not None and message is not conversation.messages[source]:
            piece = pieces[source]
            rewritten, extra = _changes(messages, piece, conversation.messages[source], message)
            changed.update(rewritten)
            if extra:
                owner = max(piece.paths())[0] if piece.paths() else 0
                appended.setdefault(owner, []).extend(extra)
    assembly = _Assembly(messages, conversation, [], present, changed, appended)
    turns = turns_of(messages)
    last_turn: int | None = None
    for message, source in zip(view, sources, strict=True):
        if source is None:
            assembly.outs.append(
                _Out(
                    message.get("role"),
                    None,
                    [(None, b) for b in _text_blocks(message.get("content"))],
                    True,
                )
            )
            last_turn = None
        elif pieces[source].turn != last_turn:
            for t in range(pieces[source].turn, pieces[source].last_turn + 1):
                assembly.turn(turns[t][1])
            last_turn = pieces[source].last_turn
    return assembly.outs


def _fold_inserted(outs: list[_Out]) -> list[_Out]:
    """An inserted message that meets a message of its role becomes part of it: appended to the
    one before, or put first in the one after (after its results and thinking, which must
    lead)."""
    folded: list[_Out] = []
    for k, out in enumerate(outs):
        if out.source is not None:
            folded.append(out)
            continue
        after = outs[k + 1] if k + 1 < len(outs) else None
        if folded and folded[-1].role == out.role:
            folded[-1].blocks.extend(out.blocks)
            folded[-1].changed = True
        elif after is not None and after.role == out.role:
            at = 0
            while at < len(after.blocks) and _leads(after.blocks[at][1]):
                at += 1
            after.blocks[at:at] = out.blocks
            after.changed = True
        else:
            folded.append(out)
    return folded


def _leads(block: Any) -> bool:
    return block_type(block) in THINKING | {"tool_result"}


def _breakpoints(messages: Sequence[Mapping[str, Any]]) -> list[tuple[Path, Any]]:
    """Every block of the request carrying `cache_control` (tool results' nested ones too)."""
    found: list[tuple[Path, Any]] = []
    for i, message in enumerate(messages):
        if not isinstance(message.get("content"), list):
            continue
        for j, block in enumerate(blocks_of(message)):
            if not isinstance(block, Mapping):
                continue
            if block.get("cache_control"):
                found.append(((i, j), block["cache_control"]))
            nested = block.get("content") if block.get("type") == "tool_result" else None
            for n, inner in enumerate(nested if isinstance(nested, list) else []):
                if isinstance(inner, Mapping) and inner.get("cache_control"):
                    found.append(((i, j, n), inner["cache_control"]))
    return found


def _holds_breakpoint(block: Any) -> bool:
    if not isinstance(block, Mapping) or block_type(block) in THINKING:
        return False
    return not (block.get("type") == "text" and not block.get("text"))


def _kept(outs: list[_Out], path: Path) -> bool:
    """Whether the breakpoint at `path` is still on its block in the output."""
    for out in outs:
        for origin, block in out.blocks:
            if origin == path[:2] and isinstance(block, Mapping):
                if len(path) == 2:
                    return bool(block.get("cache_control"))
                nested = block.get("content")
                return (
                    isinstance(nested, list)
                    and path[2] < len(nested)
                    and isinstance(nested[path[2]], Mapping)
                    and bool(nested[path[2]].get("cache_control"))
                )
    return False


def _stand_in(outs: list[_Out], path: Path) -> tuple[int, int] | None:
    """The block that now stands where `path` was: its parent result if still there, else the
    last block (the summary, or a kept one) before the first kept block after it."""
    flat = [(o, b) for o, out in enumerate(outs) for b in range(len(out.blocks))]
    for o, b in flat:
        if len(path) == 3 and outs[o].blocks[b][0] == path[:2]:
            return o, b
    end = next(
        (k for k, (o, b) in enumerate(flat) if (outs[o].blocks[b][0] or ()) > path), len(flat)
    )
    for o, b in reversed(flat[:end]):
        if outs[o].role != "system" and _holds_breakpoint(outs[o].blocks[b][1]):
            return o, b
    return None


def _move_breakpoints(messages: Sequence[Mapping[str, Any]], outs: list[_Out]) -> None:
    for path, control in _breakpoints(messages):
        if _kept(outs, path):
            continue
        target = _stand_in(outs, path)
        if target is None:
            continue
        o, b = target
        origin, block = outs[o].blocks[b]
        if not block.get("cache_control"):
            outs[o].blocks[b] = (origin, {**block, "cache_control": control})
            outs[o].changed = True


def render_messages(
    messages: Sequence[Mapping[str, Any]],
    conversation: MessagesConversation,
    view: Sequence[Mapping[str, Any]],
    sources: Sequence[int | None],
) -> list[Mapping[str, Any]]:
    """The Anthropic messages for the compacted `view` (`sources[k]`: the index in
    `conversation.messages` output k came from, None for an inserted summary).

    Every block of a piece the plan kept is put back where it was; a message none of whose blocks
    changed is the very object the client sent. What a strategy changed is rewritten in place: a
    `tool_result`'s content (truncated, or pruned to a placeholder), a text block's text, a
    `tool_use`'s `input` (deep truncation keeps arguments valid JSON). Thinking blocks are never
    rewritten. An inserted summary becomes a text block: a message of its own, or — when a neighbour
    has its role — folded into that neighbour, so turns keep alternating.

    Breakpoints (`cache_control`): one on a kept block stays on it; one whose block was cut (or
    whose nested block a prune replaced) moves to the block now standing where it was — the parent
    `tool_result`, the summary, or the last kept block before it (never a pinned system message's:
    instructions stay as sent) — unless that block has one already. None is ever added, so the
    output never has more than the request had.
    """
    outs = _fold_inserted(_assemble(messages, conversation, view, sources))
    _move_breakpoints(messages, outs)
    return [out.message() for out in outs]
