"""Tool definitions and schemas (the prompt outside the messages) are counted once per content:
an agent sends the same tools with every request."""

from __future__ import annotations

from typing import Any

from inflight.tokens.counter import ChatTokenCounter
from inflight.tokens.encodings import load_encodings

ENCODINGS = load_encodings()


def _body(description: str) -> dict[str, Any]:
    tool = {
        "type": "function",
        "function": {"name": "bash", "description": description, "parameters": {"type": "object"}},
    }
    schema = {
        "type": "json_schema",
        "json_schema": {"name": "answer", "schema": {"type": "object"}},
    }
    return {"messages": [], "tools": [tool] * 3, "response_format": schema}


def test_tools_are_encoded_once_and_counted_as_fresh(monkeypatch: Any) -> None:
    counter = ChatTokenCounter(ENCODINGS)
    encoded: list[str] = []
    original = counter._text
    monkeypatch.setattr(counter, "_text", lambda e, t: encoded.append(t) or original(e, t))
    body = _body("Runs a shell command. " * 40)
    first = counter.count_fixed("gpt-4o", body)
    calls = len(encoded)
    assert counter.count_fixed("gpt-4o", body) == first
    assert len(encoded) == calls  # nothing encoded again
    assert first == ChatTokenCounter(ENCODINGS).count_fixed("gpt-4o", body)
    other = _body("Reads a file. " * 40)  # other tools: counted on their own
    assert counter.count_fixed("gpt-4o", other) == ChatTokenCounter(ENCODINGS).count_fixed(
        "gpt-4o", other
    )
    assert counter.count_fixed("gpt-4o", other) != first
