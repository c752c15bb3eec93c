"""How often the summaries made ahead are the one the next compaction event needs, offline: the
transcripts replayed request by request through the planner alone (no timing, no upstream), the
spans each request past `SUMMARY_AHEAD` × budget starts summarising (`next_events`, up to
`SUMMARY_AHEAD_CUTS` of them) set against the cut of the event that follows.
`python -m bench.ahead` prints it per window, for the settings before issue 15's last change
(0.65, one cut) and after (0.55, two cuts), or for `--ahead F --cuts N`.

An event's summary is there in time when a request at least `--lead` requests before the event
started it (the summaries benchmark answers in 1 s and summarises in 2 s: two requests); an
event that misses it changes the prompt once more when its summary lands (DESIGN.md §12). The
"prompt changes" column is that: the events, plus the ones not covered `--lead` requests ahead,
relative to the events alone (what waiting for every summary gives). "Started" is the summary
calls made ahead (what the speculation costs; waiting makes one per event).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from app.compaction.planner import MessageCounter, Plan, plan
from app.compaction.policy import Budget, StrategyName
from app.compaction.summary.ahead import next_events
from app.compaction.summary.rolling import summary_budget
from app.tokens.counter import ChatTokenCounter
from app.tokens.encodings import load_encodings
from tests.support import load_traces, request_points

PIPELINE: tuple[StrategyName, ...] = ("truncate", "prune", "summarize")
RESERVE = 1024
WINDOWS = (8192, 16384, 32768)
SETTINGS = ((0.65, 1), (0.55, 2))  # (SUMMARY_AHEAD, SUMMARY_AHEAD_CUTS): before, after


@dataclass
class Covered:
    """One window's events and how far ahead each one's cut was started."""

    leads: list[int] = field(default_factory=list)  # per event: requests ahead (0: never)
    started: int = 0  # summaries started ahead

    def within(self, lead: int) -> int:
        return sum(1 for n in self.leads if n >= lead)


def _replan(
    messages: Sequence[Mapping[str, Any]],
    count: MessageCounter,
    *,
    budget: Budget,
    fixed: int,
    reserved: int,
) -> Plan:
    return plan(messages, PIPELINE, budget, count, fixed, reserved)


def replay(
    messages: Sequence[Mapping[str, Any]], window: int, ahead: float, cuts: int, out: Covered
) -> None:
    """One transcript: its events, and for each the first request that started its cut."""
    counter = ChatTokenCounter(load_encodings())
    count = partial(counter.count_message, "bench")
    fixed = counter.count_fixed("bench", {"model": "bench", "max_tokens": RESERVE})
    budget = Budget(window=window, reserve=RESERVE, threshold=0.8, target=0.5)
    reserved = summary_budget(budget.goal)
    started: dict[int, int] = {}  # cut -> the request it was started at
    previous: Plan | None = None
    for i, k in enumerate(request_points(messages)):
        history = messages[:k]
        now = plan(history, PIPELINE, budget, count, fixed, reserved)
        if previous is not None and now.summarize and now.cut > previous.cut:
            first = started.get(now.cut)
            out.leads.append(0 if first is None else i - first)
            started = {cut: j for cut, j in started.items() if cut > now.cut}
        if now.tokens_after >= ahead * budget.budget:
            replan = partial(_replan, budget=budget, fixed=fixed, reserved=reserved)
            for nxt in next_events(history, now, replan, budget.trigger, count, cuts):
                if nxt.cut not in started:
                    started[nxt.cut] = i
                    out.started += 1
        previous = now


def reachable(window: int, lead: int = 2) -> tuple[int, int]:
    """(events, events whose cut span the client had all sent `lead` requests before the
    event): no summary of the others can start earlier than `lead` − 1 requests ahead."""
    counter = ChatTokenCounter(load_encodings())
    count = partial(counter.count_message, "bench")
    fixed = counter.count_fixed("bench", {"model": "bench", "max_tokens": RESERVE})
    budget = Budget(window=window, reserve=RESERVE, threshold=0.8, target=0.5)
    reserved = summary_budget(budget.goal)
    events = sent_before = 0
    for _, messages in load_traces():
        units: list[int] = []  # units of each request's history
        previous: Plan | None = None
        for i, k in enumerate(request_points(messages)):
            now = plan(messages[:k], PIPELINE, budget, count, fixed, reserved)
            units.append(len(now.units))
            if previous is not None and now.summarize and now.cut > previous.cut:
                events += 1
                sent_before += i >= lead and now.cut <= units[i - lead]
            previous = now
    return events, sent_before


def report(settings: Sequence[tuple[float, int]] = SETTINGS, lead: int = 2) -> str:
    traces = load_traces()
    lines = [
        f"| SUMMARY_AHEAD | SUMMARY_AHEAD_CUTS | window | events | started ≥1 request ahead "
        f"| ≥{lead} ahead | prompt changes (× events) | summaries started ahead |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for ahead, cuts in settings:
        for window in WINDOWS:
            out = Covered()
            for _, messages in traces:
                replay(messages, window, ahead, cuts, out)
            events = len(out.leads)
            changes = 2 * events - out.within(lead)
            lines.append(
                f"| {ahead:g} | {cuts} | {window:,} | {events} | {out.within(1)} "
                f"| {out.within(lead)} | {changes} ({changes / max(1, events):.2f}×) "
                f"| {out.started} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.ahead")
    parser.add_argument("--ahead", type=float, help="SUMMARY_AHEAD (with --cuts)")
    parser.add_argument("--cuts", type=int, help="SUMMARY_AHEAD_CUTS (with --ahead)")
    parser.add_argument("--lead", type=int, default=2, help="requests a summary takes")
    args = parser.parse_args()
    chosen = SETTINGS if args.ahead is None else ((args.ahead, args.cuts or 1),)
    print(report(chosen, args.lead))
