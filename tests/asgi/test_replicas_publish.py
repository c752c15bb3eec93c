"""Replicas publish what an answer taught before the client has the whole answer: the
compare-and-set lands before a JSON body goes, and before a stream's final event (`[DONE]`), so a
client's next request, whichever replica it reaches, is planned on it; a store slower than
the bound (200 ms) delays no answer, and the miss is logged."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import anyio
import httpx
import orjson
import pytest

from bench.replicas import MODEL, BillingUpstream, settings
from inflight.factory import create_app
from inflight.windows.shared import MemoryLearnedStore
from tests.unit.windows.test_replicas_plan import conversation


class WatchedStore(MemoryLearnedStore):
    """Notes each publish in `events`; with `gate`, a publish waits until the answer's last
    bytes went."""

    def __init__(self, events: list[str], gate: anyio.Event | None = None) -> None:
        super().__init__()
        self.events = events
        self.gate = gate

    async def put(self, key: str, version: int, body: bytes) -> int | None:
        if self.gate is not None:
            await self.gate.wait()
        self.events.append("publish")
        return await super().put(key, version, body)


def upstream(request: httpx.Request) -> httpx.Response:
    """Bills like bench.replicas; streams (usage in the last chunk) when asked."""
    if request.method != "POST":  # window discovery: nothing to say
        return httpx.Response(404, json={"error": {"message": "not found"}})
    body = orjson.loads(request.content)
    if body.get("stream") is not True:
        return BillingUpstream().handle(request)
    prompt = BillingUpstream().billed(body["messages"])
    head = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": MODEL}
    events = [
        {**head, "choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": "stop"}]},
        {**head, "choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": 1}},
    ]
    content = b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events)
    return httpx.Response(
        200,
        headers={"content-type": "text/event-stream"},
        content=content + b"data: [DONE]\n\n",
    )


async def answer(store: WatchedStore, stream: bool) -> list[str]:
    """One request through an app sharing its state through `store`: what happened, in order
    ("publish", "body" for each body message, "last" for the one holding the end)."""
    app = create_app(settings("", None), transport=httpx.MockTransport(upstream), learned=store)
    body = {"model": MODEL, "messages": conversation([30] * 6), "stream": stream}
    raw = orjson.dumps(body)
    headers = [
        (b"content-type", b"application/json"),
        (b"authorization", b"Bearer t"),
        (b"x-compaction-context-limit", b"2048"),
        (b"content-length", str(len(raw)).encode()),
    ]
    scope: dict[str, Any] = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions",
        "query_string": b"", "headers": headers, "client": ("127.0.0.1", 1),
        "server": ("proxy", 80), "root_path": "",
    }  # fmt: skip
    sent = False

    async def receive() -> Mapping[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": raw, "more_body": False}
        await anyio.sleep_forever()
        raise AssertionError  # unreachable

    async def send(message: Mapping[str, Any]) -> None:
        if message["type"] == "http.response.body":
            chunk = message.get("body", b"")
            end = not message.get("more_body", False) or b"[DONE]" in chunk
            store.events.append("last" if end and chunk else "body")
            if end and chunk and store.gate is not None:
                store.gate.set()

    async with app.router.lifespan_context(app):
        with anyio.fail_after(10):
            await app(scope, receive, send)
    return store.events


@pytest.mark.parametrize("stream", [False, True])
def test_what_an_answer_taught_is_published_before_its_end(stream: bool) -> None:
    events = anyio.run(answer, WatchedStore([]), stream)
    assert "publish" in events, events
    assert "last" in events, events
    assert events.index("publish") < events.index("last"), events


def test_a_slow_store_delays_no_answer(caplog: pytest.LogCaptureFixture) -> None:
    events = anyio.run(answer, WatchedStore([], anyio.Event()), True)
    assert events.index("last") < events.index("publish"), events
    assert "publishing took over 200 ms" in caplog.text
