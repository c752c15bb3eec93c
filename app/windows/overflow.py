"""Reading an upstream's "context length exceeded" error: which window did it name?

This is the one place inflight reads an error message's text: upstreams give the window size
nowhere else. Every phrasing is in one table and each has a test.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson


@dataclass(frozen=True, slots=True)
class OverflowInfo:
    """An overflow error: the window the upstream named and the prompt size, when given."""

    window: int | None
    prompt_tokens: int | None


MIN_WINDOW = 128  # a smaller number in an overflow message is not the model's window

# (pattern, group holding the window, group holding the prompt size or 0). First match wins.
PHRASINGS: tuple[tuple[re.Pattern[str], int, int], ...] = (
    # OpenAI, Azure, DeepSeek, OpenRouter and vLLM:
    #   "This model's maximum context length is 8192 tokens. However, your messages resulted in
    #   9000 tokens" / "... you requested 5000 tokens (4000 in the messages, 1000 in the
    #   completion)" / "... However, you requested about 130000 tokens" (OpenRouter) /
    #   "... your request has 40000 input tokens" (vLLM ≥ 0.10). The prompt size is the
    #   messages' share when the message says it.
    (
        re.compile(
            r"maximum context length is (\d+) tokens.*?requested (?:about )?\d+ tokens "
            r"\((\d+) in the messages",
            re.S | re.I,
        ),
        1,
        2,
    ),
    (
        re.compile(
            r"maximum context length is (\d+) tokens.*?(?:resulted in|requested|has|contains)"
            r" (?:about )?(\d+)(?: input)? tokens",
            re.S | re.I,
        ),
        1,
        2,
    ),
    # SGLang (newer): "Requested token count exceeds the model's maximum context length of
    # 4096 tokens. You requested a total of 5100 tokens: 5000 tokens from the input messages…"
    (
        re.compile(
            r"maximum context length of (\d+) tokens.*?(\d+) tokens from the input", re.S | re.I
        ),
        1,
        2,
    ),
    (re.compile(r"maximum context length (?:is|of) (\d+) tokens", re.I), 1, 0),
    # SGLang: "The input (5000 tokens) is longer than the model's context length (4096 tokens)."
    (
        re.compile(
            r"input \((\d+) tokens\) is longer than the model's context length \((\d+) tokens\)",
            re.I,
        ),
        2,
        1,
    ),
    # Anthropic: "prompt is too long: 210000 tokens > 200000 maximum"
    (re.compile(r"prompt is too long: (\d+) tokens > (\d+) maximum", re.I), 2, 1),
    # Anthropic: "input length and `max_tokens` exceed context limit: 198000 + 8192 > 200000"
    (re.compile(r"exceed context limit: (\d+) \+ \d+ > (\d+)", re.I), 2, 1),
    # Mistral: "Prompt contains 40000 tokens ... too large for model with 32768 maximum context"
    (
        re.compile(r"prompt contains (\d+) tokens.*?model with (\d+) maximum context", re.S | re.I),
        2,
        1,
    ),
    # Gemini (OpenAI-compatible endpoint): "The input token count (1200000) exceeds the maximum
    # number of tokens allowed (1048576)."
    (
        re.compile(
            r"input token count \(?(\d+)\)? exceeds the maximum number of tokens allowed "
            r"\(?(\d+)\)?",
            re.I,
        ),
        2,
        1,
    ),
    # TGI: "`inputs` tokens + `max_new_tokens` must be <= 4096. Given: 5000 `inputs` tokens"
    (re.compile(r"must be <= (\d+)\. Given: (\d+) `inputs` tokens", re.I), 1, 2),
    # Ollama: "input length (5000) exceeds the context length (4096)"
    (re.compile(r"input length \((\d+)\) exceeds (?:the )?context length \((\d+)\)", re.I), 2, 1),
    # LM Studio: "... the model is loaded with context length of only 4096 tokens ..."; llama.cpp
    # text: "the request exceeds the available context size (4096 tokens)"
    (re.compile(r"context (?:size|length) (?:of only )?\(?(\d+)(?: tokens)?\)?", re.I), 1, 0),
)

# Overflows that state no number still count: OpenAI's Responses API says only "Your input
# exceeds the context window of this model" (the compaction service then bounds the window by
# what it sent).
_OVERFLOW_WORDS = re.compile(
    r"context[_ ]length[_ ]exceeded|exceed_context_size|maximum context length|context length|"
    r"context size|context limit|context window|prompt is too long|too large for model|"
    r"longer than the model|maximum number of tokens allowed|`inputs` tokens \+ `max_new_tokens`",
    re.I,
)


def _message_and_fields(body: bytes) -> tuple[str, dict[str, Any]]:
    """The error's text (message, type and code joined) and its structured fields."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body.decode("utf-8", "replace"), {}
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict):
        message = " ".join(
            str(error.get(k)) for k in ("message", "type", "code") if error.get(k) is not None
        )
        return message, error
    if isinstance(error, str):
        return error, {}
    if isinstance(data, dict) and isinstance(data.get("message"), str):
        return data["message"], data
    return body.decode("utf-8", "replace"), {}


def parse_overflow(status: int, body: bytes) -> OverflowInfo | None:
    """An `OverflowInfo` when `body` is a context-overflow error, else None."""
    if status not in (400, 413, 422, 500):
        return None
    message, fields = _message_and_fields(body)
    n_ctx = fields.get("n_ctx")
    if isinstance(n_ctx, int) and n_ctx > 0:  # llama.cpp exceed_context_size_error
        prompt = fields.get("n_prompt_tokens")
        return OverflowInfo(n_ctx, prompt if isinstance(prompt, int) else None)
    if not _OVERFLOW_WORDS.search(message):
        return None
    for pattern, window_group, prompt_group in PHRASINGS:
        match = pattern.search(message)
        if match:
            window = int(match.group(window_group))
            prompt = int(match.group(prompt_group)) if prompt_group else None
            return OverflowInfo(window if window >= MIN_WINDOW else None, prompt)
    return OverflowInfo(None, None)
