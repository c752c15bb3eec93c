"""`inflight simulate`: replay recorded conversations turn by turn through the compaction
engine, offline, and report tokens before/after, what was applied and prefix reuse."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inflight.compaction.engine import compact
from inflight.compaction.policy import Budget, resolve_pipeline
from inflight.compaction.units import check_pair_safety, group_units, pinned_head
from inflight.strategies import StrategyName
from inflight.tokens.counter import TokenCounter
from inflight.windows.table import output_reserve


@dataclass(frozen=True, slots=True)
class Turn:
    """One request of a replayed conversation."""

    index: int
    messages: int
    tokens_before: int
    tokens_after: int
    applied: tuple[str, ...]
    prefix_reuse: float  # share of this prompt's tokens repeating the previous prompt's prefix
    event: bool
    over_budget: bool


def load_messages(path: Path) -> tuple[list[dict[str, Any]], str | None]:
    """A transcript file: `{"messages": [...], "model"?: ...}`, a request body, or a list."""
    data = json.loads(path.read_text(encoding="utf-8"))
    if isinstance(data, list):
        return data, None
    if isinstance(data, dict) and isinstance(data.get("messages"), list):
        model = data.get("model")
        return data["messages"], model if isinstance(model, str) else None
    raise ValueError(f"{path}: expected a message list or an object with 'messages'")


def common_prefix(a: Sequence[Any], b: Sequence[Any]) -> int:
    """How many leading messages two prompts share (what a prompt cache can reuse)."""
    same = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        same += 1
    return same


def request_points(messages: Sequence[Mapping[str, Any]]) -> list[int]:
    """Each k where `messages[:k]` is a request: the assistant speaks next."""
    return [
        k
        for k in range(1, len(messages) + 1)
        if messages[k - 1].get("role") != "assistant"
        and (k == len(messages) or messages[k].get("role") == "assistant")
    ]


def simulate(
    messages: Sequence[Mapping[str, Any]],
    model: str,
    window: int,
    strategies: tuple[StrategyName, ...] | None,
    counter: TokenCounter,
    threshold: float = 0.8,
    target: float = 0.5,
) -> list[Turn]:
    """Replay; summaries need an upstream, so offline `summarize` is simulated as `trim`."""
    pipeline = resolve_pipeline(strategies, summarizer_available=False)
    turns: list[Turn] = []
    previous: Sequence[Mapping[str, Any]] | None = None

    def count(message: Mapping[str, Any]) -> int:
        return counter.count_message(model, message)

    for k in request_points(messages):
        body = {"model": model, "messages": list(messages[:k])}
        budget = Budget(window, output_reserve(body, window), threshold, target)
        result = compact(messages[:k], pipeline, budget, count, counter.count_fixed(model, body))
        out = result.messages
        same = common_prefix(previous, out) if previous is not None else 0
        reused = sum(count(m) for m in out[:same])
        event = previous is not None and same < len(previous)
        turns.append(
            Turn(
                index=k,
                messages=len(out),
                tokens_before=result.tokens_before,
                tokens_after=result.tokens_after,
                applied=result.applied,
                prefix_reuse=reused / max(1, sum(count(m) for m in out)),
                event=event,
                over_budget=result.over_budget,
            )
        )
        previous = out
    return turns


def plot(turns_by_name: Mapping[str, Sequence[Turn]], window: int, out: Path) -> None:
    """A PNG of tokens per turn (before and after) for each transcript (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 5), dpi=100)
    for name, turns in turns_by_name.items():
        xs = list(range(1, len(turns) + 1))
        ax.plot(xs, [t.tokens_before for t in turns], linestyle=":", label=f"{name} (received)")
        ax.plot(xs, [t.tokens_after for t in turns], label=f"{name} (forwarded)")
    ax.axhline(window, color="red", linewidth=0.8, label="window")
    ax.set_xlabel("request (turn)")
    ax.set_ylabel("prompt tokens")
    ax.set_title("inflight simulate")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(out, format="png")
    plt.close(fig)


# --- baselines: what agent loops do instead (`simulate --compare`) ---------------------------

Messages = Sequence[Mapping[str, Any]]
Count = Callable[[Mapping[str, Any]], int]


def trim_messages(messages: Messages, budget: int, count: Count) -> list[Mapping[str, Any]]:
    """LangChain's `trim_messages(strategy="last", include_system=True, start_on="human")` (and
    LiteLLM's `trim_messages`, which also keeps the newest messages that fit): the newest
    messages that fit, by message, then from the first user message on."""
    system = [m for m in messages[:1] if m.get("role") == "system"]
    rest = messages[len(system) :]
    total = sum(count(m) for m in system)
    kept: list[Mapping[str, Any]] = []
    for m in reversed(rest):
        if total + count(m) > budget:
            break
        kept.insert(0, m)
        total += count(m)
    while kept and kept[0].get("role") != "user":  # start_on="human"
        kept.pop(0)
    return system + kept


def keep_newest(messages: Messages, budget: int, count: Count) -> list[Mapping[str, Any]]:
    """Drop the oldest whole units (a call with its results) until the prompt fits, every
    request: pairs kept, but the cut moves with every turn."""
    units = group_units(messages)
    head = pinned_head(messages, units)
    costs = [sum(count(m) for m in messages[u.start : u.end]) for u in units]
    total = sum(costs)
    kept = list(range(len(units)))
    for i in range(head, len(units) - 1):
        if total <= budget:
            break
        kept.remove(i)
        total -= costs[i]
    return [m for i in kept for m in messages[units[i].start : units[i].end]]


def broken(request: Messages, out: Messages, budget: int, count: Count) -> bool:
    """The output lost the current turn, orphans a tool result or a call, or does not fit."""
    last, kept = request[-1], out[-1] if out else {}
    same_turn = (
        kept == last
        or (  # the current tool output may be truncated, never dropped
            kept.get("role") == last.get("role")
            and kept.get("tool_call_id") == last.get("tool_call_id")
            and str(kept.get("content"))[:200] == str(last.get("content"))[:200]
        )
    )
    return not same_turn or bool(check_pair_safety(out)) or sum(count(m) for m in out) > budget


@dataclass(frozen=True, slots=True)
class Compared:
    """One way of fitting a transcript's requests, replayed: mean prefix reuse, compaction
    events (prompts that do not extend the previous one), and broken requests."""

    name: str
    reuse: float
    events: int
    broken: int
    requests: int


def compare(messages: Messages, model: str, window: int, counter: TokenCounter) -> list[Compared]:
    """inflight's `auto` (without summaries, offline) beside the baselines, replayed request by
    request, each judged the same way."""

    def count(message: Mapping[str, Any]) -> int:
        return counter.count_message(model, message)

    body = {"model": model}
    budget = Budget(window, output_reserve(body, window), 0.8, 0.5)
    fixed = counter.count_fixed(model, body)
    pipeline = resolve_pipeline(None, summarizer_available=False)

    def inflight(request: Messages, _budget: int, _count: Count) -> list[Mapping[str, Any]]:
        return list(compact(request, pipeline, budget, count, fixed).messages)

    fits = {"inflight auto": inflight, "trim_messages": trim_messages, "keep-newest": keep_newest}
    return [_replayed(name, fit, messages, budget.budget, count) for name, fit in fits.items()]


def _replayed(
    name: str,
    fit: Callable[[Messages, int, Count], list[Mapping[str, Any]]],
    messages: Messages,
    budget: int,
    count: Count,
) -> Compared:
    previous: list[Mapping[str, Any]] | None = None
    shares: list[float] = []
    events = failures = 0
    points = request_points(messages)
    for k in points:
        out = fit(messages[:k], budget, count)
        failures += broken(messages[:k], out, budget, count)
        if previous is not None:
            same = common_prefix(previous, out)
            events += same < len(previous)
            tokens = sum(count(m) for m in out)
            shares.append(sum(count(m) for m in out[:same]) / max(1, tokens))
        previous = out
    reuse = sum(shares) / len(shares) if shares else 1.0
    return Compared(name, reuse, events, failures, len(points))
