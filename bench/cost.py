"""Dollars on the transcript replays: inflight's compacted prompts against the same
conversations uncompacted, at list prices (`config/prices.toml`), prompt caching counted.

Each transcript is replayed request by request (every point where the assistant speaks next).
Both sides go through a simulated provider prompt cache that remembers every earlier prompt:

- OpenAI (automatic caching): a prompt reads the longest whole-message prefix it shares with
  any earlier prompt, if at least 1,024 tokens, in 128-token steps; the rest is fresh input.
- Anthropic (explicit caching): the client marks two breakpoints, as Claude Code does: the end
  of the pinned head and the end of the conversation. A prompt reads the longest earlier
  breakpoint it still starts with (an earlier prompt it extends, or the head) and writes the
  rest at the cache-write price (prompts under 1,024 tokens are not cached).

"inflight" bills the forwarded (compacted) prompts, "uncompacted" the full history: the true
counterfactual under the same cache model; "re-trim every request" bills keep-newest-that-fits
applied to every request, as peers do, which moves the cut (and busts the cache) each turn.
"proxy's estimate" is the `baseline_cost` the proxy itself records for the same traffic
(`CostMeter`, README "Money"), to show how close it comes.
Completions are the transcript's own assistant turns (identical on both sides). Tokens are
o200k counts for both models (Anthropic's tokenizer is not public). The strategies are those
`auto` runs without a summarizer (truncate, prune, trim): summary calls would add their cost.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.compaction import inflight_auto, keep_newest
from inflight.compaction.policy import Budget
from inflight.compaction.units import group_units, pinned_head
from inflight.pricing.cost import Billed, automatic_hit, dollars
from inflight.pricing.meter import CostMeter
from inflight.pricing.table import BaselineRules, Caching, ModelPrice, PriceTable
from inflight.tokens.counter import ChatTokenCounter
from inflight.tokens.encodings import load_encodings
from inflight.usage.records import UsageRecord
from tests.support import load_traces, request_points

PRICES = Path(__file__).resolve().parents[1] / "config" / "prices.toml"
MODELS = ("gpt-4.1", "claude-sonnet-4-5")
WINDOWS = (16_384, 32_768, 65_536)
MIN_CACHED = 1024
PRIMING = 3  # tokens every chat prompt carries besides its messages

Messages = list[Mapping[str, Any]]


def _common(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]]) -> int:
    """Number of leading messages `a` and `b` share."""
    same = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        same += 1
    return same


@dataclass
class ProviderCache:
    """A provider's prompt cache over one conversation (see the module docstring)."""

    price: ModelPrice
    rules: BaselineRules
    prompts: list[Messages] = field(default_factory=list)
    head: Messages | None = None

    def bill(self, prompt: Messages, tokens: Sequence[int], completion: int) -> Billed:
        """`tokens[i]`: tokens of `prompt[i]`."""
        total = PRIMING + sum(tokens)

        def upto(n: int) -> int:
            return sum(tokens[:n])

        head = prompt[: pinned_head(prompt, group_units(prompt))]
        if self.price.caching is Caching.AUTOMATIC:
            best = max((upto(_common(p, prompt)) for p in self.prompts), default=0)
            billed = Billed(total, automatic_hit(self.rules, total, best), 0, completion)
        else:
            reads = [upto(len(p)) for p in self.prompts if _common(p, prompt) == len(p)]
            if self.head is not None and self.head == head:
                reads.append(upto(len(head)))
            read = max((r for r in reads if r >= MIN_CACHED), default=0)
            written = total - read if total >= MIN_CACHED else 0
            billed = Billed(total, read, written, completion)
        self.prompts.append(prompt)
        self.head = head
        return billed


@dataclass
class Tally:
    requests: int = 0
    events: int = 0
    inflight: float = 0.0
    uncompacted: float = 0.0
    retrim: float = 0.0
    estimate: float = 0.0
    read_inflight: int = 0
    read_uncompacted: int = 0
    prompt_inflight: int = 0
    prompt_uncompacted: int = 0


def _record(model: str, billed: Billed, before: int, after: int, ts: float) -> UsageRecord:
    return UsageRecord(
        ts=ts, request_id="bench", kind="chat", model=model, client_key_id=None, stream=False,
        status=200, outcome="completed", latency_ms=0.0, ttfb_ms=None,
        prompt_tokens=billed.prompt, completion_tokens=billed.completion,
        cached_tokens=billed.cached, cache_write_tokens=billed.cache_write,
        tokens_before=before, tokens_after=after, strategies=(), context_limit=None,
    )  # fmt: skip


def replay(
    model: str, price: ModelPrice, window: int, messages: Messages, tally: Tally, meter: CostMeter
) -> None:
    counter = ChatTokenCounter(load_encodings())

    def count(m: Mapping[str, Any]) -> int:
        return counter.count_message("gpt-4o", m)

    budget = Budget(window, 1024, 0.8, 0.5)
    compactor = inflight_auto(budget, count)
    rules = meter.table.baseline
    ours, theirs, peer = (ProviderCache(price, rules) for _ in range(3))
    previous: Messages | None = None
    for k in request_points(messages):
        request = messages[:k]
        out = compactor(request)
        answer = count(messages[k]) if k < len(messages) else 0
        full = theirs.bill(request, [count(m) for m in request], answer)
        ours_bill = ours.bill(out, [count(m) for m in out], answer)
        trimmed = keep_newest(request, budget.budget, count)
        tally.retrim += dollars(price, peer.bill(trimmed, [count(m) for m in trimmed], answer))
        tally.requests += 1
        tally.events += previous is not None and _common(previous, out) < len(previous)
        previous = out
        tally.inflight += dollars(price, ours_bill)
        tally.uncompacted += dollars(price, full)
        tally.read_inflight += ours_bill.read
        tally.read_uncompacted += full.read
        tally.prompt_inflight += ours_bill.prompt
        tally.prompt_uncompacted += full.prompt
        record = _record(model, ours_bill, full.prompt, ours_bill.prompt, float(k))
        costs = meter.costs(record, {"model": model, "messages": request})
        tally.estimate += costs.baseline or 0.0


def report(models: Sequence[str] = MODELS, windows: Sequence[int] = WINDOWS) -> str:
    table = PriceTable.load(PRICES)
    traces = load_traces()
    lines = [
        "| model | window | requests | compaction events | inflight | uncompacted | saved "
        "| cache reads (inflight / uncompacted) | proxy's estimate of the baseline "
        "| re-trim every request |",
        "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for model in models:
        price = table.lookup(model)
        assert price is not None, f"{model} is not in {PRICES}"
        for window in windows:
            tally = Tally()
            meter = CostMeter(table)
            for _, messages in traces:
                replay(model, price, window, messages, tally, meter)
            saved = tally.uncompacted - tally.inflight
            share = saved / tally.uncompacted if tally.uncompacted else 0.0
            error = tally.estimate / tally.uncompacted - 1 if tally.uncompacted else 0.0
            lines.append(
                f"| {model} | {window // 1024}k | {tally.requests} | {tally.events} "
                f"| ${tally.inflight:.2f} | ${tally.uncompacted:.2f} "
                f"| **${saved:.2f} ({share:+.0%})** "
                f"| {tally.read_inflight / max(1, tally.prompt_inflight):.0%} / "
                f"{tally.read_uncompacted / max(1, tally.prompt_uncompacted):.0%} "
                f"| ${tally.estimate:.2f} ({error:+.1%}) | ${tally.retrim:.2f} |"
            )
    legend = (
        f"All {len(traces)} transcripts replayed request by request; prices from "
        f"`config/prices.toml` (as of {table.as_of}); windows with a 1,024-token output "
        "reserve, threshold 0.8, target 0.5; strategies truncate, prune, trim (no summary "
        "calls). Cache reads: share of prompt tokens read from the simulated provider cache. "
        "Re-trim every request: keep-newest-that-fits on every request (what peers do), billed "
        "under the same cache model.\n\n"
    )
    return legend + "\n".join(lines)
