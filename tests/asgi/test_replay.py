"""Replays of the real transcripts, turn by turn, through the proxy to a fake upstream that
rejects what OpenAI rejects (orphan tool results, unanswered calls), what strict templates
reject (role order, for chats that alternate) and any prompt over its window."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from inflight.compaction.units import is_strict_alternation
from inflight.factory import create_app
from tests.conftest import make_settings
from tests.support import load_traces, request_points
from tests.support.fakes import FakeUpstream

pytestmark = pytest.mark.anyio
TRACES = load_traces()


async def replay(
    tmp_path: Path, messages: list[dict[str, Any]], window: int, headers: dict[str, str]
) -> tuple[FakeUpstream, list[httpx.Response]]:
    fake = FakeUpstream()
    fake.context_window = window
    fake.enforce_pairs = True
    fake.require_alternation = is_strict_alternation(messages)
    app = create_app(make_settings(tmp_path), transport=httpx.ASGITransport(app=fake.app))
    responses = []
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://proxy"
        ) as client,
    ):
        for k in request_points(messages):
            body = {"model": "fake-model", "messages": messages[:k], "max_tokens": 256}
            responses.append(
                await client.post(
                    "/v1/chat/completions", content=orjson.dumps(body), headers=headers
                )
            )
    return fake, responses


@pytest.mark.parametrize("window", [8192, 16384, 32768])
@pytest.mark.parametrize("trace", [name for name, _ in TRACES])
async def test_replay_never_rejected_and_always_within_window(
    tmp_path: Path, trace: str, window: int
) -> None:
    messages = dict(TRACES)[trace]
    fake, responses = await replay(tmp_path, messages, window, {})
    statuses = [r.status_code for r in responses]
    assert statuses == [200] * len(responses), fake.rejected[:3]
    assert fake.rejected == []
    assert fake.max_prompt_seen + 256 <= window
    assert all("x-compaction-applied" in r.headers for r in responses)


def _strict_chat(turns: int, size: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Answer briefly."}]
    for k in range(turns):
        messages.append({"role": "user", "content": f"question {k}: " + "word " * size})
        messages.append({"role": "assistant", "content": f"answer {k}: " + "reply " * size})
    messages.append({"role": "user", "content": "last"})
    return messages


@pytest.mark.parametrize("strategy", ["auto", "trim", "middle-out", "summarize"])
async def test_strict_template_chat_keeps_alternating(tmp_path: Path, strategy: str) -> None:
    fake, responses = await replay(
        tmp_path, _strict_chat(40, 300), 8192, {"X-Compaction-Strategy": strategy}
    )
    assert [r.status_code for r in responses] == [200] * len(responses), fake.rejected[:3]
    assert fake.rejected == []
