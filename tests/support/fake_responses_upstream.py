"""A fake upstream that also speaks OpenAI's Responses API (`POST /v1/responses`), for ASGI and
end-to-end tests of the Responses route.

It enforces what OpenAI enforces on `input` — every `function_call_output` names a
`function_call` of the request, every call has its output, a reasoning item is followed by the
item it preceded — and a context window, with the Responses API's own overflow error (which
states no number) or vLLM's (which states both). It answers in JSON or as the Responses event
stream, with usage in the body and in `response.completed`; chat completions (the summaries)
and `/v1/models` are the chat fake's.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from typing import Any, Literal

import anyio
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.support.fake_upstream import FakeUpstream, _o200k

OPENAI_OVERFLOW = (
    "Your input exceeds the context window of this model. Please adjust your input and try again."
)
CALL_TYPES = {
    "function_call": "function_call_output",
    "custom_tool_call": "custom_tool_call_output",
    "computer_call": "computer_call_output",
}


def _texts(value: Any) -> Iterator[str]:
    """The strings an item puts in the prompt (ids, types, statuses and encrypted parts aside)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            stack.extend(
                v
                for k, v in item.items()
                if k not in ("id", "type", "status", "call_id", "encrypted_content", "image_url")
            )
        elif isinstance(item, list):
            stack.extend(item)


def input_tokens(body: dict[str, Any]) -> int:
    """The fake's own count of a Responses prompt: o200k over the text, 4 tokens an item."""
    enc = _o200k()
    raw = body.get("input")
    items = [{"role": "user", "content": raw}] if isinstance(raw, str) else raw or []
    total = 3 + sum(len(enc.encode_ordinary(t)) for t in _texts(body.get("instructions")))
    for item in items:
        total += 4 + sum(len(enc.encode_ordinary(t)) for t in _texts(item))
    return total


def pairing_problem(items: list[Any]) -> str | None:
    """What OpenAI answers 400 for in `input` (ids looked up across the request, as it does)."""
    calls = {(i.get("type"), i.get("call_id")) for i in items if i.get("type") in CALL_TYPES}
    answered = {
        (t, i.get("call_id"))
        for i in items
        for t, out in CALL_TYPES.items()
        if i.get("type") == out
    }
    for k, item in enumerate(items):
        kind = item.get("type")
        for call, out in CALL_TYPES.items():
            if kind == out and (call, item.get("call_id")) not in calls:
                return f"No tool call found for function call output with call_id {item.get('call_id')}."
            if kind == call and (call, item.get("call_id")) not in answered:
                return f"No tool output found for function call {item.get('call_id')}."
        if kind == "reasoning":
            following = items[k + 1] if k + 1 < len(items) else {}
            if (
                following.get("type") not in (*CALL_TYPES, "message")
                and following.get("role") != "assistant"
            ):
                return (
                    f"Item '{item.get('id')}' of type 'reasoning' was provided without its "
                    "required following item."
                )
    return None


def _event(kind: str, sequence: int, **fields: Any) -> bytes:
    data = {"type": kind, "sequence_number": sequence, **fields}
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


class FakeResponsesUpstream(FakeUpstream):
    """The chat fake plus `POST /v1/responses`."""

    def __init__(self) -> None:
        super().__init__()
        self.overflow_style: Literal["openai", "vllm"] = "openai"
        self.input_tokens: int | None = None  # what usage reports (default: the fake's count)
        self.cached_tokens = 0
        self.function_calls: list[dict[str, Any]] | None = None  # output these calls instead
        # A stream over the window starts (200, `response.created`) and then fails with an
        # `error` event, as OpenAI's does; else the overflow is a 400 before any byte.
        self.overflow_in_stream = False
        self.app = Starlette(
            routes=[Route("/v1/responses", self._responses, methods=["POST"]), *self.app.routes]
        )

    @property
    def responses_requests(self) -> list[Any]:
        return [r for r in self.requests if r.path == "/v1/responses"]

    def _reject(self, message: str, code: str | None) -> JSONResponse:
        self.rejected.append(message)
        error = {
            "message": message,
            "type": "invalid_request_error",
            "param": "input",
            "code": code,
        }
        return JSONResponse({"error": error}, status_code=400)

    async def _responses(self, request: Request) -> Response:
        rec = await self._record(request)
        if self.error is not None:
            status, content, headers = self.error
            return Response(content, status, headers=headers, media_type="application/json")
        body = rec.json()
        raw = body.get("input")
        problem = pairing_problem(raw) if isinstance(raw, list) else None
        if problem is not None:
            return self._reject(problem, None)
        prompt = input_tokens(body)
        self.max_prompt_seen = max(self.max_prompt_seen, prompt)
        reserve = body.get("max_output_tokens") or 0
        if self.context_window is not None and prompt + reserve > self.context_window:
            if self.overflow_in_stream and body.get("stream") is True:
                self.rejected.append(OPENAI_OVERFLOW)
                return StreamingResponse(self._failed_stream(), media_type="text/event-stream")
            if self.overflow_style == "openai":
                return self._reject(OPENAI_OVERFLOW, "context_length_exceeded")
            return self._reject(
                f"This model's maximum context length is {self.context_window} tokens. "
                f"However, your request has {prompt} input tokens.",
                None,
            )
        response = self._response(body, prompt)
        if body.get("stream") is not True:
            return JSONResponse(response)
        return StreamingResponse(self._stream(response), media_type="text/event-stream")

    def _response(self, body: dict[str, Any], prompt: int) -> dict[str, Any]:
        words = self.reply_text.split(" ")
        used = self.input_tokens if self.input_tokens is not None else prompt
        output: list[dict[str, Any]]
        if self.function_calls is not None:
            output = [
                {"type": "function_call", "status": "completed", **c} for c in self.function_calls
            ]
        else:
            text = {"type": "output_text", "text": self.reply_text, "annotations": []}
            output = [
                {"type": "message", "id": "msg_fake", "status": "completed", "role": "assistant",
                 "content": [text]}
            ]  # fmt: skip
        return {
            "id": "resp_fake",
            "object": "response",
            "created_at": 1,
            "status": "completed",
            "model": body.get("model", "fake"),
            "output": output,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "usage": {
                "input_tokens": used,
                "input_tokens_details": {"cached_tokens": self.cached_tokens},
                "output_tokens": len(words),
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": used + len(words),
            },
        }

    async def _failed_stream(self) -> AsyncIterator[bytes]:
        started = {"id": "resp_fake", "object": "response", "status": "in_progress", "usage": None}
        error = {"type": "invalid_request_error", "code": "context_length_exceeded",
                 "message": OPENAI_OVERFLOW, "param": "input"}  # fmt: skip
        yield _event("response.created", 0, response=started)
        yield _event("response.in_progress", 1, response=started)
        yield _event("error", 2, error=error)

    async def _stream(self, response: dict[str, Any]) -> AsyncIterator[bytes]:
        pacing = self.pacing
        started = {**response, "status": "in_progress", "output": [], "usage": None}
        try:
            yield _event("response.created", 0, response=started)
            yield _event("response.in_progress", 1, response=started)
            seq = 2
            for index, item in enumerate(response["output"]):
                yield _event("response.output_item.added", seq, output_index=index, item=item)
                seq += 1
                for i, word in enumerate(self.reply_text.split(" ") if index == 0 else []):
                    if item["type"] != "message":
                        break
                    yield _event(
                        "response.output_text.delta", seq, item_id=item["id"], output_index=0,
                        content_index=0, delta=(" " if i else "") + word, logprobs=[],
                    )  # fmt: skip
                    seq += 1
                    if i == 0 and pacing is not None:
                        pacing.first_sent.set()
                        deadline = time.monotonic() + 20
                        # `release` is set from the test's thread: poll it, bounded.
                        while not pacing.release.is_set() and time.monotonic() < deadline:  # noqa: ASYNC110
                            await anyio.sleep(0.005)
                yield _event("response.output_item.done", seq, output_index=index, item=item)
                seq += 1
            yield _event("response.completed", seq, response=response)
        finally:
            if pacing is not None:
                pacing.closed.set()
