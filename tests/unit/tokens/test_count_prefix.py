"""Counting a request's messages at once reuses the last request of the same conversation
(byte-identical leading messages) and gives exactly what counting each message gives."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from inflight.tokens import prefixes
from inflight.tokens.counter import ChatTokenCounter, Counted, count_within
from inflight.tokens.encodings import load_encodings

ENCODINGS = load_encodings()
PNG = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk"
    "YPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)
TEXT = st.text(alphabet=st.sampled_from('ab {}[]"\\\u00e9'), max_size=8)
MESSAGE = st.one_of(
    st.builds(lambda r, c: {"role": r, "content": c}, st.sampled_from(["user", "assistant"]), TEXT),
    st.builds(lambda c: {"content": c, "role": "user"}, TEXT),  # another key order
    st.builds(lambda c: {"role": "tool", "tool_call_id": "x", "content": c}, TEXT),
    st.just({"role": "user", "content": [{"type": "image_url", "image_url": {"url": PNG}}]}),
    st.builds(
        lambda n: {"role": "user", "content": "n", "extra": n}, st.integers(0, 2) | st.booleans()
    ),
)
# A step: which conversation, what it appends, and an optional edit of an earlier message.
STEP = st.tuples(st.integers(0, 2), st.lists(MESSAGE, max_size=3), st.integers(-1, 6), MESSAGE)


def fresh(model: str, messages: list[dict[str, Any]]) -> list[int]:
    """The reference: each message counted on its own by a counter that has seen nothing."""
    reference = ChatTokenCounter(ENCODINGS)
    return [reference.count_message(model, m) for m in messages]


@settings(max_examples=150, deadline=None)
@given(st.lists(STEP, min_size=1, max_size=12), st.sampled_from(["gpt-4o", "gpt-4o-mini", "qwen"]))
def test_batches_equal_counting_each_message(steps: list[Any], model: str) -> None:
    counter = ChatTokenCounter(ENCODINGS)
    conversations: list[list[dict[str, Any]]] = [
        [{"role": "system", "content": "s"}] for _ in range(3)
    ]
    for which, added, edit, replacement in steps:
        messages = conversations[which]
        messages.extend(copy.deepcopy(added))
        if 0 <= edit < len(messages):
            messages[edit] = copy.deepcopy(replacement)  # an edited history: no stale counts
        request = copy.deepcopy(messages)  # a new request parses new objects
        assert list(counter.count_messages(model, request)) == fresh(model, request)
        other = "gpt-4o-mini" if model != "gpt-4o-mini" else "gpt-4o"  # image prices differ
        assert list(counter.count_messages(other, request)) == fresh(other, request)


def test_calibration_applies_to_remembered_counts() -> None:
    counter = ChatTokenCounter(ENCODINGS)
    messages = [{"role": "user", "content": "hello " * 50}, {"role": "assistant", "content": "hi"}]
    before = list(counter.count_messages("qwen", messages))
    counter.observe("qwen", {"messages": messages}, 2 * sum(before), overflowed=True)
    after = list(counter.count_messages("qwen", copy.deepcopy(messages)))
    assert after != before
    assert after == [counter.count_message("qwen", m) for m in messages]


def test_remembered_conversations_are_bounded(monkeypatch: Any) -> None:
    monkeypatch.setattr(prefixes, "PREFIX_BYTES", 10_000)
    counter = ChatTokenCounter(ENCODINGS)
    for i in range(3 * prefixes.PREFIX_SLOTS):
        counter.count_messages("gpt-4o", [{"role": "user", "content": f"{i} " + "x" * 3000}])
    entries = counter._prefixes._entries.values()
    assert len(entries) <= 3
    assert sum(len(e.text) for e in entries) <= 10_000


def test_count_within_counts_copies_on_their_own() -> None:
    counter = ChatTokenCounter(ENCODINGS)
    messages = [{"role": "user", "content": "hello " * 20}]
    memo = Counted()
    assert count_within(counter, "gpt-4o", messages, memo, messages[0]) == counter.count_message(
        "gpt-4o", messages[0]
    )
    shorter = {"role": "user", "content": "hello"}
    assert count_within(counter, "gpt-4o", messages, memo, shorter) == counter.count_message(
        "gpt-4o", shorter
    )
    assert list(memo.counts or ()) == [counter.count_message("gpt-4o", messages[0])]


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 600), st.lists(st.integers(0, 599), max_size=20), st.booleans())
def test_count_within_finds_every_message_indexing_from_the_newest(
    size: int, lookups: list[int], copy_first: bool
) -> None:
    """Each message of the request gets its own count, the same object twice or a copy of one
    too, however the lookups go; a request that looks up only its newest messages indexes only
    a stretch at the end of them."""
    counter = ChatTokenCounter(ENCODINGS)
    shared = {"role": "user", "content": "the same object twice"}
    messages = [{"role": "user", "content": f"message {i} " * (i % 7 + 1)} for i in range(size)]
    messages[size // 2] = messages[-1] = shared
    memo = Counted()
    if copy_first:  # a copy, not in the list: found nowhere, counted on its own
        copied = dict(messages[0])
        assert count_within(counter, "m", messages, memo, copied) == counter.count_message(
            "m", copied
        )
    for i in [size - 1, *(i % size for i in lookups)]:
        expected = counter.count_message("m", messages[i])
        assert count_within(counter, "m", messages, memo, messages[i]) == expected
    tail = Counted()
    for message in messages[-3:]:
        count_within(counter, "m", messages, tail, message)
    assert len(tail.ids) <= max(16, 3)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(STEP, st.integers(0, 3)), min_size=1, max_size=12))
def test_calibrated_counts_reused_with_the_prefix_follow_the_calibration(steps: list[Any]) -> None:
    """The calibrated counts kept with a conversation's prefix are reused only under the same
    correction; raw counting (as calibrating on an answer does) keeps them; a recalibration
    between requests is seen at once."""
    counter = ChatTokenCounter(ENCODINGS)
    model = "qwen"  # heuristic: calibration moves it
    conversations: list[list[dict[str, Any]]] = [
        [{"role": "system", "content": "s"}] for _ in range(3)
    ]
    for (which, added, _, _), action in steps:
        messages = conversations[which]
        messages.extend(copy.deepcopy(added))
        request = copy.deepcopy(messages)
        if action == 1:  # calibrating on an answer counts the request raw
            counter.raw_request(model, {"messages": request})
        elif action == 2:  # the upstream says the prompt was bigger: the correction moves
            actual = 2 * counter.raw_request(model, {"messages": request}) + 40
            counter.observe(model, {"messages": request}, actual, overflowed=True)
        counted = list(counter.count_messages(model, request))
        assert counted == [counter.count_message(model, m) for m in request]
