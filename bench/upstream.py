"""A minimal, fast OpenAI-shaped upstream for benchmarks: `python -m bench.upstream PORT`.

JSON answers and SSE streams of a fixed number of chunks, with usage; no real model.
"""

from __future__ import annotations

import asyncio
import sys
import time

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

CHUNKS = 20


def _chunk(i: int, stamp: bool = False) -> bytes:
    content = f"{time.time_ns()} " if stamp else f"tok{i} "
    event = {
        "id": "c",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "bench",
        "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}],
    }
    return b"data: " + orjson.dumps(event) + b"\n\n"


def usage(raw: bytes) -> dict[str, int]:
    """A plausible count of the prompt (a real server reports the real one; a fixed small
    number would read as a silently truncated prompt and teach the proxy a tiny window)."""
    prompt = len(raw) // 4
    return {"prompt_tokens": prompt, "completion_tokens": CHUNKS, "total_tokens": prompt + CHUNKS}


def answer(raw: bytes) -> bytes:
    return orjson.dumps(
        {
            "id": "c",
            "object": "chat.completion",
            "created": 1,
            "model": "bench",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "ok"},
                    "finish_reason": "stop",
                }
            ],
            "usage": usage(raw),
        }
    )


async def chat(request: Request) -> Response:
    raw = await request.body()
    body = orjson.loads(raw)
    if not body.get("stream"):
        return Response(answer(raw), media_type="application/json")
    wants_usage = (body.get("stream_options") or {}).get("include_usage")
    gap = float(body.get("bench_gap", 0))  # seconds between chunks (held streams)
    stamp = bool(body.get("bench_stamp"))  # content = send time in ns (chunk latency)
    chunks = int(body.get("bench_chunks", CHUNKS))

    async def events():  # type: ignore[no-untyped-def]
        for i in range(chunks):
            yield _chunk(i, stamp)
            if gap:  # held streams: end once the proxy has hung up (uvicorn's send would not say)
                await asyncio.sleep(gap)
                if i % 64 == 63 and await request.is_disconnected():
                    return
        if wants_usage:
            final = {"id": "c", "choices": [], "usage": usage(raw)}
            yield b"data: " + orjson.dumps(final) + b"\n\n"
        yield b"data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


async def models(request: Request) -> Response:
    return Response(b'{"object":"list","data":[{"id":"bench","max_model_len":32768}]}')


app = Starlette(
    routes=[
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
    ]
)

if __name__ == "__main__":
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
