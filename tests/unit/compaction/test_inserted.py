"""app/compaction/inserted.py: what the engine writes in place of a cut span is recognised when
a compacted request comes back — every kind of stand-in, inserted or folded, in each wire form
the adapters render it in — and nothing else is."""

from __future__ import annotations

from typing import Any

import pytest

from inflight.compaction.engine import compact
from inflight.compaction.inserted import (
    OMITTED_NOTE,
    SPAN_MARKER,
    SUMMARY_PREFIX,
    is_inserted,
    unfolded,
)
from inflight.compaction.pins import PINNED_HEADING, parse_pins
from inflight.compaction.policy import Budget
from inflight.compaction.units import UnitRoles
from inflight.strategies import StrategyName
from tests.support.conversations import agent_session, simple_count

MARKER = SPAN_MARKER.format(count=7, ref="(ref: 0123456789ab)")
STAND_INS = [
    SUMMARY_PREFIX + "the agent fixed the parser",
    MARKER,
    f"{PINNED_HEADING}\n- OPS-4127\n\n{MARKER}",
    f"{PINNED_HEADING}\n- OPS-4127",
    OMITTED_NOTE,
]


@pytest.mark.parametrize("text", STAND_INS)
@pytest.mark.parametrize("role", ["assistant", "user"])
def test_every_stand_in_is_recognised_in_every_form(text: str, role: str) -> None:
    assert is_inserted({"role": role, "content": text})
    assert is_inserted({"role": role, "content": [{"type": "text", "text": text}]})
    assert is_inserted({"role": role, "content": [{"type": "output_text", "text": text}]})


@pytest.mark.parametrize(
    "message",
    [
        {"role": "assistant", "content": "The summary of the earlier conversation: none."},
        {"role": "assistant", "content": MARKER + " and more"},  # a marker is the whole text
        {"role": "assistant", "content": "see " + OMITTED_NOTE},
        {"role": "system", "content": SUMMARY_PREFIX + "an instruction, pinned as such"},
        {"role": "tool", "tool_call_id": "c0", "content": SUMMARY_PREFIX},
        {"role": "assistant", "content": SUMMARY_PREFIX, "tool_calls": [{"id": "c0"}]},
        {"role": "user", "content": [{"type": "text", "text": SUMMARY_PREFIX}, {"type": "image"}]},
        {"role": "user", "content": None},
    ],
)
def test_what_the_engine_did_not_write_is_not_a_stand_in(message: dict[str, Any]) -> None:
    assert not is_inserted(message)


def test_unfolded_gives_the_head_its_own_content_back() -> None:
    folded = {"type": "text", "text": SUMMARY_PREFIX + "the agent fixed the parser"}
    own = [{"type": "text", "text": "Fix it."}, {"type": "image_url", "image_url": {"url": "u"}}]
    assert unfolded({"role": "user", "content": [own[0], folded]}) == {
        "role": "user",
        "content": "Fix it.",  # a string the fold made a list of parts
    }
    assert unfolded({"role": "user", "content": [*own, folded], "name": "n"}) == {
        "role": "user",
        "content": own,
        "name": "n",
    }
    responses = {"type": "input_text", "text": OMITTED_NOTE}
    assert unfolded({"role": "user", "content": [{"type": "input_text", "text": "a"}, responses]})
    assert unfolded({"role": "user", "content": "Fix it."}) is None
    assert unfolded({"role": "user", "content": own}) is None
    assert unfolded({"role": "user", "content": ["not a part"]}) is None


def test_only_the_unit_right_after_the_head_is_taken_for_a_stand_in() -> None:
    summary = {"role": "assistant", "content": SUMMARY_PREFIX + "earlier work"}
    messages = [*agent_session(2)[:2], summary, {"role": "user", "content": "go on"}]
    roles = UnitRoles.of(messages)
    assert roles.stand_in
    assert roles.lone_stand_in(roles.head + 1)  # the stand-in alone
    assert not roles.lone_stand_in(roles.head + 2)  # with a message of the client's
    assert not UnitRoles.of([*messages[:2], messages[3], summary]).stand_in
    assert roles.prefix(roles.head + 1).stand_in
    assert not roles.prefix(roles.head).stand_in
    extended = roles.prefix(roles.head).extended(messages)
    assert extended is not None
    assert extended.stand_in


BUDGET = Budget(window=2048, reserve=256, threshold=0.8, target=0.5)


@pytest.mark.parametrize(
    ("pipeline", "options"),
    [
        (("summarize",), {"summary": "the agent read the logs"}),
        (("summarize",), {"summary": "the agent read it", "restore": True}),
        (("trim",), {"restore": True}),
        (("middle-out",), {"restore": True}),
        (("trim",), {"pins": parse_pins("OPS-4127")}),
        (("trim",), {"pins": parse_pins("NOTHING-MATCHES")}),
    ],
)
@pytest.mark.parametrize("user_turn_follows", [False, True])
def test_what_the_engine_writes_it_recognises(
    pipeline: tuple[StrategyName, ...], options: dict[str, Any], user_turn_follows: bool
) -> None:
    """Compacted, a conversation carries the stand-in right after its head (a message of its
    own), or folded into the head's user message (when no user turn follows the cut): either
    way it is recognised, and the head unfolded is the head as the client sent it."""
    messages = agent_session(6 if user_turn_follows else 12, words=120)
    messages[3] = {**messages[3], "content": "ticket OPS-4127 " + messages[3]["content"]}
    if user_turn_follows:
        messages += [
            {"role": "assistant", "content": "Done."},
            {"role": "user", "content": "Now the tests."},
            *agent_session(2, words=120)[2:],
        ]
    result = compact(messages, pipeline, BUDGET, simple_count, 0, **options)
    head_end = 2
    assert result.plan.cut > result.plan.head or result.plan.dropped
    if result.plan.summary_role == "fold":
        assert unfolded(result.messages[head_end - 1]) == messages[head_end - 1]
        assert not UnitRoles.of(result.messages).stand_in
    else:
        assert is_inserted(result.messages[head_end])
        assert UnitRoles.of(result.messages).stand_in
