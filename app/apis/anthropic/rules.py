"""What Anthropic's Messages API rejects in a request body, each problem naming its field.

These checks run only when compaction would rewrite the request (a request the proxy need not touch
is forwarded as sent, for the upstream to judge), so that a body it cannot rewrite safely is a 400
naming the field (`messages.3.content.1.type`, as Anthropic names it).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

ROLES = ("user", "assistant", "system")
MAX_BREAKPOINTS = 4
# Block types each role may not carry.
FORBIDDEN: dict[str, frozenset[str]] = {
    "user": frozenset({"tool_use", "thinking", "redacted_thinking", "server_tool_use"}),
    "assistant": frozenset({"tool_result", "image", "document"}),
    "system": frozenset(
        {"tool_use", "tool_result", "thinking", "redacted_thinking", "server_tool_use"}
        | {"image", "document"}
    ),
}


@dataclass(frozen=True, slots=True)
class Problem:
    """One reason Anthropic would reject the body: the field (`messages.2.content.0.type`) and
    what is wrong with it."""

    param: str
    message: str


def block_type(block: Any) -> str | None:
    """A block's `type` when it is a block with a string type, else None."""
    kind = block.get("type") if isinstance(block, Mapping) else None
    return kind if isinstance(kind, str) else None


def _system(message: Mapping[str, Any]) -> bool:
    return message.get("role") == "system"


def blocks_of(message: Mapping[str, Any]) -> list[Any]:
    """The message's content as a list of blocks (a string is one text block)."""
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return content if isinstance(content, list) else []


def turns_of(messages: Sequence[Any]) -> list[tuple[Any, list[int]]]:
    """(role, message indices) of each maximal run of messages of one role; a system message
    is one of its own (an instruction, not a turn: each stays where it stands)."""
    turns: list[tuple[Any, list[int]]] = []
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, Mapping) else None
        if turns and turns[-1][0] == role and role != "system":
            turns[-1][1].append(i)
        else:
            turns.append((role, [i]))
    return turns


def _typed_blocks(
    messages: Sequence[Any], indices: Sequence[int], kind: str
) -> Iterator[tuple[int, int, Mapping[str, Any]]]:
    for i in indices:
        for j, block in enumerate(blocks_of(messages[i])):
            if isinstance(block, Mapping) and block.get("type") == kind:
                yield i, j, block


def _shape_problems(messages: Sequence[Any]) -> Iterator[Problem]:
    for i, message in enumerate(messages):
        where = f"messages.{i}"
        if not isinstance(message, Mapping):
            yield Problem(where, f"{where}: Input should be an object")
            continue
        role = message.get("role")
        if role not in ROLES:
            yield Problem(
                f"{where}.role", f"{where}.role: Input should be 'user', 'assistant' or 'system'"
            )
            continue
        content = message.get("content")
        if not isinstance(content, str | list):
            yield Problem(f"{where}.content", f"{where}.content: Input should be a string or list")
            continue
        for j, block in enumerate(blocks_of(message)):
            kind = block_type(block)
            if kind is None:
                yield Problem(f"{where}.content.{j}", f"{where}.content.{j}: a block needs a type")
            elif kind in FORBIDDEN[role]:
                yield Problem(
                    f"{where}.content.{j}.type",
                    f"{where}.content.{j}.type: a {role} message cannot carry `{kind}` blocks",
                )
            elif kind == "text" and not isinstance(block.get("text"), str):
                yield Problem(
                    f"{where}.content.{j}.text", f"{where}.content.{j}.text: not a string"
                )
            elif kind == "tool_use" and not isinstance(block.get("id"), str):
                yield Problem(f"{where}.content.{j}.id", f"{where}.content.{j}.id: not a string")
            elif kind == "tool_result" and not isinstance(block.get("tool_use_id"), str):
                yield Problem(
                    f"{where}.content.{j}.tool_use_id",
                    f"{where}.content.{j}.tool_use_id: not a string",
                )
    # (system messages inside `messages` aside: they take no turn)
    first = next(
        (i for i, m in enumerate(messages) if not (isinstance(m, Mapping) and _system(m))), 0
    )
    leading = messages[first] if messages else None
    if isinstance(leading, Mapping) and leading.get("role") != "user":
        yield Problem(
            f"messages.{first}.role",
            f"messages.{first}.role: the first message must use the user role",
        )


def _pairing_problems(messages: Sequence[Any]) -> Iterator[Problem]:
    turns = turns_of(messages)
    calls: set[Any] = set()  # tool_use ids of the assistant turn right before
    for t, (role, indices) in enumerate(turns):
        if role == "user":
            for i, j, block in _typed_blocks(messages, indices, "tool_result"):
                if block.get("tool_use_id") not in calls:
                    yield Problem(
                        f"messages.{i}.content.{j}.tool_use_id",
                        f"messages.{i}.content.{j}.tool_use_id: "
                        f"unexpected `tool_use_id` found in `tool_result` blocks: "
                        f"{block.get('tool_use_id')}. Each `tool_result` block must have a "
                        "corresponding `tool_use` block in the previous message.",
                    )
            calls = set()
            continue
        uses = list(_typed_blocks(messages, indices, "tool_use"))
        calls = {block.get("id") for _, _, block in uses}
        if not uses or t + 1 >= len(turns):
            continue
        answered = {
            block.get("tool_use_id")
            for _, _, block in _typed_blocks(messages, turns[t + 1][1], "tool_result")
        }
        for i, j, block in uses:
            if block.get("id") not in answered:
                yield Problem(
                    f"messages.{i}.content.{j}",
                    f"messages.{i}.content.{j}: "
                    f"`tool_use` ids were found without `tool_result` blocks immediately "
                    f"after: {block.get('id')}. Each `tool_use` block must have a corresponding "
                    "`tool_result` block in the next message.",
                )


def breakpoints(body: Mapping[str, Any]) -> int:
    """How many blocks carry `cache_control` (system, tools, messages and tool results)."""
    total = 0
    system = body.get("system")
    for holder in (system if isinstance(system, list) else [], body.get("tools")):
        if isinstance(holder, list):
            total += sum(isinstance(b, Mapping) and bool(b.get("cache_control")) for b in holder)
    messages = body.get("messages")
    for message in messages if isinstance(messages, list) else []:
        if not isinstance(message, Mapping):
            continue
        for block in blocks_of(message):
            if not isinstance(block, Mapping):
                continue
            total += bool(block.get("cache_control"))
            nested = block.get("content") if block.get("type") == "tool_result" else None
            if isinstance(nested, list):
                total += sum(
                    isinstance(b, Mapping) and bool(b.get("cache_control")) for b in nested
                )
    return total


def problems(body: Mapping[str, Any]) -> list[Problem]:
    """Everything Anthropic would reject in `body` that compaction depends on (empty: none).

    Consecutive messages of one role are one turn (Anthropic combines them), so tool pairing is
    checked per turn: every `tool_use` of an assistant turn is answered by a `tool_result` in the
    user turn right after it (unless the assistant turn ends the request), and every `tool_result`
    answers a `tool_use` of the assistant turn right before it. A `role: "system"` message inside
    `messages` (what Claude Code sends a non-Claude model, and servers of local models accept) is an
    instruction of text only; it takes no turn, but it must not stand between a call and its
    answers.
    """
    found: list[Problem] = []
    max_tokens = body.get("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
        found.append(Problem("max_tokens", "max_tokens: Field required (a non-negative integer)"))
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        found.append(Problem("messages", "messages: Input should be a non-empty list"))
        return found
    found.extend(_shape_problems(messages))
    if not found:
        found.extend(_pairing_problems(messages))
    count = breakpoints(body)
    if count > MAX_BREAKPOINTS:
        found.append(
            Problem(
                "cache_control",
                f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. "
                f"Found {count}.",
            )
        )
    return found
