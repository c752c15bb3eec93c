"""Reading client bodies: the size limit enforced while reading, and the chat request shape."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
from starlette.requests import Request

from app.errors import BadRequest, InvalidJSON, PayloadTooLarge

MAX_JSON_DEPTH = 64
MAX_MESSAGES = 100_000


def _too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"request body exceeds the limit of {limit} bytes")


def check_declared_length(request: Request, limit: int) -> None:
    """Reject at once when `Content-Length` already says the body is too large."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body, refusing (413) as soon as it passes `limit` bytes."""
    check_declared_length(request, limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


async def limited_stream(request: Request, limit: int) -> AsyncIterator[bytes]:
    """The body as a stream (pass-through), failing once it passes `limit` bytes."""
    check_declared_length(request, limit)
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        yield chunk


def _depth(value: Any, limit: int) -> int:
    """Nesting depth of a parsed JSON value, iteratively (no recursion limit surprises)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, level = stack.pop()
        deepest = max(deepest, level)
        if deepest > limit:
            return deepest
        if isinstance(item, dict):
            stack.extend((v, level + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, level + 1) for v in item)
    return deepest


def parse_chat_body(raw: bytes) -> dict[str, Any]:
    """Parse and check the shape of a chat completions request (400 naming what is wrong)."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidJSON(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    if _depth(body, MAX_JSON_DEPTH) > MAX_JSON_DEPTH:
        raise BadRequest(f"request body is nested deeper than {MAX_JSON_DEPTH} levels")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("'model' must be a non-empty string", param="model")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty array", param="messages")
    if len(messages) > MAX_MESSAGES:
        raise BadRequest(f"'messages' has more than {MAX_MESSAGES} entries", param="messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise BadRequest(f"messages[{i}] must be an object", param=f"messages[{i}]")
        if not isinstance(message.get("role"), str):
            raise BadRequest(f"messages[{i}].role must be a string", param=f"messages[{i}].role")
        content = message.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise BadRequest(
                f"messages[{i}].content must be a string, an array of parts, or null",
                param=f"messages[{i}].content",
            )
        calls = message.get("tool_calls")
        if calls is not None and not (
            isinstance(calls, list) and all(isinstance(c, dict) for c in calls)
        ):
            raise BadRequest(
                f"messages[{i}].tool_calls must be an array of objects",
                param=f"messages[{i}].tool_calls",
            )
    stream = body.get("stream", False)
    if not isinstance(stream, bool) and stream is not None:
        raise BadRequest("'stream' must be a boolean", param="stream")
    return body


def add_include_usage(raw: bytes, body: dict[str, Any]) -> bytes | None:
    """Raw bytes with `stream_options.include_usage: true` spliced in, all else byte-identical.

    Returns None when the body already has `stream_options` (the caller re-serialises then).
    """
    if "stream_options" in body:
        return None
    brace = raw.find(b"{")
    return raw[: brace + 1] + b'"stream_options":{"include_usage":true},' + raw[brace + 1 :]
