"""A fake Anthropic Messages upstream that enforces the API's rules, written apart from the
proxy's own checks so that the tests do not grade the proxy with its own code.

`rule_violations(body)` is what the fake rejects with a 400: the first message is not `user`;
two messages in a row share a role (stricter than the API, which combines them: an output of
the proxy must alternate whenever its input did); a `tool_use` not answered by a `tool_result`
in the very next message; a `tool_result` that answers nothing in the message right before, or
that comes after another kind of block; more than 4 `cache_control` breakpoints; a breakpoint on
a thinking block or on an empty text block; an empty text block.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

MAX_BREAKPOINTS = 4


def content_blocks(message: Mapping[str, Any]) -> list[Any]:
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return list(content) if isinstance(content, list) else []


def _ids(message: Mapping[str, Any], kind: str, key: str) -> list[Any]:
    return [b.get(key) for b in content_blocks(message) if b.get("type") == kind]


def all_blocks(body: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    """Every block that may carry `cache_control`: system, tools, message blocks and the blocks
    nested in tool results."""
    system = body.get("system")
    yield from system if isinstance(system, list) else []
    yield from body.get("tools") or []
    for message in body.get("messages") or []:
        for block in content_blocks(message):
            yield block
            nested = block.get("content") if block.get("type") == "tool_result" else None
            yield from nested if isinstance(nested, list) else []


def _message_violations(messages: list[Mapping[str, Any]]) -> Iterator[str]:
    if not messages or messages[0].get("role") != "user":
        yield "the first message must use the user role"
    for i, message in enumerate(messages):
        if message.get("role") not in ("user", "assistant"):
            yield f"messages.{i}.role: {message.get('role')!r}"
        if i and message.get("role") == messages[i - 1].get("role"):
            yield f"messages.{i}: roles must alternate between user and assistant"
        blocks = content_blocks(message)
        if not blocks and not (i == len(messages) - 1 and message.get("role") == "assistant"):
            yield f"messages.{i}: empty content"
        kinds = [b.get("type") for b in blocks]
        first_other = next((k for k, kind in enumerate(kinds) if kind != "tool_result"), len(kinds))
        if "tool_result" in kinds[first_other:]:
            yield f"messages.{i}: tool_result blocks must come first"
        for b in blocks:
            if b.get("type") == "text" and not b.get("text"):
                yield f"messages.{i}: text content blocks must be non-empty"
        uses = _ids(message, "tool_use", "id")
        following = messages[i + 1] if i + 1 < len(messages) else None
        if uses and following is not None:
            answered = set(_ids(following, "tool_result", "tool_use_id"))
            missing = [u for u in uses if u not in answered]
            if missing:
                yield f"messages.{i}: tool_use ids without tool_result right after: {missing}"
        results = _ids(message, "tool_result", "tool_use_id")
        called = set(_ids(messages[i - 1], "tool_use", "id")) if i else set()
        stray = [r for r in results if r not in called]
        if stray:
            yield f"messages.{i}: unexpected tool_use_id in tool_result blocks: {stray}"


def rule_violations(body: Mapping[str, Any]) -> list[str]:
    """What Anthropic's rules (made strict on alternation) reject in `body` (empty: none)."""
    messages = [m for m in body.get("messages") or [] if isinstance(m, Mapping)]
    found = list(_message_violations(messages))
    marked = [b for b in all_blocks(body) if isinstance(b, Mapping) and b.get("cache_control")]
    if len(marked) > MAX_BREAKPOINTS:
        found.append(
            f"A maximum of 4 blocks with cache_control may be provided. Found {len(marked)}."
        )
    for block in marked:
        if block.get("type") in ("thinking", "redacted_thinking"):
            found.append("thinking blocks cannot carry cache_control")
    return found
