"""Summary calls counted by how they ended, fallbacks by why, in `/stats`, `/metrics` and the
preview report (`made`, `cached`, `fallback`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson
import pytest

from inflight.compaction.summary.prompt import SummaryFailed
from inflight.compaction.summary.stats import (
    CountedCompleter,
    SummaryStats,
    count_fallback,
    summary_outcome,
)
from inflight.errors import UpstreamTimeout, UpstreamUnavailable
from inflight.factory import create_app
from tests.conftest import make_settings
from tests.support.fakes import FakeUpstream

pytestmark = pytest.mark.anyio


def completer(*answers: tuple[int, bytes] | BaseException) -> Any:
    """A completer that gives each answer in turn (raising the exceptions)."""
    queue = list(answers)

    async def complete(body: dict[str, Any]) -> tuple[int, bytes]:
        answer = queue.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    return complete


def failed_from(cause: Exception) -> SummaryFailed:
    try:
        raise SummaryFailed("summariser failed") from cause
    except SummaryFailed as exc:
        return exc


async def test_each_call_is_counted_by_how_it_ended() -> None:
    stats = SummaryStats()
    complete = CountedCompleter(
        completer(
            (200, b"{}"),
            (500, b"boom"),
            failed_from(UpstreamTimeout("upstream http://u/v1 timed out")),
            failed_from(TimeoutError()),
            failed_from(UpstreamUnavailable("upstream http://u/v1 unreachable")),
            (429, b"slow down"),
        ),
        stats,
    )
    assert await complete({}) == (200, b"{}")
    assert await complete({}) == (500, b"boom")
    for _ in range(3):
        with pytest.raises(SummaryFailed):
            await complete({})
    await complete({})
    assert stats.calls == 6
    assert stats.failures == {"http_500": 1, "timeout": 2, "unreachable": 1, "http_429": 1}
    snapshot = stats.snapshot()
    assert snapshot["failed_calls"] == 5
    assert snapshot["timeouts"] == 2
    assert snapshot["fallbacks"] == {}


async def test_a_call_cut_off_by_the_deadline_is_counted_cancelled() -> None:
    stats = SummaryStats()

    async def never(body: dict[str, Any]) -> tuple[int, bytes]:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    complete = CountedCompleter(never, stats)
    with anyio.move_on_after(0.01):
        await complete({})
    assert stats.failures == {"cancelled": 1}
    assert complete.fell_back(TimeoutError()) == "deadline"
    assert stats.fallbacks == {"deadline": 1}
    assert stats.snapshot()["timeouts"] == 1


@pytest.mark.parametrize(
    ("answers", "error", "reason", "failures"),
    [
        ([], SummaryFailed("failed recently"), "not_attempted", {}),
        ([(500, b"")], SummaryFailed("HTTP 500"), "http_500", {"http_500": 1}),
        (
            [(200, b"<html>")],
            SummaryFailed("not a completion"),
            "invalid_answer",
            {"invalid_answer": 1},
        ),
        ([(200, b"{}"), (503, b"")], SummaryFailed("HTTP 503"), "http_503", {"http_503": 1}),
        ([(200, b"{}")], TimeoutError(), "deadline", {}),
    ],
)
async def test_a_fallback_says_why_from_what_its_own_calls_did(
    answers: list[tuple[int, bytes]], error: BaseException, reason: str, failures: dict[str, int]
) -> None:
    stats = SummaryStats()
    complete = CountedCompleter(completer(*answers), stats)
    for _ in answers:
        await complete({})
    assert count_fallback(complete, error) == reason
    assert stats.fallbacks == {reason: 1}
    assert stats.failures == failures


async def test_an_uncounted_completer_counts_nothing() -> None:
    assert count_fallback(completer(), SummaryFailed("x")) is None


def test_summary_outcome() -> None:
    assert summary_outcome(("prune", "summarize"), 2, None) == {"status": "made", "calls": 2}
    assert summary_outcome(("summarize",), 0, None) == {"status": "cached", "calls": 0}
    assert summary_outcome(("prune",), 0, None) == {"status": "none", "calls": 0}
    assert summary_outcome(("trim",), 1, "summariser answered HTTP 500") == {
        "status": "fallback",
        "calls": 1,
        "why": "summariser answered HTTP 500",
    }


def tool_session(task: str, rounds: int = 40) -> list[dict[str, Any]]:
    """An agent session far over an 8,192-token window: each round a call and a long output."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": task},
    ]
    for i in range(rounds):
        call = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
        messages.append({"role": "assistant", "content": f"Step {i}. " + "why " * 120,
                         "tool_calls": [call]})  # fmt: skip
        output = f"{task} step {i}: " + "line " * 300
        messages.append({"role": "tool", "tool_call_id": "c1", "content": output})
    return messages


async def preview(client: httpx.AsyncClient, messages: list[dict[str, Any]]) -> dict[str, Any]:
    body = {"model": "fake-model", "messages": messages, "max_tokens": 256}
    response = await client.post(
        "/v1/compaction/preview",
        content=orjson.dumps(body),
        headers={"x-compaction-strategy": "summarize"},
    )
    assert response.status_code == 200, response.text
    report: dict[str, Any] = response.json()["report"]
    return report


async def test_preview_says_made_cached_or_fell_back_and_stats_count_it(
    tmp_path: Path, fake: FakeUpstream
) -> None:
    fake.context_window = 8192
    app = create_app(
        make_settings(tmp_path, summary_timeout=5, summary_wait=True),
        transport=httpx.ASGITransport(app=fake.app),
    )
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://p") as client,
    ):
        made = await preview(client, tool_session("Fix the parser."))
        cached = await preview(client, tool_session("Fix the parser."))
        fake.summary_failure = "status"
        failed = await preview(client, tool_session("Fix the lexer."))
        fake.summary_failure = "garbage"
        garbage = await preview(client, tool_session("Fix the printer."))
        stats = (await client.get("/stats")).json()["summaries"]
        metrics = (await client.get("/metrics")).text
    assert made["summary"]["status"] == "made"
    assert made["summary"]["state"] == "ready"  # X-Compaction-Summary: made while it waited
    assert made["summary"]["calls"] >= 1
    assert cached["summary"] == {"status": "cached", "calls": 0, "state": "cached"}
    assert failed["summary"]["status"] == "fallback"
    assert failed["summary"]["state"] == "failed"
    assert "HTTP 500" in failed["summary"]["why"]
    assert "trim" in failed["applied"]
    assert garbage["summary"]["status"] == "fallback"
    assert stats["failures"] == {"http_500": 1, "invalid_answer": 1}
    assert stats["fallbacks"] == {"http_500": 1, "invalid_answer": 1}
    assert stats["calls"] == made["summary"]["calls"] + 2
    assert 'inflight_summary_failures_total{reason="http_500"} 1.0' in metrics
    assert 'inflight_summary_fallbacks_total{reason="invalid_answer"} 1.0' in metrics
    assert f"inflight_summary_attempts_total {stats['calls']}.0" in metrics


async def test_a_summary_over_its_deadline_is_counted_as_a_timeout(
    tmp_path: Path, fake: FakeUpstream
) -> None:
    fake.context_window = 8192
    fake.summary_failure = "stall"
    app = create_app(
        make_settings(tmp_path, summary_timeout=0.3, summary_wait=True),
        transport=httpx.ASGITransport(app=fake.app),
    )
    try:
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://p") as c,
        ):
            report = await preview(c, tool_session("Fix the parser."))
            stats = (await c.get("/stats")).json()["summaries"]
    finally:
        fake.unstall.set()
    assert report["summary"]["status"] == "fallback"
    assert "0.3s" in report["summary"]["why"]
    assert stats["fallbacks"] == {"deadline": 1}
    assert stats["failures"] == {"cancelled": 1}
    assert stats["timeouts"] == 1
