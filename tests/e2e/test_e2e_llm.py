"""End-to-end against a real llama.cpp server (../shared/local-llm), through a real proxy."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from inflight.factory import create_app
from tests.conftest import make_settings
from tests.support.servers import serve

LLM_URL = os.environ.get("INFLIGHT_TEST_LLM_URL")
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.llm,
    pytest.mark.skipif(
        not LLM_URL,
        reason="INFLIGHT_TEST_LLM_URL is unset (start ../shared/local-llm/start.sh and export it)",
    ),
]
MODEL = "qwen2.5-coder-0.5b-instruct"
MESSAGES = [{"role": "user", "content": "Reply with the single word: pong"}]


@pytest.fixture(scope="module")
def proxy_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    assert LLM_URL is not None
    tmp = tmp_path_factory.mktemp("llm")
    # ~100 prompt tokens/s on 2 cores: a cold summary of a long conversation takes minutes.
    # These tests wait for their summaries (bounded by the deadline: then none stands in), so
    # no background summary of theirs outlives them on the shared one-slot server; summaries
    # in the background are tests/e2e/test_e2e_llm_summaries.py's.
    app = create_app(
        make_settings(tmp, upstream_url=LLM_URL, summary_timeout=60, summary_wait=True)
    )
    with serve(app) as url:
        yield url + "/v1"


@pytest.fixture
def oai(proxy_url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=proxy_url, api_key="none", timeout=110, max_retries=0) as c:
        yield c


def test_non_streaming_through_the_proxy(oai: openai.OpenAI) -> None:
    result = oai.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=8,
        temperature=0,  # type: ignore[arg-type]
    )
    assert result.choices[0].message.content
    assert result.usage is not None
    assert result.usage.prompt_tokens > 5


def test_streaming_without_usage(oai: openai.OpenAI) -> None:
    chunks = list(
        oai.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            max_tokens=8,
            temperature=0,
            stream=True,  # type: ignore[arg-type]
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert all(c.usage is None for c in chunks)


def test_streaming_with_usage(oai: openai.OpenAI) -> None:
    chunks = list(
        oai.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,  # type: ignore[arg-type]
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.prompt_tokens > 5


def test_models_passthrough(oai: openai.OpenAI) -> None:
    assert MODEL in [m.id for m in oai.models.list()]


def _long_conversation(turns: int) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": "You are a helpful assistant. Answer in one word."}]
    for k in range(turns):
        messages.append(
            {
                "role": "user",
                "content": f"Note {k}: the build log line {k} says "
                + " ".join(f"step{k}_{j} passed in {j}ms;" for j in range(25)),
            }
        )
        messages.append({"role": "assistant", "content": f"Noted {k}."})
    messages.append({"role": "user", "content": "Reply with the single word: done"})
    return messages


def test_conversation_over_the_window_fails_direct_but_works_through_the_proxy(
    oai: openai.OpenAI,
) -> None:
    assert LLM_URL is not None
    messages = _long_conversation(40)
    direct = openai.OpenAI(base_url=LLM_URL, api_key="none", timeout=60, max_retries=0)
    with direct, pytest.raises(openai.BadRequestError):
        direct.chat.completions.create(model=MODEL, messages=messages, max_tokens=8)  # type: ignore[arg-type]
    raw = oai.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=messages,
        max_tokens=8,
        temperature=0,  # type: ignore[arg-type]
    )
    result = raw.parse()
    assert result.choices[0].message.content is not None
    assert raw.headers["x-compaction-applied"] != "none"
    assert raw.headers["x-compaction-context-limit"] == "4096"
    assert result.usage is not None
    assert result.usage.prompt_tokens <= 4096


def test_summarize_with_the_real_model(oai: openai.OpenAI) -> None:
    """A summary written by the real model replaces the oldest turns (small window: fast)."""
    messages = _long_conversation(8)
    raw = oai.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=messages,  # type: ignore[arg-type]
        max_tokens=8,
        temperature=0,
        extra_headers={"X-Compaction-Strategy": "summarize", "X-Compaction-Context-Limit": "1200"},
        timeout=110,
    )
    assert raw.parse().choices[0].message.content is not None
    assert raw.headers["x-compaction-applied"] == "summarize", raw.headers.get(
        "x-compaction-summary-fallback"
    )
    assert int(raw.headers["x-compaction-summary-calls"]) >= 1
    assert int(raw.headers["x-compaction-tokens-after"]) < int(
        raw.headers["x-compaction-tokens-before"]
    )


def _tool_conversation(rounds: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. Use the tools."},
        {"role": "user", "content": "Find why test_parser fails and reply with one word."},
    ]
    for i in range(rounds):
        calls = [
            {
                "id": f"call_{i}_{j}",
                "type": "function",
                "function": {"name": "run", "arguments": f'{{"cmd": "pytest -k case{i}_{j}"}}'},
            }
            for j in range(2)  # parallel calls: one unit with both answers
        ]
        messages.append({"role": "assistant", "content": None, "tool_calls": calls})
        for call in calls:
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": call["id"],
                    "content": f"{call['id']}: " + " ".join(f"line {n} ok;" for n in range(60)),
                }
            )
    messages.append({"role": "user", "content": "Reply with the single word: done"})
    return messages


def test_tool_conversation_over_the_window_passes_the_real_chat_template(
    oai: openai.OpenAI,
) -> None:
    """Tool calls and their results, parallel ones included, compacted pair-safely: the real
    server's chat template accepts what the proxy forwards, within the window."""
    assert LLM_URL is not None
    messages = _tool_conversation(16)
    tools = [
        {
            "type": "function",
            "function": {
                "name": "run",
                "description": "Run a shell command",
                "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
            },
        }
    ]
    direct = openai.OpenAI(base_url=LLM_URL, api_key="none", timeout=60, max_retries=0)
    with direct, pytest.raises(openai.BadRequestError):
        direct.chat.completions.create(model=MODEL, messages=messages, tools=tools, max_tokens=8)  # type: ignore[arg-type]
    raw = oai.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=messages,  # type: ignore[arg-type]
        tools=tools,  # type: ignore[arg-type]
        max_tokens=8,
        temperature=0,
        extra_headers={"X-Compaction-Strategy": "truncate,prune,trim"},
    )
    result = raw.parse()
    assert result.usage is not None
    assert result.usage.prompt_tokens <= 4096
    assert {"prune", "trim"} & set(raw.headers["x-compaction-applied"].split(","))
    assert int(raw.headers["x-compaction-messages-after"]) < len(messages)


_QUESTIONS = [
    "Reply with the single word: pong",
    "Here is a function: def add(a, b): return a + b. It is called with two strings and "
    "returns their concatenation instead of failing. Is that a bug? Answer yes or no.",
    "Our nightly build log shows: step compile passed in 41s; step lint passed in 9s; step "
    "test failed after 113s with 3 errors in parser_test.py (lines 18, 77 and 102); step "
    "package skipped. Which step failed? Answer in one word.",
    "Translate to French and reply with the translation only: the meeting moved to Thursday "
    "at ten because the projector in room four is broken again.",
    "List the prime numbers below 30 separated by commas, and nothing else: 2, 3, 5, ...",
]


def _server_count(client: httpx.Client, body: dict[str, Any]) -> int:
    """The server's own prompt count for a chat body: its chat template, then its tokenizer
    (what it reports as `usage.prompt_tokens`, without running the model)."""
    root = (LLM_URL or "").removesuffix("/v1")
    prompt = client.post(root + "/apply-template", json=body).json()["prompt"]
    tokens = client.post(root + "/tokenize", json={"content": prompt, "parse_special": True})
    return len(tokens.json()["tokens"])


@pytest.mark.timeout(300)  # ~2,000 prompt tokens to process on a shared, slow server
def test_calibration_after_short_and_long_requests_matches_the_server(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """After a mix of short requests (mostly chat-template overhead: Qwen's default system
    prompt, role markers) and long ones through the proxy, `/v1/compaction/count` for a
    ~3,000-token conversation is within 5 % of what the server counts for the same body. A
    single multiplicative factor learned on the short ones overshot by 14 %."""
    assert LLM_URL is not None
    settings = make_settings(tmp_path_factory.mktemp("calibration"), upstream_url=LLM_URL)
    long_body = {"model": MODEL, "messages": _long_conversation(10), "max_tokens": 1}
    shorts = [[{"role": "user", "content": q}] for q in _QUESTIONS]
    longs = [_long_conversation(2), _long_conversation(5)]  # ~650 and ~1,600 tokens
    with (
        serve(create_app(settings)) as url,
        openai.OpenAI(base_url=url + "/v1", api_key="none", timeout=250, max_retries=0) as oai,
        httpx.Client(timeout=60) as client,
    ):
        for messages in [*shorts[:3], *longs, *shorts[3:]]:  # the last word to short prompts
            result = oai.chat.completions.create(model=MODEL, messages=messages, max_tokens=1)  # type: ignore[arg-type]
            assert result.usage is not None
            assert result.usage.prompt_tokens == _server_count(client, {"messages": messages})
        counted = client.post(url + "/v1/compaction/count", json=long_body).json()
        real = _server_count(client, long_body)
    assert 2500 < real < 4096 - 64
    error = counted["prompt_tokens"] / real - 1
    assert abs(error) < 0.05, (counted, real)


def test_overflow_with_no_compaction_keeps_the_explicit_window(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """`X-Compaction-Strategy: none` over the window: the server's error reaches the client;
    the window learned from it is the one it states (4,096, not a guess below), and an explicit
    `X-Compaction-Context-Limit` still wins over it."""
    assert LLM_URL is not None
    settings = make_settings(tmp_path_factory.mktemp("overflow"), upstream_url=LLM_URL)
    body = {"model": MODEL, "messages": _long_conversation(40), "max_tokens": 1}
    with serve(create_app(settings)) as url, httpx.Client(base_url=url, timeout=60) as client:
        response = client.post(
            "/v1/chat/completions", json=body, headers={"X-Compaction-Strategy": "none"}
        )
        assert response.status_code == 400
        assert response.json()["error"]["type"] == "exceed_context_size_error"
        learned = client.post("/v1/compaction/count", json=body).json()
        explicit = client.post(
            "/v1/compaction/count", json=body, headers={"X-Compaction-Context-Limit": "8000"}
        ).json()
    assert (learned["context_limit"], learned["limit_source"]) == (4096, "learned")
    assert (explicit["context_limit"], explicit["limit_source"]) == (8000, "header")
