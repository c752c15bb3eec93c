"""Reading client bodies: the size limit enforced while reading, and the chat request shape."""

from __future__ import annotations

import re
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


_ONE_KIND = bytes.maketrans(b"{}", b"[]")  # depth does not depend on the kind of container
_NOT_SHAPE = bytes(b for b in range(256) if b not in b'[]{}"')
# The exact rule in the rare case it is needed: every scalar (a string too) is a pair of its own.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_SCALAR = re.compile(rb"[^\[\]{}:,\s]+")


def _containers(raw: bytes) -> bytes:
    """The containers of the JSON text `raw` as brackets of one kind, strings removed.

    Escaped backslashes go first (a run of them pairs up from the left, as a parser reads it),
    then escaped quotes, then everything but brackets and quotes. What is left between quotes
    was inside a string: an empty pair is removed at once (two quotes meeting from different
    strings only merge two strings), the rest by splitting on quotes.
    """
    text = raw.replace(b"\\\\", b"").replace(b'\\"', b"").translate(_ONE_KIND, _NOT_SHAPE)
    text = text.replace(b'""', b"")
    return b"".join(text.split(b'"')[::2]) if b'"' in text else text


def _height(shape: bytes, cap: int) -> int:
    """The nesting depth of balanced `[]` pairs, at most `cap`: each pass removes every
    innermost pair at once (`bytes.replace` does not rescan what it produced)."""
    for height in range(cap):
        if not shape:
            return height
        shape = shape.replace(b"[]", b"")
    return cap


def nested_deeper(raw: bytes, limit: int) -> bool:
    """Whether the JSON text `raw` (already parsed, so valid) nests deeper than `limit`, at C
    speed. The top-level value is level 1 and each value inside a container one level below
    it (object keys do not count): a scalar inside a container at level L is at L + 1."""
    if raw.count(b"[") + raw.count(b"{") < limit:
        return False  # a value is at most one level below the deepest of so few containers
    height = _height(_containers(raw), limit + 1)
    if height != limit:
        return height > limit
    # Containers reach exactly `limit`: too deep when one of those holds a value. Every scalar
    # becomes a pair of its own, on a scan as slow as a regex, only for such bodies.
    scalars = _SCALAR.sub(b"[]", _STRING.sub(b"0", raw)).translate(_ONE_KIND, _NOT_SHAPE)
    return _height(scalars, limit + 1) > limit


def parse_model_body(raw: bytes) -> dict[str, Any]:
    """Parse a request body that names its model: a JSON object, not too deep, with a
    non-empty `model` string (400 naming what is wrong)."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidJSON(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    if nested_deeper(raw, MAX_JSON_DEPTH):
        raise BadRequest(f"request body is nested deeper than {MAX_JSON_DEPTH} levels")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("'model' must be a non-empty string", param="model")
    return body


def check_stream(body: dict[str, Any]) -> None:
    stream = body.get("stream", False)
    if not isinstance(stream, bool) and stream is not None:
        raise BadRequest("'stream' must be a boolean", param="stream")


def parse_chat_body(raw: bytes) -> dict[str, Any]:
    """Parse and check the shape of a chat completions request (400 naming what is wrong)."""
    body = parse_model_body(raw)
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
    check_stream(body)
    return body


def add_include_usage(raw: bytes, body: dict[str, Any]) -> bytes | None:
    """Raw bytes with `stream_options.include_usage: true` spliced in, all else byte-identical.

    Returns None when the body already has `stream_options` (the caller re-serialises then).
    """
    if "stream_options" in body:
        return None
    brace = raw.find(b"{")
    return raw[: brace + 1] + b'"stream_options":{"include_usage":true},' + raw[brace + 1 :]
