"""Anthropic context editing applied by the proxy (app/apis/anthropic/context_edits.py, DESIGN.md
§13): each edit against Anthropic's documented examples and defaults, the decisions' cache
stability on growing sessions, and the route: edits applied for a local upstream (field and
beta flag stripped, `applied_edits` in the JSON answer and the stream's `message_delta`),
forwarded untouched to api.anthropic.com."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from anthropic.types.beta import BetaContextManagementResponse
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from inflight.apis.anthropic.context_edits import (
    PLACEHOLDER,
    ClearToolUses,
    apply_edits,
    cleared_uses,
)
from inflight.errors import BadRequest
from inflight.factory import create_app
from inflight.proxy.headers import without_beta
from tests.conftest import make_settings
from tests.support.fakes import FakeUpstream

BETA = "context-management-2025-06-27"
BIG = "line of tool output " * 200  # a result worth clearing (~800 heuristic tokens)


def session(
    rounds: int, *, thinking: bool = False, names: tuple[str, ...] = ("Bash",)
) -> list[Any]:
    """A coding session: the task, then tool rounds with large results."""
    messages: list[Any] = [{"role": "user", "content": "Fix the failing test."}]
    for i in range(rounds):
        blocks: list[Any] = []
        if thinking:
            blocks.append({"type": "thinking", "thinking": f"plan {i}", "signature": f"sig{i}"})
        name = names[i % len(names)]
        blocks.append(
            {
                "type": "tool_use",
                "id": f"toolu_{i}",
                "name": name,
                "input": {"command": f"cat f{i}"},
            }
        )
        messages += [
            {"role": "assistant", "content": blocks},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": f"{i} {BIG}"},
            ]},
        ]  # fmt: skip
    return messages


def body_with(messages: list[Any], *edits: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": "qwen3-coder",
        "max_tokens": 256,
        "messages": messages,
        "context_management": {"edits": list(edits)},
    }


def cleared(body: dict[str, Any]) -> list[str]:
    """The ids of the tool uses whose result is the placeholder."""
    return [
        b["tool_use_id"]
        for m in body["messages"]
        if isinstance(m["content"], list)
        for b in m["content"]
        if b.get("type") == "tool_result" and b["content"] == PLACEHOLDER
    ]


def thinking_left(body: dict[str, Any]) -> list[int]:
    return [
        k
        for k, m in enumerate(body["messages"])
        if isinstance(m["content"], list) and any(b["type"] == "thinking" for b in m["content"])
    ]


# -- clear_tool_uses_20250919 -------------------------------------------------------------


def test_the_default_trigger_is_100k_input_tokens() -> None:
    small = apply_edits(body_with(session(10), {"type": "clear_tool_uses_20250919"}))
    assert small is not None
    assert small.applied == ()
    assert cleared(small.body) == []
    assert "context_management" not in small.body
    big = apply_edits(body_with(session(160), {"type": "clear_tool_uses_20250919"}))
    assert big is not None
    assert cleared(big.body)
    # default keep: the 3 most recent tool uses
    assert not {"toolu_157", "toolu_158", "toolu_159"} & set(cleared(big.body))
    (report,) = big.applied
    assert report["type"] == "clear_tool_uses_20250919"
    assert report["cleared_tool_uses"] == len(cleared(big.body))
    assert report["cleared_input_tokens"] > 0
    BetaContextManagementResponse.model_validate(big.report())  # the SDK's shape


def test_keep_and_a_tool_uses_trigger_as_in_anthropics_example() -> None:
    # trigger after 5 tool uses, keep the 2 most recent (Anthropic's docs' style of example)
    edit = {
        "type": "clear_tool_uses_20250919",
        "trigger": {"type": "tool_uses", "value": 5},
        "keep": {"type": "tool_uses", "value": 2},
    }
    under = apply_edits(body_with(session(5), edit))
    assert under is not None
    assert under.applied == ()
    messages = session(6)
    over = apply_edits(body_with(messages, edit))
    assert over is not None
    assert cleared(over.body) == ["toolu_0", "toolu_1", "toolu_2", "toolu_3"]
    assert over.applied[0]["cleared_tool_uses"] == 4
    # untouched messages are the very objects the client sent
    assert over.body["messages"][0] is messages[0]
    assert over.body["messages"][-2] is messages[-2]


def test_clear_at_least_holds_a_clearing_back_until_it_is_worth_it() -> None:
    edit = {
        "type": "clear_tool_uses_20250919",
        "trigger": {"type": "input_tokens", "value": 2000},
        "keep": {"type": "tool_uses", "value": 1},
        "clear_at_least": {"type": "input_tokens", "value": 3000},
    }
    messages = session(6)
    first = next(
        k
        for k in range(1, 7)
        if cleared(apply_edits(body_with(session(k), edit)).body)  # type: ignore[union-attr]
    )
    without = {**edit}
    del without["clear_at_least"]
    eager = next(
        k
        for k in range(1, 7)
        if cleared(apply_edits(body_with(session(k), without)).body)  # type: ignore[union-attr]
    )
    assert eager < first  # the trigger alone fired earlier, clearing less
    edited = apply_edits(body_with(messages, edit))
    assert edited is not None
    assert edited.applied[0]["cleared_input_tokens"] >= 3000


def test_exclude_tools_are_never_cleared() -> None:
    edit = {
        "type": "clear_tool_uses_20250919",
        "trigger": {"type": "tool_uses", "value": 1},
        "keep": {"type": "tool_uses", "value": 1},
        "exclude_tools": ["memory"],
    }
    edited = apply_edits(body_with(session(8, names=("Bash", "memory")), edit))
    assert edited is not None
    ids = cleared(edited.body)
    assert ids
    assert all(int(i.split("_")[1]) % 2 == 0 for i in ids)


def test_clear_tool_inputs_clears_the_calls_inputs_too() -> None:
    edit = {
        "type": "clear_tool_uses_20250919",
        "trigger": {"type": "tool_uses", "value": 2},
        "keep": {"type": "tool_uses", "value": 1},
    }
    results_only = apply_edits(body_with(session(4), edit))
    assert results_only is not None
    uses = [b for m in results_only.body["messages"][1::2] for b in m["content"]]
    assert all(u["input"] == {"command": f"cat f{k}"} for k, u in enumerate(uses))
    both = apply_edits(body_with(session(4), {**edit, "clear_tool_inputs": True}))
    assert both is not None
    inputs = [b["input"] for m in both.body["messages"][1::2] for b in m["content"]]
    assert inputs == [
        {},
        {},
        {"command": "cat f2"},
        {"command": "cat f3"},
    ]  # cleared at the third use, then under
    saved = both.applied[0]["cleared_input_tokens"]
    assert saved > results_only.applied[0]["cleared_input_tokens"]


# -- clear_thinking_20251015 --------------------------------------------------------------


def test_thinking_keeps_the_last_turn_by_default_n_turns_or_all() -> None:
    messages = session(4, thinking=True)
    default = apply_edits(body_with(messages, {"type": "clear_thinking_20251015"}))
    assert default is not None
    assert thinking_left(default.body) == [7]
    assert default.applied == (
        {
            "type": "clear_thinking_20251015",
            "cleared_thinking_turns": 3,
            "cleared_input_tokens": default.applied[0]["cleared_input_tokens"],
        },
    )
    two = apply_edits(
        body_with(
            messages,
            {"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 2}},
        )
    )
    assert two is not None
    assert thinking_left(two.body) == [5, 7]
    for keep in ("all", {"type": "all"}):
        every = apply_edits(body_with(messages, {"type": "clear_thinking_20251015", "keep": keep}))
        assert every is not None
        assert every.applied == ()
        assert every.body["messages"] == messages


def test_both_edits_report_in_order_and_a_bad_edit_is_a_400_naming_it() -> None:
    edited = apply_edits(
        body_with(
            session(6, thinking=True),
            {"type": "clear_thinking_20251015"},
            {"type": "clear_tool_uses_20250919", "trigger": {"type": "tool_uses", "value": 3}},
        )
    )
    assert edited is not None
    assert [e["type"] for e in edited.applied] == [
        "clear_thinking_20251015",
        "clear_tool_uses_20250919",
    ]
    BetaContextManagementResponse.model_validate(edited.report())
    bad = body_with(session(1), {"type": "clear_tool_uses_20250919", "keep": {"value": "x"}})
    with pytest.raises(BadRequest) as caught:
        apply_edits(bad)
    assert caught.value.param == "context_management.edits.0.keep"


def test_only_the_context_management_flag_leaves_anthropic_beta() -> None:
    headers = [("anthropic-beta", f"a-1, {BETA},b-2"), ("x", BETA)]
    assert without_beta(headers, BETA) == [("anthropic-beta", "a-1,b-2"), ("x", BETA)]
    assert without_beta([("anthropic-beta", BETA)], BETA) == []


# -- cache stability ------------------------------------------------------------------------


@hypothesis_settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    sizes=st.lists(st.integers(10, 3000), min_size=2, max_size=24),
    trigger=st.integers(500, 8000),
    keep=st.integers(0, 4),
    least=st.integers(0, 4000),
    excluded=st.booleans(),
)
def test_decisions_grow_monotonically_and_requests_share_prefixes_between_events(
    sizes: list[int], trigger: int, keep: int, least: int, excluded: bool
) -> None:
    """Each request of a growing session clears a superset of what the previous one cleared,
    and its forwarded messages extend the previous request's unless the cleared set grew."""
    messages: list[Any] = [{"role": "user", "content": "go"}]
    for i, size in enumerate(sizes):
        messages += [
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": f"t{i}", "name": "memory" if i % 3 == 0 else "Bash",
                 "input": {"i": i}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": f"t{i}", "content": "word " * size},
            ]},
        ]  # fmt: skip
    edit = {
        "type": "clear_tool_uses_20250919",
        "trigger": {"type": "input_tokens", "value": trigger},
        "keep": {"type": "tool_uses", "value": keep},
        "clear_at_least": {"type": "input_tokens", "value": least},
        **({"exclude_tools": ["memory"]} if excluded else {}),
    }
    previous: tuple[set[str], list[Any]] | None = None
    for end in range(3, len(messages) + 1, 2):
        edited = apply_edits(body_with(messages[:end], edit))
        assert edited is not None
        now, out = set(cleared(edited.body)), edited.body["messages"]
        if previous is not None:
            before, sent = previous
            assert before <= now
            if before == now:
                assert out[: len(sent)] == sent
        previous = (now, out)
    parsed = ClearToolUses(("input_tokens", trigger), keep, least)
    assert cleared_uses(parsed, messages) == sorted(cleared_uses(parsed, messages))


# -- the route ------------------------------------------------------------------------------


@pytest.fixture
def fake() -> FakeUpstream:
    return FakeUpstream()


async def _app(tmp_path: Path, fake: FakeUpstream, url: str, **extra: Any) -> Any:
    settings = make_settings(tmp_path, anthropic_upstream_url=url, **extra)
    return create_app(settings, transport=httpx.ASGITransport(app=fake.app))


@pytest.fixture
async def local(tmp_path: Path, fake: FakeUpstream) -> AsyncIterator[httpx.AsyncClient]:
    app = await _app(tmp_path, fake, "http://llama.test/v1")
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as client:
            yield client


EDITS = (
    {"type": "clear_thinking_20251015", "keep": "all"},
    {"type": "clear_tool_uses_20250919", "trigger": {"type": "tool_uses", "value": 2}},
)
HEADERS = {"x-api-key": "k", "anthropic-version": "2023-06-01", "anthropic-beta": f"{BETA},x-1"}


@pytest.mark.anyio
async def test_a_local_upstream_gets_the_edits_applied_and_the_answer_reports_them(
    local: httpx.AsyncClient, fake: FakeUpstream
) -> None:
    body = body_with(session(4), *EDITS)
    response = await local.post("/v1/messages", content=orjson.dumps(body), headers=HEADERS)
    assert response.status_code == 200, response.text
    sent = fake.messages_requests[-1]
    forwarded = sent.json()
    assert "context_management" not in forwarded
    assert cleared(forwarded) == ["toolu_0"]  # keep 3 (the default) of 4
    assert sent.headers["anthropic-beta"] == "x-1"
    report = response.json()["context_management"]
    assert report == {
        "applied_edits": [
            {
                "type": "clear_tool_uses_20250919",
                "cleared_tool_uses": 1,
                "cleared_input_tokens": report["applied_edits"][0]["cleared_input_tokens"],
            }
        ]
    }
    BetaContextManagementResponse.model_validate(report)


@pytest.mark.anyio
async def test_a_stream_reports_the_edits_on_message_delta(
    local: httpx.AsyncClient, fake: FakeUpstream
) -> None:
    body = {**body_with(session(4), *EDITS), "stream": True}
    response = await local.post("/v1/messages", content=orjson.dumps(body), headers=HEADERS)
    assert response.status_code == 200
    events = [
        orjson.loads(line[5:]) for line in response.text.splitlines() if line.startswith("data:")
    ]
    deltas = [e for e in events if e["type"] == "message_delta"]
    assert len(deltas) == 1
    assert deltas[0]["context_management"]["applied_edits"][0]["cleared_tool_uses"] == 1
    assert all("context_management" not in e for e in events if e["type"] != "message_delta")
    assert "event: message_delta" in response.text
    assert "context_management" not in fake.messages_requests[-1].json()


@pytest.mark.anyio
async def test_anthropics_own_api_gets_the_field_and_the_flag_untouched(
    tmp_path: Path, fake: FakeUpstream
) -> None:
    app = await _app(tmp_path, fake, "https://api.anthropic.com/v1")
    body = body_with(session(4), *EDITS)
    raw = orjson.dumps(body)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as client:
            response = await client.post("/v1/messages", content=raw, headers=HEADERS)
    assert response.status_code == 200
    sent = fake.messages_requests[-1]
    assert sent.body == raw
    assert sent.headers["anthropic-beta"] == f"{BETA},x-1"
    assert "context_management" not in response.json()  # the fake is not Anthropic


@pytest.mark.anyio
async def test_the_setting_forces_either_side(tmp_path: Path, fake: FakeUpstream) -> None:
    for mode, url, applied in (
        ("proxy", "https://api.anthropic.com/v1", True),
        ("upstream", "http://llama.test/v1", False),
    ):
        (tmp_path / mode).mkdir()
        app = await _app(tmp_path / mode, fake, url, context_edits=mode)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://p") as client:
                body = body_with(session(4), *EDITS)
                await client.post("/v1/messages", content=orjson.dumps(body), headers=HEADERS)
        assert ("context_management" not in fake.messages_requests[-1].json()) is applied
