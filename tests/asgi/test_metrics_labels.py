"""Security: clients choose model names, so `/metrics` and `/stats` label models from a bounded
set (configured or priced names, `INFLIGHT_METRICS_TOP_MODELS` others, then `other`): 10,000
distinct names must not grow either without bound."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families

from inflight.factory import create_app
from inflight.usage.labels import OTHER, ModelLabels, literal_names
from inflight.usage.metrics import Metrics
from inflight.usage.records import UsageRecord
from tests.conftest import make_settings
from tests.support.fakes import FakeUpstream
from tests.support.servers import WatchedStore

pytestmark = pytest.mark.anyio

DISTINCT = 10_000


def record(model: str, *, kind: str = "chat", n: int = 0) -> UsageRecord:
    return UsageRecord(
        ts=time.time(), request_id=f"r{n}", kind=kind, model=model, client_key_id=None,  # type: ignore[arg-type]
        stream=False, status=200, outcome="completed", latency_ms=12.0, ttfb_ms=3.0,
        prompt_tokens=100, completion_tokens=10, cached_tokens=5, tokens_before=200,
        tokens_after=100, strategies=("trim",), context_limit=8192,
        route="/v1/chat/completions", cost=0.001, baseline_cost=0.002,
    )  # fmt: skip


def model_labels(text: str) -> set[str]:
    return {
        sample.labels["model"]
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if "model" in sample.labels
    }


def test_ten_thousand_model_names_leave_the_metrics_bounded() -> None:
    labels = ModelLabels({"gpt-4o", "claude-sonnet-4-5"}, top=20)
    metrics = Metrics(lambda: 0.0, lambda: {}, labels=labels)
    metrics.observe(record("gpt-4o"))
    for i in range(DISTINCT):
        metrics.observe(record(f"junk-{i:05d}", kind="summary" if i % 2 else "chat", n=i))
    text = metrics.render().decode()
    assert model_labels(text) == {"gpt-4o", *(f"junk-{i:05d}" for i in range(20)), OTHER}
    assert labels.size == 2 + 20  # the structure itself: known + top, never more
    assert text.count("\n") < 2_000  # unbounded: about 480,000 lines
    assert len(text) < 250_000  # unbounded: about 33 MB
    for collector in (metrics.requests, metrics.latency, metrics.tokens, metrics.summaries):
        children = collector._metrics  # type: ignore[attr-defined]  # its series, by labels
        assert len({key[0] for key in children}) <= 2 + 20 + 1


def test_calibration_factors_only_for_named_models() -> None:
    factors = {"gpt-4o": 1.1, **{f"junk-{i}": 1.0 for i in range(50)}}
    labels = ModelLabels({"gpt-4o"}, top=2)
    metrics = Metrics(lambda: 0.0, lambda: factors, labels=labels)
    for i in range(50):
        metrics.observe(record(f"junk-{i}"))
    text = metrics.render().decode()
    calibrated = {
        s.labels["model"]
        for f in text_string_to_metric_families(text)
        if f.name == "inflight_calibration_factor"
        for s in f.samples
    }
    assert calibrated == {"gpt-4o", "junk-0", "junk-1"}
    assert labels.named_only(factors) == {"gpt-4o": 1.1, "junk-0": 1.0, "junk-1": 1.0}


def test_literal_names_are_the_configured_names_not_the_globs() -> None:
    assert literal_names(["gpt-4o*", "gpt-5-mini", "o1-[ab]", "qwen?", "claude-x"]) == {
        "gpt-5-mini",
        "claude-x",
    }


def _entry(requests: int, cost: float) -> dict[str, Any]:
    return {
        "requests": requests, "tokens_in": 10 * requests, "tokens_out": requests,
        "tokens_saved": 4 * requests, "tokens_estimated_before": 8 * requests,
        "summary_calls": 0, "summary_tokens": 0, "saved_share": 0.5,
        "recent_window_share": 0.3,
        "cost": {"currency": "USD", "actual": cost, "baseline": 2 * cost, "saved": cost,
                 "summaries": 0.0, "unpriced_requests": 0},
    }  # fmt: skip


def test_stats_models_keep_the_named_and_the_busiest_and_sum_the_rest() -> None:
    models = {f"junk-{i}": _entry(1 + i % 7, 0.001) for i in range(DISTINCT)}
    models["gpt-4o"] = _entry(1, 0.5)
    folded = ModelLabels({"gpt-4o", "unused"}, top=3).fold(models)
    assert len(folded) == 1 + 3 + 1
    assert "gpt-4o" in folded
    assert OTHER in folded
    busiest = sorted(folded.keys() - {"gpt-4o", OTHER})
    assert all(models[m]["requests"] == 7 for m in busiest)
    for field in ("requests", "tokens_in", "tokens_saved"):
        assert sum(e[field] for e in folded.values()) == sum(e[field] for e in models.values())
    other = folded[OTHER]
    assert other["saved_share"] == 0.5
    assert "recent_window_share" not in other
    assert other["cost"]["currency"] == "USD"
    total = sum(e["cost"]["actual"] for e in models.values())
    assert sum(e["cost"]["actual"] for e in folded.values()) == pytest.approx(total)


# -- through the app ------------------------------------------------------------------------


def _client(app: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy")


async def test_metrics_and_stats_of_the_app_stay_bounded(tmp_path: Path) -> None:
    fake = FakeUpstream()
    store = WatchedStore()
    app = create_app(
        make_settings(tmp_path, metrics_top_models=5),
        transport=httpx.ASGITransport(app=fake.app),
        store=store,
    )
    async with app.router.lifespan_context(app), _client(app) as client:
        for i in range(40):  # through the proxy: the app's own wiring
            body = {"model": f"client-{i}", "messages": [{"role": "user", "content": "hi"}]}
            assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
        metrics = app.state.inflight.metrics
        for i in range(DISTINCT):  # and many more, straight into the metrics
            metrics.observe(record(f"junk-{i:05d}", n=i))
        text = (await client.get("/metrics")).text
        assert model_labels(text) == {*(f"client-{i}" for i in range(5)), OTHER}
        assert len(text) < 100_000
        await store.written(40)
        await store.write_many([record(f"junk-{i:05d}", n=i) for i in range(2_000)])
        stats = (await client.get("/stats")).json()
    assert len(stats["models"]) <= 5 + 1
    assert sum(e["requests"] for e in stats["models"].values()) == 2_040
