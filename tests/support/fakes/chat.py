"""The fake's chat completions: the prompt counted with o200k and the cookbook's overheads, tool
pairing and role alternation checked when asked, OpenAI's/vLLM's overflow phrasing, answers as
`chat.completion` JSON or `chat.completion.chunk` events ending in `data: [DONE]`."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import orjson
from starlette.responses import JSONResponse, Response

if TYPE_CHECKING:
    from tests.support.fakes.upstream import FakeUpstream

USAGE_PROMPT = 11  # what usage states unless told (`prompt_tokens`): the tests check it
SUMMARY_USAGE_PROMPT = 50


def completion(model: str, text: str, prompt_tokens: int, **extra: Any) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    message.update(extra)
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 1,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": 2,
            "total_tokens": prompt_tokens + 2,
            "prompt_tokens_details": {"cached_tokens": 0},
        },
    }


@functools.cache
def o200k() -> Any:
    """o200k_base through the project's offline loader (tiktoken must never download here)."""
    from inflight.tokens.encodings import load_encodings

    encoding = load_encodings().get("o200k_base")
    assert encoding is not None, "o200k_base unavailable offline"
    return encoding


def reference_tokens(messages: list[dict[str, Any]]) -> int:
    """The fake's own prompt count: o200k over every text field, cookbook overheads."""
    enc = o200k()
    total = 3
    for m in messages:
        total += 3 + len(enc.encode_ordinary(str(m.get("role", ""))))
        content = m.get("content")
        if isinstance(content, str):
            total += len(enc.encode_ordinary(content))
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    total += len(enc.encode_ordinary(part["text"]))
                else:
                    total += 85
        for call in m.get("tool_calls") or []:
            total += 7 + len(enc.encode_ordinary(call["function"]["name"]))
            total += len(enc.encode_ordinary(call["function"]["arguments"]))
        if m.get("tool_call_id"):
            total += len(enc.encode_ordinary(str(m["tool_call_id"])))
    return total


def sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def _chunk(model: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": model,
        "choices": choices,
    }


class ChatApi:
    """`POST /v1/chat/completions`."""

    reply = "Hello there"

    def is_summary(self, body: Any) -> bool:
        messages = body.get("messages") or []
        return bool(messages) and "<transcript>" in str(messages[-1].get("content", ""))

    def problem(self, fake: FakeUpstream, body: Any, summary: bool) -> str | None:
        """What OpenAI and strict chat templates reject, when the fake is told to."""
        from inflight.compaction.units import check_pair_safety, is_strict_alternation

        messages = body.get("messages") or []
        if fake.enforce_pairs:
            problems = check_pair_safety(messages)
            if problems:
                return "invalid tool message order: " + problems[0]
        if fake.require_alternation and not summary and not is_strict_alternation(messages):
            return "Conversation roles must alternate user/assistant/user/assistant/..."
        return None

    def prompt(self, body: Any) -> int:
        return reference_tokens(body.get("messages") or [])

    def reserve(self, body: Any) -> int:
        return int(body.get("max_tokens") or body.get("max_completion_tokens") or 0)

    def refuse(self, message: str) -> Response:
        error = {"message": message, "type": "invalid_request_error", "code": None}
        return JSONResponse({"error": error}, status_code=400)

    def overflow(self, fake: FakeUpstream, body: Any, prompt: int) -> tuple[str, Response]:
        message = (
            f"This model's maximum context length is {fake.context_window} tokens. "
            f"However, your messages resulted in {prompt} tokens."
        )
        return message, self.refuse(message)

    def usage_prompt(self, fake: FakeUpstream, body: Any, summary: bool) -> int:
        if summary:
            return SUMMARY_USAGE_PROMPT
        return USAGE_PROMPT if fake.prompt_tokens is None else fake.prompt_tokens

    def summary_text(self, calls: int) -> str:
        return f"summary #{calls}: facts kept"

    def answer(self, fake: FakeUpstream, body: Any, text: str, prompt: int) -> dict[str, Any]:
        extra: dict[str, Any] = {}
        if fake.tool_calls is not None:
            extra["tool_calls"] = fake.tool_calls
        answer = completion(body.get("model", "fake"), text, prompt, **extra)
        answer["usage"]["prompt_tokens_details"]["cached_tokens"] = fake.cached_tokens
        return answer

    async def stream(
        self, fake: FakeUpstream, body: Any, answer: dict[str, Any]
    ) -> AsyncIterator[bytes]:
        model = answer["model"]
        message = answer["choices"][0]["message"]
        include_usage = (body.get("stream_options") or {}).get("include_usage") is True
        words = message["content"].split(" ")
        for i, word in enumerate(words):
            delta: dict[str, Any] = {"content": (" " if i else "") + word}
            if i == 0:
                delta["role"] = "assistant"
            chunk = _chunk(model, [{"index": 0, "delta": delta, "finish_reason": None}])
            if include_usage:
                chunk["usage"] = None
            yield sse(chunk)
            if i == 0:
                await fake.after_first_chunk(body)
        if message.get("tool_calls"):
            calls = [{"index": n, **call} for n, call in enumerate(message["tool_calls"])]
            delta = {"tool_calls": calls}
            yield sse(_chunk(model, [{"index": 0, "delta": delta, "finish_reason": None}]))
        yield sse(_chunk(model, [{"index": 0, "delta": {}, "finish_reason": "stop"}]))
        if include_usage:
            prompt = answer["usage"]["prompt_tokens"]
            usage = {
                "prompt_tokens": prompt,
                "completion_tokens": len(words),
                "total_tokens": prompt + len(words),
            }
            yield sse({**_chunk(model, []), "usage": usage})
        yield b"data: [DONE]\n\n"


API = ChatApi()
