"""The compaction service: controls, window, token count, plan, and the forwarded body.

It glues the pure core (policy, counting, the planner) to a request of any wire format: the
`WireFormat` adapter gives the planner its view (`conversation`), the service resolves the window
(header > setting > learned/discovered > table > fallback), counts, compacts, and the adapter
renders the result back (`render`). It returns a `Compacted` value — the body and bytes to
forward, the `X-Compaction-*` report headers, the numbers for the usage record — that the API
service applies; it never touches the exchange itself. No web or HTTP client imports here.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import orjson

from app.compaction.cuts import Cut, cuts_of
from app.compaction.engine import CompactionResult, compact, marker_tokens
from app.compaction.formats import ApiName, Conversation, WireFormat
from app.compaction.formats.chat import ChatFormat
from app.compaction.offload import OFFLOAD_CHARS, as_received, is_large, offload, run_off
from app.compaction.planner import MessageCounter, Plan, plan
from app.compaction.policy import (
    Budget,
    Controls,
    StrategyName,
    parse_controls,
    parse_strategy,
    resolve_pipeline,
)
from app.compaction.replays import ReplayCache, Replays
from app.compaction.report import Preview, report_headers
from app.compaction.summary.background import BackgroundSummaries
from app.compaction.summary.prompt import SummaryUsage
from app.compaction.summary.request import (
    Asked,
    CompleterFactory,
    RequestSummaries,
    StandIn,
    UpstreamOf,
)
from app.compaction.summary.rolling import Summaries, summary_budget
from app.compaction.summary.stand_in import without_summary
from app.errors import BadRequest, ContextLengthExceeded, ProxyError
from app.jsontext import messages_text
from app.settings import LedgerMode, OnOverflow, Settings
from app.tokens.counter import TokenCounter, count_within
from app.windows.overflow import OverflowInfo, parse_overflow
from app.windows.registry import WindowRegistry
from app.windows.silent import learn_silent_cut
from app.windows.table import anthropic_betas, output_reserve

# The request field that holds the history, per API (named by a too-long-to-fit error).
CHAT = ChatFormat()  # the default adapter (stateless)
HISTORY_PARAM: dict[ApiName, str] = {
    "chat": "messages",
    "responses": "input",
    "messages": "messages",
}

logger = logging.getLogger(__name__)
# A request whose history a remembered replay covers (but a little) is planned inline up to
# this many messages: see `CompactionService._heavy`.
INLINE_COVERED_MESSAGES = 1024


@dataclass(frozen=True, slots=True)
class Compacted:
    """What the API service forwards after compaction, and what it reports about it."""

    body: dict[str, Any]  # the body forwarded
    forward: bytes | None  # its bytes; None: the bytes as received
    view: Mapping[str, Any]  # the chat-shaped view of `body`, for calibrating on the usage
    headers: dict[str, str]  # the `X-Compaction-*` report (DESIGN.md §2)
    tokens_before: int
    tokens_after: int
    context_limit: int
    strategies: tuple[StrategyName, ...]
    summary_usage: SummaryUsage
    summary_model: str
    ledger_id: str | None = None  # `X-Compaction-Id`: the ledger row of what was cut (§11)
    cuts: tuple[Cut, ...] = ()  # what was cut, for that row
    # restoring: what the forwarded markers' refs stand for (app/compaction/restorable.py)
    refs: Mapping[str, str] = field(default_factory=dict)
    budget: int = 0  # the window less the output reserve (what restored texts may fill)
    # what starts once the answer is on its way (not after an error): summaries ahead
    after_answer: tuple[Callable[[], object], ...] = ()


def view_body(conversation: Conversation) -> dict[str, Any]:
    """The request as the counter sees it: the fixed parts and the chat-shaped messages."""
    return {**conversation.fixed, "messages": list(conversation.messages)}


class CompactionService:
    """Compacts requests of any wire format for the API services, and serves the preview
    endpoints: `prepare` before a request is sent, `recover` after an overflow error."""

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
    ) -> None:
        """`background` makes summaries off the request path (without it, every request waits
        for its summary, as in wait mode); `summary_upstream` names the
        upstream a summary of (model, API) goes to, whose idleness a background one waits
        for (default: the request's)."""
        self._settings = settings
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
        self._replays: ReplayCache[Any] | None = ReplayCache()  # plans resume from a prefix

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
        )
        reserve = output_reserve(cleaned, window.tokens)
        budget = self._budget(controls, window.tokens, reserve)
        pipeline = resolve_pipeline(
            self._strategies(controls) if strategies is None else strategies,
            summarizer_available=self._summarizing is not None,
        )
        summary_model = controls.summary_model or self._settings.summary_model or model
        job = _Job(
            wire, cleaned, _view(wire, cleaned), model, summary_model, base_url, headers,
            self._counter, *self._keeping(controls), wait=self._waits(controls),
            forwarded=forwarding,
        )  # fmt: skip
        outcome, error = await self._outcome(job, pipeline, budget)
        stand = outcome.stand
        preview = Preview(
            cleaned,
            outcome.forwarded,
            job.conversation,
            outcome.result,
            window.tokens,
            str(window.source),
            reserve,
            cleaned is not body,
            self._counter.is_exact(model),
            self._counter.encoding_name(model),
            outcome.usage,
            stand.why if stand is not None else None,
            summary_model,
            error,
            stand.state if stand is not None else None,
            tuple(job.later),
            tuple(job.after),
            stand.covers if stand is not None else None,
        )
        if not forwarding:
            preview.start_background()
        return preview

    async def _outcome(
        self, job: _Job, pipeline: tuple[StrategyName, ...], budget: Budget
    ) -> tuple[_Outcome, str | None]:
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

    async def _counted(self, job: _Job, budget: Budget) -> _Outcome:
        """A request forwarded as received: counted for the report and the usage record, never
        compacted (counts of 0 if even counting fails)."""
        messages = job.conversation.messages
        try:
            fixed = await offload(messages, job.count_fixed)
            counted = partial(compact, messages, (), budget, job.count, fixed)
            return _Outcome(await offload(messages, counted), job.body)
        except Exception:
            logger.exception("counting failed for %s; reported as 0 tokens", job.model)
            return _Outcome(as_received(messages), job.body)

    async def _fallback(
        self, exc: Exception, job: _Job, pipeline: tuple[StrategyName, ...], budget: Budget
    ) -> tuple[_Outcome, str]:
        """After an unexpected error in compaction: plain `trim` (nothing when the request asked
        for no compaction), or if that fails too, the messages as received. The string says what
        the request got and why."""
        why = f"{type(exc).__name__} in compaction"
        trimmed: tuple[StrategyName, ...] = ("trim",) if pipeline else ()
        try:
            fixed = job.count_fixed()
            compaction = partial(
                compact, job.conversation.messages, trimmed, budget, job.count, fixed,
                protect=job.protect, restore=job.restore,
            )  # fmt: skip
            outcome = job.rendered(await offload(job.conversation.messages, compaction))
        except Exception:
            logger.exception(
                "trim failed too for %s; forwarding the messages as received", job.model
            )
            return _Outcome(as_received(job.conversation.messages), job.body), f"none: {why}"
        return outcome, f"{trimmed[0] if trimmed else 'none'}: {why}"

    async def _compact(
        self, job: _Job, pipeline: tuple[StrategyName, ...], budget: Budget
    ) -> _Outcome:
        """Run the pipeline. With `summarize`, the cut is the plan's whatever the summary's
        state: the summary stands for the cut span when it is cached (or, in wait mode, made
        for this request), else nothing does (DESIGN.md §12)."""
        messages = job.conversation.messages
        off = partial(run_off, self._heavy(messages))  # where this request's work runs, once
        replays = None
        if self._replays is not None:
            replays = Replays(self._replays, partial(self._counter.counting, job.model))
        compacting = partial(
            compact, messages, pipeline, budget, job.count,
            protect=job.protect, restore=job.restore, replays=replays,
        )  # fmt: skip
        summarizing = self._summarizing
        if "summarize" not in pipeline or summarizing is None:

            def whole() -> _Outcome:  # counting, planning and rendering: one hop
                return job.rendered(compacting(job.count_fixed()))

            return await off(whole)
        reserved = summary_budget(budget.goal)
        # restoring, the summary ends with the span marker: its tokens are reserved too
        planned_size = reserved + (marker_tokens(job.count) if job.restore else 0)

        def plan_of(
            history: Sequence[Mapping[str, Any]],
            count: MessageCounter,
            fixed: int,
            memory: Replays | None,
        ) -> Plan:  # this request's plan inputs, for its history or a predicted one
            return plan(
                history, pipeline, budget, count, fixed, planned_size,
                protect=job.protect, marked=job.restore, replays=memory,
            )  # fmt: skip

        def planned() -> tuple[int, Plan]:
            fixed = job.count_fixed()
            return fixed, plan_of(messages, job.count, fixed, replays)

        fixed, the_plan = await off(planned)
        compaction = partial(compacting, fixed, summary_tokens=planned_size, planned=the_plan)
        asked = job.asked()
        # the next event's prediction: the same inputs, resuming this plan's replay (read only)
        peek = replays.peeking() if replays is not None else None
        predict = partial(plan_of, fixed=fixed, memory=peek)
        await summarizing.ahead(asked, the_plan, predict, budget, reserved)
        if not the_plan.summarize:
            return await off(lambda: job.rendered(compaction(summary="")))
        summary = await summarizing.job(asked, the_plan, reserved)
        stand = await summarizing.stand_in(asked, summary)

        def stood_in() -> _Outcome:
            result = compaction(summary=stand.text)
            if stand.text is None:
                result = without_summary(
                    result, pipeline, planned_size, budget, job.count, marked=job.restore
                )
            return job.rendered(result, summary.usage, stand)

        return await off(stood_in)

    def _heavy(self, messages: Sequence[Mapping[str, Any]]) -> bool:
        """Whether this request's counting, planning and rendering may hold up the event loop:
        a large history (`is_large`), unless a replay remembered covers all of it but a little
        (a conversation's next request counts, replays and renders only what it adds) and it is
        not huge (an event prices every unit since the last one). A hop to a worker thread
        costs more than such a request's work."""
        if not is_large(messages):
            return False
        replays, text = self._replays, messages_text(messages)
        if replays is None or text is None or len(messages) > INLINE_COVERED_MESSAGES:
            return True
        return not replays.covers(text, OFFLOAD_CHARS // 4)

    def _budget(self, controls: Controls, window: int, reserve: int) -> Budget:
        threshold = controls.threshold or self._settings.threshold
        target = min(controls.target or self._settings.target, threshold)
        return Budget(window=window, reserve=reserve, threshold=threshold, target=target)

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
        preview = await self.plan(headers, body, base_url, wire=wire, forwarding=True)
        compacted = await self._ledgered(preview, self._compacted(wire, preview))
        preview.start_background()  # no await from here until the caller sends the request
        return compacted

    async def _ledgered(self, preview: Preview, compacted: Compacted) -> Compacted:
        """`compacted` with a ledger id and its cuts, when something was cut and the ledger is
        on (DESIGN.md §11). The id is random (unguessable); the cuts are a pure function of
        the request, worked out in a worker thread for a large one."""
        if self._ledger is LedgerMode.OFF or not preview.result.applied:
            return compacted
        cuts = await offload(preview.conversation.messages, partial(self._cuts, preview))
        if not cuts:
            return compacted
        ledger_id = secrets.token_urlsafe(16)
        headers = {**compacted.headers, "X-Compaction-Id": ledger_id}
        return replace(compacted, headers=headers, ledger_id=ledger_id, cuts=cuts)

    def _compacted(self, wire: WireFormat, preview: Preview) -> Compacted:
        result = preview.result
        if result.over_budget and self._settings.on_overflow is OnOverflow.REJECT:
            raise ContextLengthExceeded(
                f"the conversation needs {result.tokens_after} tokens after compaction, more than "
                f"the {preview.window - preview.reserve}-token budget of this model's "
                f"{preview.window}-token window",
                param=HISTORY_PARAM[wire.api],
            )
        # unchanged: the request's own list (never changed), whose JSON text is known already
        # (app/jsontext.py)
        shown = preview.conversation.messages if not result.applied else list(result.messages)
        view = {**preview.conversation.fixed, "messages": shown}
        return Compacted(
            body=preview.forwarded,
            forward=orjson.dumps(preview.forwarded) if preview.changed else None,
            view=view,
            headers=report_headers(preview),
            tokens_before=result.tokens_before,
            tokens_after=result.tokens_after,
            context_limit=preview.window,
            strategies=result.applied,
            summary_usage=preview.summary_usage,
            summary_model=preview.summary_model,
            refs=result.refs,
            budget=preview.window - preview.reserve,
            after_answer=preview.after,
        )

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
            info = _bound(wire, body, failed)
        if info is None:
            return None
        model: str = body["model"]
        if info.window is not None:
            self._windows.learn(base_url, model, info.window)
        if info.prompt_tokens is not None:
            self._counter.observe(model, failed.view, info.prompt_tokens, overflowed=True)
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
        compacted = await self._ledgered(preview, self._compacted(wire, preview))
        preview.start_background()  # no await from here until the caller sends the request
        return compacted

    def _cuts(self, preview: Preview) -> tuple[Cut, ...]:
        messages = list(preview.conversation.messages)
        # the counts planning just made (the counter's prefix cache: no message counted again)
        tokens = self._counter.count_messages(preview.body["model"], messages)
        keep = self._ledger is LedgerMode.FULL
        return cuts_of(preview.conversation, preview.result, tokens, keep)

    def upstream_truncated(
        self, model: str, sent: Compacted, base_url: str, reported: int | None
    ) -> bool:
        """Whether the upstream cut what was `sent` silently, by the prompt tokens it
        `reported` (DESIGN.md §11); if so, the window it holds is learned and logged."""
        estimate = (sent.tokens_after, sent.context_limit)
        trusted = self._counter.is_exact(model) or model in self._counter.calibration_factors()
        return learn_silent_cut(self._windows, base_url, model, reported, estimate, trusted)


def _bound(wire: WireFormat, body: Mapping[str, Any], failed: Compacted) -> OverflowInfo | None:
    """What an overflow that states no number teaches (the Responses API's "Your input exceeds
    the context window of this model"): the prompt that failed, as estimated, is more than the
    window holds — an upper bound, learned when it is below the window assumed (else the retry
    would be the same). Not for a request forwarded as received: what it sent is not all the
    upstream counted (server-side history)."""
    if failed.tokens_after <= 0 or wire.conversation(body).skip is not None:
        return None
    bound = failed.tokens_after
    return OverflowInfo(bound, None) if bound < failed.context_limit else None


@dataclass(frozen=True, slots=True)
class _Job:
    """One request being compacted: its adapter, body, view, models and where it goes."""

    wire: WireFormat
    body: dict[str, Any]  # without control keys
    conversation: Conversation
    model: str
    summary_model: str
    base_url: str
    headers: Mapping[str, str]
    counter: TokenCounter
    protect: frozenset[str] = frozenset()  # tools whose outputs only the last unit may cut
    restore: bool = False  # a marker stands for every cut; markers' refs resolved (§11)
    counted: dict[int, int] = field(default_factory=dict)  # see count_within
    wait: bool = False  # a compaction event waits for its summary (§12)
    forwarded: bool = False  # not a preview: see `Asked.forwarded`
    later: list[Callable[[], object]] = field(default_factory=list)  # see `Asked.later`
    after: list[Callable[[], object]] = field(default_factory=list)  # see `Asked.after`

    def count(self, message: Mapping[str, Any]) -> int:
        messages = self.conversation.messages
        return count_within(self.counter, self.model, messages, self.counted, message)

    def asked(self) -> Asked:
        """What this request's summary is asked with."""
        return Asked(
            self.conversation.messages,
            self.model,
            self.summary_model,
            self.base_url,
            self.headers,
            self.wire.api,
            self.count,
            self.wait,
            self.forwarded,
            self.later,
            self.after,
        )

    def count_fixed(self) -> int:
        """The tokens of what every prompt carries whatever is cut (tools, instructions)."""
        return self.counter.count_fixed(self.model, self.conversation.fixed)

    def rendered(
        self,
        result: CompactionResult,
        usage: SummaryUsage | None = None,
        stand: StandIn | None = None,
    ) -> _Outcome:
        """The outcome of `result`: the body rendered back by the adapter when it changed;
        `stand`: what stood for its cut span, when its event needed a summary."""
        forwarded = (
            self.wire.render(self.body, self.conversation, result.messages, result.sources)
            if result.applied
            else self.body
        )
        return _Outcome(result, forwarded, usage or SummaryUsage(), stand)


@dataclass(frozen=True, slots=True)
class _Outcome:
    result: CompactionResult
    forwarded: dict[str, Any]
    usage: SummaryUsage = field(default_factory=SummaryUsage)
    stand: StandIn | None = None  # what stood for the cut span, when the event needed a summary


def _view(wire: WireFormat, body: dict[str, Any]) -> Conversation:
    """The adapter's view of `body`. A request it refuses is a 400 (`BadRequest`); one it fails
    on (a bug, not the client's fault) is forwarded as received, never a 500."""
    try:
        return wire.conversation(body)
    except ProxyError:
        raise
    except Exception as exc:
        logger.exception("the %s adapter failed on a request; forwarding it as received", wire.api)
        return Conversation(messages=(), fixed=body, skip=f"{type(exc).__name__} in the adapter")
