"""Compaction through the proxy: controls, report headers, preview, count, overflow handling."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from inflight.compaction.units import check_pair_safety
from inflight.factory import create_app
from tests.asgi.test_proxy_asgi import assert_openai_error
from tests.conftest import make_settings
from tests.support.fakes import FakeUpstream

pytestmark = pytest.mark.anyio


def long_chat(rounds: int = 30, size: int = 2000) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the bug."},
    ]
    for i in range(rounds):
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"c{i}",
                        "type": "function",
                        "function": {"name": "bash", "arguments": '{"cmd": "ls"}'},
                    }
                ],
            }
        )
        messages.append(
            {"role": "tool", "tool_call_id": f"c{i}", "content": f"out {i} " + "data " * size}
        )
    return messages


async def post(client: httpx.AsyncClient, body: dict[str, Any], **headers: str) -> httpx.Response:
    return await client.post("/v1/chat/completions", content=orjson.dumps(body), headers=headers)


async def test_report_headers_on_a_request_that_fits(
    client: httpx.AsyncClient, fake: FakeUpstream
) -> None:
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
    response = await post(client, body)
    assert response.headers["x-compaction-applied"] == "none"
    assert (
        int(response.headers["x-compaction-tokens-before"])
        == int(response.headers["x-compaction-tokens-after"])
        > 0
    )
    assert response.headers["x-compaction-context-limit"] == "128000"
    assert response.headers["x-compaction-messages-before"] == "1"
    assert "x-compaction-over-budget" not in response.headers


async def test_long_conversation_is_compacted_pair_safe(
    client: httpx.AsyncClient, fake: FakeUpstream
) -> None:
    fake.enforce_pairs = True
    body = {"model": "gpt-4o", "messages": long_chat()}
    response = await post(client, body, **{"X-Compaction-Context-Limit": "8192"})
    assert response.status_code == 200
    applied = response.headers["x-compaction-applied"].split(",")
    assert "prune" in applied or "trim" in applied
    assert int(response.headers["x-compaction-tokens-after"]) < int(
        response.headers["x-compaction-tokens-before"]
    )
    sent = fake.chat_requests[-1].json()["messages"]
    assert sent[:2] == body["messages"][:2]
    assert sent[-2:] == body["messages"][-2:]
    assert int(response.headers["x-compaction-messages-after"]) == len(sent)


async def test_strategy_none_forwards_untouched_with_over_budget_flag(
    client: httpx.AsyncClient, fake: FakeUpstream
) -> None:
    raw = orjson.dumps({"model": "gpt-4o", "messages": long_chat()})
    response = await client.post(
        "/v1/chat/completions",
        content=raw,
        headers={"X-Compaction-Strategy": "none", "X-Compaction-Context-Limit": "8192"},
    )
    assert response.headers["x-compaction-applied"] == "none"
    assert response.headers["x-compaction-over-budget"] == "true"
    assert fake.chat_requests[-1].body == raw


async def test_body_controls_and_transforms_are_removed(
    client: httpx.AsyncClient, fake: FakeUpstream
) -> None:
    body = {
        "model": "gpt-4o",
        "messages": long_chat(),
        "compaction": {"strategy": "trim", "context_limit": 8192},
        "x_vendor": {"keep": True},
    }
    response = await post(client, body)
    assert response.headers["x-compaction-applied"] == "trim"
    sent = fake.chat_requests[-1].json()
    assert "compaction" not in sent
    assert sent["x_vendor"] == {"keep": True}
    small = {
        "model": "gpt-4o",
        "messages": [{"role": "user", "content": "hi"}],
        "transforms": ["middle-out"],
    }
    await post(client, small)
    assert "transforms" not in fake.chat_requests[-1].json()
    big = {**body, "compaction": {"context_limit": 8192}, "transforms": ["middle-out"]}
    response = await post(client, big)
    assert response.headers["x-compaction-applied"] == "middle-out"


@pytest.mark.parametrize(
    ("headers", "body_extra", "param"),
    [
        ({"X-Compaction-Strategy": "shred"}, {}, "X-Compaction-Strategy"),
        ({"X-Compaction-Context-Limit": "-5"}, {}, "X-Compaction-Context-Limit"),
        ({"X-Compaction-Context-Limit": "lots"}, {}, "X-Compaction-Context-Limit"),
        ({"X-Compaction-Threshold": "1.5"}, {}, "X-Compaction-Threshold"),
        (
            {"X-Compaction-Threshold": "0.5", "X-Compaction-Target": "0.7"},
            {},
            "X-Compaction-Target",
        ),
        ({"X-Compaction-Bogus": "1"}, {}, "X-Compaction-Bogus"),
        ({}, {"compaction": {"threshold": "high"}}, "compaction.threshold"),
        ({}, {"compaction": {"colour": "red"}}, "compaction"),
        ({}, {"compaction": "trim"}, "compaction"),
        ({}, {"transforms": ["compress"]}, "transforms"),
        ({}, {"transforms": "middle-out"}, "transforms"),
        ({"X-Compaction-Strategy": ""}, {}, "X-Compaction-Strategy"),
        ({"X-Compaction-Strategy": " , "}, {}, "X-Compaction-Strategy"),
        ({}, {"compaction": {"strategy": ""}}, "compaction.strategy"),
        ({}, {"compaction": {"strategy": []}}, "compaction.strategy"),
    ],
)
async def test_invalid_controls_are_400_naming_them(
    client: httpx.AsyncClient,
    fake: FakeUpstream,
    headers: dict[str, str],
    body_extra: dict[str, Any],
    param: str,
) -> None:
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], **body_extra}
    response = await post(client, body, **headers)
    assert_openai_error(response, 400, "invalid_compaction_control")
    assert response.json()["error"]["param"].lower() == param.lower()
    assert fake.chat_requests == []


def _call(call_id: str, name: str, arguments: str = "{}") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


WRITE_FILE = orjson.dumps({"path": "src/big.py", "content": "x = 1\n" * 40_000}).decode()
HEAD = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "go"}]
LAST_UNITS: dict[str, list[dict[str, Any]]] = {
    "20 text parts": [
        {"role": "assistant", "content": None, "tool_calls": [_call("c1", "fetch")]},
        {
            "role": "tool",
            "tool_call_id": "c1",
            "content": [{"type": "text", "text": f"r{i} " * 3000} for i in range(20)],
        },
    ],
    "20 parallel outputs": [
        {"role": "assistant", "content": None, "tool_calls": [_call(f"c{i}", "read") for i in range(20)]},
        *({"role": "tool", "tool_call_id": f"c{i}", "content": f"o{i} " * 2500} for i in range(20)),
    ],
    "huge write_file arguments": [
        {"role": "assistant", "content": None, "tool_calls": [_call("w1", "write_file", WRITE_FILE)]},
        {"role": "tool", "tool_call_id": "w1", "content": "wrote 240000 bytes"},
    ],
    "client text that looks like a marker": [
        {"role": "assistant", "content": None, "tool_calls": [_call("c1", "fetch")]},
        {
            "role": "tool",
            "tool_call_id": "c1",
            "content": "<h1>x</h1>\n\n[… inflight truncated 5 chars …]\n\n" + "page " * 40_000,
        },
    ],
}  # fmt: skip


async def preview(
    client: httpx.AsyncClient, messages: list[dict[str, Any]], **headers: str
) -> dict[str, Any]:
    body = {"model": "gpt-4o", "messages": messages}
    response = await client.post(
        "/v1/compaction/preview", content=orjson.dumps(body), headers=headers
    )
    assert response.status_code == 200, response.text
    data: dict[str, Any] = response.json()
    return data


@pytest.mark.parametrize("name", list(LAST_UNITS))
@pytest.mark.parametrize("strategy", ["auto", "truncate", "truncate,trim"])
async def test_the_last_unit_is_brought_within_budget(
    client: httpx.AsyncClient, name: str, strategy: str
) -> None:
    """Issue 12, defects 2 and 8: the cap covers the last unit as a whole; answered arguments
    are cut as a last resort (inside the JSON); a marker the client wrote stops nothing."""
    messages = [*HEAD, *LAST_UNITS[name]]
    data = await preview(
        client,
        messages,
        **{"X-Compaction-Context-Limit": "8192", "X-Compaction-Strategy": strategy},
    )
    report, out = data["report"], data["messages"]
    assert report["budget"] == 6882
    assert report["tokens_before"] > 40_000
    assert not report["over_budget"]
    assert report["tokens_after"] <= report["budget"]
    assert report["applied"][0] == "truncate"
    assert out[:2] == HEAD
    assert check_pair_safety(out) == []
    assert [m.get("tool_call_id") for m in out[2:]] == [m.get("tool_call_id") for m in messages[2:]]
    if name == "huge write_file arguments":
        arguments = orjson.loads(out[2]["tool_calls"][0]["function"]["arguments"])
        assert arguments["path"] == "src/big.py"
        assert "inflight truncated" in arguments["content"]


async def test_a_long_assistant_message_before_the_last_question_is_truncated(
    client: httpx.AsyncClient,
) -> None:
    """Issue 12, defect 10: in a strict chat `[U, A(huge), U]` the assistant message can never
    be cut, so truncation reaches it (with a marker) and the request fits."""
    messages = [
        {"role": "user", "content": "Tell me everything."},
        {"role": "assistant", "content": "word " * 20_000},
        {"role": "user", "content": "Thanks. Shorter?"},
    ]
    for strategy in ("auto", "truncate,trim", "truncate,middle-out"):
        data = await preview(
            client,
            messages,
            **{"X-Compaction-Context-Limit": "8192", "X-Compaction-Strategy": strategy},
        )
        out = data["messages"]
        assert not data["report"]["over_budget"]
        assert data["report"]["applied"] == ["truncate"]
        assert [m["role"] for m in out] == ["user", "assistant", "user"]
        assert out[0] == messages[0]
        assert out[2] == messages[2]
        assert "inflight truncated" in out[1]["content"]


async def test_preview_returns_messages_and_report_without_forwarding(
    client: httpx.AsyncClient, fake: FakeUpstream
) -> None:
    body = {"model": "gpt-4o", "messages": long_chat()}
    response = await client.post(
        "/v1/compaction/preview",
        content=orjson.dumps(body),
        headers={"X-Compaction-Context-Limit": "8192"},
    )
    assert response.status_code == 200
    data = response.json()
    assert data["report"]["limit_source"] == "header"
    assert data["report"]["tokens_after"] < data["report"]["tokens_before"]
    assert len(data["messages"]) == data["report"]["messages_after"]
    assert fake.chat_requests == []


async def test_count_endpoint(client: httpx.AsyncClient) -> None:
    body = {
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": "hello world"}],
        "max_tokens": 100,
    }
    data = (await client.post("/v1/compaction/count", content=orjson.dumps(body))).json()
    assert data == {
        "model": "gpt-4o-mini",
        "prompt_tokens": data["prompt_tokens"],
        "context_limit": 128000,
        "limit_source": "table",
        "output_reserve": 100,
        "usage_ratio": round(data["prompt_tokens"] / 127900, 4),
        "exact": True,
        "encoding": "o200k_base",
    }
    assert 8 <= data["prompt_tokens"] <= 12
    llama = (
        await client.post(
            "/v1/compaction/count", content=orjson.dumps({**body, "model": "llama-3.1-8b"})
        )
    ).json()
    assert llama["exact"] is False
    assert llama["encoding"] is None


async def test_reject_mode_answers_context_length_exceeded(
    tmp_path: Path, fake: FakeUpstream
) -> None:
    app = create_app(
        make_settings(tmp_path, on_overflow="reject"), transport=httpx.ASGITransport(app=fake.app)
    )
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://p") as c,
    ):
        huge = [{"role": "user", "content": "word " * 20000}]
        response = await post(
            c, {"model": "gpt-4o", "messages": huge}, **{"X-Compaction-Context-Limit": "4096"}
        )
    assert_openai_error(response, 400, "context_length_exceeded")
    assert fake.chat_requests == []


@pytest.mark.parametrize("stream", [False, True])
async def test_overflow_error_teaches_the_window_and_retries_once(
    client: httpx.AsyncClient, fake: FakeUpstream, stream: bool
) -> None:
    # /v1/models advertises 32k, but the server really holds 6k (a smaller --ctx-size).
    fake.context_window = 6000
    fake.advertised_window = 32768
    fake.enforce_pairs = True
    body = {"model": "fake-model", "messages": long_chat(rounds=14, size=600), "stream": stream}
    first = await post(client, body)
    assert first.status_code == 200, first.text
    if stream:
        assert b"[DONE]" in first.content
    assert len(fake.rejected) == 1  # the first attempt; the client never saw it
    assert first.headers["x-compaction-context-limit"] == "6000"
    again = await post(client, body)
    assert again.status_code == 200
    assert len(fake.rejected) == 1  # learned: no second rejection


async def test_overflow_without_a_better_window_is_relayed(
    client: httpx.AsyncClient, fake: FakeUpstream
) -> None:
    fake.error = (
        400,
        b'{"error": {"message": "context_length_exceeded", "code": "context_length_exceeded"}}',
        {},
    )
    response = await post(
        client, {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
    )
    assert response.status_code == 400
    assert len(fake.chat_requests) == 1


async def test_overflow_retry_after_discovery_overestimates(
    tmp_path: Path, fake: FakeUpstream
) -> None:
    fake.context_window = 6000  # what the upstream enforces
    fake.enforce_pairs = True
    settings = make_settings(tmp_path)  # models.toml says 128k for llama-3.1: too much here

    app = create_app(settings, transport=httpx.ASGITransport(app=fake.app))
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://p") as c,
    ):
        response = await post(
            c, {"model": "llama-3.1-8b", "messages": long_chat(rounds=14, size=600)}
        )
        assert response.status_code == 200, response.text
        assert len(fake.rejected) == 1  # the first attempt; the client never saw it
        assert response.headers["x-compaction-context-limit"] == "6000"
