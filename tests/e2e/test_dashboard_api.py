"""Money and the dashboard's data through the app: priced usage records, the `cost` object of
`/stats`, `inflight_cost_usd_total`, `/stats/timeseries`, the page's routes, the stores (SQLite
and PostgreSQL, an old table upgraded in place) and a malformed price table at startup."""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from inflight.factory import create_app
from inflight.pricing.meter import CostMeter
from inflight.pricing.table import PriceTable, PriceTableError
from inflight.settings import Settings
from inflight.usage.records import UsageRecord, UsageStore
from inflight.usage.stores import open_store
from tests.conftest import make_settings
from tests.support.fakes import FakeUpstream
from tests.support.pg_server import postgres_url
from tests.support.servers import WatchedStore

pytestmark = pytest.mark.anyio
CONFIG = Path(__file__).resolve().parents[2] / "config"
KEY = "sk-proxy-key"


def _messages(turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Summarise the logs."},
    ]
    for i in range(turns):
        messages.append({"role": "assistant", "content": f"reading part {i}"})
        messages.append({"role": "user", "content": f"part {i}: " + "log line " * 300})
    return messages


async def _chat(client: httpx.AsyncClient, model: str, messages: list[Any], **headers: str) -> None:
    response = await client.post(
        "/v1/chat/completions",
        json={"model": model, "messages": messages, "max_tokens": 32},
        headers=headers,
    )
    assert response.status_code == 200, response.text


@pytest.fixture
def store() -> WatchedStore:
    return WatchedStore()


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """Summaries made for the request that needs them: their records are counted with it."""
    return make_settings(tmp_path, summary_wait=True)


@pytest.fixture
async def app(
    settings: Settings, fake: FakeUpstream, store: WatchedStore
) -> AsyncIterator[FastAPI]:
    """The conftest app, its usage store one a test can wait on."""
    application = create_app(settings, transport=httpx.ASGITransport(app=fake.app), store=store)
    async with application.router.lifespan_context(application):
        yield application


@pytest.fixture
async def traffic(
    client: httpx.AsyncClient, fake: FakeUpstream, store: WatchedStore
) -> dict[str, Any]:
    """A growing gpt-4o conversation compacted on the way, one unpriced request, one summary."""
    fake.prompt_tokens = 40_000
    for turns in (2, 4, 6, 8):
        await _chat(client, "gpt-4o", _messages(turns), **{"x-compaction-context-limit": "2500"})
    await _chat(client, "local-llama", _messages(1))
    await _chat(
        client, "gpt-4o-mini", _messages(8),
        **{"x-compaction-context-limit": "2500", "x-compaction-strategy": "summarize"},
    )  # fmt: skip
    await store.written(6 + fake.summary_calls)
    stats = (await client.get("/stats")).json()
    return dict(stats)


# --- /stats and /metrics -----------------------------------------------------------------------


async def test_stats_cost_object(traffic: dict[str, Any], fake: FakeUpstream) -> None:
    cost = traffic["cost"]
    assert set(cost) == {"currency", "actual", "baseline", "saved", "summaries",
                         "saved_by_fit", "saved_by_cost_mode", "unpriced_requests",
                         "realised_net"}  # fmt: skip
    assert cost["currency"] == "USD"
    assert cost["unpriced_requests"] == 1
    assert cost["saved"] == pytest.approx(cost["baseline"] - cost["actual"], abs=1e-6)
    # 4 gpt-4o requests at 40k prompt + 2 completion tokens each, nothing cached, and the
    # summary calls `auto` made on the way (50 + 2 tokens each, at the same model's price)
    gpt4o = traffic["models"]["gpt-4o"]
    calls = gpt4o["summary_calls"]
    assert calls >= 1
    assert gpt4o["cost"]["summaries"] == pytest.approx(calls * (50 * 2.5 + 2 * 10) / 1e6)
    requests = 4 * (40_000 * 2.5 + 2 * 10) / 1e6
    assert gpt4o["cost"]["actual"] == pytest.approx(requests + gpt4o["cost"]["summaries"])
    # the baseline reads each previous uncompacted prompt from the cache (this fake upstream
    # never reports cache hits, so the baseline can come out cheaper: the honest direction)
    assert 0 < gpt4o["cost"]["baseline"] < requests
    mini = traffic["models"]["gpt-4o-mini"]
    assert mini["cost"]["summaries"] == pytest.approx(
        mini["summary_calls"] * (50 * 0.15 + 2 * 0.6) / 1e6
    )
    assert fake.summary_calls == calls + mini["summary_calls"]
    assert traffic["models"]["local-llama"]["cost"] == {
        "currency": "USD", "actual": 0.0, "baseline": 0.0, "saved": 0.0, "summaries": 0.0,
        "saved_by_fit": 0.0, "saved_by_cost_mode": 0.0, "unpriced_requests": 1,
    }  # fmt: skip
    assert cost["actual"] == pytest.approx(sum(m["cost"]["actual"] for m in
                                               traffic["models"].values()), abs=1e-6)  # fmt: skip
    assert cost["summaries"] == pytest.approx(
        gpt4o["cost"]["summaries"] + mini["cost"]["summaries"], abs=1e-6
    )


async def test_metrics_count_dollars(client: httpx.AsyncClient, traffic: dict[str, Any]) -> None:
    text = (await client.get("/metrics")).text
    values = {
        line.split("{")[1].split("}")[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("inflight_cost_usd_total{")
    }
    assert values['kind="actual"'] == pytest.approx(traffic["cost"]["actual"], abs=1e-5)
    assert values['kind="baseline"'] == pytest.approx(traffic["cost"]["baseline"], abs=1e-5)


# --- /stats/timeseries -------------------------------------------------------------------------


async def test_timeseries_buckets_and_recent(
    client: httpx.AsyncClient, traffic: dict[str, Any]
) -> None:
    body = (await client.get("/stats/timeseries", params={"bucket": 10, "recent": 3})).json()
    assert body["bucket"] == 10
    assert body["currency"] == "USD"
    assert body["until"] % 10 == 0
    assert body["until"] - body["since"] == 3_600
    series = body["series"]
    assert all(body["since"] <= b["ts"] <= body["until"] and b["ts"] % 10 == 0 for b in series)
    assert sum(b["requests"] for b in series) == traffic["requests"]
    assert sum(b["summary_calls"] for b in series) == traffic["summary_calls"]
    assert sum(b["tokens_saved"] for b in series) == traffic["tokens_saved"]
    assert sum(b["cost_actual"] for b in series) == pytest.approx(traffic["cost"]["actual"])
    assert sum(b["cost_baseline"] for b in series) == pytest.approx(traffic["cost"]["baseline"])
    recent = body["recent"]
    assert [r["model"] for r in recent] == ["gpt-4o-mini", "local-llama", "gpt-4o"]
    assert recent[1]["cost"] is None  # unpriced
    assert recent[0]["strategies"]
    assert recent[0]["tokens_before"] > recent[0]["tokens_after"]
    assert {"latency_ms", "status", "outcome", "baseline_cost"} <= set(recent[0])


@pytest.mark.parametrize(
    ("query", "param"),
    [("bucket=0", "bucket"), ("bucket=86401", "bucket"), ("bucket=ten", "bucket"),
     ("window=-1", "window"), ("recent=501", "recent"), ("recent=1.5", "recent")],
)  # fmt: skip
async def test_timeseries_rejects_bad_parameters(
    client: httpx.AsyncClient, query: str, param: str
) -> None:
    response = await client.get(f"/stats/timeseries?{query}")
    assert response.status_code == 400
    assert response.json()["error"]["param"] == param


async def test_timeseries_of_an_empty_store(client: httpx.AsyncClient) -> None:
    body = (await client.get("/stats/timeseries")).json()
    assert body["series"] == []
    assert body["recent"] == []


# --- the page ----------------------------------------------------------------------------------


async def test_page_and_its_files(client: httpx.AsyncClient) -> None:
    page = await client.get("/dashboard")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    policy = page.headers["content-security-policy"]
    assert "script-src 'self'" in policy
    assert "connect-src 'self'" in policy
    assert "/dashboard/dashboard.js" in page.text
    assert "http" not in page.text.split("<body")[0]
    script = await client.get("/dashboard/dashboard.js")
    assert script.headers["content-type"].startswith("text/javascript")
    assert "/stats/timeseries" in script.text
    assert (await client.get("/dashboard/dashboard.css")).status_code == 200
    for missing in ("/dashboard/nope.js", "/dashboard/index.html", "/dashboard/../app.py"):
        response = await client.get(missing)
        assert response.status_code == 404
        assert "error" in response.json()


async def test_keyed_proxy_serves_the_page_but_no_data_without_a_key(
    tmp_path: Path, fake: FakeUpstream
) -> None:
    app = create_app(
        make_settings(tmp_path, api_keys=KEY), transport=httpx.ASGITransport(app=fake.app)
    )
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://p") as client,
    ):
        page = await client.get("/dashboard")
        assert page.status_code == 200
        assert "key-form" in page.text
        assert (await client.get("/stats/timeseries")).status_code == 401
        assert (await client.get("/stats")).status_code == 401
        wrong = {"authorization": "Bearer nope"}
        assert (await client.get("/stats/timeseries", headers=wrong)).status_code == 401
        right = {"authorization": f"Bearer {KEY}"}
        assert (await client.get("/stats/timeseries", headers=right)).status_code == 200


# --- startup -----------------------------------------------------------------------------------


def test_malformed_price_table_stops_the_proxy_naming_the_file(tmp_path: Path) -> None:
    config = tmp_path / "config"
    shutil.copytree(CONFIG, config)
    (config / "prices.toml").write_text('[[price]]\nmodels = ["x"]\ninput = "cheap"\n')
    with pytest.raises(PriceTableError, match=str(config / "prices.toml")):
        create_app(make_settings(tmp_path, config_dir=config))


async def test_a_config_dir_without_prices_uses_the_packaged_table(
    tmp_path: Path, fake: FakeUpstream
) -> None:
    config = tmp_path / "config"
    config.mkdir()  # a CONFIG_DIR holding only what it changes: here nothing
    store = WatchedStore()
    app = create_app(
        make_settings(tmp_path, config_dir=config),
        transport=httpx.ASGITransport(app=fake.app),
        store=store,
    )
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://p") as client,
    ):
        await _chat(client, "gpt-4o", _messages(1))
        await store.written(1)
        stats = (await client.get("/stats")).json()
    assert stats["cost"]["actual"] == pytest.approx((11 * 2.5 + 2 * 10) / 1e6)


# --- the stores --------------------------------------------------------------------------------


def _record(i: int, **kw: Any) -> UsageRecord:
    values: dict[str, Any] = {
        "ts": 1_000_000.0 + i * 30, "request_id": f"r{i}", "kind": "chat", "model": "gpt-4o",
        "client_key_id": None, "stream": False, "status": 200, "outcome": "completed",
        "latency_ms": 5.0, "ttfb_ms": None, "prompt_tokens": 1000, "completion_tokens": 10,
        "cached_tokens": 0, "tokens_before": 1500, "tokens_after": 1000, "strategies": ("trim",),
        "context_limit": 4096, "route": "/v1/chat/completions", "cost": 0.01,
        "baseline_cost": 0.02,
    }  # fmt: skip
    values.update(kw)
    return UsageRecord(**values)


async def check_money(store: UsageStore) -> None:
    await store.open()
    try:
        await store.write_many(
            [
                _record(0),
                _record(1, cache_write_tokens=200),
                _record(2, model="local", cost=None, baseline_cost=None),
                _record(3, kind="summary", cost=0.005, baseline_cost=0.0, strategies=()),
                _record(4, kind="passthrough", model="", cost=None, baseline_cost=None),
            ]
        )
        stats = await store.totals()
        assert stats["cost"] == {
            "currency": "USD", "actual": 0.025, "baseline": 0.04, "saved": 0.015,
            "summaries": 0.005, "saved_by_fit": 0.0, "saved_by_cost_mode": 0.0,
            "unpriced_requests": 1, "realised_net": 0.0,
        }  # fmt: skip
        assert stats["models"]["gpt-4o"]["cost"]["actual"] == 0.025
        activity = await store.activity(1_000_000.0, 60, 10)
        assert [(b["ts"], b["requests"], b["summary_calls"]) for b in activity["series"]] == [
            (999_960, 1, 0), (1_000_020, 2, 0), (1_000_080, 0, 1),
        ]  # fmt: skip
        assert [r["ts"] for r in activity["recent"]] == [1_000_060.0, 1_000_030.0, 1_000_000.0]
        assert activity["recent"][0]["cost"] is None
        later = await store.activity(1_000_030.0, 60, 1)
        assert sum(b["requests"] for b in later["series"]) == 2
        assert len(later["recent"]) == 1
    finally:
        await store.close()


async def test_sqlite_store_keeps_dollars(tmp_path: Path) -> None:
    await check_money(open_store(f"sqlite:///{tmp_path / 'usage.db'}"))


# The table as schema version 2 created it (no dollars): upgraded in place, rows kept.
V2_TABLE = """CREATE TABLE inflight_usage (
    ts DOUBLE PRECISION NOT NULL, request_id TEXT NOT NULL, kind TEXT NOT NULL,
    model TEXT NOT NULL, client_key_id TEXT, stream INTEGER NOT NULL, status INTEGER NOT NULL,
    outcome TEXT NOT NULL, latency_ms DOUBLE PRECISION NOT NULL, ttfb_ms DOUBLE PRECISION,
    prompt_tokens BIGINT, completion_tokens BIGINT, cached_tokens BIGINT,
    tokens_before BIGINT NOT NULL, tokens_after BIGINT NOT NULL, strategies TEXT NOT NULL,
    context_limit BIGINT, route TEXT)"""
V2_ROW = (
    "INSERT INTO inflight_usage VALUES (1.0, 'old', 'chat', 'gpt-4o', NULL, 0, 200, "
    "'completed', 1.0, NULL, 10, 1, 0, 20, 10, '', 8192, '/v1/chat/completions')"
)


async def test_sqlite_version_2_table_gains_the_dollar_columns(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE inflight_schema (version INTEGER NOT NULL)")
        conn.execute("INSERT INTO inflight_schema VALUES (2)")
        conn.execute(V2_TABLE)
        conn.execute(V2_ROW)
    store = open_store(f"sqlite:///{path}")
    await store.open()
    try:
        await store.write_many([_record(0)])
        stats = await store.totals()
        assert stats["requests"] == 2
        # the old row has no price: it counts as unpriced, never as free money
        assert stats["cost"]["actual"] == 0.01
        assert stats["cost"]["unpriced_requests"] == 1
    finally:
        await store.close()
    with sqlite3.connect(path) as conn:
        columns = {row[1] for row in conn.execute("PRAGMA table_info(inflight_usage)")}
        assert {"cost", "baseline_cost", "cache_write_tokens"} <= columns


@pytest.fixture(scope="module")
def pg() -> Iterator[str]:
    with postgres_url() as url:
        yield url


@pytest.mark.postgres
async def test_postgres_store_keeps_dollars(pg: str) -> None:
    import psycopg

    async with await psycopg.AsyncConnection.connect(pg, autocommit=True) as conn:
        await conn.execute("DROP TABLE IF EXISTS inflight_usage, inflight_schema")
        await conn.execute("CREATE TABLE inflight_schema (version INTEGER NOT NULL)")
        await conn.execute("INSERT INTO inflight_schema VALUES (2)")
        await conn.execute(V2_TABLE)
    await check_money(open_store(pg))


# --- the meter on records ----------------------------------------------------------------------


@pytest.fixture
def meter() -> CostMeter:
    return CostMeter(PriceTable.load(CONFIG / "prices.toml"))


def test_meter_prices_records(meter: CostMeter) -> None:
    body = {"model": "gpt-4o", "messages": _messages(1)}
    first = meter.priced(_record(0, prompt_tokens=2000, cached_tokens=0, tokens_before=5000,
                                 tokens_after=2000, completion_tokens=100), body)  # fmt: skip
    assert first.cost == pytest.approx((2000 * 2.5 + 100 * 10) / 1e6)
    assert first.baseline_cost == pytest.approx((5000 * 2.5 + 100 * 10) / 1e6)  # uncached
    grown = {"model": "gpt-4o", "messages": _messages(2)}
    second = meter.priced(
        _record(1, prompt_tokens=2500, cached_tokens=1920, tokens_before=7000, tokens_after=2500,
                completion_tokens=100), grown,
    )  # fmt: skip
    # baseline: 7,000 prompt tokens, of which the previous 5,000 cached (in 128-token steps)
    hit = 5000 - 5000 % 128
    assert second.baseline_cost == pytest.approx(((7000 - hit) * 2.5 + hit * 1.25 + 1000) / 1e6)
    assert second.cost == pytest.approx((580 * 2.5 + 1920 * 1.25 + 1000) / 1e6)


def test_meter_unpriced_summary_rejected_and_abandoned(meter: CostMeter) -> None:
    assert meter.priced(_record(0, model="my-local-model"), None).cost is None
    summary = meter.priced(_record(0, kind="summary", tokens_before=0, tokens_after=0), None)
    assert summary.cost == pytest.approx((1000 * 2.5 + 10 * 10) / 1e6)
    assert summary.baseline_cost == 0.0
    rejected = _record(0, outcome="rejected", status=400, prompt_tokens=None,
                       completion_tokens=None, cached_tokens=None)  # fmt: skip
    assert (meter.priced(rejected, None).cost, meter.priced(rejected, None).baseline_cost) == (
        0.0, 0.0,
    )  # fmt: skip
    gone = _record(0, outcome="client_disconnected", prompt_tokens=None, completion_tokens=None,
                   cached_tokens=None, tokens_before=3000, tokens_after=1000)  # fmt: skip
    priced = meter.priced(gone, None)
    assert priced.cost == pytest.approx(1000 * 2.5 / 1e6)
    assert priced.baseline_cost == pytest.approx(3000 * 2.5 / 1e6)
    passthrough = _record(0, kind="passthrough", model="")
    assert meter.priced(passthrough, None) is passthrough
    sonnet = _record(0, model="claude-sonnet-4-5", prompt_tokens=10_000, cached_tokens=6_000,
                     cache_write_tokens=3_000, completion_tokens=500, tokens_before=10_000,
                     tokens_after=10_000)  # fmt: skip
    expected = (1_000 * 3.0 + 6_000 * 0.3 + 3_000 * 3.75 + 500 * 15.0) / 1e6
    assert meter.priced(sonnet, None).cost == pytest.approx(expected)
