"""Restore's dialect for chat completions: the tool in `tools`, calls in `tool_calls`, answers
as `tool` messages, usage as `prompt_tokens`/`completion_tokens`, streamed deltas."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from inflight.proxy.restore import (
    DESCRIPTION,
    NO_ANSWER,
    PARAMETERS,
    TOOL_NAME,
    Kind,
    by_index,
    hashable,
    names_tool,
)
from inflight.proxy.sse_tap import Usage


def _message(answer: Any) -> dict[str, Any]:
    choices = answer.get("choices") if isinstance(answer, dict) else None
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        message = choices[0].get("message")
        if isinstance(message, dict):
            return message
    return {}


def _function_name(tool: dict[str, Any]) -> Any:
    function = tool.get("function")
    return function.get("name") if isinstance(function, dict) else None


class ChatDialect:
    """`POST /v1/chat/completions`."""

    history = "messages"
    call_key = "id"

    def tool(self) -> dict[str, Any]:
        function = {"name": TOOL_NAME, "description": DESCRIPTION, "parameters": PARAMETERS}
        return {"type": "function", "function": function}

    def forbids(self, body: Mapping[str, Any]) -> bool:
        """`tool_choice: none`, several choices (`n` > 1), or a client tool of that name."""
        n = body.get("n")
        return (
            body.get("tool_choice") == "none"
            or (isinstance(n, int) and n > 1)
            or names_tool(body.get("tools"), _function_name)
        )

    def calls(self, answer: Any) -> list[dict[str, Any]]:
        calls = _message(answer).get("tool_calls")
        if not isinstance(calls, list):
            return []
        return [c for c in calls if isinstance(c, dict) and _function_name(c) == TOOL_NAME]

    def arguments(self, call: Mapping[str, Any]) -> Any:
        function = call.get("function")
        return function.get("arguments") if isinstance(function, dict) else None

    def turn(self, answer: Any, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
        content = _message(answer).get("content")
        return [{"role": "assistant", "content": content, "tool_calls": calls}]

    def lead(self, answer: Any) -> list[dict[str, Any]]:
        return []

    def led(self, answer: dict[str, Any], lead: Sequence[dict[str, Any]]) -> dict[str, Any]:
        return answer

    def replies(self, answers: list[tuple[str, str]]) -> list[dict[str, Any]]:
        return [{"role": "tool", "tool_call_id": i, "content": text} for i, text in answers]

    def usage(self, answer: Any) -> Usage | None:
        return Usage.from_json(answer.get("usage")) if isinstance(answer, dict) else None

    def with_usage(self, answer: dict[str, Any], total: Usage) -> dict[str, Any]:
        return {**answer, "usage": total.as_chat(answer.get("usage"))}

    def visible(self, answer: dict[str, Any]) -> dict[str, Any] | None:
        return None  # the answer never echoes the request's tools

    def kind(self, event: dict[str, Any]) -> Kind | None:
        choices = event.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return None
        delta = choices[0].get("delta")
        if isinstance(delta, dict):
            if delta.get("tool_calls"):
                return "tools"
            if delta.get("content"):
                return "text"
        return "text" if choices[0].get("finish_reason") else None

    def assemble(self, events: list[dict[str, Any]]) -> dict[str, Any]:
        """Deltas joined: the text, and each call's id, name and arguments by `index`."""
        content: list[str] = []
        calls: dict[Any, dict[str, Any]] = {}
        usage: Any = None
        for event in events:
            usage = event.get("usage") or usage
            choices = event.get("choices")
            first = choices[0] if isinstance(choices, list) and choices else None
            delta = first.get("delta") if isinstance(first, dict) else None
            if not isinstance(delta, dict):
                continue
            if isinstance(delta.get("content"), str):
                content.append(delta["content"])
            parts = delta.get("tool_calls")
            for part in parts if isinstance(parts, list) else ():
                if isinstance(part, dict):
                    _add_part(calls, part)
        message: dict[str, Any] = {"role": "assistant", "content": "".join(content) or None}
        message["tool_calls"] = [calls[k] for k in sorted(calls, key=by_index)]
        return {"choices": [{"index": 0, "message": message}], "usage": usage}

    def without_calls(self, answer: dict[str, Any]) -> dict[str, Any]:
        """Each choice's message without the calls; `finish_reason` `stop` when none is left."""
        choices = answer.get("choices")
        if not isinstance(choices, list):
            return answer
        return {**answer, "choices": [_choice_without_calls(c) for c in choices]}

    def stray(self, lead: Sequence[dict[str, Any]] = ()) -> StrayCalls:
        return StrayCalls()


def _choice_without_calls(choice: Any) -> Any:
    message = choice.get("message") if isinstance(choice, dict) else None
    calls = message.get("tool_calls") if isinstance(message, dict) else None
    if not isinstance(message, dict) or not isinstance(calls, list):
        return choice
    kept = [c for c in calls if not (isinstance(c, dict) and _function_name(c) == TOOL_NAME)]
    message = {k: v for k, v in message.items() if k != "tool_calls"}
    if kept:
        return {**choice, "message": {**message, "tool_calls": kept}}
    if not message.get("content"):
        message["content"] = NO_ANSWER
    finish = choice.get("finish_reason")
    return {
        **choice,
        "message": message,
        "finish_reason": "stop" if finish == "tool_calls" else finish,
    }


class StrayCalls:
    """A chat stream without `inflight_restore` calls: their pieces are taken out of the
    deltas, the other calls renumbered from 0 (clients join pieces by `index`), and a
    `tool_calls` finish with no call left becomes `stop`, with `NO_ANSWER` when no text came."""

    def __init__(self) -> None:
        self.index: dict[
            tuple[Any, Any], int | None
        ] = {}  # (choice, call) -> new index, None: dropped
        self.kept: dict[Any, int] = {}  # per choice: the calls kept so far
        self.dropped = False
        self.text = False  # a non-empty content delta has passed

    def wants(self, payload: bytes) -> bool:
        return b"tool_calls" in payload or (not self.text and b'"content"' in payload)

    def apply(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        choices = event.get("choices")
        if not isinstance(choices, list):
            return [event]
        edited = [self._choice(c) for c in choices]
        if all(e is c for e, c in zip(edited, choices, strict=True)):
            return [event]
        kept = [c for c in edited if c is not None]
        if not kept and not event.get("usage"):
            return []
        return [{**event, "choices": kept}]

    def _choice(self, choice: Any) -> Any:
        """The choice with the calls' pieces edited; None when nothing is left of it."""
        if not isinstance(choice, dict) or not isinstance(choice.get("delta"), dict):
            return choice
        at, delta = choice.get("index"), choice["delta"]
        if isinstance(delta.get("content"), str) and delta["content"]:
            self.text = True
        out = choice
        calls = delta.get("tool_calls")
        if isinstance(calls, list):
            parts = [p for p in (self._part(at, p) for p in calls) if p is not None]
            if parts != calls:
                rest = {k: v for k, v in delta.items() if k != "tool_calls"}
                delta = {**rest, "tool_calls": parts} if parts else rest
                out = {**choice, "delta": delta}
        if out.get("finish_reason") == "tool_calls" and self.dropped and not self.kept.get(at):
            delta = out["delta"] if self.text else {**out["delta"], "content": NO_ANSWER}
            return {**out, "delta": delta, "finish_reason": "stop"}
        if out is not choice and not out["delta"] and out.get("finish_reason") is None:
            return None
        return out

    def _part(self, at: Any, part: Any) -> Any:
        """A call's piece renumbered; None when it belongs to an `inflight_restore` call."""
        if not isinstance(part, dict):
            return part
        key = (at, part.get("index"))
        if key not in self.index:  # a call's first piece names it
            if _function_name(part) == TOOL_NAME:
                self.index[key] = None
                self.dropped = True
            else:
                self.index[key] = self.kept.get(at, 0)
                self.kept[at] = self.kept.get(at, 0) + 1
        new = self.index[key]
        if new is None:
            return None
        return part if part.get("index") == new else {**part, "index": new}


def _add_part(calls: dict[Any, dict[str, Any]], part: dict[str, Any]) -> None:
    """One streamed piece of a tool call, joined to the call its `index` names."""
    index = hashable(part.get("index", len(calls)))
    call = calls.setdefault(index, {"type": "function", "function": {"arguments": ""}})
    call["id"] = part.get("id") or call.get("id")
    function = part.get("function")
    if not isinstance(function, dict):
        return
    if function.get("name"):
        call["function"]["name"] = function["name"]
    arguments = function.get("arguments")
    call["function"]["arguments"] += arguments if isinstance(arguments, str) else ""
