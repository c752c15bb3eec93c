"""Where the added latency goes: inflight's own work per request, without the network hop.

In one process, with an in-memory upstream (`httpx.MockTransport`) and the ASGI app called
directly, inflight is timed against the smallest relay one could write with the same stack
(a FastAPI route that forwards the body with one pooled `httpx.AsyncClient`). What is left is
the price of parsing, counting, planning, the report headers and the usage record.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import orjson
from fastapi import FastAPI, Request
from starlette.responses import Response

from bench.own_work import upstream
from inflight.factory import create_app
from inflight.settings import Settings

BODY = orjson.dumps({"model": "bench", "messages": [{"role": "user", "content": "hello " * 50}]})


def _bare_relay() -> FastAPI:
    app = FastAPI()
    client = httpx.AsyncClient(transport=httpx.MockTransport(upstream))

    @app.post("/v1/chat/completions")
    async def relay(request: Request) -> Response:
        answer = await client.post("http://up/v1/chat/completions", content=await request.body())
        return Response(answer.content, media_type="application/json")

    return app


async def _per_request_ms(app: FastAPI, n: int, rounds: int) -> float:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as client:
        for _ in range(100):
            await client.post("/v1/chat/completions", content=BODY)
        samples = []
        for _ in range(rounds):
            start = time.perf_counter()
            for _ in range(n):
                await client.post("/v1/chat/completions", content=BODY)
            samples.append((time.perf_counter() - start) / n * 1000)
        return statistics.median(samples)


async def _inflight_ms(database_url: str, n: int, rounds: int) -> float:
    settings = Settings(  # type: ignore[call-arg]
        _env_file=None, upstream_url="http://up/v1", database_url=database_url
    )
    app = create_app(settings, transport=httpx.MockTransport(upstream))
    async with app.router.lifespan_context(app):
        return await _per_request_ms(app, n, rounds)


async def _measure(n: int, rounds: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        return {
            "bare FastAPI + httpx relay": await _per_request_ms(_bare_relay(), n, rounds),
            "inflight, recording off": await _inflight_ms("none", n, rounds),
            "inflight, usage in SQLite": await _inflight_ms(
                f"sqlite:///{Path(tmp) / 'u.db'}", n, rounds
            ),
        }


def report(n: int = 2000, rounds: int = 5) -> str:
    ms = asyncio.run(_measure(n, rounds))
    bare = ms["bare FastAPI + httpx relay"]
    rows = [f"| {name} | {value:.3f} | {value / bare:.2f}× |" for name, value in ms.items()]
    own = ms["inflight, usage in SQLite"] - bare
    recording = ms["inflight, usage in SQLite"] - ms["inflight, recording off"]
    return (
        f"In process, no network ({n} JSON requests × {rounds} rounds, median round):\n\n"
        "| relay | ms per request | vs bare relay |\n|---|---:|---:|\n"
        + "\n".join(rows)
        + f"\n\ninflight's own work (count, plan, report headers, usage record): {own * 1000:.0f} "
        f"µs per request, of which recording usage {recording * 1000:.0f} µs; the rest of the "
        "added latency above is the extra HTTP hop (uvicorn in, httpx out)."
    )
