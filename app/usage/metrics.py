"""Prometheus metrics, one registry per app (never the process-global default registry); model
labels from a bounded set (app/usage/labels.py), since clients choose model names."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from inflight.compaction.summary.stats import SummaryStats
from inflight.usage.labels import OTHER, ModelLabels
from inflight.usage.records import UsageRecord, api_route

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class _SummaryCollector(Collector):
    """Summary call failures and fallbacks by reason, and partial stand-ins, read from
    `SummaryStats` at scrape time."""

    def __init__(self, stats: SummaryStats) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        failures = CounterMetricFamily(
            "inflight_summary_failures", "Summary calls that failed, by reason", labels=["reason"]
        )
        for reason, n in sorted(self._stats.failures.items()):
            failures.add_metric([reason], n)
        fallbacks = CounterMetricFamily(
            "inflight_summary_fallbacks",
            "Requests whose summary failed and that fell back to trim, by reason",
            labels=["reason"],
        )
        for reason, n in sorted(self._stats.fallbacks.items()):
            fallbacks.add_metric([reason], n)
        attempts = CounterMetricFamily(
            "inflight_summary_attempts", "Summary calls sent upstream (failed ones too)"
        )
        attempts.add_metric([], self._stats.calls)
        partial_events = CounterMetricFamily(
            "inflight_summary_partial_events",
            "Compaction events this replica chose a shorter summary to stand in for",
        )
        partial_events.add_metric([], self._stats.partial_events)
        partial_requests = CounterMetricFamily(
            "inflight_summary_partial_requests",
            "Requests a shorter summary stood in for (whichever replica chose it)",
        )
        partial_requests.add_metric([], self._stats.partial_requests)
        stand_ins = CounterMetricFamily(
            "inflight_summary_stand_ins",
            "Forwarded requests whose compaction cut a span, by what stood for it "
            "(summary, pending: none ready yet, failed)",
            labels=["state"],
        )
        for state, n in sorted(self._stats.stand_ins.items()):
            stand_ins.add_metric([state], n)
        starts = CounterMetricFamily(
            "inflight_summary_background_starts",
            "Background summaries started, by how: immediate, waited (for an idle one-slot "
            "upstream), forced (ran busy after the bounded wait)",
            labels=["how"],
        )
        for how, n in sorted(self._stats.background.starts.items()):
            starts.add_metric([how], n)
        yield from (failures, fallbacks, attempts, partial_events, partial_requests)
        yield from (stand_ins, starts)


class Metrics:
    """The proxy's counters, histograms and gauges, fed from usage records; every `model`
    label is `labels(model)` (by default 20 names, then `other`)."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(
        self,
        queue_depth: Callable[[], float],
        calibration: Callable[[], dict[str, float]],
        summary_stats: SummaryStats | None = None,
        labels: ModelLabels | None = None,
        api_names: Mapping[str, str] | None = None,
    ) -> None:
        self.labels = labels if labels is not None else ModelLabels((), 20)
        self.api_names = api_names or {}  # route -> API name (the registry's): the `api` label
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.summary_stats = summary_stats if summary_stats is not None else SummaryStats()
        r.register(_SummaryCollector(self.summary_stats))
        self.requests = Counter(
            "inflight_requests",
            "Chat requests answered (proxy-rejected ones too)",
            ["model", "status", "stream"],
            registry=r,
        )
        self.latency = Histogram(
            "inflight_request_latency_seconds", "Chat request latency", ["model"],
            buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.ttfb = Histogram(
            "inflight_ttfb_seconds", "Time to the first byte of the answer", ["model"],
            buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.tokens = Counter(
            "inflight_tokens", "Tokens reported by the upstream", ["model", "kind"], registry=r
        )
        self.saved = Counter(
            "inflight_tokens_saved",
            "Prompt tokens removed by compaction (the proxy's estimate before minus after)",
            ["model"],
            registry=r,
        )
        self.compactions = Counter(
            "inflight_compactions", "Requests compacted, by strategy", ["strategy"], registry=r
        )
        self.upstream_errors = Counter(
            "inflight_upstream_errors", "Upstream errors and broken streams", ["status"], registry=r
        )
        self.apis = Counter(
            "inflight_api_requests", "Requests answered on each compacting route, by API",
            ["api", "status"], registry=r,
        )  # fmt: skip
        self.passthrough = Counter(
            "inflight_passthrough_requests", "Requests relayed by passthrough routes, by API",
            ["route", "status"], registry=r,
        )  # fmt: skip
        self.summaries = Counter(
            "inflight_summary_calls", "Summary calls made upstream", ["model"], registry=r
        )
        self._calibration = calibration
        self._register_cost_and_gauges(r, queue_depth)

    def _register_cost_and_gauges(
        self, r: CollectorRegistry, queue_depth: Callable[[], float]
    ) -> None:
        """The cost counter (both series from the start) and the gauges read at scrape time."""
        self.cost = Counter(
            "inflight_cost_usd", "USD at list prices: actual (summary calls included) and the "
            "uncompacted baseline", ["kind"], registry=r,
        )  # fmt: skip
        for kind in ("actual", "baseline"):
            self.cost.labels(kind)  # both series exist from the start, at 0
        self.queue = Gauge("inflight_usage_queue_depth", "Usage records waiting", registry=r)
        self.queue.set_function(queue_depth)
        self.factors = Gauge(
            "inflight_calibration_factor", "Token estimate correction", ["model"], registry=r
        )

    def observe(self, record: UsageRecord) -> None:
        if record.cost is not None:
            self.cost.labels("actual").inc(record.cost)
        if record.baseline_cost is not None:
            self.cost.labels("baseline").inc(record.baseline_cost)
        if record.kind == "passthrough":
            self.passthrough.labels(record.route or "", str(record.status)).inc()
            return
        model = self.labels(record.model)
        if record.kind == "summary":
            self.summaries.labels(model).inc()
            self._tokens(model, record)
            return
        self.requests.labels(model, str(record.status), str(record.stream).lower()).inc()
        route = api_route(record.route)
        self.apis.labels(self.api_names.get(route, route), str(record.status)).inc()
        self.latency.labels(model).observe(record.latency_ms / 1000)
        if record.ttfb_ms is not None:
            self.ttfb.labels(model).observe(record.ttfb_ms / 1000)
        if record.outcome == "rejected":  # never forwarded: no tokens, nothing saved
            return
        self._tokens(model, record)
        self.saved.labels(model).inc(max(0, record.tokens_before - record.tokens_after))
        for strategy in record.strategies:
            self.compactions.labels(strategy).inc()
        if record.outcome == "upstream_error":
            self.upstream_errors.labels(str(record.status)).inc()

    def _tokens(self, model: str, record: UsageRecord) -> None:
        for kind, value in (
            ("prompt", record.prompt_tokens),
            ("completion", record.completion_tokens),
            ("cached", record.cached_tokens),
            ("cache_write", record.cache_write_tokens),
        ):
            if value:
                self.tokens.labels(model, kind).inc(value)

    def render(self) -> bytes:
        for model, factor in self._calibration().items():
            if self.labels.named(model) and model != OTHER:  # one factor per series, or none
                self.factors.labels(model).set(factor)
        return generate_latest(self.registry)
