"""A fake OpenAI-compatible upstream (a Starlette app) for ASGI and end-to-end tests.

It records every request (raw bytes and headers), answers chat completions in JSON or SSE with
usage, can be told to fail in specific ways, and can pace a stream on events so tests observe
incremental delivery and disconnects without sleeping.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route


@dataclass
class Recorded:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body)


@dataclass
class Pacing:
    """Hold a stream after its first chunk until `release` is set; `closed` is set when the
    upstream's generator ends for any reason (completion or the proxy hanging up)."""

    release: threading.Event = field(default_factory=threading.Event)
    first_sent: threading.Event = field(default_factory=threading.Event)
    closed: threading.Event = field(default_factory=threading.Event)


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
def _o200k() -> Any:
    """o200k_base through the project's offline loader (tiktoken must never download here)."""
    from inflight.tokens.encodings import load_encodings

    encoding = load_encodings().get("o200k_base")
    assert encoding is not None, "o200k_base unavailable offline"
    return encoding


def reference_tokens(messages: list[dict[str, Any]]) -> int:
    """The fake's own prompt count: o200k over every text field, cookbook overheads."""
    enc = _o200k()
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


class FakeUpstream:
    """Configurable fake; `app` is the ASGI app to serve or mount on a transport."""

    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        self.reply_text = "Hello there"
        self.tool_calls: list[dict[str, Any]] | None = None
        self.prompt_tokens = 11
        self.error: tuple[int, bytes, dict[str, str]] | None = None
        self.pacing: Pacing | None = None
        self.break_stream_after_first = False
        self.linger_after_done = 0.0  # seconds the stream stays open after `data: [DONE]`
        self.context_window: int | None = None
        self.advertised_window: int | None = None  # what /v1/models says (default: the real one)
        self.enforce_pairs = False
        self.require_alternation = False
        self.rejected: list[str] = []
        self.max_prompt_seen = 0
        self.summary_calls = 0
        self.summary_reply: str | None = None
        self.summary_failure: str | None = None  # "status", "garbage", "empty", "stall", "slow"
        self.summary_pause = 0.3
        self.summary_requests: list[dict[str, Any]] = []
        self.unstall = threading.Event()
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/{path:path}", self._echo, methods=["GET", "POST", "PUT", "DELETE"]),
            ]
        )

    @property
    def chat_requests(self) -> list[Recorded]:
        return [r for r in self.requests if r.path.endswith("/chat/completions")]

    async def _record(self, request: Request) -> Recorded:
        rec = Recorded(
            request.method,
            request.url.path,
            request.url.query,
            {k.lower(): v for k, v in request.headers.items()},
            await request.body(),
        )
        self.requests.append(rec)
        return rec

    async def _echo(self, request: Request) -> Response:
        rec = await self._record(request)
        if rec.path == "/v1/models":
            entry: dict[str, Any] = {"id": "fake-model"}
            advertised = self.advertised_window or self.context_window
            if advertised is not None:
                entry["max_model_len"] = advertised
            return JSONResponse({"object": "list", "data": [entry]})
        return JSONResponse(
            {"method": rec.method, "path": rec.path, "query": rec.query, "size": len(rec.body)},
            headers={"x-upstream": "yes", "set-cookie": "a=1"},
        )

    async def _chat(self, request: Request) -> Response:
        rec = await self._record(request)
        if self.error is not None:
            status, body, headers = self.error
            return Response(
                body, status_code=status, headers=headers, media_type="application/json"
            )
        body = rec.json()
        model = body.get("model", "fake")
        problem = self._validate(body)
        if problem is not None:
            self.rejected.append(problem)
            return JSONResponse(
                {"error": {"message": problem, "type": "invalid_request_error", "code": None}},
                status_code=400,
            )
        if self.is_summary_request(body):
            self.summary_calls += 1
            self.summary_requests.append(body)
            if self.summary_failure == "status":
                return JSONResponse({"error": {"message": "boom"}}, status_code=500)
            if self.summary_failure == "garbage":
                return Response(b"<html>not json", media_type="text/html")
            if self.summary_failure == "empty":
                return JSONResponse(completion(model, "   ", 10))
            if self.summary_failure == "slow":  # each call answers, but takes a while
                await anyio.sleep(self.summary_pause)
            if self.summary_failure == "stall":
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline and not self.unstall.is_set():  # noqa: ASYNC110
                    await anyio.sleep(0.01)
            reply = self.summary_reply or f"summary #{self.summary_calls}: facts kept"
            return JSONResponse(completion(model, reply, 50))
        extra: dict[str, Any] = {}
        if self.tool_calls is not None:
            extra["tool_calls"] = self.tool_calls
        if not body.get("stream"):
            return JSONResponse(completion(model, self.reply_text, self.prompt_tokens, **extra))
        include_usage = (body.get("stream_options") or {}).get("include_usage") is True
        hold = body.get("x_test_hold") is True  # an unknown field: forwarded untouched
        return StreamingResponse(
            self._stream(model, include_usage, extra, hold), media_type="text/event-stream"
        )

    @staticmethod
    def is_summary_request(body: dict[str, Any]) -> bool:
        messages = body.get("messages") or []
        return bool(messages) and "<transcript>" in str(messages[-1].get("content", ""))

    def _validate(self, body: dict[str, Any]) -> str | None:
        """Reject what OpenAI and strict chat templates reject, and prompts over the window."""
        from inflight.compaction.units import check_pair_safety, is_strict_alternation

        messages = body.get("messages") or []
        if self.enforce_pairs:
            problems = check_pair_safety(messages)
            if problems:
                return "invalid tool message order: " + problems[0]
        if (
            self.require_alternation
            and not self.is_summary_request(body)
            and not is_strict_alternation(messages)
        ):
            return "Conversation roles must alternate user/assistant/user/assistant/..."
        if self.context_window is not None:
            prompt = reference_tokens(messages)
            self.max_prompt_seen = max(self.max_prompt_seen, prompt)
            reserve = body.get("max_tokens") or body.get("max_completion_tokens") or 0
            if prompt + reserve > self.context_window:
                return (
                    f"This model's maximum context length is {self.context_window} tokens. "
                    f"However, your messages resulted in {prompt} tokens."
                )
        return None

    async def _stream(
        self, model: str, include_usage: bool, extra: dict[str, Any], hold: bool = False
    ) -> AsyncIterator[bytes]:
        pacing = self.pacing
        try:
            words = self.reply_text.split(" ")
            for i, word in enumerate(words):
                delta: dict[str, Any] = {"content": (" " if i else "") + word}
                if i == 0:
                    delta["role"] = "assistant"
                chunk = {
                    "id": "chatcmpl-fake",
                    "object": "chat.completion.chunk",
                    "created": 1,
                    "model": model,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
                }
                if include_usage:
                    chunk["usage"] = None
                yield sse(chunk)
                if i == 0 and hold:  # until the proxy hangs up (cancels us), bounded
                    deadline = time.monotonic() + 10
                    while time.monotonic() < deadline:  # noqa: ASYNC110
                        await anyio.sleep(0.01)
                if i == 0:
                    if self.break_stream_after_first:
                        raise RuntimeError("upstream broke mid-stream")
                    if pacing is not None:
                        pacing.first_sent.set()
                        deadline = time.monotonic() + 20
                        # `release` is set from the test's thread: poll it, bounded.
                        while not pacing.release.is_set() and time.monotonic() < deadline:  # noqa: ASYNC110
                            await anyio.sleep(0.005)
            if extra.get("tool_calls"):
                calls = [{"index": n, **call} for n, call in enumerate(extra["tool_calls"])]
                yield sse(
                    {
                        "id": "chatcmpl-fake",
                        "object": "chat.completion.chunk",
                        "created": 1,
                        "model": model,
                        "choices": [
                            {"index": 0, "delta": {"tool_calls": calls}, "finish_reason": None}
                        ],
                    }
                )
            yield sse(
                {
                    "id": "chatcmpl-fake",
                    "object": "chat.completion.chunk",
                    "created": 1,
                    "model": model,
                    "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                }
            )
            if include_usage:
                yield sse(
                    {
                        "id": "chatcmpl-fake",
                        "object": "chat.completion.chunk",
                        "created": 1,
                        "model": model,
                        "choices": [],
                        "usage": {
                            "prompt_tokens": self.prompt_tokens,
                            "completion_tokens": len(words),
                            "total_tokens": self.prompt_tokens + len(words),
                        },
                    }
                )
            yield b"data: [DONE]\n\n"
            if self.linger_after_done:  # like servers that close the stream a while later
                await anyio.sleep(self.linger_after_done)
        finally:
            if pacing is not None:
                pacing.closed.set()
