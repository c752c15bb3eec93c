"""A local model's prefill speed learned from llama.cpp's `timings` (DESIGN.md §16): read from
JSON answers and streams, kept per (upstream, model) as a bounded running rate, and used by
cost mode's local-model rule when INFLIGHT_PREFILL_RATE is unset."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from fastapi import FastAPI
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from inflight.apis.chat.events import EVENTS as CHAT_EVENTS
from inflight.compaction.cost_mode import PrefillRates
from inflight.factory import create_app
from inflight.proxy.sse_tap import Prefill, SSETap
from tests.conftest import make_settings
from tests.support.servers import WatchedStore
from tests.unit.compaction.test_cost_mode import session

pytestmark = pytest.mark.anyio
UPSTREAM = "http://upstream.test/v1"
MODEL = "my-local-model"  # no price: judged on prefill time


def timings(prompt_n: int, per_second: float) -> dict[str, Any]:
    """llama.cpp's `timings` object."""
    return {
        "prompt_n": prompt_n, "prompt_ms": 1000.0 * prompt_n / per_second,
        "prompt_per_token_ms": 1000.0 / per_second, "prompt_per_second": per_second,
        "predicted_n": 2, "predicted_ms": 40.0, "predicted_per_token_ms": 20.0,
        "predicted_per_second": 50.0,
    }  # fmt: skip


def chunk(**fields: Any) -> bytes:
    return b"data: " + orjson.dumps({"object": "chat.completion.chunk", **fields}) + b"\n\n"


class LlamaServer:
    """A llama.cpp server's chat completions: `timings` on the answer (JSON), or on the usage
    chunk (a stream that asked for usage), else on the last chunk."""

    def __init__(self, per_second: float) -> None:
        self.per_second = per_second
        self.app = Starlette(routes=[Route("/v1/chat/completions", self.chat, methods=["POST"])])

    async def chat(self, request: Request) -> Response:
        body = await request.json()
        n = 1000
        usage = {"prompt_tokens": n, "completion_tokens": 2, "total_tokens": n + 2}
        if not body.get("stream"):
            message = {"role": "assistant", "content": "ok"}
            return JSONResponse({
                "id": "x", "object": "chat.completion", "model": body["model"],
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": usage, "timings": timings(n, self.per_second),
            })  # fmt: skip
        with_usage = (body.get("stream_options") or {}).get("include_usage") is True
        last: dict[str, Any] = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
        parts = [chunk(choices=[{"index": 0, "delta": {"content": "ok"}}])]
        if with_usage:
            parts += [chunk(**last), chunk(choices=[], usage=usage, timings=timings(n, 500.0))]
        else:
            parts.append(chunk(**last, timings=timings(n, 500.0)))
        parts.append(b"data: [DONE]\n\n")
        return StreamingResponse(iter(parts), media_type="text/event-stream")


def test_the_running_rate_weighs_answers_by_what_they_prefilled() -> None:
    rates = PrefillRates(capacity=2, decay=1.0)
    assert rates.rate(UPSTREAM, MODEL) is None
    rates.observe(UPSTREAM, MODEL, 1000, 1000.0)  # 1 s
    rates.observe(UPSTREAM, MODEL, 10, 10.0)  # a cached prompt's few tokens: 1 s, little weight
    assert rates.rate(UPSTREAM, MODEL) == pytest.approx(1010 / 2.0)
    rates.observe(UPSTREAM, MODEL, 0, 5.0)  # nothing prefilled: nothing learned
    rates.observe(UPSTREAM, MODEL, 5, 0.0)
    assert rates.rate(UPSTREAM, MODEL) == pytest.approx(1010 / 2.0)
    assert rates.rate("http://other/v1", MODEL) is None  # per upstream
    rates.observe("http://a/v1", MODEL, 10, 1.0)
    rates.observe("http://b/v1", MODEL, 10, 1.0)
    assert rates.rate(UPSTREAM, MODEL) is None  # bounded: the least recent pair is gone


def test_older_answers_decay() -> None:
    rates = PrefillRates(decay=0.5)
    rates.observe(UPSTREAM, MODEL, 1000, 100.0)
    for _ in range(20):
        rates.observe(UPSTREAM, MODEL, 1000, 2000.0)
    rate = rates.rate(UPSTREAM, MODEL)
    assert rate is not None
    assert rate == pytest.approx(2000.0, rel=1e-3)


def test_timings_are_read_strictly() -> None:
    assert Prefill.of(timings(1000, 812.5)) == Prefill(1000, 812.5)
    for bad in (None, [], {"prompt_n": 10}, {"prompt_n": 0, "prompt_per_second": 5.0},
                {"prompt_n": 10, "prompt_per_second": 0}, {"prompt_n": 10, "prompt_per_second": True},
                {"prompt_n": 10, "prompt_per_second": float("inf")},
                {"prompt_n": "10", "prompt_per_second": 5.0}):  # fmt: skip
        assert Prefill.of(bad) is None


@pytest.mark.parametrize("with_usage", [True, False])
def test_the_tap_keeps_a_streams_timings_with_its_usage(with_usage: bool) -> None:
    usage = {"prompt_tokens": 1000, "completion_tokens": 2, "total_tokens": 1002}
    last: dict[str, Any] = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    if with_usage:  # timings on the usage chunk, as llama.cpp sends them
        stream = chunk(**last) + chunk(choices=[], usage=usage, timings=timings(1000, 640.0))
    else:  # an older server: usage and timings on the last chunk, in either order of reading
        stream = chunk(**last, timings=timings(1000, 640.0)) + chunk(choices=[], usage=usage)
    tap = SSETap(CHAT_EVENTS, strip_usage_chunk=with_usage)
    out = tap.feed(stream + b"data: [DONE]\n\n") + tap.flush()
    assert tap.usage is not None
    assert tap.usage.prompt_tokens == 1000
    assert tap.usage.prefill == Prefill(1000, 640.0)
    assert (b"timings" in out) is not with_usage  # the usage chunk the proxy asked for is cut


@pytest.fixture
async def proxy(tmp_path: Path) -> AsyncIterator[tuple[FastAPI, LlamaServer]]:
    llama = LlamaServer(per_second=800.0)
    settings = make_settings(tmp_path, upstream_url=UPSTREAM, cost_min_prompt=1000)
    assert settings.prefill_rate is None
    app = create_app(settings, transport=httpx.ASGITransport(app=llama.app), store=WatchedStore())
    async with app.router.lifespan_context(app):
        yield app, llama


async def test_a_local_model_is_judged_on_the_prefill_rate_its_answers_showed(
    proxy: tuple[FastAPI, LlamaServer],
) -> None:
    app, _ = proxy
    body = {"model": MODEL, "messages": session(150, 400), "max_tokens": 8}
    headers = {"x-compaction-context-limit": "200000", "x-compaction-for-cost": "on"}
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as client:

        async def economics() -> Any:
            response = await client.post("/v1/compaction/preview", json=body, headers=headers)
            assert response.status_code == 200, response.text
            return response.json()["report"]["economics"]

        assert await economics() is None  # no rate known yet: cost mode cannot judge it
        first = await client.post("/v1/chat/completions", json=body, headers=headers)
        assert first.status_code == 200
        assert first.headers["x-compaction-applied"] == "none"
        learned = await economics()
        assert learned["unit"] == "s"
        # a cached token costs a tenth of reading it afresh at the 800 tokens/s it showed
        removed = learned["tokens_removed"]
        assert learned["saving_per_request"] == pytest.approx(removed * 0.1 / 800.0, rel=1e-4)
        again = await client.post("/v1/chat/completions", json=body, headers=headers)
        assert again.headers["x-compaction-applied"] != "none"
        # a stream's timings (500 tokens/s, on its usage chunk) move the running rate
        streamed = await client.post(
            "/v1/chat/completions", json={**body, "stream": True}, headers=headers
        )
        assert streamed.status_code == 200
        assert b"[DONE]" in streamed.content
        moved = await economics()
        per_token = moved["saving_per_request"] / moved["tokens_removed"]
        assert 0.1 / 800.0 < per_token < 0.1 / 500.0
