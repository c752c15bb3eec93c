"""Prefix reuse, compaction events and planning cost on the transcript replays.

`auto` (inflight's cache-stable planner) against baselines that re-trim every request:
keep-newest-that-fit (drop the oldest whole units until the prompt fits), LangChain-style
`trim_messages` (newest messages that fit, by message, then repaired so no tool result is
orphaned), and OpenRouter-style middle-out (drop from the middle until it fits).
Prefix reuse = tokens of the previous forwarded prompt's prefix that the next one repeats,
over the next one's tokens: what an upstream prompt cache (vLLM prefix caching, OpenAI
caching) can reuse.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import orjson

from inflight.cli.simulate import broken, common_prefix
from inflight.cli.simulate import trim_messages as langchain_trim
from inflight.compaction.engine import compact
from inflight.compaction.policy import Budget
from inflight.compaction.units import group_units, pinned_head
from inflight.tokens.counter import ChatTokenCounter
from inflight.tokens.encodings import load_encodings
from tests.support import load_traces, request_points

Messages = list[Mapping[str, Any]]
Counter = Callable[[Mapping[str, Any]], int]


def _fit_by_units(messages: Messages, budget: int, count: Counter, middle: bool) -> Messages:
    units = group_units(messages)
    head = pinned_head(messages, units)
    costs = [sum(count(m) for m in messages[u.start : u.end]) for u in units]
    total = sum(costs)
    kept = list(range(len(units)))
    droppable = list(range(head, len(units) - 1))
    if middle:
        centre = len(droppable) // 2
        order = sorted(droppable, key=lambda i: (abs(i - droppable[centre]) if droppable else 0, i))
    else:
        order = droppable
    for i in order:
        if total <= budget:
            break
        kept.remove(i)
        total -= costs[i]
    return [m for i in kept for m in messages[units[i].start : units[i].end]]


def keep_newest(messages: Messages, budget: int, count: Counter) -> Messages:
    return _fit_by_units(messages, budget, count, middle=False)


def middle_out_every_request(messages: Messages, budget: int, count: Counter) -> Messages:
    return _fit_by_units(messages, budget, count, middle=True)


def inflight_auto(budget: Budget, count: Counter) -> Callable[[Messages], Messages]:
    def run(messages: Messages) -> Messages:
        return compact(messages, ("truncate", "prune", "trim"), budget, count, 0).messages

    return run


def replay(
    messages: Messages, compactor: Callable[[Messages], Messages], count: Counter, budget: int
) -> tuple[float, int, int, int]:
    """(mean prefix reuse, events, broken requests, requests) over one transcript."""
    previous: Messages | None = None
    shares: list[float] = []
    events = 0
    failures = 0
    for k in request_points(messages):
        out = compactor(messages[:k])
        failures += broken(messages[:k], out, budget, count)
        tokens = sum(count(m) for m in out)
        if previous is not None:
            same = common_prefix(previous, out)
            if same < len(previous):
                events += 1
            shares.append(sum(count(m) for m in out[:same]) / max(1, tokens))
        previous = out
    reuse = statistics.mean(shares) if shares else 1.0
    return reuse, events, failures, len(request_points(messages))


def prefix_reuse_report(windows: Sequence[int] = (8192, 16384, 32768)) -> str:
    counter = ChatTokenCounter(load_encodings())

    def count(m: Mapping[str, Any]) -> int:
        return counter.count_message("gpt-4o", m)

    lines = [
        "| transcript | window | inflight auto | keep-newest | LangChain trim | middle-out |",
        "|---|---:|---|---|---|---|",
    ]
    totals: dict[str, list[float]] = {"auto": [], "newest": [], "langchain": [], "middle": []}
    broke = dict.fromkeys(totals, 0)
    for name, messages in load_traces():
        for window in windows:
            budget = Budget(window, 1024, 0.8, 0.5)
            fit = budget.budget
            cells = []
            for key, fn in (
                ("auto", inflight_auto(budget, count)),
                ("newest", lambda ms, f=fit: keep_newest(ms, f, count)),
                ("langchain", lambda ms, f=fit: langchain_trim(ms, f, count)),
                ("middle", lambda ms, f=fit: middle_out_every_request(ms, f, count)),
            ):
                reuse, events, failures, _ = replay(messages, fn, count, fit)
                totals[key].append(reuse)
                broke[key] += failures
                cells.append(f"{reuse:.0%} · {events} ev · {failures} bad")
            lines.append(f"| {name[:32]} | {window // 1024}k | " + " | ".join(cells) + " |")
    means = " | ".join(f"**{statistics.mean(v):.0%}**" for v in totals.values())
    lines.append(f"| **mean prefix reuse** | | {means} |")
    bad = " | ".join(f"**{n}**" for n in broke.values())
    lines.append(f"| **broken requests** | | {bad} |")
    legend = (
        "Each cell: mean prefix reuse · compaction events (requests whose prompt is not an "
        "extension of the previous one) · broken requests (lost the current turn, orphaned a "
        "tool result, or over the budget). Windows with a 1,024-token output reserve; "
        "threshold 0.8, target 0.5; counts with o200k.\n\n"
    )
    return legend + "\n".join(lines)


def planning_cost_report() -> str:
    """Count + plan for the largest transcript, cold (new counter) and warm (cached)."""
    traces = load_traces()
    name, messages = max(traces, key=lambda t: sum(len(str(m.get("content"))) for m in t[1]))
    encodings = load_encodings()
    budget = Budget(8192, 1024, 0.8, 0.5)
    rows = []
    for model in ("gpt-4o", "llama-3.1-8b"):
        colds, warms = [], []
        for _ in range(5):
            counter = ChatTokenCounter(encodings)
            for target in (colds, warms):
                start = time.perf_counter()
                fixed = counter.count_fixed(model, {"messages": messages})
                compact(
                    messages,
                    ("truncate", "prune", "trim"),
                    budget,
                    lambda m, c=counter, mo=model: c.count_message(mo, m),
                    fixed,
                )
                target.append((time.perf_counter() - start) * 1000)
        cold, warm = statistics.median(colds), statistics.median(warms)
        rows.append(f"| {model} | {cold:.1f} ms | {warm:.1f} ms | {cold / warm:.1f}× |")
    header = (
        f"Count + plan of `{name}` ({len(messages)} messages) for an 8k window, median of 5:\n\n"
        "| model (counting) | cold | warm (per-message cache) | cold / warm |\n|---|---:|---:|---:|"
    )
    return header + "\n" + "\n".join(rows)


def scaling_report(sizes: Sequence[int] = (100, 250, 500, 1000, 2000)) -> str:
    """Warm planning cost as a conversation grows (tool rounds of ~600 tokens)."""
    counter = ChatTokenCounter(load_encodings())
    budget = Budget(32768, 2048, 0.8, 0.5)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "agent"},
        {"role": "user", "content": "task"},
    ]
    rows = []
    i = 0
    for size in sizes:
        while len(messages) < size:
            call = {
                "id": f"c{i}",
                "type": "function",
                "function": {"name": "bash", "arguments": "{}"},
            }
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            messages.append(
                {"role": "tool", "tool_call_id": f"c{i}", "content": f"{i} " + "out " * 600}
            )
            i += 1

        def count(m: Mapping[str, Any]) -> int:
            return counter.count_message("gpt-4o", m)

        compact(messages, ("truncate", "prune", "trim"), budget, count, 0)  # warm the cache
        runs = []
        for _ in range(5):
            start = time.perf_counter()
            compact(messages, ("truncate", "prune", "trim"), budget, count, 0)
            runs.append((time.perf_counter() - start) * 1000)
        rows.append(f"| {len(messages)} | {statistics.median(runs):.1f} ms |")
    return "| messages | warm plan (32k window) |\n|---:|---:|\n" + "\n".join(rows)


def _chat(size: int, text: Callable[[int], str]) -> Messages:
    """A system message, then `size - 1` user/assistant turns."""
    turns: Messages = [{"role": "system", "content": "Be brief."}]
    turns += [
        {"role": "user" if i % 2 == 0 else "assistant", "content": text(i)} for i in range(size - 1)
    ]
    return turns


def middle_out_report(window: int = 1024) -> str:
    """Middle-out (and its neighbours) on huge histories at a small window: the replay is
    near-linear, so 16,000 messages (6.6 MB) and 100,000 tiny ones plan in about a second.
    `count + plan` starts from a cold token counter (o200k, as for gpt-4o); `plan` alone gets
    the counts from a table, which isolates the planner."""
    histories = {
        "16,000 messages": _chat(16_000, lambda i: f"m{i} " + "word " * 75),
        "100,000 tiny messages": _chat(100_000, lambda i: f"m{i}"),
    }
    budget = Budget(window, window // 2, 0.8, 0.5)
    rows = []
    for name, messages in histories.items():
        known = {id(m): len(orjson.dumps(m)) // 4 + 3 for m in messages}
        for pipeline in (("middle-out",), ("truncate", "middle-out"), ("trim",)):
            counter = ChatTokenCounter(load_encodings())
            start = time.perf_counter()
            compact(messages, pipeline, budget, partial(counter.count_message, "gpt-4o"), 3)
            cold = time.perf_counter() - start
            start = time.perf_counter()
            compact(messages, pipeline, budget, lambda m, table=known: table[id(m)], 3)
            alone = time.perf_counter() - start
            mb = len(orjson.dumps(messages)) / 1e6
            rows.append(
                f"| {name} | {mb:.1f} MB | `{','.join(pipeline)}` | {cold:.2f} s | {alone:.2f} s |"
            )
    header = (
        f"Huge histories at a {window:,}-token window, one run each:\n\n"
        "| history | body | strategy | count + plan | plan |\n|---|---:|---|---:|---:|"
    )
    return header + "\n" + "\n".join(rows)
