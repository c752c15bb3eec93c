"""Reused parses through the whole proxy (issue 16): on each compacting API, a growing session —
compacted, streamed or not, restore on — sends upstream exactly what a proxy that parses every
body in full sends, and no remembered body is changed by anything the request went through
(the parsed objects are shared by a conversation's requests)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from fastapi import FastAPI

from inflight.factory import create_app
from inflight.http.state import AppState
from inflight.proxy.service import ApiService
from tests.asgi.test_anthropic_route import ANTHROPIC, HEADERS, agent_body
from tests.asgi.test_responses_route import agent_items
from tests.conftest import make_settings
from tests.support.fakes import FakeUpstream

pytestmark = pytest.mark.anyio


def chat_session(rounds: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the failing test."},
    ]
    for i in range(rounds):
        call = {"id": f"c{i}", "type": "function",
                "function": {"name": "bash", "arguments": f'{{"cmd": "cat f{i}"}}'}}  # fmt: skip
        messages += [
            {"role": "assistant", "content": f"step {i}", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{i}", "content": f"out {i} " + "data " * 600},
        ]
    return messages


def bodies(route: str) -> list[dict[str, Any]]:
    """A session's requests on `route`, each the last one plus a turn."""
    if route == "/v1/chat/completions":
        history = chat_session(40)
        return [{"model": "gpt-4o", "messages": history[:k]} for k in range(12, len(history), 2)]
    if route == "/v1/responses":
        items = agent_items(30, 600)
        return [{"model": "gpt-4o", "input": items[:k]} for k in range(10, len(items), 3)]
    whole = agent_body(30, 1500)
    return [{**whole, "messages": whole["messages"][:k]} for k in range(11, 61, 2)]


def service(app: FastAPI, route: str) -> ApiService:
    state = app.state.inflight
    assert isinstance(state, AppState)
    return next(service for service in state.apis.values() if service.api.route == route)


ROUTES = ("/v1/chat/completions", "/v1/messages", "/v1/responses")


def sent(fake: FakeUpstream, route: str) -> list[bytes]:
    """What the fake was sent on the route (summary calls aside), in order."""
    return [r.body for r in fake.requests if r.path == route and not r.summary]


def proxy_app(tmp_path: Path, fake: FakeUpstream) -> FastAPI:
    """The proxy in front of `fake`, a 16k window assumed."""
    settings = make_settings(tmp_path, anthropic_upstream_url=ANTHROPIC, context_limit=16_384)
    return create_app(settings, transport=httpx.ASGITransport(app=fake.app))


async def session(app: FastAPI, route: str) -> AsyncIterator[httpx.Response]:
    """A session's answers from `app` on `route`, restore on, every third request streamed."""
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://p") as client:
            for i, body in enumerate(bodies(route)):
                headers = {**HEADERS, "x-compaction-restore": "true"}
                stream = i % 3 == 2
                yield await client.post(
                    route, content=orjson.dumps({**body, "stream": stream}), headers=headers
                )


@pytest.mark.parametrize("route", ROUTES)
async def test_a_session_sends_what_full_parses_send(tmp_path: Path, route: str) -> None:
    outcomes = []
    for reusing in (True, False):
        fake = FakeUpstream()
        (tmp_path / str(reusing)).mkdir()
        app = proxy_app(tmp_path / str(reusing), fake)
        api = service(app, route)
        if not reusing:
            api._bodies = None  # every body parsed in full
        statuses, reports = [], []
        async for response in session(app, route):
            statuses.append(response.status_code)
            reports.append(response.headers.get("x-compaction-applied"))
            if reusing:
                remembered = api._bodies
                assert remembered is not None
                assert remembered.intact()
            if reusing:
                assert remembered.reused >= len(statuses) - 3  # all but the first few
        outcomes.append((statuses, reports, sent(fake, route)))
    assert outcomes[0] == outcomes[1]
    statuses, reports, _ = outcomes[0]
    assert set(statuses) == {200}
    assert any(r not in (None, "none") for r in reports)  # the session was compacted
