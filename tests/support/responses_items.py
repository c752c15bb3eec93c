"""Chat conversations as Responses API requests, the invariants' oracles in Responses terms, and
Hypothesis strategies for item lists (shared by the Responses tests and the bench).

A chat conversation becomes `input` items the way the openai SDK's users write them: system and
user messages as shorthand or typed message items with `input_text`/`input_image` parts,
assistant text as shorthand or as an output message with `output_text` parts, each tool call as
a `function_call` (optionally after a `reasoning` item) and each tool result as a
`function_call_output` naming its call.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from hypothesis import strategies as st

from inflight.apis.responses.format import CALLS, OUTPUTS
from tests.support.conversations import TEXT, conversations, sizes


def _parts(content: Any, text_type: str) -> Any:
    """Chat content parts as Responses parts."""
    if isinstance(content, str):
        return [{"type": text_type, "text": content}]
    parts: list[Any] = []
    for part in content if isinstance(content, list) else []:
        if part.get("type") == "text":
            parts.append({"type": text_type, "text": part["text"]})
        elif part.get("type") == "image_url":
            image = part["image_url"]
            parts.append(
                {"type": "input_image", "image_url": image["url"], "detail": image.get("detail")}
            )
        else:
            parts.append(part)
    return parts


def _message(message: Mapping[str, Any], k: int, typed: bool) -> dict[str, Any]:
    """A system, developer, user or assistant message as an item (shorthand or typed)."""
    role = message["role"]
    extra = {key: v for key, v in message.items() if key not in ("role", "content", "tool_calls")}
    content = message.get("content")
    if content is None:
        content = ""
    if not typed and isinstance(content, str):
        return {"role": role, "content": content, **extra}
    if not typed and role != "assistant":
        return {"role": role, "content": _parts(content, "input_text"), **extra}
    if role == "assistant":
        parts = [{**p, "annotations": []} for p in _parts(content, "output_text")]
        return {
            "type": "message",
            "id": f"msg_{k}",
            "role": role,
            "status": "completed",
            "content": parts,
            **extra,
        }
    return {"type": "message", "role": role, "content": _parts(content, "input_text"), **extra}


def _call(call: Mapping[str, Any]) -> dict[str, Any]:
    function = call.get("function") or {}
    return {
        "type": "function_call",
        "call_id": call.get("id"),
        "name": function.get("name"),
        "arguments": function.get("arguments", ""),
    }


def _answers(calls: Sequence[Any], answers: Sequence[Mapping[str, Any]]) -> list[Any]:
    """The call id each tool message answers: its own when it names one of the calls, else the
    call at its position (chat pairs by position)."""
    ids = [c.get("id") for c in calls]
    named = [a.get("tool_call_id") for a in answers]
    if all(n in ids for n in named) and len(set(named)) == len(named):
        return named
    return [ids[k] if k < len(ids) else None for k in range(len(answers))]


def to_items(
    messages: Sequence[Mapping[str, Any]], *, typed: int = 0, reasoning: bool = False
) -> list[dict[str, Any]]:
    """`messages` as Responses `input` items. `typed`: every n-th message is a typed item
    (0: none); `reasoning`: a reasoning item before each round of calls."""
    items: list[dict[str, Any]] = []
    i, n = 0, len(messages)
    while i < n:
        message = messages[i]
        role = message.get("role")
        is_typed = bool(typed) and i % typed == 0
        calls = message.get("tool_calls") if role == "assistant" else None
        if calls:
            if message.get("content"):
                items.append(_message(message, i, is_typed))
            if reasoning:
                summary = [{"type": "summary_text", "text": f"thinking about step {i}"}]
                items.append({"type": "reasoning", "id": f"rs_{i}", "summary": summary})
            items.extend(_call(c) for c in calls)
            j = i + 1
            while j < n and messages[j].get("role") == "tool":
                j += 1
            answers = messages[i + 1 : j]
            for answer, call_id in zip(answers, _answers(calls, answers), strict=True):
                items.append(_output(answer, call_id))
            i = j
            continue
        legacy = message.get("function_call") if role == "assistant" else None
        if isinstance(legacy, dict):
            call_id = f"legacy_{i}"
            items.append({"type": "function_call", "call_id": call_id, **legacy})
            if i + 1 < n and messages[i + 1].get("role") == "function":
                items.append(_output(messages[i + 1], call_id))
                i += 1
        elif role in ("tool", "function"):
            items.append(_output(message, message.get("tool_call_id")))
        else:
            items.append(_message(message, i, is_typed))
        i += 1
    return items


def _output(message: Mapping[str, Any], call_id: Any) -> dict[str, Any]:
    content = message.get("content")
    output = content if isinstance(content, str) else _parts(content, "input_text")
    item: dict[str, Any] = {"type": "function_call_output", "call_id": call_id, "output": output}
    if message.get("name"):
        item["name"] = message["name"]
    return item


def request_body(
    messages: Sequence[Mapping[str, Any]], *, instructions: bool = True, **options: Any
) -> dict[str, Any]:
    """A Responses request for a chat conversation: a leading system message becomes
    `instructions` (when asked), the rest `input` items."""
    body: dict[str, Any] = {"model": "gpt-4.1"}
    if instructions and messages and messages[0].get("role") == "system":
        body["instructions"] = messages[0]["content"]
        messages = messages[1:]
    body["input"] = to_items(messages, **options)
    return body


def request_points(items: Sequence[Mapping[str, Any]]) -> list[int]:
    """Each k where `items[:k]` is a request: the model speaks next (an assistant message, a
    call or a reasoning item follows, or the list ends) and no call is left unanswered."""
    points: list[int] = []
    pending: Counter[tuple[str, Any]] = Counter()
    for k, item in enumerate(items):
        if _model_side(item) and not _model_side(items[k - 1] if k else {}) and not +pending:
            points.append(k)
        kind = item_kind(item)
        if kind in CALLS:
            pending[(kind, item.get(CALLS[kind].key))] += 1
        elif kind in OUTPUTS:
            pending[answer(item)] -= 1
    if not +pending and items and not _model_side(items[-1]):
        points.append(len(items))
    return [k for k in points if k > 0]


def _model_side(item: Mapping[str, Any]) -> bool:
    kind = item_kind(item)
    return (
        kind in CALLS
        or kind == "reasoning"
        or (kind == "message" and item.get("role") == "assistant")
    )


def item_kind(item: Mapping[str, Any]) -> str:
    if item.get("type") is None:
        return "item_reference" if item.get("role") is None else "message"
    return str(item["type"])


def model_made(item: Mapping[str, Any]) -> bool:
    """An item the model produced, which a reasoning item may precede: anything but a
    reasoning item, an output, or a message of another role than the assistant's."""
    kind = item_kind(item)
    if kind == "message":
        return item.get("role") == "assistant"
    return kind != "reasoning" and kind not in OUTPUTS


def answer(item: Mapping[str, Any]) -> tuple[str, Any]:
    """(call type, id) an output item answers."""
    call = OUTPUTS[item_kind(item)]
    names = CALLS[call].answer_keys
    return call, next((item[k] for k in names if item.get(k) is not None), None)


def pair_problems(items: Sequence[Mapping[str, Any]]) -> list[str]:
    """Where `items` break the Responses pairing rules, written apart from the adapter: in each
    run of call, output and reasoning items, every output answers a call before it in the run
    not answered yet, and no call is left unanswered when the run ends; a reasoning item (or a
    chain of them) is followed by an item the model made (a call, an assistant message, a web
    search…)."""
    problems: list[str] = []
    pending: Counter[tuple[str, Any]] = Counter()
    for k, item in enumerate(items):
        kind = item_kind(item)
        if kind in CALLS:
            pending[(kind, item.get(CALLS[kind].key))] += 1
        elif kind in OUTPUTS:
            key = answer(item)
            if pending[key] <= 0:
                problems.append(f"input[{k}]: {kind} {key[1]!r} without its call")
            else:
                pending[key] -= 1
        elif kind == "reasoning":
            j = k + 1
            while j < len(items) and item_kind(items[j]) == "reasoning":
                j += 1
            if j == len(items) or not model_made(items[j]):
                problems.append(f"input[{k}]: reasoning not followed by what it preceded")
        elif +pending:
            problems.append(f"input[{k}]: {sorted(map(str, +pending))} unanswered before it")
            pending.clear()
    if +pending:
        problems.append(f"calls {sorted(map(str, +pending))} unanswered at the end")
    return problems


def follows_strict_rule(items: Sequence[Mapping[str, Any]]) -> bool:
    """DESIGN.md §4.6 on items: one optional leading system item, then — ignoring calls,
    outputs and reasoning — user and assistant messages alternate, starting with user. Any
    other item (a web search…) breaks it."""
    roles: list[Any] = []
    for item in items:
        kind = item_kind(item)
        if kind in CALLS or kind in OUTPUTS or kind == "reasoning":
            continue
        roles.append(item.get("role") if kind == "message" else kind)
    if roles and roles[0] == "system":
        roles = roles[1:]
    alternating = ["user", "assistant"] * (len(roles) // 2) + ["user"] * (len(roles) % 2)
    return bool(roles) and roles == alternating


# -- generated item lists: what real Responses clients send beyond converted chats -----------


def reasoning_item(name: str) -> dict[str, Any]:
    summary = [{"type": "summary_text", "text": f"thinking {name}"}]
    return {"type": "reasoning", "id": f"rs_{name}", "summary": summary, "encrypted_content": "e"}


def _call_pair(kind: str, call_id: str, name: str, size: int, text: str) -> tuple[Any, Any]:
    """A client-executed call of `kind` and its output, shaped as the SDK's params."""
    out: Any
    if kind == "custom_tool_call":
        call = {"type": kind, "call_id": call_id, "name": "patch", "input": text}
        out = {"type": "custom_tool_call_output", "call_id": call_id, "output": "p" * size}
    elif kind == "local_shell_call":
        action = {"type": "exec", "command": ["ls", text], "env": {}}
        call = {"type": kind, "id": f"ls_{name}", "call_id": call_id, "action": action,
                "status": "completed"}  # fmt: skip
        out = {"type": "local_shell_call_output", "id": call_id, "output": "l" * size}
    elif kind == "computer_call":
        action = {"type": "click", "button": "left", "x": size, "y": 1}
        call = {"type": kind, "id": f"cu_{name}", "call_id": call_id, "action": action,
                "pending_safety_checks": [], "status": "completed"}  # fmt: skip
        screenshot = {"type": "computer_screenshot", "image_url": "data:image/png;base64,AAAA"}
        out = {"type": "computer_call_output", "call_id": call_id, "output": screenshot}
    elif kind == "shell_call":
        action = {"commands": ["ls", text], "timeout_ms": 1000}
        call = {"type": kind, "id": f"sh_{name}", "call_id": call_id, "action": action,
                "status": "completed"}  # fmt: skip
        chunk = {"stdout": "s" * size, "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}
        out = {"type": "shell_call_output", "call_id": call_id, "output": [chunk]}
    elif kind == "apply_patch_call":
        operation = {"type": "update_file", "path": "a.py", "diff": text}
        call = {"type": kind, "id": f"ap_{name}", "call_id": call_id, "operation": operation,
                "status": "completed"}  # fmt: skip
        out = {"type": "apply_patch_call_output", "call_id": call_id, "status": "completed",
               "output": "a" * size}  # fmt: skip
    elif kind == "mcp_approval_request":
        call = {"type": kind, "id": call_id, "name": "fetch", "arguments": text,
                "server_label": "docs"}  # fmt: skip
        out = {"type": "mcp_approval_response", "approval_request_id": call_id, "approve": True}
    elif kind == "tool_search_call":
        call = {"type": kind, "id": f"ts_{name}", "call_id": call_id, "execution": "client",
                "arguments": {"query": text}, "status": "completed"}  # fmt: skip
        tool = {"type": "function", "name": "found", "parameters": {"type": "object"},
                "description": "d" * size}  # fmt: skip
        out = {"type": "tool_search_output", "id": f"tso_{name}", "call_id": call_id,
               "execution": "client", "tools": [tool], "status": "completed"}  # fmt: skip
    else:  # program
        call = {"type": kind, "id": f"pg_{name}", "call_id": call_id, "code": text,
                "fingerprint": "fp"}  # fmt: skip
        out = {"type": "program_output", "id": f"pgo_{name}", "call_id": call_id,
               "result": "r" * size, "status": "completed"}  # fmt: skip
    return call, out


# every client-executed call type but `function_call` (converted chats have those)
EXTRA_CALLS = ("custom_tool_call", "local_shell_call", "computer_call", "shell_call",
               "apply_patch_call", "mcp_approval_request", "tool_search_call", "program")  # fmt: skip


@st.composite
def extra_round(draw: st.DrawFn, k: int) -> list[dict[str, Any]]:
    """A round of other client-executed calls (every such type the SDK defines), maybe after
    a reasoning item, with outputs in any order and possibly interleaved."""
    kinds = draw(st.lists(st.sampled_from(EXTRA_CALLS), min_size=1, max_size=3))
    calls: list[dict[str, Any]] = []
    outputs: list[dict[str, Any]] = []
    for m, kind in enumerate(kinds):
        call_id = draw(st.sampled_from(["call_a", "call_b"])) + str(m)  # ids repeat across rounds
        call, out = _call_pair(kind, call_id, f"{k}_{m}", draw(sizes()), draw(TEXT))
        calls.append(call)
        outputs.append(out)
    order = draw(st.permutations(range(len(outputs))))
    items: list[dict[str, Any]] = []
    if draw(st.booleans()):
        items.append(reasoning_item(f"x{k}"))
    if draw(st.booleans()) and len(calls) > 1:  # interleaved: the first call answered at once
        items += [calls[0], outputs[0], *calls[1:], *(outputs[o] for o in order if o)]
    else:
        items += [*calls, *(outputs[o] for o in order)]
    return items


def _other(kind: str, k: int, text: str, size: int) -> dict[str, Any]:
    """An item of `kind` that is neither a message, a reasoning item, nor a client call or its
    output, shaped as the SDK's params."""
    status = {"status": "completed"}
    if kind == "web_search_call":
        return {"type": kind, "id": f"ws_{k}", **status,
                "action": {"type": "search", "query": text}}  # fmt: skip
    if kind == "file_search_call":
        result = {"file_id": "file_1", "filename": "a.md", "score": 0.5, "text": "f" * size}
        return {"type": kind, "id": f"fs_{k}", "queries": [text], "results": [result], **status}
    if kind == "image_generation_call":
        return {"type": kind, "id": f"ig_{k}", "result": "iVBORw0KGgo" + "A" * size, **status}
    if kind == "code_interpreter_call":
        outputs = [{"type": "logs", "logs": "c" * size}]
        return {"type": kind, "id": f"ci_{k}", "code": text, "container_id": "cntr_1",
                "outputs": outputs, **status}  # fmt: skip
    if kind == "mcp_call":
        return {"type": kind, "id": f"mcp_{k}", "name": "fetch", "arguments": "{}",
                "server_label": "docs", "output": "m" * size, **status}  # fmt: skip
    if kind == "mcp_list_tools":
        tool = {"name": "fetch", "input_schema": {"type": "object"}, "description": text}
        return {"type": kind, "id": f"mcpl_{k}", "server_label": "docs", "tools": [tool]}
    if kind == "item_reference":
        return {"type": kind, "id": f"msg_ref{k}"}
    if kind == "untyped_reference":  # the SDK's `type` is optional on an item reference
        return {"id": f"msg_ref{k}"}
    if kind == "additional_tools":
        tool = {"type": "function", "name": f"late_{k}", "parameters": {"type": "object"}}
        return {"type": kind, "role": "developer", "tools": [tool]}
    # configuration_update
    return {"type": kind, "id": f"cfg_{k}", "reasoning": {"effort": "low"}, "text": {}}


OTHER_ITEMS = ("web_search_call", "file_search_call", "image_generation_call",
               "code_interpreter_call", "mcp_call", "mcp_list_tools", "item_reference",
               "untyped_reference", "additional_tools", "configuration_update")  # fmt: skip
# produced by the model, so a reasoning item may precede them
MODEL_MADE = ("web_search_call", "file_search_call", "image_generation_call",
              "code_interpreter_call", "mcp_call", "mcp_list_tools")  # fmt: skip


@st.composite
def other_items(draw: st.DrawFn, k: int) -> list[dict[str, Any]]:
    """An item of every other type the SDK defines (a web search, a file search, an item
    reference…), kept or dropped whole; one the model made maybe after a reasoning item."""
    kind = draw(st.sampled_from(OTHER_ITEMS))
    item = _other(kind, k, draw(TEXT), draw(sizes()))
    chain = draw(st.integers(0, 2)) if kind in MODEL_MADE else 0
    return [*(reasoning_item(f"o{k}_{r}") for r in range(chain)), item]


@st.composite
def item_lists(draw: st.DrawFn) -> dict[str, Any]:
    """A Responses request: a generated chat conversation as items (instructions or a system
    item, shorthand or typed messages, reasoning before calls), with rounds of the other call
    kinds and items of every other type (`extra_round`, `other_items`) mixed in at random
    places; maybe compacted by the provider first, as Codex's history is after
    `/v1/responses/compact` (`compacted`)."""
    messages = draw(conversations())
    body = request_body(
        messages,
        instructions=draw(st.booleans()),
        typed=draw(st.sampled_from([0, 1, 2, 3])),
        reasoning=draw(st.booleans()),
    )
    items = body["input"]
    extra = draw(st.integers(0, 4))
    for k in range(extra):
        # after a complete request point (never inside a round of calls)
        points = request_points(items)
        if not points:
            break
        at = draw(st.sampled_from(points))
        if at == 0:
            continue
        insert = draw(st.one_of(extra_round(k), other_items(k)))
        items[at:at] = insert
    points = request_points(items)
    if points and draw(st.booleans()):
        body["input"] = compacted(items, draw(st.sampled_from(points)))
    return body


def compaction_item(k: int = 0) -> dict[str, Any]:
    """A provider's `compaction` item (SDK: `ResponseCompactionItemParam`)."""
    return {"type": "compaction", "id": f"cmp_{k}", "encrypted_content": f"gAAAA{k}" + "x" * 200}


def compacted(items: Sequence[Mapping[str, Any]], at: int) -> list[Any]:
    """`items` as the provider compacts them at request point `at`: the system, developer and
    user messages before it, then one `compaction` item standing for the rest of them, then
    what followed."""
    kept = [
        item
        for item in items[:at]
        if item_kind(item) == "message" and item.get("role") in ("system", "developer", "user")
    ]
    return [*kept, compaction_item(at), *items[at:]]
