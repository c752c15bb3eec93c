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
def agent_conversation(draw: st.DrawFn) -> list[dict[str, Any]]:
    """System, user, then a mix of tool rounds, function rounds, assistant and user turns."""
    ids = ["call_a", "call_b"]  # tiny pool: ids repeat across turns, as in real transcripts
    msgs: list[dict[str, Any]] = []
    if draw(st.booleans()):
        msgs.append({"role": "system", "content": "You are an agent. " + draw(TEXT)})
    msgs.append(draw(user_message()))
    for _ in range(draw(st.integers(0, 24))):
        kind = draw(st.sampled_from(["tool", "tool", "function", "assistant", "user"]))
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
        else:
            msgs.append(draw(user_message()))
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


def conversations() -> st.SearchStrategy[list[dict[str, Any]]]:
    return st.one_of(agent_conversation(), strict_conversation())


def common_prefix(a: Sequence[Any], b: Sequence[Any]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
