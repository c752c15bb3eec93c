"""End to end: real uvicorn servers (the proxy, a fake upstream that enforces the Responses
pairing rule and a window) driven by the official `openai` client's `responses.create`, JSON
and stream; and the llama.cpp test server's `/v1/responses` when one is configured."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest

from inflight.factory import create_app
from tests.conftest import make_settings
from tests.support.fakes import FakeUpstream, Pacing
from tests.support.fakes.responses import input_tokens
from tests.support.responses_items import pair_problems
from tests.support.servers import WatchedStore, serve

pytestmark = pytest.mark.e2e

TASK = {"role": "user", "content": "Find why the build fails and fix it."}
WINDOW = 6000


@pytest.fixture
def fake() -> FakeUpstream:
    upstream = FakeUpstream()
    upstream.context_window = WINDOW  # enforced, and what `/v1/models` tells discovery
    return upstream


@pytest.fixture
def store() -> WatchedStore:
    return WatchedStore()


@pytest.fixture
def proxy_url(tmp_path: Path, fake: FakeUpstream, store: WatchedStore) -> Iterator[str]:
    with serve(fake.app) as upstream:
        # a model the table does not know: its window comes from the upstream (discovery)
        app = create_app(make_settings(tmp_path, upstream_url=upstream + "/v1"), store=store)
        with serve(app) as url:
            yield url + "/v1"


@pytest.fixture
def oai(proxy_url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=proxy_url, api_key="sk-test", timeout=20, max_retries=0) as c:
        yield c


def test_json_answer_with_usage(oai: openai.OpenAI, fake: FakeUpstream) -> None:
    raw = oai.responses.with_raw_response.create(
        model="fake-model", instructions="Be brief.", input=[TASK]
    )
    response = raw.parse()
    assert response.output_text == "Hello there"
    assert response.usage is not None
    assert response.usage.input_tokens == input_tokens(fake.responses_requests[0].json())
    assert raw.headers["x-compaction-applied"] == "none"
    assert raw.headers["x-compaction-context-limit"] == str(WINDOW)
    assert fake.responses_requests[0].headers["authorization"] == "Bearer sk-test"


def test_stream_events_arrive_as_the_upstream_sends_them(
    oai: openai.OpenAI, fake: FakeUpstream, store: WatchedStore
) -> None:
    fake.reply_text = "first second third"
    fake.pacing = pacing = Pacing()
    stream = oai.responses.create(model="fake-model", input=[TASK], stream=True)
    events = iter(stream)
    try:
        seen = []
        for event in events:
            seen.append(event.type)
            if event.type == "response.output_text.delta":
                assert event.delta == "first"
                assert not pacing.release.is_set()  # the upstream still holds the rest
                break
    finally:
        pacing.release.set()
    rest = list(events)
    assert seen[:2] == ["response.created", "response.in_progress"]
    text = "".join(e.delta for e in rest if e.type == "response.output_text.delta")
    assert text == " second third"
    completed = rest[-1]
    assert completed.type == "response.completed"
    assert completed.response.usage is not None
    [record] = store.wait_for(1)
    assert record.route == "/v1/responses"
    assert record.stream
    assert record.prompt_tokens == completed.response.usage.input_tokens


def _tool_loop(oai: openai.OpenAI, fake: FakeUpstream, stream: bool) -> list[Any]:
    """An agent session: each turn the model calls `bash`, the client runs it and sends the
    whole history back with the output (as the Agents SDK does with `store=False`)."""
    history: list[Any] = [TASK]
    headers = []
    for turn in range(14):
        fake.function_calls = [
            {"id": f"fc_{turn}", "call_id": f"call_{turn % 2}", "name": "bash",
             "arguments": orjson.dumps({"cmd": f"make step{turn}"}).decode()}
        ]  # fmt: skip
        if stream:
            with oai.responses.with_streaming_response.create(
                model="fake-model", input=history, stream=True, store=False
            ) as raw:
                headers.append(raw.headers)
                events = list(raw.parse())
            output = events[-1].response.output
        else:
            raw_json = oai.responses.with_raw_response.create(
                model="fake-model", input=history, store=False
            )
            headers.append(raw_json.headers)
            output = raw_json.parse().output
        [call] = output
        assert call.type == "function_call"
        history.append(call.model_dump(exclude_none=True))
        history.append(
            {"type": "function_call_output", "call_id": call.call_id,
             "output": f"step {turn}: " + "log line\n" * 160}
        )  # fmt: skip
    return headers


@pytest.mark.parametrize("stream", [False, True])
def test_a_long_tool_session_stays_inside_the_window(
    oai: openai.OpenAI, fake: FakeUpstream, stream: bool
) -> None:
    headers = _tool_loop(oai, fake, stream)
    assert fake.rejected == []  # never over the window, never a broken pair
    applied = [h["x-compaction-applied"] for h in headers]
    assert any(a != "none" for a in applied), applied
    assert fake.max_prompt_seen <= WINDOW
    # summaries of a Responses request are asked on /v1/responses too (DESIGN.md §12)
    requests = [r.json() for r in fake.responses_requests]
    sent = [body for body in requests if "<transcript>" not in orjson.dumps(body["input"]).decode()]
    assert len(sent) == 14
    assert all(pair_problems(body["input"]) == [] for body in sent)
    assert all(body["input"][0] == TASK for body in sent)
    assert input_tokens({"input": [TASK]}) > 0


def test_an_overflow_is_retried_once_before_any_byte(
    oai: openai.OpenAI, fake: FakeUpstream
) -> None:
    """The upstream admits less than it advertises and says only that the input is too long
    (the Responses API's error): the proxy compacts what it sent and retries, once."""
    fake.advertised_window = 32_000
    history: list[Any] = [TASK]
    for turn in range(8):
        history += [
            {"type": "function_call", "call_id": f"c{turn}", "name": "bash", "arguments": "{}"},
            {"type": "function_call_output", "call_id": f"c{turn}", "output": "x " * 1200},
        ]
    assert input_tokens({"input": history}) > WINDOW
    response = oai.responses.create(model="fake-model", input=history)
    assert response.output_text == "Hello there"
    assert len(fake.rejected) == 1
    assert len(fake.responses_requests) == 2


LLM = os.environ.get("INFLIGHT_TEST_LLM_URL")


def _serves_responses(url: str) -> bool:
    try:
        reply = httpx.post(
            url + "/responses",
            json={"model": "x", "input": "hi", "max_output_tokens": 1},
            timeout=300,
        )
    except httpx.HTTPError:
        return False
    return reply.status_code == 200


@pytest.mark.llm
@pytest.mark.timeout(600)  # a shared server with one slot: other requests may be ahead of ours
@pytest.mark.skipif(not LLM, reason="INFLIGHT_TEST_LLM_URL is not set (no local model server)")
def test_llama_cpp_responses_end_to_end(tmp_path: Path) -> None:
    """The real server: tool rounds over its 4,096-token window (discovered from it) compacted
    before they are sent, JSON and stream, usage recorded from what the server reports. A low
    threshold and target keep the prompt it must process small."""
    assert LLM is not None
    if not _serves_responses(LLM):
        pytest.skip(f"{LLM} does not implement /v1/responses")
    store = WatchedStore()
    app = create_app(make_settings(tmp_path, upstream_url=LLM), store=store)
    history: list[Any] = [{"role": "user", "content": "Which file failed? Answer in one word."}]
    for turn in range(6):
        history += [
            {"type": "function_call", "call_id": f"c{turn}", "name": "bash",
             "arguments": orjson.dumps({"cmd": f"cat log{turn}"}).decode()},
            {"type": "function_call_output", "call_id": f"c{turn}",
             "output": f"log {turn}: " + "compiling module ok\n" * 120},
        ]  # fmt: skip
    # no summary calls: the shared server has one slow slot
    low = {
        "X-Compaction-Threshold": "0.5",
        "X-Compaction-Target": "0.2",
        "X-Compaction-Strategy": "truncate,prune,trim",
    }
    with (
        serve(app) as url,
        openai.OpenAI(base_url=url + "/v1", api_key="x", timeout=500, default_headers=low) as c,
    ):
        raw = c.responses.with_raw_response.create(model="qwen", input=history, max_output_tokens=8)
        assert raw.headers["x-compaction-applied"] != "none"
        assert raw.headers["x-compaction-context-limit"] == "4096"
        response = raw.parse()
        assert response.usage is not None
        assert response.usage.input_tokens < 2048
        events = list(
            c.responses.create(model="qwen", input=history, max_output_tokens=8, stream=True)
        )
        assert events[-1].type == "response.completed"
    records = [r for r in store.wait_for(2, timeout=30) if r.kind == "chat"]
    assert [r.route for r in records] == ["/v1/responses", "/v1/responses"]
    assert all(r.prompt_tokens and r.prompt_tokens < 4096 for r in records)
