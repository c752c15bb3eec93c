"""Reference retention (DESIGN.md §14): how well a strategy keeps the identifiers a session
reuses. For each compaction event of a replayed conversation, the identifiers of what the
event cut (messages no longer forwarded whole) that the conversation mentions again after it
are *retained* (in the forwarded prompt: kept text, a marker, the summary), *restorable* (in
the original behind a ref a marker of the prompt names) or *lost*.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import anyio

from inflight.cli.simulate import request_points
from inflight.compaction.engine import CompactionResult, compact
from inflight.compaction.facts import fate, identifier_set, message_text, whole_positions
from inflight.compaction.policy import Budget
from inflight.compaction.refs import REF_SUFFIX_RE
from inflight.strategies import StrategyName
from inflight.tokens.counter import TokenCounter
from inflight.windows.table import output_reserve

# Compacts one request of the replay (the history up to a request point).
Compactor = Callable[[Sequence[Mapping[str, Any]]], Awaitable[CompactionResult]]


@dataclass(frozen=True, slots=True)
class Retention:
    """The fate of the recurring references of a replay's events, and its tokens."""

    events: int = 0
    recurring: int = 0  # references cut at an event and mentioned again after it
    retained: int = 0
    restorable: int = 0
    lost: int = 0
    tokens_before: int = 0  # over every request of the replay
    tokens_after: int = 0

    def __add__(self, other: Retention) -> Retention:
        return Retention(*(a + b for a, b in zip(_values(self), _values(other), strict=True)))

    def share(self, count: int) -> float:
        """`count` as a share of the recurring references (1.0 when there were none)."""
        return count / self.recurring if self.recurring else 1.0

    @property
    def saved(self) -> float:
        """The share of prompt tokens compaction saved over the replay."""
        return 1 - self.tokens_after / self.tokens_before if self.tokens_before else 0.0


def _values(r: Retention) -> tuple[int, ...]:
    return (
        r.events, r.recurring, r.retained, r.restorable, r.lost, r.tokens_before, r.tokens_after,
    )  # fmt: skip


async def retention(messages: Sequence[Mapping[str, Any]], compactor: Compactor) -> Retention:
    """Replay `messages` request by request through `compactor` and score its events."""
    ids = [identifier_set(message_text(m)) for m in messages]
    total = Retention()
    previous: set[int] = set()
    for k in request_points(messages):
        result = await compactor(messages[:k])
        whole = whole_positions(messages[:k], result.messages, result.sources)
        total += Retention(tokens_before=result.tokens_before, tokens_after=result.tokens_after)
        cut = previous - whole
        previous = whole
        if not cut:
            continue
        later: set[str] = set().union(*ids[k:])
        recurring = set().union(*(ids[p] for p in cut)) & later
        prompt = "\n".join(message_text(m) for m in result.messages)
        named = REF_SUFFIX_RE.findall(prompt)
        fates = [fate(r, prompt, result.refs, named) for r in sorted(recurring)]
        total += Retention(
            events=1,
            recurring=len(fates),
            retained=fates.count("retained"),
            restorable=fates.count("restorable"),
            lost=fates.count("lost"),
        )
    return total


OFFLINE: tuple[tuple[str, tuple[StrategyName, ...], bool], ...] = (
    ("trim", ("trim",), False),
    ("trim + restore", ("trim",), True),
    ("middle-out", ("middle-out",), False),
    ("auto (offline: no summaries)", ("truncate", "prune", "trim"), False),
)


def offline_table(
    messages: Sequence[Mapping[str, Any]],
    model: str,
    window: int,
    counter: TokenCounter,
    threshold: float = 0.8,
    target: float = 0.5,
) -> str:
    """`inflight simulate --retention`: the retention of each strategy that needs no
    summariser, on one transcript, as a table."""

    def count(message: Mapping[str, Any]) -> int:
        return counter.count_message(model, message)

    def compactor(pipeline: tuple[StrategyName, ...], restore: bool) -> Compactor:
        async def run(history: Sequence[Mapping[str, Any]]) -> CompactionResult:
            body = {"model": model, "messages": list(history)}
            budget = Budget(window, output_reserve(body, window), threshold, target)
            fixed = counter.count_fixed(model, body)
            return compact(history, pipeline, budget, count, fixed, restore=restore)

        return run

    lines = [
        f"{'strategy':<30} {'events':>6} {'refs':>5} {'retained':>9} {'restorable':>10} "
        f"{'lost':>6} {'saved':>6}"
    ]
    for name, pipeline, restore in OFFLINE:
        r = anyio.run(retention, messages, compactor(pipeline, restore))
        lines.append(
            f"{name:<30} {r.events:>6} {r.recurring:>5} {r.share(r.retained):>9.0%} "
            f"{r.share(r.restorable):>10.0%} {r.share(r.lost):>6.0%} {r.saved:>6.0%}"
        )
    return "\n".join(lines)
