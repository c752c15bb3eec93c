"""Restore (DESIGN.md §11): the `inflight_restore` tool the proxy offers and answers itself.

This module is the loop, on any API through its `Dialect` (where the APIs differ: each API's
`restore.py` under app/apis/); `restore_stream.py` holds back a stream until its kind is known.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

import anyio
import orjson

from inflight.compaction.refs import REF_SUFFIX_RE
from inflight.proxy.sse_tap import EventEdit, SSETap, Usage
from inflight.proxy.upstream import read_all

if TYPE_CHECKING:
    import httpx

    from inflight.compaction.compacted import Compacted

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
PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"ref": {"type": "string", "description": "the ID in (ref: ID)"}},
    "required": ["ref"],
}
# What the client gets when the answer of the last round (which does not offer the tool) was
# nothing but calls to it: those are dropped, and the answer says why it is empty.
NO_ANSWER = (
    "[inflight: the model asked to read more of the text cut from this conversation after the "
    "last restore round, and gave no answer. Ask again, or narrow the question.]"
)
Kind = Literal["text", "tools"]


class Dialect(Protocol):
    """Where restore differs between APIs: the tool's shape, calls and turns, usage, and what
    a stream's first events say."""

    history: str  # the body field that holds the conversation
    call_key: str  # the field of a call that its answer names (`id`, `call_id`)

    def tool(self) -> dict[str, Any]: ...

    def forbids(self, body: Mapping[str, Any]) -> bool:
        """Whether the client's request rules out offering a tool."""
        ...

    def calls(self, answer: Any) -> list[dict[str, Any]]:
        """The answer's `inflight_restore` calls (none: an ordinary answer)."""
        ...

    def arguments(self, call: Mapping[str, Any]) -> Any: ...

    def turn(self, answer: Any, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The assistant turn to append: the answer with only its restore calls."""
        ...

    def lead(self, answer: Any) -> list[dict[str, Any]]:
        """What of an answered round the client's answer must begin with (Messages: its
        signed thinking, which a client with thinking on must send back first); often none."""
        ...

    def led(self, answer: dict[str, Any], lead: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """The final JSON answer beginning with `lead` (the earlier rounds' `lead`s)."""
        ...

    def replies(self, answers: list[tuple[str, str]]) -> list[dict[str, Any]]:
        """The tool answers to append, as (call id, text)."""
        ...

    def usage(self, answer: Any) -> Usage | None: ...

    def with_usage(self, answer: dict[str, Any], total: Usage) -> dict[str, Any]:
        """The final answer stating the usage of every round."""
        ...

    def visible(self, answer: dict[str, Any]) -> dict[str, Any] | None:
        """The answer as the client may see it, when showing it as it came would reveal the
        tool (an API that echoes `tools`); None when it reveals nothing."""
        ...

    def kind(self, event: dict[str, Any]) -> Kind | None:
        """What a stream event says the answer is; None while it says nothing yet."""
        ...

    def assemble(self, events: list[dict[str, Any]]) -> dict[str, Any]:
        """A whole streamed answer as its JSON answer would be."""
        ...

    def without_calls(self, answer: dict[str, Any]) -> dict[str, Any]:
        """`answer` without its `inflight_restore` calls (a model may call a tool it saw
        earlier even when it is not offered); `NO_ANSWER` as its text when nothing is left."""
        ...

    def stray(self, lead: Sequence[dict[str, Any]] = ()) -> EventEdit:
        """A new edit for one relayed stream: without the calls, beginning with `lead`, event
        by event."""
        ...


def marked_refs(history: Any, refs: Mapping[str, str]) -> bool:
    """Whether `history` carries at least one marker whose ref the proxy can resolve."""
    text = orjson.dumps(history).decode()
    return any(m.group(1) in refs for m in REF_SUFFIX_RE.finditer(text))


def dicts_in(answer: Any, key: str) -> list[dict[str, Any]]:
    """The objects in the list `answer[key]` (an answer's output items or content blocks)."""
    found = answer.get(key) if isinstance(answer, dict) else None
    return [x for x in found if isinstance(x, dict)] if isinstance(found, list) else []


def by_index(index: Any) -> tuple[int, int, str]:
    """The sort key of a streamed part's `index`: numbers in numeric order (0, 1, …, 10), then
    whatever a malformed upstream sent instead."""
    if isinstance(index, int) and not isinstance(index, bool):
        return 0, index, ""
    return 1, 0, str(index)


def hashable(index: Any) -> Any:
    """A streamed part's `index` as a dict key (a malformed upstream's list or object: None)."""
    return index if isinstance(index, int | str) or index is None else None


def client_tools(body: Mapping[str, Any]) -> list[Any] | None:
    """The client's `tools` beside which the proxy's tool may be offered (absent or null: none
    yet); None when they are of a type the proxy does not read (forwarded as received)."""
    tools = body.get("tools")
    if tools is None:
        return []
    return tools if isinstance(tools, list) else None


def names_tool(tools: Any, name_of: Callable[[dict[str, Any]], Any]) -> bool:
    """Whether the client's own `tools` already name one `inflight_restore`."""
    return isinstance(tools, list) and any(
        isinstance(t, dict) and name_of(t) == TOOL_NAME for t in tools
    )


@dataclass(slots=True)
class RestoreLoop:
    """One client request's restore rounds: what to send next, and what the model read.

    When restore is on and the forwarded request carries at least one elision marker the proxy can
    resolve, it offers the model a function tool `inflight_restore(ref)`. An answer that calls it is
    not returned: the proxy appends that assistant turn (its restore calls only — the client's own
    calls in the same turn are dropped, the model re-issues them once it has read) and one tool
    answer per call, resolved against the originals of the request being served (the client resends
    its whole history, so nothing is stored), cut to fit what is left of the budget, and asks again.
    At most `MAX_ROUNDS` upstream requests: the last one does not offer the tool, so the model must
    answer. The client never sees the tool, the calls or the extra messages: a call the proxy does
    not answer (the last round's, or one after text a stream already relayed) is dropped from what
    the client gets, and an answer that was nothing else says `NO_ANSWER`. The usage it gets (and
    the one usage record) is the sum of every round; when a later round fails, the client gets that
    failure and the record still has the rounds before it. What a client must send back first
    (Messages: the signed thinking before a restore call) leads its answer. A client that hangs up
    during the rounds stops them at once (`unless_hung_up`).
    """

    dialect: Dialect
    body: dict[str, Any]  # the compacted body as first forwarded (without the tool)
    refs: Mapping[str, str]  # ref -> original text (app/compaction/restorable.py)
    room_chars: int  # what the restored texts may take together
    rounds: int = 1  # upstream requests so far
    calls: int = 0  # restore calls answered
    usage: Usage | None = None  # of the rounds before the current one
    extra: list[dict[str, Any]] = field(default_factory=list)  # the turns appended so far
    lead: list[dict[str, Any]] = field(default_factory=list)  # what the client's answer begins

    @classmethod
    def start(
        cls,
        dialect: Dialect,
        body: Mapping[str, Any],
        refs: Mapping[str, str],
        room_tokens: int,
    ) -> RestoreLoop | None:
        """A loop for `body` (the compacted body), or None when restore has nothing to offer
        or may not offer a tool (the request is then forwarded exactly as before): also when
        the history is no list or `tools` neither a list nor null (the upstream judges those)."""
        history = body.get(dialect.history)
        if not refs or not isinstance(history, list) or client_tools(body) is None:
            return None
        if dialect.forbids(body) or not marked_refs(history, refs):
            return None
        room = max(0, room_tokens - TOOL_TOKENS) * CHARS_PER_TOKEN
        return cls(dialect, dict(body), refs, room)

    @property
    def offering(self) -> bool:
        """Whether the current round offers the tool (every round but the last)."""
        return self.rounds < MAX_ROUNDS

    def request(self) -> dict[str, Any]:
        """The body of the current round: the turns so far, the tool offered unless last."""
        out = dict(self.body)
        if self.extra:
            out[self.dialect.history] = [*self.body[self.dialect.history], *self.extra]
        if self.offering:
            out["tools"] = [*(client_tools(self.body) or ()), self.dialect.tool()]
        return out

    def answer(self, answer: Any, calls: list[dict[str, Any]]) -> None:
        """Take in an answer that called the tool: its turn and the tool's answers join the
        conversation, and the next round begins."""
        key = self.dialect.call_key
        named = [
            {**call, key: call.get(key) or f"inflight_restore_{self.rounds}_{k}"}
            for k, call in enumerate(calls)
        ]
        texts = [(c[key], self.resolve(self.dialect.arguments(c))) for c in named]
        self.extra += [*self.dialect.turn(answer, named), *self.dialect.replies(texts)]
        self.lead += self.dialect.lead(answer)
        self.calls += len(named)
        usage = self.dialect.usage(answer)
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

    def final(self, answer: dict[str, Any], content: bytes) -> bytes:
        """The final JSON answer (`content`, parsed as `answer`): its usage the sum of every
        round's, without the tool or calls to it; the bytes as received when that changes
        nothing."""
        stray = bool(self.dialect.calls(answer))  # the last round's: not answered
        if stray:
            answer = self.dialect.without_calls(answer)
        if self.lead:
            answer = self.dialect.led(answer, self.lead)
        shown = self.dialect.visible(answer)
        if self.usage is None and shown is None and not stray and not self.lead:
            return content
        shown = answer if shown is None else shown
        if self.usage is not None:
            shown = self.dialect.with_usage(shown, self.usage.plus(self.dialect.usage(answer)))
        return orjson.dumps(shown)

    def prepare(self, tap: SSETap) -> None:
        """Set up the tap of the stream relayed after the loop: the earlier rounds' usage to
        add (already the stream's usage: a stream that breaks before stating its own still
        records them), the calls to the tool to drop, and the tool to hide from the events
        that echo `tools`."""
        tap.carry = tap.usage = self.usage
        tap.edit = self.dialect.stray(self.lead)
        if self.dialect.visible({"tools": [self.dialect.tool()]}) is not None:
            tap.hide_tool = TOOL_NAME


def offer(compacted: Compacted, dialect: Dialect) -> tuple[RestoreLoop, Compacted] | None:
    """Restore's loop for what the compaction service decided to forward, and that decision
    now offering the tool (the counter's view too: its tokens are in the prompt); None when
    restore is off or has nothing to offer (what is forwarded does not change)."""
    if not compacted.refs:
        return None
    room = compacted.budget - compacted.tokens_after
    loop = RestoreLoop.start(dialect, compacted.body, compacted.refs, room)
    if loop is None:
        return None
    body = loop.request()
    view = {**compacted.view, "tools": [*(client_tools(compacted.view) or ()), dialect.tool()]}
    return loop, replace(compacted, body=body, forward=orjson.dumps(body), view=view)


def restore_headers(loop: RestoreLoop) -> dict[str, str]:
    """What restore did, for the response's report headers (the client sees no tool)."""
    return {
        "X-Compaction-Restore-Rounds": str(loop.rounds),
        "X-Compaction-Restore-Calls": str(loop.calls),
    }


Send = Callable[[dict[str, Any]], Awaitable["httpx.Response"]]  # one round's body -> its answer
Receive = Callable[[], Awaitable[Mapping[str, Any]]]  # the client request's ASGI `receive`
T = TypeVar("T")


async def unless_hung_up(
    receive: Receive, first: httpx.Response, send: Send, rounds: Callable[[Send], Awaitable[T]]
) -> tuple[T] | None:
    """Restore's `rounds` (on the first round's answer `first`, the next ones asked through
    `send`), or None when the client hung up first: then they stop at once — the upstream
    answer being read is closed and no other round starts (each would resend the prompt)."""
    opened = [first]

    async def tracked(body: dict[str, Any]) -> httpx.Response:
        response = await send(body)
        opened.append(response)
        return response

    done: list[T] = []
    failed: list[Exception] = []
    async with anyio.create_task_group() as group:
        group.start_soon(_cancel_on_hang_up, receive, group.cancel_scope)
        try:
            done.append(await rounds(tracked))
        except Exception as exc:  # noqa: BLE001 - raised below as itself, not in a group
            failed.append(exc)
        group.cancel_scope.cancel()
    if failed:
        raise failed[0]
    if done:
        return (done[0],)
    with anyio.CancelScope(shield=True):
        for response in opened:
            await response.aclose()
    return None


async def _cancel_on_hang_up(receive: Receive, scope: anyio.CancelScope) -> None:
    while (await receive())["type"] != "http.disconnect":
        continue
    scope.cancel()


async def follow_json(
    loop: RestoreLoop, upstream: httpx.Response, send: Send
) -> tuple[httpx.Response, bytes]:
    """Read the JSON answer of the first round (`upstream`, a success) and run the loop: while
    the answer calls the tool and a round is left, answer the calls and ask again. Returns the
    last response (closed) and the body to relay: the final answer with the usage of every
    round summed; an error of a later round as it came."""
    content = await read_all(upstream)
    while upstream.status_code < 400:
        try:
            answer = orjson.loads(content)
        except orjson.JSONDecodeError:
            return upstream, content
        if not isinstance(answer, dict):
            return upstream, content
        calls = loop.dialect.calls(answer)
        if not calls or not loop.offering:
            return upstream, loop.final(answer, content)
        loop.answer(answer, calls)
        upstream = await send(loop.request())
        content = await read_all(upstream)
    return upstream, content
