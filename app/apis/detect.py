"""Which wire format a `/v1/compaction/*` body is in (DESIGN.md §8): the `X-Compaction-Format`
header says so; without it, `input` means Responses, and an `anthropic-version` header, a
top-level `system` or Anthropic content blocks mean Messages; anything else is chat."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, get_args

from inflight.compaction.wire import ApiName
from inflight.errors import InvalidControl

FORMAT_HEADER = "X-Compaction-Format"
ANTHROPIC_BLOCKS = frozenset({"tool_use", "tool_result", "thinking", "redacted_thinking"})
NAMES: tuple[ApiName, ...] = get_args(ApiName)


def _has_anthropic_blocks(messages: Any) -> bool:
    for message in messages if isinstance(messages, list) else []:
        content = message.get("content") if isinstance(message, dict) else None
        for block in content if isinstance(content, list) else []:
            kind = block.get("type") if isinstance(block, dict) else None
            if isinstance(kind, str) and kind in ANTHROPIC_BLOCKS:  # a list or dict: unhashable
                return True
    return False


def detect_api(headers: Mapping[str, str], body: Mapping[str, Any]) -> ApiName:
    """The API `body` speaks; a 400 naming the header when it names none of them."""
    lowered = {k.lower(): v for k, v in headers.items()}
    named = lowered.get(FORMAT_HEADER.lower())
    if named is not None:
        for name in NAMES:
            if named.strip().lower() == name:
                return name
        raise InvalidControl(
            f"{FORMAT_HEADER} must be one of {', '.join(NAMES)}, not {named!r}",
            param=FORMAT_HEADER,
        )
    if "input" in body:
        return "responses"
    if "anthropic-version" in lowered or "system" in body:
        return "messages"
    return "messages" if _has_anthropic_blocks(body.get("messages")) else "chat"
