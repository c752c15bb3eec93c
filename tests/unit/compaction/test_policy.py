"""Per-request controls: parsed from headers and the body without changing the body, headers
winning; every bad value is a 400 naming it; the budget and the pipeline they imply."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from inflight.compaction.policy import CONTROL_KEYS, Budget, parse_controls, resolve_pipeline
from inflight.errors import InvalidControl
from inflight.strategies import parse_strategy

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)
controls = st.fixed_dictionaries(
    {},
    optional={
        "transforms": st.sampled_from([[], ["middle-out"]]),
        "compaction": st.fixed_dictionaries(
            {},
            optional={
                "strategy": st.sampled_from(["auto", "none", "trim", "truncate,prune"]),
                "context_limit": st.integers(1, 10**6),
                "threshold": st.sampled_from([0.5, 0.9, 1]),
            },
        ),
    },
)
bodies = st.builds(
    lambda rest, ctl: {**rest, **ctl},
    st.dictionaries(st.text(max_size=6).filter(lambda k: k not in CONTROL_KEYS), json_values),
    controls,
)


@given(bodies)
def test_the_body_is_never_changed(body: dict[str, Any]) -> None:
    before = copy.deepcopy(body)
    _, cleaned = parse_controls({}, body)
    assert body == before
    assert cleaned == {k: v for k, v in body.items() if k not in CONTROL_KEYS}
    if not any(k in body for k in CONTROL_KEYS):
        assert cleaned is body  # nothing to remove: the same object, so its bytes go up


def test_headers_win_over_the_body() -> None:
    body = {"compaction": {"strategy": "trim", "threshold": 0.5}, "transforms": ["middle-out"]}
    parsed, _ = parse_controls({"x-compaction-strategy": "prune"}, body)
    assert parsed.strategies == ("prune",)
    assert parsed.threshold == 0.5


@pytest.mark.parametrize(
    ("headers", "body", "param"),
    [
        ({"x-compaction-bogus": "1"}, {}, "x-compaction-bogus"),
        ({}, {"transforms": "middle-out"}, "transforms"),
        ({}, {"transforms": ["fit"]}, "transforms"),
        ({}, {"compaction": []}, "compaction"),
        ({}, {"compaction": {"nope": 1}}, "compaction"),
        ({"x-compaction-context-limit": "0"}, {}, "x-compaction-context-limit"),
        ({}, {"compaction": {"threshold": 1.5}}, "compaction.threshold"),
        (
            {"x-compaction-threshold": "0.5", "x-compaction-target": "0.8"},
            {},
            "x-compaction-target",
        ),
        ({}, {"compaction": {"summary_model": " "}}, "compaction.summary_model"),
        ({"x-compaction-strategy": ""}, {}, "x-compaction-strategy"),
    ],
)
def test_a_bad_control_is_a_400_naming_it(
    headers: dict[str, str], body: dict[str, Any], param: str
) -> None:
    with pytest.raises(InvalidControl) as caught:
        parse_controls(headers, body)
    assert caught.value.param == param
    assert caught.value.status_code == 400


def test_strategy_lists_and_the_pipeline() -> None:
    assert parse_strategy("auto", "p") is None
    assert parse_strategy("none", "p") == ()
    assert parse_strategy("Trim, prune,trim", "p") == ("trim", "prune")
    assert resolve_pipeline(None, summarizer_available=True)[-1] == "summarize"
    assert resolve_pipeline(None, summarizer_available=False)[-1] == "trim"
    assert resolve_pipeline(("prune",), summarizer_available=True) == ("prune",)


def test_budget_band() -> None:
    budget = Budget(window=10_000, reserve=2_000, threshold=0.8, target=0.6)
    assert (budget.budget, budget.trigger, budget.goal) == (8_000, 6_400, 4_800)
    assert Budget(window=10, reserve=10, threshold=1, target=1).budget == 1


@pytest.mark.parametrize("value", ["100000001", "1" + "0" * 30])
def test_an_absurd_context_limit_is_a_400_naming_it(value: str) -> None:
    with pytest.raises(InvalidControl) as caught:
        parse_controls({"x-compaction-context-limit": value}, {"model": "m", "messages": []})
    assert caught.value.param == "x-compaction-context-limit"


@pytest.mark.parametrize(
    ("headers", "body", "expected"),
    [
        ({"x-compaction-restore": "ON"}, {}, {"restore": True}),
        ({"x-compaction-restore": "off"}, {"restore": True}, {"restore": False}),
        ({}, {"summary_wait": True}, {"summary_wait": True}),
        ({"x-compaction-summary-wait": "false"}, {}, {"summary_wait": False}),
        (
            {"x-compaction-protect-tools": " memory, plan ,"},
            {},
            {"protect_tools": {"memory", "plan"}},
        ),
        ({}, {"protect_tools": ["memory"]}, {"protect_tools": {"memory"}}),
        ({"x-compaction-protect-tools": ""}, {}, {"protect_tools": set()}),
        ({}, {}, {"restore": None, "summary_wait": None, "protect_tools": None}),
    ],
)
def test_restore_protect_and_wait_controls(
    headers: dict[str, str], body: dict[str, Any], expected: dict[str, Any]
) -> None:
    controls, _ = parse_controls(headers, {"model": "m", "compaction": body})
    for name, value in expected.items():
        assert getattr(controls, name) == value


@pytest.mark.parametrize(
    ("headers", "body", "param"),
    [
        ({"X-Compaction-Restore": "maybe"}, {}, "X-Compaction-Restore"),
        ({}, {"summary_wait": "soon"}, "compaction.summary_wait"),
        ({}, {"protect_tools": [1, 2]}, "compaction.protect_tools"),
        ({}, {"restore": 3}, "compaction.restore"),
    ],
)
def test_bad_switches_are_400s_naming_them(
    headers: dict[str, str], body: dict[str, Any], param: str
) -> None:
    with pytest.raises(InvalidControl) as raised:
        parse_controls(headers, {"model": "m", "compaction": body})
    assert raised.value.param == param
