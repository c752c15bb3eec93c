"""A shared proxy: what one client's traffic teaches never reshapes another client's requests
(DESIGN.md §7 Isolation). Through the ASGI app with an Anthropic upstream (MockTransport) that
bills text at its size and each PDF document at what it likes: documents (sized by a guess)
neither prove a silent cut nor calibrate the counter, and a window one client saw the upstream
cut to is its own until others saw it too."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from inflight.factory import create_app
from inflight.tokens.heuristic import heuristic_tokens
from inflight.windows.registry import SILENT_QUORUM
from tests.conftest import make_settings

pytestmark = pytest.mark.anyio

MODEL = "claude-sonnet-4-5"
TABLE_WINDOW = 200_000  # config/models.toml
MESSAGES = "/v1/messages"
WORDS = "the proxy compacts a long agent session so that it fits the model's context window "
PDF = {
    "type": "document",
    "source": {
        "type": "base64",
        "media_type": "application/pdf",
        "data": base64.b64encode(b"%PDF-1.4 a one-page invoice").decode(),
    },
}


def client_headers(key: str) -> dict[str, str]:
    return {"x-api-key": key, "anthropic-version": "2023-06-01"}


def _texts(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [b["text"] for b in content if isinstance(b, dict) and b.get("type") == "text"]
    return []


class Billing:
    """An Anthropic upstream that bills the text `text_rate` times the heuristic (plus a few
    tokens of framing per message) and every document `per_document` tokens."""

    def __init__(self, per_document: int, text_rate: float = 1.0) -> None:
        self.per_document = per_document
        self.text_rate = text_rate
        self.cut_at: int | None = None  # a server that silently keeps only this many tokens
        self.sent: list[dict[str, Any]] = []

    def text_tokens(self, body: dict[str, Any]) -> int:
        texts = [t for m in body["messages"] for t in _texts(m.get("content"))]
        texts += _texts(body.get("system"))
        framing = 4 * len(body["messages"]) + 8
        return round(self.text_rate * sum(heuristic_tokens(t) for t in texts)) + framing

    def billed(self, body: dict[str, Any]) -> int:
        documents = sum(
            1
            for m in body["messages"]
            for b in (m["content"] if isinstance(m.get("content"), list) else ())
            if isinstance(b, dict) and b.get("type") == "document"
        )
        billed = self.text_tokens(body) + self.per_document * documents
        return billed if self.cut_at is None else min(billed, self.cut_at)

    def handle(self, request: httpx.Request) -> httpx.Response:
        if request.method != "POST" or not request.url.path.endswith("/messages"):
            return httpx.Response(404, json={"type": "error", "error": {"type": "not_found"}})
        body = orjson.loads(request.content)
        self.sent.append(body)
        message = {
            "id": f"msg_{len(self.sent)}",
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": [{"type": "text", "text": "ok"}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": self.billed(body), "output_tokens": 1},
        }
        return httpx.Response(200, json=message)


@asynccontextmanager
async def proxy(tmp_path: Path, upstream: Billing) -> AsyncIterator[httpx.AsyncClient]:
    settings = make_settings(tmp_path, anthropic_upstream_url="http://anthropic.test/v1")
    app = create_app(settings, transport=httpx.MockTransport(upstream.handle))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://proxy.test") as client:
            yield client


def conversation(turns: int, size: int) -> dict[str, Any]:
    """An ordinary text conversation: `2 * turns + 1` messages of `size` repetitions each."""
    messages = [
        {"role": role, "content": f"{role} {i}: " + WORDS * size}
        for i in range(turns)
        for role in ("user", "assistant")
    ]
    messages.append({"role": "user", "content": "and now?"})
    return {"model": MODEL, "max_tokens": 256, "messages": messages}


def with_documents(i: int, documents: int) -> dict[str, Any]:
    content = [dict(PDF) for _ in range(documents)] + [
        {"type": "text", "text": f"invoice batch {i}: what is the total of each?"}
    ]
    return {"model": MODEL, "max_tokens": 256, "messages": [{"role": "user", "content": content}]}


async def send(client: httpx.AsyncClient, body: dict[str, Any], key: str) -> httpx.Response:
    response = await client.post(MESSAGES, content=orjson.dumps(body), headers=client_headers(key))
    assert response.status_code == 200, response.text
    return response


async def counted(client: httpx.AsyncClient, body: dict[str, Any], key: str) -> int:
    response = await client.post(
        "/v1/compaction/count", content=orjson.dumps(body), headers=client_headers(key)
    )
    assert response.status_code == 200, response.text
    return int(response.json()["prompt_tokens"])


async def test_documents_billed_below_their_guess_shrink_nobodys_window(tmp_path: Path) -> None:
    """Issue 7: client A's requests hold a few small PDFs (guessed at 1,000 tokens each, billed
    250). Before: with the model calibrated (so its estimates "trusted"), the shortfall read as
    a silent cut and the window learned was a few hundred tokens — for everyone, so client C's
    ordinary 3k-token conversation of 13 messages was cut to a few. Now the documents count as
    nothing in the comparison: no cut, and C's request goes whole, at the table's window."""
    upstream = Billing(per_document=250, text_rate=1.15)
    ordinary = conversation(turns=6, size=16)
    assert len(ordinary["messages"]) == 13
    async with proxy(tmp_path, upstream) as client:
        for size in (4, 8, 16):  # C's answers calibrate the counter for the model
            await send(client, conversation(turns=6, size=size), "key-c")
        assert upstream.text_tokens(ordinary) > 3000
        answers = [await send(client, with_documents(i, documents=3), "key-a") for i in range(4)]
        forwarded = len(upstream.sent)
        after = await send(client, ordinary, "key-c")
        assert after.headers["x-compaction-context-limit"] == str(TABLE_WINDOW)
        assert after.headers["x-compaction-applied"] == "none"
        assert len(upstream.sent[forwarded]["messages"]) == 13
        assert all("x-compaction-upstream-truncated" not in a.headers for a in answers)
        mine = await send(client, ordinary, "key-a")  # nor A's own window
        assert mine.headers["x-compaction-context-limit"] == str(TABLE_WINDOW)


@pytest.mark.parametrize("per_document", [3000, 250])
async def test_documents_billed_off_their_guess_skew_nobodys_estimate(
    tmp_path: Path, per_document: int
) -> None:
    """Issue 8: twelve requests with PDFs billed at 3,000 tokens each (or 250) moved the
    shared calibration (content ×2.0 and +1,351 per request), so client B's unchanged plain
    request was counted at twice its size (or under it). Documents calibrate nothing now: B's
    estimate stays within a few per cent of what the upstream counts."""
    upstream = Billing(per_document=per_document)
    plain = conversation(turns=20, size=28)
    async with proxy(tmp_path, upstream) as client:
        real = upstream.text_tokens(plain)
        assert 20_000 < real < 25_000
        for _ in range(3):
            await send(client, plain, "key-b")
        before = await counted(client, plain, "key-b")
        assert abs(before - real) <= 0.05 * real
        for i in range(12):
            await send(client, with_documents(i, documents=2), "key-a")
        after = await counted(client, plain, "key-b")
        assert abs(after - real) <= 0.05 * real, (before, after, real)
        stats = (await client.get("/stats")).json()
        assert abs(stats["calibration"].get(MODEL, 1.0) - 1.0) < 0.1


async def test_a_silent_cut_is_its_clients_window_until_others_see_one(tmp_path: Path) -> None:
    """A real silent cut (text only, counted far short by a calibrated counter): the window
    is learned for the client that saw it; another client keeps the table's until
    `SILENT_QUORUM` distinct clients saw a cut, then the largest window that many agree on
    applies to all."""
    upstream = Billing(per_document=0, text_rate=1.15)
    long = conversation(turns=30, size=16)
    async with proxy(tmp_path, upstream) as client:
        for size in (4, 8, 16):
            await send(client, conversation(turns=6, size=size), "key-c")
        upstream.cut_at = 2000
        seen = ["key-a", "key-d", "key-e"][:SILENT_QUORUM]
        for n, key in enumerate(seen, start=1):
            cut = await send(client, long, key)
            assert cut.headers["x-compaction-upstream-truncated"] == "true"
            upstream.cut_at += 100  # each saw a slightly different window
            own = await counted_limit(client, long, key)
            other = await counted_limit(client, long, "key-b")
            assert own == 2000 + 100 * (n - 1)
            assert other == (TABLE_WINDOW if n < SILENT_QUORUM else 2000 + 100 * (n - 1))


async def counted_limit(client: httpx.AsyncClient, body: dict[str, Any], key: str) -> int:
    response = await client.post(
        "/v1/compaction/count", content=orjson.dumps(body), headers=client_headers(key)
    )
    assert response.status_code == 200, response.text
    return int(response.json()["context_limit"])
