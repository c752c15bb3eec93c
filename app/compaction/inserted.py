"""The messages the engine inserts where it cut — a summary, a span marker with or without a
pinned block, the note that holds a summary's place — and how one is recognised when a compacted
request comes back (DESIGN.md §4.5: compacting it again must change nothing)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from inflight.compaction.pins import PINNED_HEADING
from inflight.compaction.refs import REF_PATTERN

SUMMARY_PREFIX = "[Summary of the earlier conversation, written by inflight to fit the context]\n\n"
SPAN_MARKER = (
    "[inflight removed {count} earlier messages to fit the context window; "
    "call inflight_restore to read them {ref}]"
)
_SPAN_MARKER_RE = re.compile(
    r"\[inflight removed \d+ earlier messages to fit the context window; "
    r"call inflight_restore to read them \(ref: " + REF_PATTERN + r"\)\]"
)
OMITTED_NOTE = "[inflight: earlier turns of this conversation were left out to fit the context]"
_TURNS = ("user", "assistant")
_TEXT_PARTS = ("text", "input_text", "output_text")


def _calls(message: Mapping[str, Any]) -> bool:
    return bool(message.get("tool_calls") or message.get("function_call"))


def _text(content: Any) -> str | None:
    """The text of a message's content: a string, or a list of text parts only (as a wire
    format renders the inserted string back) joined; None for anything else."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not content:
        return None
    texts = [p.get("text") if isinstance(p, Mapping) else None for p in content]
    if not all(isinstance(t, str) for t in texts):
        return None
    return "".join(t for t in texts if isinstance(t, str))


def _plain_text(part: Any) -> str | None:
    """The text of a content part that holds nothing else (`text` in chat and Anthropic's
    form, `input_text` or `output_text` in the Responses API's)."""
    if not isinstance(part, Mapping) or set(part) != {"type", "text"}:
        return None
    text = part["text"]
    return text if part["type"] in _TEXT_PARTS and isinstance(text, str) else None


def _stand_in_text(text: str) -> bool:
    """Whether `text` is what the engine writes in place of a cut span: a summary (it starts
    with `SUMMARY_PREFIX`), a pinned block (then maybe a span marker), a span marker alone, or
    the note holding a summary's place."""
    return (
        text.startswith((SUMMARY_PREFIX, PINNED_HEADING + "\n"))
        or text == OMITTED_NOTE
        or _SPAN_MARKER_RE.fullmatch(text) is not None
    )


def is_inserted(message: Mapping[str, Any]) -> bool:
    """Whether `message` is one the engine inserted in place of a cut span: a plain user or
    assistant message whose text stands in for it."""
    if message.get("role") not in _TURNS or _calls(message):
        return False
    text = _text(message.get("content"))
    return text is not None and _stand_in_text(text)


def unfolded(message: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The head's user `message` without what the engine folded into it in place of a cut span
    (its last part, a text that stands in for the span: DESIGN.md §4.6), its own content a
    string again when one plain text part is left; None when nothing was folded into it."""
    content = message.get("content")
    if not isinstance(content, list) or not content:
        return None
    *rest, last = content
    text = last.get("text") if isinstance(last, Mapping) else None
    if not isinstance(text, str) or last.get("type") not in _TEXT_PARTS:
        return None
    if not _stand_in_text(text):
        return None
    own = _plain_text(rest[0]) if len(rest) == 1 else None  # a string made a list of parts
    return {**message, "content": rest if own is None else own}
