"""One request's messages serialised once (app/jsontext.py): the counter, the replay cache and
the offload check share the text; another list (even of equal content) is its own."""

from __future__ import annotations

from collections import UserDict
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import inflight.jsontext as jsontext
from inflight.jsontext import HistoryTexts


def test_the_text_of_a_list_is_made_once(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[int] = []
    real = orjson.dumps

    def dumps(value: Any, **kwargs: Any) -> bytes:
        made.append(1)
        return real(value, **kwargs)

    monkeypatch.setattr(jsontext.orjson, "dumps", dumps)
    messages_text = HistoryTexts().messages_text
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

    texts = HistoryTexts()
    assert texts.messages_text([Message(role="user", content="hi")]) is None
    assert texts.messages_text([{"role": "user", "content": "hi"}]) is not None


# -- what the body parser proves: a history starts with an earlier one's bytes ----------------

EDITS = st.lists(
    st.tuples(
        st.sampled_from(["grow", "grow", "grow", "branch", "model", "drop"]), st.integers(0, 50)
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=40, deadline=None)
@given(EDITS)
def test_starts_with_agrees_with_the_bytes(
    tmp_path_factory: pytest.TempPathFactory, edits: list[tuple[str, int]]
) -> None:
    """A session parsed as the proxy parses it (reusing the last body's parse), grown,
    branched at an earlier message, its model changed or its tail dropped: whatever the parser
    claims a history starts with (`starts_with`'s shortcut), the bytes say the same, for every
    earlier history at every message boundary and whole; and a grown session is claimed."""
    from inflight.factory import create_app
    from tests.conftest import make_settings

    app = create_app(make_settings(tmp_path_factory.mktemp("s")))
    chat = app.state.inflight.apis["chat"]
    shared = chat._compactor.texts  # the parser's, the counter's and the replay cache's
    messages: list[dict[str, Any]] = [{"role": "system", "content": "s " * 300}]
    model, texts, claimed = "gpt-4o", [], 0
    for kind, n in edits:
        if kind == "grow":
            messages = [
                *messages,
                {"role": "user" if n % 2 else "assistant", "content": f"m{n} " * 100},
            ]
        elif kind == "branch" and len(messages) > 1:
            at = 1 + n % (len(messages) - 1)
            messages = [
                *messages[:at],
                {"role": "user", "content": f"edited {n}"},
                *messages[at + 1 :],
            ]
        elif kind == "model":
            model = f"gpt-4o-{n % 3}"
        elif kind == "drop" and len(messages) > 1:
            messages = messages[: max(1, len(messages) - 1 - n % 3)]
        body = chat._parse(orjson.dumps({"model": model, "messages": messages}), b"client")
        text = shared.messages_text(body["messages"])
        assert text == orjson.dumps(messages)
        for earlier in texts:
            bounds = {len(earlier), len(earlier) - 1, *range(1, len(earlier), 997)}
            for length in bounds:
                assert shared.starts_with(text, earlier, length) == text.startswith(
                    earlier[:length]
                ), (kind, length)
                known = shared._proof
                if known is not None and known[0] is text and id(earlier) in known[1]:
                    claimed += 1
        texts = [*texts[-10:], text]
    if sum(kind == "grow" for kind, _ in edits) > 3 and all(k == "grow" for k, _ in edits):
        assert claimed  # a growing session's histories are known without comparing
