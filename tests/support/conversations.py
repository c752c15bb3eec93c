"""Hypothesis strategies for chat conversations, and helpers shared by the compaction tests.

Generated conversations have what real agent transcripts have: parallel tool calls, tool_call
ids that repeat across turns, legacy function_call pairs, huge tool outputs, images in user
content, unknown fields, and strictly alternating chats as strict templates require.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
from hypothesis import strategies as st

from inflight.cli.simulate import common_prefix as common_prefix  # re-exported for the tests
from inflight.compaction.inserted import SUMMARY_PREFIX
from inflight.compaction.units import Unit

TEXT = st.text(alphabet="abcdefghij klmnop\n.,:{}0123456789", min_size=0, max_size=300)


def simple_count(message: Mapping[str, Any]) -> int:
    """A deterministic stand-in for the token counter: ~4 bytes a token, 3 of overhead."""
    return len(orjson.dumps(message)) // 4 + 3


def sizes() -> st.SearchStrategy[int]:
    return st.one_of(st.integers(0, 400), st.integers(400, 4000), st.integers(10_000, 60_000))


@st.composite
def tool_round(draw: st.DrawFn, ids: Sequence[str]) -> list[dict[str, Any]]:
    n = draw(st.integers(1, 4))
    call_ids = [draw(st.sampled_from(ids)) + str(k) for k in range(n)]
    calls = [
        {
            "id": cid,
            "type": "function",
            "function": {
                "name": draw(st.sampled_from(["bash", "read", "grep"])),
                "arguments": json.dumps({"q": draw(TEXT)}),
            },
        }
        for cid in call_ids
    ]
    msgs: list[dict[str, Any]] = [
        {"role": "assistant", "content": draw(st.one_of(st.none(), TEXT)), "tool_calls": calls}
    ]
    for cid in call_ids:
        size = draw(sizes())
        msgs.append({"role": "tool", "tool_call_id": cid, "content": "x" * size})
    return msgs


@st.composite
def function_round(draw: st.DrawFn) -> list[dict[str, Any]]:
    return [
        {
            "role": "assistant",
            "content": None,
            "function_call": {"name": "lookup", "arguments": "{}"},
        },
        {"role": "function", "name": "lookup", "content": "y" * draw(sizes())},
    ]


@st.composite
def user_message(draw: st.DrawFn) -> dict[str, Any]:
    if draw(st.booleans()):
        return {"role": "user", "content": draw(TEXT) + "u" * draw(st.integers(0, 2000))}
    return {
        "role": "user",
        "content": [
            {"type": "text", "text": draw(TEXT)},
            {
                "type": "image_url",
                "image_url": {
                    "url": "data:image/png;base64,AAAA",
                    "detail": draw(st.sampled_from(["low", "high"])),
                },
            },
        ],
        "x_client_meta": {"id": draw(st.integers(0, 9))},
    }


@st.composite
def instruction(draw: st.DrawFn) -> dict[str, Any]:
    """A system or developer message in the middle of a conversation (an instruction)."""
    role = draw(st.sampled_from(["system", "developer"]))
    return {"role": role, "content": "From now on: " + draw(TEXT) + "s" * draw(st.integers(0, 800))}


@st.composite
def agent_conversation(draw: st.DrawFn) -> list[dict[str, Any]]:
    """System, user, then a mix of tool rounds, function rounds, assistant and user turns."""
    ids = ["call_a", "call_b"]  # tiny pool: ids repeat across turns, as in real transcripts
    msgs: list[dict[str, Any]] = []
    if draw(st.booleans()):
        msgs.append({"role": "system", "content": "You are an agent. " + draw(TEXT)})
    msgs.append(draw(user_message()))
    for _ in range(draw(st.integers(0, 24))):
        kind = draw(
            st.sampled_from(["tool", "tool", "function", "assistant", "user", "user", "system"])
        )
        if kind == "tool":
            msgs.extend(draw(tool_round(ids)))
        elif kind == "function":
            msgs.extend(draw(function_round()))
        elif kind == "assistant":
            msgs.append(
                {
                    "role": "assistant",
                    "content": draw(TEXT) + "a" * draw(st.integers(0, 3000)),
                    "x_unknown": 1,
                }
            )
        elif kind == "user":
            msgs.append(draw(user_message()))
        else:
            msgs.append(draw(instruction()))
    if msgs[-1]["role"] == "assistant" and not msgs[-1].get("tool_calls"):
        msgs.append(draw(user_message()))
    return msgs


@st.composite
def strict_conversation(draw: st.DrawFn) -> list[dict[str, Any]]:
    """One system message, then user/assistant strictly alternating, ending with user."""
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}]
    turns = draw(st.integers(1, 30))
    for k in range(turns):
        msgs.append(
            {"role": "user", "content": f"q{k} " + draw(TEXT) + "u" * draw(st.integers(0, 1500))}
        )
        msgs.append(
            {
                "role": "assistant",
                "content": f"a{k} " + draw(TEXT) + "a" * draw(st.integers(0, 1500)),
            }
        )
    msgs.append({"role": "user", "content": "last question"})
    return msgs


@st.composite
def strict_agent_conversation(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Strict role order as the Mistral v0.3 template checks it, with tool calls: after each
    user message, tool rounds, the assistant's answer, maybe more tool rounds, then the user
    again. The last turn may stop after any tool result."""
    ids = ["call_a", "call_b"]
    msgs: list[dict[str, Any]] = []
    if draw(st.booleans()):
        msgs.append({"role": "system", "content": "You are an agent. " + draw(TEXT)})
    msgs.append(draw(user_message()))
    for turn in range(draw(st.integers(0, 12)) + 1):
        for _ in range(draw(st.integers(0, 3))):
            msgs.extend(draw(tool_round(ids)))
        if not draw(st.integers(0, 5)):
            break  # stop mid-turn (after a tool result, or at the user message)
        text = f"answer {turn} " + draw(TEXT) + "a" * draw(st.integers(0, 2500))
        msgs.append({"role": "assistant", "content": text})
        for _ in range(draw(st.sampled_from([0, 0, 0, 1, 2]))):
            msgs.extend(draw(tool_round(ids)))
        if msgs[-1]["role"] == "tool" and not draw(st.integers(0, 3)):
            break
        msgs.append(draw(user_message()))
    return msgs


def conversations() -> st.SearchStrategy[list[dict[str, Any]]]:
    return st.one_of(agent_conversation(), strict_conversation(), strict_agent_conversation())


def turns(messages: Sequence[Mapping[str, Any]]) -> list[Any]:
    """The roles strict templates check order on: all but tool results and assistant messages
    that carry calls."""
    return [
        m.get("role")
        for m in messages
        if m.get("role") not in ("tool", "function")
        and not (m.get("role") == "assistant" and (m.get("tool_calls") or m.get("function_call")))
    ]


def follows_strict_rule(messages: Sequence[Mapping[str, Any]], *, planning: bool = False) -> bool:
    """The test oracle for DESIGN.md §4.6, written independently of `inflight.compaction.units`: one
    optional leading system message; then, ignoring tool results and assistant messages that
    carry calls, user and assistant alternate, starting with user (at least one user).
    `planning`: as the planner keeps turns alternating, where a system or developer message
    after the first user message is an instruction that takes no turn (§3; Anthropic's rule for
    the system messages Claude Code puts in `messages`)."""
    rest = messages[1:] if messages and messages[0].get("role") == "system" else messages
    if planning:
        first_user = next((i for i, m in enumerate(rest) if m.get("role") == "user"), len(rest))
        rest = [
            m
            for i, m in enumerate(rest)
            if i <= first_user or m.get("role") not in ("system", "developer")
        ]
    spoken = turns(rest)
    alternating = ["user", "assistant"] * (len(spoken) // 2) + ["user"] * (len(spoken) % 2)
    return bool(spoken) and spoken == alternating


def summary_text(message: Mapping[str, Any]) -> str | None:
    """The summary a message carries: its content, or its last text part when folded in."""
    content = message.get("content")
    if isinstance(content, list) and content and isinstance(content[-1], dict):
        content = content[-1].get("text")
    return content if isinstance(content, str) and content.startswith(SUMMARY_PREFIX) else None


def strict_floor(
    messages: Sequence[Mapping[str, Any]],
    units: Sequence[Unit],
    head: int,
    *,
    planning: bool = False,
) -> int:
    """The furthest unit a cut may stand before in a strict chat: after the head's user message
    the kept turns, and the next turn to come, must go on alternating (`planning`: instructions
    take no turn, see `follows_strict_rule`)."""
    spoken = [t for t in turns(messages) if not (planning and t in ("system", "developer"))]
    after = {"role": "user" if spoken and spoken[-1] == "assistant" else "assistant", "content": ""}
    head_messages = list(messages[: units[head - 1].end])
    for first in range(len(units) - 1, head - 1, -1):
        kept = [*head_messages, *messages[units[first].start :], after]
        if follows_strict_rule(kept, planning=planning):
            return first
    return head


def summary_in(messages: Sequence[Mapping[str, Any]]) -> str | None:
    """The summary in forwarded messages: a message of its own right after the head, or
    folded into the head's user message."""
    return next((text for m in messages if (text := summary_text(m)) is not None), None)


def agent_session(rounds: int, words: int = 200) -> list[dict[str, Any]]:
    """A fixed agent session: a system and a user message, then `rounds` tool rounds whose
    outputs are `words` words long."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": "Fix the bug."},
    ]
    for i in range(rounds):
        call = {"id": f"c{i}", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": f"out {i} " * words})
    return messages


def planted(session: int, rounds: int = 26) -> tuple[list[dict[str, Any]], list[str]]:
    """An agent session whose first ten tool outputs each plant one fact (`FACT-…`), and
    those facts (the summaries-under-load test and bench)."""
    facts = [f"FACT-{session:02x}{i:04x}" for i in range(10)]
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": f"Session {session}: fix the parser."},
    ]
    for i in range(rounds):
        call = {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": "bash", "arguments": f'{{"cmd": "step {i}"}}'},
        }
        fact = f" remember {facts[i]}." if i < len(facts) else ""
        messages.append({"role": "assistant", "content": f"Step {i}.", "tool_calls": [call]})
        output = f"output {i}{fact} " + "line " * 160
        messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": output})
    return messages, facts
