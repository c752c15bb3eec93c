"""Summaries made off the request path (DESIGN.md §12): a bounded registry of background tasks."""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

from inflight.compaction.summary.cache import SummaryBusy
from inflight.compaction.summary.prompt import SummaryFailed, SummaryUsage
from inflight.compaction.summary.rolling import Summaries, SummaryJob
from inflight.compaction.summary.stats import CountedCompleter, SummaryStats

logger = logging.getLogger(__name__)

IDLE_POLL = 0.05  # seconds between looks at a busy upstream
IDLE_SETTLE = 0.1  # seconds an upstream stays idle before a summary starts on it


class BackgroundSummaries:
    """Makes summaries in background tasks; `submit` never waits.

    A request never waits for a summary made here: it is served without it (`pending`), and the
    summary stands in from the first request after it is cached. The work is bounded: one task per
    span (`key`) in this process, and across replicas the cache's lock (a replica that finds the
    span locked leaves it to the holder); at most `concurrency` summaries run at once, at most
    `max_tasks` wait. On an upstream that serves one request at a time (`gated`) a summary prefers a
    moment with no client request in flight (`idle`), but waits for one at most `idle_wait` seconds
    and then runs anyway, so sustained load cannot starve it. Once started it runs to completion;
    only `aclose` (shutdown) cancels it. No exception is lost.
    """

    def __init__(
        self,
        summaries: Summaries,
        *,
        concurrency: int = 1,
        idle: Callable[[str], bool] | None = None,
        idle_wait: float = 2.0,
        gated: Callable[[str], Awaitable[bool]] | None = None,
        max_tasks: int = 1_000,
        on_usage: Callable[[SummaryJob], None] | None = None,
        stats: SummaryStats | None = None,
    ) -> None:
        self._summaries = summaries
        self._slots = _Slots(concurrency)
        self._idle = idle
        self._idle_wait = idle_wait
        self._gated = gated
        self._max_tasks = max_tasks
        self._on_usage = on_usage
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._waiting: dict[str, bool] = {}  # key -> made ahead of its event, until it starts
        self._since: dict[str, float] = {}  # key -> when its conversation's summary began to wait
        self._started: set[str] = set()
        self._predicting: set[asyncio.Task[None]] = set()  # next events being worked out
        self._closing = False
        self.stats = stats if stats is not None else SummaryStats()
        self.counts = self.stats.background

    def pending(self, key: str) -> bool:
        """Whether the summary of `key` is being made (or waits to be) in this process."""
        return key in self._tasks or self._summaries.computing(key)

    @property
    def predicting(self) -> int:
        """How many next events are being worked out (their summaries not submitted yet)."""
        return len(self._predicting)

    def full(self) -> bool:
        """Whether no more summaries may wait."""
        return len(self._tasks) >= self._max_tasks

    def submit(
        self,
        job: SummaryJob,
        keys: list[tuple[int, str]],
        *,
        ahead: bool = False,
        keep: frozenset[str] = frozenset(),
    ) -> bool:
        """Start making `job`'s summary (its boundary `keys`, the last one its own) unless it
        is being made already; `ahead`: of a span predicted for the next event. False when it
        was not taken (too many waiting).

        A waiting summary of a shorter span of the same conversation (a prefix of this one) is
        superseded: the conversation has moved on, and this one's rolling update covers it.
        Not a span a request needs now for one predicted ahead, though, nor one of `keep`
        (the other spans predicted with this one)."""
        key = keys[-1][1]
        if self.pending(key):
            return True
        since = time.monotonic()
        for _, shorter in keys[:-1]:
            was_ahead = self._waiting.get(shorter)
            if shorter in keep:
                continue
            if was_ahead is not None and (was_ahead or not ahead):
                del self._waiting[shorter]
                self._tasks[shorter].cancel()
                self.counts.skip("superseded")
                # the conversation has waited since then: superseding never restarts the wait
                since = min(since, self._since.get(shorter, since))
        if self.full():
            self.counts.skip("full")
            return False
        self.counts.queued += 1
        self._waiting[key] = ahead
        self._since[key] = since
        task = asyncio.create_task(self._run(job, keys), name=f"summary {key[:12]}")
        self._tasks[key] = task
        task.add_done_callback(partial(self._done, key))
        return True

    def submit_ahead(self, jobs: list[tuple[SummaryJob, list[tuple[int, str]]]]) -> None:
        """Start the summaries of the spans predicted for a conversation's next event, the
        likeliest first; none of them supersedes another (see `submit`)."""
        keep = frozenset(keys[-1][1] for _, keys in jobs)
        for job, keys in jobs:
            self.submit(job, keys, ahead=True, keep=keep)

    def predict(self, work: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run `work` (a conversation's next event worked out, its spans submitted) in a task
        of its own that no request waits for; at most `max_tasks` at once, cancelled at
        shutdown, a failure logged and counted."""
        if self._closing or len(self._predicting) >= self._max_tasks:
            self.counts.skip("full")
            return
        task = asyncio.create_task(work(), name="summaries ahead")
        self._predicting.add(task)
        task.add_done_callback(self._predicted)

    def _predicted(self, task: asyncio.Task[None]) -> None:
        self._predicting.discard(task)
        if not task.cancelled() and task.exception() is not None:  # not lost: logged, counted
            self.counts.failed += 1
            self.stats.failed("error")
            logger.error("predicting the next event failed", exc_info=task.exception())

    async def _run(self, job: SummaryJob, keys: list[tuple[int, str]]) -> None:
        key = keys[-1][1]
        since = self._since.get(key, time.monotonic())
        async with self._slots.taken(since):
            await self._until_idle(job.upstream, since)
            self._waiting.pop(key, None)
            self._started.add(key)
            self.counts.queued -= 1
            self.counts.running += 1
            try:
                await self._make(job, keys)
            finally:
                self.counts.running -= 1

    def _done(self, key: str, task: asyncio.Task[None]) -> None:
        """A task ended (made, skipped, failed, cancelled — maybe before it ever ran)."""
        del self._tasks[key]
        self._waiting.pop(key, None)
        self._since.pop(key, None)
        if key in self._started:
            self._started.discard(key)
        else:
            self.counts.queued -= 1
        if task.cancelled():
            if self._closing:
                self.counts.skip("shutdown")
        elif task.exception() is not None:  # not lost: logged and counted
            self.counts.failed += 1
            self.stats.failed("error")
            logger.error("background summary task failed", exc_info=task.exception())

    async def _until_idle(self, upstream: str, since: float) -> None:
        """On a gated upstream, wait (at most `idle_wait`) until it has had no client request
        in flight for a moment (`IDLE_SETTLE`): an upstream goes idle as its answer leaves it,
        while the answer is still on its way to the client, whose next request (an agent's tool
        round) may follow at once; a summary started in that gap would queue in front of it.
        The wait runs from `since` (its conversation's first summary submitted). Counted:
        `immediate` (not gated, or idle at once), `waited`, `forced` (ran busy)."""
        idle = self._idle
        if idle is None or (self._gated is not None and not await self._gated(upstream)):
            self.counts.started("immediate")
            return
        start = time.monotonic()
        deadline = since + self._idle_wait  # waiting for a slot counts too
        quiet_since: float | None = None
        while True:
            now = time.monotonic()
            if not idle(upstream):
                quiet_since = None
            elif quiet_since is None:
                quiet_since = now
            elif now - quiet_since >= IDLE_SETTLE:
                self.counts.started("waited" if quiet_since > start else "immediate")
                return
            if now >= deadline:
                self.counts.started("forced")
                return
            await asyncio.sleep(IDLE_POLL)

    async def _make(self, job: SummaryJob, keys: list[tuple[int, str]]) -> None:
        """One summary, every ending accounted for: made, made elsewhere, failed (counted and
        backed off), or a bug (logged with its traceback, counted, backed off)."""
        try:
            await self._summaries.summary_for(job, keys, wait=False)
            self.counts.made += 1
        except SummaryBusy:
            self.counts.skip("elsewhere")
        except SummaryFailed as exc:  # counted by the completer, backed off by `Summaries`
            self.counts.failed += 1
            complete = job.complete
            if isinstance(complete, CountedCompleter) and _answered(complete):
                self.stats.failed("invalid_answer")  # 2xx, but no usable summary
            logger.warning("background summary for %s failed: %s", job.model, exc)
        except Exception:
            self.counts.failed += 1
            self.stats.failed("error")
            self._summaries.mark_failed(job)
            logger.exception("background summary for %s failed", job.model)
        finally:
            if self._on_usage is not None and job.usage != SummaryUsage():
                self._on_usage(job)

    async def aclose(self) -> None:
        """Cancel every background summary (shutdown) and wait until they have ended."""
        self._closing = True
        tasks = [*self._tasks.values(), *self._predicting]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class _Slots:
    """At most `n` summaries at once, handed out oldest wait first (`since`), so a summary
    superseded by its conversation's longer one keeps its place in the line: under load a
    fast conversation would otherwise go to the back on every event and never get one."""

    def __init__(self, n: int) -> None:
        self._free = n
        self._line: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = 0

    @asynccontextmanager
    async def taken(self, since: float) -> AsyncIterator[None]:
        if self._free > 0 and not self._line:
            self._free -= 1
        else:
            self._order += 1
            ticket = (since, self._order, asyncio.get_running_loop().create_future())
            heapq.heappush(self._line, ticket)
            try:
                await ticket[2]
            except asyncio.CancelledError:
                if ticket[2].done() and not ticket[2].cancelled():
                    self._release()  # handed a slot as it was cancelled: pass it on
                elif ticket in self._line:
                    self._line.remove(ticket)
                    heapq.heapify(self._line)
                raise
        try:
            yield
        finally:
            self._release()

    def _release(self) -> None:
        while self._line:
            _, _, waiter = heapq.heappop(self._line)
            if not waiter.done():
                waiter.set_result(None)  # the slot passes straight to the oldest waiter
                return
        self._free += 1


def _answered(complete: CountedCompleter) -> bool:
    """Whether the summariser's last call answered 2xx (the summary failed on its content)."""
    return complete.calls > 0 and complete.last_failure is None
