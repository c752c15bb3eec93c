"""Pins: text a client marks as one that must survive compaction (`X-Compaction-Pin`,
`compaction.pin`; DESIGN.md §14). What a pin matches in the messages a plan cuts is kept verbatim
beside the summary or marker that stands for them, bounded, in a deterministic order (by position,
then by pin), so the stand-in stays cache-stable.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from inflight.compaction.facts import message_text

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


# A regex pin runs in the event loop, under Python's backtracking engine, on text whose size the
# client chooses: only shapes whose work per position is bounded are accepted — every repeat
# bounded (`{m,n}`, no `+`, `*` or `{m,}`), none inside another, no group or alternation under
# a repeat, no backreference or lookaround — and the product of their bounds (the steps one
# position can take) is at most WORK_PER_POSITION over all of a request's pins together, on at
# most SCANNED_CHARS of the cut: the worst request costs about their product, tens of ms.
WORK_PER_POSITION = 1024
SCANNED_CHARS = 32 * 1024
_UNSAFE = frozenset({"GROUPREF", "GROUPREF_EXISTS", "ASSERT", "ASSERT_NOT"})
_REPEATS = frozenset({"MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"})


class _Unsafe(Exception):
    """Why a pattern's work per position is not bounded."""


def work_per_position(pattern: str) -> int:
    """The steps one start position of `pattern` can take, at most; `_Unsafe` when unbounded."""
    parser: Any = importlib.import_module("re._parser")
    return _work(parser.parse(pattern), under_repeat=False)


def _work(items: Any, under_repeat: bool) -> int:
    work = 1
    for op, arg in items:
        name = str(op)
        if name in _UNSAFE:
            raise _Unsafe("backreferences and lookarounds are not allowed")
        if name in _REPEATS:
            _, high, body = arg
            if under_repeat:
                raise _Unsafe("a repeat inside a repeat")
            if high > MAX_PIN_CHARS:
                raise _Unsafe("+, * and {m,} are not allowed: bound every repeat ({m,n})")
            if any(str(o) in ("BRANCH", "SUBPATTERN") for o, _ in body):
                raise _Unsafe("a group or alternation under a repeat")
            work *= (high + 1) * _work(body, under_repeat=True)
        elif name == "SUBPATTERN":
            work *= _work(arg[-1], under_repeat)
        elif name == "BRANCH":
            work *= sum(_work(branch, under_repeat) for branch in arg[1])
    return work


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
        try:
            work = work_per_position(text[3:])
        except _Unsafe as exc:
            raise BadPin(f"pin {text!r} could take too long on a large text: {exc}") from exc
        if work > WORK_PER_POSITION:
            raise BadPin(
                f"pin {text!r} could take too long on a large text: its repeats' bounds "
                f"multiply to {work}, over {WORK_PER_POSITION}"
            )
        return Pin(text, pattern)
    return Pin(text, re.compile(re.escape(text)))


def parse_pins(value: Any) -> tuple[Pin, ...]:
    """Pins from a header value (comma list) or a body value (a string, or an array of
    strings: one pin each). `BadPin` on anything else.

    Syntax: a comma list (a comma inside brackets or braces is part of its pin; a body array: one
    pin per item); an item `re:PATTERN` is a regular expression of a shape whose work per position
    is bounded (see `WORK_PER_POSITION`), anything else a literal string. At most `MAX_PINS` pins of
    `MAX_PIN_CHARS` each.
    """
    if isinstance(value, str):
        items = [v for v in _split(value) if v.strip()]
    elif isinstance(value, list) and all(isinstance(v, str) for v in value):
        items = value
    else:
        raise BadPin("pins must be a comma list or an array of strings")
    if len(items) > MAX_PINS:
        raise BadPin(f"at most {MAX_PINS} pins")
    pins = tuple(dict.fromkeys(parse_pin(v) for v in items))
    work = sum(work_per_position(p.source[3:]) for p in pins if p.source.startswith("re:"))
    if work > WORK_PER_POSITION:
        raise BadPin(
            f"the regex pins' repeats multiply to {work} steps a position together, "
            f"over {WORK_PER_POSITION}"
        )
    return pins


def _split(value: str) -> list[str]:
    """A comma list, where a comma inside brackets or braces (`\\d{1,8}`, `[,;]`) or escaped
    belongs to its pin."""
    items, depth, start, escaped = [], 0, 0, False
    for i, char in enumerate(value):
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth = max(0, depth - 1)
        elif char == "," and depth == 0:
            items.append(value[start:i])
            start = i + 1
    items.append(value[start:])
    return items


def pin_tokens(goal: int) -> int:
    """Tokens reserved for the pinned text beside a stand-in: 1/16 of the target, 32–256."""
    return max(32, min(256, goal // 16))


def pinned_matches(
    messages: Sequence[Mapping[str, Any]], positions: Sequence[int], pins: Sequence[Pin]
) -> list[str]:
    """What the pins match in the messages at `positions`, in order (by position, then pin,
    then place), each once, each at most `MAX_PIN_CHARS`."""
    found: dict[str, None] = {}
    budget = SCANNED_CHARS
    for position in positions:
        text = message_text(messages[position])[:budget]
        budget -= len(text)
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
