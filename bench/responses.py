"""The transcript replays again as OpenAI Responses API requests, beside the chat figures.

Each transcript becomes `input` items (tool calls as `function_call` items after a `reasoning`
item, results as `function_call_output`, every other message typed with content parts), and every
request point is compacted through the Responses adapter with `auto` (truncate, prune, trim)
and rendered back to items. Prefix reuse = tokens of the previous forwarded `input`'s prefix
that the next one repeats item for item, over the next one's tokens; an event is a request
whose `input` does not extend the previous one; a broken request lost its last item, breaks
the Responses pairing rules, or does not fit.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from bench.compaction import inflight_auto, replay
from inflight.apis.responses.format import ResponsesFormat
from inflight.compaction.engine import compact
from inflight.compaction.policy import Budget
from inflight.tokens.counter import ChatTokenCounter
from inflight.tokens.encodings import load_encodings
from tests.support import load_traces
from tests.support.conversations import common_prefix
from tests.support.responses_items import pair_problems, request_body, request_points

Count = Callable[[Mapping[str, Any]], int]
PIPELINE = ("truncate", "prune", "trim")
FORMAT = ResponsesFormat()


def _forward(body: dict[str, Any], budget: Budget, count: Count) -> list[Mapping[str, Any]]:
    conversation = FORMAT.conversation(body)
    result = compact(conversation.messages, PIPELINE, budget, count, 0)
    if not result.applied:
        return list(body["input"])
    rendered = FORMAT.render(body, conversation, result.messages, result.sources)
    return list(rendered["input"])


def _tokens(items: Sequence[Mapping[str, Any]], count: Count) -> int:
    """Tokens of items as the counter sees them through the adapter's view."""
    view = FORMAT.conversation({"input": list(items)}).messages
    return sum(count(m) for m in view)


def replay_items(body: dict[str, Any], budget: Budget, count: Count) -> tuple[float, int, int, int]:
    """(mean prefix reuse, events, broken requests, requests) over one transcript as items."""
    items = body["input"]
    previous: list[Mapping[str, Any]] | None = None
    shares: list[float] = []
    events = failures = 0
    points = request_points(items)
    for k in points:
        out = _forward({**body, "input": items[:k]}, budget, count)
        tokens = _tokens(out, count)
        lost = not out or out[-1].get("type") != items[k - 1].get("type")
        failures += lost or bool(pair_problems(out)) or tokens > budget.budget
        if previous is not None:
            same = common_prefix(previous, out)
            events += same < len(previous)
            shares.append(_tokens(out[:same], count) / max(1, tokens))
        previous = out
    return (statistics.mean(shares) if shares else 1.0), events, failures, len(points)


def prefix_reuse_report(windows: Sequence[int] = (8192, 16384, 32768)) -> str:
    """Chat completions and Responses side by side, per transcript and window."""
    counter = ChatTokenCounter(load_encodings())

    def count(message: Mapping[str, Any]) -> int:
        return counter.count_message("gpt-4o", message)

    lines = [
        "| transcript | window | chat completions | Responses API |",
        "|---|---:|---|---|",
    ]
    chat: list[float] = []
    responses: list[float] = []
    for name, messages in load_traces():
        body = request_body(messages, instructions=False, reasoning=True, typed=2)
        for window in windows:
            budget = Budget(window, 1024, 0.8, 0.5)
            c_reuse, c_events, c_bad, _ = replay(
                messages, inflight_auto(budget, count), count, budget.budget
            )
            r_reuse, r_events, r_bad, n = replay_items(body, budget, count)
            chat.append(c_reuse)
            responses.append(r_reuse)
            lines.append(
                f"| {name[:32]} | {window // 1024}k | {c_reuse:.0%} · {c_events} ev · {c_bad} bad"
                f" | {r_reuse:.0%} · {r_events} ev · {r_bad} bad ({n} requests) |"
            )
    lines.append(
        f"| **mean prefix reuse** | | **{statistics.mean(chat):.0%}** "
        f"| **{statistics.mean(responses):.0%}** |"
    )
    legend = (
        "Each cell: mean prefix reuse · compaction events · broken requests. The Responses "
        "column replays the same transcripts as `input` items (a reasoning item before each "
        "round of calls, every other message typed with content parts); its request points are "
        "where the model speaks next. `auto` without a "
        "summarizer; windows with a 1,024-token output reserve; threshold 0.8, target 0.5; "
        "o200k counts.\n\n"
    )
    return legend + "\n".join(lines)
