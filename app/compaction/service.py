"""The compaction service: controls, window, token count, plan, and the forwarded body.

It glues the pure core (policy, counting, the planner) to a request of any wire format; no web or
HTTP client imports here.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from functools import partial
from typing import Any

from inflight.apis.chat.format import ChatFormat
from inflight.compaction.compacted import Compacted, compacted_of, ledgered, overflow_bound
from inflight.compaction.cost_mode import (
    CacheRates,
    CostRule,
    Economics,
    PrefillRateOf,
    economics,
)
from inflight.compaction.engine import compact
from inflight.compaction.job import Job, Outcome, Planning, view_of
from inflight.compaction.offload import as_received, is_heavy, offload, run_off
from inflight.compaction.policy import Budget, Controls, parse_controls, resolve_pipeline
from inflight.compaction.quiet_path import planned_later, quiet_outcome
from inflight.compaction.rendering import Plan
from inflight.compaction.replays import ReplayCache, Replays
from inflight.compaction.report import Deferred, Preview
from inflight.compaction.summary.background import BackgroundSummaries
from inflight.compaction.summary.request import (
    CompleterFactory,
    RequestSummaries,
    UpstreamOf,
)
from inflight.compaction.summary.rolling import Summaries, summary_budget
from inflight.compaction.summary.stand_in import without_summary
from inflight.compaction.wire import WireFormat
from inflight.credentials import client_identity
from inflight.errors import BadRequest
from inflight.jsontext import HistoryTexts
from inflight.settings import LedgerMode, Settings
from inflight.strategies import StrategyName, parse_strategy
from inflight.tokens.counter import TokenCounter
from inflight.windows.overflow import OverflowInfo, parse_overflow
from inflight.windows.registry import Window, WindowRegistry
from inflight.windows.silent import SILENT_SHARE, learn_silent_cut
from inflight.windows.table import anthropic_betas, output_reserve

CHAT = ChatFormat()  # the default adapter (stateless)

logger = logging.getLogger(__name__)


class CompactionService:
    """Compacts requests of any wire format for the API services, and serves the preview
    endpoints: `prepare` before a request is sent, `recover` after an overflow error.

    The `WireFormat` adapter gives the planner its view (`conversation`), the service resolves the
    window (header > setting > learned/discovered > table > fallback), counts, compacts, and the
    adapter renders the result back (`render`). It returns a `Compacted` value — the body and bytes
    to forward, the `X-Compaction-*` report headers, the numbers for the usage record — that the API
    service applies; it never touches the exchange itself.
    """

    def __init__(
        self,
        settings: Settings,
        counter: TokenCounter,
        windows: WindowRegistry,
        summaries: Summaries | None = None,
        completer_for: CompleterFactory | None = None,
        ledger: LedgerMode | None = None,
        *,
        background: BackgroundSummaries | None = None,
        summary_upstream: UpstreamOf | None = None,
        cache_rates: CacheRates | None = None,
        prefill_rate: PrefillRateOf | None = None,
    ) -> None:
        """`background` makes summaries off the request path (without it, every request waits
        for its summary, as in wait mode); `summary_upstream` names the
        upstream a summary of (model, API) goes to, whose idleness a background one waits
        for (default: the request's); `cache_rates`: what cost mode weighs, a model's dollars per
        prompt token re-read from and re-written to the cache (default: none known);
        `prefill_rate`: the prefill speed an (upstream, model)'s answers showed, for a local
        model when `INFLIGHT_PREFILL_RATE` is unset."""
        self._settings = settings
        self._cache_rates = cache_rates
        self._prefill_rate = prefill_rate
        self._counter = counter
        self._windows = windows
        self._summarizing = (
            RequestSummaries(
                settings, counter, windows, summaries, completer_for, background, summary_upstream
            )
            if summaries is not None and completer_for is not None
            else None
        )
        self._default_strategies = parse_strategy(settings.strategy, "INFLIGHT_STRATEGY")
        self._ledger = ledger if ledger is not None else settings.ledger
        # plans resume from a prefix
        self._replays: ReplayCache[Any] | None = ReplayCache(texts=counter.texts)

    @property
    def texts(self) -> HistoryTexts:
        """The last history serialised, shared with the counter and the body parser."""
        return self._counter.texts

    @property
    def background(self) -> BackgroundSummaries | None:
        """The summaries being made off the request path (None: requests wait for theirs)."""
        return self._summarizing.background if self._summarizing is not None else None

    async def plan(
        self,
        headers: Mapping[str, str],
        body: Mapping[str, Any],
        base_url: str,
        *,
        wire: WireFormat = CHAT,
        strategies: tuple[StrategyName, ...] | None = None,
        forwarding: bool = False,
    ) -> Preview:
        """Compact `body` (not changed: the preview holds the body to forward) for the model's
        window. A request the adapter says to skip is forwarded as received. `forwarding` (not
        a preview): summaries ahead of the next event may start, and background summaries wait
        for `Preview.start_background`, called right before the request is sent."""
        controls, cleaned = parse_controls({k.lower(): v for k, v in headers.items()}, body)
        model: str = cleaned["model"]
        window = await self._windows.window_for(
            model,
            base_url,
            header_limit=controls.context_limit,
            setting_limit=self._settings.context_limit,
            betas=anthropic_betas(headers),
            client=client_identity(headers),
        )
        reserve = output_reserve(cleaned, window.tokens)
        rule = self._cost_rule(model, base_url)
        cost = rule if self._for_cost(controls) else None
        budget = self._budget(controls, window.tokens, reserve, cost)
        pipeline = resolve_pipeline(
            self._strategies(controls) if strategies is None else strategies,
            summarizer_available=self._summarizing is not None,
        )
        summary_model = controls.summary_model or self._settings.summary_model or model
        job = Job(
            wire, cleaned, view_of(wire, cleaned), model, summary_model, base_url, headers,
            self._counter, *self._keeping(controls), pins=controls.pins or (),
            wait=self._waits(controls), forwarded=forwarding,
        )  # fmt: skip
        outcome, error = await self._outcome(job, pipeline, budget)
        changed = cleaned is not body
        preview = self._preview(job, outcome, error, window, reserve, changed, rule)
        if not forwarding:
            preview.start_background()
        return preview

    def _preview(
        self,
        job: Job,
        outcome: Outcome,
        error: str | None,
        window: Window,
        reserve: int,
        changed_body: bool,
        rule: CostRule | None,
    ) -> Preview:
        """The request's outcome as the report and the API service read it."""
        stand, model = outcome.stand, job.model
        return Preview(
            body=job.body,
            forwarded=outcome.forwarded,
            conversation=job.conversation,
            result=outcome.result,
            window=window.tokens,
            limit_source=str(window.source),
            reserve=reserve,
            changed_body=changed_body,
            exact=self._counter.is_exact(model),
            encoding=self._counter.encoding_name(model),
            summary_usage=outcome.usage,
            fallback=stand.why if stand is not None else None,
            summary_model=job.summary_model,
            error=error,
            summary_state=stand.state if stand is not None else None,
            starts=Deferred(tuple(job.later)),
            after=Deferred(tuple(job.after)),
            summary_covers=stand.covers if stand is not None else None,
            economics=_economics(job, outcome, rule),
        )

    async def _outcome(
        self, job: Job, pipeline: tuple[StrategyName, ...], budget: Budget
    ) -> tuple[Outcome, str | None]:
        """The pipeline's outcome, and what the request got instead if compaction failed."""
        if job.conversation.skip is not None:
            logger.info("forwarding %s as received: %s", job.model, job.conversation.skip)
            return await self._counted(job, budget), None
        try:
            return await self._compact(job, pipeline, budget), None
        except BadRequest:
            raise  # the adapter's verdict: a body it cannot rewrite safely (400 naming why)
        except Exception as exc:  # any compaction bug: fall back, never a 500
            logger.exception("compaction failed for %s, falling back to trim", job.model)
            return await self._fallback(exc, job, pipeline, budget)

    async def _counted(self, job: Job, budget: Budget) -> Outcome:
        """A request forwarded as received: counted for the report and the usage record, never
        compacted (counts of 0 if even counting fails)."""
        messages = job.conversation.messages
        try:
            fixed = await offload(messages, job.count_fixed, self.texts)
            counted = partial(compact, messages, (), budget, job.count, fixed)
            return Outcome(await offload(messages, counted, self.texts), job.body)
        except Exception:
            logger.exception("counting failed for %s; reported as 0 tokens", job.model)
            return Outcome(as_received(messages), job.body)

    async def _fallback(
        self, exc: Exception, job: Job, pipeline: tuple[StrategyName, ...], budget: Budget
    ) -> tuple[Outcome, str]:
        """After an unexpected error in compaction: plain `trim` (nothing when the request asked
        for no compaction), or if that fails too, the messages as received. The string says what
        the request got and why."""
        why = f"{type(exc).__name__} in compaction"
        trimmed: tuple[StrategyName, ...] = ("trim",) if pipeline else ()
        try:
            fixed = job.count_fixed()
            compaction = partial(
                compact, job.conversation.messages, trimmed, budget, job.count, fixed,
                protect=job.protect, restore=job.restore, pins=job.pins,
            )  # fmt: skip
            texts = self.texts
            outcome = job.rendered(await offload(job.conversation.messages, compaction, texts))
        except Exception:
            logger.exception(
                "trim failed too for %s; forwarding the messages as received", job.model
            )
            return Outcome(as_received(job.conversation.messages), job.body), f"none: {why}"
        return outcome, f"{trimmed[0] if trimmed else 'none'}: {why}"

    async def _compact(
        self, job: Job, pipeline: tuple[StrategyName, ...], budget: Budget
    ) -> Outcome:
        """Run the pipeline. A forwarded request under the trigger as a whole goes as received
        without a plan, the plan it would have made made after its answer (the quiet path,
        app/compaction/quiet_path.py)."""
        messages = job.conversation.messages
        heavy = is_heavy(messages, self._replays, self.texts)
        replays = self._remembered(job.model)
        summarizing = self._summarizing if "summarize" in pipeline else None
        planning = Planning.of(job, pipeline, budget, replays, summarizing is not None)
        if job.forwarded and not heavy:
            quiet = quiet_outcome(job, budget, summarizing)
            if quiet is not None:
                if replays is not None:  # the replay this request's plan remembers, later
                    heavy_now = partial(is_heavy, messages, self._replays, self.texts)
                    job.after.append(planned_later(replays, heavy_now, planning.remembered))
                return quiet
        if summarizing is None:  # counting, planning and rendering: one hop
            return await run_off(heavy, lambda: job.rendered(planning.compact(job.count_fixed())))
        return await self._summarized(planning, summarizing, heavy)

    async def _summarized(
        self,
        planning: Planning,
        summarizing: RequestSummaries,
        heavy: bool,
    ) -> Outcome:
        """The pipeline with `summarize`: the cut is the plan's whatever the summary's state:
        the summary stands for the cut span when it is cached (or, in wait mode, made for
        this request), else nothing does (DESIGN.md §12). `heavy`: its work runs in a worker
        thread (`is_heavy`)."""
        job, budget, replays = planning.job, planning.budget, planning.replays
        off = partial(run_off, heavy)  # where its work runs, once

        def planned() -> tuple[int, Plan]:
            fixed = job.count_fixed()
            return fixed, planning.plan(job.conversation.messages, job.count, fixed, replays)

        fixed, the_plan = await off(planned)
        compaction = partial(
            planning.compact, fixed, summary_tokens=planning.stand_in, planned=the_plan
        )
        asked = job.asked()
        reserved = summary_budget(budget.goal)
        # the next event's prediction: the same inputs, resuming this plan's replay (read only)
        peek = replays.peeking() if replays is not None else None
        predict = partial(planning.plan, fixed=fixed, memory=peek)
        await summarizing.ahead(asked, the_plan, predict, budget, reserved)
        if not the_plan.summarize:
            return await off(lambda: job.rendered(compaction(summary="")))
        summary = await summarizing.job(asked, the_plan, reserved)
        stand = await summarizing.stand_in(asked, summary)

        def stood_in() -> Outcome:
            result = compaction(summary=stand.text)
            if stand.text is None:
                result = without_summary(
                    result, planning.pipeline, planning.stand_in, budget, job.count,
                    marked=job.marked,
                )  # fmt: skip
            return job.rendered(result, summary.usage, stand)

        return await off(stood_in)

    def _remembered(self, model: str) -> Replays | None:
        """The replay cache as `model`'s plans use it (keyed by its counter's state too)."""
        if self._replays is None:
            return None
        return Replays(self._replays, partial(self._counter.counting, model))

    def _budget(
        self, controls: Controls, window: int, reserve: int, cost: CostRule | None
    ) -> Budget:
        threshold = controls.threshold or self._settings.threshold
        target = min(controls.target or self._settings.target, threshold)
        return Budget(window, reserve, threshold, target, cost)

    def _for_cost(self, controls: Controls) -> bool:
        """Whether cost mode is on (DESIGN.md §16): header or body, else the setting."""
        on = controls.for_cost
        return self._settings.compact_for_cost if on is None else on

    def _cost_rule(self, model: str, base_url: str) -> CostRule | None:
        """What a prompt token of `model` costs to re-read and to re-write: its prices, else
        (a local model) prefill time at `INFLIGHT_PREFILL_RATE`, else at the rate its answers
        from `base_url` showed; None when none is known."""
        floor = self._settings.cost_min_prompt
        rates = self._cache_rates(model) if self._cache_rates is not None else None
        if rates is not None:
            return CostRule.priced(*rates, floor)
        rate = self._settings.prefill_rate
        if rate is None and self._prefill_rate is not None:
            rate = self._prefill_rate(base_url, model)
        return CostRule.prefill(rate, floor) if rate is not None else None

    def _waits(self, controls: Controls) -> bool:
        """Whether a compaction event of this request waits for its summary (wait mode)."""
        wait = controls.summary_wait
        return self._settings.summary_wait if wait is None else wait

    def forget_replays(self) -> None:
        """Plan every request from its first message (the benchmark's "before")."""
        self._replays = None

    def _keeping(self, controls: Controls) -> tuple[frozenset[str], bool]:
        """The protected tools and whether restore is on (DESIGN.md §11): header, else setting."""
        protect = controls.protect_tools
        if protect is None:
            protect = frozenset(self._settings.protect_tools)
        restore = self._settings.restore if controls.restore is None else controls.restore
        return protect, restore

    def _strategies(self, controls: Controls) -> tuple[StrategyName, ...] | None:
        if controls.strategies is not None:
            return controls.strategies
        return self._default_strategies

    async def prepare(
        self, wire: WireFormat, headers: Mapping[str, str], body: Mapping[str, Any], base_url: str
    ) -> Compacted:
        """What to forward for `body` (a request as received, parsed)."""
        return await self._forwarded(
            wire, await self.plan(headers, body, base_url, wire=wire, forwarding=True), headers
        )

    async def _forwarded(
        self, wire: WireFormat, preview: Preview, headers: Mapping[str, str]
    ) -> Compacted:
        """What to forward for `preview`, with its ledger id; its background summaries start,
        and there is no await from there until the caller sends the request."""
        compacted = compacted_of(wire, preview, self._settings.on_overflow)
        compacted = replace(compacted, client=client_identity(headers))
        if self._ledger is not LedgerMode.OFF:
            full = self._ledger is LedgerMode.FULL
            compacted = await ledgered(preview, compacted, self._counter, full)
        preview.start_background()
        return compacted

    def learn(
        self,
        wire: WireFormat,
        body: Mapping[str, Any],
        failed: Compacted,
        overflow: tuple[str, int, bytes],
    ) -> OverflowInfo | None:
        """What an upstream overflow error (`overflow`: base URL, status, body) on what `failed`
        sent teaches, taken in: the window it states — or, stating no number, the bound what
        failed sets — and the prompt size it states (recalibrates the counter). None when it is
        no overflow or teaches nothing. Also after a stream that reported it once started."""
        base_url, status, content = overflow
        info = parse_overflow(status, content)
        if info is not None and info.window is None and info.prompt_tokens is None:
            info = overflow_bound(wire, body, failed)
        if info is None:
            return None
        model: str = body["model"]
        if info.window is not None:
            self._windows.learn(base_url, model, info.window)
        if info.prompt_tokens is not None:
            self._counter.observe(
                model, failed.view, info.prompt_tokens, overflowed=True, client=failed.client
            )
        return info

    async def recover(
        self,
        wire: WireFormat,
        headers: Mapping[str, str],
        body: Mapping[str, Any],
        failed: Compacted,
        overflow: tuple[str, int, bytes],
    ) -> Compacted | None:
        """After an upstream overflow error (`overflow`: base URL, status, body) on `failed`:
        learn the window it states, recalibrate the counter on the prompt size it states
        (DESIGN.md §8), and compact `body` (as received) again. A new `Compacted` (retry once)
        only when that changes what is sent: the same prompt would fail the same way."""
        base_url = overflow[0]
        info = self.learn(wire, body, failed, overflow)
        if info is None:
            return None
        model: str = body["model"]
        preview = await self.plan(headers, body, base_url, wire=wire, forwarding=True)
        if info.window is not None and info.window < preview.window:
            logger.warning(
                "upstream says %s holds %d tokens, but the %s limit of %d wins",
                model, info.window, preview.limit_source, preview.window,
            )  # fmt: skip
        if preview.forwarded == failed.body:
            logger.info("upstream overflow for %s: nothing more to cut, relaying it", model)
            return None
        logger.info(
            "upstream overflow for %s (window %s, prompt %s tokens): retrying with %d",
            model, info.window, info.prompt_tokens, preview.result.tokens_after,
        )  # fmt: skip
        return await self._forwarded(wire, preview, headers)

    def upstream_truncated(
        self, model: str, sent: Compacted, base_url: str, reported: int | None
    ) -> bool:
        """Whether the upstream cut what was `sent` silently, by the prompt tokens it
        `reported` (DESIGN.md §11); if so, the window it holds is learned (for the client that
        sent it) and logged. Guessed parts (images, documents) are left out of the estimate."""
        measured = sent.tokens_after
        if reported is not None and reported < SILENT_SHARE * measured:  # else no cut anyway
            measured -= self._counter.guessed_tokens(model, sent.view)
        estimate = (measured, sent.context_limit)
        trusted = self._counter.is_exact(model) or model in self._counter.calibration_factors()
        return learn_silent_cut(
            self._windows, base_url, model, reported, estimate, trusted, sent.client
        )


def _economics(job: Job, outcome: Outcome, rule: CostRule | None) -> Economics | None:
    """What this request's cut costs and saves (DESIGN.md §16); None when nothing was cut or
    the model has no price (nor a prefill rate)."""
    result = outcome.result
    plan = result.plan
    if rule is None or not result.applied or not plan.units:
        return None
    end = plan.units[plan.head - 1].end if plan.head else 0
    head = job.count_fixed() + sum(job.count(m) for m in job.conversation.messages[:end])
    return economics(rule, result.tokens_before, result.tokens_after, head)
