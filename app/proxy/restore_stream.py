"""Restore on a stream: hold back only the first chunks, until the answer's kind is known."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from inflight.proxy.restore import Dialect, Kind, RestoreLoop, Send, follow_json
from inflight.proxy.upstream import upstream_errors


@dataclass(slots=True)
class Held:
    """The round to relay: its response, the bytes read from it so far (a JSON answer: the
    body to relay), and the rest."""

    upstream: httpx.Response
    head: bytes
    rest: AsyncIterator[bytes]


async def _nothing() -> AsyncIterator[bytes]:
    return
    yield b""  # pragma: no cover - makes this an async generator


def _events(data: bytes) -> list[dict[str, Any]]:
    """The JSON objects of the complete `data:` lines in `data`."""
    out: list[dict[str, Any]] = []
    for line in data.splitlines():
        payload = line[5:].strip() if line.startswith(b"data:") else b""
        if not payload or payload == b"[DONE]":
            continue
        try:
            event = orjson.loads(payload)
        except orjson.JSONDecodeError:
            continue
        if isinstance(event, dict):
            out.append(event)
    return out


async def _first_kind(chunks: AsyncIterator[bytes], dialect: Dialect) -> tuple[Kind, bytes]:
    """Read until a complete line says the answer's kind (text when the body ends first or
    is not an event stream); returns it and the bytes read."""
    head = bytearray()
    seen = 0  # `head[:seen]` holds complete lines already looked at
    async for chunk in chunks:
        head += chunk
        end = head.rfind(b"\n") + 1
        if end <= seen:
            continue
        lines, seen = bytes(head[seen:end]), end
        for event in _events(lines):
            kind = dialect.kind(event)
            if kind is not None:
                return kind, bytes(head)
        if b"[DONE]" in lines:
            return "text", bytes(head)
    return "text", bytes(head)


async def _read_rest(upstream: httpx.Response, chunks: AsyncIterator[bytes]) -> bytes:
    with upstream_errors(upstream.request.url, "stream"):
        return b"".join([chunk async for chunk in chunks])


async def _look(
    upstream: httpx.Response, dialect: Dialect
) -> tuple[Kind, bytes, AsyncIterator[bytes]]:
    """The kind of a round's answer and what was read to know it; the upstream is closed when
    this fails."""
    chunks = upstream.aiter_bytes()
    try:
        with upstream_errors(upstream.request.url, "stream"):
            kind, head = await _first_kind(chunks, dialect)
    except BaseException:
        await upstream.aclose()
        raise
    return kind, head, chunks


async def follow_stream(loop: RestoreLoop, upstream: httpx.Response, send: Send) -> Held:
    """Run the loop on a stream whose first round (`upstream`, a success) has just started.
    Returns the round to relay; a later round's error response is returned unread.

    A stream's first events say what the answer is (the `Dialect` reads them). Text (a first
    non-empty text delta, or an end without tool calls) is relayed from there on as it comes: the
    chunks held so far go first, then the rest of the same upstream body. Tool calls are short: that
    answer is read to its end and assembled; when it calls `inflight_restore` (and a round is left)
    the proxy answers and streams the next round instead, else the held answer is relayed exactly as
    received. The client sees one well-formed stream — the final round's — with time to first byte
    delayed only for tool-call answers. A restore call in the relayed stream (after its text, or on
    the last round) is not answered: the tap drops it (`Dialect.stray`).
    """
    while True:
        kind, head, chunks = await _look(upstream, loop.dialect)
        if kind == "text" or not loop.offering:
            return Held(upstream, head, chunks)
        try:
            whole = head + await _read_rest(upstream, chunks)
        finally:
            await upstream.aclose()
        answer = loop.dialect.assemble(_events(whole))
        calls = loop.dialect.calls(answer)
        if not calls:
            return Held(upstream, whole, _nothing())
        loop.answer(answer, calls)
        upstream = await send(loop.request())
        if upstream.status_code >= 400:
            return Held(upstream, b"", _nothing())


async def follow(loop: RestoreLoop, upstream: httpx.Response, send: Send, *, stream: bool) -> Held:
    """Restore's rounds on a first answer that succeeded, a stream's (`follow_stream`) or a
    JSON answer's (`follow_json`: its last response, closed, and the body to relay)."""
    if stream:
        return await follow_stream(loop, upstream, send)
    upstream, content = await follow_json(loop, upstream, send)
    return Held(upstream, content, _nothing())
