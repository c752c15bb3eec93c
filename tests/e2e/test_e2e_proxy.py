"""End-to-end: real uvicorn servers (proxy and fake upstream), the official `openai` client."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from inflight.factory import create_app
from tests.conftest import make_settings
from tests.support.fakes import FakeUpstream, Pacing
from tests.support.servers import WatchedStore, serve

pytestmark = pytest.mark.e2e

MESSAGES = [{"role": "user", "content": "Say hello"}]


@pytest.fixture
def upstream_url(fake: FakeUpstream) -> Iterator[str]:
    with serve(fake.app) as url:
        yield url + "/v1"


@pytest.fixture
def proxy_url(tmp_path: Path, upstream_url: str) -> Iterator[str]:
    app = create_app(make_settings(tmp_path, upstream_url=upstream_url))
    with serve(app) as url:
        yield url + "/v1"


@pytest.fixture
def oai(proxy_url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=proxy_url, api_key="sk-test", timeout=20, max_retries=0) as c:
        yield c


def test_non_streaming(oai: openai.OpenAI, fake: FakeUpstream) -> None:
    result = oai.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)  # type: ignore[arg-type]
    assert result.choices[0].message.content == "Hello there"
    assert result.usage is not None
    assert result.usage.prompt_tokens == 11
    assert fake.chat_requests[0].headers["authorization"] == "Bearer sk-test"


def test_stream_without_usage_hides_the_usage_chunk_it_asked_for(
    oai: openai.OpenAI, fake: FakeUpstream
) -> None:
    fake.reply_text = "one two three"
    chunks = list(
        oai.chat.completions.create(model="m", messages=MESSAGES, stream=True)  # type: ignore[arg-type]
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "one two three"
    assert all(c.choices for c in chunks), "the usage-only chunk reached a client that did not ask"
    assert fake.chat_requests[0].json()["stream_options"] == {"include_usage": True}


def test_stream_with_usage_keeps_it(oai: openai.OpenAI) -> None:
    chunks = list(
        oai.chat.completions.create(
            model="m",
            messages=MESSAGES,  # type: ignore[arg-type]
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.prompt_tokens == 11


def test_tool_calls_in_the_response(oai: openai.OpenAI, fake: FakeUpstream) -> None:
    fake.tool_calls = [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        }
    ]
    result = oai.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    calls = result.choices[0].message.tool_calls
    assert calls is not None
    assert calls[0].function.name == "get_weather"
    streamed = list(oai.chat.completions.create(model="m", messages=MESSAGES, stream=True))  # type: ignore[arg-type]
    deltas = [c.choices[0].delta.tool_calls for c in streamed if c.choices]
    names = [t.function.name for d in deltas if d for t in d if t.function]
    assert names == ["get_weather"]


def test_first_chunk_arrives_while_upstream_holds_the_second(
    oai: openai.OpenAI, fake: FakeUpstream
) -> None:
    fake.reply_text = "first second third"
    fake.pacing = pacing = Pacing()
    stream = oai.chat.completions.create(model="m", messages=MESSAGES, stream=True)  # type: ignore[arg-type]
    try:
        first = next(iter(stream))
        assert first.choices[0].delta.content == "first"
        assert not pacing.release.is_set()  # the upstream is still holding the rest
    finally:
        pacing.release.set()
    rest = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert rest == " second third"


def test_client_disconnect_mid_stream_closes_the_upstream(
    proxy_url: str, fake: FakeUpstream
) -> None:
    fake.reply_text = "first second"
    fake.pacing = pacing = Pacing()
    body = {"model": "m", "messages": MESSAGES, "stream": True}
    with (
        httpx.Client(timeout=10) as c,
        c.stream("POST", proxy_url + "/chat/completions", json=body) as r,
    ):
        first = next(r.iter_raw())
        assert b"first" in first
    # The client hung up while the upstream was still holding its second chunk.
    assert pacing.closed.wait(10), "upstream response was not closed after the client left"
    assert not pacing.release.is_set()


def test_upstream_breaking_mid_stream_ends_with_an_sse_error(
    proxy_url: str, fake: FakeUpstream
) -> None:
    fake.reply_text = "first second"
    fake.break_stream_after_first = True
    body = {"model": "m", "messages": MESSAGES, "stream": True}
    with httpx.Client(timeout=10) as c:
        response = c.post(proxy_url + "/chat/completions", json=body)
    assert response.status_code == 200
    assert b"first" in response.content
    assert response.content.rstrip().endswith(b"}")
    assert b"event: error" in response.content
    assert b"upstream_unavailable" in response.content


def test_passthrough_models(oai: openai.OpenAI) -> None:
    assert [m.id for m in oai.models.list()] == ["fake-model"]


def test_stream_delivered_to_the_end_is_completed_though_the_upstream_lingers(
    tmp_path: Path, upstream_url: str, fake: FakeUpstream
) -> None:
    """The SDK hangs up right after `data: [DONE]`; the upstream closes 0.5 s later."""
    fake.linger_after_done = 0.5
    fake.reply_text = "one two"
    store = WatchedStore()
    app = create_app(make_settings(tmp_path, upstream_url=upstream_url), store=store)
    with (
        serve(app) as url,
        openai.OpenAI(base_url=url + "/v1", api_key="sk", timeout=20, max_retries=0) as oai,
    ):
        chunks = list(oai.chat.completions.create(model="m", messages=MESSAGES, stream=True))  # type: ignore[arg-type]
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "one two"
        (record,) = store.wait_for(1)
    assert record.outcome == "completed"
    assert record.prompt_tokens == 11
