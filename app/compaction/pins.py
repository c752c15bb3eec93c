"""Pins: text a client marks as one that must survive compaction (`X-Compaction-Pin`,
`compaction.pin`; DESIGN.md §14). What a pin matches in the messages a plan cuts is kept
verbatim beside the summary or marker that stands for them, bounded, in a deterministic order
(by position, then by pin), so the stand-in stays cache-stable.

Syntax: a comma list (a body array: one pin per item); an item `re:PATTERN` is a regular
expression, anything else a literal string. At most `MAX_PINS` pins of `MAX_PIN_CHARS` each.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.compaction.facts import message_text

MAX_PINS = 16
MAX_PIN_CHARS = 200  # a pin's own length, and a match's
PINNED_HEADING = "Pinned (kept verbatim from the cut messages):"


class BadPin(ValueError):
    """A pin the client sent cannot be used (the message says why)."""


@dataclass(frozen=True, slots=True)
class Pin:
    """One pin: a literal string, or a compiled regular expression."""

    source: str  # as the client wrote it (`re:` and all)
    pattern: re.Pattern[str]


def parse_pin(item: str) -> Pin:
    """One pin from its text; `BadPin` when it is empty, too long, or a bad regex."""
    text = item.strip()
    if not text:
        raise BadPin("a pin is empty")
    if len(text) > MAX_PIN_CHARS:
        raise BadPin(f"a pin is longer than {MAX_PIN_CHARS} characters")
    if text.startswith("re:"):
        try:
            pattern = re.compile(text[3:])
        except re.error as exc:
            raise BadPin(f"pin {text!r} is not a valid regular expression: {exc}") from exc
        if pattern.fullmatch(""):
            raise BadPin(f"pin {text!r} matches the empty string")
        return Pin(text, pattern)
    return Pin(text, re.compile(re.escape(text)))


def parse_pins(value: Any) -> tuple[Pin, ...]:
    """Pins from a header value (comma list) or a body value (a string, or an array of
    strings: one pin each). `BadPin` on anything else."""
    if isinstance(value, str):
        items = [v for v in value.split(",") if v.strip()]
    elif isinstance(value, list) and all(isinstance(v, str) for v in value):
        items = value
    else:
        raise BadPin("pins must be a comma list or an array of strings")
    if len(items) > MAX_PINS:
        raise BadPin(f"at most {MAX_PINS} pins")
    return tuple(dict.fromkeys(parse_pin(v) for v in items))


def pin_tokens(goal: int) -> int:
    """Tokens reserved for the pinned text beside a stand-in: 1/16 of the target, 32–256."""
    return max(32, min(256, goal // 16))


def pinned_matches(
    messages: Sequence[Mapping[str, Any]], positions: Sequence[int], pins: Sequence[Pin]
) -> list[str]:
    """What the pins match in the messages at `positions`, in order (by position, then pin,
    then place), each once, each at most `MAX_PIN_CHARS`."""
    found: dict[str, None] = {}
    for position in positions:
        text = message_text(messages[position])
        for pin in pins:
            for match in pin.pattern.finditer(text):
                if match.group(0):
                    found.setdefault(match.group(0)[:MAX_PIN_CHARS], None)
    return list(found)


def pinned_text(
    messages: Sequence[Mapping[str, Any]],
    positions: Sequence[int],
    pins: Sequence[Pin],
    max_tokens: int,
    count: Callable[[str], int],
) -> str:
    """The pinned block for the cut messages at `positions`: their matches one a line under
    `PINNED_HEADING`, in order, as many as fit `max_tokens`; empty when none matched."""
    lines: list[str] = []
    used = count(PINNED_HEADING)
    for match in pinned_matches(messages, positions, pins):
        line = f"- {match}"
        size = count(line) + 1
        if used + size > max_tokens:
            break  # in order: what fits first is kept, so the block never reorders
        lines.append(line)
        used += size
    return "\n".join([PINNED_HEADING, *lines]) if lines else ""
