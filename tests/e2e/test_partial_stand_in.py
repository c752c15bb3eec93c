"""The partial stand-in (app/compaction/summary/partial.py): at an event whose span's own
summary is not made, the cached summary of a prefix of it stands in — when the prefix holds
`SUMMARY_PARTIAL` of the span's tokens — and stays, recorded in the summary cache, after the
span's own summary lands, until the cut moves; the next event starts from that full summary.
The choice is recorded set-if-absent (replicas sharing Redis agree on it), never by a preview,
and the forwarded prompt keeps DESIGN.md §4's invariants."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson
import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from inflight.compaction.facts import FACTS_HEADING
from inflight.compaction.inserted import SUMMARY_PREFIX
from inflight.compaction.planner import plan
from inflight.compaction.policy import Budget
from inflight.compaction.service import CompactionService
from inflight.compaction.summary.background import BackgroundSummaries
from inflight.compaction.summary.cache import MemoryCache, RedisCache, SummaryFlight
from inflight.compaction.summary.partial import OWN, Chosen, covered, record_key
from inflight.compaction.summary.prompt import SummaryPrompt
from inflight.compaction.summary.rolling import Summaries, boundary_keys
from inflight.compaction.units import check_pair_safety
from inflight.factory import create_app
from inflight.tokens.counter import ChatTokenCounter
from inflight.tokens.encodings import load_encodings
from inflight.windows.registry import WindowRegistry
from inflight.windows.table import ModelTable
from tests.asgi.test_anthropic_route import ANTHROPIC, agent_body, post
from tests.conftest import make_settings
from tests.e2e.test_background_summaries import (
    SERVICE_PROPERTY,
    background_of,
    first_event,
    forwarded,
    never,
    open_app,  # noqa: F401 (a fixture)
    redis,  # noqa: F401 (a fixture)
    send,
    until,
)
from tests.e2e.test_summarize import agent_log
from tests.support import request_points
from tests.support.conversations import conversations, follows_strict_rule, simple_count, summary_in
from tests.support.fakes import FakeUpstream
from tests.support.fakes.anthropic import SUMMARY_REPLY, rule_violations

pytestmark = pytest.mark.anyio
CONFIG = Path(__file__).resolve().parents[2] / "config"
MESSAGES = agent_log(80)
POINTS = request_points(MESSAGES)
PROMPT = SummaryPrompt.load(CONFIG / "summary_prompt.md")
ENCODINGS = load_encodings()
LIMITS = {"x-compaction-context-limit": "16000", "x-compaction-strategy": "summarize"}


def steps(text: str) -> set[int]:
    """The agent steps (`Step n.`) a text shows."""
    return {int(n) for n in re.findall(r"Step (\d+)\.", text)}


async def next_event(
    client: httpx.AsyncClient, fake: FakeUpstream, k: int, messages: Sequence[Any] = MESSAGES
) -> tuple[int, httpx.Response, list[dict[str, Any]]]:
    """Requests from point `k` on, each extending the prompt before it, until one does not
    (the cut moved): that request, and the last prompt before it."""
    points = request_points(messages)
    previous: list[dict[str, Any]] | None = None
    for n in points[points.index(k) :]:
        response = await send(client, messages[:n])
        now = forwarded(fake)
        if previous is not None and now[: len(previous)] != previous:
            return n, response, previous
        previous = now
    raise AssertionError("the cut never moved")


async def second_event(
    app: Any, client: httpx.AsyncClient, fake: FakeUpstream
) -> tuple[int, httpx.Response, list[dict[str, Any]]]:
    """A session's first event (nothing made to stand in: `pending`) and its summary made,
    then requests until the next event, whose own summary the stalled summariser holds: the
    point of that event, its response, and the last prompt before it."""
    fake.summary_failure = "stall"  # the summariser answers only when the test says so
    k1, first = await first_event(client, MESSAGES)
    assert first.headers["x-compaction-summary"] == "pending"
    fake.unstall.set()
    await until(lambda: background_of(app).counts.made == 1)
    fake.unstall.clear()
    return await next_event(client, fake, k1)


async def test_an_event_with_a_rolling_gap_keeps_the_shorter_summary_until_the_cut_moves(
    open_app: Callable[..., Any],  # noqa: F811
    fake: FakeUpstream,
) -> None:
    # no summaries ahead: every event has a gap; the model's text alone (no exact-fact guard)
    app, client = await open_app(summary_ahead=1.0, summary_facts_guard=False)
    k2, event, before = await second_event(app, client, fake)
    at_event = fake.chat_requests[-1].body
    prompt = forwarded(fake)
    # the span's own summary is not made (a rolling update, stalled): the first's stands in
    assert event.headers["x-compaction-summary"] == "cached"
    assert event.headers["x-compaction-applied"].endswith("summarize")
    assert summary_in(before) == summary_in(prompt) == SUMMARY_PREFIX + "summary #1: facts kept"
    await until(lambda: fake.summary_calls == 2)
    rolling = fake.summary_requests[1].json()["messages"][0]["content"]
    assert "summary #1: facts kept" in rolling  # the own summary updates the shorter one...
    gap = steps(rolling.split("summary #1: facts kept", 1)[1])
    assert gap  # ...with what the event cut past it, which the prompt leaves out (like trim)
    assert not gap & steps(orjson.dumps(prompt).decode())
    stats = (await client.get("/stats")).json()["summaries"]["partial"]
    assert stats == {"events": 1, "requests": 1}
    metrics = (await client.get("/metrics")).text
    assert "inflight_summary_partial_events_total 1.0" in metrics
    assert "inflight_summary_partial_requests_total 1.0" in metrics

    # the same request, before and after the span's own summary lands: the same bytes
    await send(client, MESSAGES[:k2])
    assert fake.chat_requests[-1].body == at_event
    fake.unstall.set()
    await until(lambda: background_of(app).counts.made == 2)
    again = await send(client, MESSAGES[:k2])
    assert again.headers["x-compaction-summary"] == "cached"
    assert fake.chat_requests[-1].body == at_event

    # every prompt extends it until the cut moves; then the span's full summary is the
    # nearest one: it stands for the next event's span
    k3, third, before = await next_event(client, fake, k2)
    assert k3 > POINTS[POINTS.index(k2) + 1]  # requests in between kept the stand-in
    assert summary_in(before) == SUMMARY_PREFIX + "summary #1: facts kept"
    assert third.headers["x-compaction-summary"] == "cached"
    assert summary_in(forwarded(fake)) == SUMMARY_PREFIX + "summary #2: facts kept"
    stats = (await client.get("/stats")).json()["summaries"]["partial"]
    assert stats["events"] == 2


async def test_a_small_prefix_does_not_stand_in_and_the_own_summary_stays_the_choice(
    open_app: Callable[..., Any],  # noqa: F811
    fake: FakeUpstream,
) -> None:
    """Below `SUMMARY_PARTIAL` the event goes without (`pending`), as without partial
    stand-ins; its own summary stands in from the first request after it lands."""
    app, client = await open_app(
        summary_ahead=1.0, summary_partial=0.999, summary_facts_guard=False
    )
    k2, event, _ = await second_event(app, client, fake)
    assert event.headers["x-compaction-summary"] == "pending"
    assert summary_in(forwarded(fake)) is None
    fake.unstall.set()
    await until(lambda: background_of(app).counts.made == 2)
    landed = await send(client, MESSAGES[:k2])
    assert landed.headers["x-compaction-summary"] == "cached"
    assert summary_in(forwarded(fake)) == SUMMARY_PREFIX + "summary #2: facts kept"
    assert (await client.get("/stats")).json()["summaries"]["partial"]["events"] == 0


async def test_partial_stand_ins_can_be_turned_off(
    open_app: Callable[..., Any],  # noqa: F811
    fake: FakeUpstream,
) -> None:
    app, client = await open_app(summary_ahead=1.0, summary_partial=1)
    _, event, _ = await second_event(app, client, fake)
    assert event.headers["x-compaction-summary"] == "pending"


def service(tmp_path: Path, made: Summaries, **overrides: Any) -> CompactionService:
    table = ModelTable.load(CONFIG / "models.toml")
    return CompactionService(
        make_settings(tmp_path, **overrides),
        ChatTokenCounter(ENCODINGS, table),
        WindowRegistry(table, None),
        made,
        lambda model, headers, api: never,
        # an upstream never idle and a wait longer than any test: background summaries wait,
        # never run (`never` would fail them)
        background=BackgroundSummaries(made, idle=lambda _: False, idle_wait=3600.0),
    )


async def seed_prefix(
    compactor: CompactionService,
    made: Summaries,
    cache: MemoryCache | RedisCache,
    body: Mapping[str, Any],
    headers: Mapping[str, str],
    share: float,
) -> tuple[str, int] | None:
    """Cache a summary of the longest prefix of `body`'s event span with at most `share` of
    its tokens (none when the span has no such boundary): (the span's cache key, the
    prefix's end)."""
    preview = await compactor.plan(headers, body, "http://u")
    the_plan = preview.result.plan
    if not the_plan.summarize or the_plan.cut - the_plan.head < 2:
        return None
    messages = preview.conversation.messages
    keys = boundary_keys(messages, the_plan, "gpt-4o", made.prompt)
    count = ChatTokenCounter(ENCODINGS).count_message
    found = [
        (end, key)
        for end, key in keys[:-1]
        if covered(messages, the_plan, end, lambda m: count("gpt-4o", m)) <= share
    ]
    if not found:
        return None
    end, key = found[-1]
    await cache.set(key, f"the summary up to unit {end}")
    return keys[-1][1], end


async def test_a_preview_only_looks_and_a_forwarded_request_records_its_choice(
    tmp_path: Path,
) -> None:
    cache = MemoryCache()
    made = Summaries(PROMPT, SummaryFlight(cache))
    compactor = service(tmp_path, made)
    body = {"model": "gpt-4o", "messages": MESSAGES, "max_tokens": 256}
    headers = {"x-compaction-context-limit": "8192"}
    seeded = await seed_prefix(compactor, made, cache, body, headers, 0.95)
    assert seeded is not None
    key, end = seeded
    preview = await compactor.plan(headers, body, "http://u")
    assert preview.summary_state == "cached"
    # the prefix's summary, with the guard's list of what it does not cover (gap_guard)
    standing = summary_in(preview.result.messages)
    assert standing.startswith(SUMMARY_PREFIX + f"the summary up to unit {end}\n\n")
    assert FACTS_HEADING in standing
    assert preview.summary_covers is not None
    assert 0.5 <= preview.summary_covers <= 0.95
    assert await cache.get(record_key(key)) is None  # read only
    forwarded_ = await compactor.plan(headers, body, "http://u", forwarding=True)
    assert forwarded_.result.messages == preview.result.messages
    recorded = await cache.get(record_key(key))
    assert recorded is not None
    assert Chosen.decode(recorded) == Chosen(
        standing.removeprefix(SUMMARY_PREFIX), preview.summary_covers
    )


async def test_the_first_choice_recorded_stands() -> None:
    """Set-if-absent: a later choice (a longer prefix cached since) does not replace it."""
    made = Summaries(PROMPT, SummaryFlight(MemoryCache()))
    first, later = Chosen("up to 3", 0.6), Chosen("up to 5", 0.9)
    assert await made.choose("span", first) == (first, True)
    assert await made.choose("span", later) == (first, False)
    assert await made.standing("span") == (first, None)
    assert await made.choose("other", OWN) == (OWN, True)
    assert await made.choose("other", later) == (OWN, False)


def test_a_record_decodes_to_what_was_chosen_or_to_nothing() -> None:
    for chosen in (OWN, Chosen("a summary", 0.625), Chosen("", 0.5)):
        assert Chosen.decode(chosen.encode()) == chosen
    for value in ("", "not json", "[]", '{"summary": 3, "covers": 1}', '{"summary": "s"}', "7"):
        assert Chosen.decode(value) is None


def test_the_share_covered_counts_the_span_s_tokens_but_pinned_instructions() -> None:
    messages = agent_log(30)
    messages.insert(20, {"role": "system", "content": "An instruction " * 500})
    the_plan = plan(messages, ("summarize",), Budget(4096, 256, 0.8, 0.5), simple_count, 0, 256)
    assert the_plan.cut - the_plan.head >= 4
    assert any(the_plan.head <= i < the_plan.cut for i in the_plan.pinned)
    assert covered(messages, the_plan, the_plan.head, simple_count) == 0.0
    assert covered(messages, the_plan, the_plan.cut, simple_count) == 1.0
    shares = [
        covered(messages, the_plan, end, simple_count)
        for end in range(the_plan.head, the_plan.cut + 1)
    ]
    assert shares == sorted(shares)
    units = the_plan.units
    span = [
        m
        for i in range(the_plan.head, the_plan.cut)
        if i not in the_plan.pinned
        for m in messages[units[i].start : units[i].end]
    ]
    first = messages[units[the_plan.head].start : units[the_plan.head].end]
    expected = sum(map(simple_count, first)) / sum(map(simple_count, span))
    assert covered(messages, the_plan, the_plan.head + 1, simple_count) == pytest.approx(expected)


@pytest.mark.redis
async def test_two_replicas_sharing_redis_agree_on_the_stand_in(
    open_app: Callable[..., Any],  # noqa: F811
    fake: FakeUpstream,
    redis: str,  # noqa: F811
) -> None:
    """Replica one chooses the partial stand-in at an event; replica two, at the same cut
    after the span's own summary landed, serves replica one's choice: the same prompt."""
    (one_app, one), (_, two) = [
        await open_app(cache_url=redis, summary_ahead=1.0, summary_facts_guard=False)
        for _ in range(2)
    ]
    k2, event, _ = await second_event(one_app, one, fake)
    assert event.headers["x-compaction-summary"] == "cached"
    at_event = fake.chat_requests[-1].body
    fake.unstall.set()
    await until(lambda: background_of(one_app).counts.made == 2)
    served = await send(two, MESSAGES[:k2])
    assert served.headers["x-compaction-summary"] == "cached"
    assert fake.chat_requests[-1].body == at_event
    assert summary_in(forwarded(fake)) == SUMMARY_PREFIX + "summary #1: facts kept"
    stats = (await two.get("/stats")).json()["summaries"]["partial"]
    assert stats == {"events": 0, "requests": 1}  # replica one's choice, served by two


@pytest.mark.redis
async def test_replicas_racing_to_record_a_choice_agree_on_one(redis: str) -> None:  # noqa: F811
    caches = [RedisCache(redis) for _ in range(6)]
    try:
        made = [Summaries(PROMPT, SummaryFlight(cache)) for cache in caches]
        results: list[tuple[Chosen, bool]] = []

        async def choose(n: int) -> None:
            results.append(await made[n].choose("raced", Chosen(f"prefix {n}", 0.5 + n / 20)))

        async with anyio.create_task_group() as tg:
            for n in range(len(made)):
                tg.start_soon(choose, n)
        assert len({chosen for chosen, _ in results}) == 1
        assert sum(recorded for _, recorded in results) == 1
        assert (await made[0].standing("raced"))[0] == results[0][0]
    finally:
        for cache in caches:
            await cache.close()


@given(
    messages=conversations(),
    window=st.sampled_from([1024, 2048, 4096, 8192]),
    strategy=st.sampled_from(["auto", "summarize"]),
    share=st.sampled_from([0.5, 0.8, 0.99]),
    restore=st.booleans(),
)
@SERVICE_PROPERTY
async def test_with_a_partial_stand_in_the_output_keeps_the_invariants(
    tmp_path: Path,
    messages: list[dict[str, Any]],
    window: int,
    strategy: str,
    share: float,
    restore: bool,
) -> None:
    """Invariants 1, 4, 5 and 6 (DESIGN.md §4) hold for what is forwarded with the summary of
    a prefix of the span standing in, restoring or not; compacting it again changes nothing."""
    cache = MemoryCache()
    made = Summaries(PROMPT, SummaryFlight(cache))
    compactor = service(tmp_path, made)
    headers = {
        "x-compaction-context-limit": str(window),
        "x-compaction-strategy": strategy,
        "x-compaction-restore": str(restore).lower(),
    }
    body = {"model": "gpt-4o", "messages": messages}
    seeded = await seed_prefix(compactor, made, cache, body, headers, share)
    event("a prefix cached" if seeded else "no event, or no prefix")
    if seeded is None:
        return
    try:
        preview = await compactor.plan(headers, body, "http://u", forwarding=True)
    finally:
        await compactor.background.aclose() if compactor.background else None
    result, out = preview.result, preview.result.messages
    assert preview.error is None
    event(f"stand-in: {preview.summary_state}, restore {restore}")
    if preview.summary_covers is None:  # the prefix holds too little of the span
        assert preview.summary_state == "pending"
        return
    assert preview.summary_state == "cached"
    assert 0.5 <= preview.summary_covers <= share
    assert "summarize" in result.applied
    assert "the summary up to unit" in (summary_in(out) or "")
    assert check_pair_safety(out) == []  # 1
    assert result.tokens_after <= result.tokens_before  # 4
    if not result.over_budget:
        assert result.tokens_after <= preview.window - preview.reserve
    if follows_strict_rule(messages):  # 6
        assert follows_strict_rule(out)
    again = await compactor.plan(headers, {**body, "messages": list(out)}, "http://u")  # 5
    assert again.result.messages == out


async def test_a_messages_session_keeps_anthropic_s_rules_with_a_partial_stand_in(
    tmp_path: Path,
) -> None:
    """On `/v1/messages` (strict alternation, tool_use/tool_result pairs): the first event
    goes without its summary, a later one is served with the earlier summary standing in."""
    anthropic = FakeUpstream()
    settings = make_settings(tmp_path, anthropic_upstream_url=ANTHROPIC, summary_ahead=1.0)
    app = create_app(settings, transport=httpx.ASGITransport(app=anthropic.app))
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://p") as client,
    ):
        states: list[str] = []
        for rounds in range(4, 60):
            body = agent_body(rounds, 1500)
            response = await post(client, body, **LIMITS)
            assert response.status_code == 200, response.text
            states.append(response.headers.get("x-compaction-summary", "-"))
            await until(lambda: background_of(app).counts.queued == 0)
            await until(lambda: background_of(app).counts.running == 0)
            stats = (await client.get("/stats")).json()["summaries"]["partial"]
            if stats["events"]:
                break
        else:
            raise AssertionError(f"no partial stand-in: {states}")
    assert "pending" in states  # the first event: nothing to stand in yet
    assert states[-1] == "cached"
    assert anthropic.rejected == []
    sent = anthropic.messages_requests[-1].json()
    assert rule_violations(sent) == []
    texts = [
        b.get("text", "") for m in sent["messages"] for b in m["content"] if isinstance(b, dict)
    ]
    assert any(SUMMARY_REPLY in t for t in texts)
