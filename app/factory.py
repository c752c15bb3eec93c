"""`create_app`: builds every collaborator once, wires routes and the error handler."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import httpx
from fastapi import FastAPI
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from inflight import __version__
from inflight.apis.registry import APIS, route_names
from inflight.banner import log_banner
from inflight.compaction.cost_mode import PrefillRates
from inflight.compaction.service import CompactionService
from inflight.compaction.summary.background import BackgroundSummaries
from inflight.compaction.summary.cache import RedisCache, SummaryCache, SummaryFlight, open_cache
from inflight.compaction.summary.prompt import Completer, SummaryPrompt
from inflight.compaction.summary.rolling import Summaries, SummaryJob
from inflight.compaction.summary.stats import CountedCompleter, SummaryStats
from inflight.compaction.wire import ApiName
from inflight.dashboard.assets import DashboardAssets
from inflight.errors import BadRequest, ProxyError
from inflight.http.auth import KeyChecker
from inflight.http.errors import error_response, proxy_error_handler, unexpected_error_handler
from inflight.http.hot import InflightApp
from inflight.http.readiness import Check, Readiness
from inflight.http.routes import compaction, dashboard, ledger, ops, passthrough
from inflight.http.state import AppState
from inflight.pricing.meter import CostMeter
from inflight.pricing.table import PriceTable
from inflight.proxy.api import Api, Exchange
from inflight.proxy.completers import (
    SummaryShapes,
    anthropic_summary_completer,
    responses_summary_completer,
    summary_completer,
)
from inflight.proxy.passthrough import PassthroughService
from inflight.proxy.recording import records_for, summary_records
from inflight.proxy.service import ApiService
from inflight.proxy.slots import UpstreamSlots
from inflight.proxy.upstream import Upstream
from inflight.settings import Settings
from inflight.tokens.counter import ChatTokenCounter
from inflight.tokens.encodings import EncodingSet, load_encodings
from inflight.usage.labels import ModelLabels, literal_names
from inflight.usage.ledger import Ledger, ledger_mode
from inflight.usage.metrics import Metrics
from inflight.usage.records import UsageQueue, UsageRecord, UsageStore
from inflight.usage.stores import open_store, spill_file
from inflight.windows.discovery import discover_window
from inflight.windows.registry import WindowRegistry
from inflight.windows.shared import LearnedStore, SharedLearning, open_learning
from inflight.windows.table import ModelTable, Route

logger = logging.getLogger(__name__)

Lifespan = Callable[[FastAPI], AbstractAsyncContextManager[None]]
ExchangeHook = Callable[[Exchange], Awaitable[None]]
ExchangeHooks = tuple[ExchangeHook, ExchangeHook]  # on its answer, when it ended


class _NotFound(BadRequest):
    status_code = 404
    code = "not_found"


class _MethodNotAllowed(BadRequest):
    status_code = 405
    code = "method_not_allowed"


async def _http_error_handler(request: Request, exc: Exception) -> Response:
    """Starlette's own 404/405 in OpenAI's envelope too, keeping its headers (405's `Allow`)."""
    assert isinstance(exc, HTTPException)
    error: ProxyError = (
        _MethodNotAllowed(f"method {request.method} not allowed on {request.url.path}")
        if exc.status_code == 405
        else _NotFound(f"no route {request.method} {request.url.path}")
    )
    response = error_response(error)
    response.headers.update(exc.headers or {})
    return response


def _windows(settings: Settings, upstream: Upstream, table: ModelTable) -> WindowRegistry:
    """The window registry, discovering windows through `upstream`."""

    async def discover(base_url: str, model: str) -> int | None:
        return await discover_window(upstream, base_url, model)

    return WindowRegistry(table, discover, ttl=settings.discovery_ttl)


def _compaction(
    settings: Settings,
    upstream: Upstream,
    windows: WindowRegistry,
    counter: ChatTokenCounter,
    summary_stats: SummaryStats,
    submit: Callable[[UsageRecord], None],
    prices: PriceTable,
    prefill: PrefillRates,
) -> tuple[CompactionService, SummaryCache, BackgroundSummaries]:
    """The compaction service (cost mode weighing `prices`, or a local model's `prefill`
    speed), the summary cache and the background summaries (both closed at shutdown)."""
    prompt = SummaryPrompt.load(settings.config_file("summary_prompt.md"))
    cache = open_cache(settings.cache_url)
    # A background summary may take several calls: the lock outlives them.
    summaries = Summaries(
        prompt,
        SummaryFlight(cache, lock_ttl=max(120.0, 4 * settings.summary_timeout)),
        guard=settings.summary_facts_guard,
    )
    elsewhere = settings.summary_upstream_url
    summary_route = Route(elsewhere, upstream.default_route.api_key) if elsewhere else None

    shapes = SummaryShapes(summary_stats)

    def completer_for(model: str, headers: Mapping[str, str], api: ApiName) -> Completer:
        # Asked through the client's own API (SUMMARY_UPSTREAM_URL: one chat upstream for all).
        timeout = settings.summary_timeout
        if summary_route is not None:
            complete = summary_completer(upstream, model, headers, timeout, summary_route, shapes)
        elif api == "messages":
            complete = anthropic_summary_completer(upstream, model, headers, timeout)
        elif api == "responses":
            complete = responses_summary_completer(upstream, model, headers, timeout, shapes)
        else:
            complete = summary_completer(upstream, model, headers, timeout, None, shapes)
        return CountedCompleter(complete, summary_stats)

    def summary_upstream(model: str, api: ApiName) -> str:
        if summary_route is not None:
            return summary_route.base_url
        return upstream.route(model, APIS[api].api.provider).base_url

    background = _background(settings, upstream, summaries, summary_stats, submit)
    keeps = ledger_mode(settings.ledger, settings.database_url)
    compactor = CompactionService(
        settings, counter, windows, summaries, completer_for, keeps,
        background=background, summary_upstream=summary_upstream,
        cache_rates=cache_rates(prices), prefill_rate=prefill.rate,
    )  # fmt: skip
    return compactor, cache, background


def cache_rates(prices: PriceTable) -> Callable[[str], tuple[float, float] | None]:
    """A model's dollars per prompt token re-read from and re-written to the cache, for cost
    mode (the engine weighs numbers; it never reads the price table)."""

    def rates(model: str) -> tuple[float, float] | None:
        price = prices.lookup(model)
        return None if price is None else (price.cache_read_rate, price.cache_write_rate)

    return rates


def _prefill_observer(upstream: Upstream, rates: PrefillRates) -> Callable[[Exchange], None]:
    """What an answer's stated prefill speed (llama.cpp's `timings`) teaches cost mode about
    its (upstream, model): the rate a local model is judged on when INFLIGHT_PREFILL_RATE is
    unset."""

    def observe(exchange: Exchange) -> None:
        prefill = exchange.usage.prefill if exchange.usage is not None else None
        if prefill is not None and exchange.rounds == 1:
            base_url = upstream.route(exchange.model, exchange.api.provider).base_url
            rates.observe(base_url, exchange.model, prefill.tokens, prefill.per_second)

    return observe


def _background(
    settings: Settings,
    upstream: Upstream,
    summaries: Summaries,
    summary_stats: SummaryStats,
    submit: Callable[[UsageRecord], None],
) -> BackgroundSummaries:
    """Summaries made off the request path: their calls recorded as usage, their start on a
    one-slot upstream waiting (bounded) for an idle moment (`SUMMARY_WHEN_IDLE`)."""

    def record_summary(job: SummaryJob) -> None:
        for record in summary_records(job.usage, job.model, None):
            submit(record)

    return BackgroundSummaries(
        summaries,
        concurrency=settings.summary_concurrency,
        idle=upstream.idle if settings.summary_when_idle else None,
        idle_wait=settings.summary_idle_wait,
        gated=UpstreamSlots(upstream, settings.upstream_slots).gated,
        on_usage=record_summary,
        stats=summary_stats,
    )


def _lifespan(
    state: AppState,
    cache: SummaryCache,
    background: BackgroundSummaries,
    learning: SharedLearning | None,
) -> Lifespan:
    """Startup (banner, store, usage writer, the readiness probe) and shutdown (the probe
    stopped, flush, then close everything)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        log_banner(state.settings, state.encodings_missing, state.counters)
        await state.store.open()
        await state.queue.start()
        state.readiness.start()
        try:
            yield
        finally:
            await state.readiness.aclose()  # before what it probes
            await background.aclose()  # cancel background summaries before their upstream
            await state.ledger.aclose()  # and the ledger's work on references, before the flush
            await state.queue.close()  # flush every record before the store closes
            await state.store.close()
            await state.upstream.aclose()
            await cache.close()
            if learning is not None:
                await learning.aclose()

    return lifespan


def _readiness(
    settings: Settings, upstream: Upstream, store: UsageStore, cache: SummaryCache
) -> Readiness:
    """What `/readyz` reports: the upstream, the usage store and, with `CACHE_URL`, Redis."""
    checks: dict[str, Check] = {"store": store.ping, "upstream": upstream.reachable}
    if isinstance(cache, RedisCache):
        checks["cache"] = cache.ping
    return Readiness(checks, interval=settings.ready_interval, timeout=settings.ready_timeout)


def _recording(
    counter: ChatTokenCounter,
    meter: CostMeter,
    metrics: Metrics,
    queue: UsageQueue,
    learning: SharedLearning | None,
    prefilled: Callable[[Exchange], None],
) -> tuple[Callable[[UsageRecord], None], ExchangeHooks]:
    """How a record is submitted (metrics, then the write queue), and the exchange's hooks:
    on its answer, the counter calibrates on the upstream's usage (with `learning`, published
    to the other replicas before the answer's last bytes, bounded); when it ends, what is left
    is published and the records are priced."""

    def submit(record: UsageRecord) -> None:
        metrics.observe(record)
        queue.submit(record)

    async def on_answer(exchange: Exchange) -> None:
        usage = exchange.usage
        view = exchange.view
        # A prompt the upstream cut silently says nothing about how the counter counts.
        completed = exchange.outcome == "completed" and not exchange.upstream_truncated
        if usage is not None and usage.prompt_tokens and completed and view is not None:
            client = exchange.compacted.client if exchange.compacted is not None else ""
            counter.observe(exchange.model, view, usage.prompt_tokens, client=client)
        if completed:
            prefilled(exchange)
        if learning is not None:  # also what an overflow or a silent cut taught
            await learning.publish_within()

    async def on_done(exchange: Exchange) -> None:
        if learning is not None:  # what a publish that outlasted its bound left
            await learning.flush()
        for record in records_for(exchange):
            submit(meter.priced(record, exchange.body))

    return submit, (on_answer, on_done)


def create_app(
    settings: Settings,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
    store: UsageStore | None = None,
    encodings: EncodingSet | None = None,
    learned: LearnedStore | None = None,
) -> FastAPI:
    """The ASGI app. `transport` lets tests put a fake upstream behind the pooled client,
    `store` replaces the usage store `DATABASE_URL` names, `encodings` the encodings loaded
    from the tiktoken cache (loading them takes about a second), and `learned` where replicas
    share what they learned (Redis at `CACHE_URL` otherwise)."""
    table = ModelTable.load(settings.config_file("models.toml"))
    upstream = Upstream(settings, routes=table, transport=transport)
    encodings = encodings if encodings is not None else load_encodings()
    shared = learned is not None or bool(settings.cache_url)
    # replicas sharing calibration share its clock: wall time
    counter = ChatTokenCounter(encodings, table, clock=time.time if shared else time.monotonic)
    windows = _windows(settings, upstream, table)
    learning = open_learning(settings.cache_url, counter.calibrated, windows, learned)
    summary_stats = SummaryStats()
    prices = PriceTable.load(settings.config_file("prices.toml"))
    meter = CostMeter(prices)
    store = store if store is not None else open_store(settings.database_url)
    queue = UsageQueue(
        store,
        max_pending=settings.usage_queue_max,
        spill=spill_file(settings.database_url, settings.usage_spill_path),
        spill_after=settings.usage_spill_after,
    )
    named = [entry.pattern for entry in table.model] + [m for p in prices.price for m in p.models]
    labels = ModelLabels(literal_names(named), settings.metrics_top_models)
    metrics = Metrics(
        lambda: queue.depth, counter.calibration_factors, summary_stats, labels, route_names()
    )

    prefill = PrefillRates()
    submit, (on_answer, on_done) = _recording(
        counter, meter, metrics, queue, learning, _prefill_observer(upstream, prefill)
    )
    compactor, cache, background = _compaction(
        settings, upstream, windows, counter, summary_stats,
        lambda r: submit(meter.priced(r, None)), prices, prefill,
    )  # fmt: skip
    cuts = Ledger(
        ledger_mode(settings.ledger, settings.database_url), settings.ledger_ttl, queue, store
    )

    def service(api: Api) -> ApiService:
        return ApiService(
            settings, upstream, api, compactor, on_done=on_done, on_sent=cuts.record,
            on_answer=on_answer, answer_first=learning is not None,
        )  # fmt: skip

    state = AppState(
        settings=settings,
        upstream=upstream,
        keys=KeyChecker(settings.api_keys),
        apis={name: service(served.api) for name, served in APIS.items()},
        passthrough=PassthroughService(settings, upstream, record=submit),
        counter=counter,
        compactor=compactor,
        store=store,
        queue=queue,
        ledger=cuts,
        metrics=metrics,
        encodings_missing=encodings.missing,
        counters=encodings.counters(),
        readiness=_readiness(settings, upstream, store, cache),
    )
    return _asgi_app(state, _lifespan(state, cache, background, learning))


def _asgi_app(state: AppState, lifespan: Lifespan) -> FastAPI:
    """The FastAPI app over `state`: its error handlers and routes, in matching order."""
    app = InflightApp(title="inflight", version=__version__, lifespan=lifespan)
    app.state.inflight = state
    app.hot = {served.api.route: served.endpoint for served in APIS.values()}  # app/http/hot.py
    app.add_exception_handler(ProxyError, proxy_error_handler)
    app.add_exception_handler(HTTPException, _http_error_handler)
    app.add_exception_handler(Exception, unexpected_error_handler)
    app.include_router(ops.router)
    for served in APIS.values():
        app.include_router(served.router)
    app.include_router(ledger.router)  # before `/v1/compaction/*`, the proxy's own namespace
    app.include_router(compaction.router)
    app.include_router(dashboard.build_router(DashboardAssets.load()))
    app.include_router(passthrough.router)
    return app
