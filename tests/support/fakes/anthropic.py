"""The fake's Anthropic Messages (`POST /v1/messages`, and `count_tokens`): Anthropic's rules,
written apart from the proxy's own checks so that the tests do not grade the proxy with its own
code; a prompt over the window refused with "prompt is too long: N tokens > M maximum" (the
prompt alone: `max_tokens` is not counted); answers as a `message` or Anthropic's event stream
(`event:` lines), usage with cache reads and writes.

`rule_violations(body)` is what the fake rejects with a 400: the first message is not `user`;
two messages in a row share a role (stricter than the API, which combines them: an output of
the proxy must alternate whenever its input did); a `tool_use` not answered by a `tool_result`
in the very next message; a `tool_result` that answers nothing in the message right before, or
that comes after another kind of block; more than 4 `cache_control` breakpoints; a breakpoint on
a thinking block or on an empty text block; an empty text block.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import orjson
from starlette.responses import JSONResponse, Response

if TYPE_CHECKING:
    from tests.support.fakes.upstream import FakeUpstream

MAX_BREAKPOINTS = 4


def content_blocks(message: Mapping[str, Any]) -> list[Any]:
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return list(content) if isinstance(content, list) else []


def _ids(message: Mapping[str, Any], kind: str, key: str) -> list[Any]:
    return [b.get(key) for b in content_blocks(message) if b.get("type") == kind]


def all_blocks(body: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    """Every block that may carry `cache_control`: system, tools, message blocks and the blocks
    nested in tool results."""
    system = body.get("system")
    yield from system if isinstance(system, list) else []
    yield from body.get("tools") or []
    for message in body.get("messages") or []:
        for block in content_blocks(message):
            yield block
            nested = block.get("content") if block.get("type") == "tool_result" else None
            yield from nested if isinstance(nested, list) else []


def _message_violations(messages: list[Mapping[str, Any]]) -> Iterator[str]:
    if not messages or messages[0].get("role") != "user":
        yield "the first message must use the user role"
    for i, message in enumerate(messages):
        if message.get("role") not in ("user", "assistant"):
            yield f"messages.{i}.role: {message.get('role')!r}"
        if i and message.get("role") == messages[i - 1].get("role"):
            yield f"messages.{i}: roles must alternate between user and assistant"
        blocks = content_blocks(message)
        if not blocks and not (i == len(messages) - 1 and message.get("role") == "assistant"):
            yield f"messages.{i}: empty content"
        kinds = [b.get("type") for b in blocks]
        first_other = next((k for k, kind in enumerate(kinds) if kind != "tool_result"), len(kinds))
        if "tool_result" in kinds[first_other:]:
            yield f"messages.{i}: tool_result blocks must come first"
        wrong = {"user": ("tool_use", "thinking"), "assistant": ("tool_result", "image")}
        if any(k in wrong.get(str(message.get("role")), ()) for k in kinds):
            yield f"messages.{i}: a block type its role cannot carry"
        for b in blocks:
            if b.get("type") == "text" and not b.get("text"):
                yield f"messages.{i}: text content blocks must be non-empty"
        uses = _ids(message, "tool_use", "id")
        following = messages[i + 1] if i + 1 < len(messages) else None
        if uses and following is not None:
            answered = set(_ids(following, "tool_result", "tool_use_id"))
            missing = [u for u in uses if u not in answered]
            if missing:
                yield f"messages.{i}: tool_use ids without tool_result right after: {missing}"
        results = _ids(message, "tool_result", "tool_use_id")
        called = set(_ids(messages[i - 1], "tool_use", "id")) if i else set()
        stray = [r for r in results if r not in called]
        if stray:
            yield f"messages.{i}: unexpected tool_use_id in tool_result blocks: {stray}"


def well_formed(body: Any) -> bool:
    """Messages the checks can read: objects with a role, content a string or blocks (as do
    tool results)."""
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list):
        return False
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("content"), str | list):
            return False
        for block in content_blocks(message):
            if not isinstance(block, dict):
                return False
            nested = block.get("content")
            if isinstance(nested, list) and not all(isinstance(b, dict) for b in nested):
                return False
    return True


def rule_violations(body: Mapping[str, Any]) -> list[str]:
    """What Anthropic's rules (made strict on alternation) reject in `body` (empty: none)."""
    messages = [m for m in body.get("messages") or [] if isinstance(m, Mapping)]
    found = list(_message_violations(messages))
    marked = [b for b in all_blocks(body) if isinstance(b, Mapping) and b.get("cache_control")]
    if len(marked) > MAX_BREAKPOINTS:
        found.append(
            f"A maximum of 4 blocks with cache_control may be provided. Found {len(marked)}."
        )
    for block in marked:
        if block.get("type") in ("thinking", "redacted_thinking"):
            found.append("thinking blocks cannot carry cache_control")
    return found


SUMMARY_REPLY = "SUMMARY: the agent read files and ran tests"


def prompt_tokens(body: Mapping[str, Any]) -> int:
    """The fake's own count of a prompt: a token per 4 bytes of its JSON (system, tools and
    messages), apart from the proxy's counter."""
    shown = {k: body.get(k) for k in ("system", "tools", "messages")}
    return len(orjson.dumps(shown)) // 4


def anthropic_error(status: int, kind: str, message: str) -> JSONResponse:
    """Anthropic's error envelope."""
    return JSONResponse(
        {"type": "error", "error": {"type": kind, "message": message}}, status_code=status
    )


def sse_event(name: str, data: Mapping[str, Any]) -> bytes:
    """One event of Anthropic's stream (`event:` line, then its data)."""
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


class AnthropicApi:
    """`POST /v1/messages`; `count_tokens` answers `prompt_tokens`."""

    reply = "Hello from Claude"

    def is_summary(self, body: Any) -> bool:
        """A summary request from the proxy: one user message asking for the summary."""
        messages = body.get("messages") if isinstance(body, dict) else None
        if not isinstance(messages, list) or len(messages) != 1:
            return False
        content = messages[0].get("content") if isinstance(messages[0], dict) else None
        return isinstance(content, str) and "<transcript>" in content

    def problem(self, fake: FakeUpstream, body: Any, summary: bool) -> str | None:
        problems = [] if well_formed(body) else ["messages: malformed"]
        problems = problems or rule_violations(body)
        return problems[0] if problems else None

    def prompt(self, body: Any) -> int:
        return prompt_tokens(body)

    def reserve(self, body: Any) -> int:
        return 0

    def refuse(self, message: str) -> Response:
        return anthropic_error(400, "invalid_request_error", message)

    def overflow(self, fake: FakeUpstream, body: Any, prompt: int) -> tuple[str, Response]:
        message = f"prompt is too long: {prompt} tokens > {fake.context_window} maximum"
        return message, self.refuse(message)

    def usage_prompt(self, fake: FakeUpstream, body: Any, summary: bool) -> int:
        return self.prompt(body) if fake.prompt_tokens is None else fake.prompt_tokens

    def summary_text(self, calls: int) -> str:
        return SUMMARY_REPLY

    def answer(self, fake: FakeUpstream, body: Any, text: str, prompt: int) -> dict[str, Any]:
        read = min(fake.cached_tokens, prompt)
        written = min(fake.cache_write_tokens, prompt - read)
        return {
            "id": "msg_fake",
            "type": "message",
            "role": "assistant",
            "model": body.get("model"),
            "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {
                "input_tokens": prompt - read - written,
                "cache_read_input_tokens": read,
                "cache_creation_input_tokens": written,
                "output_tokens": len(text.split()),
            },
        }

    async def stream(
        self, fake: FakeUpstream, body: Any, answer: dict[str, Any]
    ) -> AsyncIterator[bytes]:
        usage = answer["usage"]
        started = {
            **answer,
            "content": [],
            "stop_reason": None,
            "usage": {**usage, "output_tokens": 1},
        }
        yield sse_event("message_start", {"type": "message_start", "message": started})
        block = {"type": "text", "text": ""}
        yield sse_event(
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": block},
        )
        yield sse_event("ping", {"type": "ping"})
        for i, word in enumerate(answer["content"][0]["text"].split(" ")):
            delta = {"type": "text_delta", "text": (" " if i else "") + word}
            yield sse_event(
                "content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}
            )
            if i == 0:
                await fake.after_first_chunk(body)
        yield sse_event("content_block_stop", {"type": "content_block_stop", "index": 0})
        done = {"stop_reason": "end_turn", "stop_sequence": None}
        output = {"output_tokens": usage["output_tokens"]}
        yield sse_event("message_delta", {"type": "message_delta", "delta": done, "usage": output})
        yield sse_event("message_stop", {"type": "message_stop"})


API = AnthropicApi()
