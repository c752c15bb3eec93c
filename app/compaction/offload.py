"""Where counting and planning run: inline for small requests, in a worker thread for large
ones, so that no request's CPU time stalls the event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from inflight.compaction.engine import CompactionResult, untouched
from inflight.compaction.replays import ReplayCache
from inflight.jsontext import HistoryTexts

# Planning bigger than this runs in a worker thread, so it never holds up the event loop.
OFFLOAD_MESSAGES = 256
OFFLOAD_CHARS = 256 * 1024
# A request whose history a remembered replay covers (but a little) is planned inline up to
# this many messages: see `is_heavy`.
INLINE_COVERED_MESSAGES = 1024
T = TypeVar("T")


def _chars(message: Mapping[str, Any]) -> int:
    """Roughly how much text a message holds (content, text parts, call arguments)."""
    content = message.get("content")
    size = len(content) if isinstance(content, str) else 0
    for part in content if isinstance(content, list) else []:
        if isinstance(part, dict) and isinstance(part.get("text"), str):
            size += len(part["text"])
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else []:
        function = call.get("function") if isinstance(call, dict) else None
        arguments = function.get("arguments") if isinstance(function, dict) else None
        size += len(arguments) if isinstance(arguments, str) else 0
    return size


def is_large(messages: Sequence[Mapping[str, Any]], texts: HistoryTexts) -> bool:
    """Whether counting and planning these messages may take long enough to hold up other
    requests: many messages, or much text."""
    if len(messages) > OFFLOAD_MESSAGES:
        return True
    text = texts.messages_text(messages)  # never shorter than the text in it: settles most
    if text is not None and len(text) <= OFFLOAD_CHARS:
        return False
    return sum(_chars(m) for m in messages if isinstance(m, Mapping)) > OFFLOAD_CHARS


def is_heavy(
    messages: Sequence[Mapping[str, Any]], replays: ReplayCache[Any] | None, texts: HistoryTexts
) -> bool:
    """Whether a request's counting, planning and rendering may hold up the event loop: a
    large history (`is_large`), unless a replay remembered in `replays` covers all of it but a
    little (a conversation's next request counts, replays and renders only what it adds) and it
    is not huge (an event prices every unit since the last one). A hop to a worker thread
    costs more than such a request's work."""
    if not is_large(messages, texts):
        return False
    text = texts.messages_text(messages)
    if replays is None or text is None or len(messages) > INLINE_COVERED_MESSAGES:
        return True
    return not replays.covers(text, OFFLOAD_CHARS // 4)


async def offload(
    messages: Sequence[Mapping[str, Any]], work: Callable[[], T], texts: HistoryTexts
) -> T:
    """Run counting and planning for `messages`: in a worker thread when they are large (the
    pure core and the counter are thread-safe), so that no request's CPU time stalls the event
    loop — other requests and `/healthz` go on being served meanwhile."""
    return await run_off(is_large(messages, texts), work)


async def run_off(large: bool, work: Callable[[], T]) -> T:
    """Run `work` in a worker thread when it is `large` (see `is_large`), else inline."""
    if large:
        return await asyncio.to_thread(work)
    return work()


def as_received(messages: Sequence[Mapping[str, Any]]) -> CompactionResult:
    """The result that forwards `messages` untouched, for when compaction cannot run at all
    (token counts unknown: reported as 0)."""
    return untouched(messages, 0)
