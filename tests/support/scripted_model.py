"""A scripted, strict model for the coding agents' end-to-end tier: one Starlette app speaking
Anthropic Messages, OpenAI Responses and chat completions (JSON and SSE, the providers' own
event shapes), written apart from the proxy so that the agents' runs are graded by other code.

Each request is validated (tool pairing, Anthropic's first-user and alternation, at most 4
`cache_control` breakpoints, thinking signatures as they were issued) and measured against a
window (a token per 4 characters of its prompt's JSON): over it, the provider's own overflow
error. Otherwise it answers with a call to the shell tool the agent offers — a command whose
output is large — until the conversation holds `rounds` calls, then with a final text.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

Api = Literal["messages", "responses", "chat"]
FINAL_TEXT = "All rounds done."
MAX_BREAKPOINTS = 4
# The shell tools each agent offers, by the name it gives them.
SHELL_TOOLS = ("Bash", "bash", "shell", "exec_command", "local_shell", "shell_command")


@dataclass(frozen=True, slots=True)
class Seen:
    """One request as the model received it: its API, body, prompt size and what was wrong."""

    api: Api
    body: Mapping[str, Any]
    tokens: int
    violations: tuple[str, ...]
    overflow: bool
    shell: str | None  # the shell tool it offered (None: a side request without one)


def signature(thinking: str) -> str:
    """The signature the model gives its thinking (checked when the thinking comes back)."""
    return "sig-" + hashlib.sha256(thinking.encode()).hexdigest()[:32]


def prompt_tokens(body: Mapping[str, Any]) -> int:
    """The model's own count: a token per 4 characters of the prompt's JSON."""
    keys = ("system", "tools", "messages", "input", "instructions")
    prompt = {k: body[k] for k in keys if k in body}
    return len(json.dumps(prompt, ensure_ascii=False)) // 4


# --- validation --------------------------------------------------------------------------


def _blocks(message: Mapping[str, Any]) -> list[Any]:
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return list(content) if isinstance(content, list) else []


def _breakpoints(body: Mapping[str, Any]) -> int:
    system = body.get("system")
    holders: list[Any] = [*(system if isinstance(system, list) else []), *(body.get("tools") or [])]
    for message in body.get("messages") or []:
        for block in _blocks(message):
            holders.append(block)
            nested = block.get("content") if isinstance(block, dict) else None
            holders.extend(nested if isinstance(nested, list) else [])
    return sum(isinstance(b, dict) and bool(b.get("cache_control")) for b in holders)


def messages_violations(body: Mapping[str, Any], issued: Mapping[str, str]) -> Iterator[str]:
    """What Anthropic rejects (stricter: two turns of one role must not meet even though the
    API would combine them). `role: "system"` messages inside `messages` (what Claude Code
    sends to a non-Claude model) are instructions: they take no turn."""
    messages = [m for m in body.get("messages") or [] if m.get("role") != "system"]
    if not messages or messages[0].get("role") != "user":
        yield "the first message must use the user role"
    for i, message in enumerate(messages):
        if i and message.get("role") == messages[i - 1].get("role"):
            yield f"turn {i}: two {message.get('role')} turns meet"
        blocks = _blocks(message)
        kinds = [b.get("type") for b in blocks]
        results = [b.get("tool_use_id") for b in blocks if b.get("type") == "tool_result"]
        calls_before = [
            b.get("id")
            for b in (_blocks(messages[i - 1]) if i else [])
            if b.get("type") == "tool_use"
        ]
        if sorted(map(str, results)) != sorted(map(str, calls_before)) and (
            results or (calls_before and message.get("role") == "user")
        ):
            yield f"turn {i}: results {results} do not answer the calls {calls_before}"
        if "tool_result" in kinds[kinds.count("tool_result") :]:
            yield f"turn {i}: tool_result blocks must come first"
        for b in blocks:
            if b.get("type") == "text" and not b.get("text"):
                yield f"turn {i}: an empty text block"
            if b.get("type") == "thinking" and issued.get(b.get("thinking", "")) != b.get(
                "signature"
            ):
                yield f"turn {i}: a thinking block whose signature is not the one issued"
    if calls_pending := [
        b for b in (_blocks(messages[-1]) if messages else []) if b.get("type") == "tool_use"
    ]:
        yield f"the request ends with {len(calls_pending)} unanswered tool_use blocks"
    if (count := _breakpoints(body)) > MAX_BREAKPOINTS:
        yield f"{count} cache_control breakpoints"


def chat_violations(body: Mapping[str, Any]) -> Iterator[str]:
    """Tool messages right after the assistant message whose calls they answer, all answered."""
    messages = list(body.get("messages") or [])
    i = 0
    while i < len(messages):
        message = messages[i]
        calls = message.get("tool_calls") or []
        if message.get("role") == "tool":
            yield f"messages.{i}: a tool message without its call right before it"
        if message.get("role") == "assistant" and calls:
            j = i + 1
            while j < len(messages) and messages[j].get("role") == "tool":
                j += 1
            answered = sorted(str(m.get("tool_call_id")) for m in messages[i + 1 : j])
            if answered != sorted(str(c.get("id")) for c in calls):
                yield f"messages.{i}: calls answered by {answered}"
            i = j
            continue
        i += 1


CALL_ITEMS = {
    "function_call": "function_call_output",
    "local_shell_call": "local_shell_call_output",
}
CALL_ITEMS |= {"custom_tool_call": "custom_tool_call_output"}


def responses_violations(body: Mapping[str, Any]) -> Iterator[str]:
    """Every call item answered by an output item with its `call_id` after it, every output
    after its call."""
    items = body.get("input")
    if not isinstance(items, list):
        return
    open_calls: dict[str, str] = {}
    for i, item in enumerate(items):
        kind = item.get("type")
        if kind in CALL_ITEMS:
            open_calls[str(item.get("call_id"))] = CALL_ITEMS[kind]
        elif kind in CALL_ITEMS.values() and open_calls.pop(str(item.get("call_id")), None) != kind:
            yield f"input.{i}: an output without its call before it"
    if open_calls:
        yield f"calls without their output: {sorted(open_calls)}"


# --- the script --------------------------------------------------------------------------


def _tool_names(api: Api, body: Mapping[str, Any]) -> list[str]:
    names = []
    for tool in body.get("tools") or []:
        if api == "chat":
            names.append(str((tool.get("function") or {}).get("name")))
        else:
            names.append(str(tool.get("name") or tool.get("type")))
    return names


def _shell(api: Api, body: Mapping[str, Any]) -> str | None:
    names = _tool_names(api, body)
    return next((n for n in SHELL_TOOLS if n in names), None)


def _call_ids(api: Api, body: Mapping[str, Any]) -> Iterator[str]:
    if api == "responses":
        items = body.get("input")
        for item in items if isinstance(items, list) else []:
            if isinstance(item, dict) and item.get("type") in CALL_ITEMS:
                yield str(item.get("call_id"))
    elif api == "chat":
        for message in body.get("messages") or []:
            yield from (str(c.get("id")) for c in message.get("tool_calls") or [])
    else:
        for message in body.get("messages") or []:
            for block in _blocks(message):
                if isinstance(block, dict) and block.get("type") == "tool_use":
                    yield str(block.get("id"))


def rounds_so_far(api: Api, body: Mapping[str, Any]) -> int:
    """How many calls the conversation has had: the round number the model wrote into its
    newest call id (compaction may have cut the older calls, never the last one)."""
    found = [int(i.split("_r")[-1]) for i in _call_ids(api, body) if i.split("_r")[-1].isdigit()]
    return max(found, default=0)


@dataclass(slots=True)
class ScriptedModel:
    """The model: `rounds` shell calls per conversation, then a final text; `window` tokens."""

    window: int
    rounds: int
    command: str = "yes 'the quick brown fox jumps over the lazy dog' | head -n 600"
    seen: list[Seen] = field(default_factory=list)
    issued: dict[str, str] = field(default_factory=dict)  # thinking text -> its signature
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _ids: Iterator[int] = field(default_factory=itertools.count)

    @property
    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/messages", self._messages, methods=["POST"]),
                Route("/v1/messages/count_tokens", self._count, methods=["POST"]),
                Route("/v1/responses", self._responses, methods=["POST"]),
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
                Route("/{rest:path}", self._other, methods=["GET", "POST", "HEAD"]),
            ]
        )

    def next_id(self) -> int:
        with self._lock:
            return next(self._ids)

    def _see(self, api: Api, body: Mapping[str, Any]) -> Seen:
        with self._lock:
            issued = dict(self.issued)
        if api == "messages":
            found = list(messages_violations(body, issued))
        elif api == "chat":
            found = list(chat_violations(body))
        else:
            found = list(responses_violations(body))
        tokens = prompt_tokens(body)
        seen = Seen(api, body, tokens, tuple(found), tokens > self.window, _shell(api, body))
        with self._lock:
            self.seen.append(seen)
        return seen

    def _command(self, seen: Seen) -> str | None:
        """The next command, or None when the conversation has had its rounds."""
        if seen.shell is None or rounds_so_far(seen.api, seen.body) >= self.rounds:
            return None
        return self.command

    def call_id(self, prefix: str, seen: Seen) -> str:
        """A new call id carrying the conversation's round number."""
        return f"{prefix}{self.next_id():04d}_r{rounds_so_far(seen.api, seen.body) + 1}"

    async def _other(self, request: Request) -> Response:
        return JSONResponse({"error": {"message": "not found"}}, status_code=404)

    async def _models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": []})

    async def _count(self, request: Request) -> Response:
        return JSONResponse({"input_tokens": prompt_tokens(await request.json())})

    # --- Anthropic Messages ---------------------------------------------------------------

    async def _messages(self, request: Request) -> Response:
        body = await request.json()
        seen = self._see("messages", body)
        if seen.violations:
            return _anthropic_error("; ".join(seen.violations))
        if seen.overflow:
            return _anthropic_error(
                f"prompt is too long: {seen.tokens} tokens > {self.window} maximum"
            )
        n = self.next_id()
        content: list[dict[str, Any]] = []
        thinking = body.get("thinking")
        if isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive"):
            text = f"Thinking about step {n}."
            with self._lock:
                self.issued[text] = signature(text)
            content.append({"type": "thinking", "thinking": text, "signature": signature(text)})
        command = self._command(seen)
        if command is None:
            content.append({"type": "text", "text": FINAL_TEXT})
            stop = "end_turn"
        else:
            content.append({"type": "text", "text": f"Running step {n}."})
            use = {"type": "tool_use", "id": self.call_id("toolu_", seen), "name": seen.shell}
            content.append({**use, "input": _shell_input(seen, command)})
            stop = "tool_use"
        usage = {
            "input_tokens": seen.tokens,
            "output_tokens": 20,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        }
        message = {
            "id": f"msg_{n:04d}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model"),
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": usage,
        }
        if body.get("stream"):
            return _sse(_anthropic_events(message))
        return JSONResponse(message)

    # --- OpenAI Responses -----------------------------------------------------------------

    async def _responses(self, request: Request) -> Response:
        body = await request.json()
        seen = self._see("responses", body)
        if seen.violations:
            return _openai_error("; ".join(seen.violations), None)
        if seen.overflow:
            return _openai_error(
                f"Your input exceeds the context window of this model. "
                f"({seen.tokens} tokens > {self.window})",
                "context_length_exceeded",
            )
        n = self.next_id()
        command = self._command(seen)
        if command is None:
            output: dict[str, Any] = {
                "type": "message",
                "id": f"msg_{n:04d}",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": FINAL_TEXT, "annotations": []}],
            }
        else:
            output = {
                "type": "function_call",
                "id": f"fc_{n:04d}",
                "call_id": self.call_id("call_", seen),
                "name": seen.shell,
                "arguments": json.dumps(_shell_input(seen, command)),
                "status": "completed",
            }
        response = {
            "id": f"resp_{n:04d}",
            "object": "response",
            "created_at": int(time.time()),
            "status": "completed",
            "model": body.get("model"),
            "output": [output],
            "parallel_tool_calls": False,
            "tool_choice": "auto",
            "tools": [],
            "usage": {
                "input_tokens": seen.tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": 20,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": seen.tokens + 20,
            },
        }
        if body.get("stream"):
            return _sse(_responses_events(response))
        return JSONResponse(response)

    # --- OpenAI chat completions ----------------------------------------------------------

    async def _chat(self, request: Request) -> Response:
        body = await request.json()
        seen = self._see("chat", body)
        if seen.violations:
            return _openai_error("; ".join(seen.violations), None)
        if seen.overflow:
            return _openai_error(
                f"This model's maximum context length is {self.window} tokens. However, your "
                f"messages resulted in {seen.tokens} tokens. Please reduce the length of the "
                "messages.",
                "context_length_exceeded",
            )
        n = self.next_id()
        command = self._command(seen)
        message: dict[str, Any] = {"role": "assistant", "content": None}
        if command is None:
            message["content"] = FINAL_TEXT
            finish = "stop"
        else:
            message["tool_calls"] = [
                {
                    "id": self.call_id("call_", seen),
                    "type": "function",
                    "function": {
                        "name": seen.shell,
                        "arguments": json.dumps(_shell_input(seen, command)),
                    },
                }
            ]
            finish = "tool_calls"
        usage = {
            "prompt_tokens": seen.tokens,
            "completion_tokens": 20,
            "total_tokens": seen.tokens + 20,
        }
        completion = {
            "id": f"chatcmpl-{n:04d}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model"),
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": usage,
        }
        if body.get("stream"):
            options = body.get("stream_options") or {}
            return _sse(_chat_events(completion, bool(options.get("include_usage"))))
        return JSONResponse(completion)


def _shell_input(seen: Seen, command: str) -> dict[str, Any]:
    """The arguments the agent's shell tool takes, from its own schema."""
    schema: Mapping[str, Any] = {}
    for tool in seen.body.get("tools") or []:
        name = (tool.get("function") or {}).get("name") if seen.api == "chat" else tool.get("name")
        if name == seen.shell:
            function = tool.get("function") or {}
            schema = (
                tool.get("input_schema")
                or tool.get("parameters")
                or function.get("parameters")
                or {}
            )
    properties = schema.get("properties") or {}
    if "cmd" in properties:
        return {"cmd": command}
    if (properties.get("command") or {}).get("type") == "array":
        return {"command": ["bash", "-lc", command]}
    arguments: dict[str, Any] = {"command": command}
    if "description" in (schema.get("required") or []):
        arguments["description"] = "Print numbers"
    return arguments


# --- wire shapes ----------------------------------------------------------------------------


def _anthropic_error(message: str) -> Response:
    error = {"type": "error", "error": {"type": "invalid_request_error", "message": message}}
    return JSONResponse(error, status_code=400)


def _openai_error(message: str, code: str | None) -> Response:
    error = {"message": message, "type": "invalid_request_error", "param": None, "code": code}
    return JSONResponse({"error": error}, status_code=400)


def _sse(events: Sequence[tuple[str | None, Any]]) -> Response:
    async def stream() -> AsyncIterator[bytes]:
        for name, data in events:
            text = data if isinstance(data, str) else json.dumps(data)
            yield (f"event: {name}\n" if name else "").encode() + f"data: {text}\n\n".encode()

    return StreamingResponse(stream(), media_type="text/event-stream")


def _anthropic_events(message: Mapping[str, Any]) -> list[tuple[str | None, Any]]:
    start = {**message, "content": [], "stop_reason": None, "stop_sequence": None}
    start["usage"] = {**message["usage"], "output_tokens": 1}
    events: list[tuple[str | None, Any]] = [
        ("message_start", {"type": "message_start", "message": start})
    ]
    for index, block in enumerate(message["content"]):
        kind = block["type"]
        if kind == "text":
            opening: dict[str, Any] = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": block["text"]}]
        elif kind == "thinking":
            opening = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [
                {"type": "thinking_delta", "thinking": block["thinking"]},
                {"type": "signature_delta", "signature": block["signature"]},
            ]
        else:
            opening = {**block, "input": {}}
            deltas = [{"type": "input_json_delta", "partial_json": json.dumps(block["input"])}]
        events.append(
            (
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": opening},
            )
        )
        events.extend(
            ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d})
            for d in deltas
        )
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    delta = {"stop_reason": message["stop_reason"], "stop_sequence": None}
    usage = {"output_tokens": message["usage"]["output_tokens"]}
    events.append(("message_delta", {"type": "message_delta", "delta": delta, "usage": usage}))
    events.append(("message_stop", {"type": "message_stop"}))
    return events


def _responses_events(response: Mapping[str, Any]) -> list[tuple[str | None, Any]]:
    sequence = itertools.count()
    pending = {**response, "status": "in_progress", "output": [], "usage": None}
    events: list[tuple[str | None, Any]] = []

    def add(kind: str, **fields: Any) -> None:
        events.append((kind, {"type": kind, "sequence_number": next(sequence), **fields}))

    add("response.created", response=pending)
    add("response.in_progress", response=pending)
    for index, item in enumerate(response["output"]):
        if item["type"] == "message":
            add(
                "response.output_item.added",
                output_index=index,
                item={**item, "status": "in_progress", "content": []},
            )
            part = item["content"][0]
            where = {"item_id": item["id"], "output_index": index, "content_index": 0}
            add("response.content_part.added", **where, part={**part, "text": ""})
            add("response.output_text.delta", **where, delta=part["text"], logprobs=[])
            add("response.output_text.done", **where, text=part["text"], logprobs=[])
            add("response.content_part.done", **where, part=part)
        else:
            add(
                "response.output_item.added",
                output_index=index,
                item={**item, "status": "in_progress", "arguments": ""},
            )
            where = {"item_id": item["id"], "output_index": index}
            add("response.function_call_arguments.delta", **where, delta=item["arguments"])
            add("response.function_call_arguments.done", **where, arguments=item["arguments"])
        add("response.output_item.done", output_index=index, item=item)
    add("response.completed", response=response)
    return events


def _chat_events(
    completion: Mapping[str, Any], include_usage: bool
) -> list[tuple[str | None, Any]]:
    head = {k: completion[k] for k in ("id", "created", "model")}
    head["object"] = "chat.completion.chunk"
    choice = completion["choices"][0]
    message = choice["message"]
    delta: dict[str, Any] = {"role": "assistant", "content": message["content"]}
    if message.get("tool_calls"):
        delta["tool_calls"] = [{"index": k, **c} for k, c in enumerate(message["tool_calls"])]
    events: list[tuple[str | None, Any]] = [
        (None, {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}),
        (
            None,
            {
                **head,
                "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}],
            },
        ),
    ]
    if include_usage:
        events.append((None, {**head, "choices": [], "usage": completion["usage"]}))
    events.append((None, "[DONE]"))
    return events
