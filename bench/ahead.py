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
relative to the events alone (what waiting for every summary gives) — without partial stand-ins,
and with them (`SUMMARY_PARTIAL`, app/compaction/summary/partial.py: an event not covered whose
span has a prefix holding that share of its tokens, summarised `--lead` requests before — made
ahead, or the cut of an earlier event — is served with that summary, which stays: no change
more). "Started" is the summary calls made ahead (what the speculation costs; waiting makes
one per event).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from inflight.compaction.planner import plan
from inflight.compaction.policy import Budget
from inflight.compaction.rendering import Plan
from inflight.compaction.summary.ahead import next_events
from inflight.compaction.summary.partial import covered
from inflight.compaction.summary.rolling import summary_budget
from inflight.compaction.unit_costs import MessageCounter
from inflight.settings import Settings
from inflight.strategies import StrategyName
from inflight.tokens.counter import ChatTokenCounter
from inflight.tokens.encodings import load_encodings
from tests.support import load_traces, request_points

PIPELINE: tuple[StrategyName, ...] = ("truncate", "prune", "summarize")
RESERVE = 1024
WINDOWS = (8192, 16384, 32768)
SETTINGS = ((0.65, 1), (0.55, 2))  # (SUMMARY_AHEAD, SUMMARY_AHEAD_CUTS): before, after
PARTIAL: float = Settings.model_fields["summary_partial"].default  # SUMMARY_PARTIAL's default


@dataclass
class Covered:
    """One window's events and how far ahead each one's cut was started."""

    leads: list[int] = field(default_factory=list)  # per event: requests ahead (0: never)
    started: int = 0  # summaries started ahead
    partial: int = 0  # events not covered `lead` ahead that a partial stand-in serves

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
    messages: Sequence[Mapping[str, Any]],
    window: int,
    ahead: float,
    cuts: int,
    out: Covered,
    lead: int = 2,
) -> None:
    """One transcript: its events, for each the first request that started its cut, and
    whether a summary of a prefix of its span, started `lead` requests before, stands in."""
    counter = ChatTokenCounter(load_encodings())
    count = partial(counter.count_message, "bench")
    fixed = counter.count_fixed("bench", {"model": "bench", "max_tokens": RESERVE})
    budget = Budget(window=window, reserve=RESERVE, threshold=0.8, target=0.5)
    reserved = summary_budget(budget.goal)
    started: dict[int, int] = {}  # cut -> the request its summary started at (ahead, or event)
    previous: Plan | None = None
    for i, k in enumerate(request_points(messages)):
        history = messages[:k]
        now = plan(history, PIPELINE, budget, count, fixed, reserved)
        if previous is not None and now.summarize and now.cut > previous.cut:
            first = started.get(now.cut)
            out.leads.append(0 if first is None else i - first)
            if first is None or i - first < lead:
                made = [c for c, j in started.items() if now.head < c < now.cut and i - j >= lead]
                out.partial += bool(made) and covered(history, now, max(made), count) >= PARTIAL
            started.setdefault(now.cut, i)  # made at the event when not ahead of it
        if now.tokens_after >= ahead * budget.budget:
            replan = partial(_replan, budget=budget, fixed=fixed, reserved=reserved)
            for nxt in next_events(history, now, replan, budget.trigger, count, cuts):
                if nxt.cut not in started:
                    started[nxt.cut] = i
                    out.started += 1
        previous = now


def reachable(window: int, lead: int = 2) -> tuple[int, int, int]:
    """(events, events whose cut span the client had all sent `lead` requests before the
    event, other events of which a prefix holding `SUMMARY_PARTIAL` of the span's tokens it
    had): no summary of the span of the others can start earlier than `lead` − 1 requests
    ahead, and a summary of a prefix no earlier than the prefix was sent; the best any policy
    gets is a change more for each event neither covers."""
    counter = ChatTokenCounter(load_encodings())
    count = partial(counter.count_message, "bench")
    fixed = counter.count_fixed("bench", {"model": "bench", "max_tokens": RESERVE})
    budget = Budget(window=window, reserve=RESERVE, threshold=0.8, target=0.5)
    reserved = summary_budget(budget.goal)
    events = sent_before = prefixed = 0
    for _, messages in load_traces():
        units: list[int] = []  # units of each request's history
        previous: Plan | None = None
        for i, k in enumerate(request_points(messages)):
            history = messages[:k]
            now = plan(history, PIPELINE, budget, count, fixed, reserved)
            units.append(len(now.units))
            if previous is not None and now.summarize and now.cut > previous.cut:
                events += 1
                sent = units[i - lead] if i >= lead else 0
                if now.cut <= sent:
                    sent_before += 1
                elif now.head < sent:
                    prefixed += covered(history, now, sent, count) >= PARTIAL
            previous = now
    return events, sent_before, prefixed


def report(settings: Sequence[tuple[float, int]] = SETTINGS, lead: int = 2) -> str:
    traces = load_traces()
    lines = [
        f"| SUMMARY_AHEAD | SUMMARY_AHEAD_CUTS | window | events | started ≥1 request ahead "
        f"| ≥{lead} ahead | prompt changes, no partial stand-ins (× events) "
        f"| partial stand-ins | prompt changes (× events) | summaries started ahead |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for ahead, cuts in settings:
        for window in WINDOWS:
            out = Covered()
            for _, messages in traces:
                replay(messages, window, ahead, cuts, out, lead)
            events = len(out.leads)
            without = 2 * events - out.within(lead)
            changes = without - out.partial
            lines.append(
                f"| {ahead:g} | {cuts} | {window:,} | {events} | {out.within(1)} "
                f"| {out.within(lead)} | {without} ({without / max(1, events):.2f}×) "
                f"| {out.partial} | {changes} ({changes / max(1, events):.2f}×) "
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
