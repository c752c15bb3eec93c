"""inflight's own work per request, in process, for whichever `app` this interpreter imports.

Run as a script by `bench.hot_path.own_work` (never imported by it), once with this checkout's
`app` and once with an earlier checkout's (`python -m bench --before DIR`: `PYTHONPATH=DIR`), so
that the same sessions measure both builds in one run. It imports nothing from `bench`: the
sessions come as a JSON file of cases, each `{"label", "window", "bodies": [JSON text, ...]}`,
and it prints `{label: median ms per request}` (every request after the first three timed; the
upstream is in memory and answers with a plausible prompt count).

Usage: `python bench/own_work.py CASES.json`
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from typing import Any

import httpx
import orjson

from inflight.factory import create_app
from inflight.settings import Settings

HEADERS = {"authorization": "Bearer sk-bench-key", "content-type": "application/json"}
WARM = 3


def upstream(request: httpx.Request) -> httpx.Response:
    """An in-memory upstream (also `bench.overhead`'s): a tiny JSON answer whose usage states
    a plausible prompt count — a fixed small one would read as a silently truncated prompt."""
    if request.url.path.endswith("/models"):
        return httpx.Response(200, json={"data": [{"id": "bench", "max_model_len": 8192}]})
    prompt = len(request.content) // 4
    answer = {
        "id": "bench",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": 2, "total_tokens": prompt + 2},
    }
    headers = {"content-type": "application/json"}
    return httpx.Response(200, content=orjson.dumps(answer), headers=headers)


async def _session(window: int, bodies: list[bytes]) -> float:
    settings = Settings(  # type: ignore[call-arg]
        _env_file=None, upstream_url="http://up/v1", database_url="none", context_limit=window
    )
    app = create_app(settings, transport=httpx.MockTransport(upstream))
    samples = []
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as client:
            for i, body in enumerate(bodies):
                start = time.perf_counter()
                response = await client.post("/v1/chat/completions", content=body, headers=HEADERS)
                if i >= WARM:
                    samples.append((time.perf_counter() - start) * 1000)
                response.raise_for_status()
    return statistics.median(samples)


def main(path: str) -> None:
    with open(path) as file:
        cases: list[dict[str, Any]] = json.load(file)
    results = {
        case["label"]: asyncio.run(
            _session(case["window"], [body.encode() for body in case["bodies"]])
        )
        for case in cases
    }
    print(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1])
