"""How summary calls end, counted by reason, and the requests that fell back to `trim` because of
them (shown in `/stats` under `summaries` and in `/metrics`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from inflight.compaction.summary.prompt import Completer, SummaryFailed
from inflight.errors import UpstreamTimeout, UpstreamUnavailable


@dataclass(slots=True)
class BackgroundCounts:
    """What the background summaries of this process did (DESIGN.md §12)."""

    queued: int = 0  # waiting for a slot or for their upstream to be idle
    running: int = 0
    made: int = 0
    failed: int = 0
    skipped: dict[str, int] = field(default_factory=dict)  # not made here, by reason
    # how each one started: `immediate` (upstream not gated, or idle), `waited` (for an idle
    # moment), `forced` (the bounded wait ran out under sustained load: it ran anyway)
    starts: dict[str, int] = field(default_factory=dict)

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1

    def started(self, how: str) -> None:
        self.starts[how] = self.starts.get(how, 0) + 1

    def snapshot(self) -> dict[str, Any]:
        return {
            "queued": self.queued,
            "running": self.running,
            "made": self.made,
            "failed": self.failed,
            "skipped": dict(self.skipped),
            "started": dict(self.starts),
        }


@dataclass(slots=True)
class SummaryStats:
    """Counts since this process started (each replica counts its own)."""

    calls: int = 0
    failures: dict[str, int] = field(default_factory=dict)  # failed calls, by reason
    fallbacks: dict[str, int] = field(default_factory=dict)  # requests that fell back, by reason
    since: float = field(default_factory=time.time)
    background: BackgroundCounts = field(default_factory=BackgroundCounts)
    # partial stand-ins (app/compaction/summary/partial.py): the events this process chose one
    # for, and the requests one stood in for (on every replica's choice)
    partial_events: int = 0
    partial_requests: int = 0
    # forwarded requests whose compaction cut a span, by what stood for it: `summary` (its own
    # or a prefix's, cached or made for it), `pending` (none ready yet: served without),
    # `failed` (backed off after a failure, or too many waiting)
    stand_ins: dict[str, int] = field(default_factory=dict)

    def stood(self, state: str) -> None:
        self.stand_ins[state] = self.stand_ins.get(state, 0) + 1

    def failed(self, reason: str) -> None:
        self.failures[reason] = self.failures.get(reason, 0) + 1

    def fell_back(self, reason: str) -> None:
        self.fallbacks[reason] = self.fallbacks.get(reason, 0) + 1

    def snapshot(self) -> dict[str, Any]:
        """The `summaries` object of `/stats`."""
        return {
            "calls": self.calls,
            "failed_calls": sum(self.failures.values()),
            "timeouts": self.failures.get("timeout", 0) + self.fallbacks.get("deadline", 0),
            "failures": dict(self.failures),
            "fallbacks": dict(self.fallbacks),
            "since": round(self.since, 3),
            "background": self.background.snapshot(),
            "partial": {"events": self.partial_events, "requests": self.partial_requests},
            "stand_ins": dict(self.stand_ins),
        }


def _failure_of(exc: BaseException) -> str:
    cause = exc.__cause__
    if isinstance(cause, TimeoutError | UpstreamTimeout):
        return "timeout"
    if isinstance(cause, UpstreamUnavailable):
        return "unreachable"
    return "failed"


class CountedCompleter:
    """A `Completer` that counts each call and how it ended, and remembers this request's last
    call so a fallback can say why it happened.

    Built per request by the app's completer factory, it sees how the call ended without reading any
    error text: the exception's cause (`TimeoutError`/`UpstreamTimeout`: `timeout`,
    `UpstreamUnavailable`: `unreachable`), the status (`http_<status>`), or a cancellation
    (`cancelled`: the request's summary deadline passed, the client left, or the proxy shut down).
    When a request falls back, `fell_back` names why from what this request's own calls did:

    - `deadline`: the request's summary deadline (`SUMMARY_TIMEOUT`) passed;
    - the reason of the request's last failed call (`timeout`, `unreachable`, `http_<status>`);
    - `invalid_answer`: the summariser answered 2xx but with no usable summary (not a completion,
      empty, too long) — also counted as a failed call;
    - `not_attempted`: this request made no call (the span failed recently and is backed off, or
      another request's call for the same span failed).
    """

    def __init__(self, complete: Completer, stats: SummaryStats) -> None:
        self._complete = complete
        self._stats = stats
        self.calls = 0
        self.last_failure: str | None = None

    async def __call__(self, body: dict[str, Any]) -> tuple[int, bytes]:
        self.calls += 1
        self._stats.calls += 1
        try:
            status, content = await self._complete(body)
        except asyncio.CancelledError:  # the app runs on asyncio
            self._failed("cancelled")
            raise
        except SummaryFailed as exc:
            self._failed(_failure_of(exc))
            raise
        self.last_failure = f"http_{status}" if status >= 400 else None
        if self.last_failure is not None:
            self._stats.failed(self.last_failure)
        return status, content

    def _failed(self, reason: str) -> None:
        self.last_failure = reason
        self._stats.failed(reason)

    def fell_back(self, exc: BaseException) -> str:
        """Count one request's fallback to `trim` after `exc`; returns the reason."""
        if isinstance(exc, TimeoutError):
            reason = "deadline"
        elif self.last_failure is not None and self.last_failure != "cancelled":
            reason = self.last_failure
        elif self.calls:
            reason = "invalid_answer"  # the last call answered 2xx, but not with a summary
            self._stats.failed(reason)
        else:
            reason = "not_attempted"
        self._stats.fell_back(reason)
        return reason


def count_fallback(complete: Completer, exc: BaseException) -> str | None:
    """`fell_back` for a request's completer when it is counted (the app's always is)."""
    return complete.fell_back(exc) if isinstance(complete, CountedCompleter) else None


def summary_outcome(applied: Sequence[str], calls: int, fallback: str | None) -> dict[str, Any]:
    """What one request's summary was, for the preview report: `made` (by `calls` upstream
    calls), `cached` (reused: no call was needed), `fallback` (the summary failed; `why` says
    how, and `trim` stood in), or `none` (the request needed no summary)."""
    if fallback is not None:
        return {"status": "fallback", "calls": calls, "why": fallback}
    if "summarize" not in applied:
        return {"status": "none", "calls": calls}
    return {"status": "made" if calls else "cached", "calls": calls}
