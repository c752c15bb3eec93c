"""`truncate`: long texts shrunk in place to head and tail, with a byte-stable marker."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

import orjson

from inflight.compaction.prune import answered_calls, tool_names
from inflight.compaction.refs import REF_LENGTH, ref_for, ref_suffix

MARKER = "\n\n[… inflight truncated {cut} chars {ref}]\n\n"
_MARKER_RE = re.compile(
    rf"\n\n\[… inflight truncated ([1-9][0-9]*) chars \(ref: [0-9a-f]{{{REF_LENGTH}}}\)\]\n\n"
)
_MARKER_BASE = len(MARKER.format(cut="", ref=ref_suffix("0" * REF_LENGTH)))  # without the digits
_MARKER_START = MARKER.partition("{")[0]
_MARKER_JSON = orjson.dumps(_MARKER_START.strip())[1:-1]  # as it reads in a message's JSON
_MARKER_REF_JSON = re.compile(  # a whole marker in a message's JSON; the group is its ref
    re.escape(_MARKER_JSON) + rb" [1-9][0-9]* chars \(ref: ([0-9a-f]{%d})\)\]" % REF_LENGTH
)
_MAX_DIGITS = 20
_JSON_DEPTH = 32  # JSON arguments nested deeper are cut as plain text
MIN_CAP_CHARS = 2_000
CHARS_PER_TOKEN = 4

TextMap = Callable[[str], str]


def cap_chars(budget_tokens: int) -> int:
    """The text a unit keeps whole: a tenth of the budget, at least 2,000 chars."""
    return max(MIN_CAP_CHARS, budget_tokens // 10 * CHARS_PER_TOKEN)


def kept_length(text: str) -> int | None:
    """How much of the original a text the proxy cut still holds; None when it was not cut.

    A cut keeps `k` chars and puts the marker at `k * 2 // 3`, so the marker's position and the
    text's length must agree, and the count in the marker must exceed twice the marker's own
    length (a cut is only made when it saves at least that).
    """
    lowest = (len(text) - _MARKER_BASE - _MAX_DIGITS) * 2 // 3
    highest = (len(text) - _MARKER_BASE - 1) * 2 // 3
    if highest < 0 or text.find(_MARKER_START, max(0, lowest), highest + len(_MARKER_START)) < 0:
        return None  # the common case, decided by one scan of a few chars
    for digits in range(1, _MAX_DIGITS + 1):
        size = _MARKER_BASE + digits
        kept = len(text) - size
        if kept < 0:
            return None
        at = kept * 2 // 3
        found = _MARKER_RE.fullmatch(text, at, at + size)
        if found is not None and int(found.group(1)) > 2 * size:
            return kept
    return None


def unshared_markers(
    messages: Sequence[Mapping[str, Any]], others: Sequence[Mapping[str, Any]]
) -> int:
    """How many cut markers two renderings of the same messages do not share, told apart by
    their refs (with multiplicity): those whose ref tokens can make one rendering cost more or
    less than the other from one position to the next. A marker both carry — a text cut alike
    in both, or cut before and kept — counts the same in both wherever the unit stands, so a
    unit truncated further is judged alike before and after its first cut (invariant 5)."""
    unshared = 0
    for one, other in zip(messages, others, strict=True):
        if one is not other:
            mine = Counter(_MARKER_REF_JSON.findall(orjson.dumps(one)))
            theirs = Counter(_MARKER_REF_JSON.findall(orjson.dumps(other)))
            unshared += (mine - theirs).total() + (theirs - mine).total()
    return unshared


def cut_text(text: str, keep: int, ref: str) -> str:
    """`text` cut to `keep` chars of head and tail around a marker naming `ref`; the same
    object when it fits, when the proxy already cut it, or when the cut would not remove more
    than twice the marker's length (so a cut always saves, even counted in JSON bytes or
    tokens)."""
    cut = len(text) - keep
    marker = MARKER.format(cut=cut, ref=ref_suffix(ref))
    if cut <= 2 * len(marker) or kept_length(text) is not None:
        return text
    head = keep * 2 // 3
    return text[:head] + marker + text[head + cut :]


def shares(texts: Sequence[str], cap: int) -> list[int]:
    """How many chars each text may keep so that together they keep at most `cap`.

    Texts already cut keep what they hold; the others share the rest, short ones whole and long
    ones an equal share of what the short ones leave.
    """
    kept = [kept_length(t) for t in texts]
    allowed = [len(t) for t in texts]
    left = max(0, cap - sum(k for k in kept if k is not None))
    open_ = sorted((k for k in range(len(texts)) if kept[k] is None), key=allowed.__getitem__)
    for rank, index in enumerate(open_):
        allowed[index] = min(allowed[index], left // (len(open_) - rank))
        left -= allowed[index]
    return allowed


def _map_content(content: Any, fn: TextMap) -> Any:
    """`content` (a string or a list of parts) with each text mapped; the same object when no
    text changed."""
    if isinstance(content, str):
        return fn(content)
    if not isinstance(content, list):
        return content
    parts: list[Any] = []
    changed = False
    for part in content:
        if isinstance(part, dict) and isinstance(part.get("text"), str):
            text = fn(part["text"])
            if text is not part["text"]:
                changed = True
                part = {**part, "text": text}
        parts.append(part)
    return parts if changed else content


def _nests_within(value: Any, limit: int) -> bool:
    """Whether JSON `value` nests no more than `limit` containers deep (checked without
    recursion: arguments are client data)."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth >= limit:
                return False
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return True


def _map_json(value: Any, fn: TextMap) -> Any:
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, list):
        items = [_map_json(v, fn) for v in value]
        return items if any(a is not b for a, b in zip(items, value, strict=True)) else value
    if isinstance(value, dict):
        mapped = {k: _map_json(v, fn) for k, v in value.items()}
        return mapped if any(mapped[k] is not v for k, v in value.items()) else value
    return value


def _map_arguments(arguments: Any, fn: TextMap) -> Any:
    """Call arguments with their texts mapped: the string values of JSON arguments (re-encoded
    only when one changed), else the whole string."""
    if not isinstance(arguments, str):
        return arguments
    try:
        parsed = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return fn(arguments)
    if not _nests_within(parsed, _JSON_DEPTH):
        return fn(arguments)
    mapped = _map_json(parsed, fn)
    return arguments if mapped is parsed else orjson.dumps(mapped).decode()


def _map_call(call: Any, fn: TextMap) -> Any:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or "arguments" not in function:
        return call
    arguments = _map_arguments(function["arguments"], fn)
    if arguments is function["arguments"]:
        return call
    return {**call, "function": {**function, "arguments": arguments}}


def _map_assistant(message: Mapping[str, Any], answered: set[int], fn: TextMap) -> dict[str, Any]:
    """The assistant message's text and its answered calls' arguments, mapped (a new dict)."""
    out = dict(message)
    if "content" in message:
        out["content"] = _map_content(message["content"], fn)
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        out["tool_calls"] = [
            _map_call(call, fn) if k in answered else call for k, call in enumerate(calls)
        ]
        if all(a is b for a, b in zip(out["tool_calls"], calls, strict=True)):
            out["tool_calls"] = calls
    legacy = message.get("function_call")
    if isinstance(legacy, dict) and "arguments" in legacy and answered:
        arguments = _map_arguments(legacy["arguments"], fn)
        if arguments is not legacy["arguments"]:
            out["function_call"] = {**legacy, "arguments": arguments}
    return out


def _map_message(
    message: Mapping[str, Any], deep: bool, answered: set[int], fn: TextMap
) -> Mapping[str, Any]:
    """The message with every text truncation may reach mapped by `fn`, in a fixed order; the
    same object when nothing changed."""
    role = message.get("role")
    if role in ("tool", "function"):
        content = message.get("content")
        mapped = _map_content(content, fn)
        return message if mapped is content else {**message, "content": mapped}
    if role != "assistant" or not deep:
        return message
    out = _map_assistant(message, answered, fn)
    return message if all(out[k] is message[k] for k in message) else out


def _answered(unit: Sequence[Mapping[str, Any]]) -> set[int]:
    """Indices of the first message's calls that the unit answers (legacy `function_call`: 0)."""
    if len(unit) < 2 or unit[0].get("role") != "assistant":
        return set()
    if isinstance(unit[0].get("tool_calls"), list):
        return {k for k in answered_calls(unit) if k is not None}
    return {0} if unit[1].get("role") == "function" else set()


def text_part(index: int, texts: int) -> str:
    """The ref `part` of a message's `index`-th text a cut can reach, of `texts`: empty when
    it is the only one (a tool output), else `text<index>` in a fixed order (content parts,
    then the answered calls' arguments, string values of JSON arguments one by one)."""
    return "" if texts == 1 else f"text{index}"


def _protected(unit: Sequence[Mapping[str, Any]], protect: AbstractSet[str]) -> set[int]:
    """Offsets in the unit of the outputs of protected tools."""
    if not protect or len(unit) < 2 or unit[0].get("role") != "assistant":
        return set()
    return {k + 1 for k, name in enumerate(tool_names(unit)) if name in protect}


def unit_texts(
    unit: Sequence[Mapping[str, Any]],
    *,
    deep: bool = False,
    start: int = 0,
    protect: AbstractSet[str] = frozenset(),
) -> list[tuple[int, str, str]]:
    """Every text truncation may reach in the unit (whose first message is at `start` in the
    history), in order: (its message's position, its ref part, the text)."""
    answered = _answered(unit) if deep else set()
    skip = _protected(unit, protect)
    found: list[str] = []

    def collect(text: str) -> str:
        found.append(text)
        return text

    out: list[tuple[int, str, str]] = []
    for offset, message in enumerate(unit):
        if offset in skip:
            continue
        found.clear()
        _map_message(message, deep, answered, collect)
        out.extend((start + offset, text_part(k, len(found)), t) for k, t in enumerate(found))
    return out


def truncate_unit(
    unit: Sequence[Mapping[str, Any]],
    cap: int,
    *,
    deep: bool = False,
    start: int = 0,
    protect: AbstractSet[str] = frozenset(),
) -> list[Mapping[str, Any]]:
    """The unit's messages with their tool outputs (and, `deep`, assistant text and answered
    call arguments) cut to share `cap` chars; `start` is the position of the unit's first
    message in the history (for the markers' refs), and outputs of `protect`ed tools are left
    whole. Unchanged messages are the same objects.

    One cap covers a unit as a whole: all its tool outputs (parallel outputs, many text parts) share
    it, the short ones kept whole and the long ones cut to equal shares of the rest. A unit that no
    cut can remove (the last unit; in a strict chat also the assistant message right before the last
    user message) and that still does not fit is truncated *deeply*, as a last resort: its assistant
    text and the arguments of its calls that were already answered share the cap too. Arguments that
    are JSON are cut inside their string values, so they stay valid JSON.

    Idempotent: a text the proxy cut carries the marker exactly where a cut puts it (`kept_length`)
    and is never cut again; the same marker text anywhere else is ordinary content, cut like any
    other. Each marker ends with the ref of the text it cut (DESIGN.md §11; app/compaction/refs.py):
    the message's position in the client's history and, when the message holds several texts a cut
    can reach, which one (`text_part`), so `inflight_restore` can hand the original back. Tool
    outputs of protected tools (§11) are never cut, except in the last unit.
    """
    found = unit_texts(unit, deep=deep, start=start, protect=protect)
    texts = [t for _, _, t in found]
    allowed = shares(texts, cap)
    if all(len(t) <= a for t, a in zip(texts, allowed, strict=True)):
        return list(unit)
    cuts = [
        cut_text(t, a, ref_for(position, t, part)) if len(t) > a else t
        for (position, part, t), a in zip(found, allowed, strict=True)
    ]
    answered = _answered(unit) if deep else set()
    skip = _protected(unit, protect)
    pending = iter(cuts)

    def cut(text: str) -> str:
        # The texts were collected from a parse of their own: one not cut is returned as the
        # object this pass holds, so an untouched message (or call) stays the same object.
        done = next(pending)
        return text if done == text else done

    return [m if k in skip else _map_message(m, deep, answered, cut) for k, m in enumerate(unit)]
