"""Cost mode (DESIGN.md §16) on the transcript replays: prompt dollars per session with it off
and on, for Claude Sonnet and gpt-4.1 list prices (`config/prices.toml`).

Every request point of a transcript is compacted (`auto` without a summarizer) for a 200k
window, in Claude Code's shape: a cache breakpoint on the last message, so a request reads from
the cache the messages it shares with the previous request and writes the rest (Anthropic: at
the cache-write price; OpenAI: no write premium, the rest is plain input). Completions are the
transcript's own turns, the same either way: not counted. Break-even: the requests a cut takes
to pay back its rewrite at the savings per request it starts with (the rule's own economics).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inflight.compaction.cost_mode import CostRule, economics
from inflight.compaction.engine import compact
from inflight.compaction.policy import Budget
from inflight.compaction.replays import ReplayCache, Replays
from inflight.pricing.table import ModelPrice, PriceTable
from inflight.strategies import StrategyName
from inflight.tokens.counter import ChatTokenCounter
from inflight.tokens.encodings import load_encodings
from tests.support import load_traces, request_points

PRICES = Path(__file__).resolve().parents[1] / "config" / "prices.toml"
MODELS = ("claude-sonnet-4-5", "gpt-4.1")
WINDOW, RESERVE = 200_000, 32_000
FLOOR = 32_768  # INFLIGHT_COST_MIN_PROMPT's default
AUTO: tuple[StrategyName, ...] = ("truncate", "prune", "trim")
SHORT = "taubench_gpt-4o_airline_task2_trial1"  # a short session: under the floor throughout

Messages = Sequence[Mapping[str, Any]]


@dataclass(frozen=True, slots=True)
class Session:
    dollars: float
    events: int
    reuse: float  # cached prompt tokens / prompt tokens
    break_even: float | None  # mean requests a cut takes to pay back
    requests: int


def _common(a: Messages, b: Messages) -> int:
    same = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        same += 1
    return same


def replay(messages: Messages, model: str, price: ModelPrice, on: bool) -> Session:
    counter = ChatTokenCounter(load_encodings())
    memo: dict[int, tuple[Mapping[str, Any], int]] = {}

    def count(message: Mapping[str, Any]) -> int:
        hit = memo.get(id(message))
        if hit is None or hit[0] is not message:
            hit = (message, counter.count_message(model, message))
            memo[id(message)] = hit
        return hit[1]

    rule = CostRule.priced(price.cache_read_rate, price.cache_write_rate, FLOOR)
    budget = Budget(WINDOW, RESERVE, 0.8, 0.5, rule if on else None)
    write = price.cache_write_rate if price.cache_write is not None else price.input
    replays = Replays(ReplayCache(), lambda: model)
    previous: Messages = ()
    dollars, cached_all, prompt_all, events = 0.0, 0, 0, 0
    break_evens: list[float] = []
    for k in request_points(messages):
        result = compact(messages[:k], AUTO, budget, count, 0, replays=replays)
        out = result.messages
        tokens = [count(m) for m in out]
        same = _common(previous, out)
        if previous and same < len(previous):
            events += 1
            head = sum(tokens[: same or 0])
            cut = economics(rule, result.tokens_before, result.tokens_after, head)
            if cut.break_even_requests is not None:
                break_evens.append(cut.break_even_requests)
        cached, prompt = sum(tokens[:same]), sum(tokens)
        dollars += (cached * price.cache_read_rate + (prompt - cached) * write) / 1e6
        cached_all, prompt_all = cached_all + cached, prompt_all + prompt
        previous = out
    mean = sum(break_evens) / len(break_evens) if break_evens else None
    points = len(request_points(messages))
    return Session(dollars, events, cached_all / max(1, prompt_all), mean, points)


def report() -> str:
    table = PriceTable.load(PRICES)
    lines = [
        f"window {WINDOW:,} (reserve {RESERVE:,}), threshold 0.8, target 0.5, floor {FLOOR:,};"
        " prompt dollars per session, cost mode off -> on",
        "",
        "| model | session | requests | $ off | $ on | saved | events off/on | "
        "prefix reuse off/on | break-even (requests) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    traces = dict(load_traces())
    long = [name for name, m in traces.items() if len(m) >= 100]
    for model in MODELS:
        price = table.lookup(model)
        if price is None:
            raise LookupError(f"{model} is not in {PRICES}")
        totals = [0.0, 0.0]
        for name in [*long, SHORT]:
            off = replay(traces[name], model, price, on=False)
            on = replay(traces[name], model, price, on=True)
            totals[0] += off.dollars
            totals[1] += on.dollars
            saved = 1 - on.dollars / off.dollars if off.dollars else 0.0
            breaks = "-" if on.break_even is None else f"{on.break_even:.1f}"
            lines.append(
                f"| {model} | {name}{' (short)' if name == SHORT else ''} | {on.requests} | "
                f"{off.dollars:.3f} | {on.dollars:.3f} | {saved:.0%} | {off.events}/{on.events} | "
                f"{off.reuse:.0%}/{on.reuse:.0%} | {breaks} |"
            )
        lines.append(
            f"| {model} | all | | {totals[0]:.3f} | {totals[1]:.3f} | "
            f"{1 - totals[1] / totals[0]:.0%} | | | |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    print(report())
