"""The fake's OpenAI Responses API (`POST /v1/responses`): what OpenAI enforces on `input` —
every `function_call_output` names a `function_call` of the request, every call has its output,
a reasoning item is followed by the item it preceded — the overflow error in OpenAI's phrasing
(which states no number) or vLLM's (which states both), and answers as a `response` object or
the Responses event stream, usage in the body and in `response.completed`. Summaries of a
Responses conversation go through chat completions."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

import orjson
from starlette.responses import JSONResponse, Response, StreamingResponse

from tests.support.fakes.chat import o200k

if TYPE_CHECKING:
    from tests.support.fakes.upstream import FakeUpstream

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
    enc = o200k()
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


def event(kind: str, sequence: int, **fields: Any) -> bytes:
    """One Responses stream event (`event:` line, then its data with its sequence number)."""
    data = {"type": kind, "sequence_number": sequence, **fields}
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def _rejection(message: str, code: str | None) -> JSONResponse:
    error = {"message": message, "type": "invalid_request_error", "param": "input", "code": code}
    return JSONResponse({"error": error}, status_code=400)


async def _failed_stream() -> AsyncIterator[bytes]:
    started = {"id": "resp_fake", "object": "response", "status": "in_progress", "usage": None}
    error = {"type": "invalid_request_error", "code": "context_length_exceeded",
             "message": OPENAI_OVERFLOW, "param": "input"}  # fmt: skip
    yield event("response.created", 0, response=started)
    yield event("response.in_progress", 1, response=started)
    yield event("error", 2, error=error)


class ResponsesApi:
    """`POST /v1/responses`."""

    reply = "Hello there"

    def is_summary(self, body: Any) -> bool:
        return False

    def problem(self, fake: FakeUpstream, body: Any, summary: bool) -> str | None:
        raw = body.get("input")
        return pairing_problem(raw) if isinstance(raw, list) else None

    def prompt(self, body: Any) -> int:
        return input_tokens(body)

    def reserve(self, body: Any) -> int:
        return int(body.get("max_output_tokens") or 0)

    def refuse(self, message: str) -> Response:
        return _rejection(message, None)

    def overflow(self, fake: FakeUpstream, body: Any, prompt: int) -> tuple[str, Response]:
        if fake.overflow_in_stream and body.get("stream") is True:
            return OPENAI_OVERFLOW, StreamingResponse(
                _failed_stream(), media_type="text/event-stream"
            )
        if fake.overflow_style == "openai":
            return OPENAI_OVERFLOW, _rejection(OPENAI_OVERFLOW, "context_length_exceeded")
        message = (
            f"This model's maximum context length is {fake.context_window} tokens. "
            f"However, your request has {prompt} input tokens."
        )
        return message, _rejection(message, None)

    def usage_prompt(self, fake: FakeUpstream, body: Any, summary: bool) -> int:
        return self.prompt(body) if fake.prompt_tokens is None else fake.prompt_tokens

    def summary_text(self, calls: int) -> str:
        return f"summary #{calls}: facts kept"

    def answer(self, fake: FakeUpstream, body: Any, text: str, prompt: int) -> dict[str, Any]:
        words = text.split(" ")
        output: list[dict[str, Any]]
        if fake.function_calls is not None:
            output = [
                {"type": "function_call", "status": "completed", **c} for c in fake.function_calls
            ]
        else:
            part = {"type": "output_text", "text": text, "annotations": []}
            output = [
                {"type": "message", "id": "msg_fake", "status": "completed", "role": "assistant",
                 "content": [part]}
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
                "input_tokens": prompt,
                "input_tokens_details": {"cached_tokens": fake.cached_tokens},
                "output_tokens": len(words),
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": prompt + len(words),
            },
        }

    async def stream(
        self, fake: FakeUpstream, body: Any, answer: dict[str, Any]
    ) -> AsyncIterator[bytes]:
        started = {**answer, "status": "in_progress", "output": [], "usage": None}
        yield event("response.created", 0, response=started)
        yield event("response.in_progress", 1, response=started)
        seq = 2
        for index, item in enumerate(answer["output"]):
            yield event("response.output_item.added", seq, output_index=index, item=item)
            seq += 1
            if index == 0 and item["type"] == "message":
                for i, word in enumerate(item["content"][0]["text"].split(" ")):
                    yield event(
                        "response.output_text.delta", seq, item_id=item["id"], output_index=0,
                        content_index=0, delta=(" " if i else "") + word, logprobs=[],
                    )  # fmt: skip
                    seq += 1
                    if i == 0:
                        await fake.after_first_chunk(body)
            yield event("response.output_item.done", seq, output_index=index, item=item)
            seq += 1
        yield event("response.completed", seq, response=answer)


API = ResponsesApi()
