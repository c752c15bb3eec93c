"""A scripted upstream for the restore loop: each request gets the next scripted reply — text,
or tool calls (`inflight_restore` with a ref read from the request's markers, or any other
tool) — in JSON or as an SSE stream, with usage, as chat completions (`/v1/chat/completions`)
or Anthropic Messages (`/v1/messages`); every request body is recorded. A reply may instead
fail: an error status, or (through `transport()`) a refused connection, a timeout, or a body
that breaks halfway."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Literal

import httpx
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from inflight.compaction.refs import REF_SUFFIX_RE

FIRST_REF = "<first ref>"  # a restore call's ref: the first one in the request's messages


@dataclass(frozen=True)
class Call:
    name: str
    ref: str | None = None  # for inflight_restore: a ref, or FIRST_REF
    arguments: str = "{}"  # for any other tool


Fail = Literal["status", "connect", "timeout", "broken"]


@dataclass(frozen=True)
class Reply:
    text: str | None = None
    calls: tuple[Call, ...] = ()
    fail: Fail | None = None  # status: a 429 error body; the others: see `transport()`


def sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


class ScriptedUpstream:
    """`app` answers `/v1/chat/completions` with `replies` in order (the last one repeats)."""

    def __init__(self, replies: list[Reply]) -> None:
        self.replies = replies
        self.bodies: list[dict[str, Any]] = []
        self.raw: list[bytes] = []
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/messages", self._messages, methods=["POST"]),
                Route("/v1/responses", self._responses, methods=["POST"]),
            ]
        )

    def transport(self) -> httpx.AsyncBaseTransport:
        """The app behind an httpx transport that also fails as the scripted replies say."""
        return _FailingTransport(self)

    def reply_for(self, k: int) -> Reply:
        return self.replies[min(k, len(self.replies) - 1)]

    async def _next(self, request: Request) -> tuple[dict[str, Any], int, Reply]:
        """The request's body (recorded), its number, and the reply scripted for it."""
        raw = await request.body()
        self.raw.append(raw)
        body = orjson.loads(raw)
        k = len(self.bodies)
        self.bodies.append(body)
        return body, k, self.reply_for(k)

    @staticmethod
    def refused(reply: Reply) -> Response | None:
        """The error response a reply scripted to fail with a status gets."""
        if reply.fail != "status":
            return None
        error = {"type": "rate_limit_error", "message": "slow down"}
        return JSONResponse({"type": "error", "error": error}, status_code=429)

    def usage(self, k: int) -> dict[str, Any]:
        return {
            "prompt_tokens": 1000 + k,
            "completion_tokens": 10 + k,
            "total_tokens": 1010 + 2 * k,
        }

    async def _responses(self, request: Request) -> Response:
        """The Responses API's shape; like OpenAI's, each response object echoes `tools`."""
        body, k, reply = await self._next(request)
        if (refused := self.refused(reply)) is not None:
            return refused
        output: list[dict[str, Any]] = [{"type": "reasoning", "id": f"rs_{k}", "summary": []}]
        if reply.text:
            text = {"type": "output_text", "text": reply.text, "annotations": []}
            output.append({"type": "message", "id": f"msg_{k}", "role": "assistant",
                           "status": "completed", "content": [text]})  # fmt: skip
        for call in self._calls(reply, body, k):
            function = call["function"]
            output.append({"type": "function_call", "id": f"fc_{call['id']}", "status": "completed",
                           "call_id": call["id"], "name": function["name"],
                           "arguments": function["arguments"]})  # fmt: skip
        usage = {"input_tokens": 1000 + k, "input_tokens_details": {"cached_tokens": 0},
                 "output_tokens": 10 + k, "total_tokens": 1010 + 2 * k}  # fmt: skip
        response = {"id": f"resp_{k}", "object": "response", "status": "completed",
                    "model": body.get("model"), "output": output,
                    "tools": body.get("tools") or [], "usage": usage}  # fmt: skip
        if not body.get("stream"):
            return JSONResponse(response)
        return StreamingResponse(self._response_events(response), media_type="text/event-stream")

    async def _response_events(self, response: dict[str, Any]) -> AsyncIterator[bytes]:
        """The events OpenAI sends (the openai SDK's stream accumulator checks them): each
        output item added empty, its text or arguments in deltas, then done whole."""
        sequence = iter(range(1_000_000))

        def event(kind: str, **fields: Any) -> bytes:
            data = orjson.dumps({"type": kind, "sequence_number": next(sequence), **fields})
            return b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"

        started = {**response, "status": "in_progress", "output": [], "usage": None}
        yield event("response.created", response=started)
        for index, item in enumerate(response["output"]):
            at = {"output_index": index, "item_id": item["id"]}
            if item["type"] == "message":
                yield event("response.output_item.added", output_index=index,
                            item={**item, "status": "in_progress", "content": []})  # fmt: skip
                for n, part in enumerate(item["content"]):
                    empty = {**part, "text": ""}
                    yield event("response.content_part.added", **at, content_index=n, part=empty)
                    text = part["text"]
                    for cut in range(0, len(text), 8):
                        yield event("response.output_text.delta", **at, content_index=n,
                                    delta=text[cut : cut + 8], logprobs=[])  # fmt: skip
                    yield event("response.output_text.done", **at, content_index=n,
                                text=part["text"], logprobs=[])  # fmt: skip
                    yield event("response.content_part.done", **at, content_index=n, part=part)
            elif item["type"] == "function_call":
                yield event("response.output_item.added", output_index=index,
                            item={**item, "status": "in_progress", "arguments": ""})  # fmt: skip
                arguments = item["arguments"]
                for cut in range(0, len(arguments), 7):
                    yield event("response.function_call_arguments.delta", **at,
                                delta=arguments[cut : cut + 7])  # fmt: skip
                yield event("response.function_call_arguments.done", **at, arguments=arguments)
            else:
                yield event("response.output_item.added", output_index=index, item=item)
            yield event("response.output_item.done", output_index=index, item=item)
        yield event("response.completed", response=response)

    def anthropic_usage(self, k: int) -> dict[str, Any]:
        return {"input_tokens": 1000 + k, "output_tokens": 10 + k}

    async def _messages(self, request: Request) -> Response:
        body, k, reply = await self._next(request)
        if (refused := self.refused(reply)) is not None:
            return refused
        blocks: list[dict[str, Any]] = [{"type": "text", "text": reply.text}] if reply.text else []
        for call in self._calls(reply, body, k):
            function = call["function"]
            arguments = orjson.loads(function["arguments"])
            blocks.append(
                {"type": "tool_use", "id": call["id"], "name": function["name"], "input": arguments}
            )
        message = {
            "id": f"msg_{k}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model"),
            "content": blocks,
            "stop_reason": "tool_use" if reply.calls else "end_turn",
            "usage": self.anthropic_usage(k),
        }
        if body.get("stream"):
            return StreamingResponse(self._events(message), media_type="text/event-stream")
        return JSONResponse(message)

    async def _events(self, message: dict[str, Any]) -> AsyncIterator[bytes]:
        def event(name: str, data: dict[str, Any]) -> bytes:
            return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"

        usage = message["usage"]
        start = {**message, "content": [], "usage": {**usage, "output_tokens": 1}}
        yield event("message_start", {"type": "message_start", "message": start})
        for index, block in enumerate(message["content"]):
            empty = {**block, "text": ""} if block["type"] == "text" else {**block, "input": {}}
            yield event(
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": empty},
            )
            if block["type"] == "text":
                delta = {"type": "text_delta", "text": block["text"]}
            else:
                delta = {
                    "type": "input_json_delta",
                    "partial_json": orjson.dumps(block["input"]).decode(),
                }
            yield event(
                "content_block_delta",
                {"type": "content_block_delta", "index": index, "delta": delta},
            )
            yield event("content_block_stop", {"type": "content_block_stop", "index": index})
        done = {"stop_reason": message["stop_reason"]}
        yield event("message_delta", {"type": "message_delta", "delta": done,
                                      "usage": {"output_tokens": usage["output_tokens"]}})  # fmt: skip
        yield event("message_stop", {"type": "message_stop"})

    def _calls(self, reply: Reply, body: dict[str, Any], k: int) -> list[dict[str, Any]]:
        out = []
        for n, call in enumerate(reply.calls):
            arguments = call.arguments
            if call.ref is not None:
                ref = call.ref
                if ref == FIRST_REF:
                    history = body.get("messages", body.get("input"))
                    found = REF_SUFFIX_RE.search(orjson.dumps(history).decode())
                    ref = found.group(1) if found else "none"
                arguments = orjson.dumps({"ref": ref}).decode()
            function = {"name": call.name, "arguments": arguments}
            out.append({"id": f"call_{k}_{n}", "type": "function", "function": function})
        return out

    async def _chat(self, request: Request) -> Response:
        body, k, reply = await self._next(request)
        if (refused := self.refused(reply)) is not None:
            return refused
        calls = self._calls(reply, body, k)
        if body.get("stream"):
            usage = (body.get("stream_options") or {}).get("include_usage") is True
            return StreamingResponse(
                self._stream(reply.text, calls, k, usage), media_type="text/event-stream"
            )
        message: dict[str, Any] = {"role": "assistant", "content": reply.text}
        if calls:
            message["tool_calls"] = calls
        finish = "tool_calls" if calls else "stop"
        return JSONResponse(
            {
                "id": f"chatcmpl-{k}",
                "object": "chat.completion",
                "model": body.get("model"),
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": self.usage(k),
            }
        )

    async def _stream(
        self, text: str | None, calls: list[dict[str, Any]], k: int, usage: bool
    ) -> AsyncIterator[bytes]:
        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
            return sse(
                {"id": f"chatcmpl-{k}", "object": "chat.completion.chunk", "choices": [choice]}
            )

        yield chunk({"role": "assistant", "content": ""})  # says nothing yet about the kind
        for word in (text or "").split(" ") if text else ():
            yield chunk({"content": word + " "})
        for n, call in enumerate(calls):
            function = call["function"]
            first = {"index": n, "id": call["id"], "type": "function"}
            yield chunk({"tool_calls": [{**first, "function": {"name": function["name"]}}]})
            arguments = function["arguments"]
            for at in range(0, len(arguments), 7):  # arguments arrive in pieces
                piece = {"index": n, "function": {"arguments": arguments[at : at + 7]}}
                yield chunk({"tool_calls": [piece]})
        yield chunk({}, "tool_calls" if calls else "stop")
        if usage:
            yield sse({"id": f"chatcmpl-{k}", "object": "chat.completion.chunk", "choices": [],
                       "usage": self.usage(k)})  # fmt: skip
        yield b"data: [DONE]\n\n"


class _FailingTransport(httpx.AsyncBaseTransport):
    """`ScriptedUpstream.app` over ASGI; a request whose reply is scripted to fail with
    `connect` or `timeout` raises that httpx error, one with `broken` gets the first half of
    its body and then a broken connection."""

    def __init__(self, upstream: ScriptedUpstream) -> None:
        self.upstream = upstream
        self.asgi = httpx.ASGITransport(app=upstream.app)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        fail = self.upstream.reply_for(len(self.upstream.bodies)).fail
        if fail == "connect":
            self.upstream.bodies.append(orjson.loads(request.content))
            raise httpx.ConnectError("connection refused", request=request)
        if fail == "timeout":
            self.upstream.bodies.append(orjson.loads(request.content))
            raise httpx.ReadTimeout("read timed out", request=request)
        response = await self.asgi.handle_async_request(request)
        if fail != "broken":
            return response
        whole = b"".join([chunk async for chunk in response.aiter_raw()])
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=_Broken(whole[: len(whole) // 2], request),
            request=request,
        )


class _Broken(httpx.AsyncByteStream):
    def __init__(self, head: bytes, request: httpx.Request) -> None:
        self.head = head
        self.request = request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self.head
        raise httpx.RemoteProtocolError("peer closed connection", request=self.request)
