"""The engine as a library (DESIGN.md §15): count and compact a conversation in process, in any
of the three wire formats, with the proxy's planner and every invariant of DESIGN.md §4."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, cast, get_args

from inflight.apis.anthropic.format import MessagesFormat
from inflight.apis.chat.format import ChatFormat
from inflight.apis.responses.format import ResponsesFormat
from inflight.compaction.engine import CompactionResult
from inflight.compaction.engine import compact as compact_view
from inflight.compaction.planner import plan
from inflight.compaction.policy import Budget, resolve_pipeline
from inflight.compaction.rendering import render_span
from inflight.compaction.report import Preview, SummaryState, preview_report, report_headers
from inflight.compaction.summary.prompt import SummaryUsage
from inflight.compaction.summary.rolling import summary_budget
from inflight.compaction.wire import Conversation, WireFormat
from inflight.strategies import StrategyName, parse_strategy
from inflight.tokens.counter import ChatTokenCounter, TokenCounter
from inflight.tokens.encodings import load_encodings
from inflight.windows.table import output_reserve

Api = Literal["chat", "responses", "anthropic"]
APIS: tuple[Api, ...] = get_args(Api)
# Each API's wire format (stateless adapters): its planner view, render and history field.
_FORMATS: Mapping[Api, WireFormat] = MappingProxyType(
    {"chat": ChatFormat(), "responses": ResponsesFormat(), "anthropic": MessagesFormat()}
)
# What `summarize` gets: the span of the conversation a compaction event cuts, as chat-shaped
# messages (what the proxy's summariser is shown); it returns the summary's text.
Summarize = Callable[[list[Mapping[str, Any]]], "str | Awaitable[str]"]


@dataclass(frozen=True, slots=True)
class Compacted:
    """What `compact` made of a request.

    `body` is the request as the proxy would forward it (the input itself when nothing
    changed), `messages` its history (`messages`, or `input` for the Responses API);
    `headers` the `X-Compaction-*` headers the proxy would answer with, `report` the
    `report` object of `POST /v1/compaction/preview`.
    """

    body: dict[str, Any]
    messages: list[Any]
    applied: tuple[StrategyName, ...]
    tokens_before: int
    tokens_after: int
    over_budget: bool
    summary: str | None
    headers: dict[str, str] = field(default_factory=dict)
    report: dict[str, Any] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        """Whether anything was compacted (else `body` is the input as given)."""
        return bool(self.applied)


class Engine:
    """Counting and compaction with one set of encodings (loaded once, offline); the module's
    `count_tokens` and `compact` use a default one."""

    def __init__(self, counter: TokenCounter | None = None) -> None:
        self._counter = counter if counter is not None else ChatTokenCounter(load_encodings())
        self._formats = _FORMATS

    def count_tokens(
        self, conversation: Sequence[Any] | Mapping[str, Any], *, model: str, api: Api = "chat"
    ) -> int:
        """The prompt tokens of a request (or of its history alone), as the proxy counts them:
        exact with the model's tokenizer where it has one, else its calibrated estimate."""
        body = _body(conversation, model, api)
        view = self._view(body, api)
        counter = self._counter
        return counter.count_fixed(model, view.fixed) + sum(
            counter.count_messages(model, view.messages)
        )

    def compact(
        self,
        conversation: Sequence[Any] | Mapping[str, Any],
        *,
        model: str,
        context_limit: int,
        api: Api = "chat",
        strategy: str | Sequence[str] = "auto",
        threshold: float = 0.8,
        target: float = 0.6,
        protect_tools: Sequence[str] = (),
        summarize: Summarize | None = None,
    ) -> Compacted:
        """`acompact` for synchronous code; an async `summarize` is run to completion here,
        which needs no event loop running in this thread (else use `acompact`)."""
        return _run(
            self.acompact(
                conversation,
                model=model,
                context_limit=context_limit,
                api=api,
                strategy=strategy,
                threshold=threshold,
                target=target,
                protect_tools=protect_tools,
                summarize=summarize,
            )
        )

    async def acompact(
        self,
        conversation: Sequence[Any] | Mapping[str, Any],
        *,
        model: str,
        context_limit: int,
        api: Api = "chat",
        strategy: str | Sequence[str] = "auto",
        threshold: float = 0.8,
        target: float = 0.6,
        protect_tools: Sequence[str] = (),
        summarize: Summarize | None = None,
    ) -> Compacted:
        """Compact a request (a body, or its history alone) for a `context_limit`-token window:
        the same plan the proxy makes (`strategy` as `X-Compaction-Strategy`; `threshold` and
        `target` as shares of the budget), so the successive requests of a growing
        conversation share their prefixes between events. Without `summarize`, `auto` trims
        where it would summarise; with it, the cut span is summarised by `summarize`."""
        if context_limit < 1:
            raise ValueError(f"context_limit must be a positive token count, not {context_limit}")
        if not 0 < target <= threshold <= 1:
            raise ValueError(f"need 0 < target <= threshold <= 1, not {target} and {threshold}")
        body = _body(conversation, model, api)
        view = self._view(body, api)
        strategies = _strategies(strategy)
        pipeline = resolve_pipeline(strategies, summarizer_available=summarize is not None)
        budget = Budget(context_limit, output_reserve(body, context_limit), threshold, target)
        counter = self._counter

        def count(message: Mapping[str, Any]) -> int:
            return counter.count_message(model, message)

        fixed = counter.count_fixed(model, view.fixed)
        protect = frozenset(protect_tools)
        summary: str | None = None
        state: SummaryState | None = None
        fallback: str | None = None
        if view.skip is not None or "summarize" not in pipeline or summarize is None:
            result = compact_view(view.messages, pipeline, budget, count, fixed, protect=protect)
        else:
            reserved = summary_budget(budget.goal)
            planned = plan(view.messages, pipeline, budget, count, fixed, reserved, protect=protect)
            if planned.summarize:
                span = render_span(view.messages, planned, planned.head, planned.cut)
                summary, fallback = await _summary_of(summarize, span, reserved, counter, model)
                state = "ready" if summary is not None else "failed"
            result = compact_view(
                view.messages, pipeline, budget, count, fixed, summary=summary,
                summary_tokens=reserved if summary is not None else 0,
                planned=planned if summary is not None else None, protect=protect,
            )  # fmt: skip
        return self._compacted(body, api, view, result, budget, model, summary, state, fallback)

    def _view(self, body: Mapping[str, Any], api: Api) -> Conversation:
        if api not in self._formats:
            raise ValueError(f"api must be one of {', '.join(APIS)}, not {api!r}")
        return self._formats[api].conversation(body)

    def _compacted(
        self,
        body: dict[str, Any],
        api: Api,
        view: Conversation,
        result: CompactionResult,
        budget: Budget,
        model: str,
        summary: str | None,
        state: SummaryState | None,
        fallback: str | None,
    ) -> Compacted:
        wire = self._formats[api]
        forwarded = (
            wire.render(body, view, result.messages, result.sources) if result.applied else body
        )
        preview = Preview(
            body=body, forwarded=forwarded, conversation=view, result=result,
            window=budget.window, limit_source="library", reserve=budget.reserve,
            changed_body=False, exact=self._counter.is_exact(model),
            encoding=self._counter.encoding_name(model), summary_usage=SummaryUsage(),
            fallback=fallback, summary_model=model, summary_state=state,
        )  # fmt: skip
        history = forwarded.get(wire.history)
        return Compacted(
            body=forwarded,
            messages=list(history) if isinstance(history, list) else [],
            applied=result.applied,
            tokens_before=result.tokens_before,
            tokens_after=result.tokens_after,
            over_budget=result.over_budget,
            summary=summary,
            headers=report_headers(preview),
            report=preview_report(preview),
        )


def _body(conversation: Sequence[Any] | Mapping[str, Any], model: str, api: Api) -> dict[str, Any]:
    """The request body: as given (its `model` set when missing), or one around a history."""
    if api not in _FORMATS:
        raise ValueError(f"api must be one of {', '.join(APIS)}, not {api!r}")
    if isinstance(conversation, Mapping):
        return {"model": model, **conversation}
    if isinstance(conversation, str | bytes) or not isinstance(conversation, Sequence):
        raise TypeError("pass a request body (a mapping) or its history (a list of messages)")
    body: dict[str, Any] = {"model": model, _FORMATS[api].history: list(conversation)}
    if api == "anthropic":
        body["max_tokens"] = 4096  # required by the Messages API; the answer's reserve
    return body


def _strategies(strategy: str | Sequence[str]) -> tuple[StrategyName, ...] | None:
    value = strategy if isinstance(strategy, str) else ",".join(strategy)
    return parse_strategy(value, "strategy")


async def _summary_of(
    summarize: Summarize,
    span: list[Mapping[str, Any]],
    reserved: int,
    counter: TokenCounter,
    model: str,
) -> tuple[str | None, str | None]:
    """The caller's summary of `span` (None and why, when it gave none that fits)."""
    made = summarize(span)
    text = await made if inspect.isawaitable(made) else made
    if not isinstance(text, str) or not text.strip():
        return None, "summarize returned no text"
    if counter.count_message(model, {"role": "user", "content": text}) > 2 * reserved:
        return None, f"the summary is far over the {reserved} tokens reserved for it"
    return text.strip(), None


def _run(work: Awaitable[Compacted]) -> Compacted:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        done: Compacted = asyncio.run(cast("Coroutine[Any, Any, Compacted]", work))
        return done
    close = getattr(work, "close", None)
    if close is not None:
        close()
    raise RuntimeError("compact() was called inside a running event loop: await acompact()")


def _default() -> Engine:
    """The engine the module-level functions share, built on first use (its encodings load
    once per process; build an `Engine` of your own to choose when)."""
    engine: Engine | None = _DEFAULT.get("engine")
    if engine is None:
        engine = _DEFAULT.setdefault("engine", Engine())
    return engine


_DEFAULT: dict[str, Engine] = {}


def count_tokens(
    conversation: Sequence[Any] | Mapping[str, Any], *, model: str, api: Api = "chat"
) -> int:
    """`Engine.count_tokens` with the default engine."""
    return _default().count_tokens(conversation, model=model, api=api)


def compact(
    conversation: Sequence[Any] | Mapping[str, Any],
    *,
    model: str,
    context_limit: int,
    **options: Any,
) -> Compacted:
    """`Engine.compact` with the default engine (options: `api`, `strategy`, `threshold`,
    `target`, `protect_tools`, `summarize`)."""
    return _default().compact(conversation, model=model, context_limit=context_limit, **options)


async def acompact(
    conversation: Sequence[Any] | Mapping[str, Any],
    *,
    model: str,
    context_limit: int,
    **options: Any,
) -> Compacted:
    """`Engine.acompact` with the default engine."""
    return await _default().acompact(
        conversation, model=model, context_limit=context_limit, **options
    )
