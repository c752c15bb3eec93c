"""The summary a request's compaction event needs (DESIGN.md §12): cached, waited for (wait
mode), or made in the background while the request is served without it or with the summary
of a prefix of its span (partial.py); and, near the threshold, the summaries of the spans the
next event is likeliest to cut, started ahead of it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any
from urllib.parse import urlsplit

import orjson

from inflight.compaction.offload import offload
from inflight.compaction.policy import Budget
from inflight.compaction.rendering import Plan
from inflight.compaction.report import SummaryState
from inflight.compaction.summary.ahead import Replan, next_events
from inflight.compaction.summary.background import BackgroundSummaries
from inflight.compaction.summary.partial import OWN, Chosen, covered
from inflight.compaction.summary.prompt import Completer, SummaryFailed
from inflight.compaction.summary.rolling import Summaries, SummaryJob, boundary_keys, gap_guard
from inflight.compaction.summary.stats import count_fallback
from inflight.compaction.unit_costs import MessageCounter
from inflight.compaction.units import head_end
from inflight.compaction.wire import ApiName
from inflight.lru import BoundedLRU, weigh_strings
from inflight.settings import Settings
from inflight.tokens.counter import TokenCounter
from inflight.windows.registry import WindowRegistry

# (summary model, the client's headers, the client's API) -> where summaries are asked
CompleterFactory = Callable[[str, Mapping[str, str], ApiName], Completer]
# (summary model, the client's API) -> the base URL of the upstream its summaries go to
UpstreamOf = Callable[[str, ApiName], str]
PROMPT_OVERHEAD = 700  # the summary prompt's own instructions, in tokens
# A conversation's next event is predicted again once it grew by this share of the way from
# the goal to the trigger (or its cuts moved); conversations remembered for that, at most:
PREDICT_STEP = 1 / 16
PREDICTED_CONVERSATIONS = 4096
PREDICTED_BYTES = 4 * 1024 * 1024  # their keys (a client-chosen summary model name)

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StandIn:
    """What stands for a request's cut span: the summary text (None: nothing), its state for
    `X-Compaction-Summary`, why it failed when it did, and the share of the span's tokens the
    summary covers when it is a prefix's (partial.py)."""

    text: str | None
    state: SummaryState
    why: str | None = None
    covers: float | None = None


@dataclass(frozen=True, slots=True)
class Asked:
    """One request's side of a summary: its history, and where and how to ask for it."""

    messages: Sequence[Mapping[str, Any]]
    model: str  # the request's own model
    summary_model: str
    base_url: str
    headers: Mapping[str, str]
    api: ApiName
    count: MessageCounter
    wait: bool  # the request waits for its summary (wait mode)
    # it is forwarded (not a preview, which only looks): summaries ahead of its next event may
    # start, and the stand-in chosen for its span is recorded
    forwarded: bool = True
    # Background summaries this request starts, once its compaction is done: its own upstream
    # request is in flight by the time they look whether that upstream is idle.
    later: list[Callable[[], object]] = field(default_factory=list)
    # What starts once its answer is on its way (the next event's prediction, see `ahead`).
    after: list[Callable[[], object]] = field(default_factory=list)


class RequestSummaries:
    """Finds the summary for a request's cut span, and starts the ones ahead of it."""

    def __init__(
        self,
        settings: Settings,
        counter: TokenCounter,
        windows: WindowRegistry,
        summaries: Summaries,
        completer_for: CompleterFactory,
        background: BackgroundSummaries | None = None,
        upstream_of: UpstreamOf | None = None,
    ) -> None:
        self._settings = settings
        self._counter = counter
        self._windows = windows
        self._summaries = summaries
        self._completer_for = completer_for
        self.background = background
        self._upstream_of = upstream_of
        # per conversation (model, head, cuts): its size when its next event was last predicted
        self._predicted: BoundedLRU[tuple[Any, ...], int] = BoundedLRU(
            PREDICTED_CONVERSATIONS, PREDICTED_BYTES, weigh_strings
        )

    async def job(self, asked: Asked, the_plan: Plan, reserved: int) -> SummaryJob:
        """What making the summary of `the_plan`'s cut span takes."""
        window = await self._windows.window_for(asked.summary_model, asked.base_url)
        return SummaryJob(
            messages=asked.messages,
            plan=the_plan,
            model=asked.summary_model,
            complete=self._completer_for(asked.summary_model, asked.headers, asked.api),
            summary_tokens=reserved,
            chunk_tokens=max(256, window.tokens - 2 * reserved - PROMPT_OVERHEAD),
            count_text=partial(self._counter.count_text, asked.summary_model),
            upstream=self._summary_upstream(asked),
        )

    def _summary_upstream(self, asked: Asked) -> str:
        """The base URL of the upstream `asked`'s summaries go to (default: the request's)."""
        upstream_of = self._upstream_of
        return upstream_of(asked.summary_model, asked.api) if upstream_of else asked.base_url

    async def ahead(
        self,
        asked: Asked,
        the_plan: Plan,
        replan: Replan,
        budget: Budget,
        reserved: int,
    ) -> None:
        """Near the threshold (`SUMMARY_AHEAD`), start summarising the spans the next event
        is likeliest to cut (`SUMMARY_AHEAD_CUTS` of them), in the background: the event then
        finds its summary made, or a prefix of it that a rolling update extends. At most twice
        that many are in the making per conversation; a prediction that moves on starts only
        the spans not in the making already (a rolling update from the nearest one made)."""
        background = self.background
        if background is None or not asked.forwarded:
            return
        if not self.looks_ahead(the_plan.tokens_after, budget, asked.wait):
            return
        if self._predicted_lately(asked, the_plan, budget):
            return
        predict = partial(self._predict, background, asked, the_plan, replan, budget, reserved)
        start = partial(background.predict, predict)
        (asked.later if self._predicts_at_once(asked) else asked.after).append(start)

    def looks_ahead(self, tokens: int, budget: Budget, wait: bool) -> bool:
        """Whether a forwarded request of `tokens` (after compaction) starts summaries ahead
        of its next event: it is near the threshold (`SUMMARY_AHEAD`), and summaries are made
        in the background (not in wait mode, `wait`)."""
        if self.background is None or wait:
            return False
        return tokens >= self._settings.summary_ahead * budget.budget

    def keeps_still(
        self, messages: Sequence[Mapping[str, Any]], summary_model: str, tokens: int,
        budget: Budget, wait: bool,
    ) -> bool:  # fmt: skip
        """Whether `ahead` starts nothing for a forwarded request of `messages` whose plan
        keeps them all, at `tokens`: it is not near the threshold (`looks_ahead`), or its
        conversation's next event was predicted lately (`_predicted_lately`). Read only."""
        if not self.looks_ahead(tokens, budget, wait):
            return True
        head = head_end(messages)  # a plan that keeps everything cuts nothing past its head
        key = self._prediction_key(summary_model, messages, head, head, ())
        return key is not None and self._lately(key, tokens, budget)

    def _predicted_lately(self, asked: Asked, the_plan: Plan, budget: Budget) -> bool:
        """Whether this conversation's next event was predicted at a request less than
        `PREDICT_STEP` of the way from the goal to the trigger before this one, with the same
        cuts so far: a prediction grows the conversation by turns like its last one, so one
        message more changes little, and predicting is an event's work. A conversation of big
        turns (a tool round of a few thousand tokens) is predicted at every request; one of
        many small messages at every few. If not, this request's prediction is remembered."""
        units = the_plan.units
        head = units[the_plan.head - 1].end if the_plan.head else 0
        cut = units[the_plan.cut - 1].end if the_plan.cut else 0
        key = self._prediction_key(asked.summary_model, asked.messages, head, cut, the_plan.events)
        now = the_plan.tokens_after
        if key is None:
            return False
        if self._lately(key, now, budget):
            return True
        self._predicted.put(key, now)
        return False

    @staticmethod
    def _prediction_key(
        summary_model: str,
        messages: Sequence[Mapping[str, Any]],
        head: int,
        cut: int,
        events: tuple[Any, ...],
    ) -> tuple[Any, ...] | None:
        """A conversation's predictions, by its head's messages (it ends at message `head`)
        and what its plan cut so far (up to message `cut`, at `events`); None when its head
        is not plain JSON."""
        try:
            start = orjson.dumps(list(messages[: max(head, 1)]))
        except TypeError:
            return None
        return (summary_model, hash(start), cut, events)

    def _lately(self, key: tuple[Any, ...], now: int, budget: Budget) -> bool:
        """Whether the prediction remembered under `key` was made less than `PREDICT_STEP`
        of the way from the goal to the trigger before `now` tokens."""
        last = self._predicted.get(key)
        step = max(1, int(PREDICT_STEP * (budget.trigger - budget.goal)))
        return last is not None and last <= now < last + step

    def _predicts_at_once(self, asked: Asked) -> bool:
        """Whether the next event's prediction starts with the request rather than after its
        answer: when the summaries it starts need not wait for the request's upstream to go
        idle (`SUMMARY_WHEN_IDLE=false`, or summaries go to another upstream). Otherwise they
        could not start before the answer anyway, and planning them then takes nothing from
        the answer's way on a busy event loop."""
        if not self._settings.summary_when_idle:
            return True
        return _server(self._summary_upstream(asked)) != _server(asked.base_url)

    async def _predict(
        self,
        background: BackgroundSummaries,
        asked: Asked,
        the_plan: Plan,
        replan: Replan,
        budget: Budget,
        reserved: int,
    ) -> None:
        """Plan the next event's likeliest cuts and start the summaries of their spans."""
        summaries = self._summaries
        cuts = self._settings.summary_ahead_cuts
        predict = partial(
            next_events, asked.messages, the_plan, replan, budget.trigger, asked.count, cuts
        )
        plans = await offload(asked.messages, predict, self._counter.texts)
        if not plans:
            return
        jobs = [await self.job(asked, nxt, reserved) for nxt in plans]
        groups = [(job, summaries.keys(job)) for job in jobs]
        # every span of this conversation past its cut that may be in the making: a prefix of
        # what it has sent
        sent = boundary_keys(
            asked.messages, the_plan, asked.summary_model, summaries.prompt,
            len(the_plan.units), summaries.chains,
        )  # fmt: skip
        making = sum(1 for end, key in sent if end > the_plan.cut and background.pending(key))
        start: list[tuple[SummaryJob, list[tuple[int, str]]]] = []
        for job, keys in groups:
            if len(start) + making >= 2 * cuts:
                break  # bounded per conversation: the ones in the making are enough
            if background.pending(job.key) or summaries.failed_recently(job.key):
                continue
            if await summaries.cached(job.key) is None:
                start.append((job, keys))
        if start:
            background.submit_ahead(start)

    async def stand_in(self, asked: Asked, job: SummaryJob) -> StandIn:
        """The summary of `job`'s span for this request: cached (its own, or the partial
        stand-in chosen for it); else, in wait mode, made now; else being made in the
        background (`pending`) — or `failed`, backed off. Counted when forwarded."""
        stand = await self._stand_in(asked, job)
        if asked.forwarded and self.background is not None:
            self.background.stats.stood("summary" if stand.text is not None else stand.state)
        return stand

    async def _stand_in(self, asked: Asked, job: SummaryJob) -> StandIn:
        summaries, background = self._summaries, self.background
        keys = summaries.keys(job)
        if asked.wait or background is None:
            cached = await summaries.cached(job.key)
            if cached is not None:
                return StandIn(cached, "cached")
            return await self._waited(job, keys, asked.model)
        chosen: Chosen | None = OWN
        if self._settings.summary_partial < 1:
            chosen, own = await summaries.standing(job.key)
            if chosen is None and own is None:
                chosen = await self._choose(asked, job, keys)
        else:
            own = await summaries.cached(job.key)
        if chosen is not None and chosen.partial:
            if own is None and not summaries.failed_recently(job.key):
                self._later(asked, job, keys)  # the next event's rolling update starts from it
            if asked.forwarded:
                background.stats.partial_requests += 1
            return StandIn(chosen.summary, "cached", covers=chosen.covers)
        if own is not None:
            return StandIn(own, "cached")
        if summaries.failed_recently(job.key):
            why = "the summary of this span failed recently; not retried yet"
            count_fallback(job.complete, SummaryFailed(why))
            return StandIn(None, "failed", why)
        if not self._later(asked, job, keys):
            return StandIn(None, "failed", "too many summaries waiting to be made")
        return StandIn(None, "pending")

    async def _choose(self, asked: Asked, job: SummaryJob, keys: list[tuple[int, str]]) -> Chosen:
        """What stands for `job`'s span, whose own summary is not made: the newest summary
        cached of a prefix of it when that prefix holds `SUMMARY_PARTIAL` of its tokens, else
        its own summary (once made). Recorded unless this is a preview; the first choice
        recorded (by any request, on any replica) is the one that stands."""
        chosen = OWN
        nearest = await self._summaries.nearest(keys)
        if nearest is not None:
            end, summary = nearest
            share = covered(asked.messages, job.plan, end, asked.count)
            if share >= self._settings.summary_partial:
                if self._summaries.guard:  # the facts of what it does not cover (a thread:
                    summary = await asyncio.to_thread(gap_guard, summary, job, end)  # long)
                chosen = Chosen(summary, share)
        if not asked.forwarded:
            return chosen
        kept, recorded = await self._summaries.choose(job.key, chosen)
        if recorded and chosen.partial and self.background is not None:
            self.background.stats.partial_events += 1
        return kept

    def _later(self, asked: Asked, job: SummaryJob, keys: list[tuple[int, str]]) -> bool:
        """Have `job`'s summary made in the background once this request is compacted; False
        when it cannot be (too many waiting)."""
        background = self.background
        if background is None or (background.full() and not background.pending(job.key)):
            return False
        asked.later.append(partial(background.submit, job, keys))
        return True

    async def _waited(self, job: SummaryJob, keys: list[tuple[int, str]], model: str) -> StandIn:
        """Wait mode: the summary made for this request, bounded by `SUMMARY_TIMEOUT`."""
        deadline = self._settings.summary_timeout
        try:
            async with asyncio.timeout(deadline):
                return StandIn(await self._summaries.summary_for(job, keys), "ready")
        except (SummaryFailed, TimeoutError) as exc:
            if isinstance(exc, TimeoutError):
                self._summaries.mark_failed(job)
            why = str(exc) if isinstance(exc, SummaryFailed) else f"summary took over {deadline:g}s"
            reason = count_fallback(job.complete, exc)  # counted in /stats and /metrics
            logger.warning("summary failed (%s) for %s, none stands in: %s", reason, model, why)
            return StandIn(None, "failed", why)


def _server(url: str) -> tuple[str, str]:
    """The scheme and host:port of `url` (one upstream server, whatever the path)."""
    parts = urlsplit(url)
    return parts.scheme, parts.netloc.rpartition("@")[2]
