"""Summaries ahead of the next compaction event (DESIGN.md §12): the few spans the event is
likeliest to cut (`SUMMARY_AHEAD_CUTS`), not just one, so that an event whose turn goes further
past the threshold than the last one finds its summary made; predicted spans never supersede
each other; the work stays bounded per conversation; a summary starts on an upstream that
has stayed idle a moment."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import anyio
import pytest

from inflight.compaction.planner import plan
from inflight.compaction.policy import Budget
from inflight.compaction.rendering import Plan
from inflight.compaction.summary.ahead import next_event, next_events
from inflight.compaction.summary.background import IDLE_POLL, IDLE_SETTLE, BackgroundSummaries
from inflight.compaction.summary.rolling import summary_budget
from inflight.compaction.unit_costs import MessageCounter
from inflight.strategies import StrategyName
from inflight.tokens.counter import ChatTokenCounter
from inflight.tokens.encodings import load_encodings
from tests.e2e.test_background_summaries import (
    background_of,
    idle,
    never,
    open_app,  # noqa: F401 (a fixture)
    send,
    summaries,
    summary_job,
    until,
)
from tests.e2e.test_summarize import agent_log
from tests.support import load_traces, request_points
from tests.support.fakes import FakeUpstream

pytestmark = pytest.mark.anyio
PIPELINE: tuple[StrategyName, ...] = ("truncate", "prune", "summarize")
BUDGET = Budget(window=8192, reserve=1024, threshold=0.8, target=0.5)
COUNTER = ChatTokenCounter(load_encodings())
COUNT = partial(COUNTER.count_message, "gpt-4o")


def bigger_turn(rounds: int, at: int, size: int) -> list[dict[str, Any]]:
    """An agent log whose round `at` outputs `size` lines instead of 300."""
    messages = agent_log(rounds)
    tool = messages[2 + 2 * at + 1]
    messages[2 + 2 * at + 1] = {**tool, "content": f"output {at} " + "line " * size}
    return messages


def test_the_next_events_cut_in_different_places_likeliest_first() -> None:
    """On every request of the real transcripts past the ahead threshold: up to `cuts` plans,
    the first the single prediction when it has one, each cutting past the current cut and
    only what the client has sent, no two at the same cut."""
    reserved = summary_budget(BUDGET.goal)

    def replan(messages: Sequence[Mapping[str, Any]], count: MessageCounter) -> Plan:
        return plan(messages, PIPELINE, BUDGET, count, 10, reserved)

    seen = 0
    for _, messages in load_traces():
        for k in request_points(messages):
            history = messages[:k]
            now = plan(history, PIPELINE, BUDGET, COUNT, 10, reserved)
            if now.tokens_after < 0.55 * BUDGET.budget:
                continue
            found = next_events(history, now, replan, BUDGET.trigger, COUNT, 3)
            one = next_event(history, now, replan, BUDGET.trigger, COUNT)
            assert len(found) <= 3
            if one is not None:
                assert found[0].cut == one.cut
            cuts = [p.cut for p in found]
            assert len(set(cuts)) == len(cuts)
            for p in found:
                assert now.cut < p.cut
                assert p.summarize
                assert p.units[p.cut - 1].end <= len(history)
            seen += len(found) > 1
    assert seen > 50  # many predictions give more than one place


async def test_predicted_spans_do_not_supersede_each_other() -> None:
    """The spans predicted together all wait their turn; when the prediction moves on, a
    waiting span no longer predicted is superseded, the ones still predicted are kept."""
    made = summaries()
    background = BackgroundSummaries(made, idle=lambda _: False, idle_wait=30)
    messages = agent_log(60)
    jobs = [summary_job(messages[: 2 * n], never) for n in (40, 42, 44, 46)]
    groups = [(job, made.keys(job)) for job in jobs]
    assert len({job.plan.cut for job in jobs}) == 4  # four spans, each a prefix of the next
    background.submit_ahead(groups[:3])
    await anyio.wait_all_tasks_blocked()
    assert all(background.pending(job.key) for job in jobs[:3])
    assert background.counts.skipped == {}
    background.submit_ahead(groups[1:])
    await until(lambda: not background.pending(jobs[0].key))
    assert all(background.pending(job.key) for job in jobs[1:])
    assert background.counts.skipped == {"superseded": 1}
    await background.aclose()


@pytest.mark.parametrize(("cuts", "state"), [(1, "pending"), (2, "cached")])
async def test_an_event_past_the_likeliest_cut_finds_its_summary_made(
    open_app: Callable[..., Any],  # noqa: F811
    fake: FakeUpstream,
    cuts: int,
    state: str,
) -> None:
    """The turn that crosses the threshold is bigger than the others: it cuts further than a
    turn like the last one would. Summarised ahead at one cut, the event misses its summary
    (`pending`: one more prompt change when it lands); at two, the second is its span. (The
    one cut's summary, of a prefix of the span, would stand in for it: partial stand-ins off,
    to see the span's own.)"""
    app, client = await open_app(summary_ahead=0.65, summary_ahead_cuts=cuts, summary_partial=1)
    messages = bigger_turn(40, 12, 500)
    for k in request_points(messages):
        response = await send(client, messages[:k])
        await until(lambda: idle(app))  # time between requests: the summaries are made
        found = response.headers.get("x-compaction-summary")
        if found is not None:
            assert k == 2 + 2 * 13  # the event is the bigger turn's
            assert found == state
            return
    raise AssertionError("no compaction event")


async def test_summaries_ahead_stay_bounded_per_conversation(
    open_app: Callable[..., Any],  # noqa: F811
    fake: FakeUpstream,
) -> None:
    """Summaries that never finish, turns of changing sizes (each request predicts other
    cuts): however many requests approach the threshold, at most twice `SUMMARY_AHEAD_CUTS`
    spans of one conversation past its cut are in the making."""
    fake.summary_failure = "stall"
    app, client = await open_app(summary_ahead=0.3, summary_ahead_cuts=2)
    messages = agent_log(60, size=40, thoughts=10)
    for i in range(60):  # turns of changing sizes: each request predicts other cuts
        tool = messages[3 + 2 * i]
        messages[3 + 2 * i] = {**tool, "content": f"output {i} " + "line " * (20 + 90 * (i % 4))}
    most = 0
    for k in request_points(messages):
        response = await send(client, messages[:k])
        if "x-compaction-summary" in response.headers:
            break  # the event: what was predicted is behind it
        await anyio.wait_all_tasks_blocked()
        counts = background_of(app).counts
        most = max(most, counts.queued + counts.running)
    assert 2 < most <= 4  # more than one prediction's worth, never more than the bound


async def test_a_summary_waits_for_its_upstream_to_stay_idle_a_moment() -> None:
    """An upstream goes idle as its answer leaves it, before the client has it; the client's
    next request may follow at once. A summary starts only once the upstream has stayed idle
    for `IDLE_SETTLE`: an idle gap shorter than that starts nothing."""
    busy = {"now": True}
    calls: list[float] = []

    async def complete(body: dict[str, Any]) -> tuple[int, bytes]:
        calls.append(time.monotonic())
        raise AssertionError("stop here: only when it starts matters")

    background = BackgroundSummaries(summaries(), idle=lambda _: not busy["now"], idle_wait=30)
    job = summary_job(agent_log(40), complete)
    background.submit(job, summaries().keys(job))
    for _ in range(5):  # idle gaps shorter than the settle time
        busy["now"] = False
        await anyio.sleep(IDLE_SETTLE / 4)
        busy["now"] = True
        await anyio.sleep(IDLE_POLL * 2)
    assert calls == []
    busy["now"] = False
    quiet = time.monotonic()
    await until(lambda: bool(calls))
    assert calls[0] - quiet >= IDLE_SETTLE
    await background.aclose()


@pytest.mark.parametrize("when_idle", [True, False])
async def test_the_next_event_is_predicted_off_the_request_path(
    open_app: Callable[..., Any],  # noqa: F811
    fake: FakeUpstream,
    monkeypatch: pytest.MonkeyPatch,
    when_idle: bool,
) -> None:
    """Predicting the next event replans the history grown past the threshold (an event's
    work, at every request near it): it runs in a task of its own that no request waits for.
    Summaries waiting for the upstream to go idle (the default) could not start before the
    answer anyway, so it runs once the answer is on its way: the upstream has the request a
    prediction is of before it. Otherwise it starts with the request. Its spans are
    summarised either way."""
    import inflight.compaction.summary.request as request_module

    def chats() -> int:  # the client requests the upstream has had
        return sum(r.path.endswith("/chat/completions") and b'"max_tokens":256' in r.body
                   for r in fake.requests)  # fmt: skip

    seen: list[tuple[int, int]] = []  # (messages of the request predicted for, chats then)
    real = request_module.next_events

    def predicting(messages: Sequence[Mapping[str, Any]], *args: Any) -> list[Plan]:
        seen.append((len(messages), chats()))
        return real(messages, *args)

    monkeypatch.setattr(request_module, "next_events", predicting)
    app, client = await open_app(summary_ahead=0.55, summary_when_idle=when_idle)
    messages = agent_log(40)
    points = request_points(messages)[:24]
    for k in points:
        await send(client, messages[:k])
        await until(lambda: idle(app))
    assert len(seen) >= 3
    if when_idle:
        for size, upstream_had in seen:
            assert upstream_had >= points.index(size) + 1
    assert fake.summary_calls > 0  # the predicted spans were summarised
    assert background_of(app).predicting == 0


async def test_a_conversation_of_small_messages_is_predicted_every_few_requests(
    open_app: Callable[..., Any],  # noqa: F811
    fake: FakeUpstream,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Predicting is an event's work (issue 16). A conversation that grows by small messages
    is predicted again once it grew by `PREDICT_STEP` of the way from the goal to the
    trigger, or its cuts moved; one of big turns (a tool round of hundreds of lines) at every
    request past `SUMMARY_AHEAD`, as when every request predicted."""
    import inflight.compaction.summary.request as request_module

    predicted: list[int] = []
    real = request_module.next_events

    def predicting(messages: Sequence[Mapping[str, Any]], *args: Any) -> list[Plan]:
        predicted.append(len(messages))
        return real(messages, *args)

    monkeypatch.setattr(request_module, "next_events", predicting)
    chat: list[dict[str, Any]] = [{"role": "user", "content": "Tell me about the codebase."}]
    for i in range(480):
        role = "assistant" if i % 2 == 0 else "user"
        chat.append({"role": role, "content": f"note {i}: " + "the parser reads tokens " * 4})
    tools = agent_log(24)
    counts: dict[tuple[str, float], int] = {}
    default = request_module.PREDICT_STEP
    for step in (default, 0.0):  # 0: every request predicts
        monkeypatch.setattr(request_module, "PREDICT_STEP", step)
        for name, session, points in (
            ("small", chat, range(2, len(chat), 2)),
            ("big", tools, request_points(tools)),
        ):
            app, client = await open_app(summary_ahead=0.55)
            predicted.clear()
            for k in points:
                await send(client, session[:k])
                await until(lambda app=app: idle(app))
            counts[name, step] = len(predicted)
    every = {name: counts[name, 0.0] for name in ("small", "big")}
    assert every["small"] > 60  # many requests past SUMMARY_AHEAD
    assert 0 < counts["small", default] < every["small"] / 2, counts
    assert counts["big", default] == every["big"] > 5, counts
