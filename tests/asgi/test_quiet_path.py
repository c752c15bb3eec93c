"""The quiet path (app/compaction/quiet_path.py, issue 16): a forwarded request under the trigger as
a whole goes as received, decided from its token count alone, and the plan it would have made is
made once its answer is on its way. What it forwards and reports is what planning it gives;
the replay cache it leaves, once the answers are out, is the one planning leaves; it never
swallows a prediction of the next event (summaries ahead); and a calibration that moved
between the request and its answer leaves the cache as it was."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import orjson
import pytest
from fastapi import FastAPI
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

import inflight.compaction.quiet_path as quiet_path
import inflight.compaction.service as service_module
from inflight.apis.chat.format import ChatFormat
from inflight.compaction.compacted import Compacted
from inflight.compaction.engine import untouched
from inflight.compaction.offload import OFFLOAD_MESSAGES
from inflight.compaction.policy import Budget
from inflight.compaction.replays import ENTRIES
from inflight.compaction.service import CompactionService
from inflight.compaction.units import group_units, head_end, pinned_head
from inflight.http.state import AppState
from tests.asgi.test_reuse_asgi import ROUTES, proxy_app, sent, session
from tests.e2e.test_background_summaries import summaries
from tests.e2e.test_partial_stand_in import service as compaction_service
from tests.support.conversations import agent_session, conversations
from tests.support.fakes import FakeUpstream

pytestmark = pytest.mark.anyio
CONFIG = Path(__file__).resolve().parents[2] / "config"
CHAT = ChatFormat()
QUIET = hypothesis_settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
STRATEGIES = ["auto", "summarize", "trim", "truncate,prune,trim", "middle-out", "none"]


def planning_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """No quiet path (until the patch is undone): every request is planned."""
    monkeypatch.setattr(service_module, "quiet_outcome", lambda *args: None)


def deferred(compacted: Compacted) -> list[Callable[[], object]]:
    """The plans a quiet request left for after its answer."""
    return [
        start
        for start in compacted.after_answer.work
        if getattr(start, "func", None) is quiet_path._replayed
    ]


def others(compacted: Compacted) -> list[Callable[[], object]]:
    """What else starts after its answer (the next event's prediction)."""
    return [start for start in compacted.after_answer.work if start not in deferred(compacted)]


def reported(compacted: Compacted) -> dict[str, str]:
    """The report headers but the ledger id (random)."""
    return {k: v for k, v in compacted.headers.items() if k != "X-Compaction-Id"}


def entries(service: CompactionService) -> list[tuple[Any, int, str]]:
    """The replay cache, oldest first: each entry's plan inputs, prefix length and kind."""
    cache = service._replays
    assert cache is not None
    return [(e.key, e.length, type(e.state).__name__) for e in cache._entries.values()]


def prefixes(messages: list[dict[str, Any]], step: int) -> Iterator[list[dict[str, Any]]]:
    """A growing session's histories: a new list of new objects each request, as parsed."""
    for end in range(1, len(messages) + 1, step):
        yield orjson.loads(orjson.dumps(messages[:end]))
    if (len(messages) - 1) % step:
        yield orjson.loads(orjson.dumps(messages))


@given(
    messages=conversations(),
    window=st.sampled_from([1024, 2048, 4096, 8192, 65_536]),
    strategy=st.sampled_from(STRATEGIES),
    restore=st.booleans(),
    step=st.sampled_from([1, 2, 5]),
)
@QUIET
async def test_a_session_forwards_reports_and_remembers_what_planning_does(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    messages: list[dict[str, Any]],
    window: int,
    strategy: str,
    restore: bool,
    step: int,
) -> None:
    """Request by request, a session through the quiet path and through planning: the same
    body and bytes forwarded, the same report, the same predictions started, and once each
    quiet request's answer is out, the same replay cache (entries, order, inputs)."""
    made = summaries()
    quiet, planned = compaction_service(tmp_path, made), compaction_service(tmp_path, made)
    headers = {
        "x-compaction-context-limit": str(window),
        "x-compaction-strategy": strategy,
        "x-compaction-restore": str(restore).lower(),
    }
    try:
        for history in prefixes(messages, step):
            body = {"model": "gpt-4o", "messages": history}
            got = await quiet.prepare(CHAT, headers, body, "http://u")
            with monkeypatch.context() as patch:
                planning_only(patch)
                want = await planned.prepare(
                    CHAT, headers, orjson.loads(orjson.dumps(body)), "http://u"
                )
            assert (got.body, got.forward, got.view) == (want.body, want.forward, want.view)
            assert reported(got) == reported(want)
            assert (got.tokens_before, got.tokens_after) == (want.tokens_before, want.tokens_after)
            assert got.strategies == want.strategies
            assert len(others(got)) == len(want.after_answer.work)
            assert not deferred(want)
            for start in deferred(got):  # the answer is out
                start()
            assert entries(quiet) == entries(planned)
    finally:
        for service in (quiet, planned):
            background = service.background
            assert background is not None
            await background.aclose()


async def test_most_requests_of_a_long_session_take_the_quiet_path(tmp_path: Path) -> None:
    """A session growing one tool round a request, far under its window, then into the zone
    where summaries start ahead of the next event, then past the trigger: every request it
    sends before its first event is served by the quiet path, but those that predict the next
    event (a few: a prediction holds while the session grows a sixteenth of the way to the
    trigger); the compacted ones are planned."""
    made = summaries()
    service = compaction_service(tmp_path, made)
    session = agent_session(120, words=60)
    headers = {"x-compaction-context-limit": "16384"}
    kinds = []  # per request: quiet, predicting, compacted
    try:
        for end in range(4, len(session), 2):
            body = {"model": "gpt-4o", "messages": session[:end]}
            got = await service.prepare(CHAT, headers, body, "http://u")
            kinds.append((bool(deferred(got)), bool(others(got)), got.strategies != ()))
            for start in deferred(got):
                start()
    finally:
        background = service.background
        assert background is not None
        await background.aclose()
    first_event = next(i for i, (_, _, compacted) in enumerate(kinds) if compacted)
    before = kinds[:first_event]
    assert all(quiet != predicting for quiet, predicting, _ in before)
    assert sum(predicting for _, predicting, _ in before) >= 2
    assert sum(quiet for quiet, _, _ in before) > 2 * sum(p for _, p, _ in before)
    assert not any(quiet for quiet, _, _ in kinds[first_event:])


async def test_a_calibration_moved_before_the_answer_leaves_the_cache_as_it_was(
    tmp_path: Path,
) -> None:
    """The counts a quiet request was decided on are its own: when the counter's state moved
    before its answer was out, the plan for the cache is not made (it would be remembered
    under the new state with the old counts); the next request is planned from scratch
    under the new state, as planning would."""
    made = summaries()
    service = compaction_service(tmp_path, made)
    session = agent_session(30, words=40)
    headers = {"x-compaction-context-limit": "65536"}
    try:
        first = await service.prepare(
            CHAT, headers, {"model": "llama-3.1-8b", "messages": session[:20]}, "http://u"
        )
        for start in deferred(first):
            start()
        before = entries(service)
        assert before  # the first request's plan is remembered
        body = {"model": "llama-3.1-8b", "messages": session[:22]}
        second = await service.prepare(CHAT, headers, body, "http://u")
        assert deferred(second)
        state = service._counter.counting("llama-3.1-8b")
        stated = int(second.tokens_before * 1.6)  # what the answer says it counted
        service._counter.observe("llama-3.1-8b", body, stated, overflowed=True)
        assert service._counter.counting("llama-3.1-8b") != state
        for start in deferred(second):
            start()
        assert entries(service) == before
    finally:
        background = service.background
        assert background is not None
        await background.aclose()


async def test_a_plan_no_longer_small_by_its_answer_is_left_to_the_next_request(
    tmp_path: Path,
) -> None:
    """A long conversation's quiet request is small work only while the cache holds the replay
    it resumes. When other conversations pushed that out before its answer, its plan (a replay
    from the first message) is not made on the event loop after the answer: the cache is
    left as it was, and the next request plans where planning runs."""
    made = summaries()
    service = compaction_service(tmp_path, made)
    headers = {"x-compaction-context-limit": "1000000"}
    session = agent_session(160, words=20)
    assert len(session) > OFFLOAD_MESSAGES
    try:
        for end in (300, 302):  # the first is planned (in a worker thread), the next is quiet
            body = {"model": "gpt-4o", "messages": session[:end]}
            got = await service.prepare(CHAT, headers, body, "http://u")
        assert deferred(got)
        for i in range(ENTRIES):  # other conversations, each remembered once its answer is out
            other = [{"role": "user", "content": f"question {i}"}, *session[2:9]]
            for start in deferred(
                await service.prepare(CHAT, headers, {"model": "gpt-4o", "messages": other}, "u")
            ):
                start()
        assert all(length < 1000 for _, length, _ in entries(service))  # the long one is gone
        before = entries(service)
        for start in deferred(got):
            start()
        assert entries(service) == before
        planned = await service.prepare(
            CHAT, headers, {"model": "gpt-4o", "messages": session[:304]}, "http://u"
        )
        assert not deferred(planned)  # planned, not quiet: no longer covered
        assert entries(service)[-1][1] > 1000  # the long one, remembered by planning again
    finally:
        background = service.background
        assert background is not None
        await background.aclose()


@given(messages=conversations(), roles=st.lists(st.sampled_from(["system", "developer"])))
@QUIET
def test_the_head_ends_where_the_pinned_head_does(
    messages: list[dict[str, Any]], roles: list[str]
) -> None:
    """`head_end` (found without grouping) is where `pinned_head`'s units end, with a user
    message and without one (leading instructions, then anything but a user message)."""
    without_user = [{"role": role, "content": "x"} for role in roles] + [
        m for m in messages if m.get("role") != "user"
    ]
    for history in (messages, without_user, []):
        units = group_units(history)
        head = pinned_head(history, units)
        assert head_end(history) == (units[head - 1].end if head else 0)


def compactor(app: FastAPI) -> CompactionService:
    state = app.state.inflight
    assert isinstance(state, AppState)
    return state.compactor


@pytest.mark.parametrize("route", sorted(ROUTES))
async def test_through_the_proxy_a_session_is_served_as_planning_serves_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, route: str
) -> None:
    """On each compacting API, streamed or not, restore on: a growing session through the
    whole proxy with the quiet path and without it — the same statuses and reports, the same
    bytes upstream, the same replay cache at the end."""
    outcomes = []
    for quiet in (True, False):
        fake = FakeUpstream()
        (tmp_path / str(quiet)).mkdir()
        app = proxy_app(tmp_path / str(quiet), fake)
        service = compactor(app)
        taken: list[bool] = []

        def spied(*args: Any, taken: list[bool] = taken) -> Any:
            outcome = quiet_path.quiet_outcome(*args)
            taken.append(outcome is not None)
            return outcome

        if quiet:
            monkeypatch.setattr(service_module, "quiet_outcome", spied)
        else:
            planning_only(monkeypatch)
        statuses, reports = [], []
        async for response in session(app, route):
            statuses.append(response.status_code)
            reports.append(
                {
                    k: v
                    for k, v in response.headers.items()
                    if k.startswith("x-compaction-") and k != "x-compaction-id"
                }
            )
        remembered = entries(service)
        if quiet:  # the session's first requests took it, its compacted ones did not
            assert 0 < sum(taken) < len(taken)
        outcomes.append((statuses, reports, sent(fake, route), remembered))
    assert outcomes[0] == outcomes[1]
    statuses, reports, _, _ = outcomes[0]
    assert set(statuses) == {200}
    assert any(r.get("x-compaction-applied") not in (None, "none") for r in reports)


def test_a_quiet_result_is_the_request_as_received(tmp_path: Path) -> None:
    """What the quiet path forwards: the very messages, every index its own source, nothing
    applied, and over the budget only when the tokens are."""
    messages: list[Mapping[str, Any]] = [{"role": "user", "content": "hi"}]
    result = untouched(messages, 12)
    assert result.messages is messages
    assert list(result.sources) == [0]
    assert (result.applied, result.tokens_before, result.tokens_after) == ((), 12, 12)
    assert not result.over_budget
    assert untouched(messages, 12, Budget(20, 9, 0.8, 0.5)).over_budget
    assert not untouched(messages, 11, Budget(20, 9, 0.8, 0.5)).over_budget
