"""Restore's dialect for Anthropic's Messages API: the tool with an `input_schema`, calls as
`tool_use` blocks, answers as `tool_result` blocks in the next user message, usage with cache
reads and writes, and the content-block events of a stream."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from inflight.apis.anthropic.events import ANTHROPIC_COUNTS, anthropic_counts
from inflight.proxy.restore import (
    DESCRIPTION,
    NO_ANSWER,
    PARAMETERS,
    TOOL_NAME,
    Kind,
    by_index,
    dicts_in,
    hashable,
    names_tool,
)
from inflight.proxy.sse_tap import Usage

THINKING = ("thinking", "redacted_thinking")  # signed: passed back as they came
KEPT = (*THINKING, "text")  # blocks the appended turn keeps


class MessagesDialect:
    """`POST /v1/messages`."""

    history = "messages"
    call_key = "id"

    def tool(self) -> dict[str, Any]:
        return {"name": TOOL_NAME, "description": DESCRIPTION, "input_schema": PARAMETERS}

    def forbids(self, body: Mapping[str, Any]) -> bool:
        """`tool_choice: {"type": "none"}`, or a client tool of that name."""
        choice = body.get("tool_choice")
        none = isinstance(choice, dict) and choice.get("type") == "none"
        return none or names_tool(body.get("tools"), lambda t: t.get("name"))

    def calls(self, answer: Any) -> list[dict[str, Any]]:
        return [
            b
            for b in dicts_in(answer, "content")
            if b.get("type") == "tool_use" and b.get("name") == TOOL_NAME
        ]

    def arguments(self, call: Mapping[str, Any]) -> Any:
        return call.get("input")

    def turn(self, answer: Any, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Thinking (its signature kept: Anthropic checks it), non-empty text, the calls."""
        kept = [
            b
            for b in dicts_in(answer, "content")
            if b.get("type") in KEPT and (b.get("type") != "text" or b.get("text"))
        ]
        return [{"role": "assistant", "content": [*kept, *calls]}]

    def lead(self, answer: Any) -> list[dict[str, Any]]:
        """The round's thinking blocks: with thinking on, the client's answer is its assistant
        turn, which must begin with the signed thinking the model did before it called the
        tool (the turn then goes on with the final round's blocks)."""
        return [b for b in dicts_in(answer, "content") if b.get("type") in THINKING]

    def led(self, answer: dict[str, Any], lead: Sequence[dict[str, Any]]) -> dict[str, Any]:
        return {**answer, "content": [*lead, *dicts_in(answer, "content")]}

    def replies(self, answers: list[tuple[str, str]]) -> list[dict[str, Any]]:
        results = [
            {"type": "tool_result", "tool_use_id": i, "content": text} for i, text in answers
        ]
        return [{"role": "user", "content": results}]

    def usage(self, answer: Any) -> Usage | None:
        return Usage.from_anthropic(answer.get("usage")) if isinstance(answer, dict) else None

    def with_usage(self, answer: dict[str, Any], total: Usage) -> dict[str, Any]:
        stated = answer.get("usage")
        usage = dict(stated) if isinstance(stated, dict) else {}
        for key, count in zip(ANTHROPIC_COUNTS, anthropic_counts(total), strict=True):
            if count or key in usage or key in ("input_tokens", "output_tokens"):
                usage[key] = count
        return {**answer, "usage": usage}

    def visible(self, answer: dict[str, Any]) -> dict[str, Any] | None:
        return None  # the answer never echoes the request's tools

    def kind(self, event: dict[str, Any]) -> Kind | None:
        kind = event.get("type")
        if kind == "content_block_start":
            block = event.get("content_block")
            return "tools" if isinstance(block, dict) and block.get("type") == "tool_use" else None
        if kind == "content_block_delta":
            delta = event.get("delta")
            if isinstance(delta, dict) and delta.get("type") == "text_delta" and delta.get("text"):
                return "text"
            return None
        return "text" if kind in ("message_delta", "message_stop") else None

    def assemble(self, events: list[dict[str, Any]]) -> dict[str, Any]:
        """`message_start`'s message with its blocks built from the deltas, and the usage and
        stop reason of `message_delta`."""
        message: dict[str, Any] = {"role": "assistant", "content": []}
        blocks: dict[Any, dict[str, Any]] = {}
        partial: dict[Any, str] = {}
        for event in events:
            kind = event.get("type")
            if kind == "message_start" and isinstance(event.get("message"), dict):
                message = {**event["message"], "content": []}
            elif kind == "content_block_start" and isinstance(event.get("content_block"), dict):
                blocks[_index(event)] = dict(event["content_block"])
            elif kind == "content_block_delta" and _index(event) in blocks:
                _add_delta(blocks[_index(event)], event.get("delta"), partial, _index(event))
            elif kind == "message_delta":
                delta, usage = event.get("delta"), event.get("usage")
                message.update(delta if isinstance(delta, dict) else {})
                before = message.get("usage")
                message["usage"] = {
                    **(before if isinstance(before, dict) else {}),
                    **(usage if isinstance(usage, dict) else {}),
                }
        for index, text in partial.items():
            try:
                blocks[index]["input"] = orjson.loads(text) if text else {}
            except orjson.JSONDecodeError:
                blocks[index]["input"] = text
        message["content"] = [blocks[k] for k in sorted(blocks, key=by_index)]
        return message

    def without_calls(self, answer: dict[str, Any]) -> dict[str, Any]:
        """The content without the calls; `stop_reason` `end_turn` when no `tool_use` is left,
        a text block `NO_ANSWER` when no text or call is."""
        content = [b for b in dicts_in(answer, "content") if not _restore_use(b)]
        if not any(b.get("type") in ANSWERING for b in content):
            content.append({"type": "text", "text": NO_ANSWER})
        out = {**answer, "content": content}
        if answer.get("stop_reason") == "tool_use" and not _uses(content):
            out["stop_reason"] = "end_turn"
        return out

    def stray(self, lead: Sequence[dict[str, Any]] = ()) -> StrayUses:
        return StrayUses(list(lead))


def _index(event: Mapping[str, Any]) -> Any:
    """An event's block `index`, hashable (a malformed upstream's list or object: None)."""
    return hashable(event.get("index"))


ANSWERING = ("text", "tool_use", "server_tool_use")  # blocks that are an answer (not thinking)


def _restore_use(block: Any) -> bool:
    return (
        isinstance(block, dict)
        and block.get("type") == "tool_use"
        and block.get("name") == TOOL_NAME
    )


def _uses(blocks: list[dict[str, Any]]) -> bool:
    return any(b.get("type") == "tool_use" for b in blocks)


class StrayUses:
    """A Messages stream without `inflight_restore` blocks: their `content_block_*` events are
    dropped and the later blocks renumbered (clients index the content list by `index`); a
    `tool_use` stop with no call left becomes `end_turn`, after a `NO_ANSWER` text block when
    no text or call came. The `lead` blocks (earlier rounds' thinking) come first, right after
    `message_start`, and the stream's own blocks after them."""

    def __init__(self, lead: list[dict[str, Any]] | None = None) -> None:
        self.lead = lead or []  # blocks still to send first (emptied once sent)
        self.shift = len(self.lead)  # the stream's blocks come after these
        self.index: dict[Any, int | None] = {}  # block index -> new index, None: dropped
        self.answering = False  # a text or client call block has started
        self.uses = False  # a client `tool_use` block has started

    def wants(self, payload: bytes) -> bool:
        return (
            b"content_block_start" in payload
            or (bool(self.lead) and b"message_start" in payload)
            or (
                (self.shift > 0 or None in self.index.values())
                and (b'"index"' in payload or b"message_delta" in payload)
            )
        )

    def apply(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        kind = event.get("type")
        if kind == "message_start" and self.lead:
            lead, self.lead = self.lead, []
            return [event, *(e for at, b in enumerate(lead) for e in _block_events(at, b))]
        if kind == "content_block_start":
            block = event.get("content_block")
            if _restore_use(block):
                self.index[_index(event)] = None
                return []
            if isinstance(block, dict):
                self.answering |= block.get("type") in ANSWERING
                self.uses |= block.get("type") == "tool_use"
            self.index[_index(event)] = self._kept()
        if kind in ("content_block_start", "content_block_delta", "content_block_stop"):
            new = self.index.get(_index(event), event.get("index"))
            if new is None:
                return []
            return [event] if new == event.get("index") else [{**event, "index": new}]
        if kind == "message_delta" and None in self.index.values():
            return self._end(event)
        return [event]

    def _end(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        """The `message_delta` of a stream that dropped a call: the stop reason, and the
        `NO_ANSWER` block first when nothing else answers."""
        delta = event.get("delta")
        if isinstance(delta, dict) and delta.get("stop_reason") == "tool_use" and not self.uses:
            event = {**event, "delta": {**delta, "stop_reason": "end_turn"}}
        if self.answering:
            return [event]
        at = self._kept()
        text = {"type": "text_delta", "text": NO_ANSWER}
        return [
            {
                "type": "content_block_start",
                "index": at,
                "content_block": {"type": "text", "text": ""},
            },
            {"type": "content_block_delta", "index": at, "delta": text},
            {"type": "content_block_stop", "index": at},
            event,
        ]

    def _kept(self) -> int:
        """The index of the next block the client sees."""
        return self.shift + sum(v is not None for v in self.index.values())


def _block_events(at: int, block: dict[str, Any]) -> list[dict[str, Any]]:
    """A whole block as the events that stream it at `index` `at`: thinking as its text and
    its signature in deltas (as Anthropic streams it), any other block whole at its start."""
    if block.get("type") != "thinking":
        start = {"type": "content_block_start", "index": at, "content_block": block}
        return [start, {"type": "content_block_stop", "index": at}]
    empty = {"type": "thinking", "thinking": "", "signature": ""}
    thinking = {"type": "thinking_delta", "thinking": str(block.get("thinking", ""))}
    signature = {"type": "signature_delta", "signature": str(block.get("signature", ""))}
    return [
        {"type": "content_block_start", "index": at, "content_block": empty},
        {"type": "content_block_delta", "index": at, "delta": thinking},
        {"type": "content_block_delta", "index": at, "delta": signature},
        {"type": "content_block_stop", "index": at},
    ]


def _add_delta(block: dict[str, Any], delta: Any, partial: dict[Any, str], index: Any) -> None:
    """One streamed delta joined to its block (JSON input is parsed once it is whole)."""
    if not isinstance(delta, dict):
        return
    kind = delta.get("type")
    if kind == "text_delta":
        block["text"] = block.get("text", "") + str(delta.get("text", ""))
    elif kind == "input_json_delta":
        partial[index] = partial.get(index, "") + str(delta.get("partial_json", ""))
    elif kind == "thinking_delta":
        block["thinking"] = block.get("thinking", "") + str(delta.get("thinking", ""))
    elif kind == "signature_delta":
        block["signature"] = block.get("signature", "") + str(delta.get("signature", ""))
