"""Every overflow phrasing in the table, and errors that are not overflows."""

from __future__ import annotations

import orjson
import pytest

from app.overflow import OverflowInfo, parse_overflow


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
    from app.overflow import PHRASINGS, _message_and_fields

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
