"""Hostile input and secrets: fuzzed bodies and headers always get an OpenAI-shaped 4xx or a
correct relay; every field the adapters read, set to a value of any JSON type on every route
(restore and streaming on and off), gets the upstream's answer or a 400 in the route's
envelope; keys never leak into logs, errors, /stats or /metrics; nothing a client sends can
redirect the upstream."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inflight.factory import create_app
from tests.conftest import make_settings
from tests.support.fakes import FakeUpstream
from tests.support.hostile_fields import SWITCHES, Case, Route, cases, fuzzed_proxy, problem, send

pytestmark = pytest.mark.anyio

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=50),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5)
    ),
    max_leaves=30,
)
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system", "tool", "bogus", 7])},
    optional={"content": JSON, "tool_calls": JSON, "tool_call_id": JSON, "name": JSON},
)
BODY = st.one_of(
    JSON,
    st.fixed_dictionaries(
        {
            "model": st.one_of(st.text(max_size=20), JSON),
            "messages": st.one_of(st.lists(MESSAGE, max_size=8), JSON),
        },
        optional={
            "stream": JSON,
            "compaction": JSON,
            "transforms": JSON,
            "max_tokens": JSON,
            "tools": JSON,
        },
    ),
)
ITEM = st.one_of(
    JSON,
    st.fixed_dictionaries(
        {},
        optional={
            "type": st.sampled_from(
                ["message", "function_call", "function_call_output", "reasoning", "custom_tool_call",
                 "custom_tool_call_output", "local_shell_call", "local_shell_call_output",
                 "computer_call_output", "mcp_approval_response", "compaction", "web_search_call",
                 "image_generation_call", "bogus", 7]
            ),
            "role": st.sampled_from(["user", "assistant", "system", "developer", "tool", 7]),
            "call_id": st.one_of(st.sampled_from(["a", "b", None]), JSON),
            **dict.fromkeys(
                ("content", "output", "arguments", "input", "name", "id", "summary", "action", "result"),
                JSON,
            ),
        },
    ),
)  # fmt: skip
RESPONSES_BODY = st.one_of(
    JSON,
    st.fixed_dictionaries(
        {"model": st.one_of(st.text(max_size=20), JSON), "input": st.one_of(st.lists(ITEM, max_size=8), JSON)},
        optional=dict.fromkeys(
            ("stream", "instructions", "previous_response_id", "max_output_tokens", "tools", "text",
             "compaction"),
            JSON,
        ),
    ),
)  # fmt: skip
HEADER_VALUE = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=30)
HEADERS = st.dictionaries(
    st.sampled_from(
        ["X-Compaction-Strategy", "X-Compaction-Context-Limit", "X-Compaction-Threshold",
         "X-Compaction-Target", "X-Compaction-Summary-Model", "X-Compaction-Other", "Content-Type"]
    ),
    HEADER_VALUE,
    max_size=3,
)  # fmt: skip

KEY = "sk-proxy-secret-123"
UPSTREAM_KEY = "sk-upstream-secret-456"


@pytest.fixture
async def guarded(tmp_path: Path, fake: FakeUpstream) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(
        make_settings(tmp_path, api_keys=KEY, upstream_api_key=UPSTREAM_KEY),
        transport=httpx.ASGITransport(app=fake.app),
    )
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app),
            base_url="http://proxy",
            headers={"authorization": f"Bearer {KEY}"},
        ) as client,
    ):
        yield client


def check_response(response: httpx.Response) -> None:
    assert response.status_code != 500, response.text
    if response.status_code >= 400:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
    assert KEY not in response.text
    assert UPSTREAM_KEY not in response.text


@pytest.mark.parametrize(
    "path", ["/v1/chat/completions", "/v1/compaction/preview", "/v1/compaction/count"]
)
@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(body=BODY, headers=HEADERS)
async def test_fuzzed_bodies_and_headers(
    guarded: httpx.AsyncClient, path: str, body: Any, headers: dict[str, str]
) -> None:
    response = await guarded.post(path, content=orjson.dumps(body), headers=headers)
    check_response(response)


@pytest.mark.parametrize("path", ["/v1/responses", "/v1/compaction/preview"])
@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    body=RESPONSES_BODY,
    headers=HEADERS,
    limit=st.sampled_from([None, "256", "2048"]),
    form=st.sampled_from([None, "responses", "chat", "bogus"]),
)
async def test_fuzzed_responses_bodies(
    guarded: httpx.AsyncClient,
    path: str,
    body: Any,
    headers: dict[str, str],
    limit: str | None,
    form: str | None,
) -> None:
    """Responses API bodies (items of every type, malformed ones, tiny windows that force
    compaction): an OpenAI-shaped 4xx or a relay, never a 500."""
    if limit is not None:
        headers = {**headers, "X-Compaction-Context-Limit": limit}
    if form is not None and path != "/v1/responses":
        headers = {**headers, "X-Compaction-Format": form}
    response = await guarded.post(path, content=orjson.dumps(body), headers=headers)
    check_response(response)


@pytest.mark.parametrize("path", ["/v1/compaction/preview", "/v1/compaction/count"])
@pytest.mark.parametrize("kind", [["tool_use"], {"tool_use": 1}, [], 3])
async def test_a_block_type_that_is_not_a_string_is_never_a_500(
    guarded: httpx.AsyncClient, path: str, kind: Any
) -> None:
    """The format detection read a content block's `type` as a set member: a list or an
    object there raised TypeError (found by the fuzzer above)."""
    body = {"model": "m", "messages": [{"role": "user", "content": [{"type": kind}]}]}
    check_response(await guarded.post(path, content=orjson.dumps(body)))


@pytest.mark.parametrize(("route", "restore", "stream"), SWITCHES)
@settings(
    max_examples=25,  # ~5 s for the twelve; `python -m bench.fuzz_fields` runs longer
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
async def test_hostile_fields_get_the_upstreams_answer_or_a_400(
    tmp_path: Path, route: Route, restore: bool, stream: bool, data: st.DataObject
) -> None:
    """A well-formed request of each API with fields (top level, or in a message, item, part,
    tool call or tool) set to null, a number, a string, an object, an array, a boolean or a
    huge int, compacted at a small window: never a 500."""
    case = data.draw(cases(route, restore, stream))
    async with fuzzed_proxy(tmp_path) as client:
        response = await send(client, case)
    assert problem(case, response) is None, (problem(case, response), case)


@pytest.mark.parametrize("call_id", [{"id": "c1"}, ["c1"], {}, []])
async def test_a_tool_call_id_of_another_type_is_forwarded(tmp_path: Path, call_id: Any) -> None:
    """A chat tool message whose `tool_call_id` is an object or an array, in a request that is
    compacted (and ledgered): forwarded, where the ledger's cuts raised TypeError (a 500)."""
    messages = [
        {"role": "user", "content": "hi " * 200},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": call_id, "content": "x " * 3000},
        {"role": "user", "content": "go " * 100},
    ]  # fmt: skip
    case = Case("/v1/chat/completions", {"model": "gpt-4o", "messages": messages}, False, False,
                2048)  # fmt: skip
    async with fuzzed_proxy(tmp_path) as client:
        response = await send(client, case)
    assert problem(case, response) is None
    assert response.headers["x-compaction-applied"] != "none"


@pytest.mark.parametrize(
    "raw",
    [b"", b"\xff\xfe\x00garbage", b"{" * 10000, b'{"model": "m", "messages": [' + b"[" * 5000 + b"]}",
     b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}', b"null", b"[]"],
)  # fmt: skip
async def test_malformed_json_is_400(guarded: httpx.AsyncClient, raw: bytes) -> None:
    response = await guarded.post("/v1/chat/completions", content=raw)
    check_response(response)
    assert response.status_code == 400


async def test_thousands_of_messages_and_huge_strings(
    guarded: httpx.AsyncClient, fake: FakeUpstream
) -> None:
    many = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"} for i in range(5001)
    ]
    response = await guarded.post(
        "/v1/chat/completions", json={"model": "gpt-4o", "messages": many}
    )
    check_response(response)
    assert response.status_code == 200
    huge = [{"role": "user", "content": "x" * 5_000_000}]
    response = await guarded.post(
        "/v1/chat/completions",
        json={"model": "gpt-4o", "messages": huge},
        headers={"X-Compaction-Context-Limit": "8192"},
    )
    check_response(response)
    assert response.headers["x-compaction-over-budget"] == "true"


async def test_keys_never_reach_logs_errors_stats_or_metrics(
    guarded: httpx.AsyncClient, caplog: pytest.LogCaptureFixture, fake: FakeUpstream
) -> None:
    caplog.set_level(logging.DEBUG)
    await guarded.post(
        "/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    )
    bad = await guarded.post(
        "/v1/chat/completions", content=b"{", headers={"authorization": "Bearer sk-wrong-key-789"}
    )
    fake.summary_failure = "status"
    await guarded.post(
        "/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "x"}]}
    )
    stats = await guarded.get("/stats")
    metrics = await guarded.get("/metrics")
    for text in (bad.text, stats.text, metrics.text, caplog.text):
        for secret in (KEY, UPSTREAM_KEY, "sk-wrong-key-789"):
            assert secret not in text
    assert fake.chat_requests[0].headers["authorization"] == f"Bearer {UPSTREAM_KEY}"


async def test_stats_and_metrics_require_a_key(guarded: httpx.AsyncClient) -> None:
    for path in ("/stats", "/metrics"):
        response = await guarded.get(path, headers={"authorization": ""})
        assert response.status_code == 401
        assert (await guarded.get(path)).status_code == 200
    assert (await guarded.get("/healthz", headers={"authorization": ""})).status_code == 200


async def test_nothing_in_a_request_changes_the_upstream(
    guarded: httpx.AsyncClient, fake: FakeUpstream
) -> None:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "base_url": "http://evil.test/v1",
        "api_base": "http://evil.test/v1",
        "compaction": {"strategy": "none"},
    }
    headers = {
        "Host": "evil.test",
        "X-Forwarded-Host": "evil.test",
        "X-Upstream-Url": "http://evil.test",
    }
    response = await guarded.post("/v1/chat/completions", json=body, headers=headers)
    assert response.status_code == 200
    assert (
        len(fake.chat_requests) == 1
    )  # it reached the configured upstream (the fake), not evil.test
    bad = await guarded.post(
        "/v1/chat/completions", json={**body, "compaction": {"upstream": "http://evil.test"}}
    )
    assert bad.status_code == 400


async def test_an_upstream_cookie_goes_to_its_client_only(
    client: httpx.AsyncClient, fake: FakeUpstream
) -> None:
    """The pooled upstream client is shared by every client: a `Set-Cookie` from upstream is
    relayed to the client that got it and never replayed upstream for anyone else."""
    first = await client.get("/v1/files")
    assert first.headers["set-cookie"] == "a=1"
    for path in ("/v1/other", "/v1/chat/completions"):
        client.cookies.clear()  # another client, with no cookies of its own
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        await client.post(path, json=body)
        assert fake.requests[-1].path == path
        assert "cookie" not in fake.requests[-1].headers
