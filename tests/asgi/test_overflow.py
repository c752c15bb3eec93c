"""Every overflow phrasing in the table, errors that are not overflows, and what the proxy does
after an upstream overflow: learn the stated window, recalibrate, retry only what differs."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from inflight.factory import create_app
from inflight.windows.overflow import OverflowInfo, parse_overflow
from tests.conftest import make_settings
from tests.support.fakes.chat import completion


def _openai_style(message: str, code: str | None = None) -> bytes:
    return orjson.dumps(
        {"error": {"message": message, "type": "invalid_request_error", "code": code}}
    )


_CASES = [
    pytest.param(*case)
    for case in [
        (
            _openai_style(
                "This model's maximum context length is 8192 tokens. However, your messages "
                "resulted in 9000 tokens. Please reduce the length of the messages.",
                "context_length_exceeded",
            ),
            OverflowInfo(8192, 9000),
        ),
        (
            _openai_style(
                "This model's maximum context length is 4096 tokens. However, you requested "
                "5000 tokens (4000 in the messages, 1000 in the completion)."
            ),
            OverflowInfo(4096, 4000),
        ),
        (
            _openai_style(
                "This endpoint's maximum context length is 128000 tokens. However, you requested "
                "about 130512 tokens (122320 of text input, 8192 in the output). Please reduce "
                'the length of either one, or use the "middle-out" transform.'
            ),
            OverflowInfo(128000, 130512),
        ),
        (
            _openai_style(
                "'max_tokens' or 'max_completion_tokens' is too large: 1000. This model's maximum "
                "context length is 4096 tokens and your request has 3500 input tokens "
                "(1000 > 4096 - 3500)."
            ),
            OverflowInfo(4096, 3500),
        ),
        (
            _openai_style(
                "Requested token count exceeds the model's maximum context length of 4096 tokens. "
                "You requested a total of 5100 tokens: 5000 tokens from the input messages and "
                "100 tokens for the completion. Please reduce the number of tokens in the input "
                "messages or the completion to fit within the limit."
            ),
            OverflowInfo(4096, 5000),
        ),
        (
            orjson.dumps(
                {
                    "type": "error",
                    "error": {
                        "type": "invalid_request_error",
                        "message": "input length and `max_tokens` exceed context limit: 198000 + "
                        "8192 > 200000, decrease input length or `max_tokens` and try again",
                    },
                }
            ),
            OverflowInfo(200000, 198000),
        ),
        (
            orjson.dumps(
                {
                    "error": {
                        "code": 400,
                        "message": "The input token count (1200000) exceeds the maximum "
                        "number of tokens allowed (1048576).",
                        "status": "INVALID_ARGUMENT",
                    }
                }
            ),
            OverflowInfo(1048576, 1200000),
        ),
        (
            orjson.dumps(
                {
                    "error": "Input validation error: `inputs` tokens + `max_new_tokens` must be "
                    "<= 4096. Given: 5000 `inputs` tokens and 100 `max_new_tokens`",
                    "error_type": "validation",
                }
            ),
            OverflowInfo(4096, 5000),
        ),
        (
            b'{"error":{"code":500,"message":"the request exceeds the available context size '
            b'(4096 tokens), try increasing it","type":"server_error"}}',
            OverflowInfo(4096, None),
        ),
        (
            _openai_style(
                "This model's maximum context length is 32768 tokens. However, your request "
                "has 40000 input tokens. Please reduce the length of the input messages."
            ),
            OverflowInfo(32768, 40000),
        ),
        (
            b'{"error":{"code":400,"message":"the request exceeds the available context size, '
            b'try increasing it","type":"exceed_context_size_error","n_prompt_tokens":5000,'
            b'"n_ctx":4096}}',
            OverflowInfo(4096, 5000),
        ),
        (
            _openai_style(
                "The input (5000 tokens) is longer than the model's context length (4096 tokens)."
            ),
            OverflowInfo(4096, 5000),
        ),
        (
            orjson.dumps(
                {
                    "type": "error",
                    "error": {
                        "type": "invalid_request_error",
                        "message": "prompt is too long: 210000 tokens > 200000 maximum",
                    },
                }
            ),
            OverflowInfo(200000, 210000),
        ),
        (
            orjson.dumps(
                {
                    "object": "error",
                    "message": "Prompt contains 40000 tokens and 0 draft tokens, too large for "
                    "model with 32768 maximum context length",
                }
            ),
            OverflowInfo(32768, 40000),
        ),
        (
            orjson.dumps({"error": "input length (5000) exceeds the context length (4096)"}),
            OverflowInfo(4096, 5000),
        ),
        (
            _openai_style(
                "Trying to keep the first 5000 tokens when context the overflows. However, the "
                "model is loaded with context length of only 4096 tokens, which is not enough."
            ),
            OverflowInfo(4096, None),
        ),
        (
            _openai_style("context_length_exceeded", "context_length_exceeded"),
            OverflowInfo(None, None),
        ),
        (  # OpenAI's Responses API states no number (the proxy bounds the window by what failed)
            _openai_style(
                "Your input exceeds the context window of this model. Please adjust your input "
                "and try again.",
                "context_length_exceeded",
            ),
            OverflowInfo(None, None),
        ),
        (  # the same as a Responses stream's `error` event
            orjson.dumps(
                {
                    "type": "error",
                    "sequence_number": 2,
                    "error": {
                        "type": "invalid_request_error",
                        "code": "context_length_exceeded",
                        "param": "input",
                        "message": "Your input exceeds the context window of this model.",
                    },
                }
            ),
            OverflowInfo(None, None),
        ),
    ]
]


@pytest.mark.parametrize(("body", "expected"), _CASES)
def test_phrasings(body: bytes, expected: OverflowInfo) -> None:
    assert parse_overflow(400, body) == expected


def test_llamacpp_fields_win_whatever_the_status() -> None:
    body = b'{"error":{"code":500,"message":"x","type":"exceed_context_size_error","n_ctx":2048}}'
    assert parse_overflow(500, body) == OverflowInfo(2048, None)


def test_a_tiny_number_is_not_a_window() -> None:
    body = _openai_style("context length exceeded: context size (0 tokens)")
    assert parse_overflow(400, body) == OverflowInfo(None, None)


def test_every_phrasing_in_the_table_is_tested() -> None:
    """Each regex of the table answers at least one case above (no dead phrasings)."""
    from inflight.windows.overflow import PHRASINGS, _message_and_fields

    cases = [case.values[0] for case in _CASES]
    for pattern, _, _ in PHRASINGS:
        assert any(pattern.search(_message_and_fields(body)[0]) for body in cases), pattern.pattern


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (400, _openai_style("Invalid value for 'temperature'")),
        (401, _openai_style("maximum context length is 8192 tokens")),
        (429, _openai_style("Rate limit reached")),
        (400, b"not json at all"),
        (500, b""),
    ],
)
def test_other_errors_are_not_overflows(status: int, body: bytes) -> None:
    assert parse_overflow(status, body) is None


# -- recovery through the proxy: learn what the error states, retry only what differs ---------
class TemplateUpstream:
    """A llama.cpp-like upstream with a chat template the proxy's heuristic underestimates:
    it counts 2 tokens a word plus 30 a request, enforces `window` with llama.cpp's
    `exceed_context_size_error` (which states the prompt's size), and advertises `advertised`
    in `/v1/models` (a server started with a smaller context than it says, when they differ)."""

    def __init__(self, window: int, advertised: int | None = None) -> None:
        self.window = window
        self.advertised = advertised or window
        self.chat: list[dict[str, Any]] = []

    @staticmethod
    def count(body: dict[str, Any]) -> int:
        return 30 + 2 * sum(len(str(m.get("content") or "").split()) for m in body["messages"])

    def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/models"):
            entry = {"id": "local-model", "max_model_len": self.advertised}
            return httpx.Response(200, json={"object": "list", "data": [entry]})
        if not request.url.path.endswith("/chat/completions"):
            return httpx.Response(404, json={"error": {"message": "not found"}})
        body = json.loads(request.content)
        if "<transcript>" not in str(body["messages"][-1].get("content")):
            self.chat.append(body)  # the conversation, not the proxy's own summary calls
        prompt = self.count(body)
        if prompt > self.window:
            error = {
                "code": 400,
                "message": "the request exceeds the available context size, try increasing it",
                "type": "exceed_context_size_error",
                "n_prompt_tokens": prompt,
                "n_ctx": self.window,
            }
            return httpx.Response(400, json={"error": error})
        return httpx.Response(200, json=completion("local-model", "ok", prompt))


def _chat(words: int, turns: int = 20) -> dict[str, Any]:
    messages = [{"role": "system", "content": "You are terse."}]
    for k in range(turns):
        role = "user" if k % 2 == 0 else "assistant"
        messages.append({"role": role, "content": f"turn {k} " + "word " * (words // turns)})
    messages.append({"role": "user", "content": "Reply with one word."})
    return {"model": "local-model", "messages": messages, "max_tokens": 64}


@contextlib.asynccontextmanager
async def _proxy(
    tmp_path: Path, upstream: TemplateUpstream, **settings: Any
) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(
        make_settings(tmp_path, **settings), transport=httpx.MockTransport(upstream.handle)
    )
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://p") as client,
    ):
        yield client


@pytest.mark.anyio
async def test_strategy_none_overflow_is_relayed_without_an_identical_retry(
    tmp_path: Path,
) -> None:
    """With nothing to cut, resending what failed fails the same way: the upstream's error goes
    to the client after one attempt."""
    upstream = TemplateUpstream(4096)
    async with _proxy(tmp_path, upstream) as client:
        response = await client.post(
            "/v1/chat/completions",
            json=_chat(2200),
            headers={"X-Compaction-Strategy": "none"},
        )
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "exceed_context_size_error"
    assert len(upstream.chat) == 1


@pytest.mark.anyio
async def test_an_overflow_with_the_right_window_recalibrates_and_the_retry_fits(
    tmp_path: Path,
) -> None:
    """The window was right (discovery said 4,096) but the estimate was low: the error's own
    count corrects the counter, so the retry is compacted (it differs) and fits. The window
    learned is the one the error states, not a guess below it."""
    upstream = TemplateUpstream(4096)
    body = _chat(2200)
    async with _proxy(tmp_path, upstream) as client:
        response = await client.post("/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text
        assert len(upstream.chat) == 2
        assert len(upstream.chat[1]["messages"]) < len(upstream.chat[0]["messages"])
        assert TemplateUpstream.count(upstream.chat[1]) <= 4096 - 64
        count = (await client.post("/v1/compaction/count", json=body)).json()
        stats = (await client.get("/stats")).json()
    assert (count["context_limit"], count["limit_source"]) == (4096, "learned")
    real = TemplateUpstream.count(body)
    assert abs(count["prompt_tokens"] - real) < 0.05 * real  # recalibrated (it said ~55 %)
    assert stats["calibration"]["local-model"] > 1.5


@pytest.mark.parametrize("explicit", ["header", "setting"])
@pytest.mark.anyio
async def test_a_learned_window_never_overrides_an_explicit_limit(
    tmp_path: Path, explicit: str
) -> None:
    """The server advertises 8,192 but holds 3,000: its overflow error teaches 3,000, which
    replaces what discovery said; an explicit limit (header or INFLIGHT_CONTEXT_LIMIT) still
    wins over it."""
    upstream = TemplateUpstream(3000, advertised=8192)
    body = _chat(1800)
    async with _proxy(tmp_path, upstream) as client:
        response = await client.post("/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text
        learned = (await client.post("/v1/compaction/count", json=body)).json()
    assert (learned["context_limit"], learned["limit_source"]) == (3000, "learned")

    settings: dict[str, Any] = {"context_limit": 4096} if explicit == "setting" else {}
    headers = {"X-Compaction-Context-Limit": "4096"} if explicit == "header" else {}
    (tmp_path / "explicit").mkdir()
    async with _proxy(tmp_path / "explicit", upstream, **settings) as client:
        await client.post("/v1/chat/completions", json=body)  # teaches 3,000 here too
        count = (await client.post("/v1/compaction/count", json=body, headers=headers)).json()
    assert (count["context_limit"], count["limit_source"]) == (4096, explicit)
