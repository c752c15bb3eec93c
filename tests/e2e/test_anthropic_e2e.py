"""End to end: real uvicorn servers (the proxy, a fake Anthropic upstream that enforces the
Messages rules and a window) driven by the official `anthropic` SDK, JSON and stream; and the
llama.cpp test server's `/v1/messages` when one is configured."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from inflight.factory import create_app
from inflight.usage.records import UsageRecord
from tests.conftest import make_settings
from tests.support import load_traces
from tests.support.anthropic_conversations import from_chat
from tests.support.fakes import FakeUpstream
from tests.support.fakes.anthropic import all_blocks, prompt_tokens, rule_violations
from tests.support.servers import WatchedStore, serve

pytestmark = pytest.mark.e2e

MODEL = "claude-sonnet-4-6"  # (the SDK warns on deprecated names)
WINDOW = 12_000  # the fake's own window (its count: a token per 4 bytes of JSON)


@pytest.fixture
def fake() -> FakeUpstream:
    return FakeUpstream(context_window=WINDOW, cached_tokens=300, cache_write_tokens=40)


@pytest.fixture
def store() -> WatchedStore:
    return WatchedStore()


@pytest.fixture
def proxy_url(tmp_path: Path, fake: FakeUpstream, store: WatchedStore) -> Iterator[str]:
    with serve(fake.app) as upstream:
        settings = make_settings(tmp_path, anthropic_upstream_url=upstream + "/v1")
        with serve(create_app(settings, store=store)) as url:
            yield url


@pytest.fixture
def claude(proxy_url: str) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(
        base_url=proxy_url, api_key="sk-ant-test", timeout=20, max_retries=0
    ) as client:
        yield client


def client_record(store: WatchedStore) -> UsageRecord:
    """The usage record of the client's request (summary calls have their own)."""
    store.wait_for(1)
    (record,) = [r for r in store.records if r.kind == "chat"]
    return record


def session() -> dict[str, Any]:
    """A real agent transcript as Claude Code would send it, far over the fake's window."""
    _, chat = load_traces()[2]
    return from_chat(chat, MODEL)


def test_json_answer_of_a_compacted_session(
    claude: anthropic.Anthropic, fake: FakeUpstream, store: WatchedStore
) -> None:
    body = session()
    raw = claude.messages.with_raw_response.create(
        model=MODEL,
        max_tokens=1024,
        system=body["system"],
        messages=body["messages"],
        extra_headers={"x-compaction-context-limit": str(WINDOW // 2)},
    )
    message = raw.parse()
    assert message.content[0].type == "text"
    assert message.content[0].text == "Hello from Claude"
    assert raw.headers["x-compaction-applied"] != "none"
    (sent,) = fake.messages_requests  # accepted at once (a summary call may have been refused)
    assert prompt_tokens(sent.json()) <= WINDOW
    assert rule_violations(sent.json()) == []
    # the SDK's credential, forwarded (x-api-key, or `Authorization: Bearer` in newer SDKs)
    credential = sent.headers.get("x-api-key") or sent.headers.get("authorization", "")
    assert credential.removeprefix("Bearer ") == "sk-ant-test"
    assert sent.headers["anthropic-version"]  # the SDK's, forwarded
    marked = [b for b in all_blocks(sent.json()) if b.get("cache_control")]
    assert len(marked) == 2  # Claude Code's two breakpoints, kept or moved, none added
    assert message.usage.cache_read_input_tokens == 300
    record = client_record(store)
    assert record.route == "/v1/messages"
    assert record.cached_tokens == 300
    assert record.cache_write_tokens == 40
    assert record.prompt_tokens == (
        message.usage.input_tokens
        + (message.usage.cache_read_input_tokens or 0)
        + (message.usage.cache_creation_input_tokens or 0)
    )


def test_stream_of_a_session_the_upstream_first_refuses(
    claude: anthropic.Anthropic, fake: FakeUpstream, store: WatchedStore
) -> None:
    """No window header: the table's 200k is wrong for this upstream, whose overflow error
    teaches the window; the proxy compacts and retries before any byte reaches the SDK."""
    body = session()
    with claude.messages.stream(
        model=MODEL, max_tokens=1024, system=body["system"], messages=body["messages"]
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "Hello from Claude"
    assert final.usage.output_tokens == 3
    _, retry = fake.messages_requests
    assert fake.rejected[0].startswith("prompt is too long")
    assert rule_violations(retry.json()) == []
    record = client_record(store)
    assert record.stream
    assert record.outcome == "completed"
    assert (record.cached_tokens, record.cache_write_tokens) == (300, 40)
    assert record.context_limit == WINDOW


def test_count_tokens_through_the_sdk(claude: anthropic.Anthropic) -> None:
    counted = claude.messages.count_tokens(
        model=MODEL, messages=[{"role": "user", "content": "Hello"}]
    )
    assert counted.input_tokens > 0


def test_errors_reach_the_sdk_as_anthropic_errors(proxy_url: str, tmp_path: Path) -> None:
    settings = make_settings(
        tmp_path, anthropic_upstream_url="http://127.0.0.1:9/v1", api_keys="proxy-key"
    )
    with serve(create_app(settings)) as url:
        for key, error in (("wrong", anthropic.AuthenticationError), ("proxy-key", None)):
            with anthropic.Anthropic(base_url=url, api_key=key, timeout=20, max_retries=0) as c:
                expected = error or anthropic.InternalServerError  # 502: nothing listens
                with pytest.raises(expected) as caught:
                    c.messages.create(
                        model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "Hi"}]
                    )
                assert caught.value.body["type"] == "error"  # type: ignore[index]


LLM_URL = os.environ.get("INFLIGHT_TEST_LLM_URL")


def _serves_messages(url: str) -> bool:
    """Whether the server has a `/v1/messages` route: an empty body is answered at once with a
    400 where it does and a 404 where it does not (no generation, the slot stays free)."""
    try:
        return httpx.post(url + "/messages", json={}, timeout=30).status_code != 404
    except httpx.HTTPError:
        return False


@pytest.mark.llm
@pytest.mark.timeout(300)  # a shared server with one slow slot
@pytest.mark.skipif(not LLM_URL, reason="INFLIGHT_TEST_LLM_URL is not set")
def test_llamacpp_messages_end_to_end(tmp_path: Path, store: WatchedStore) -> None:
    """The llama.cpp server's own `/v1/messages`, through the proxy, JSON and stream, with a
    conversation compacted to its real window (discovered from the server)."""
    assert LLM_URL is not None
    if not _serves_messages(LLM_URL):
        pytest.skip(f"{LLM_URL} does not implement /v1/messages")
    settings = make_settings(tmp_path, anthropic_upstream_url=LLM_URL)
    _, chat = load_traces()[0]
    body = from_chat(chat[:40], "qwen")
    with (
        serve(create_app(settings, store=store)) as url,
        anthropic.Anthropic(base_url=url, api_key="none", timeout=300, max_retries=0) as claude,
    ):
        raw = claude.messages.with_raw_response.create(
            model="qwen",
            max_tokens=16,
            system=body["system"],
            messages=body["messages"],
            # no summary calls: the shared server has one slow slot
            extra_headers={"x-compaction-strategy": "truncate,prune,trim"},
        )
        message = raw.parse()
        # a 0.5B model may stop at once (empty content): what must hold is a whole answer
        assert message.stop_reason in ("end_turn", "max_tokens")
        assert message.usage.output_tokens >= 1
        assert raw.headers["x-compaction-applied"] != "none"
        assert int(raw.headers["x-compaction-context-limit"]) == 4096
        with claude.messages.stream(
            model="qwen", max_tokens=8, messages=[{"role": "user", "content": "Say hi"}]
        ) as stream:
            text = "".join(stream.text_stream)
        assert text
    first, second = store.wait_for(2)
    assert first.prompt_tokens is not None
    assert first.prompt_tokens <= 4096
    assert second.stream
