"""The `summarize` strategy's async side: rolling summaries through the upstream, cached.

The pure planner decides which span a summary replaces (its cut only moves at compaction events);
here the summary for the current cut is found or made.
"""

from __future__ import annotations

import asyncio
import hashlib
import operator
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from inflight.compaction.facts import guarded, message_text
from inflight.compaction.rendering import Plan, kept_units, render_span, shown
from inflight.compaction.summary.cache import SummaryFlight
from inflight.compaction.summary.partial import Chosen, record_key
from inflight.compaction.summary.prompt import (
    Completer,
    SummaryFailed,
    SummaryPrompt,
    SummaryUsage,
    chunk_transcript,
    parse_summary,
)
from inflight.lru import BoundedLRU

TextCounter = Callable[[str], int]


def summary_budget(goal_tokens: int) -> int:
    """Tokens reserved for the summary message: a quarter of the target, 128–1,024."""
    return max(128, min(1024, goal_tokens // 4))


def model_budget(summary_tokens: int, guard: bool) -> int:
    """The tokens the model may write of a summary of `summary_tokens`: all of them, or with
    the exact-fact guard on, half (the rest, with what the model leaves, is the guard's room:
    measured in bench/RESULTS.md "Facts survive")."""
    return summary_tokens - summary_tokens // 2 if guard else summary_tokens


def kept_text(messages: Sequence[Mapping[str, Any]], plan: Plan) -> str:
    """What the prompt holds beside the summary while it stands, as the plan shows it: the
    fixed head (system prompt, first user message), pinned instructions, and the units kept
    after the cut — of them, those `messages` has (a plan predicted ahead of an event goes
    further). Between events these only grow (invariant 7): the guard leaves out what they
    hold."""
    kept = (i for i in kept_units(plan) if plan.units[i].end <= len(messages))
    return "\n".join(message_text(m) for i in kept for m in shown(messages, plan, i))


def guard(text: str, job: SummaryJob) -> str:
    """The model's `text` with the exact-fact guard's list (DESIGN.md §14) for all of the
    span `job`'s summary stands for (not only what its roll added), within the summary's
    budget, leaving out what the prompt holds beside the summary (`kept_text`)."""
    plan = job.plan
    whole = render_span(job.messages, plan, plan.head, plan.cut)
    known = kept_text(job.messages, plan)
    return guarded(text, whole, job.summary_tokens, job.count_text, known)


def gap_guard(text: str, job: SummaryJob, end: int) -> str:
    """A prefix's summary `text` standing for `job`'s whole span (a partial stand-in,
    partial.py) with the guard's list for the units it does not cover, `[end, cut)`: that
    summary's own guard left out what its prompt kept after its cut — these units, cut now."""
    plan = job.plan
    gap = render_span(job.messages, plan, end, plan.cut)
    return guarded(text, gap, job.summary_tokens, job.count_text, kept_text(job.messages, plan))


@dataclass(slots=True)
class _Chain:
    """The boundary keys of a conversation's last request, to resume from: the messages they
    hashed (held, so that the same objects prove the same content: a reused parse hands the
    next request the very objects, app/proxy/reuse.py) and, per boundary, the end of its unit,
    the hash state after it and its key."""

    messages: list[Mapping[str, Any]]
    marks: list[tuple[int, Any, str]]  # (message end, hash state after it, key), per boundary


CHAINS = 64  # conversations whose boundary keys are kept to resume from


class KeyChains:
    """The boundary keys of the last requests of a few conversations, to resume from (the
    least recently used go first); thread-safe. Owned by `Summaries`."""

    def __init__(self, size: int = CHAINS) -> None:
        self._chains: BoundedLRU[tuple[Any, ...], _Chain] = BoundedLRU(size)
        self._lock = threading.Lock()

    def get(self, whose: tuple[Any, ...]) -> _Chain | None:
        with self._lock:
            return self._chains.get(whose)

    def put(self, whose: tuple[Any, ...], chain: _Chain) -> None:
        with self._lock:
            self._chains.put(whose, chain)


def boundary_keys(
    messages: Sequence[Mapping[str, Any]],
    plan: Plan,
    model: str,
    prompt: SummaryPrompt,
    end: int | None = None,
    chains: KeyChains | None = None,
) -> list[tuple[int, str]]:
    """(b, cache key of the span of units [head, b)) for every unit boundary b after the head
    up to `end` (the plan's cut by default), oldest first.

    A key hashes everything summarised up to its boundary, so it is the same on every replica
    and changes only when the summarised content does. Every boundary has one, not only the
    cuts of compaction events: a summary made ahead of an event (of the span it was predicted
    to cut) is found by the event that cuts further, and updated from there. The keys of the
    conversation's last request (remembered in `chains`; without, every key is hashed) are
    resumed where its messages are the same objects: a long conversation hashes only what it
    adds.
    """
    end = plan.cut if end is None else end
    first = plan.units[plan.head].start if plan.head < len(plan.units) else len(messages)
    whose = (model, prompt.version, first, id(messages[first]) if first < len(messages) else 0)
    chain = chains.get(whose) if chains is not None else None
    marks: list[tuple[int, Any, str]] = []
    if chain is not None:
        marks = _resumable(chain, messages, plan, end)
    if marks:
        h = marks[-1][1].copy()
    else:
        h = hashlib.sha256(f"{model}\0{prompt.version}\0".encode())
    for b in range(plan.head + 1 + len(marks), end + 1):
        unit = plan.units[b - 1]
        for message in messages[unit.start : unit.end]:
            h.update(orjson.dumps(message, option=orjson.OPT_SORT_KEYS))
            h.update(b"\0")
        marks.append((unit.end, h.copy(), h.hexdigest()))
    if chains is not None and marks and (chain is None or len(marks) >= len(chain.marks)):
        chains.put(whose, _Chain(list(messages[: marks[-1][0]]), marks))
    return [(plan.head + 1 + i, key) for i, (_, _, key) in enumerate(marks)]


def _resumable(
    chain: _Chain, messages: Sequence[Mapping[str, Any]], plan: Plan, end: int
) -> list[tuple[int, Any, str]]:
    """The marks of `chain` that hold for `messages` and `plan` up to boundary `end`: the same
    unit ends, over the same message objects."""
    marks = chain.marks
    n = 0
    for i in range(min(len(marks), end - plan.head)):
        if marks[i][0] != plan.units[plan.head + i].end:
            break
        n = i + 1
    if not n:
        return []
    stop = marks[n - 1][0]
    if stop > len(messages) or not all(map(operator.is_, chain.messages[:stop], messages[:stop])):
        return []
    return marks[:n]


def span_keys(
    messages: Sequence[Mapping[str, Any]], plan: Plan, model: str, prompt: SummaryPrompt
) -> list[tuple[int, str]]:
    """(unit where the span ends, cache key) for each event cut, oldest first."""
    if not plan.events:
        return []
    keys = dict(boundary_keys(messages, plan, model, prompt, max(plan.events)))
    return [(cut, keys[cut]) for cut in plan.events]


@dataclass(slots=True)
class SummaryJob:
    """Everything one request's summary needs."""

    messages: Sequence[Mapping[str, Any]]
    plan: Plan
    model: str
    complete: Completer
    summary_tokens: int
    chunk_tokens: int
    count_text: TextCounter
    usage: SummaryUsage = field(default_factory=SummaryUsage)
    key: str = ""  # the cache key of the summary this job is for (set by `keys`)
    upstream: str = ""  # where its calls go (a background summary waits for it to be idle)


class Summaries:
    """Finds or makes the summary of a plan's cut span.

    A span whose summary just failed (error, garbage, or over the request's deadline) is not
    retried by every following request of the conversation — each would wait out the same
    deadline before falling back — but only after `retry_after` seconds; until then requests
    fall back to `trim` at once.

    Found from the cache (keyed by a hash of the summarised span, the model and the prompt version);
    else made by updating the newest summary cached at an earlier unit boundary — an earlier event's
    cut, or a span summarised ahead of its event — with everything cut since (one upstream call per
    event when the cache is warm); else, on a cold cache, from scratch — always in chunks that each
    fit the summariser's window. The exact-fact guard (DESIGN.md §14) then appends the span's
    identifiers the model's text lost, verbatim, within the summary's budget. Any failure — error
    status, timeout, empty or oversized answer — raises `SummaryFailed`; the request goes without
    the summary (the same cut, nothing in its place).
    """

    def __init__(
        self,
        prompt: SummaryPrompt,
        flight: SummaryFlight,
        *,
        retry_after: float = 600.0,
        max_failures: int = 10_000,
        guard: bool = True,
    ) -> None:
        """`guard`: the exact-fact guard (DESIGN.md §14) appends what the model's text lost."""
        self.prompt = prompt
        self.guard = guard
        self._flight = flight
        self._retry_after = retry_after
        self._failed: BoundedLRU[str, float] = BoundedLRU(max_failures)  # key -> when to retry
        self.chains = KeyChains()  # boundary keys resumed from a conversation's last request

    def keys(self, job: SummaryJob) -> list[tuple[int, str]]:
        """The boundary keys of `job`'s span (see `boundary_keys`); sets `job.key`, the key of
        the summary the job is for (its plan's cut)."""
        keys = boundary_keys(job.messages, job.plan, job.model, self.prompt, chains=self.chains)
        job.key = keys[-1][1]
        return keys

    async def cached(self, key: str) -> str | None:
        """The summary of `key` when it is made already."""
        return await self._flight.cached(key)

    async def standing(self, key: str) -> tuple[Chosen | None, str | None]:
        """What was chosen to stand for the span of `key` (app/compaction/summary/partial.py),
        and its own summary when made — in one cache round trip."""
        record, own = await self._flight.cached_many([record_key(key), key])
        return (None if record is None else Chosen.decode(record)), own

    async def choose(self, key: str, chosen: Chosen) -> tuple[Chosen, bool]:
        """Record `chosen` for the span of `key` unless a choice is recorded already (by
        another request or replica): the one that stands, and whether it is this one."""
        found = await self._flight.add(record_key(key), chosen.encode())
        if found is None:
            return chosen, True
        return Chosen.decode(found) or chosen, False  # a record that is none: this choice

    async def nearest(self, keys: list[tuple[int, str]]) -> tuple[int, str] | None:
        """(b, summary) of the newest summary cached at a boundary b before the last of
        `keys` (an earlier event's cut, or a span summarised ahead): one cache round trip."""
        earlier = keys[:-1]
        found = await self._flight.cached_many([key for _, key in earlier])
        for (end, _), cached in zip(reversed(earlier), reversed(found), strict=True):
            if cached is not None:
                return end, cached
        return None

    def computing(self, key: str) -> bool:
        """Whether this process is making the summary of `key` right now."""
        return self._flight.computing(key)

    def failed_recently(self, key: str) -> bool:
        """Whether the summary of `key` failed and is backed off (not retried yet)."""
        retry = self._failed.get(key)
        return retry is not None and time.monotonic() < retry

    async def summary_for(
        self, job: SummaryJob, keys: list[tuple[int, str]] | None = None, *, wait: bool = True
    ) -> str:
        """The summary of `job`'s span: cached, shared with whoever makes it, or made here.
        `wait=False` (a background summary): `SummaryBusy` when another replica makes it."""
        keys = self.keys(job) if keys is None else keys
        job.key = keys[-1][1]
        if self.failed_recently(job.key):
            raise SummaryFailed("the summary of this span failed recently; not retried yet")
        self._failed.pop(job.key)
        try:
            return await self._flight.get_or_compute(
                job.key, lambda: self._roll(job, keys), wait=wait
            )
        except SummaryFailed:
            self.mark_failed(job)
            raise

    def mark_failed(self, job: SummaryJob) -> None:
        """Remember that `job`'s summary could not be made (also after its deadline)."""
        if not job.key:
            return
        self._failed.put(job.key, time.monotonic() + self._retry_after)

    async def _roll(self, job: SummaryJob, keys: list[tuple[int, str]]) -> str:
        """The summary for the plan's cut: the newest summary cached at an earlier boundary
        (an earlier event's cut, or a span summarised ahead) updated with everything cut
        since, in as few chunks as fit the summariser — a loop, never a recursion, however
        many events the history holds. One cache round trip finds it."""
        nearest = await self.nearest(keys)
        start, previous = (job.plan.head, None) if nearest is None else nearest
        # What leaves the prompt, as the prompt showed it (pruned outputs as placeholders).
        plan = job.plan
        span = render_span(job.messages, plan, start, plan.cut)
        text = await self._summarize(job, span, previous)
        if not self.guard:
            return text
        # in a worker thread: the kept turns it searches may be long
        return await asyncio.to_thread(guard, text, job)

    async def _summarize(
        self, job: SummaryJob, span: Sequence[Mapping[str, Any]], previous: str | None
    ) -> str:
        summary = previous
        for chunk in chunk_transcript(span, job.count_text, job.chunk_tokens):
            body = {
                "model": job.model,
                "messages": [{"role": "user", "content": self.prompt.render(chunk, summary)}],
                "max_tokens": model_budget(job.summary_tokens, self.guard),
                "temperature": 0,
                "stream": False,
            }
            status, content = await job.complete(body)
            summary, usage = parse_summary(status, content, max_chars=job.summary_tokens * 8)
            # The upstream enforces max_tokens; twice the budget by our estimate means it did not.
            if job.count_text(summary) > job.summary_tokens * 2:
                raise SummaryFailed("summary far longer than its reserved budget")
            job.usage = job.usage + usage
        if summary is None:
            raise SummaryFailed("nothing to summarise")
        return summary
