"""Real uvicorn servers: a client that hangs up while restore holds its answer back stops the
loop at once, on every API, stream and JSON — the upstream answer being read is closed (each
further round would resend the whole prompt, billed) and no new round starts."""

from __future__ import annotations

import socket
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
import orjson
import pytest

from inflight.factory import create_app
from inflight.proxy.restore import TOOL_NAME
from tests.asgi.test_restore_route import RESTORE
from tests.conftest import make_settings
from tests.support.fake_restore_upstream import FIRST_REF, Call, Reply, ScriptedUpstream
from tests.support.servers import WatchedStore, serve
from tests.unit.proxy.test_restore_stray import BODIES

pytestmark = pytest.mark.e2e
WAIT = 10.0  # seconds any one wait may take


class HeldUpstream:
    """Every API's upstream, answering each round with a call to `inflight_restore`
    (`ScriptedUpstream`'s bytes); round 1 sends only its first part — enough for the proxy to
    know it is a tool call — then waits until the proxy closes it (`closed`) or the test
    lets it finish (`release`)."""

    def __init__(self) -> None:
        self.scripted = ScriptedUpstream([Reply(calls=(Call(TOOL_NAME, FIRST_REF),))])
        self.started = threading.Event()  # round 1's first part is sent
        self.closed = threading.Event()  # the proxy closed round 1 before its end
        self.release = threading.Event()

    @property
    def rounds(self) -> int:
        return len(self.scripted.bodies)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": message["type"] + ".complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        while (message := await receive()).get("more_body"):
            body += message.get("body", b"")
        body += message.get("body", b"")
        first = scope["method"] == "POST" and self.rounds == 0  # (not a discovery GET)
        start, whole = await self._answer(scope, body)
        await send(start)
        if not first:
            await send({"type": "http.response.body", "body": whole})
            return
        cut = whole.find(b"\n\n", whole.find(TOOL_NAME.encode())) + 2
        cut = cut if cut > 1 and b"\ndata" in whole else len(whole) // 2  # JSON: half of it
        await send({"type": "http.response.body", "body": whole[:cut], "more_body": True})
        self.started.set()
        async with anyio.create_task_group() as group:
            group.start_soon(self._until_closed, receive, group.cancel_scope)
            await anyio.to_thread.run_sync(self.release.wait, WAIT, abandon_on_cancel=True)
            group.cancel_scope.cancel()
            await send({"type": "http.response.body", "body": whole[cut:]})

    async def _until_closed(self, receive: Any, scope: anyio.CancelScope) -> None:
        while (await receive())["type"] != "http.disconnect":
            continue
        self.closed.set()
        scope.cancel()

    async def _answer(self, scope: Any, body: bytes) -> tuple[dict[str, Any], bytes]:
        """The scripted upstream's response start and whole body for this request."""
        sent: list[dict[str, Any]] = []
        given = False

        async def receive() -> dict[str, Any]:
            nonlocal given
            if given:
                await anyio.sleep_forever()
            given = True
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await self.scripted.app(scope, receive, send)
        return sent[0], b"".join(m.get("body", b"") for m in sent[1:])


def post_and_hang_up(url: str, route: str, body: dict[str, Any], upstream: HeldUpstream) -> None:
    """Send the request over a raw socket, and close it once round 1 is being held."""
    where = urlsplit(url)
    content = orjson.dumps(body)
    head = [f"POST {route} HTTP/1.1", f"host: {where.netloc}", "content-type: application/json",
            f"content-length: {len(content)}", *(f"{k}: {v}" for k, v in RESTORE.items())]  # fmt: skip
    with socket.create_connection((where.hostname, where.port), timeout=WAIT) as client:
        client.sendall("\r\n".join(head).encode() + b"\r\n\r\n" + content)
        assert upstream.started.wait(WAIT), "round 1 never started"


@pytest.mark.parametrize("route", list(BODIES))
@pytest.mark.parametrize("stream", [False, True])
def test_a_hang_up_during_restore_closes_the_upstream_and_starts_no_round(
    tmp_path: Path, route: str, stream: bool
) -> None:
    upstream = HeldUpstream()
    store = WatchedStore()
    with serve(upstream) as upstream_url:
        settings = make_settings(
            tmp_path, upstream_url=upstream_url + "/v1", anthropic_upstream_url=upstream_url + "/v1"
        )
        with serve(create_app(settings, store=store)) as url:
            post_and_hang_up(url, route, {**BODIES[route], "stream": stream}, upstream)
            closed = upstream.closed.wait(WAIT)
            upstream.release.set()  # (before the fix: the proxy reads round 1 on, and asks again)
            (record,) = store.wait_for(1)
    assert closed, "the upstream's round 1 was not closed after the client hung up"
    assert upstream.rounds == 1
    assert (record.outcome, record.status) == ("client_disconnected", 499)
