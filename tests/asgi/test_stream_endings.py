"""How a relayed stream that ends in an error event is recorded: `upstream_error`, with the usage
the upstream reported before failing (an Anthropic `error` event after some text, a Responses
`response.failed` or `error` event)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from inflight.factory import create_app
from tests.conftest import make_settings
from tests.support.list_store import ListStore


def sse(name: str, data: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


ANTHROPIC_OVERLOADED = b"".join(
    [
        sse(
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg_1",
                    "type": "message",
                    "role": "assistant",
                    "content": [],
                    "model": "claude-sonnet-4-5",
                    "usage": {"input_tokens": 40, "output_tokens": 1},
                },
            },
        ),
        sse(
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": "Hi"},
            },
        ),
        sse(
            "error",
            {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
        ),
    ]
)
RESPONSE = {"id": "resp_1", "object": "response", "status": "in_progress", "usage": None}
USAGE = {"input_tokens": 30, "output_tokens": 2, "total_tokens": 32}
FAILED = {**RESPONSE, "status": "failed", "usage": USAGE}
RESPONSES_FAILED = b"".join(
    [
        sse("response.created", {"type": "response.created", "response": RESPONSE}),
        sse("response.output_text.delta", {"type": "response.output_text.delta", "delta": "Hi"}),
        sse(
            "response.failed",
            {
                "type": "response.failed",
                "response": {**FAILED, "error": {"code": "server_error", "message": "boom"}},
            },
        ),
    ]
)
RESPONSES_ERROR_EVENT = b"".join(
    [
        sse("response.created", {"type": "response.created", "response": RESPONSE}),
        sse("response.output_text.delta", {"type": "response.output_text.delta", "delta": "Hi"}),
        sse("error", {"type": "error", "code": "server_error", "message": "boom", "param": None}),
    ]
)
RESPONSES_COMPLETED = b"".join(
    [
        sse("response.created", {"type": "response.created", "response": RESPONSE}),
        sse(
            "response.completed",
            {
                "type": "response.completed",
                "response": {**RESPONSE, "status": "completed", "usage": USAGE},
            },
        ),
    ]
)


def upstream(stream: bytes) -> httpx.MockTransport:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=stream)

    return httpx.MockTransport(answer)


async def relay(tmp_path: Path, path: str, stream: bytes, body: dict[str, Any]) -> Any:
    """Post `body` to `path` against an upstream answering `stream`; the request's record."""
    store = ListStore()
    settings = make_settings(tmp_path, anthropic_upstream_url="http://anthropic.test/v1")
    app = create_app(settings, transport=upstream(stream), store=store)  # type: ignore[arg-type]
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://proxy.test") as client:
            headers = {"anthropic-version": "2023-06-01", "x-api-key": "sk-ant"}
            response = await client.post(path, content=orjson.dumps(body), headers=headers)
            assert response.status_code == 200
            assert response.content == stream  # relayed as it came
    (record,) = store.records  # the queue is flushed when the app stops
    return record


MESSAGES = {
    "model": "claude-sonnet-4-5",
    "max_tokens": 64,
    "stream": True,
    "messages": [{"role": "user", "content": "Hi"}],
}
RESPONSES = {"model": "gpt-4o", "stream": True, "input": [{"role": "user", "content": "Hi"}]}

Check = Callable[[Any], None]


@pytest.mark.anyio
async def test_an_anthropic_stream_ending_in_an_error_event_is_an_upstream_error(
    tmp_path: Path,
) -> None:
    record = await relay(tmp_path, "/v1/messages", ANTHROPIC_OVERLOADED, MESSAGES)
    assert record.outcome == "upstream_error"
    assert (record.prompt_tokens, record.completion_tokens) == (40, 1)  # what it reported


@pytest.mark.anyio
@pytest.mark.parametrize("stream", [RESPONSES_FAILED, RESPONSES_ERROR_EVENT])
async def test_a_responses_stream_that_fails_is_an_upstream_error(
    tmp_path: Path, stream: bytes
) -> None:
    record = await relay(tmp_path, "/v1/responses", stream, RESPONSES)
    assert record.outcome == "upstream_error"
    if stream is RESPONSES_FAILED:
        assert (record.prompt_tokens, record.completion_tokens) == (30, 2)


@pytest.mark.anyio
async def test_a_responses_stream_that_completes_is_completed(tmp_path: Path) -> None:
    record = await relay(tmp_path, "/v1/responses", RESPONSES_COMPLETED, RESPONSES)
    assert record.outcome == "completed"
    assert record.prompt_tokens == 30
