"""OpenAI Responses: `input` items as the planner's chat-shaped view, and back (DESIGN.md §8)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from inflight.compaction.wire import ApiName, Conversation
from inflight.errors import BadRequest


@dataclass(frozen=True, slots=True)
class CallKind:
    """A client-executed call item type and how its output names it."""

    output: str  # the output item's type
    key: str  # the call's field that names it
    answer_keys: tuple[str, ...]  # the output's fields that name the call (first present wins)
    arguments: tuple[str, ...]  # the call's fields shown as its arguments (first present wins)


CALLS: dict[str, CallKind] = {
    "function_call": CallKind("function_call_output", "call_id", ("call_id",), ("arguments",)),
    "custom_tool_call": CallKind("custom_tool_call_output", "call_id", ("call_id",), ("input",)),
    # The SDK names the output's link `id`, the guides `call_id`: either is read.
    "local_shell_call": CallKind(
        "local_shell_call_output", "call_id", ("call_id", "id"), ("action",)
    ),
    "computer_call": CallKind(
        "computer_call_output", "call_id", ("call_id",), ("action", "actions")
    ),
    "shell_call": CallKind("shell_call_output", "call_id", ("call_id",), ("action",)),
    "apply_patch_call": CallKind(
        "apply_patch_call_output", "call_id", ("call_id",), ("operation",)
    ),
    "mcp_approval_request": CallKind(
        "mcp_approval_response", "id", ("approval_request_id",), ("arguments",)
    ),
    "tool_search_call": CallKind("tool_search_output", "call_id", ("call_id",), ("arguments",)),
    "program": CallKind("program_output", "call_id", ("call_id",), ("code",)),
}
OUTPUTS: dict[str, str] = {kind.output: call for call, kind in CALLS.items()}
COMPACTION = "compaction"  # a provider's stand-in for the history before it: pinned
SKIP_STRING_INPUT = "input is a string"
SKIP_NO_INPUT = "no input items"


@dataclass(frozen=True, slots=True)
class ResponsesConversation(Conversation):
    """The view with, for each view message, the indices of the `input` items it stands for."""

    groups: tuple[tuple[int, ...], ...] = ()
    compacted_head: bool = False  # view message 0 is the history through a `compaction` item

    def origin(self, position: int) -> tuple[int, ...]:
        """The `input` items of view message `position`."""
        return self.groups[position]


def _kind(item: Mapping[str, Any]) -> str:
    """`message` for a message item (typed, or shorthand with a role), `item_reference` for an
    untyped one with only an id (the SDK's `type` is optional there), else its type."""
    kind = item.get("type")
    if kind is None:
        return "item_reference" if item.get("role") is None else "message"
    return str(kind)


def _check(items: list[Any]) -> None:
    """400 naming the first item that is not an object, or has neither `type`, `role` nor
    `id`."""
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise BadRequest(f"input[{i}] must be an object", param=f"input[{i}]")
        kind, role = item.get("type"), item.get("role")
        if kind is None and role is None and not isinstance(item.get("id"), str):
            raise BadRequest(f"input[{i}] has neither a type nor a role", param=f"input[{i}]")
        if kind is not None and not isinstance(kind, str):
            raise BadRequest(f"input[{i}].type must be a string", param=f"input[{i}].type")
        is_message = kind == "message" or (kind is None and role is not None)
        if is_message and not isinstance(role, str):
            raise BadRequest(f"input[{i}].role must be a string", param=f"input[{i}].role")


def _first(item: Mapping[str, Any], fields: Sequence[str]) -> Any:
    return next((item[f] for f in fields if item.get(f) is not None), None)


def _ident(value: Any) -> Hashable:
    """An id as a key: client data, so an object or a list stands as its JSON text."""
    return orjson.dumps(value) if isinstance(value, dict | list) else value


def _answer_key(item: Mapping[str, Any]) -> tuple[str, Hashable]:
    """(call type, id) that an output item answers."""
    call = OUTPUTS[_kind(item)]
    return call, _ident(_first(item, CALLS[call].answer_keys))


def _call_key(item: Mapping[str, Any]) -> tuple[str, Hashable]:
    call = _kind(item)
    return call, _ident(item.get(CALLS[call].key))


@dataclass(slots=True)
class _Grouping:
    """The walk over `input` that finds the groups; `orphan` is the first output item whose
    call is not in its round."""

    items: Sequence[Mapping[str, Any]]
    groups: list[tuple[int, ...]]
    orphan: int | None = None

    def kind(self, i: int) -> str:
        return _kind(self.items[i]) if i < len(self.items) else ""

    def after_reasoning(self, i: int) -> int:
        """The first item at or after i that is not a reasoning item."""
        while self.kind(i) == "reasoning":
            i += 1
        return i

    def walk(self) -> None:
        i, n = 0, len(self.items)
        while i < n:
            j = self.after_reasoning(i)
            if self.kind(j) in CALLS:
                i = self.round(i)
                continue
            if self.kind(j) in OUTPUTS and self.orphan is None:
                self.orphan = j
            # reasoning goes with the item it preceded, whatever its type (OpenAI rejects a
            # reasoning item without its following item); a trailing run is one group
            end = min(j + 1, n)
            self.groups.append(tuple(range(i, end)))
            i = end

    def round(self, start: int) -> int:
        """Group the call round starting at `start`; returns where the next group starts."""
        heads: list[int] = []  # reasoning and call items: the view's assistant message
        outputs: list[int] = []
        pending: Counter[tuple[str, Hashable]] = Counter()
        i = start
        while i < len(self.items):
            j = self.after_reasoning(i)
            if self.kind(j) in CALLS and (not outputs or pending):
                heads.extend(range(i, j + 1))
                pending[_call_key(self.items[j])] += 1
                i = j + 1
            elif self.kind(i) in OUTPUTS and pending[_answer_key(self.items[i])] > 0:
                key = _answer_key(self.items[i])
                pending[key] -= 1
                if not pending[key]:
                    del pending[key]
                outputs.append(i)
                i += 1
            else:
                break
        self.groups.append(tuple(heads))
        self.groups.extend((k,) for k in outputs)
        return i


def _texts(item: Mapping[str, Any]) -> Iterator[str]:
    """The readable text of a reasoning item (its summary and content; never the encrypted
    part, which is opaque)."""
    for field in ("summary", "content"):
        parts = item.get(field)
        for part in parts if isinstance(parts, list) else []:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                yield part["text"]


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return "" if value is None else orjson.dumps(value).decode()


def _view_call(item: Mapping[str, Any]) -> dict[str, Any]:
    kind = CALLS[_kind(item)]
    name = item.get("name")
    return {
        "id": item.get(kind.key),
        "type": "function",
        "function": {
            "name": name if isinstance(name, str) else _kind(item),
            "arguments": _as_text(_first(item, kind.arguments)),
        },
    }


def _view_output(item: Mapping[str, Any]) -> dict[str, Any]:
    """A tool message: the output as its content when it is text or parts (what truncation and
    pruning rewrite), a screenshot as an image part, anything else opaque (counted, kept)."""
    output = item.get("output")
    call = CALLS[OUTPUTS[_kind(item)]]
    message: dict[str, Any] = {"role": "tool", "tool_call_id": _first(item, call.answer_keys)}
    if isinstance(output, str | list):
        message["content"] = output
    elif isinstance(output, dict) and isinstance(output.get("image_url"), str):
        message["content"] = [{"type": "input_image", "image_url": output["image_url"]}]
    else:
        message["content"] = None
        message["output"] = {k: v for k, v in item.items() if k not in ("type", "id", "status")}
    return message


def _view_other(item: Mapping[str, Any]) -> dict[str, Any]:
    """An item the planner keeps or drops whole; its role is its type, so it takes no turn."""
    fields = {k: v for k, v in item.items() if k not in ("type", "id", "status", "result")}
    result = item.get("result")
    content = None
    if _kind(item) == "image_generation_call" and isinstance(result, str):
        # counted as the image it is (its size is in the header), not as base64 text
        content = [{"type": "input_image", "image_url": "data:image/png;base64," + result[:64]}]
    elif result is not None:
        fields["result"] = result
    return {"role": _kind(item), "content": content, "item": fields}


def _view(items: Sequence[Mapping[str, Any]], group: tuple[int, ...]) -> dict[str, Any]:
    members = [items[i] for i in group]
    last = members[-1]
    kind = _kind(last)
    reasoning = "\n".join(t for m in members if _kind(m) == "reasoning" for t in _texts(m))
    if any(_kind(m) in CALLS for m in members):
        view: dict[str, Any] = {
            "role": "assistant",
            "content": None,
            "tool_calls": [_view_call(m) for m in members if _kind(m) in CALLS],
        }
    elif kind == "message":
        view = {"role": last.get("role"), "content": last.get("content")}
    elif kind in OUTPUTS:
        view = _view_output(last)
    elif kind == "reasoning":
        view = {"role": "reasoning", "content": None}
    else:
        view = _view_other(last)
    if reasoning:
        view["reasoning_content"] = reasoning
    return view


def _skip(body: Mapping[str, Any]) -> str | None:
    for field in ("previous_response_id", "conversation"):
        if body.get(field) is not None:
            return f"{field}: the history is kept upstream"
    return None


def _pinned_through_compaction(
    items: Sequence[Mapping[str, Any]], groups: list[tuple[int, ...]], views: list[dict[str, Any]]
) -> bool:
    """Make every group up to the one holding the last `compaction` item, and the user message
    item right after it, one pinned user view message (in place): the provider's stand-in for
    the history before it, and the head. False when there is no such item."""
    last = max((i for i, item in enumerate(items) if _kind(item) == COMPACTION), default=None)
    if last is None:
        return False
    g = next(k for k, group in enumerate(groups) if last in group)
    after = groups[g + 1] if g + 1 < len(groups) else ()
    if len(after) == 1 and _kind(items[after[0]]) == "message":
        g += items[after[0]].get("role") == "user"
    merged = tuple(i for group in groups[: g + 1] for i in group)
    head = {"role": "user", "content": None, "history": views[: g + 1]}
    groups[: g + 1] = [merged]
    views[: g + 1] = [head]
    return True


def _fixed(body: Mapping[str, Any]) -> dict[str, Any]:
    """What every prompt carries: instructions, tools, tool choice and the output format."""
    fixed = {k: body[k] for k in ("instructions", "tools", "tool_choice") if k in body}
    text = body.get("text")
    if isinstance(text, dict) and isinstance(text.get("format"), dict):
        fixed["response_format"] = text["format"]
    return fixed


class ResponsesFormat:
    """`POST /v1/responses` bodies.

    One view message per group of items, in order:

    - a message item (`{"role", "content"}` shorthand, or `type: "message"`) is a message of its
      role, its `content` (a string or a list of `input_text`/`output_text`/`input_image`… parts)
      shared as it is — the counter and the strategies read those parts like chat's;
    - a tool round is an assistant message whose `tool_calls` are the round's call items
      (`function_call`, `custom_tool_call`, `local_shell_call`, `computer_call`, `shell_call`,
      `apply_patch_call`, `mcp_approval_request`, `tool_search_call`, `program`), followed by one
      `tool` message per output item. Calls and outputs are found by position — the run of calls,
      then their outputs, each matched by `call_id` among the calls of this round only (real
      transcripts reuse ids) — and the round goes on while a call is still unanswered, so
      interleaved calls and outputs of one turn stay one unit;
    - a `reasoning` item (or a run of them) goes with the item it preceded, whatever its type (a
      call round, a message, a `web_search_call`…): carried inside that view message, never
      separated from it (OpenAI rejects a reasoning item without its following item);
    - any other item (`web_search_call`, `item_reference`, …) is a message of its own.

    The pinned head is `instructions` (in `fixed`, counted with the tools), then the leading
    system/developer items and the first user item, exactly as for chat. A provider `compaction`
    item (what `/v1/responses/compact` returns, DESIGN.md §13) stands in for the history before it:
    every item up to the last one is one pinned user view message, and what follows is compacted
    like any history, never cut before or across it.

    Rendering puts every view message the plan left untouched back as its very items (the same
    objects, so they serialise to the bytes the client sent as orjson writes them); a truncated or
    pruned output keeps its item with a new `output`, a deeply truncated call keeps its item with
    new arguments, and the summary is a message item (after a pinned compaction item, when folded
    into the head). A string `input`, server-side history (`previous_response_id`, `conversation`),
    or an output whose call is not in its round make the request one to forward as received
    (`Conversation.skip`).
    """

    api: ApiName = "responses"
    history: str = "input"

    def conversation(self, body: Mapping[str, Any]) -> ResponsesConversation:
        raw = body.get("input")
        fixed = _fixed(body)
        if isinstance(raw, str):
            view = [{"role": "user", "content": raw}]
            return ResponsesConversation(view, fixed, SKIP_STRING_INPUT, ((),))
        if raw is None:
            return ResponsesConversation([], fixed, SKIP_NO_INPUT)
        if not isinstance(raw, list):
            raise BadRequest("input must be a string or a list of items", param="input")
        _check(raw)
        grouping = _Grouping(raw, [])
        grouping.walk()
        views = [_view(raw, g) for g in grouping.groups]
        stand_in = _pinned_through_compaction(raw, grouping.groups, views)
        skip = _skip(body)
        if skip is None and grouping.orphan is not None:
            kind = _kind(raw[grouping.orphan])
            skip = f"orphan {kind} at input[{grouping.orphan}]: its call is not right before it"
        return ResponsesConversation(views, fixed, skip, tuple(grouping.groups), stand_in)

    def render(
        self,
        body: Mapping[str, Any],
        conversation: Conversation,
        messages: Sequence[Mapping[str, Any]],
        sources: Sequence[int | None],
    ) -> dict[str, Any]:
        if not isinstance(conversation, ResponsesConversation):
            conversation = self.conversation(body)
        items: list[Mapping[str, Any]] = body["input"]
        out: list[Mapping[str, Any]] = []
        for message, source in zip(messages, sources, strict=True):
            if source is None:
                out.append(summary_item(message))
                continue
            members = [items[i] for i in conversation.groups[source]]
            view = conversation.messages[source]
            if message is view:
                out.extend(members)
            elif source == 0 and conversation.compacted_head:
                out.extend(_folded(members, message))
            else:
                out.extend(_rewrite(members, view, message))
        return {**body, "input": out}


def summary_item(message: Mapping[str, Any]) -> dict[str, Any]:
    """A message the proxy inserted (the summary), as a shorthand message item."""
    return {"role": message["role"], "content": message["content"]}


def _rewrite(
    members: list[Mapping[str, Any]], view: Mapping[str, Any], message: Mapping[str, Any]
) -> list[Mapping[str, Any]]:
    """The group's items with what the strategies changed in its view message written back."""
    last = members[-1]
    kind = _kind(last)
    if kind in OUTPUTS:
        content = message.get("content")
        if isinstance(last.get("output"), str | list) and isinstance(content, str | list):
            return [{**last, "output": content}]
        return members
    if kind == "message":
        return [*members[:-1], {**last, "content": _item_content(last, message.get("content"))}]
    calls = iter(zip(view.get("tool_calls") or [], message.get("tool_calls") or [], strict=True))
    out: list[Mapping[str, Any]] = []
    for item in members:
        if _kind(item) in CALLS:
            before, after = next(calls)
            item = item if after is before else _with_arguments(item, after)
        out.append(item)
    return out


def _folded(members: list[Mapping[str, Any]], message: Mapping[str, Any]) -> list[Any]:
    """A head ending with a `compaction` item (and maybe the user item after it) with the
    summary folded into it: the summary's parts after that user item's own content, or as a
    user item of its own after the compaction item."""
    content = message.get("content")
    added = _item_content({}, content if isinstance(content, list) else [])
    last = members[-1]
    if _kind(last) != "message":
        return [*members, summary_item({"role": "user", "content": added})]
    own = last.get("content")
    parts = [{"type": "input_text", "text": own}] if isinstance(own, str) else list(own or [])
    return [*members[:-1], {**last, "content": [*parts, *added]}]


def _item_content(item: Mapping[str, Any], content: Any) -> Any:
    """The view's content as the item's. Only a user, system or developer item gains parts
    (the summary folded in after its content, which becomes a part if it was a string): those
    the proxy made are `text` parts, written as `input_text`; every part of the item's own is
    the same object."""
    if not isinstance(content, list) or item.get("role") == "assistant":
        return content
    own = item.get("content")
    kept = {id(part) for part in own} if isinstance(own, list) else set()
    return [
        {**part, "type": "input_text"}
        if id(part) not in kept and isinstance(part, dict) and part.get("type") == "text"
        else part
        for part in content
    ]


def _with_arguments(item: Mapping[str, Any], call: Any) -> Mapping[str, Any]:
    """The call item with the view call's (truncated) arguments; unchanged when they no longer
    parse as the object the item holds."""
    function = call.get("function") if isinstance(call, dict) else None
    arguments = function.get("arguments") if isinstance(function, dict) else None
    kind = CALLS[_kind(item)]
    field = next((f for f in kind.arguments if item.get(f) is not None), None)
    if field is None or not isinstance(arguments, str):
        return item
    if isinstance(item[field], str):
        return {**item, field: arguments}
    try:
        return {**item, field: orjson.loads(arguments)}
    except orjson.JSONDecodeError:
        return item
