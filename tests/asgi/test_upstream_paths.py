"""Security: a relayed path never leaves the upstream's base path. The proxy sends its
operator's key with every relayed request, so `GET /v1/%2e%2e/%2e%2e/admin` reaching the
upstream as `GET /admin` would be a request the operator never allowed; it is a 400."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import httpx
import orjson
import pytest
from fastapi import FastAPI
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inflight.factory import create_app
from inflight.proxy.upstream import PathOutsideUpstream, upstream_path
from tests.conftest import make_settings

pytestmark = pytest.mark.anyio

BASE = "/base/v1"
ANTHROPIC_BASE = "/anthropic/v1"
KEY = "sk-operator-0001"


def _inside(request: httpx.Request) -> bool:
    """Whether the upstream, decoding the path as often as it likes, stays under a base."""
    path = request.url.raw_path.split(b"?")[0].decode("ascii")
    for _ in range(5):
        segments = path.replace("\\", "/").split("/")
        if ".." in segments:
            return False
        path = unquote(path)
    return path in (BASE, ANTHROPIC_BASE) or path.startswith((BASE + "/", ANTHROPIC_BASE + "/"))


class Upstreams:
    def __init__(self) -> None:
        self.seen: list[httpx.Request] = []

    def transport(self) -> httpx.MockTransport:
        def handle(request: httpx.Request) -> httpx.Response:
            self.seen.append(request)
            body = httpx.ByteStream(b'{"object": "list", "data": []}')
            return httpx.Response(200, headers={"content-type": "application/json"}, stream=body)

        return httpx.MockTransport(handle)


@pytest.fixture
def upstreams() -> Upstreams:
    return Upstreams()


@pytest.fixture
async def app(tmp_path: Path, upstreams: Upstreams) -> AsyncIterator[FastAPI]:
    settings = make_settings(
        tmp_path,
        upstream_url="http://up" + BASE,
        upstream_api_key=KEY,
        anthropic_upstream_url="http://anthropic.up" + ANTHROPIC_BASE,
        anthropic_api_key=KEY,
    )
    application = create_app(settings, transport=upstreams.transport())
    async with application.router.lifespan_context(application):
        yield application


async def asgi_get(app: FastAPI, raw_path: bytes) -> tuple[int, bytes]:
    """`GET raw_path` as an ASGI server hands it over (`path` decoded once, `raw_path` as
    sent): httpx's client would normalise `/../` away before sending."""
    scope: dict[str, Any] = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
        "scheme": "http", "path": unquote(raw_path.decode("latin-1")), "raw_path": raw_path,
        "query_string": b"", "root_path": "", "headers": [(b"host", b"proxy")],
        "client": ("127.0.0.1", 1), "server": ("proxy", 80),
    }  # fmt: skip
    sent: list[dict[str, Any]] = []
    received = False

    async def receive() -> dict[str, Any]:
        nonlocal received
        if not received:
            received = True
            return {"type": "http.request", "body": b"", "more_body": False}
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, body


CLIMBING = [
    "/v1/%2e%2e/%2e%2e/x",
    "/v1/%2E%2E/%2E%2E/admin",
    "/v1/%2e%2E/x",
    "/v1/.%2e/x",
    "/v1/%2e./x",
    "/v1/..%2f..%2fadmin",
    "/v1/..%2F..%2Fadmin",
    "/v1/..%5c..%5cadmin",
    "/v1/..%5C..%5Cadmin",
    "/v1/models/%2e%2e%2f%2e%2e%2f%2e%2e%2fadmin",
    "/v1/%252e%252e/%252e%252e/x",
    "/v1/%252E%252E%252F%252E%252E%252Fx",
    "/v1/..%252f..%252fadmin",
    "/v1/%25252e%25252e/x",
    "/v1/../x",
    "/v1/./../x",
    "/v1//../../x",
    "/v1/models/../../../admin",
    "/v1/..\\..\\admin",
    "/v1/messages/%2e%2e/%2e%2e/admin",
    "/v1/messages/..%2f..%2fadmin",
    "/v1/%2e%2e",
    "/v1/..",
]


@pytest.mark.parametrize("path", CLIMBING)
async def test_a_path_that_climbs_out_is_a_400_and_never_reaches_the_upstream(
    app: FastAPI, upstreams: Upstreams, path: str
) -> None:
    status, body = await asgi_get(app, path.encode())
    assert status == 400, body
    error = orjson.loads(body)["error"]
    assert error["type"] == "invalid_request_error"
    if not path.startswith("/v1/messages/"):  # Anthropic's API has its own envelope
        assert set(error) == {"message", "type", "param", "code"}
        assert error["code"] == "invalid_path"
    assert all(_inside(r) for r in upstreams.seen), [str(r.url) for r in upstreams.seen]
    assert not [r for r in upstreams.seen if not r.url.path.endswith("/models")]


@pytest.mark.parametrize(
    ("path", "arrives"),
    [
        ("/v1/models", BASE + "/models"),
        ("/v1/./models", BASE + "/./models"),  # `.` stays where it is: inside the base
        ("/v1//models", BASE + "//models"),
        ("/v1/models/gpt-4.1", BASE + "/models/gpt-4.1"),
        ("/v1/files/a%20b", BASE + "/files/a%20b"),
        ("/v1/files/100%25", BASE + "/files/100%25"),
        ("/v1/files/a%3Fb%23c", BASE + "/files/a%3Fb%23c"),  # `?` and `#` stay in the path
        ("/v1/files/...", BASE + "/files/..."),
        ("/v1/files/..x", BASE + "/files/..x"),
        ("/v1/messages/count_tokens", ANTHROPIC_BASE + "/messages/count_tokens"),
    ],
)
async def test_a_path_inside_the_base_is_relayed_under_it(
    app: FastAPI, upstreams: Upstreams, path: str, arrives: str
) -> None:
    upstreams.seen.clear()
    status, _ = await asgi_get(app, path.encode())
    assert status == 200
    (sent,) = upstreams.seen
    raw = sent.url.raw_path.decode()
    assert raw.replace("/./", "/") == arrives.replace("/./", "/")  # httpx may drop a `.`
    assert sent.headers.get("authorization") == f"Bearer {KEY}" or sent.url.host == "anthropic.up"


async def test_the_issues_request_through_httpx_is_a_400(
    app: FastAPI, upstreams: Upstreams
) -> None:
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://proxy"
    ) as client:
        for path in ("/v1/%2e%2e/%2e%2e/x", "/v1/..%2f..%2fadmin"):
            assert (await client.get(path)).status_code == 400
    assert all(_inside(r) for r in upstreams.seen)


PIECES = ["..", ".", "%2e", "%2E", "%25", "2e", "%252e", "/", "//", "%2f", "%2F", "%5c", "\\",
          "a", "models", "%00", "?", "%3f"]  # fmt: skip


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.sampled_from(PIECES), max_size=10))
async def test_no_path_reaches_the_upstream_outside_its_base(
    app: FastAPI, upstreams: Upstreams, pieces: list[str]
) -> None:
    upstreams.seen.clear()
    path = "/v1/" + "".join(pieces).replace("?", "%3F")
    status, _ = await asgi_get(app, path.encode("latin-1"))
    assert status in (200, 400, 404, 405), status
    assert all(_inside(r) for r in upstreams.seen), [r.url.raw_path for r in upstreams.seen]


@pytest.mark.parametrize("path", ["/../x", "/%2e%2e/x", "/a/..\\..\\x", "/%252e%252e/x", "/.."])
def test_upstream_path_refuses_dot_dot_at_any_decoding(path: str) -> None:
    with pytest.raises(PathOutsideUpstream):
        upstream_path(path)


def test_upstream_path_leaves_the_compacting_routes_as_they_are() -> None:
    for path in ("/chat/completions", "/responses", "/messages", "/models/gpt-4o"):
        assert upstream_path(path) == path
