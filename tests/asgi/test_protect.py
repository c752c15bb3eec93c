"""Protected tools (DESIGN.md §11): their outputs are never pruned or truncated before the last
unit; their units may still be trimmed whole; the last unit follows §3."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inflight.compaction.engine import compact
from inflight.compaction.policy import Budget
from inflight.compaction.prune import tool_names
from inflight.compaction.units import check_pair_safety, group_units
from inflight.factory import create_app
from inflight.strategies import StrategyName
from tests.conftest import make_settings
from tests.support.conversations import conversations, simple_count
from tests.support.fakes import FakeUpstream

BUDGET = Budget(window=8192, reserve=1024, threshold=0.8, target=0.5)
SHRINK: tuple[StrategyName, ...] = ("truncate", "prune")
AUTO: tuple[StrategyName, ...] = ("truncate", "prune", "trim")


def tool_round(k: int, name: str, size: int) -> list[dict[str, Any]]:
    call = {"id": f"c{k}", "type": "function", "function": {"name": name, "arguments": "{}"}}
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": f"c{k}", "content": f"{name} {k} " + "m" * size},
    ]


def agent(rounds: int, size: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    for k in range(rounds):
        out += tool_round(k, "memory" if k % 3 == 0 else "read", size)
    return out


def protected_outputs(
    messages: list[dict[str, Any]], protect: frozenset[str]
) -> list[tuple[int, int]]:
    """(message index, unit index) of the protected tools' outputs before the last unit."""
    units = group_units(messages)
    found = []
    for i, unit in enumerate(units[:-1]):
        chunk = messages[unit.start : unit.end]
        if unit.kind != "tool_round":
            continue
        for offset, name in enumerate(tool_names(chunk), 1):
            if name in protect:
                found.append((unit.start + offset, i))
    return found


def test_protected_outputs_are_never_pruned_or_truncated() -> None:
    messages = [*agent(30, 12_000), {"role": "user", "content": "next"}]
    plain = compact(messages, SHRINK, BUDGET, simple_count, 0)
    kept = compact(messages, SHRINK, BUDGET, simple_count, 0, protect=frozenset({"memory"}))
    shown = dict(zip(kept.sources, kept.messages, strict=True))
    memory = protected_outputs(messages, frozenset({"memory"}))
    assert all(dict(zip(plain.sources, plain.messages, strict=True))[p] is not messages[p]
               for p, _ in memory)  # fmt: skip  # unprotected, they would be cut
    assert all(shown[p] is messages[p] for p, _ in memory)
    reads = protected_outputs(messages, frozenset({"read"}))
    assert all(shown[p] is not messages[p] for p, _ in reads)  # the others are still cut


def test_protected_units_are_still_trimmed_whole() -> None:
    messages = [*agent(60, 3_000), {"role": "user", "content": "next"}]
    result = compact(messages, AUTO, BUDGET, simple_count, 0, protect=frozenset({"memory"}))
    assert result.plan.cut > result.plan.head
    assert check_pair_safety(result.messages) == []
    shown = dict(zip(result.sources, result.messages, strict=True))
    for position, _ in protected_outputs(messages, frozenset({"memory"})):
        assert position not in shown or shown[position] is messages[position]
    assert not result.over_budget


def test_the_last_unit_is_truncated_even_when_protected() -> None:
    messages = [{"role": "user", "content": "go"}, *tool_round(0, "memory", 200_000)]
    result = compact(messages, AUTO, BUDGET, simple_count, 0, protect=frozenset({"memory"}))
    assert "inflight truncated" in result.messages[-1]["content"]
    assert not result.over_budget


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    messages=conversations(),
    protect=st.sampled_from([frozenset({"bash"}), frozenset({"read", "grep"})]),
    pipeline=st.sampled_from([SHRINK, AUTO, ("truncate", "prune", "summarize")]),
    window=st.sampled_from([2048, 8192, 16384]),
)
def test_protection_holds_on_generated_conversations(
    messages: list[dict[str, Any]],
    protect: frozenset[str],
    pipeline: tuple[StrategyName, ...],
    window: int,
) -> None:
    budget = Budget(window=window, reserve=window // 8, threshold=0.8, target=0.5)
    result = compact(messages, pipeline, budget, simple_count, 0, protect=protect)
    assert check_pair_safety(result.messages) == []
    shown = dict(zip(result.sources, result.messages, strict=True))
    for position, _ in protected_outputs(messages, protect):
        if position in shown:
            assert shown[position] is messages[position]
    again = compact(result.messages, pipeline, budget, simple_count, 0, protect=protect)
    assert again.applied == ()  # idempotent with protection too


@pytest.mark.anyio
@pytest.mark.parametrize("by", ["header", "setting"])
async def test_the_header_and_the_setting_protect_a_tool(tmp_path: Path, by: str) -> None:
    fake = FakeUpstream()
    overrides: dict[str, Any] = {"context_limit": 8192}
    headers = {"x-compaction-strategy": "truncate,prune"}
    if by == "setting":
        overrides["protect_tools"] = "memory,plan"
    else:
        headers["x-compaction-protect-tools"] = "memory, plan"
    messages = [*agent(12, 2_500), {"role": "user", "content": "next"}]
    app = create_app(make_settings(tmp_path, **overrides), transport=httpx.ASGITransport(fake.app))
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://p") as client,
    ):
        response = await client.post(
            "/v1/chat/completions",
            json={"model": "gpt-4o-mini", "messages": messages},
            headers=headers,
        )
    assert response.status_code == 200
    sent = fake.chat_requests[0].json()["messages"]
    assert len(sent) == len(messages)
    for before, after in zip(messages, sent, strict=True):
        if str(before.get("content")).startswith("memory"):
            assert after == before
    assert [m for m in sent if "inflight pruned an old output of read" in str(m["content"])]
