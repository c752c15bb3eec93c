"""Restore (DESIGN.md §11): the `inflight_restore` tool the proxy offers and answers itself.

When restore is on and the forwarded chat request carries at least one elision marker, the
proxy offers the model a function tool `inflight_restore(ref)`. An answer whose calls include
it is not returned: the proxy appends that assistant turn (its restore calls only — the
client's own calls in the same turn are dropped, the model re-issues them once it has read)
and one tool answer per call, resolved against the originals of the request being served (the
client resends its whole history, so nothing is stored), cut to fit what is left of the budget,
and asks again. At most `MAX_ROUNDS` upstream requests: the last one does not offer the tool,
so the model must answer. The client never sees the tool, the calls or the extra messages; the
usage it gets (and the one usage record) is the sum of every round.

This module is the loop's logic on chat bodies and answers; `restore_stream.py` holds back a
stream until its kind is known. Only chat completions offer restore; on the Responses and
Messages routes the markers carry refs (the ledger names them) but no tool is offered.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from app.compaction.refs import REF_SUFFIX_RE
from app.proxy.sse_tap import Usage
from app.proxy.upstream import read_all

if TYPE_CHECKING:
    import httpx

TOOL_NAME = "inflight_restore"
MAX_ROUNDS = 3  # upstream requests per client request; the last one does not offer the tool
TOOL_TOKENS = 120  # what the tool's definition costs in the prompt, with margin
CHARS_PER_TOKEN = 3  # conservative: an answer cut to this many chars per token of room
MIN_ROOM_CHARS = 200
DESCRIPTION = (
    "Read the original text of something inflight cut from this conversation to fit the "
    "context window. Markers like [… inflight truncated N chars (ref: ID)], "
    "[inflight pruned an old output of TOOL: N chars (ref: ID)] or "
    "[inflight removed N earlier messages … (ref: ID)] stand for it: pass the ID."
)
CHAT_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": DESCRIPTION,
        "parameters": {
            "type": "object",
            "properties": {"ref": {"type": "string", "description": "the ID in (ref: ID)"}},
            "required": ["ref"],
        },
    },
}


def _calls_tool(call: Any) -> bool:
    function = call.get("function") if isinstance(call, dict) else None
    return isinstance(function, dict) and function.get("name") == TOOL_NAME


def restore_calls(message: Any) -> list[dict[str, Any]]:
    """The `inflight_restore` calls of an assistant message (none: an ordinary answer)."""
    calls = message.get("tool_calls") if isinstance(message, dict) else None
    return [c for c in calls if _calls_tool(c)] if isinstance(calls, list) else []


def _forbids_tools(body: Mapping[str, Any]) -> bool:
    """Whether the client's request rules out offering a tool: `tool_choice: none`, several
    choices (`n` > 1), or a tool of its own with the same name."""
    if body.get("tool_choice") == "none":
        return True
    n = body.get("n")
    if isinstance(n, int) and n > 1:
        return True
    tools = body.get("tools")
    return isinstance(tools, list) and any(
        isinstance(t, dict) and (t.get("function") or {}).get("name") == TOOL_NAME for t in tools
    )


def marked_refs(messages: Any, refs: Mapping[str, str]) -> bool:
    """Whether `messages` carry at least one marker whose ref the proxy can resolve."""
    text = orjson.dumps(messages).decode()
    return any(m.group(1) in refs for m in REF_SUFFIX_RE.finditer(text))


@dataclass(slots=True)
class RestoreLoop:
    """One client request's restore rounds: what to send next, and what the model read."""

    body: dict[str, Any]  # the compacted body as first forwarded (without the tool)
    refs: Mapping[str, str]  # ref -> original text (app/compaction/restorable.py)
    room_chars: int  # what the restored texts may take together
    rounds: int = 1  # upstream requests so far
    calls: int = 0  # restore calls answered
    usage: Usage | None = None  # of the rounds before the current one
    extra: list[dict[str, Any]] = field(default_factory=list)  # the turns appended so far

    @classmethod
    def start(
        cls, body: Mapping[str, Any], refs: Mapping[str, str], room_tokens: int
    ) -> RestoreLoop | None:
        """A loop for `body` (the compacted chat body), or None when restore has nothing to
        offer or may not offer a tool (the request is then forwarded exactly as before)."""
        if not refs or _forbids_tools(body) or not marked_refs(body.get("messages"), refs):
            return None
        room = max(0, room_tokens - TOOL_TOKENS) * CHARS_PER_TOKEN
        return cls(dict(body), refs, room)

    @property
    def offering(self) -> bool:
        """Whether the current round offers the tool (every round but the last)."""
        return self.rounds < MAX_ROUNDS

    def request(self) -> dict[str, Any]:
        """The body of the current round: the turns so far, the tool offered unless last."""
        out = dict(self.body)
        if self.extra:
            out["messages"] = [*self.body["messages"], *self.extra]
        if self.offering:
            out["tools"] = [*(self.body.get("tools") or ()), CHAT_TOOL]
        return out

    def answer(
        self, message: Mapping[str, Any], calls: Iterable[dict[str, Any]], usage: Usage | None
    ) -> None:
        """Take in an answer that called the tool: its turn and the tool's answers join the
        conversation, and the next round begins."""
        answered: list[dict[str, Any]] = []
        replies: list[dict[str, Any]] = []
        for k, call in enumerate(calls):
            call_id = call.get("id") or f"inflight_restore_{self.rounds}_{k}"
            answered.append({**call, "id": call_id})
            text = self.resolve(call.get("function", {}).get("arguments"))
            replies.append({"role": "tool", "tool_call_id": call_id, "content": text})
        turn: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
        turn["tool_calls"] = answered
        self.extra += [turn, *replies]
        self.calls += len(answered)
        self.usage = usage if self.usage is None else self.usage.plus(usage)
        self.rounds += 1

    def resolve(self, arguments: Any) -> str:
        """The tool's answer to one call: the original text (cut to the room left), or why
        there is none — never an error: the model reads it and goes on."""
        try:
            parsed = orjson.loads(arguments) if isinstance(arguments, str) else arguments
        except orjson.JSONDecodeError:
            parsed = None
        ref = parsed.get("ref") if isinstance(parsed, dict) else None
        if not isinstance(ref, str):
            return f'{TOOL_NAME}: the arguments must be {{"ref": "ID"}}, ID from a (ref: ID) marker'
        ref = ref.strip().removeprefix("(ref: ").removesuffix(")").strip()
        original = self.refs.get(ref)
        if original is None:
            return f"{TOOL_NAME}: no cut text has the ref {ref!r} in this conversation"
        return self._fit(ref, original)

    def _fit(self, ref: str, original: str) -> str:
        room = self.room_chars
        if len(original) <= room:
            self.room_chars -= len(original)
            return original
        if room < MIN_ROOM_CHARS:
            return f"{TOOL_NAME}: no room is left in the context window to restore {ref}"
        self.room_chars = 0
        head = room * 2 // 3
        tail = room - head
        note = f"[{TOOL_NAME}: {len(original) - room} of {len(original)} chars not shown]"
        return f"{original[:head]}\n\n{note}\n\n{original[len(original) - tail :]}"


def restore_headers(loop: RestoreLoop) -> dict[str, str]:
    """What restore did, for the response's report headers (the client sees no tool)."""
    return {
        "X-Compaction-Restore-Rounds": str(loop.rounds),
        "X-Compaction-Restore-Calls": str(loop.calls),
    }


def answer_message(content: bytes) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """A JSON chat answer and its first choice's message; None when it is not one."""
    try:
        data = orjson.loads(content)
    except orjson.JSONDecodeError:
        return None
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    message = choices[0].get("message")
    return (data, message) if isinstance(message, dict) else None


def with_usage(data: dict[str, Any], earlier: Usage | None) -> tuple[bytes, Usage | None]:
    """The final JSON answer with the usage of every round summed, and that sum."""
    usage = Usage.from_json(data.get("usage"))
    if earlier is None:
        return orjson.dumps(data), usage
    total = earlier.plus(usage)
    return orjson.dumps({**data, "usage": total.as_chat(data.get("usage"))}), total


Send = Callable[[dict[str, Any]], Awaitable["httpx.Response"]]  # one round's body -> its answer


async def follow_json(
    loop: RestoreLoop, upstream: httpx.Response, send: Send
) -> tuple[httpx.Response, bytes]:
    """Read the JSON answer of the first round (`upstream`, a success) and run the loop: while
    the answer calls the tool and a round is left, answer the calls and ask again. Returns the
    last response (closed) and the body to relay: the final answer with the usage of every
    round summed; an error of a later round as it came."""
    content = await read_all(upstream)
    while upstream.status_code < 400:
        parsed = answer_message(content)
        if parsed is None:
            return upstream, content
        data, message = parsed
        calls = restore_calls(message)
        if not calls or not loop.offering:
            return upstream, with_usage(data, loop.usage)[0]
        loop.answer(message, calls, Usage.from_json(data.get("usage")))
        upstream = await send(loop.request())
        content = await read_all(upstream)
    return upstream, content
