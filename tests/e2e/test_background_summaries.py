"""Summaries off the request path (DESIGN.md §12): a compaction event is served at once
(`pending`) while a slow summariser works, the summary stands in from the first request after
it is cached (`cached`), the cut is the same either way, failures are backed off (`failed`),
wait mode still waits (`ready`), shutdown cancels a running summary, a summary waits for its
upstream to be idle and never runs more than the concurrency limit allows, summaries are made
ahead of the event, and two replicas sharing a real Redis never make one twice."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson
import pytest
from fastapi import FastAPI
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from inflight.compaction.inserted import SUMMARY_PREFIX
from inflight.compaction.planner import plan
from inflight.compaction.policy import Budget
from inflight.compaction.service import CompactionService
from inflight.compaction.summary.background import IDLE_SETTLE, BackgroundSummaries
from inflight.compaction.summary.cache import MemoryCache, SummaryFlight
from inflight.compaction.summary.prompt import SummaryPrompt
from inflight.compaction.summary.rolling import Summaries, SummaryJob
from inflight.compaction.summary.stand_in import OMITTED
from inflight.compaction.truncate import truncate_unit
from inflight.compaction.units import check_pair_safety, group_units, pinned_head
from inflight.factory import create_app
from inflight.proxy.upstream import Upstream
from inflight.settings import Settings
from inflight.tokens.counter import ChatTokenCounter
from inflight.tokens.encodings import load_encodings
from inflight.windows.registry import WindowRegistry
from inflight.windows.table import ModelTable
from tests.conftest import make_settings
from tests.e2e.test_summarize import agent_log
from tests.support import request_points
from tests.support.conversations import conversations, follows_strict_rule, simple_count, summary_in
from tests.support.fakes import FakeUpstream
from tests.support.fakes.chat import completion
from tests.support.redis_server import redis_url

pytestmark = pytest.mark.anyio
CONFIG = Path(__file__).resolve().parents[2] / "config"
MESSAGES = agent_log(40)
ENCODINGS = load_encodings()


async def until(condition: Callable[[], bool], limit: float = 10.0) -> None:
    """Wait (bounded) until `condition()` holds (state of the app or the fake: polled)."""
    with anyio.fail_after(limit):
        while not condition():  # noqa: ASYNC110
            await anyio.sleep(0.01)


def background_of(app: FastAPI) -> BackgroundSummaries:
    background = app.state.inflight.compactor.background
    assert isinstance(background, BackgroundSummaries)
    return background


def idle(app: FastAPI) -> bool:
    background = background_of(app)
    counts = background.counts
    return background.predicting == 0 and counts.queued == 0 and counts.running == 0


def without_summary(messages: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """`messages` with the summary taken out (a message of its own, or a folded text part)."""
    out: list[Mapping[str, Any]] = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, str) and content.startswith(SUMMARY_PREFIX):
            continue
        if isinstance(content, list) and str(content[-1].get("text", "")).startswith(
            SUMMARY_PREFIX
        ):
            rest = content[:-1]
            m = {**m, "content": rest[0]["text"] if len(rest) == 1 else rest}
        out.append(m)
    return out


@pytest.fixture
async def open_app(tmp_path: Path, fake: FakeUpstream) -> AsyncIterator[Callable[..., Any]]:
    """Opens apps on the fake upstream (`settings` overrides), closes them at the end."""
    fake.context_window = 8192
    fake.enforce_pairs = True
    opened = 0

    async with AsyncExitStack() as stack:

        async def open_one(**overrides: Any) -> tuple[FastAPI, httpx.AsyncClient]:
            nonlocal opened
            opened += 1
            (tmp_path / str(opened)).mkdir()
            settings = make_settings(tmp_path / str(opened), **overrides)
            app = create_app(settings, transport=httpx.ASGITransport(app=fake.app))
            await stack.enter_async_context(app.router.lifespan_context(app))
            client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://p")
            await stack.enter_async_context(client)
            return app, client

        stack.callback(fake.unstall.set)  # runs first: nothing stalls the shutdown
        yield open_one


async def send(
    client: httpx.AsyncClient, messages: Sequence[Mapping[str, Any]], **headers: str
) -> httpx.Response:
    body = {"model": "fake-model", "messages": list(messages), "max_tokens": 256}
    response = await client.post(
        "/v1/chat/completions", content=orjson.dumps(body), headers=headers
    )
    assert response.status_code == 200, response.text
    return response


async def first_event(
    client: httpx.AsyncClient, messages: Sequence[Mapping[str, Any]] = MESSAGES
) -> tuple[int, httpx.Response]:
    """Replay `messages` until the first request whose compaction event needs a summary."""
    for k in request_points(messages):
        response = await send(client, messages[:k])
        if "x-compaction-summary" in response.headers:
            return k, response
    raise AssertionError("no compaction event")


def forwarded(fake: FakeUpstream) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = fake.chat_requests[-1].json()["messages"]
    return messages


async def test_an_event_is_served_at_once_and_its_summary_stands_in_later(
    open_app: Callable[..., Any], fake: FakeUpstream
) -> None:
    fake.summary_failure = "stall"  # the summariser answers only when the test says so
    app, client = await open_app(summary_ahead=1.0, summary_timeout=60, summary_facts_guard=False)
    k, event = await first_event(client)
    # served while the summariser is still working on it: nothing waited for it
    assert event.headers["x-compaction-summary"] == "pending"
    assert event.headers["x-compaction-applied"].endswith("trim")
    assert "x-compaction-summary-fallback" not in event.headers
    pending = forwarded(fake)
    assert summary_in(pending) is None
    await until(lambda: fake.summary_calls == 1)
    assert not fake.unstall.is_set()
    again = await send(client, MESSAGES[:k])
    assert again.headers["x-compaction-summary"] == "pending"
    assert forwarded(fake) == pending
    assert fake.summary_calls == 1  # one summary in flight per span
    fake.unstall.set()
    await until(lambda: background_of(app).counts.made == 1)
    cached = await send(client, MESSAGES[:k])
    assert cached.headers["x-compaction-summary"] == "cached"
    assert cached.headers["x-compaction-applied"].endswith("summarize")
    with_it = forwarded(fake)
    assert summary_in(with_it) == SUMMARY_PREFIX + "summary #1: facts kept"
    assert without_summary(with_it) == pending  # the same cut: only the summary appeared
    later = await send(client, MESSAGES[: k + 2])
    assert later.headers["x-compaction-summary"] == "cached"
    assert forwarded(fake)[: len(with_it)] == with_it  # and the next prompt extends it
    assert fake.summary_calls == 1


async def test_wait_mode_waits_for_the_summary(
    open_app: Callable[..., Any], fake: FakeUpstream
) -> None:
    fake.summary_failure = "slow"
    fake.summary_pause = 0.3
    _, client = await open_app(summary_ahead=1.0)
    k, event = await first_event(client)
    assert event.headers["x-compaction-summary"] == "pending"
    fresh = [*MESSAGES[:k]]  # another conversation: its first output differs
    fresh[3] = {**fresh[3], "content": fresh[3]["content"].replace("output 0", "result 0")}
    waited = await send(client, fresh, **{"X-Compaction-Summary-Wait": "true"})
    assert waited.headers["x-compaction-summary"] == "ready"
    assert waited.headers["x-compaction-summary-calls"] == "1"
    assert summary_in(forwarded(fake)) is not None


async def test_a_failed_summary_is_failed_with_the_same_cut_and_backed_off(
    open_app: Callable[..., Any], fake: FakeUpstream
) -> None:
    fake.summary_failure = "status"
    app, client = await open_app(summary_ahead=1.0)
    k, event = await first_event(client)
    assert event.headers["x-compaction-summary"] == "pending"
    pending = forwarded(fake)
    await until(lambda: background_of(app).counts.failed == 1)
    for n in (k, k, k + 2):
        response = await send(client, MESSAGES[:n])
        assert response.headers["x-compaction-summary"] == "failed"
        assert "failed recently" in response.headers["x-compaction-summary-fallback"]
        assert forwarded(fake)[: len(pending)] == pending  # the same cut, no summary
    assert fake.summary_calls == 1  # backed off: not retried by each request
    stats = (await client.get("/stats")).json()["summaries"]
    assert stats["failures"] == {"http_500": 1}
    assert stats["background"]["failed"] == 1


async def test_shutdown_cancels_a_running_background_summary(
    tmp_path: Path, fake: FakeUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    fake.context_window = 8192
    fake.summary_failure = "stall"
    app = create_app(
        make_settings(tmp_path, summary_ahead=1.0), transport=httpx.ASGITransport(app=fake.app)
    )
    try:
        async with app.router.lifespan_context(app):
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://p"
            ) as client:
                _, event = await first_event(client)
            assert event.headers["x-compaction-summary"] == "pending"
            await until(lambda: background_of(app).counts.running == 1)
            await until(lambda: fake.summary_calls == 1)
            started = time.monotonic()
        assert time.monotonic() - started < 5  # the stalled call did not hold up shutdown
    finally:
        fake.unstall.set()
    counts = background_of(app).counts
    assert counts.running == counts.queued == 0
    assert counts.skipped == {"shutdown": 1}
    assert app.state.inflight.metrics.summary_stats.failures == {"cancelled": 1}
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def summary_job(messages: list[dict[str, Any]], complete: Any) -> SummaryJob:
    budget = Budget(4096, 256, 0.8, 0.5)
    return SummaryJob(
        messages=messages,
        plan=plan(messages, ("summarize",), budget, simple_count, 0, 256),
        model="m",
        complete=complete,
        summary_tokens=256,
        chunk_tokens=100_000,
        count_text=lambda text: len(text) // 4,
        upstream="http://summariser.test/v1",
    )


def summaries() -> Summaries:
    """Summaries of the model's text alone (the exact-fact guard: tests/unit/compaction/test_facts_guard.py)."""
    prompt = SummaryPrompt.load(CONFIG / "summary_prompt.md")
    return Summaries(prompt, SummaryFlight(MemoryCache()), guard=False)


async def test_a_background_summary_starts_only_when_its_upstream_is_idle() -> None:
    busy = {"http://summariser.test/v1": True}
    asked: list[str] = []

    def idle(upstream: str) -> bool:
        asked.append(upstream)
        return not busy[upstream]

    release = anyio.Event()
    calls = 0

    async def complete(body: dict[str, Any]) -> tuple[int, bytes]:
        nonlocal calls
        calls += 1
        await release.wait()
        return 200, orjson.dumps(completion("m", "the summary", 20))

    made = summaries()
    background = BackgroundSummaries(made, idle=idle, idle_wait=30)
    job = summary_job(agent_log(30), complete)
    background.submit(job, made.keys(job))
    await until(lambda: len(asked) >= 5)  # it looked, more than once, and found it busy
    assert calls == 0
    assert background.counts.queued == 1
    busy["http://summariser.test/v1"] = False
    await until(lambda: calls == 1)
    busy["http://summariser.test/v1"] = True  # client traffic again: the summary goes on
    release.set()
    await until(lambda: background.counts.made == 1)
    assert await made.cached(job.key) == "the summary"
    await background.aclose()


async def test_a_summary_waiting_for_an_idle_upstream_runs_after_the_bounded_wait() -> None:
    """Sustained load (the upstream never idle) cannot starve a summary: it runs once its
    bounded wait is over, counted as `forced`."""
    made = summaries()
    background = BackgroundSummaries(made, idle=lambda _: False, idle_wait=0.1)

    async def complete(body: dict[str, Any]) -> tuple[int, bytes]:
        return 200, orjson.dumps(completion("m", "made under load", 20))

    job = summary_job(agent_log(30), complete)
    background.submit(job, made.keys(job))
    await until(lambda: background.counts.made == 1)
    assert background.counts.starts == {"forced": 1}
    assert background.counts.skipped == {}
    assert background.counts.queued == 0
    assert await made.cached(job.key) == "made under load"
    await background.aclose()


async def test_an_upstream_that_is_not_gated_gets_summaries_without_waiting() -> None:
    """A hosted API or a multi-slot server (`gated` says no) is never waited for, busy or not."""
    made = summaries()
    gated_asked: list[str] = []

    async def gated(upstream: str) -> bool:
        gated_asked.append(upstream)
        return False

    background = BackgroundSummaries(made, idle=lambda _: False, idle_wait=30, gated=gated)

    async def complete(body: dict[str, Any]) -> tuple[int, bytes]:
        return 200, orjson.dumps(completion("m", "no wait", 20))

    job = summary_job(agent_log(30), complete)
    background.submit(job, made.keys(job))
    await until(lambda: background.counts.made == 1)  # well before the 30 s wait
    assert background.counts.starts == {"immediate": 1}
    assert gated_asked == [job.upstream]
    await background.aclose()


async def test_the_concurrency_limit_holds() -> None:
    made = summaries()
    background = BackgroundSummaries(made, concurrency=2)
    release = anyio.Event()
    running = peak = 0

    async def complete(body: dict[str, Any]) -> tuple[int, bytes]:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await release.wait()
        running -= 1
        return 200, orjson.dumps(completion("m", "a summary", 20))

    for n in range(5):
        messages = agent_log(30)
        messages[2] = {**messages[2], "content": f"Step {n} of five conversations."}
        job = summary_job(messages, complete)
        assert background.submit(job, made.keys(job))
    await until(lambda: running == 2)
    await anyio.wait_all_tasks_blocked()
    assert peak == 2
    assert background.counts.queued == 3
    release.set()
    await until(lambda: background.counts.made == 5)
    assert peak == 2


async def test_the_upstream_counts_client_requests_in_flight_until_closed(
    settings: Settings, fake: FakeUpstream
) -> None:
    upstream = Upstream(settings, transport=httpx.ASGITransport(app=fake.app))
    url = "http://upstream.test/v1/chat/completions"
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    headers = [("content-type", "application/json")]
    try:
        assert upstream.idle("http://upstream.test/v1")
        response = await upstream.send("POST", url, headers, body)
        assert not upstream.idle("http://upstream.test/v1")
        assert upstream.idle("http://other.test/v1")
        await response.aread()  # read to the end: closed
        assert upstream.idle("http://upstream.test/v1")
        streamed = await upstream.send("POST", url, headers, body)
        await streamed.aclose()  # closed unread
        assert upstream.idle("http://upstream.test/v1")
        own = await upstream.send("POST", url, headers, body, client=False)
        assert upstream.idle("http://upstream.test/v1")  # a summary does not make it busy
        await own.aclose()
    finally:
        await upstream.aclose()

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    broken = Upstream(settings, transport=httpx.MockTransport(refuse))
    try:
        with pytest.raises(Exception, match="unreachable"):
            await broken.send("POST", url, headers, body)
        assert broken.idle(url)
    finally:
        await broken.aclose()


async def replay(
    app: FastAPI, client: httpx.AsyncClient, fake: FakeUpstream, messages: list[dict[str, Any]]
) -> tuple[list[str], int, int | None]:
    """Replay `messages` request by request, letting the background work between requests
    (the model answering, the user typing): the summary states, the prompt changes, and the
    summary calls made before the first event's request."""
    states: list[str] = []
    calls_before_event = None
    previous: list[dict[str, Any]] = []
    changes = 0
    for k in request_points(messages):
        response = await send(client, messages[:k])
        state = response.headers.get("x-compaction-summary")
        if state is not None:
            states.append(state)
            if calls_before_event is None:
                calls_before_event = fake.summary_calls
        now = forwarded(fake)
        changes += now[: len(previous)] != previous
        previous = now
        await until(lambda: idle(app))
    return states, changes, calls_before_event


async def test_summaries_are_made_ahead_of_the_event(
    open_app: Callable[..., Any], fake: FakeUpstream
) -> None:
    """Near the threshold the span the next event will cut is summarised in the background;
    with time between requests, the event finds its summary made. An event that cuts past
    the predicted span is served without its summary and the prompt changes once more when
    the rolling update lands: the prompt changes stay within 1.5x of waiting for each."""
    messages = agent_log(80)
    waiting = await open_app(summary_wait=True)
    _, waited_changes, _ = await replay(*waiting, fake, messages)
    calls = fake.summary_calls
    states, changes, calls_before_event = await replay(*await open_app(), fake, messages)
    assert calls_before_event is not None
    assert calls_before_event > calls  # made before the event's request arrived
    assert states[0] == "cached"  # the event found it
    assert "failed" not in states
    assert waited_changes <= changes <= 1.5 * waited_changes


@pytest.fixture
async def redis(tmp_path: Path) -> AsyncIterator[str]:
    with redis_url(tmp_path) as url:
        yield url


@pytest.mark.redis
async def test_two_replicas_sharing_redis_make_each_summary_once(
    open_app: Callable[..., Any], fake: FakeUpstream, redis: str
) -> None:
    """Requests alternate between two app instances on one slow summariser: a span in the
    making on one replica is not made again on the other, and both serve it once cached."""
    fake.summary_failure = "slow"
    fake.summary_pause = 1.0
    replicas = [await open_app(cache_url=redis), await open_app(cache_url=redis)]
    points = request_points(MESSAGES)
    for n, k in enumerate(points):
        await send(replicas[n % 2][1], MESSAGES[:k])
        await anyio.sleep(2 * IDLE_SETTLE)  # a moment between requests: summaries may start
    for app, _ in replicas:
        await until(lambda app=app: idle(app), limit=60)
    last = []
    for _, client in replicas:
        response = await send(client, MESSAGES)
        assert response.headers["x-compaction-summary"] == "cached"
        last.append(forwarded(fake))
    assert last[0] == last[1]
    assert fake.summary_calls >= 1
    tails = [
        r.json()["messages"][0]["content"].rsplit("</transcript>", 1)[0][-300:]
        for r in fake.summary_requests
    ]
    assert len(tails) == len(set(tails))  # no span summarised twice
    skipped = [background_of(app).counts.skipped.get("elsewhere", 0) for app, _ in replicas]
    assert sum(skipped) >= 1  # a replica found a span in the making on the other


async def test_an_omitted_note_keeps_the_roles_alternating(
    open_app: Callable[..., Any], fake: FakeUpstream
) -> None:
    """In a strict chat the summary is an assistant message between the head's user message
    and a user turn: while it is pending, a fixed note holds its place, so that two user
    messages never meet; the summary replaces it when it lands."""
    fake.require_alternation = True
    fake.summary_failure = "stall"
    app, client = await open_app(summary_ahead=1.0)
    chat = [{"role": "system", "content": "Be brief."}]
    for i in range(60):
        chat.append({"role": "user", "content": f"question {i} " + "word " * 150})
        chat.append({"role": "assistant", "content": f"answer {i} " + "word " * 150})
    chat.append({"role": "user", "content": "last question"})
    k, event = await first_event(client, chat)
    assert event.headers["x-compaction-summary"] == "pending"
    pending = forwarded(fake)
    assert pending[2] == {"role": "assistant", "content": OMITTED}
    assert fake.rejected == []
    fake.unstall.set()
    await until(lambda: background_of(app).counts.made == 1)
    await send(client, chat[:k])
    with_it = forwarded(fake)
    assert with_it[2]["role"] == "assistant"
    assert with_it[2]["content"].startswith(SUMMARY_PREFIX)
    assert with_it[:2] + with_it[3:] == pending[:2] + pending[3:]
    assert fake.rejected == []


async def never(body: dict[str, Any]) -> tuple[int, bytes]:
    raise AssertionError("a summary call while the upstream is busy")


# The property tests that compact generated conversations through a service, on the event loop.
SERVICE_PROPERTY = hypothesis_settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)


@given(
    messages=conversations(),
    window=st.sampled_from([1024, 2048, 4096, 8192]),
    strategy=st.sampled_from(["auto", "summarize"]),
)
@SERVICE_PROPERTY
async def test_without_its_summary_the_output_keeps_the_invariants(
    tmp_path: Path, messages: list[dict[str, Any]], window: int, strategy: str
) -> None:
    """Invariants 1, 2, 4 and 6 (DESIGN.md §4) hold for what is forwarded while the summary
    is pending: the summarising cut with nothing, or the note, in the summary's place."""
    table = ModelTable.load(CONFIG / "models.toml")
    made = summaries()
    background = BackgroundSummaries(made, idle=lambda _: False, idle_wait=3600.0)
    service = CompactionService(
        make_settings(tmp_path),
        ChatTokenCounter(ENCODINGS, table),
        WindowRegistry(table, None),
        made,
        lambda model, headers, api: never,
        background=background,
    )
    headers = {"x-compaction-context-limit": str(window), "x-compaction-strategy": strategy}
    try:
        preview = await service.plan(headers, {"model": "gpt-4o", "messages": messages}, "http://u")
    finally:
        await background.aclose()
    result = preview.result
    out = result.messages
    assert preview.error is None
    assert preview.summary_state in (None, "pending")
    if preview.summary_state == "pending":
        assert summary_in(out) is None
        assert "summarize" not in result.applied
    # 1. pair safety
    assert check_pair_safety(out) == []
    # 2. the pinned head (the same objects) and the last unit are kept
    units = group_units(messages)
    head = pinned_head(messages, units)
    head_end = units[head - 1].end if head else 0
    assert all(a is b for a, b in zip(out[:head_end], messages[:head_end], strict=True))
    last = units[-1].start
    tail = messages[last:]
    cap = result.plan.cap
    assert out[len(out) - len(tail) :] in (
        tail,
        truncate_unit(tail, cap, start=last),
        truncate_unit(tail, cap, deep=True, start=last),
    )
    # 4. monotone and bounded
    assert result.tokens_after <= result.tokens_before
    if not result.over_budget:
        assert result.tokens_after <= preview.window - preview.reserve
    # 6. role order kept
    if follows_strict_rule(messages):
        assert follows_strict_rule(out)


class Hosts(httpx.AsyncBaseTransport):
    """Sends each request to the app serving its host (two upstreams behind one client)."""

    def __init__(self, apps: Mapping[str, Any]) -> None:
        self._transports = {host: httpx.ASGITransport(app=app) for host, app in apps.items()}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self._transports[request.url.host].handle_async_request(request)


async def test_summaries_go_to_the_summary_upstream_with_the_upstream_key(
    tmp_path: Path, fake: FakeUpstream
) -> None:
    """`SUMMARY_UPSTREAM_URL`: the summaries go there, with the upstream key, and a summary
    waits for that upstream to be idle, not for the busy one the requests go to."""
    fake.context_window = 8192
    summariser = FakeUpstream()
    settings = make_settings(
        tmp_path,
        summary_upstream_url="http://summariser.test/v1",
        upstream_api_key="sk-upstream",
        summary_ahead=1.0,
    )
    transport = Hosts({"upstream.test": fake.app, "summariser.test": summariser.app})
    app = create_app(settings, transport=transport)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://p") as client,
    ):
        upstream = app.state.inflight.upstream
        held = await upstream.send("POST", "http://upstream.test/v1/models", [], b"")
        try:  # a client request in flight to the main upstream the whole time
            k, event = await first_event(client)
            assert event.headers["x-compaction-summary"] == "pending"
            await until(lambda: background_of(app).counts.made == 1)
        finally:
            await held.aclose()
        cached = await send(client, MESSAGES[:k])
    assert cached.headers["x-compaction-summary"] == "cached"
    assert fake.summary_calls == 0
    assert summariser.summary_calls == 1
    (call,) = [r for r in summariser.requests if r.path == "/v1/chat/completions"]
    assert call.headers["authorization"] == "Bearer sk-upstream"


async def test_a_waiting_summary_of_a_shorter_span_is_superseded() -> None:
    """The conversation moved on: a waiting summary of a prefix of the new span is dropped
    (the new one's rolling update covers it) — but a span predicted ahead never drops the one
    a request needs now. A task cancelled before it ever ran leaves the counts right."""
    made = summaries()
    background = BackgroundSummaries(made, idle=lambda _: False, idle_wait=30)
    messages = agent_log(60)
    short = summary_job(messages[:40], never)
    longer = summary_job(messages, never)
    assert longer.plan.cut > short.plan.cut
    short_keys, longer_keys = made.keys(short), made.keys(longer)
    assert short_keys[-1] in longer_keys  # a prefix of the longer span
    background.submit(short, short_keys)
    background.submit(longer, longer_keys, ahead=True)
    await anyio.wait_all_tasks_blocked()
    assert background.pending(short.key)  # needed now: not dropped for a prediction
    assert background.counts.skipped == {}
    newest = summary_job([*messages, *agent_log(62)[-4:]], never)
    background.submit(newest, made.keys(newest))
    await until(lambda: not background.pending(short.key) and not background.pending(longer.key))
    assert background.counts.skipped == {"superseded": 2}
    assert background.counts.queued == 1
    await background.aclose()
    assert background.counts.queued == 0
    assert background.counts.skipped == {"superseded": 2, "shutdown": 1}


async def test_a_request_reaches_its_upstream_before_the_summary_it_started(
    open_app: Callable[..., Any], fake: FakeUpstream
) -> None:
    """On a one-slot server a summary started before the request that asked for it would
    queue the request behind it: the background summaries a request starts are released only
    once its compaction is done, so its own upstream request is in flight when they look
    whether the upstream is idle (a long conversation: planned in a worker thread)."""
    fake.summary_failure = "slow"
    fake.summary_pause = 0.05
    _, client = await open_app()
    messages = agent_log(130)
    assert len(messages) > 256  # compaction awaits a worker thread
    response = await send(client, messages)
    assert response.headers["x-compaction-summary"] == "pending"
    await until(lambda: fake.summary_calls >= 1)
    chats = [r for r in fake.requests if r.path == "/v1/chat/completions"]
    kinds = ["summary" if r.summary else "chat" for r in chats]
    assert kinds[0] == "chat"
