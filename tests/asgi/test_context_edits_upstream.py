"""Context editing the upstream applies itself (Anthropic's API, DESIGN.md §13): inflight
forwards `context_management` untouched and compacts only what is over budget once the edits
are done — counted with the same edit code (app/apis/anthropic/context_edits.py `upstream_sees`),
the body forwarded as the client sent it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inflight.apis.anthropic.context_edits import PLACEHOLDER, apply_edits, upstream_sees
from inflight.apis.anthropic.format import MessagesFormat
from inflight.factory import create_app
from tests.asgi.test_context_edits import BETA, body_with, cleared, session
from tests.conftest import make_settings
from tests.support.fakes import FakeUpstream
from tests.support.fakes.anthropic import rule_violations
from tests.unit.apis.anthropic.test_anthropic_format import PIPELINES, compacted

ANTHROPIC = "https://api.anthropic.com/v1"
CLEAR = {
    "type": "clear_tool_uses_20250919",
    "trigger": {"type": "input_tokens", "value": 3000},
    "keep": {"type": "tool_uses", "value": 1},
}
HEADERS = {
    "x-api-key": "k",
    "anthropic-version": "2023-06-01",
    "anthropic-beta": BETA,
    "x-compaction-context-limit": "8192",
}


async def _post(tmp_path: Path, fake: FakeUpstream, body: dict[str, Any]) -> httpx.Response:
    settings = make_settings(tmp_path, anthropic_upstream_url=ANTHROPIC, ledger="off")
    app = create_app(settings, transport=httpx.ASGITransport(app=fake.app))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as client:
            return await client.post("/v1/messages", content=orjson.dumps(body), headers=HEADERS)


def _budget() -> int:
    return 8192 - 256  # the window less the body's max_tokens


@pytest.mark.anyio
async def test_a_prompt_that_fits_after_anthropics_edits_is_forwarded_as_sent(
    tmp_path: Path,
) -> None:
    fake = FakeUpstream()
    body = body_with(session(10), CLEAR)
    full = MessagesFormat().conversation(
        {k: v for k, v in body.items() if k != "context_management"}
    )
    response = await _post(tmp_path, fake, body)
    assert response.status_code == 200, response.text
    sent = fake.messages_requests[-1]
    assert sent.body == orjson.dumps(body)  # byte for byte, `context_management` and all
    assert sent.headers["anthropic-beta"] == BETA
    assert response.headers["x-compaction-applied"] == "none"
    assert "x-compaction-id" not in response.headers
    # over the budget in full, inside it once the edit cleared the old results
    assert len(orjson.dumps(full.messages)) // 4 > _budget()
    assert int(response.headers["x-compaction-tokens-before"]) < 0.8 * _budget()
    assert "context_management" not in response.json()  # Anthropic reports its own


@pytest.mark.anyio
async def test_a_prompt_over_budget_even_after_the_edits_is_compacted_by_the_excess(
    tmp_path: Path,
) -> None:
    keep_more = {**CLEAR, "keep": {"type": "tool_uses", "value": 8}}
    body = body_with(session(16), keep_more)
    fake = FakeUpstream()
    (tmp_path / "a").mkdir()
    response = await _post(tmp_path / "a", fake, body)
    assert response.status_code == 200, response.text
    assert response.headers["x-compaction-applied"] != "none"
    forwarded = fake.messages_requests[-1].json()
    assert forwarded["context_management"] == body["context_management"]  # untouched
    assert fake.messages_requests[-1].headers["anthropic-beta"] == BETA
    assert rule_violations(forwarded) == []
    assert PLACEHOLDER not in orjson.dumps(forwarded).decode()  # Anthropic clears, not inflight
    kept = forwarded["messages"]
    calls = [m for m in kept if m["role"] == "assistant"]
    assert all(m in body["messages"] for m in calls)  # the simulation's `{}` inputs stay in it
    # the same history without the edit is cut deeper: only the excess after it goes
    plain = {k: v for k, v in body.items() if k != "context_management"}
    alone = FakeUpstream()
    (tmp_path / "b").mkdir()
    await _post(tmp_path / "b", alone, plain)
    assert len(orjson.dumps(kept)) > len(
        orjson.dumps(alone.messages_requests[-1].json()["messages"])
    )


def test_the_simulation_keeps_every_block_in_place_and_the_body_as_sent() -> None:
    messages = session(6, thinking=True)
    body = body_with(
        messages, {"type": "clear_thinking_20251015"}, {**CLEAR, "clear_tool_inputs": True}
    )
    before = orjson.dumps(body)
    seen = upstream_sees(body)
    assert seen is not None
    assert orjson.dumps(body) == before  # nothing changed in what is forwarded
    for original, edited in zip(messages, seen, strict=True):
        if isinstance(original["content"], list):
            assert len(edited["content"]) == len(original["content"])
            kinds = [b["type"] for b in edited["content"]]
            assert kinds == [b["type"] for b in original["content"]]
    # thinking of all but the last turn is gone (an empty block stands in its place)
    thoughts = [b for m in seen for b in m["content"] if isinstance(m["content"], list)]
    assert [b.get("thinking") for b in thoughts if b["type"] == "thinking"] == [
        *[None] * 5,
        "plan 5",
    ]
    # the results and inputs cleared are those the proxy clears when it applies the edits
    applied = apply_edits(body)
    assert applied is not None
    assert cleared(applied.body)
    assert cleared({"messages": seen}) == cleared(applied.body)

    def inputs(messages: list[Any]) -> list[Any]:
        return [b["input"] for m in messages[1:] for b in m["content"] if b["type"] == "tool_use"]

    assert inputs(seen) == inputs(applied.body["messages"])
    assert {} in inputs(seen)


def test_no_simulation_without_edits_that_clear_or_with_a_bad_field() -> None:
    messages = session(3)
    assert upstream_sees({"model": "m", "messages": messages}) is None
    assert upstream_sees(body_with(messages, {"type": "clear_thinking_20251015"})) is None
    assert upstream_sees(body_with(messages, {**CLEAR, "keep": "three"})) is None  # Anthropic 400s
    assert upstream_sees(body_with(messages, CLEAR)) is None  # under the trigger


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rounds=st.integers(1, 24), trigger=st.integers(500, 6000), keep=st.integers(0, 4))
def test_the_view_is_a_pure_function_of_the_history(rounds: int, trigger: int, keep: int) -> None:
    """Same history, same view (invariant 7 needs the decision to be one): and a request whose
    edits clear nothing is viewed exactly as one without them."""
    edit = {
        "type": "clear_tool_uses_20250919",
        "trigger": {"type": "input_tokens", "value": trigger},
        "keep": {"type": "tool_uses", "value": keep},
    }
    wire = MessagesFormat()
    body = body_with(session(rounds), edit)
    once, twice = wire.conversation(body), wire.conversation(orjson.loads(orjson.dumps(body)))
    assert once.messages == twice.messages
    if upstream_sees(body) is None:
        plain = {k: v for k, v in body.items() if k != "context_management"}
        assert wire.conversation(plain).messages == once.messages


@pytest.mark.parametrize("name", ["auto", "trim"])
def test_a_growing_session_is_compacted_the_same_way_for_the_same_history(name: str) -> None:
    """The decision is a pure function of the history (invariant 7 rests on it): a request
    parsed afresh is forwarded identically, `context_management` untouched, whether it is
    compacted or not."""
    pipeline = PIPELINES[name]
    messages = session(40)
    edit = {**CLEAR, "keep": {"type": "tool_uses", "value": 6}}
    changed = 0
    for k in range(3, len(messages) + 1, 4):
        body = body_with(messages[:k], edit)
        out, result, _ = compacted(body, pipeline, 8192)
        assert out["context_management"] == body["context_management"]
        again, _, _ = compacted(orjson.loads(orjson.dumps(body)), pipeline, 8192)
        assert again == out
        changed += result.plan.changed
    assert changed
