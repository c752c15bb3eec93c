"""Silent truncation (DESIGN.md §11): an upstream that answers 200 having counted far fewer
prompt tokens than were sent, over the known window. The response says so, the window is
learned (the next request is compacted to it), a WARNING says so without content — on all three
APIs; a normal answer, or an estimate under the window, changes nothing."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from fastapi import FastAPI
from starlette.types import ASGIApp

from inflight.factory import create_app
from inflight.windows.silent import SILENT_SHARE, silently_truncated
from tests.conftest import make_settings
from tests.support.fakes import FakeUpstream

pytestmark = pytest.mark.anyio

CHAT = "/v1/chat/completions"
MODEL = "fake-model"  # the fake's /v1/models advertises its window
WINDOW = 4096
SEEN = 1500  # what the truncating upstream says it counted
NO_COMPACTION = {"x-compaction-strategy": "none"}
WORDS = "tokens of a conversation that grows past the window of a small local model "


@pytest.mark.parametrize(
    ("reported", "estimate", "window", "truncated"),
    [
        (1500, 6000, 4096, True),
        (None, 6000, 4096, False),  # no usage
        (0, 6000, 4096, False),  # nothing to learn from
        (4300, 6000, 4096, False),  # 72 %: within what a calibrated estimate may be off
        (1500, 4000, 4096, False),  # the estimate fits the window: prompt caching, not a cut
        (1500, 4096, 4096, False),
    ],
)
def test_the_rule(reported: int | None, estimate: int, window: int, truncated: bool) -> None:
    assert silently_truncated(reported, estimate, window) is truncated
    assert SILENT_SHARE == 0.70


@pytest.mark.parametrize(
    ("reported", "estimate", "truncated"),
    [(1500, 4000, True), (2900, 4000, False), (None, 4000, False)],
)
def test_a_trusted_estimate_counts_under_the_window(
    reported: int | None, estimate: int, truncated: bool
) -> None:
    """Exact or calibrated: a 30 % shortfall is no counting error, even under the window."""
    assert silently_truncated(reported, estimate, 32768, trusted=True) is truncated
    assert not silently_truncated(reported, estimate, 32768, trusted=False)


def chat_body(turns: int = 30, **extra: Any) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}]
    for i in range(turns):
        messages += [
            {"role": "user", "content": f"question {i}: " + WORDS * 6},
            {"role": "assistant", "content": f"answer {i}: " + WORDS * 6},
        ]
    messages.append({"role": "user", "content": "and now?"})
    return {"model": MODEL, "messages": messages, "max_tokens": 64, **extra}


@asynccontextmanager
async def proxy(
    tmp_path: Path, upstream: ASGIApp, **settings: Any
) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    app = create_app(make_settings(tmp_path, **settings), transport=httpx.ASGITransport(upstream))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://proxy.test") as client:
            yield app, client


async def post(
    client: httpx.AsyncClient, path: str, body: Any, headers: dict[str, str] | None = None
) -> httpx.Response:
    response = await client.post(path, content=orjson.dumps(body), headers=headers or {})
    assert response.status_code == 200, response.text
    return response


def warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.levelno == logging.WARNING and "silently truncated" in r.getMessage()
    ]


async def test_chat_a_silent_cut_is_reported_learned_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fake = FakeUpstream()
    fake.advertised_window = WINDOW
    fake.prompt_tokens = SEEN
    caplog.set_level(logging.DEBUG)
    async with proxy(tmp_path, fake.app) as (app, client):
        first = await post(client, CHAT, chat_body(), NO_COMPACTION)
        assert first.headers["x-compaction-context-limit"] == str(WINDOW)
        assert int(first.headers["x-compaction-tokens-after"]) > WINDOW  # sent over the window
        assert first.headers["x-compaction-upstream-truncated"] == "true"
        (line,) = warnings(caplog)
        assert MODEL in line.getMessage()
        assert str(SEEN) in line.getMessage()
        assert all(WORDS.strip() not in r.getMessage() for r in caplog.records)  # no content
        # the counter is not calibrated on a prompt the upstream did not see whole
        assert MODEL not in app.state.inflight.counter.calibration_factors()
        second = await post(client, CHAT, chat_body())
        assert second.headers["x-compaction-context-limit"] == str(SEEN)
        assert second.headers["x-compaction-applied"] != "none"
        assert int(second.headers["x-compaction-tokens-after"]) <= SEEN
        assert "x-compaction-upstream-truncated" not in second.headers


async def estimate(client: httpx.AsyncClient, body: dict[str, Any]) -> int:
    counted = await post(client, "/v1/compaction/count", body)
    return int(counted.json()["prompt_tokens"])


async def test_chat_a_session_growing_past_a_smaller_server_window_is_caught(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Ollama's case: the proxy believes a large window (the table, discovery), the server runs
    a small `num_ctx`. Short requests are counted in full (the counter calibrates on them);
    once the conversation outgrows the server, its count stops growing. The estimate is under
    the window the proxy knows, but calibrated: the cut is caught, and the next request is
    compacted to what the server holds. A first request with no calibration is not taken for
    a cut (the shortfall could be a counting error)."""
    fake = FakeUpstream()
    fake.advertised_window = 32768
    async with proxy(tmp_path, fake.app) as (app, client):
        fake.prompt_tokens = SEEN
        long = chat_body(turns=30)
        uncalibrated = await post(client, CHAT, long)
        assert int(uncalibrated.headers["x-compaction-tokens-after"]) < 32768
        assert "x-compaction-upstream-truncated" not in uncalibrated.headers
        for turns in (2, 4, 6):  # short requests the server sees whole
            short = chat_body(turns=turns)
            fake.prompt_tokens = await estimate(client, short)
            await post(client, CHAT, short)
        assert MODEL in app.state.inflight.counter.calibration_factors()
        fake.prompt_tokens = SEEN
        caught = await post(client, CHAT, long)
        assert caught.headers["x-compaction-upstream-truncated"] == "true"
        assert len(warnings(caplog)) == 1
        after = await post(client, CHAT, long)
        assert after.headers["x-compaction-context-limit"] == str(SEEN)
        assert int(after.headers["x-compaction-tokens-after"]) <= SEEN


@pytest.mark.parametrize("fits", [False, True])
async def test_chat_a_normal_answer_or_a_prompt_that_fits_sets_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, fits: bool
) -> None:
    """Over the window, an answer that counted near the estimate; or a prompt that fits, with a
    tiny reported count (a prompt cache, a server counting its own way): no evidence of a cut."""
    fake = FakeUpstream()
    fake.advertised_window = WINDOW
    body = chat_body(turns=3 if fits else 30)
    async with proxy(tmp_path, fake.app) as (_, client):
        fake.prompt_tokens = 11 if fits else int(0.9 * await estimate(client, body))
        first = await post(client, CHAT, body, NO_COMPACTION)
        assert (int(first.headers["x-compaction-tokens-after"]) < WINDOW) is fits
        assert "x-compaction-upstream-truncated" not in first.headers
        second = await post(client, CHAT, chat_body())
        assert second.headers["x-compaction-context-limit"] == str(WINDOW)
        assert warnings(caplog) == []
        fake.prompt_tokens = SEEN  # the control: the same proxy does see a cut
        cut = await post(client, CHAT, chat_body(), NO_COMPACTION)
        assert cut.headers["x-compaction-upstream-truncated"] == "true"


async def test_chat_a_stream_learns_and_logs_but_its_headers_were_sent(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fake = FakeUpstream()
    fake.advertised_window = WINDOW
    fake.prompt_tokens = SEEN
    async with proxy(tmp_path, fake.app) as (_, client):
        body = orjson.dumps(chat_body(stream=True))
        async with client.stream("POST", CHAT, content=body, headers=NO_COMPACTION) as response:
            assert "x-compaction-upstream-truncated" not in response.headers
            await response.aread()
        assert len(warnings(caplog)) == 1
        after = await post(client, CHAT, chat_body())
        assert after.headers["x-compaction-context-limit"] == str(SEEN)


def responses_body() -> dict[str, Any]:
    items = [
        {"role": role, "content": f"{role} {i}: " + WORDS * 6}
        for i in range(30)
        for role in ("user", "assistant")
    ]
    return {"model": MODEL, "input": [*items, {"role": "user", "content": "and now?"}]}


async def test_responses_input_tokens_are_compared(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fake = FakeUpstream()
    fake.advertised_window = WINDOW
    async with proxy(tmp_path, fake.app) as (_, client):
        normal = await post(client, "/v1/responses", responses_body(), NO_COMPACTION)
        assert int(normal.headers["x-compaction-tokens-after"]) > WINDOW
        assert "x-compaction-upstream-truncated" not in normal.headers  # the fake's real count
        assert warnings(caplog) == []
        fake.prompt_tokens = SEEN
        cut = await post(client, "/v1/responses", responses_body(), NO_COMPACTION)
        assert cut.headers["x-compaction-upstream-truncated"] == "true"
        assert len(warnings(caplog)) == 1
        after = await post(client, "/v1/responses", responses_body())
        assert after.headers["x-compaction-context-limit"] == str(SEEN)


def messages_body() -> dict[str, Any]:
    messages = [
        {"role": role, "content": f"{role} {i}: " + WORDS * 12}
        for i in range(30)
        for role in ("user", "assistant")
    ]
    return {
        "model": "local-model",  # not in the table: the fallback window
        "max_tokens": 64,
        "messages": [*messages, {"role": "user", "content": "and now?"}],
    }


async def test_messages_input_plus_cache_reads_and_writes_are_compared(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fake = FakeUpstream()
    headers = {"x-api-key": "sk-ant", "anthropic-version": "2023-06-01", **NO_COMPACTION}
    async with proxy(tmp_path, fake.app, anthropic_upstream_url="http://anthropic.test/v1") as (
        _,
        client,
    ):
        fake.cached_tokens = 10**9  # nearly all of the prompt read from the cache ...
        fake.cache_write_tokens = 0
        cached = await post(client, "/v1/messages", messages_body(), headers)
        window = int(cached.headers["x-compaction-context-limit"])
        assert int(cached.headers["x-compaction-tokens-after"]) > window
        assert "x-compaction-upstream-truncated" not in cached.headers  # ... and still counted
        assert warnings(caplog) == []
        fake.cached_tokens, fake.cache_write_tokens, fake.prompt_tokens = 200, 300, SEEN
        cut = await post(client, "/v1/messages", messages_body(), headers)
        assert cut.headers["x-compaction-upstream-truncated"] == "true"
        assert len(warnings(caplog)) == 1
        after = await post(client, "/v1/messages", messages_body(), {"x-api-key": "sk-ant"})
        assert after.headers["x-compaction-context-limit"] == str(SEEN)
