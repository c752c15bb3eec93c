"""The engine as a library (DESIGN.md §15): the public surface, counting and compaction on the
three wire formats with the invariants of DESIGN.md §4 (pairing, idempotence, role order, cache
stability on growing conversations), and `summarize` as the caller's own model call."""

from __future__ import annotations

import inspect
import json
from itertools import pairwise
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings

import inflight
from inflight.compaction.units import check_pair_safety
from inflight.library import Engine
from tests.support import load_traces, request_points
from tests.support.anthropic_conversations import anthropic_bodies
from tests.support.conversations import common_prefix, conversations, follows_strict_rule
from tests.support.responses_items import item_lists, pair_problems
from tests.support.responses_items import request_points as item_points

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ENGINE = Engine()
PROPERTY = hypothesis_settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def test_the_public_surface_is_what_the_docs_promise() -> None:
    """Fails when the public API changes by accident: names, and every signature."""
    assert sorted(inflight.__all__) == sorted(
        ["Compacted", "Engine", "__version__", "acompact", "compact", "count_tokens"]
    )
    for name in inflight.__all__:
        assert getattr(inflight, name) is not None
    assert str(inspect.signature(inflight.count_tokens)) == (
        "(conversation: 'Sequence[Any] | Mapping[str, Any]', *, model: 'str', "
        "api: 'Api' = 'chat') -> 'int'"
    )
    assert str(inspect.signature(Engine.compact)) == (
        "(self, conversation: 'Sequence[Any] | Mapping[str, Any]', *, model: 'str', "
        "context_limit: 'int', api: 'Api' = 'chat', strategy: 'str | Sequence[str]' = 'auto', "
        "threshold: 'float' = 0.8, target: 'float' = 0.6, protect_tools: 'Sequence[str]' = (), "
        "summarize: 'Summarize | None' = None) -> 'Compacted'"
    )
    fields = [f for f in inflight.Compacted.__dataclass_fields__]
    assert fields == [
        "body", "messages", "applied", "tokens_before", "tokens_after", "over_budget",
        "summary", "headers", "report",
    ]  # fmt: skip
    with pytest.raises(AttributeError):
        _ = inflight.not_a_name  # type: ignore[attr-defined]


def agent_session() -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = json.loads(
        (EXAMPLES / "agent-session.json").read_text("utf-8")
    )["messages"]
    return messages


def test_count_tokens_is_what_the_proxy_counts() -> None:
    messages = agent_session()
    counted = inflight.count_tokens(messages, model="gpt-4o")
    body = {"model": "gpt-4o", "messages": messages}
    assert inflight.count_tokens(body, model="gpt-4o") == counted
    report = ENGINE.compact(messages, model="gpt-4o", context_limit=10**6)
    assert report.tokens_before == counted
    assert report.applied == ()
    with_tools = {**body, "tools": [{"type": "function", "function": {"name": "bash"}}]}
    assert inflight.count_tokens(with_tools, model="gpt-4o") > counted


def test_compact_a_chat_history_keeps_pairs_and_reports_like_the_proxy() -> None:
    messages = agent_session()
    done = inflight.compact(messages, model="gpt-4o", context_limit=3000)
    assert done.changed
    assert done.tokens_after < done.tokens_before <= 10**6
    assert check_pair_safety(done.messages) == []
    assert done.messages[:2] == messages[:2]  # the pinned head
    assert done.messages[-1] == messages[-1]
    assert done.headers["X-Compaction-Applied"] == ",".join(done.applied)
    assert done.headers["X-Compaction-Context-Limit"] == "3000"
    assert done.report["tokens_after"] == done.tokens_after
    assert done.body["messages"] == done.messages
    again = inflight.compact(done.messages, model="gpt-4o", context_limit=3000)
    assert again.applied == ()  # idempotent
    assert again.body["messages"] is done.messages or again.messages == done.messages


def test_bad_arguments_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="api must be one of"):
        inflight.count_tokens([], model="m", api="gemini")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="context_limit"):
        inflight.compact([], model="m", context_limit=0)
    with pytest.raises(TypeError, match="request body"):
        inflight.compact("hello", model="m", context_limit=100)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="target"):
        inflight.compact([], model="m", context_limit=100, threshold=0.5, target=0.7)


def test_a_summarize_callable_stands_for_the_cut_sync_and_async() -> None:
    messages = agent_session()
    seen: list[int] = []

    def summarize(span: list[Any]) -> str:
        seen.append(len(span))
        return f"Summary of {len(span)} messages: slugify fixed in textkit/slug.py."

    done = inflight.compact(messages, model="gpt-4o", context_limit=3000, summarize=summarize)
    assert "summarize" in done.applied
    assert seen
    assert done.summary is not None
    assert done.summary in json.dumps(done.messages)
    assert done.headers["X-Compaction-Summary"] == "ready"
    assert check_pair_safety(done.messages) == []

    async def asummarize(span: list[Any]) -> str:
        return summarize(span)

    async def main() -> inflight.Compacted:
        with pytest.raises(RuntimeError, match="acompact"):
            inflight.compact(messages, model="gpt-4o", context_limit=3000, summarize=summarize)
        return await inflight.acompact(
            messages, model="gpt-4o", context_limit=3000, summarize=asummarize
        )

    assert anyio.run(main).messages == done.messages  # the same plan, the same summary
    # without a summariser (or with one that gives nothing) `auto` trims
    trimmed = inflight.compact(messages, model="gpt-4o", context_limit=3000)
    assert "trim" in trimmed.applied
    assert trimmed.summary is None
    failed = inflight.compact(messages, model="gpt-4o", context_limit=3000, summarize=lambda s: " ")
    assert failed.summary is None
    assert failed.headers["X-Compaction-Summary"] == "failed"
    assert failed.messages == trimmed.messages


@PROPERTY
@given(messages=conversations())
def test_chat_invariants_through_the_public_api(messages: list[dict[str, Any]]) -> None:
    done = ENGINE.compact(messages, model="gpt-4o", context_limit=1500, strategy="auto")
    out = done.messages
    assert check_pair_safety(out) == []
    assert done.tokens_after <= done.tokens_before
    if follows_strict_rule(messages):
        assert follows_strict_rule(out)
    again = ENGINE.compact(out, model="gpt-4o", context_limit=1500, strategy="auto")
    assert again.applied == ()
    assert again.messages == out


@PROPERTY
@given(body=item_lists())
def test_responses_invariants_through_the_public_api(body: dict[str, Any]) -> None:
    done = ENGINE.compact(body, model="gpt-4.1", context_limit=1500, api="responses")
    assert pair_problems(done.body["input"]) == []
    assert done.tokens_after <= done.tokens_before
    again = ENGINE.compact(done.body, model="gpt-4.1", context_limit=1500, api="responses")
    assert again.applied == ()


@PROPERTY
@given(body=anthropic_bodies())
def test_anthropic_invariants_through_the_public_api(body: dict[str, Any]) -> None:
    done = ENGINE.compact(body, model="claude-sonnet-4-5", context_limit=2500, api="anthropic")
    assert done.tokens_after <= done.tokens_before
    if done.applied:  # a user turn first, turns alternating (system messages take none)
        roles = [m["role"] for m in done.body["messages"] if m["role"] != "system"]
        assert roles[0] == "user"
        assert all(a != b for a, b in pairwise(roles))
    again = ENGINE.compact(
        done.body, model="claude-sonnet-4-5", context_limit=2500, api="anthropic"
    )
    assert again.applied == ()


@pytest.mark.parametrize(("name", "messages"), load_traces()[:3])
def test_a_growing_conversation_is_cache_stable_across_calls(
    name: str, messages: list[dict[str, Any]]
) -> None:
    """Invariant 7 through the library: each call's output extends the previous one's except
    at compaction events, and the events are few (each needs (threshold − target) × budget of
    growth)."""
    previous: list[Any] | None = None
    events = 0
    requests = request_points(messages)
    for k in requests:
        out = ENGINE.compact(messages[:k], model="gpt-4o", context_limit=8192).messages
        if previous is not None and common_prefix(previous, out) < len(previous):
            events += 1
        previous = out
    assert events < max(2, len(requests) // 3), (name, events, len(requests))


def test_responses_request_points_compact_as_bodies() -> None:
    """A Responses history given as a list is the request's `input`."""
    items = [{"role": "user", "content": "hi " * 50}] + [
        item
        for i in range(30)
        for item in (
            {"type": "function_call", "call_id": f"c{i}", "name": "sh", "arguments": "{}"},
            {"type": "function_call_output", "call_id": f"c{i}", "output": "x " * 300},
        )
    ]
    assert item_points(items)
    done = inflight.compact(items, model="gpt-4.1", context_limit=3000, api="responses")
    assert done.changed
    assert done.body["input"] == done.messages
    assert pair_problems(done.messages) == []
