"""`truncate`: giant tool outputs shrunk in place to head and tail, with a byte-stable marker.

Idempotent: an output that carries the marker is never cut again.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

MARKER = "\n\n[… inflight truncated {cut} chars …]\n\n"
MARKER_RE = re.compile(r"\n\n\[… inflight truncated \d+ chars …\]\n\n")
MIN_CAP_CHARS = 2_000
CHARS_PER_TOKEN = 4


def cap_chars(budget_tokens: int) -> int:
    """The longest tool output kept whole: a tenth of the budget, at least 2,000 chars."""
    return max(MIN_CAP_CHARS, budget_tokens // 10 * CHARS_PER_TOKEN)


def _cut(text: str, cap: int) -> str:
    if len(text) <= cap or MARKER_RE.search(text):
        return text
    head = cap * 2 // 3
    tail = cap - head
    return text[:head] + MARKER.format(cut=len(text) - head - tail) + text[len(text) - tail :]


def truncate_message(message: Mapping[str, Any], cap: int) -> Mapping[str, Any]:
    """The message with its tool output cut to `cap` chars; the same object when unchanged."""
    if message.get("role") not in ("tool", "function"):
        return message
    content = message.get("content")
    if isinstance(content, str):
        cut = _cut(content, cap)
        return message if cut is content else {**message, "content": cut}
    if isinstance(content, list):
        parts: list[Any] = []
        changed = False
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                cut = _cut(part["text"], cap)
                if cut is not part["text"]:
                    changed = True
                    part = {**part, "text": cut}
            parts.append(part)
        return {**message, "content": parts} if changed else message
    return message
