"""The transcript replays again as Anthropic Messages requests, beside the chat figures.

Each transcript becomes a Messages body in Claude Code's shape (`tests/anthropic_conversations`:
calls as `tool_use`, results as `tool_result` blocks of the next user message, a breakpoint on
the system prompt and on the last user message), and every request point is compacted through
the Messages adapter with `auto` (truncate, prune, trim) and rendered back. Prefix reuse =
tokens of the previous forwarded `messages`' prefix that the next one repeats message for
message (breakpoints aside: Claude Code moves its own every turn), over the next one's tokens —
what Anthropic's prompt cache can read; an event is a request that does not extend the previous
one; a broken request lost its last message, breaks Anthropic's rules (alternation, pairing, at
most 4 breakpoints), has more breakpoints than it was sent with, or does not fit.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson

from bench.compaction import inflight_auto, replay
from inflight.apis.anthropic.format import MessagesFormat
from inflight.cli.simulate import common_prefix
from inflight.compaction.engine import compact
from inflight.compaction.policy import Budget
from inflight.tokens.counter import ChatTokenCounter
from inflight.tokens.encodings import load_encodings
from tests.support import load_traces, request_points
from tests.support.anthropic_conversations import from_chat
from tests.support.fakes.anthropic import all_blocks, content_blocks, rule_violations

Count = Callable[[Mapping[str, Any]], int]
PIPELINE = ("truncate", "prune", "trim")
FORMAT = MessagesFormat()


def _forward(body: dict[str, Any], budget: Budget, count: Count) -> dict[str, Any]:
    conversation = FORMAT.conversation(body)
    fixed = count({"role": "system", "content": body.get("system")})  # as chat's system message
    result = compact(conversation.messages, PIPELINE, budget, count, fixed)
    if not result.plan.changed:
        return body
    return FORMAT.render(body, conversation, result.messages, result.sources)


def _tokens(body: Mapping[str, Any], messages: Sequence[Mapping[str, Any]], count: Count) -> int:
    """Tokens of the system prompt and `messages` as the counter sees them through the
    adapter's view (the system prompt counted as chat counts its system message)."""
    view = FORMAT.conversation({"messages": list(messages)}).messages
    system = {"role": "system", "content": body.get("system")}
    return count(system) + sum(count(m) for m in view)


def _breakpoints(body: Mapping[str, Any]) -> int:
    return sum(1 for b in all_blocks(body) if isinstance(b, Mapping) and b.get("cache_control"))


def _types(message: Mapping[str, Any]) -> list[Any]:
    return [message.get("role"), *(b.get("type") for b in content_blocks(message))]


def _unmarked(message: Mapping[str, Any]) -> bytes:
    blocks = [{k: v for k, v in b.items() if k != "cache_control"} for b in content_blocks(message)]
    return orjson.dumps({**message, "content": blocks})


def replay_messages(
    chat: Sequence[Mapping[str, Any]], budget: Budget, count: Count
) -> tuple[float, int, int, int]:
    """(mean prefix reuse, events, broken requests, requests) over one transcript as Messages."""
    previous: list[bytes] | None = None
    shares: list[float] = []
    events = failures = 0
    points = request_points(chat)
    for k in points:
        body = from_chat(chat[:k])
        out = _forward(body, budget, count)
        messages = out["messages"]
        tokens = _tokens(out, messages, count)
        lost = _types(messages[-1]) != _types(body["messages"][-1])  # (truncated is fine)
        added = _breakpoints(out) > _breakpoints(body)
        failures += lost or added or bool(rule_violations(out)) or tokens > budget.budget
        now = [_unmarked(m) for m in messages]
        if previous is not None:
            same = common_prefix(previous, now)
            events += same < len(previous)
            shares.append(_tokens(out, messages[:same], count) / max(1, tokens))
        previous = now
    return (statistics.mean(shares) if shares else 1.0), events, failures, len(points)


def prefix_reuse_report(windows: Sequence[int] = (8192, 16384, 32768)) -> str:
    """Chat completions and Messages side by side, per transcript and window."""
    counter = ChatTokenCounter(load_encodings())

    def count(message: Mapping[str, Any]) -> int:
        return counter.count_message("gpt-4o", message)

    lines = ["| transcript | window | chat completions | Messages API |", "|---|---:|---|---|"]
    chat_shares: list[float] = []
    message_shares: list[float] = []
    for name, chat in load_traces():
        for window in windows:
            budget = Budget(window, 1024, 0.8, 0.5)
            c_reuse, c_events, c_bad, _ = replay(
                chat, inflight_auto(budget, count), count, budget.budget
            )
            m_reuse, m_events, m_bad, n = replay_messages(chat, budget, count)
            chat_shares.append(c_reuse)
            message_shares.append(m_reuse)
            lines.append(
                f"| {name[:32]} | {window // 1024}k | {c_reuse:.0%} · {c_events} ev · {c_bad} bad"
                f" | {m_reuse:.0%} · {m_events} ev · {m_bad} bad ({n} requests) |"
            )
    lines.append(
        f"| **mean prefix reuse** | | **{statistics.mean(chat_shares):.0%}** "
        f"| **{statistics.mean(message_shares):.0%}** |"
    )
    legend = (
        "Each cell: mean prefix reuse · compaction events · broken requests. The Messages "
        "column replays the same transcripts as Claude Code would send them (results as "
        "`tool_result` blocks, breakpoints on the system prompt and the last user message); "
        "broken counts Anthropic's rules and breakpoints added. `auto` without a summarizer; "
        "windows with a 1,024-token output reserve; threshold 0.8, target 0.5; o200k counts "
        "(the same counter on both sides, so the columns compare the adapters, not tokenizers)."
        "\n\n"
    )
    return legend + "\n".join(lines)
