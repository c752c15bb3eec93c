"""Which wire format a `/v1/compaction/*` body is in (app/apis/detect.py)."""

from __future__ import annotations

from typing import Any

import pytest

from inflight.apis.detect import detect_api
from inflight.errors import InvalidControl

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
RESULT = {"type": "tool_result", "tool_use_id": "t", "content": "ok"}


@pytest.mark.parametrize(
    ("headers", "body", "expected"),
    [
        ({}, CHAT, "chat"),
        ({}, {"model": "m", "input": "hi"}, "responses"),
        ({}, {"model": "m", "input": [{"role": "user", "content": "hi"}]}, "responses"),
        ({"anthropic-version": "2023-06-01"}, CHAT, "messages"),
        ({}, {**CHAT, "system": "Be brief."}, "messages"),
        ({}, {"model": "m", "messages": [{"role": "user", "content": [RESULT]}]}, "messages"),
        ({"X-Compaction-Format": "chat"}, {**CHAT, "input": "x"}, "chat"),
        ({"x-compaction-format": " Responses "}, CHAT, "responses"),
        ({"X-Compaction-Format": "messages"}, CHAT, "messages"),
    ],
)
def test_detection(headers: dict[str, str], body: dict[str, Any], expected: str) -> None:
    assert detect_api(headers, body) == expected


def test_an_unknown_format_is_a_400_naming_the_header() -> None:
    with pytest.raises(InvalidControl) as caught:
        detect_api({"X-Compaction-Format": "gemini"}, CHAT)
    assert caught.value.param == "X-Compaction-Format"
