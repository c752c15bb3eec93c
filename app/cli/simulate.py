"""`inflight simulate`: replay recorded conversations turn by turn through the compaction
engine, offline, and report tokens before/after, what was applied and prefix reuse."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inflight.compaction.engine import compact
from inflight.compaction.policy import Budget, resolve_pipeline
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
        same = 0
        if previous is not None:
            for a, b in zip(previous, out, strict=False):
                if a != b:
                    break
                same += 1
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
