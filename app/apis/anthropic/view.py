"""Anthropic Messages: the planner's view of a `POST /v1/messages` body (DESIGN.md §8).

Anthropic combines consecutive messages of one role into one turn, so the view is built per turn (a
maximal run of same-role messages), and each view message remembers its `Piece`: the blocks of the
body it stands for, by path.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from inflight.apis.anthropic.rules import block_type, blocks_of, turns_of
from inflight.compaction.wire import Conversation

Path = tuple[int, ...]  # (message, block) or (message, block, block inside a tool_result)
PieceKind = Literal["assistant", "result", "extra", "plain"]
THINKING = frozenset({"thinking", "redacted_thinking"})
COMPACTION = "compaction"


@dataclass(frozen=True, slots=True)
class Piece:
    """The blocks one view message stands for: `parts` behind its content parts (for a result,
    the `tool_result` block itself), `calls` behind its `tool_calls`, `hidden` (thinking)."""

    turn: int
    kind: PieceKind
    parts: tuple[Path, ...]
    calls: tuple[Path, ...] = ()
    hidden: tuple[Path, ...] = ()
    through: int | None = None  # the last turn it covers, when more than `turn` (the head)

    def paths(self) -> tuple[Path, ...]:
        return self.parts + self.calls + self.hidden

    @property
    def last_turn(self) -> int:
        return self.turn if self.through is None else self.through


@dataclass(frozen=True, slots=True)
class MessagesConversation(Conversation):
    """The view with the piece of the body behind each view message."""

    pieces: tuple[Piece, ...] = ()

    def origin(self, position: int) -> tuple[int, ...]:
        """The indices of the `messages` holding the blocks of view message `position`."""
        return tuple(sorted({path[0] for path in self.pieces[position].paths()}))


def _arguments(value: Any) -> str:
    try:
        return orjson.dumps(value).decode()
    except orjson.JSONEncodeError:  # integers past 64 bits, non-string keys
        return json.dumps(value, default=str)


def view_part(block: Any, *, opaque_text: bool = False) -> Any:
    """A block as a chat content part the counter reads: text as text (or, `opaque_text`, as a
    `value` no strategy cuts), images as image parts, documents as files, others as they are."""
    if not isinstance(block, Mapping):
        return block
    kind = block.get("type")
    if kind == "text" and isinstance(block.get("text"), str):
        key = "value" if opaque_text else "text"
        return {"type": "text", key: block["text"]}
    if kind == "image":
        source = block.get("source")
        source = source if isinstance(source, Mapping) else {}
        url = source.get("url")
        if source.get("type") == "base64":
            url = f"data:{source.get('media_type')};base64,{source.get('data')}"
        return {"type": "image_url", "image_url": {"url": url if isinstance(url, str) else ""}}
    if kind == "document":
        return {"type": "file"}
    part = {k: v for k, v in block.items() if k != "cache_control"}
    if opaque_text and "text" in part:
        part["value"] = part.pop("text")
    return part


def _result_content(block: Mapping[str, Any]) -> Any:
    content = block.get("content")
    if isinstance(content, list):
        return [view_part(b) for b in content]
    return content if isinstance(content, str) else ""


@dataclass(slots=True)
class _Builder:
    """Builds the view and its pieces, one turn at a time."""

    messages: Sequence[Any]
    view: list[dict[str, Any]] = field(default_factory=list)
    pieces: list[Piece] = field(default_factory=list)

    def blocks(self, indices: Sequence[int]) -> list[tuple[Path, Any]]:
        out: list[tuple[Path, Any]] = []
        for i in indices:
            content = self.messages[i].get("content")
            if isinstance(content, str):
                out.append(((i, -1), blocks_of(self.messages[i])[0]))
            else:
                out.extend(((i, j), b) for j, b in enumerate(blocks_of(self.messages[i])))
        return out

    def add(self, message: dict[str, Any], piece: Piece) -> None:
        self.view.append(message)
        self.pieces.append(piece)

    def assistant(self, t: int, blocks: list[tuple[Path, Any]]) -> bool:
        """One view message for the turn; True when it calls tools."""
        parts: list[Path] = []
        calls: list[Path] = []
        hidden: list[Path] = []
        for path, block in blocks:
            kind = block_type(block)
            (calls if kind == "tool_use" else hidden if kind in THINKING else parts).append(path)
        found = dict(blocks)
        message: dict[str, Any] = {
            "role": "assistant",
            "content": [view_part(found[p]) for p in parts],
        }
        if calls:
            message["tool_calls"] = [
                {
                    "id": found[p].get("id"),
                    "type": "function",
                    "function": {
                        "name": found[p].get("name"),
                        "arguments": _arguments(found[p].get("input")),
                    },
                }
                for p in calls
            ]
        thoughts = [found[p].get("thinking") for p in hidden]
        if any(isinstance(x, str) for x in thoughts):
            message["reasoning_content"] = "\n".join(x for x in thoughts if isinstance(x, str))
        self.add(message, Piece(t, "assistant", tuple(parts), tuple(calls), tuple(hidden)))
        return bool(calls)

    def answers(self, t: int, blocks: list[tuple[Path, Any]]) -> None:
        """A user turn answering calls: a tool message per result, one for the other blocks."""
        others: list[Path] = []
        for path, block in blocks:
            if isinstance(block, Mapping) and block.get("type") == "tool_result":
                view = {"role": "tool", "tool_call_id": block.get("tool_use_id")}
                self.add({**view, "content": _result_content(block)}, Piece(t, "result", (path,)))
            else:
                others.append(path)
        if others:
            found = dict(blocks)
            content = [view_part(found[p], opaque_text=True) for p in others]
            self.add({"role": "tool", "content": content}, Piece(t, "extra", tuple(others)))

    def plain(self, t: int, role: Any, blocks: list[tuple[Path, Any]]) -> None:
        content = [view_part(b) for _, b in blocks]
        self.add({"role": role, "content": content}, Piece(t, "plain", tuple(p for p, _ in blocks)))

    def pinned(self, turns: Sequence[tuple[Any, list[int]]]) -> int:
        """The turns a `compaction` block stands in for, and the user turn after it, as one
        pinned user view message; returns the first turn after them (0: no such block)."""
        holding = [
            t
            for t, (_, indices) in enumerate(turns)
            if any(
                block_type(b) == COMPACTION for i in indices for b in blocks_of(self.messages[i])
            )
        ]
        if not holding:
            return 0
        end = holding[-1]
        if turns[end][0] != "user":
            end = next((t for t in range(end + 1, len(turns)) if turns[t][0] == "user"), end)
        blocks = [b for t in range(end + 1) for b in self.blocks(turns[t][1])]
        content = [view_part(b) for _, b in blocks]
        paths = tuple(p for p, _ in blocks)
        self.add({"role": "user", "content": content}, Piece(0, "plain", paths, through=end))
        return end + 1

    def build(self) -> None:
        calling = False
        turns = turns_of(self.messages)
        start = self.pinned(turns)
        for t, (role, indices) in enumerate(turns):
            if t < start:
                continue
            blocks = self.blocks(indices) if isinstance(role, str) else []
            if role == "assistant":
                calling = self.assistant(t, blocks)
                continue
            answering = calling and any(
                isinstance(b, Mapping) and b.get("type") == "tool_result" for _, b in blocks
            )
            if answering:
                self.answers(t, blocks)
            else:
                self.plain(t, role if isinstance(role, str) else "user", blocks)
            calling = False


def build_view(
    messages: Sequence[Mapping[str, Any]],
) -> tuple[list[dict[str, Any]], tuple[Piece, ...]]:
    """The chat-shaped view of Anthropic `messages` and the piece behind each view message.

    - an assistant turn is one assistant view message: its text and other blocks as content parts,
      its `tool_use` blocks as `tool_calls` (arguments are the JSON of `input`), its thinking as
      `reasoning_content` (counted, never truncated: thinking and redacted-thinking blocks stay with
      their turn, byte-identical, signatures untouched);
    - the user turn right after an assistant turn with calls, when it answers them, is one `tool`
      view message per `tool_result` block, plus one `tool` message for its other blocks (text,
      images) whose parts carry no `text` field, so neither truncation nor pruning reaches what the
      user wrote: the planner keeps or drops the call and its answers as one unit;
    - any other turn is one view message of its role — a `role: "system"` message inside `messages`
      too: the planner pins it where it stands and it takes no turn (§3).

    `system`, `tools` and `tool_choice` are `fixed`; the first user message is the pinned head. An
    Anthropic `compaction` block (beta `compact-2026-01-12`) stands in for the history before it
    (DESIGN.md §13): every turn up to the last one holding such a block, and the user turn after it,
    is one pinned user view message, so what follows is compacted and nothing before or across it is
    cut. The turns of a valid request alternate and a tool round takes an assistant turn and a user
    turn, so the view follows the strict role order (§4.6) and every plan keeps the turns
    alternating.
    """
    builder = _Builder(messages)
    builder.build()
    return builder.view, tuple(builder.pieces)
