"""Anthropic Messages bodies for the tests and the bench: Hypothesis strategies for valid
conversations (tool rounds with parallel calls and text beside the results, thinking with
signatures, images, nested tool-result blocks, breakpoints, `role: "system"` messages inside
`messages`, `compaction` blocks of beta `compact-2026-01-12` leading assistant turns), and the
shipped chat transcripts
converted to Messages form in Claude Code's shape (a breakpoint on the system prompt and on the
last user message)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from hypothesis import strategies as st

TEXT = st.text(alphabet="abcdefghij klmnop\n.,:{}0123456789", min_size=1, max_size=300)
EPHEMERAL = {"type": "ephemeral"}
THINKING_TYPES = ("thinking", "redacted_thinking")


def sizes() -> st.SearchStrategy[int]:
    return st.one_of(st.integers(1, 400), st.integers(400, 4000), st.integers(10_000, 60_000))


def blocks(message: Mapping[str, Any]) -> list[Any]:
    content = message.get("content")
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(content)


@st.composite
def thinking(draw: st.DrawFn) -> list[dict[str, Any]]:
    kind = draw(st.sampled_from(["none", "none", "thinking", "redacted"]))
    if kind == "thinking":
        return [{"type": "thinking", "thinking": draw(TEXT), "signature": "sig" + draw(TEXT)}]
    if kind == "redacted":
        return [{"type": "redacted_thinking", "data": "enc" + draw(TEXT)}]
    return []


@st.composite
def tool_result(draw: st.DrawFn, call_id: str) -> dict[str, Any]:
    size = draw(sizes())
    shape = draw(st.sampled_from(["string", "string", "blocks", "none"]))
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": call_id}
    if shape == "string":
        block["content"] = "x" * size
    elif shape == "blocks":
        block["content"] = [
            {"type": "text", "text": "y" * size},
            {"type": "text", "text": draw(TEXT)},
        ]
    if draw(st.booleans()):
        block["is_error"] = True
    return block


@st.composite
def tool_round(draw: st.DrawFn, ids: Sequence[str]) -> list[dict[str, Any]]:
    """An assistant message calling tools and the user message answering every call, maybe
    with text after the results (Claude Code's reminders)."""
    n = draw(st.integers(1, 3))
    call_ids = [draw(st.sampled_from(ids)) + str(k) for k in range(n)]
    said = [{"type": "text", "text": draw(TEXT)}] if draw(st.booleans()) else []
    uses = [
        {
            "type": "tool_use",
            "id": cid,
            "name": draw(st.sampled_from(["Bash", "Read", "Grep"])),
            "input": {"command": draw(TEXT), "n": draw(st.integers(0, 9))},
        }
        for cid in call_ids
    ]
    answers: list[dict[str, Any]] = [draw(tool_result(cid)) for cid in call_ids]
    if draw(st.booleans()):
        answers.append({"type": "text", "text": "<system-reminder>" + draw(TEXT)})
    if draw(st.integers(0, 5)) == 0:
        answers.append({"type": "image", "source": {"type": "url", "url": "https://x/y.png"}})
    return [
        {"role": "assistant", "content": [*draw(thinking()), *said, *uses]},
        {"role": "user", "content": answers},
    ]


@st.composite
def chat_round(draw: st.DrawFn) -> list[dict[str, Any]]:
    reply = [*draw(thinking()), {"type": "text", "text": draw(TEXT) + "r" * draw(sizes())}]
    question = draw(st.one_of(TEXT, st.just([{"type": "text", "text": "q" * 50}])))
    return [{"role": "assistant", "content": reply}, {"role": "user", "content": question}]


@st.composite
def compaction_block(draw: st.DrawFn) -> dict[str, Any]:
    """A `compaction` block as Anthropic returns it and the client sends it back
    (`anthropic.types.beta.BetaCompactionBlockParam`): a summary, or null when the compaction
    failed (never an empty string), maybe with its opaque metadata and signature."""
    block: dict[str, Any] = {"type": "compaction", "content": draw(st.one_of(st.none(), TEXT))}
    if draw(st.booleans()):
        block["encrypted_content"] = "enc" + draw(TEXT)
    if draw(st.booleans()):
        block["signature"] = "sig" + draw(TEXT)
    return block


@st.composite
def with_compaction_blocks(draw: st.DrawFn, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`messages` with a `compaction` block at the start of one or two answered assistant turns:
    where the API puts it when it compacts, before the turn's other blocks."""
    turns = [i for i, m in enumerate(messages[:-1]) if m["role"] == "assistant"]
    out = list(messages)
    for i in draw(st.lists(st.sampled_from(turns), max_size=2, unique=True)) if turns else []:
        out[i] = {**out[i], "content": [draw(compaction_block()), *blocks(out[i])]}
    return out


def _eligible(block: Any) -> bool:
    return isinstance(block, dict) and block.get("type") not in THINKING_TYPES


@st.composite
def anthropic_bodies(draw: st.DrawFn) -> dict[str, Any]:
    """A valid Messages body: strict alternation, every call answered in the next message,
    Claude Code's breakpoints (system, last user message) and up to two more."""
    ids = draw(st.lists(st.sampled_from(["toolu_a", "toolu_b", "c"]), min_size=1, max_size=2))
    first = draw(st.one_of(TEXT, st.just([{"type": "text", "text": "task " * 40}])))
    messages: list[dict[str, Any]] = [{"role": "user", "content": first}]
    for _ in range(draw(st.integers(0, 14))):
        rounds = st.one_of(tool_round(ids), tool_round(ids), chat_round())
        messages.extend(draw(rounds))
    body: dict[str, Any] = {"model": "claude-sonnet-4-5", "max_tokens": 512}
    if draw(st.booleans()):
        body["system"] = [{"type": "text", "text": "You are a coding agent.", **_mark()}]
    if draw(st.integers(0, 4)) == 0:
        messages.append({"role": "assistant", "content": "Here is"})  # prefill
    body["messages"] = messages
    if draw(st.integers(0, 3)) == 0:
        messages = draw(with_compaction_blocks(messages))
    claude_code_breakpoint(messages)
    for _ in range(draw(st.integers(0, 2))):
        i = draw(st.integers(0, len(messages) - 1))
        content = messages[i]["content"]
        if isinstance(content, list) and content:
            j = draw(st.integers(0, len(content) - 1))
            if _eligible(content[j]):
                content[j] = {**content[j], **_mark()}
    if draw(st.booleans()):
        body["messages"] = draw(with_system_messages(messages))
    return body


def _calls(message: Mapping[str, Any]) -> bool:
    return any(isinstance(b, dict) and b.get("type") == "tool_use" for b in blocks(message))


@st.composite
def with_system_messages(draw: st.DrawFn, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`messages` with `role: "system"` messages inside, as Claude Code sends a non-Claude model
    (its agent-types listing right after the first user message, later reminders): anywhere
    after the first message but between a call and its answers, several in a row at times."""
    places = [i for i in range(1, len(messages) + 1) if not _calls(messages[i - 1])]
    chosen = draw(st.lists(st.sampled_from(places), min_size=1, max_size=4))
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        out.append(message)
        for k in range(chosen.count(i + 1)):
            text = draw(st.one_of(TEXT, st.just("Available agent types: " + "a" * 2000)))
            content: Any = text if k % 2 == 0 else [{"type": "text", "text": text}]
            out.append({"role": "system", "content": content})
    return out


def _mark() -> dict[str, Any]:
    return {"cache_control": dict(EPHEMERAL)}


def claude_code_breakpoint(messages: list[dict[str, Any]]) -> None:
    """A breakpoint on the last block of the last user message (in place)."""
    last = max(i for i, m in enumerate(messages) if m["role"] == "user")
    content = blocks(messages[last])
    k = max(j for j, b in enumerate(content) if _eligible(b))
    content[k] = {**content[k], **_mark()}
    messages[last] = {**messages[last], "content": content}


def _text(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    out: list[dict[str, Any]] = []
    for part in content if isinstance(content, list) else []:
        if isinstance(part, dict) and part.get("text"):
            out.append({"type": "text", "text": str(part["text"])})
        elif isinstance(part, dict) and part.get("type") == "image_url":
            url = part["image_url"]["url"] if isinstance(part["image_url"], dict) else ""
            out.append({"type": "image", "source": {"type": "url", "url": url}})
    return out


def _input(arguments: Any) -> dict[str, Any]:
    try:
        value = json.loads(arguments) if isinstance(arguments, str) else arguments
    except json.JSONDecodeError:
        value = None
    return value if isinstance(value, dict) else {"arguments": str(arguments)}


def _append(messages: list[dict[str, Any]], role: str, content: list[dict[str, Any]]) -> None:
    if messages and messages[-1]["role"] == role:
        messages[-1]["content"].extend(content)
    else:
        messages.append({"role": role, "content": content})


def from_chat(
    chat: Sequence[Mapping[str, Any]], model: str = "claude-sonnet-4-5"
) -> dict[str, Any]:
    """A chat transcript as a Messages body in Claude Code's shape: system as a text block with
    a breakpoint, calls as `tool_use`, tool messages as `tool_result` blocks of the next user
    message (answering the calls by position), consecutive same-role messages joined."""
    system = [str(m.get("content") or "") for m in chat if m.get("role") in ("system", "developer")]
    messages: list[dict[str, Any]] = []
    calls: list[str] = []
    for m in chat:
        role = m.get("role")
        if role == "assistant":
            content = _text(m.get("content"))
            calls = [f"toolu_{len(messages)}_{k}" for k in range(len(m.get("tool_calls") or []))]
            for call_id, call in zip(calls, m.get("tool_calls") or [], strict=True):
                fn = call.get("function") or {}
                content.append(
                    {"type": "tool_use", "id": call_id, "name": fn.get("name") or "tool",
                     "input": _input(fn.get("arguments"))}
                )  # fmt: skip
            _append(messages, "assistant", content or [{"type": "text", "text": "(no content)"}])
        elif role == "tool" and calls:
            result = {"type": "tool_result", "tool_use_id": calls.pop(0)}
            _append(messages, "user", [{**result, "content": str(m.get("content") or "")}])
        elif role in ("user", "tool"):
            _append(messages, "user", _text(m.get("content")) or [{"type": "text", "text": "."}])
    if not messages or messages[0]["role"] != "user":
        messages.insert(0, {"role": "user", "content": [{"type": "text", "text": "Begin."}]})
    claude_code_breakpoint(messages)
    body: dict[str, Any] = {"model": model, "max_tokens": 1024, "messages": messages}
    body["system"] = [{"type": "text", "text": "\n\n".join(system) or "You are Claude.", **_mark()}]
    return body
