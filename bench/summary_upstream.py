"""A fake upstream for the summaries benchmark: `python -m bench.summary_upstream PORT SUMMARY_S
ANSWER_S`. A summary call (its prompt holds a `<transcript>`) takes SUMMARY_S seconds, any
other chat request ANSWER_S (a model answering); each answer carries the messages it was sent
(`bench_messages`, relayed untouched by the proxy) so the benchmark can compare prompts."""

from __future__ import annotations

import asyncio
import sys

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from bench.upstream import models

SUMMARY_SECONDS = float(sys.argv[2]) if len(sys.argv) > 2 else 2.0
ANSWER_SECONDS = float(sys.argv[3]) if len(sys.argv) > 3 else 0.2


def _answer(text: str, **extra: object) -> Response:
    body = {
        "id": "c",
        "object": "chat.completion",
        "created": 1,
        "model": "bench",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 50, "completion_tokens": 20, "total_tokens": 70},
        **extra,
    }
    return Response(orjson.dumps(body), media_type="application/json")


async def chat(request: Request) -> Response:
    body = orjson.loads(await request.body())
    messages = body.get("messages") or []
    if messages and "<transcript>" in str(messages[-1].get("content", "")):
        await asyncio.sleep(SUMMARY_SECONDS)
        return _answer("Goal: the task. Done: the steps so far. Open: what remains.")
    await asyncio.sleep(ANSWER_SECONDS)
    return _answer("ok", bench_messages=messages)


app = Starlette(
    routes=[
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
    ]
)

if __name__ == "__main__":
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
