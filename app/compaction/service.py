"""The compaction service: controls, window, token count, plan, and the forwarded body.

It glues the pure core (policy, counting, the planner) to a request: it resolves the window
(header > setting > learned/discovered > table > fallback), counts, compacts, decides whether the
original bytes can go upstream untouched, and writes the `X-Compaction-*` report headers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import anyio.to_thread
import orjson

from app.compaction.engine import CompactionResult, compact
from app.compaction.planner import Plan, plan
from app.compaction.policy import (
    Budget,
    Controls,
    StrategyName,
    parse_controls,
    parse_strategy,
    resolve_pipeline,
)
from app.compaction.summary.prompt import Completer, SummaryFailed, SummaryUsage
from app.compaction.summary.rolling import Summaries, SummaryJob, summary_budget
from app.errors import ContextLengthExceeded
from app.proxy.chat import Exchange
from app.settings import OnOverflow, Settings
from app.tokens.counter import TokenCounter
from app.usage.summary_stats import count_fallback, summary_outcome
from app.windows.overflow import parse_overflow
from app.windows.registry import WindowRegistry
from app.windows.table import output_reserve

CompleterFactory = Callable[[str, Mapping[str, str]], Completer]
PROMPT_OVERHEAD = 700  # the summary prompt's own instructions, in tokens
# Planning bigger than this runs in a worker thread, so it never holds up the event loop.
OFFLOAD_MESSAGES = 256
OFFLOAD_CHARS = 256 * 1024
T = TypeVar("T")

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Preview:
    """The outcome of compacting one request, without forwarding it."""

    body: dict[str, Any]
    result: CompactionResult
    window: int
    limit_source: str
    reserve: int
    changed_body: bool
    exact: bool
    encoding: str | None
    summary_usage: SummaryUsage
    fallback: str | None
    summary_model: str
    error: str | None = None  # compaction itself failed: what the request got instead, and why


def report_headers(preview: Preview) -> dict[str, str]:
    """The `X-Compaction-*` response headers (DESIGN.md §2)."""
    result = preview.result
    headers = {
        "X-Compaction-Applied": ",".join(result.applied) or "none",
        "X-Compaction-Tokens-Before": str(result.tokens_before),
        "X-Compaction-Tokens-After": str(result.tokens_after),
        "X-Compaction-Context-Limit": str(preview.window),
        "X-Compaction-Messages-Before": str(result.messages_before),
        "X-Compaction-Messages-After": str(result.messages_after),
    }
    if result.over_budget:
        headers["X-Compaction-Over-Budget"] = "true"
    usage = preview.summary_usage
    if usage.calls:
        headers["X-Compaction-Summary-Calls"] = str(usage.calls)
        headers["X-Compaction-Summary-Prompt-Tokens"] = str(usage.prompt_tokens)
        headers["X-Compaction-Summary-Completion-Tokens"] = str(usage.completion_tokens)
    if preview.fallback is not None:
        headers["X-Compaction-Summary-Fallback"] = preview.fallback[:200]
    if preview.error is not None:
        headers["X-Compaction-Fallback"] = preview.error[:200]
    return headers


class CompactionService:
    """Implements the chat service's `Compactor` seam, and serves the preview endpoint."""

    def __init__(
        self,
        settings: Settings,
        counter: TokenCounter,
        windows: WindowRegistry,
        summaries: Summaries | None = None,
        completer_for: CompleterFactory | None = None,
    ) -> None:
        self._settings = settings
        self._counter = counter
        self._windows = windows
        self._summaries = summaries
        self._completer_for = completer_for
        self._default_strategies = parse_strategy(settings.strategy, "INFLIGHT_STRATEGY")

    async def plan(
        self,
        headers: Mapping[str, str],
        body: dict[str, Any],
        base_url: str,
        *,
        strategies: tuple[StrategyName, ...] | None = None,
    ) -> Preview:
        """Compact `body` (its control keys are removed in place) for the model's window."""
        controls, changed_body = parse_controls({k.lower(): v for k, v in headers.items()}, body)
        model: str = body["model"]
        window = await self._windows.window_for(
            model,
            base_url,
            header_limit=controls.context_limit,
            setting_limit=self._settings.context_limit,
        )
        reserve = output_reserve(body, window.tokens)
        threshold = controls.threshold or self._settings.threshold
        budget = Budget(
            window=window.tokens,
            reserve=reserve,
            threshold=threshold,
            target=min(controls.target or self._settings.target, threshold),
        )
        if strategies is None:
            strategies = self._strategies(controls)
        can_summarize = self._summaries is not None and self._completer_for is not None
        pipeline = resolve_pipeline(strategies, summarizer_available=can_summarize)
        summary_model = controls.summary_model or self._settings.summary_model or model
        error = None
        try:
            outcome = await self._compact(
                body, pipeline, budget, model, summary_model, base_url, headers
            )
        except Exception as exc:  # any compaction bug: fall back, never a 500
            logger.exception("compaction failed for %s, falling back to trim", model)
            outcome, error = await self._fallback(exc, body, pipeline, budget, model)
        result, usage, fallback = outcome
        return Preview(
            body,
            result,
            window.tokens,
            str(window.source),
            reserve,
            changed_body,
            self._counter.is_exact(model),
            self._counter.encoding_name(model),
            usage,
            fallback,
            summary_model,
            error,
        )

    async def _fallback(
        self,
        exc: Exception,
        body: dict[str, Any],
        pipeline: tuple[StrategyName, ...],
        budget: Budget,
        model: str,
    ) -> tuple[tuple[CompactionResult, SummaryUsage, str | None], str]:
        """After an unexpected error in compaction: plain `trim` (nothing when the request asked
        for no compaction), or if that fails too, the messages as received. The string says what
        the request got and why."""
        why = f"{type(exc).__name__} in compaction"
        messages = body["messages"]
        trimmed: tuple[StrategyName, ...] = ("trim",) if pipeline else ()
        try:
            result = await offload(
                messages,
                lambda: compact(
                    messages,
                    trimmed,
                    budget,
                    lambda m: self._counter.count_message(model, m),
                    self._counter.count_fixed(model, body),
                ),
            )
        except Exception:
            logger.exception("trim failed too for %s; forwarding the messages as received", model)
            return (as_received(messages), SummaryUsage(), None), f"none: {why}"
        return (result, SummaryUsage(), None), f"{trimmed[0] if trimmed else 'none'}: {why}"

    async def _compact(
        self,
        body: dict[str, Any],
        pipeline: tuple[StrategyName, ...],
        budget: Budget,
        model: str,
        summary_model: str,
        base_url: str,
        headers: Mapping[str, str],
    ) -> tuple[CompactionResult, SummaryUsage, str | None]:
        """Run the pipeline; `summarize` asks the upstream, and falls back to `trim`."""
        messages = body["messages"]

        def count(message: Mapping[str, Any]) -> int:
            return self._counter.count_message(model, message)

        fixed = await offload(messages, partial(self._counter.count_fixed, model, body))
        compaction = partial(compact, messages, pipeline, budget, count, fixed)
        if "summarize" not in pipeline or self._summaries is None or self._completer_for is None:
            return await offload(messages, compaction), SummaryUsage(), None
        reserved = summary_budget(budget.goal)
        the_plan = await offload(
            messages, partial(plan, messages, pipeline, budget, count, fixed, reserved)
        )
        if not the_plan.summarize:
            result = await offload(
                messages, partial(compaction, summary="", summary_tokens=reserved, planned=the_plan)
            )
            return result, SummaryUsage(), None
        window = await self._windows.window_for(summary_model, base_url)
        job = SummaryJob(
            messages=messages,
            plan=the_plan,
            model=summary_model,
            complete=self._completer_for(summary_model, headers),
            summary_tokens=reserved,
            chunk_tokens=max(256, window.tokens - 2 * reserved - PROMPT_OVERHEAD),
            count_text=lambda text: self._counter.count_text(summary_model, text),
        )
        deadline = self._settings.summary_timeout
        try:
            async with asyncio.timeout(deadline):
                text = await self._summaries.summary_for(job)
        except (SummaryFailed, TimeoutError) as exc:
            if isinstance(exc, TimeoutError):
                self._summaries.mark_failed(job)
            why = str(exc) if isinstance(exc, SummaryFailed) else f"summary took over {deadline:g}s"
            reason = count_fallback(job.complete, exc)  # counted in /stats and /metrics
            logger.warning("summary failed (%s) for %s, trim instead: %s", reason, model, why)
            trimmed = tuple("trim" if s == "summarize" else s for s in pipeline)
            result = await offload(
                messages, partial(compact, messages, trimmed, budget, count, fixed)
            )
            return result, job.usage, why
        result = await offload(
            messages, partial(compaction, summary=text, summary_tokens=reserved, planned=the_plan)
        )
        return result, job.usage, None

    def _strategies(self, controls: Controls) -> tuple[StrategyName, ...] | None:
        if controls.strategies is not None:
            return controls.strategies
        return self._default_strategies

    async def prepare(self, headers: Mapping[str, str], exchange: Exchange, base_url: str) -> None:
        exchange.request_headers = {k.lower(): v for k, v in headers.items()}
        preview = await self.plan(exchange.request_headers, exchange.body, base_url)
        self._apply(exchange, preview)

    def _apply(self, exchange: Exchange, preview: Preview) -> None:
        result = preview.result
        if result.over_budget and self._settings.on_overflow is OnOverflow.REJECT:
            raise ContextLengthExceeded(
                f"the conversation needs {result.tokens_after} tokens after compaction, more than "
                f"the {preview.window - preview.reserve}-token budget of this model's "
                f"{preview.window}-token window",
                param="messages",
            )
        if result.applied:
            exchange.body = {**preview.body, "messages": list(result.messages)}
        if result.applied or preview.changed_body:
            exchange.forward = orjson.dumps(exchange.body)
        exchange.tokens_before = result.tokens_before
        exchange.tokens_after = result.tokens_after
        exchange.context_limit = preview.window
        exchange.strategies = tuple(result.applied)
        exchange.summary_usage = preview.summary_usage
        exchange.summary_model = preview.summary_model
        exchange.headers.update(report_headers(preview))

    async def recover(self, exchange: Exchange, base_url: str, status: int, content: bytes) -> bool:
        """After an upstream overflow error: learn the window it states, recalibrate the counter
        on the prompt size it states (DESIGN.md §8), and compact again. True (retry once) only
        when that changes what is sent: the same prompt would fail the same way."""
        info = parse_overflow(status, content)
        if info is None or (info.window is None and info.prompt_tokens is None):
            return False
        model = exchange.model
        if info.window is not None:
            self._windows.learn(base_url, model, info.window)
        if info.prompt_tokens is not None:
            self._counter.observe(model, exchange.body, info.prompt_tokens, overflowed=True)
        preview = await self.plan(exchange.request_headers, orjson.loads(exchange.raw), base_url)
        if info.window is not None and info.window < preview.window:
            logger.warning(
                "upstream says %s holds %d tokens, but the %s limit of %d wins",
                model, info.window, preview.limit_source, preview.window,
            )  # fmt: skip
        result = preview.result
        retry = {**preview.body, "messages": list(result.messages)} if result.applied else None
        if (retry or preview.body) == exchange.body:
            logger.info("upstream overflow for %s: nothing more to cut, relaying it", model)
            return False
        logger.info(
            "upstream overflow for %s (window %s, prompt %s tokens): retrying with %d",
            model, info.window, info.prompt_tokens, result.tokens_after,
        )  # fmt: skip
        self._apply(exchange, preview)
        if retry is None:  # what failed was compacted; the request as received is what fits now
            exchange.body = preview.body
            exchange.forward = orjson.dumps(preview.body) if preview.changed_body else exchange.raw
        return True


def _chars(message: Mapping[str, Any]) -> int:
    """Roughly how much text a message holds (content, text parts, call arguments)."""
    content = message.get("content")
    size = len(content) if isinstance(content, str) else 0
    for part in content if isinstance(content, list) else []:
        if isinstance(part, dict) and isinstance(part.get("text"), str):
            size += len(part["text"])
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else []:
        function = call.get("function") if isinstance(call, dict) else None
        arguments = function.get("arguments") if isinstance(function, dict) else None
        size += len(arguments) if isinstance(arguments, str) else 0
    return size


def is_large(messages: Sequence[Mapping[str, Any]]) -> bool:
    """Whether counting and planning these messages may take long enough to hold up other
    requests: many messages, or much text."""
    if len(messages) > OFFLOAD_MESSAGES:
        return True
    return sum(_chars(m) for m in messages if isinstance(m, Mapping)) > OFFLOAD_CHARS


async def offload(messages: Sequence[Mapping[str, Any]], work: Callable[[], T]) -> T:
    """Run counting and planning for `messages`: in a worker thread when they are large (the
    pure core and the counter are thread-safe), so that no request's CPU time stalls the event
    loop — other requests and `/healthz` go on being served meanwhile."""
    if is_large(messages):
        return await anyio.to_thread.run_sync(work)
    return work()


def as_received(messages: list[Any]) -> CompactionResult:
    """The result that forwards `messages` untouched, for when compaction cannot run at all
    (token counts unknown: reported as 0)."""
    nothing = Plan(
        units=(),
        head=0,
        cut=0,
        dropped=frozenset(),
        truncated=frozenset(),
        pruned_before=0,
        cap=0,
        events=(),
        summarize=False,
        tokens_before=0,
        tokens_after=0,
        strict=False,
    )
    return CompactionResult(
        messages, (), 0, 0, len(messages), len(messages), False, nothing,
        tuple(range(len(messages))),
    )


def preview_report(preview: Preview) -> dict[str, Any]:
    """The `report` object of `POST /v1/compaction/preview`."""
    result = preview.result
    plan = result.plan
    return {
        "applied": list(result.applied),
        "tokens_before": result.tokens_before,
        "tokens_after": result.tokens_after,
        "messages_before": result.messages_before,
        "messages_after": result.messages_after,
        "context_limit": preview.window,
        "limit_source": preview.limit_source,
        "output_reserve": preview.reserve,
        "budget": preview.window - preview.reserve,
        "over_budget": result.over_budget,
        "exact": preview.exact,
        "encoding": preview.encoding,
        "pinned_head_units": plan.head,
        "units": len(plan.units),
        "compaction_events": len(plan.events),
        "summary": summary_outcome(result.applied, preview.summary_usage.calls, preview.fallback),
    }


def count_report(preview: Preview, model: str) -> dict[str, Any]:
    """The body of `POST /v1/compaction/count` (tokens of the request as received)."""
    tokens = preview.result.tokens_before
    budget = max(1, preview.window - preview.reserve)
    return {
        "model": model,
        "prompt_tokens": tokens,
        "context_limit": preview.window,
        "limit_source": preview.limit_source,
        "output_reserve": preview.reserve,
        "usage_ratio": round(tokens / budget, 4),
        "exact": preview.exact,
        "encoding": preview.encoding,
    }
