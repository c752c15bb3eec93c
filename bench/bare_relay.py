"""The smallest streaming relay one can write on inflight's stack, as a latency floor.

FastAPI in, one pooled `httpx.AsyncClient` out, bytes streamed through untouched: no auth,
counting, compaction, headers or usage. With POOLS > 1, that many clients, a request taking the
least busy, their connections shared out as inflight's are (app/proxy/upstream.py).
Run: `python -m bench.bare_relay PORT UPSTREAM_URL [POOLS]`.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator

import httpx
from fastapi import FastAPI, Request
from starlette.background import BackgroundTask
from starlette.responses import Response, StreamingResponse


def create(upstream: str, pools: int = 1) -> FastAPI:
    app = FastAPI()
    # inflight's connection limits (app/proxy/upstream.py): with httpx's default (20 kept
    # alive), 64 concurrent clients churn connections and the relay measures that, not the hop
    limits = httpx.Limits(
        max_connections=1000 // pools, max_keepalive_connections=200 // pools, keepalive_expiry=2
    )
    clients = [
        httpx.AsyncClient(base_url=upstream, timeout=60, limits=limits, trust_env=False)
        for _ in range(pools)
    ]
    loads = [0] * pools

    @app.post("/v1/chat/completions", response_model=None)
    async def relay(request: Request) -> Response:
        pool = loads.index(min(loads))
        client = clients[pool]
        sent = client.build_request(
            "POST",
            "/chat/completions",
            content=await request.body(),
            headers={"content-type": "application/json"},
        )
        loads[pool] += 1
        try:
            answer = await client.send(sent, stream=True)
        except BaseException:
            loads[pool] -= 1
            raise

        async def done() -> None:
            loads[pool] -= 1
            await answer.aclose()

        async def body() -> AsyncIterator[bytes]:
            async for chunk in answer.aiter_raw():
                yield chunk

        return StreamingResponse(
            body(),
            status_code=answer.status_code,
            media_type=answer.headers.get("content-type"),
            background=BackgroundTask(done),
        )

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app


if __name__ == "__main__":
    import uvicorn

    port, upstream = int(sys.argv[1]), sys.argv[2]
    pools = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    uvicorn.run(create(upstream, pools), host="127.0.0.1", port=port, log_level="warning")
