"""Reading client bodies: the size limit enforced while reading, the chat request shape, and
whose body it is (the key of what is remembered to parse the next one: app/proxy/reuse.py)."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import anyio
import orjson
from starlette.requests import ClientDisconnect, Request

from inflight.credentials import CREDENTIAL_HEADERS
from inflight.errors import BadRequest, InvalidJSON, PayloadTooLarge, ProxyError
from inflight.proxy.reuse import Reused

logger = logging.getLogger(__name__)

MAX_JSON_DEPTH = 64
MAX_MESSAGES = 100_000
CREDENTIALS = frozenset(name.encode() for name in CREDENTIAL_HEADERS)


def _too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"request body exceeds the limit of {limit} bytes")


def check_declared_length(request: Request, limit: int) -> None:
    """Reject at once when `Content-Length` already says the body is too large."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)


class ClientGone(ProxyError):
    """The client hung up before its whole body arrived: nobody is left to answer (499, the
    status nginx gives it). Logged at info, recorded as `client_disconnected`."""

    status_code = 499
    error_type = "invalid_request_error"
    code = "client_disconnected"


class BodyTimeout(ProxyError):
    """The body did not arrive within `INFLIGHT_BODY_READ_TIMEOUT` seconds (408)."""

    status_code = 408
    error_type = "invalid_request_error"
    code = "request_timeout"


async def read_body(request: Request, limit: int, within: float | None = None) -> bytes:
    """The whole body, refusing (413) as soon as it passes `limit` bytes, or (408) when it has
    not all arrived `within` seconds after reading began; `ClientGone` when the client hangs
    up meanwhile."""
    check_declared_length(request, limit)
    chunks: list[bytes] = []
    size = 0
    try:
        with anyio.fail_after(within):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise _too_large(limit)
                chunks.append(chunk)
    except ClientDisconnect:
        logger.info("client hung up after %d body bytes of %s", size, request.url.path)
        raise ClientGone("the client disconnected before its body was read") from None
    except TimeoutError:
        logger.info("body of %s not read within %s s (%d bytes)", request.url.path, within, size)
        raise BodyTimeout(f"the request body did not arrive within {within:g} s") from None
    return b"".join(chunks)


async def limited_stream(
    request: Request, limit: int, within: float | None = None
) -> AsyncIterator[bytes]:
    """The body as a stream (pass-through), failing as `read_body` fails: once it passes
    `limit` bytes, when it has not all arrived `within` seconds after reading began, or when
    the client hangs up meanwhile."""
    check_declared_length(request, limit)
    size = 0
    deadline = None if within is None else anyio.current_time() + within
    chunks = aiter(request.stream())
    try:
        while True:
            with anyio.fail_after(None if deadline is None else deadline - anyio.current_time()):
                chunk = await anext(chunks, None)
            if chunk is None:
                return
            size += len(chunk)
            if size > limit:
                raise _too_large(limit)
            yield chunk
    except ClientDisconnect:
        logger.info("client hung up after %d body bytes of %s", size, request.url.path)
        raise ClientGone("the client disconnected before its body was read") from None
    except TimeoutError:
        logger.info("body of %s not read within %s s (%d bytes)", request.url.path, within, size)
        raise BodyTimeout(f"the request body did not arrive within {within:g} s") from None


def body_owner(request: Request) -> bytes:
    """Whose body `request` carries, for what is remembered to parse the next one
    (app/proxy/reuse.py): a full-length hash of its route and every credential header it sent
    (`inflight.credentials.CREDENTIAL_HEADERS`: Authorization of any scheme, x-api-key,
    api-key; each with its value, in order), whether or not the proxy checks keys. Not
    `client_identity`: that is a short id for records. Requests without any credential share
    one per route."""
    digest = hashlib.blake2b(request.scope["path"].encode(), digest_size=32)
    for name, value in request.scope["headers"]:
        name = name.lower()
        if name in CREDENTIALS:
            digest.update(b"\n%d:%s=%d:%s" % (len(name), name, len(value), value))
    return digest.digest()


def deeper_than(value: Any, limit: int) -> bool:
    """Whether the parsed JSON `value` nests deeper than `limit`: the top-level value is level 1
    and each value inside a container one level below it (object keys do not count).

    At C speed, without a walk in Python: indented by orjson, every value inside a container
    starts a line of its own, two spaces deeper per level (a value at level L is indented
    2·(L − 1)), and no newline inside a string is written raw — so a value below `limit` is a
    line indented 2·`limit` spaces or more. orjson refuses to write a value nested past its own
    recursion limit (hundreds of levels): deeper than any limit here."""
    try:
        text = orjson.dumps(value, option=orjson.OPT_INDENT_2)
    except orjson.JSONEncodeError:
        return True
    return b"\n" + b" " * (2 * limit) in text


def parse_model_body(raw: bytes) -> dict[str, Any]:
    """Parse a request body that names its model: a JSON object, not too deep, with a
    non-empty `model` string (400 naming what is wrong)."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidJSON(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    check_depth(body)
    check_model(body)
    return body


def check_depth(value: Any) -> None:
    """400 when the JSON object `value` (a body, or what a reused parse parsed of one: its
    keys are at the body's level) nests deeper than `MAX_JSON_DEPTH`."""
    if deeper_than(value, MAX_JSON_DEPTH):
        raise BadRequest(f"request body is nested deeper than {MAX_JSON_DEPTH} levels")


def check_model(body: dict[str, Any]) -> None:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("'model' must be a non-empty string", param="model")


def check_stream(body: dict[str, Any]) -> None:
    stream = body.get("stream", False)
    if not isinstance(stream, bool) and stream is not None:
        raise BadRequest("'stream' must be a boolean", param="stream")


def check_model_rest(reused: Reused) -> None:
    """What `parse_model_body` and `check_stream` check, on a body parsed from a remembered
    one (app/proxy/reuse.py): the part parsed now (its depth), and the body's model and stream."""
    check_depth(reused.rest)
    check_model(reused.body)
    check_stream(reused.body)


def check_chat_rest(reused: Reused) -> None:
    """What `parse_chat_body` checks, on a body parsed from a remembered one: the part parsed
    now (its depth), the model, and the messages parsed now."""
    check_depth(reused.rest)
    check_model(reused.body)
    check_chat_body(reused.body, reused.reused)


def parse_chat_body(raw: bytes) -> dict[str, Any]:
    """Parse and check the shape of a chat completions request (400 naming what is wrong)."""
    body = parse_model_body(raw)
    check_chat_body(body)
    return body


def check_chat_body(body: dict[str, Any], start: int = 0) -> None:
    """The shape of a chat completions request, its messages from `start` on (those before
    were checked when they were parsed: a reused parse)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty array", param="messages")
    if len(messages) > MAX_MESSAGES:
        raise BadRequest(f"'messages' has more than {MAX_MESSAGES} entries", param="messages")
    for i in range(start, len(messages)):
        message = messages[i]
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


def add_include_usage(raw: bytes, body: dict[str, Any]) -> bytes | None:
    """Raw bytes with `stream_options.include_usage: true` spliced in, all else byte-identical.

    Returns None when the body already has `stream_options` (the caller re-serialises then).
    """
    if "stream_options" in body:
        return None
    brace = raw.find(b"{")
    return raw[: brace + 1] + b'"stream_options":{"include_usage":true},' + raw[brace + 1 :]


def parse_streamable_body(raw: bytes) -> dict[str, Any]:
    """Parse a Responses or Messages request: an object with a `model`, and a boolean `stream`
    if any (what the history holds is the format adapter's to check, naming the item)."""
    body = parse_model_body(raw)
    check_stream(body)
    return body
