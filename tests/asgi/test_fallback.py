"""No unexpected exception from compaction, ever: long histories with a cold summary cache are
summarised without recursion, and any failure inside compaction falls back to `trim` (or, when
that fails too, forwards the messages as received), is logged with its traceback and reported
in `X-Compaction-Fallback` — never a 500."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import redis.exceptions
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inflight.compaction.report import report_headers
from inflight.compaction.service import CompactionService
from inflight.compaction.summary.cache import MemoryCache, SummaryFlight
from inflight.compaction.summary.prompt import Completer, SummaryPrompt
from inflight.compaction.summary.rolling import Summaries
from inflight.compaction.units import check_pair_safety
from inflight.factory import create_app
from inflight.tokens.counter import ChatTokenCounter
from inflight.tokens.encodings import load_encodings
from inflight.windows.registry import WindowRegistry
from inflight.windows.table import ModelTable
from tests.conftest import make_settings
from tests.support.conversations import conversations
from tests.support.fakes import FakeUpstream
from tests.support.fakes.chat import completion

pytestmark = pytest.mark.anyio
CONFIG = Path(__file__).resolve().parents[2] / "config"


def long_history(pairs: int) -> list[dict[str, Any]]:
    """The issue's repro: a system message, a first question, then `pairs` long exchanges."""
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "start"}]
    for i in range(pairs):
        messages.append({"role": "assistant", "content": f"a{i} " * 60})
        messages.append({"role": "user", "content": f"u{i} " * 60})
    return messages


def tiny_messages(n: int) -> list[dict[str, Any]]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": "x"} for i in range(n)]


@pytest.fixture
async def proxy(tmp_path: Path, fake: FakeUpstream) -> AsyncIterator[httpx.AsyncClient]:
    """A fresh app, so a cold summary cache; app errors come back as responses (a 500 would).
    Its requests wait for their summaries: compaction's own failures are what is tested."""
    app = create_app(
        make_settings(tmp_path, summary_wait=True), transport=httpx.ASGITransport(app=fake.app)
    )
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://proxy") as client,
    ):
        yield client


async def send(client: httpx.AsyncClient, messages: list[dict[str, Any]]) -> httpx.Response:
    body = {"model": "gpt-4o", "messages": messages}
    return await client.post(
        "/v1/chat/completions",
        content=orjson.dumps(body),
        headers={"X-Compaction-Context-Limit": "2048"},
    )


@pytest.mark.parametrize(
    "messages",
    [long_history(480), tiny_messages(99_999)],
    ids=["480 long pairs", "99,999 tiny messages"],
)
async def test_a_long_history_with_a_cold_summary_cache_is_summarised(
    proxy: httpx.AsyncClient, fake: FakeUpstream, messages: list[dict[str, Any]]
) -> None:
    """Issue 12, defect 1: hundreds of past compaction events, nothing cached — one rolling
    summary (in chunks), no RecursionError, no 500."""
    response = await send(proxy, messages)
    assert response.status_code == 200, response.text
    assert response.headers["x-compaction-applied"].endswith("summarize")
    assert "x-compaction-fallback" not in response.headers
    calls = int(response.headers["x-compaction-summary-calls"])
    assert calls == fake.summary_calls >= 1
    forwarded = fake.chat_requests[-1].json()["messages"]
    head = 2 if messages[0]["role"] == "system" else 1
    assert forwarded[:head] == messages[:head]
    assert any(str(m["content"]).startswith("[Summary") for m in forwarded)
    assert forwarded[-1] == messages[-1]
    assert int(response.headers["x-compaction-tokens-after"]) <= 2048 - 1024  # the budget


def _explode(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("a bug inside compaction")


async def test_an_unexpected_error_falls_back_to_trim_and_is_logged(
    proxy: httpx.AsyncClient,
    fake: FakeUpstream,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr("inflight.compaction.summary.rolling.render_span", _explode)
    messages = long_history(40)
    with caplog.at_level(logging.ERROR, logger="inflight.compaction.service"):
        response = await send(proxy, messages)
    assert response.status_code == 200
    assert response.headers["x-compaction-applied"] == "trim"
    assert response.headers["x-compaction-fallback"] == "trim: RuntimeError in compaction"
    forwarded = fake.chat_requests[-1].json()["messages"]
    assert forwarded[:2] == messages[:2]
    assert forwarded[-1] == messages[-1]
    assert int(response.headers["x-compaction-tokens-after"]) < int(
        response.headers["x-compaction-tokens-before"]
    )
    failures = [r for r in caplog.records if r.exc_info is not None]
    assert failures
    assert failures[0].exc_info is not None
    assert failures[0].exc_info[0] is RuntimeError  # the traceback is in the log


async def test_when_trim_fails_too_the_request_is_forwarded_as_received(
    proxy: httpx.AsyncClient,
    fake: FakeUpstream,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr("inflight.compaction.job.compact", _explode)  # the pipeline
    monkeypatch.setattr("inflight.compaction.job.plan", _explode)
    monkeypatch.setattr("inflight.compaction.service.compact", _explode)  # the fallback's trim
    messages = long_history(40)
    body = orjson.dumps({"model": "gpt-4o", "messages": messages})
    with caplog.at_level(logging.ERROR, logger="inflight.compaction.service"):
        response = await proxy.post(
            "/v1/chat/completions", content=body, headers={"X-Compaction-Context-Limit": "2048"}
        )
    assert response.status_code == 200
    assert response.headers["x-compaction-applied"] == "none"
    assert response.headers["x-compaction-fallback"] == "none: RuntimeError in compaction"
    assert fake.chat_requests[-1].body == body  # the bytes as received
    assert sum(r.exc_info is not None for r in caplog.records) == 2  # both failures, traced


ERRORS: list[type[Exception]] = [
    RuntimeError,
    RecursionError,
    KeyError,
    TypeError,
    MemoryError,
    ConnectionError,
    redis.exceptions.ConnectionError,
]
PLACES = ["count", "fixed", "cache", "completer", "garbage", "nowhere"]


class Fault:
    """Where the injected failure happens, after how many good calls, what it raises, and
    whether it fails once (a glitch) or from then on (an outage, or a bug that always hits)."""

    def __init__(self, place: str, after: int, error: type[Exception], once: bool) -> None:
        self.place, self.after, self.error, self.once = place, after, error, once
        self.fired = False

    def check(self, place: str) -> None:
        if place != self.place or (self.once and self.fired):
            return
        if self.after > 0:
            self.after -= 1
            return
        self.fired = True
        raise self.error("injected")


@st.composite
def faults(draw: st.DrawFn) -> Fault:
    place = draw(st.sampled_from(PLACES))
    calls = 80 if place == "count" else 2  # how often each place is reached per request
    after = draw(st.integers(0, calls))
    return Fault(place, after, draw(st.sampled_from(ERRORS)), draw(st.booleans()))


class FaultyCounter(ChatTokenCounter):
    fault: Fault

    def count_message(self, model: str, message: Mapping[str, Any]) -> int:
        self.fault.check("count")
        return super().count_message(model, message)

    def count_messages(self, model: str, messages: Sequence[Mapping[str, Any]]) -> Sequence[int]:
        for _ in messages:  # the batch counts each message as count_message would
            self.fault.check("count")
        return super().count_messages(model, messages)

    def count_fixed(self, model: str, body: Mapping[str, Any]) -> int:
        self.fault.check("fixed")
        return super().count_fixed(model, body)


class FaultyCache(MemoryCache):
    """A summary cache that goes down like Redis does."""

    def __init__(self, fault: Fault) -> None:
        super().__init__()
        self.fault = fault

    async def get(self, key: str) -> str | None:
        self.fault.check("cache")
        return await super().get(key)


def completer_for(fault: Fault) -> Completer:
    async def complete(body: dict[str, Any]) -> tuple[int, bytes]:
        fault.check("completer")
        if fault.place == "garbage":
            fault.fired = True
            return 200, b"<html>"
        return 200, orjson.dumps(completion(body["model"], "the summary so far", 40))

    return complete


@pytest.fixture(scope="module")
def table() -> ModelTable:
    return ModelTable.load(CONFIG / "models.toml")


@pytest.fixture(scope="module")
def encodings() -> Any:
    return load_encodings()


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    messages=conversations(),
    window=st.sampled_from([1024, 2048, 4096, 8192]),
    fault=faults(),
    strategy=st.sampled_from(["auto", "summarize", "truncate,prune,trim", "middle-out", "none"]),
)
async def test_no_unexpected_exception_from_compaction_ever(
    tmp_path: Path,
    table: ModelTable,
    encodings: Any,
    messages: list[dict[str, Any]],
    window: int,
    fault: Fault,
    strategy: str,
) -> None:
    """Whatever fails inside compaction — counting, the plan, the summary cache, the
    summariser — the request gets `trim` (or its messages as received) and the failure is
    reported; a summariser that answers garbage is the ordinary summary fallback."""
    counter = FaultyCounter(encodings, table)
    counter.fault = fault
    summaries = Summaries(
        SummaryPrompt.load(CONFIG / "summary_prompt.md"), SummaryFlight(FaultyCache(fault))
    )
    service = CompactionService(
        make_settings(tmp_path),
        counter,
        WindowRegistry(table, None),
        summaries,
        lambda model, headers, api: completer_for(fault),
    )
    headers = {"x-compaction-context-limit": str(window), "x-compaction-strategy": strategy}
    preview = await service.plan(headers, {"model": "gpt-4o", "messages": messages}, "http://u/v1")
    out = preview.result.messages
    shown = report_headers(preview)
    assert check_pair_safety(out) == []
    if preview.error is None:
        assert "X-Compaction-Fallback" not in shown
        assert not fault.fired or fault.place == "garbage"
        if fault.fired:
            assert preview.fallback
            assert preview.result.applied[-1:] in ((), ("trim",))
        return
    assert fault.fired
    assert shown["X-Compaction-Fallback"] == preview.error
    what, _, why = preview.error.partition(": ")
    assert why == f"{fault.error.__name__} in compaction"
    if what == "trim":
        assert set(preview.result.applied) <= {"trim"}
        assert strategy != "none"
    else:
        assert what == "none"
        assert all(a is b for a, b in zip(out, messages, strict=True))
        assert shown["X-Compaction-Applied"] == "none"
