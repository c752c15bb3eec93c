"""One request's messages serialised once (app/jsontext.py): the counter, the replay cache and
the offload check share the text; another list (even of equal content) is its own."""

from __future__ import annotations

from collections import UserDict
from typing import Any

import orjson
import pytest

import app.jsontext as jsontext
from app.jsontext import messages_text


def test_the_text_of_a_list_is_made_once(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[int] = []
    real = orjson.dumps

    def dumps(value: Any, **kwargs: Any) -> bytes:
        made.append(1)
        return real(value, **kwargs)

    monkeypatch.setattr(jsontext.orjson, "dumps", dumps)
    messages = [{"role": "user", "content": "hi"}]
    assert messages_text(messages) == real(messages)
    assert messages_text(messages) == real(messages)
    assert len(made) == 1
    other = [{"role": "user", "content": "hi there"}]
    assert messages_text(other) == real(other)
    assert len(made) == 2
    for i in range(jsontext.RECENT):  # pushed out by as many other lists
        messages_text([{"role": "user", "content": str(i)}])
    assert messages_text(messages) == real(messages)
    assert len(made) == 3 + jsontext.RECENT


def test_mappings_that_are_not_plain_objects_have_no_text() -> None:
    class Message(UserDict[str, Any]):
        pass

    assert messages_text([Message(role="user", content="hi")]) is None
    assert messages_text([{"role": "user", "content": "hi"}]) is not None
