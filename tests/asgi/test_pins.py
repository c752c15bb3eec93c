"""Pins (`X-Compaction-Pin`, `compaction.pin`; DESIGN.md §14): the syntax, a 400 on a bad pin,
what a pin matches in the cut survives trim and summarize verbatim beside the stand-in, and
the invariants of §4 hold with pins."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inflight.compaction.engine import compact
from inflight.compaction.pins import (
    MAX_PIN_CHARS,
    MAX_PINS,
    PINNED_HEADING,
    BadPin,
    parse_pins,
    pinned_matches,
)
from inflight.compaction.policy import parse_controls
from inflight.compaction.units import check_pair_safety
from inflight.errors import InvalidControl
from tests.asgi.test_compaction_asgi import long_chat
from tests.support.conversations import conversations, follows_strict_rule, simple_count
from tests.unit.compaction.test_invariants import budget_for, check_cache_stability

PINS = parse_pins("OPS-4127, re:order #W\\d{7}")


def test_a_pin_list_is_literals_and_re_prefixed_patterns() -> None:
    pins = parse_pins(" OPS-4127 ,re:id=\\d{1,12}, a.b ")
    assert [p.source for p in pins] == ["OPS-4127", "re:id=\\d{1,12}", "a.b"]
    assert pins[2].pattern.search("a.b")
    assert not pins[2].pattern.search("axb")
    assert parse_pins(["a, b", "c"])[0].source == "a, b"  # an array: one pin per item
    assert parse_pins("") == ()


@pytest.mark.parametrize(
    "value",
    [
        "re:(unclosed",
        "re:x*",  # matches the empty string
        ",".join(f"p{i}" for i in range(MAX_PINS + 1)),
        "x" * (MAX_PIN_CHARS + 1),
        5,
        ["ok", 3],
        {"pin": "x"},
    ],
)
def test_a_bad_pin_is_refused(value: Any) -> None:
    with pytest.raises(BadPin):
        parse_pins(value)


def test_pins_come_from_the_header_or_the_body_and_the_header_wins() -> None:
    body = {"model": "m", "messages": [], "compaction": {"pin": ["from-body"]}}
    controls, cleaned = parse_controls({}, body)
    assert controls.pins is not None
    assert [p.source for p in controls.pins] == ["from-body"]
    assert "compaction" not in cleaned
    controls, _ = parse_controls({"x-compaction-pin": "from-header"}, body)
    assert controls.pins is not None
    assert [p.source for p in controls.pins] == ["from-header"]
    with pytest.raises(InvalidControl) as info:
        parse_controls({"x-compaction-pin": "re:["}, {"model": "m", "messages": []})
    assert info.value.param == "x-compaction-pin"


def test_matches_are_in_order_each_once_and_bounded() -> None:
    messages = [
        {"role": "user", "content": "order #W1234567 and OPS-4127"},
        {"role": "assistant", "content": "OPS-4127 again, order #W7654321"},
    ]
    assert pinned_matches(messages, [0, 1], PINS) == [
        "OPS-4127",
        "order #W1234567",
        "order #W7654321",
    ]
    long = parse_pins("re:y{1,200}")
    assert pinned_matches([{"role": "user", "content": "y" * 500}], [0], long) == [
        "y" * MAX_PIN_CHARS,
        "y" * 100,
    ]


def session() -> list[dict[str, Any]]:
    messages = long_chat(30, 400)
    messages[3] = {**messages[3], "content": "ticket OPS-4127: order #W1234567 " + "data " * 400}
    return messages


def test_pinned_text_survives_trim() -> None:
    messages = session()
    budget = budget_for(8192)
    plain = compact(messages, ("trim",), budget, simple_count, 0)
    assert "trim" in plain.applied
    assert "OPS-4127" not in orjson.dumps(plain.messages).decode()
    pinned = compact(messages, ("trim",), budget, simple_count, 0, pins=PINS)
    shown = orjson.dumps(pinned.messages).decode()
    assert PINNED_HEADING in shown
    assert "OPS-4127" in shown
    assert "order #W1234567" in shown
    assert check_pair_safety(pinned.messages) == []
    assert pinned.tokens_after <= budget.budget
    assert pinned.tokens_after == sum(simple_count(m) for m in pinned.messages)
    again = compact(pinned.messages, ("trim",), budget, simple_count, 0, pins=PINS)
    assert again.applied == ()
    assert again.messages == pinned.messages


def test_pinned_text_stands_after_the_summary_and_before_the_marker() -> None:
    messages = session()
    budget = budget_for(8192)
    pipeline = ("summarize",)
    result = compact(
        messages, pipeline, budget, simple_count, 0, summary="the summary", restore=True,
        summary_tokens=600, pins=PINS,
    )  # fmt: skip
    shown = orjson.dumps(result.messages).decode()
    summary, pinned, marker = (
        shown.index("the summary"),
        shown.index(PINNED_HEADING),
        shown.index("inflight removed"),
    )
    assert summary < pinned < marker


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    messages=conversations(),
    window=st.sampled_from([2048, 4096, 8192]),
    pipeline=st.sampled_from([("trim",), ("middle-out",), ("truncate", "prune", "trim")]),
    restore=st.booleans(),
)
def test_the_invariants_hold_with_pins(
    messages: list[dict[str, Any]], window: int, pipeline: tuple[Any, ...], restore: bool
) -> None:
    """1 pair safety, 4 bounded, 5 idempotent, 6 role order, 7 cache-stable, with pins that
    match what the generated conversations hold (digits, words)."""
    pins = parse_pins("re:[0-9]{3}, abc")
    budget = budget_for(window)

    def run(m: Any, p: Any, w: int) -> Any:
        return compact(m, p, budget_for(w), simple_count, 0, restore=restore, pins=pins)

    result = run(messages, pipeline, window)
    out = result.messages
    assert check_pair_safety(out) == []
    assert result.tokens_after <= result.tokens_before
    assert result.tokens_after == sum(simple_count(m) for m in out)
    if not result.over_budget:
        assert result.tokens_after <= budget.budget
    again = run(out, pipeline, window)
    assert again.applied == ()
    assert again.messages == out
    if follows_strict_rule(messages):
        assert follows_strict_rule(out)
    check_cache_stability(messages, pipeline, window, run)


pytestmark = pytest.mark.anyio


async def test_a_bad_pin_header_is_a_400_naming_it(client: httpx.AsyncClient) -> None:
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
    response = await client.post(
        "/v1/chat/completions", content=orjson.dumps(body), headers={"X-Compaction-Pin": "re:(("}
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"].lower() == "x-compaction-pin"
    assert "regular expression" in error["message"]


async def test_a_pin_survives_trim_and_summarize_through_the_preview(
    client: httpx.AsyncClient,
) -> None:
    messages = session()
    for strategy in ("trim", "summarize"):
        response = await client.post(
            "/v1/compaction/preview",
            content=orjson.dumps({"model": "gpt-4o", "messages": messages}),
            headers={
                "X-Compaction-Context-Limit": "8192",
                "X-Compaction-Strategy": strategy,
                "X-Compaction-Summary-Wait": "true",
                "X-Compaction-Pin": "OPS-4127",
            },
        )
        assert response.status_code == 200, response.text
        data = response.json()
        assert strategy in data["report"]["applied"]
        shown = orjson.dumps(data["messages"]).decode()
        assert "OPS-4127" in shown
        assert PINNED_HEADING in shown
        assert check_pair_safety(data["messages"]) == []


async def test_the_preview_reports_what_became_of_the_cut_references(
    client: httpx.AsyncClient,
) -> None:
    """The preview's `facts`: the identifiers of what was cut, retained / restorable / lost."""
    messages = session()
    reports = {}
    for restore in ("off", "on"):
        response = await client.post(
            "/v1/compaction/preview",
            content=orjson.dumps({"model": "gpt-4o", "messages": messages}),
            headers={
                "X-Compaction-Context-Limit": "8192",
                "X-Compaction-Strategy": "trim",
                "X-Compaction-Restore": restore,
            },
        )
        reports[restore] = response.json()["report"]["facts"]
    off, on = reports["off"], reports["on"]
    assert off["references"] > 0
    assert off["lost"] > 0
    assert off["restorable"] == 0
    assert on["restorable"] > 0
    assert on["lost"] == 0
    for counts in (off, on):
        assert counts["retained"] + counts["restorable"] + counts["lost"] == counts["references"]


@pytest.mark.parametrize(
    "pattern",
    [
        r"re:(a+)+x",  # nested repeats: exponential on "aaaa…"
        r"re:(a|aa){1,9}",  # alternation under a repeat
        r"re:\w+x",  # unbounded: quadratic over a long run of word characters
        r"re:.*secret",
        r"re:\d{3,}",
        r"re:(\w{1,9})\1",  # a backreference
        r"re:(?=a)b",  # a lookaround
        r"re:\w{1,64}\d{1,64}",  # bounds multiplying past the work per position
    ],
)
def test_a_regex_pin_whose_work_is_not_bounded_is_refused(pattern: str) -> None:
    """A pin runs in the event loop on text the client sizes: a shape that can backtrack
    without bound is a 400, never a stalled proxy."""
    with pytest.raises(BadPin, match="too long"):
        parse_pins(pattern)


def test_the_regex_pins_of_one_request_share_one_work_bound() -> None:
    one = r"re:[a-z]{1,30}\.py"  # 31 × 1 steps a position
    parse_pins(", ".join([one] * 16))  # 496: within the bound
    with pytest.raises(BadPin, match="together"):
        parse_pins(", ".join(f"re:{c}{{1,200}}" for c in "uvwxyz"))  # 6 × 201 = 1206


def test_a_hostile_text_is_scanned_only_so_far() -> None:
    """What regex pins read of a cut is bounded whatever its size."""
    from inflight.compaction.pins import SCANNED_CHARS

    messages = [{"role": "tool", "content": "a" * (4 * SCANNED_CHARS) + "ORD-123456"}]
    (pin,) = parse_pins(r"re:ORD-\d{6}")
    assert pinned_matches(messages, [0], [pin]) == []  # past the bound: not read
    messages = [{"role": "tool", "content": "ORD-123456 " + "a" * (4 * SCANNED_CHARS)}]
    assert pinned_matches(messages, [0], [pin]) == ["ORD-123456"]
