"""Summaries through the upstream: the prompt, the transcript as data, chunking, validation.

Any failure raises `SummaryFailed`; the caller falls back to `trim`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

MARKER = "\n---\n"
TOOL_OUTPUT_CHARS = 2_000


class SummaryFailed(Exception):
    """The summariser could not produce a usable summary (status, timeout, empty, too long)."""


@dataclass(frozen=True, slots=True)
class SummaryPrompt:
    """The template from `config/summary_prompt.md`; `version` is a hash of its text."""

    template: str
    version: str

    @classmethod
    def load(cls, path: Path) -> SummaryPrompt:
        text = path.read_text(encoding="utf-8")
        _, sep, template = text.partition(MARKER)
        template = template if sep else text
        for slot in ("{transcript}", "{previous_summary}"):
            if slot not in template:
                raise ValueError(f"{path}: the summary prompt must contain {slot}")
        return cls(template.strip(), hashlib.sha256(template.encode()).hexdigest()[:12])

    def render(self, transcript: str, previous: str | None) -> str:
        prior = (
            "The summary of the conversation before this transcript follows; update it with "
            "the transcript and return the complete new summary.\n<previous_summary>\n"
            f"{previous}\n</previous_summary>"
            if previous
            else ""
        )
        return self.template.replace("{previous_summary}", prior).replace(
            "{transcript}", transcript
        )


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict):
                if isinstance(part.get("text"), str):
                    parts.append(part["text"])
                elif part.get("type") in ("image_url", "input_image", "image"):
                    parts.append("[image]")
        return "\n".join(parts)
    return "" if content is None else str(content)


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[… {len(text) - 2 * half} chars omitted …]\n{text[-half:]}"


def render_message(message: Mapping[str, Any]) -> str:
    """One message as transcript text: role, content, tool calls; images and bulk removed."""
    role = str(message.get("role", "?"))
    text = _text_of(message.get("content"))
    if role in ("tool", "function"):
        text = _cut(text, TOOL_OUTPUT_CHARS)
    lines = [f"[{role}{' ' + str(message['name']) if message.get('name') else ''}]"]
    if text:
        lines.append(text)
    for call in message.get("tool_calls") or []:
        if isinstance(call, dict) and isinstance(call.get("function"), dict):
            fn = call["function"]
            lines.append(f"→ {fn.get('name')}({_cut(str(fn.get('arguments', '')), 1_000)})")
    legacy = message.get("function_call")
    if isinstance(legacy, dict):
        lines.append(f"→ {legacy.get('name')}({_cut(str(legacy.get('arguments', '')), 1_000)})")
    return "\n".join(lines)


def chunk_transcript(
    messages: Sequence[Mapping[str, Any]], count: Callable[[str], int], budget: int
) -> list[str]:
    """Rendered messages grouped into chunks of at most `budget` tokens each.

    A summary request must always fit the summariser's own window, so the transcript is rendered
    without images, long tool outputs are cut to head and tail, and a span larger than the window is
    summarised in chunks, each chunk updating the summary of the ones before (the same rolling
    update a later compaction event uses).
    """
    chunks: list[str] = []
    current: list[str] = []
    used = 0
    for message in messages:
        text = render_message(message)
        size = count(text)
        if size > budget:
            text = _cut(text, max(200, len(text) * budget // (size + 1)))
            size = count(text)
        if current and used + size > budget:
            chunks.append("\n\n".join(current))
            current, used = [], 0
        current.append(text)
        used += size
    if current:
        chunks.append("\n\n".join(current))
    return chunks


@dataclass(frozen=True, slots=True)
class SummaryUsage:
    """Tokens spent by summary calls (reported in headers and usage records)."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    each: tuple[tuple[int, int], ...] = ()  # (prompt, completion) tokens of every call, in order

    def __add__(self, other: SummaryUsage) -> SummaryUsage:
        return SummaryUsage(
            self.calls + other.calls,
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            self.each + other.each,
        )


# Sends one non-streaming chat request upstream; returns (status, body bytes).
Completer = Callable[[dict[str, Any]], Awaitable[tuple[int, bytes]]]


def parse_summary(status: int, content: bytes, max_chars: int) -> tuple[str, SummaryUsage]:
    """The summary text from a chat completion, or `SummaryFailed` saying why."""
    if status >= 400:
        raise SummaryFailed(f"summariser answered HTTP {status}")
    try:
        data = orjson.loads(content)
        text = data["choices"][0]["message"]["content"]
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError) as exc:
        raise SummaryFailed("summariser answer is not a chat completion") from exc
    if not isinstance(text, str) or not text.strip():
        raise SummaryFailed("summariser returned an empty summary")
    if len(text) > max_chars:
        raise SummaryFailed(f"summariser returned {len(text)} chars, over the {max_chars} cap")
    usage = data.get("usage") if isinstance(data, dict) else None
    usage = usage if isinstance(usage, dict) else {}
    prompt, completion = (
        int(usage.get("prompt_tokens") or 0),
        int(usage.get("completion_tokens") or 0),
    )
    return text.strip(), SummaryUsage(1, prompt, completion, ((prompt, completion),))
