"""No request's CPU work starves the event loop: while the proxy counts and plans a ~32 MiB
conversation, `/healthz` keeps answering (issue 12, defect 6)."""

from __future__ import annotations

import time
from itertools import pairwise
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson
import pytest

from inflight.compaction.offload import (
    INLINE_COVERED_MESSAGES,
    OFFLOAD_CHARS,
    OFFLOAD_MESSAGES,
    is_heavy,
    is_large,
)
from inflight.factory import create_app
from inflight.jsontext import HistoryTexts
from tests.conftest import make_settings
from tests.support.fakes import FakeUpstream

pytestmark = pytest.mark.anyio
LONGEST_GAP_SHARE = 0.75  # of the big request's time: a blocked loop's gap is all of it
PROBE_EVERY = 0.05


def huge_chat(messages: int = 16_000, words: int = 400) -> list[dict[str, Any]]:
    chat: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}]
    for i in range(messages - 1):
        role = "user" if i % 2 == 0 else "assistant"
        chat.append({"role": role, "content": f"m{i} " + "word " * words})
    return chat


def test_what_counts_as_large() -> None:
    small = [{"role": "user", "content": "hi"}] * OFFLOAD_MESSAGES
    assert not is_large(small, HistoryTexts())
    assert is_large([*small, {"role": "assistant", "content": "hello"}], HistoryTexts())
    assert is_large(
        [{"role": "tool", "tool_call_id": "c", "content": "x" * (OFFLOAD_CHARS + 1)}],
        HistoryTexts(),
    )
    parts = [{"type": "text", "text": "x" * (OFFLOAD_CHARS // 2 + 1)}] * 2
    assert is_large([{"role": "user", "content": parts}], HistoryTexts())
    fn = {"name": "write_file", "arguments": "x" * (OFFLOAD_CHARS + 1)}
    assert is_large(
        [{"role": "assistant", "content": None, "tool_calls": [{"function": fn}]}], HistoryTexts()
    )


async def test_healthz_answers_during_a_32_mib_compaction(
    tmp_path: Path, fake: FakeUpstream
) -> None:
    body = orjson.dumps({"model": "gpt-4o", "messages": huge_chat()})
    assert 30 * 2**20 < len(body) <= 32 * 2**20
    app = create_app(make_settings(tmp_path), transport=httpx.ASGITransport(app=fake.app))
    transport = httpx.ASGITransport(app=app)
    beats: list[float] = []  # when each /healthz answer came back
    outcome: dict[str, Any] = {}
    done = anyio.Event()

    async def compact_it(client: httpx.AsyncClient) -> None:
        start = time.monotonic()
        outcome["response"] = await client.post(
            "/v1/compaction/preview",
            content=body,
            headers={"X-Compaction-Strategy": "middle-out", "X-Compaction-Context-Limit": "1024"},
        )
        outcome["seconds"] = time.monotonic() - start
        done.set()

    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://proxy") as client,
    ):
        assert (await client.get("/healthz")).status_code == 200
        with anyio.fail_after(300):
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(compact_it, client)
                while not done.is_set():  # a liveness probe every 50 ms, until it is done
                    assert (await client.get("/healthz")).status_code == 200
                    beats.append(time.monotonic())
                    with anyio.move_on_after(PROBE_EVERY):
                        await done.wait()
                beats.append(time.monotonic())  # the loop saw the compaction end
    response = outcome["response"]
    assert response.status_code == 200
    assert response.json()["report"]["applied"] == ["middle-out"]
    # The loop answered all along: a blocked loop leaves one gap as long as the compaction
    # (measured: the whole ~2 s with the worker thread disabled). Relative, not absolute, so a
    # loaded 2-core machine slows both sides alike (quiet: 0.5 s of 2.4 s, the 32 MiB parse).
    gaps = [later - earlier for earlier, later in pairwise(beats)]
    assert len(beats) >= 5
    assert max(gaps) < LONGEST_GAP_SHARE * outcome["seconds"], (max(gaps), outcome["seconds"])


async def test_a_large_history_a_replay_covers_is_planned_inline(
    tmp_path: Path, fake: FakeUpstream
) -> None:
    """A hop to a worker thread costs more than a conversation's next request's work (it
    counts, replays and renders only what it added). A large history is planned inline once a
    remembered replay covers all but a little of it, unless it is huge; a cold one, an edited
    one and a huge one go to a worker thread."""
    app = create_app(make_settings(tmp_path), transport=httpx.ASGITransport(app=fake.app))
    compactor = app.state.inflight.compactor
    chat = huge_chat(messages=2400, words=20)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://p") as client:
            for size in (400, 1500):
                history = chat[:size]
                assert is_large(history, compactor.texts)
                # cold: nothing remembered
                assert is_heavy(history, compactor._replays, compactor.texts)
                body = orjson.dumps({"model": "gpt-4o", "messages": history})
                assert (await client.post("/v1/chat/completions", content=body)).status_code == 200
                grown = chat[: size + 2]
                heavy = is_heavy(grown, compactor._replays, compactor.texts)
                assert heavy == (size + 2 > INLINE_COVERED_MESSAGES)
                edited = [{**history[0], "content": "Be verbose."}, *history[1:]]
                assert is_heavy(edited, compactor._replays, compactor.texts)
