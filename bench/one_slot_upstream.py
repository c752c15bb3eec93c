"""A one-slot fake upstream for `bench/summaries_load.py`: `python -m bench.one_slot_upstream
PORT ANSWER_S SUMMARY_S`. It serves one request at a time (llama.cpp with `-np 1`, and says so
in `/props`); a summary repeats every planted fact (`FACT-…`) of its prompt; each answer
carries the messages it was sent (`bench_messages`) so the benchmark can read the prompt."""

from __future__ import annotations

import asyncio
import re
import sys

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from bench.upstream import models

ANSWER_SECONDS = float(sys.argv[2]) if len(sys.argv) > 2 else 0.1
SUMMARY_SECONDS = float(sys.argv[3]) if len(sys.argv) > 3 else 0.5
FACT = re.compile(r"FACT-[0-9a-f]{6}")
SLOT = asyncio.Lock()


def _answer(text: str, prompt: int, **extra: object) -> Response:
    body = {
        "id": "c",
        "object": "chat.completion",
        "created": 1,
        "model": "local",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": prompt, "completion_tokens": 20, "total_tokens": prompt + 20},
        **extra,
    }
    return Response(orjson.dumps(body), media_type="application/json")


async def chat(request: Request) -> Response:
    raw = await request.body()
    messages = orjson.loads(raw).get("messages") or []
    async with SLOT:
        last = str(messages[-1].get("content", "")) if messages else ""
        if "<transcript>" in last:
            await asyncio.sleep(SUMMARY_SECONDS)
            facts = ", ".join(dict.fromkeys(FACT.findall(last)))
            return _answer(f"Summary. Facts: {facts}", len(raw) // 4)
        await asyncio.sleep(ANSWER_SECONDS)
        return _answer("ok", len(raw) // 4, bench_messages=messages)


async def props(request: Request) -> Response:
    return JSONResponse({"total_slots": 1})


app = Starlette(
    routes=[
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/props", props, methods=["GET"]),
    ]
)

if __name__ == "__main__":
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
