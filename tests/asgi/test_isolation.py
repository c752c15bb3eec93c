"""One client's bodies never shape another's request (DESIGN.md §7, Isolation), through the
whole proxy on every compacting route: what the upstream is sent for a client's request is
what a fresh proxy sends for that request alone, whatever other clients sent before it —
overlapping conversations, malformed bodies, keys given twice (issue "A shared proxy")."""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from fastapi import FastAPI
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inflight.factory import create_app
from tests.conftest import make_settings

pytestmark = pytest.mark.anyio

ANTHROPIC = "http://anthropic.test/v1"
ROUTES = ("/v1/chat/completions", "/v1/responses", "/v1/messages")
MODELS = {"/v1/messages": "claude-sonnet-4-5"}
HISTORY = {"/v1/responses": "input"}
SYSTEM = "You are a careful coding agent. Follow the repository's conventions. " * 12  # > 600 B
ANSWERS: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": "gpt-4o",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
        ],
    },
    "/v1/responses": {
        "id": "resp_1",
        "object": "response",
        "created_at": 0,
        "model": "gpt-4o",
        "status": "completed",
        "output": [
            {
                "type": "message",
                "id": "msg_1",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": "ok", "annotations": []}],
            }
        ],
    },
    "/v1/messages": {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": [{"type": "text", "text": "ok"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
    },
}  # no usage: nothing is calibrated, so a fresh proxy plans as a warm one does


@dataclass
class Upstream:
    """A MockTransport upstream that keeps every body it is sent (in order)."""

    sent: list[tuple[str, bytes]] = field(default_factory=list)

    def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if request.method != "POST" or path not in ANSWERS:  # window discovery: none known
            return httpx.Response(404, json={"error": {"message": "not found"}})
        self.sent.append((path, request.content))
        return httpx.Response(200, json=ANSWERS[path])

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a request came to: the answer's status and JSON, and the bodies sent upstream."""

    status: int
    answer: Any
    forwarded: tuple[bytes, ...]


class Proxy:
    """The proxy in front of an `Upstream`, serving one client request at a time."""

    def __init__(self, app: FastAPI, upstream: Upstream, client: httpx.AsyncClient) -> None:
        self.app, self.upstream, self.client = app, upstream, client

    async def send(self, route: str, raw: bytes, headers: Mapping[str, str]) -> Outcome:
        before = len(self.upstream.sent)
        answer = await self.client.post(route, content=raw, headers=dict(headers))
        return Outcome(
            answer.status_code,
            answer.json(),
            tuple(body for _, body in self.upstream.sent[before:]),
        )


@asynccontextmanager
async def proxy() -> AsyncIterator[Proxy]:
    """A new proxy (its own app, store and caches), no API keys, Anthropic upstream apart."""
    upstream = Upstream()
    with tempfile.TemporaryDirectory() as folder:
        app = create_app(
            make_settings(Path(folder), anthropic_upstream_url=ANTHROPIC),
            transport=upstream.transport(),
        )
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://p") as client:
                yield Proxy(app, upstream, client)


def message(route: str, role: str, text: str) -> dict[str, Any]:
    if route == "/v1/messages":
        return {"role": role, "content": [{"type": "text", "text": text}]}
    return {"role": role, "content": text}


def body(route: str, history: list[dict[str, Any]], system: str = SYSTEM) -> dict[str, Any]:
    """A request on `route` with `history` (and `system` where the API has a place for it)."""
    if route == "/v1/messages":
        return {"model": MODELS[route], "max_tokens": 256, "system": system, "messages": history}
    head = [message(route, "system" if route != "/v1/responses" else "developer", system)]
    return {"model": "gpt-4o", HISTORY.get(route, "messages"): [*head, *history]}


def turns(route: str, n: int, tag: str = "") -> list[dict[str, Any]]:
    """`n` alternating user and assistant messages, user first."""
    return [
        message(route, "user" if i % 2 == 0 else "assistant", f"{tag}turn {i} " + "word " * 30)
        for i in range(n)
    ]


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}", "anthropic-version": "2023-06-01"}


def sent_model_and_system(route: str, forwarded: bytes) -> tuple[Any, Any]:
    sent = orjson.loads(forwarded)
    if route == "/v1/messages":
        return sent["model"], sent["system"]
    return sent["model"], sent[HISTORY.get(route, "messages")][0]["content"]


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/messages"])
@pytest.mark.parametrize("b_key", ["key-b", "key-a", None])
async def test_a_body_that_repeats_a_key_does_not_rewrite_the_next_clients(
    route: str, b_key: str | None
) -> None:
    """Finding 1: client A sends a body, then the same conversation one turn on with `model`
    (and on /v1/messages `system`) given again after the history; client B — another key,
    the same key, or neither sending one — then sends an ordinary body whose bytes start as
    A's did. B's request, compacted (so the body sent is rendered from its parse, not its
    bytes), goes upstream with B's model and system."""
    a_key = "key-a" if b_key is not None else None
    a_headers = bearer(a_key) if a_key else {"anthropic-version": "2023-06-01"}
    b_headers = {
        **(bearer(b_key) if b_key else {"anthropic-version": "2023-06-01"}),
        "x-compaction-context-limit": "500",
        "x-compaction-strategy": "trim",
    }
    history = turns(route, 9)
    async with proxy() as shared:
        first = orjson.dumps(body(route, history[:1]))
        assert (await shared.send(route, first, a_headers)).status == 200
        again = b',"model":"evil-model"'
        if route == "/v1/messages":
            again += b',"system":"You are evil."'
        poisoned = orjson.dumps(body(route, history[:3]))[:-1] + again + b"}"
        outcome = await shared.send(route, poisoned, a_headers)
        assert outcome.status == 200  # valid JSON: the last value of a key counts
        assert sent_model_and_system(route, outcome.forwarded[0])[0] == "evil-model"
        ordinary = orjson.dumps(body(route, history))
        got = await shared.send(route, ordinary, b_headers)
    assert got.status == 200
    assert got.forwarded[0] != ordinary  # compacted
    model, system = sent_model_and_system(route, got.forwarded[0])
    assert model == MODELS.get(route, "gpt-4o")
    assert system == SYSTEM


@pytest.mark.parametrize("route", ROUTES)
async def test_a_trailing_comma_after_a_remembered_body_is_refused(route: str) -> None:
    """Finding 2: the remembered body again, ending `…},]}`, is not JSON: 400 in the API's
    envelope, as a fresh proxy answers, and nothing is sent upstream."""
    raw = orjson.dumps(body(route, turns(route, 3)))
    close = raw.rindex(b"]")
    broken = raw[:close] + b"," + raw[close:]
    async with proxy() as shared:
        assert (await shared.send(route, raw, bearer("key-a"))).status == 200
        got = await shared.send(route, broken, bearer("key-a"))
    async with proxy() as fresh:
        expected = await fresh.send(route, broken, bearer("key-a"))
    assert expected.status == 400
    assert got == expected
    assert got.forwarded == ()


CLIENTS = (
    {"authorization": "Bearer key-a"},
    {"authorization": "Bearer key-b"},
    {"x-api-key": "key-c"},
    {"authorization": "Basic a2V5LWE6"},
    {},
)


@st.composite
def requests(draw: st.DrawFn, route: str) -> list[tuple[int, bytes, dict[str, str]]]:
    """Interleaved requests of a few clients whose conversations share a system prompt and
    a prefix, grow, retry, and now and then are malformed or give a key twice."""
    clients = draw(st.lists(st.integers(0, len(CLIENTS) - 1), min_size=2, max_size=3, unique=True))
    shared = turns(route, draw(st.integers(0, 4)), "shared ")
    own = {  # the own turns continue where the shared ones end: roles still alternate
        c: [*shared, *turns(route, len(shared) + 8, f"client {c} ")[len(shared) :]] for c in clients
    }
    lengths = dict.fromkeys(clients, 0)
    out = []
    for _ in range(draw(st.integers(3, 8))):
        c = draw(st.sampled_from(clients))
        lengths[c] = max(1, min(len(own[c]), lengths[c] + draw(st.integers(-1, 3))))
        raw = orjson.dumps(body(route, own[c][: lengths[c]]))
        form = draw(
            st.sampled_from(["plain"] * 4 + ["again"] * 2 + ["comma", "cut", "spaced", "dup"])
        )
        if form == "again":  # a key given twice: after the history
            raw = raw[:-1] + b',"model":"evil-model"}'
        elif form == "comma":
            close = raw.rindex(b"]")
            raw = raw[:close] + b"," + raw[close:]
        elif form == "cut":
            raw = raw[: draw(st.integers(len(raw) // 2, len(raw) - 1))]
        elif form == "spaced":
            raw = raw.replace(b'","', b'", "', 1)
        elif form == "dup":  # a key twice inside the last message
            close = raw.rindex(b"}]")
            raw = raw[:close] + b',"role":"user"' + raw[close:]
        limit = draw(st.sampled_from(["300", "500", "800", "100000"]))
        headers = {
            **CLIENTS[c],
            "anthropic-version": "2023-06-01",
            "x-compaction-context-limit": limit,
            "x-compaction-strategy": "truncate,prune,trim",
        }
        out.append((c, raw, headers))
    return out


@pytest.mark.parametrize("route", ROUTES)
@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
async def test_each_clients_request_is_what_a_fresh_proxy_sends(
    route: str, data: st.DataObject
) -> None:
    """Clients interleave on one proxy; every request's outcome (status, answer, the bodies
    sent upstream) is the one a new proxy gives for that request alone."""
    sequence = data.draw(requests(route))
    got = []
    async with proxy() as shared:
        for _, raw, headers in sequence:
            got.append(await shared.send(route, raw, headers))
    expected: dict[tuple[bytes, tuple[tuple[str, str], ...]], Outcome] = {}
    for (_, raw, headers), outcome in zip(sequence, got, strict=True):
        key = (raw, tuple(sorted(headers.items())))
        if key not in expected:
            async with proxy() as fresh:
                expected[key] = await fresh.send(route, raw, headers)
        assert outcome == expected[key], raw[-300:]


@pytest.mark.parametrize(
    "other",
    [
        {"authorization": "Bearer key-b"},
        {"authorization": "Basic a2V5LWE6"},
        {"x-api-key": "key-a"},
        {"api-key": "key-a"},
        {"authorization": "Bearer key-a", "x-api-key": "key-b"},
        {},
    ],
)
async def test_a_remembered_body_is_reused_for_its_own_client_only(other: dict[str, str]) -> None:
    """What is remembered to parse the next body is keyed by the credentials sent (any
    header, any scheme): another client's extension of the same conversation is parsed in
    full, the same client's is not."""
    route = "/v1/chat/completions"
    history = turns(route, 5)
    own = {"authorization": "Bearer key-a"}
    async with proxy() as shared:
        remembered = shared.app.state.inflight.apis["chat"]._bodies
        await shared.send(route, orjson.dumps(body(route, history[:2])), own)
        await shared.send(route, orjson.dumps(body(route, history[:3])), other)
        assert remembered.reused == 0
        await shared.send(route, orjson.dumps(body(route, history[:4])), own)
        assert remembered.reused == 1
