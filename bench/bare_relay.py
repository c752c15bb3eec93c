"""The smallest streaming relay one can write on inflight's stack, as a latency floor.

FastAPI in, one pooled `httpx.AsyncClient` out (pooled as inflight's is), bytes streamed
through untouched: no auth, counting, compaction, headers or usage.
Run: `python -m bench.bare_relay PORT UPSTREAM_URL`.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator

import httpx
from fastapi import FastAPI, Request
from starlette.background import BackgroundTask
from starlette.responses import Response, StreamingResponse


def create(upstream: str) -> FastAPI:
    app = FastAPI()
    # the pool inflight's (app/proxy/upstream.py): with httpx's default (20 kept alive), 64
    # concurrent clients churn connections and the relay measures that, not the hop
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=200, keepalive_expiry=2)
    client = httpx.AsyncClient(base_url=upstream, timeout=60, limits=limits, trust_env=False)

    @app.post("/v1/chat/completions", response_model=None)
    async def relay(request: Request) -> Response:
        sent = client.build_request(
            "POST",
            "/chat/completions",
            content=await request.body(),
            headers={"content-type": "application/json"},
        )
        answer = await client.send(sent, stream=True)

        async def body() -> AsyncIterator[bytes]:
            async for chunk in answer.aiter_raw():
                yield chunk

        return StreamingResponse(
            body(),
            status_code=answer.status_code,
            media_type=answer.headers.get("content-type"),
            background=BackgroundTask(answer.aclose),
        )

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app


if __name__ == "__main__":
    import uvicorn

    port, upstream = int(sys.argv[1]), sys.argv[2]
    uvicorn.run(create(upstream), host="127.0.0.1", port=port, log_level="warning")
