"""Why a request was cut (DESIGN.md §16): the plan says `fit` or `cost`, the usage record keeps
it (`cut_for`, schema version 6), and `/stats` nets the dollars saved by each kind apart."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from inflight.compaction.cost_mode import CostRule
from inflight.compaction.engine import compact
from inflight.compaction.policy import Budget
from inflight.factory import create_app
from inflight.usage.records import UsageRecord
from inflight.usage.stores import open_store
from inflight.usage.stores.sql import MIGRATIONS, SCHEMA_VERSION
from tests.conftest import make_settings
from tests.support.conversations import simple_count
from tests.support.fakes import FakeUpstream
from tests.support.servers import WatchedStore
from tests.unit.compaction.test_cost_mode import AUTO, session

pytestmark = pytest.mark.anyio
OPENAI = CostRule.priced(0.50, 2.00, 1024)


def test_the_plan_says_why_it_cuts() -> None:
    messages = session(60, 400)  # ~6.2k tokens
    roomy = Budget(window=65_536, reserve=8192, threshold=0.8, target=0.5, cost=OPENAI)
    tight = Budget(window=6000, reserve=500, threshold=0.8, target=0.5, cost=OPENAI)
    plain = Budget(window=6000, reserve=500, threshold=0.8, target=0.5)
    assert compact(messages[:4], AUTO, roomy, simple_count, 0).plan.cut_for is None
    early = compact(messages, AUTO, roomy, simple_count, 0)
    assert early.applied
    assert early.plan.cut_for == "cost"  # the window held it all: only cost mode cut it
    for budget in (tight, plain):  # over the trigger as received: cut to fit, cost mode or not
        result = compact(messages, AUTO, budget, simple_count, 0)
        assert result.applied
        assert result.plan.cut_for == "fit"


def record(i: int, cut_for: str | None, cost: float, baseline: float) -> UsageRecord:
    return UsageRecord(
        ts=1_000_000.0 + i, request_id=f"r{i}", kind="chat", model="gpt-4o" if i else "other",
        client_key_id=None, stream=False, status=200, outcome="completed", latency_ms=1.0,
        ttfb_ms=None, prompt_tokens=100, completion_tokens=1, cached_tokens=0,
        tokens_before=200, tokens_after=100, strategies=("trim",), context_limit=8192,
        cost=cost, baseline_cost=baseline, cut_for=cut_for,  # type: ignore[arg-type]
    )  # fmt: skip


RECORDS = [
    record(0, "fit", 0.010, 0.030),
    record(1, "fit", 0.020, 0.025),
    record(2, "cost", 0.010, 0.014),
    record(3, "cost", 0.010, 0.008),  # an early cut that has not paid back yet
    record(4, None, 0.005, 0.005),
]


def check_split(stats: dict[str, Any], unsplit: float = 0.0) -> None:
    """`unsplit`: what records that say no kind of cut saved."""
    cost = stats["cost"]
    assert cost["saved_by_fit"] == pytest.approx(0.020 + 0.005)
    assert cost["saved_by_cost_mode"] == pytest.approx(0.004 - 0.002)
    split = cost["saved_by_fit"] + cost["saved_by_cost_mode"]
    assert cost["saved"] == pytest.approx(split + unsplit)
    assert stats["models"]["gpt-4o"]["cost"]["saved_by_fit"] == pytest.approx(0.005)
    assert stats["models"]["other"]["cost"]["saved_by_cost_mode"] == 0.0


async def test_stats_net_the_savings_of_each_kind_of_cut(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'usage.db'}")
    await store.open()
    try:
        await store.write_many(RECORDS)
        check_split(await store.totals())
    finally:
        await store.close()


async def test_a_version_5_table_gains_cut_for(tmp_path: Path) -> None:
    path = tmp_path / "v5.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE inflight_schema (version INTEGER NOT NULL)")
        conn.execute("INSERT INTO inflight_schema VALUES (5)")
        conn.execute(
            """CREATE TABLE inflight_usage (ts DOUBLE PRECISION NOT NULL, request_id TEXT NOT NULL,
            kind TEXT NOT NULL, model TEXT NOT NULL, client_key_id TEXT, stream INTEGER NOT NULL,
            status INTEGER NOT NULL, outcome TEXT NOT NULL, latency_ms DOUBLE PRECISION NOT NULL,
            ttfb_ms DOUBLE PRECISION, prompt_tokens BIGINT, completion_tokens BIGINT,
            cached_tokens BIGINT, tokens_before BIGINT NOT NULL, tokens_after BIGINT NOT NULL,
            strategies TEXT NOT NULL, context_limit BIGINT, route TEXT,
            cache_write_tokens BIGINT, cost DOUBLE PRECISION, baseline_cost DOUBLE PRECISION,
            id TEXT)"""
        )
        for statement in MIGRATIONS[4]:
            conn.execute(statement)
        conn.execute(
            "INSERT INTO inflight_usage VALUES (1.0, 'old', 'chat', 'old', NULL, 0, 200, "
            "'completed', 1.0, NULL, 10, 1, 0, 20, 10, 'trim', 8192, NULL, NULL, 0.5, 0.75, 'x')"
        )
    store = open_store(f"sqlite:///{path}")
    await store.open()
    try:
        await store.write_many(RECORDS)
        stats = await store.totals()
        check_split(stats, unsplit=0.25)  # the old row says no kind of cut: in neither
    finally:
        await store.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT version FROM inflight_schema").fetchone()[0] == SCHEMA_VERSION


@pytest.fixture
async def app(tmp_path: Path, fake: FakeUpstream) -> AsyncIterator[tuple[FastAPI, WatchedStore]]:
    store = WatchedStore()
    settings = make_settings(tmp_path, cost_min_prompt=1000)
    application = create_app(settings, transport=httpx.ASGITransport(app=fake.app), store=store)
    async with application.router.lifespan_context(application):
        yield application, store


async def test_records_and_stats_keep_why_requests_were_cut(
    app: tuple[FastAPI, WatchedStore], fake: FakeUpstream
) -> None:
    application, store = app
    fake.prompt_tokens = 20_000  # more than any prompt sent: no silent cut to learn
    messages = session(30, 400)  # ~2.2k tokens
    sent = [
        ({"x-compaction-context-limit": "200000", "x-compaction-for-cost": "on"}, "cost"),
        ({"x-compaction-context-limit": "1500", "x-compaction-for-cost": "on"}, "fit"),
        ({"x-compaction-context-limit": "1500"}, "fit"),
        ({"x-compaction-context-limit": "200000"}, None),
    ]
    transport = httpx.ASGITransport(app=application)
    async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as client:
        for headers, _ in sent:
            response = await client.post(
                "/v1/chat/completions",
                json={"model": "gpt-4o", "messages": messages, "max_tokens": 8},
                headers=headers,
            )
            assert response.status_code == 200, response.text
        records = await store.written(len(sent))
        stats = (await client.get("/stats")).json()
    chats = sorted((r for r in records if r.kind == "chat"), key=lambda r: r.ts)
    assert [r.cut_for for r in chats] == [why for _, why in sent]
    by_kind = {"fit": 0.0, "cost": 0.0}
    for r in chats:
        if r.cut_for is not None:
            assert r.cost is not None
            assert r.baseline_cost is not None
            by_kind[r.cut_for] += r.baseline_cost - r.cost
    assert stats["cost"]["saved_by_fit"] == pytest.approx(by_kind["fit"], abs=1e-9)
    assert stats["cost"]["saved_by_cost_mode"] == pytest.approx(by_kind["cost"], abs=1e-9)
    assert stats["cost"]["saved_by_cost_mode"] != 0
