"""The ledger's entries (`app/compaction/cuts.py`): what a compaction cut, message by message, as
a pure function of the request (DESIGN.md §11)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inflight.apis.anthropic.format import MessagesFormat
from inflight.apis.responses.format import ResponsesFormat
from inflight.compaction.cuts import Cut, cuts_of
from inflight.compaction.engine import CompactionResult, compact
from inflight.compaction.policy import Budget
from inflight.compaction.refs import ref_for
from inflight.compaction.wire import Conversation
from inflight.strategies import StrategyName
from tests.support.conversations import conversations, simple_count
from tests.support.responses_items import item_lists

BUDGET = Budget(window=2048, reserve=256, threshold=0.8, target=0.5)


def chat(messages: list[dict[str, Any]]) -> Conversation:
    return Conversation(messages=messages, fixed={})


def run(
    conversation: Conversation,
    pipeline: tuple[StrategyName, ...],
    budget: Budget = BUDGET,
    summary: str | None = None,
    keep: bool = True,
) -> tuple[CompactionResult, tuple[Cut, ...]]:
    messages = conversation.messages
    result = compact(
        messages, pipeline, budget, simple_count, 0, summary=summary, summary_tokens=100
    )
    return result, cuts_of(conversation, result, [simple_count(m) for m in messages], keep)


def agent(rounds: int, size: int, text: str = "file") -> list[dict[str, Any]]:
    """An agent session: the task, then rounds of a call, its output (`text` and its number,
    repeated `size` times) and a short answer."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the failing test."},
    ]
    for i in range(rounds):
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"c{i}",
                        "type": "function",
                        "function": {"name": "read_file", "arguments": f'{{"path": "f{i}.py"}}'},
                    }
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": f"{text} {i} " * size})
        messages.append({"role": "assistant", "content": f"Read f{i}.py, looks fine."})
    return messages


def test_trimmed_messages_are_listed_with_position_role_tool_tokens_hash_and_ref() -> None:
    messages = agent(rounds=12, size=60)
    result, cuts = run(chat(messages), ("trim",))
    assert result.applied == ("trim",)
    assert cuts, "a trim cuts whole units"
    assert {c.kind for c in cuts} == {"trimmed"}
    kept = {id(m) for m in result.messages}
    # exactly the messages that are not forwarded, in order
    assert [c.position for c in cuts] == [i for i, m in enumerate(messages) if id(m) not in kept]
    for cut in cuts:
        original = messages[cut.position]
        assert cut.items == (cut.position,)
        assert cut.role == original["role"]
        assert cut.tokens == simple_count(original)
        doc = cut.document(full=False)
        content = original["content"]
        if isinstance(content, str):
            assert doc["sha256"] == hashlib.sha256(content.encode()).hexdigest()
        assert doc["ref"] == ref_for(cut.position, content)
        assert "content" not in doc
        if original["role"] == "tool":
            assert cut.tool == "read_file"
        elif original.get("tool_calls"):
            assert cut.tool == "read_file"
            assert doc["calls"] == [
                {
                    "name": "read_file",
                    "sha256": hashlib.sha256(
                        original["tool_calls"][0]["function"]["arguments"].encode()
                    ).hexdigest(),
                }
            ]
        else:
            assert cut.tool is None


def test_full_documents_keep_the_original_content_and_arguments() -> None:
    messages = agent(rounds=12, size=60)
    _, cuts = run(chat(messages), ("trim",))
    for cut in cuts:
        doc = cut.document(full=True)
        assert doc["content"] == messages[cut.position]["content"]
        for call, original in zip(
            doc.get("calls", []), messages[cut.position].get("tool_calls") or [], strict=True
        ):
            assert call["arguments"] == original["function"]["arguments"]


def test_without_full_nothing_of_the_content_is_held() -> None:
    messages = agent(rounds=12, size=60)
    _, kept = run(chat(messages), ("trim",))
    _, meta = run(chat(messages), ("trim",), keep=False)
    assert [c.document(full=False) for c in meta] == [c.document(full=False) for c in kept]
    for cut in meta:
        assert cut.content is None
        assert cut.size == 0
        assert all(call.arguments is None for call in cut.calls)
    assert all(c.size > 0 for c in kept)


def test_pruned_and_truncated_outputs_are_kinds_of_their_own() -> None:
    messages = agent(rounds=10, size=30)[:-1]  # ends with the last round's output
    messages[-1]["content"] = "giant log line\n" * 3000  # truncated, too recent to prune
    result, cuts = run(chat(messages), ("truncate", "prune"))
    assert set(result.applied) == {"truncate", "prune"}
    kinds = {c.position: c.kind for c in cuts}
    assert kinds[len(messages) - 1] == "truncated"
    pruned = [p for p, k in kinds.items() if k == "pruned"]
    assert pruned
    assert all(messages[p]["role"] == "tool" for p in pruned)
    shown = dict(zip(result.sources, result.messages, strict=True))
    for cut in cuts:
        assert shown[cut.position] is not messages[cut.position]  # changed, so listed
        assert cut.tool == "read_file"
    unchanged = [p for p, m in shown.items() if p is not None and m is messages[p]]
    assert not set(unchanged) & set(kinds), "an unchanged message is never a cut"


def test_summarized_and_dropped() -> None:
    messages = agent(rounds=12, size=60)
    result, cuts = run(chat(messages), ("summarize",), summary="what happened")
    assert result.applied == ("summarize",)
    assert cuts
    assert {c.kind for c in cuts} == {"summarized"}
    result, cuts = run(chat(messages), ("middle-out",))
    assert result.applied == ("middle-out",)
    assert cuts
    assert {c.kind for c in cuts} == {"dropped"}


def test_the_pinned_head_is_never_a_cut_even_with_a_summary_folded_into_it() -> None:
    # An agent session whose only user message is the task: the summary is folded into it.
    messages = agent(rounds=12, size=60)
    result, cuts = run(chat(messages), ("summarize",), summary="what happened")
    assert result.plan.summary_role == "fold"
    assert result.messages[1] is not messages[1]  # the head's user message got the summary
    assert all(c.position > 1 for c in cuts)


def test_nothing_cut_nothing_listed() -> None:
    messages = agent(rounds=2, size=10)
    result, cuts = run(chat(messages), ("truncate", "prune", "trim"))
    assert result.applied == ()
    assert cuts == ()


def test_responses_items_name_the_input_items_of_each_cut() -> None:
    items: list[dict[str, Any]] = [{"role": "user", "content": "Fix the failing test."}]
    for i in range(12):
        items += [
            {"type": "reasoning", "id": f"rs_{i}", "summary": [{"type": "summary_text", "text": "hm"}]},
            {"type": "function_call", "call_id": f"c{i}", "name": "read_file", "arguments": "{}"},
            {"type": "function_call_output", "call_id": f"c{i}", "output": f"file {i} " * 60},
        ]  # fmt: skip
    conversation = ResponsesFormat().conversation({"model": "m", "input": items})
    _, cuts = run(conversation, ("trim",))
    assert cuts
    for cut in cuts:
        members = [items[k] for k in cut.items]
        if cut.role == "tool":
            assert [m["type"] for m in members] == ["function_call_output"]
            assert cut.content == members[0]["output"]
            assert cut.tool == "read_file"
        else:  # the call, with the reasoning item that preceded it
            assert [m["type"] for m in members] == ["reasoning", "function_call"]


def test_messages_items_name_the_anthropic_messages_of_each_cut() -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix the failing test."}]
    for i in range(12):
        messages += [
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": f"t{i}", "name": "Bash", "input": {"c": i}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": f"t{i}", "content": f"out {i} " * 60},
            ]},
        ]  # fmt: skip
    conversation = MessagesFormat().conversation({"model": "m", "messages": messages})
    _, cuts = run(conversation, ("trim",))
    assert cuts
    for cut in cuts:
        (index,) = cut.items
        assert messages[index]["role"] == ("user" if cut.role == "tool" else "assistant")
        if cut.role == "tool":
            assert cut.content == messages[index]["content"][0]["content"]
            assert cut.tool == "Bash"


def _signature(cuts: Sequence[Cut]) -> list[Mapping[str, Any]]:
    return [c.document(full=True) for c in cuts]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    conversations(),
    st.sampled_from(
        [("truncate", "prune", "trim"), ("middle-out",), ("summarize",), ("prune", "trim")]
    ),
)
def test_every_message_is_forwarded_as_received_or_listed_once(
    messages: list[dict[str, Any]], pipeline: tuple[StrategyName, ...]
) -> None:
    """The ledger is complete and exact: a message not forwarded as it was received is listed
    once, one that was is not; and the entries (refs included) are a pure function of the
    request — a copy of it gives the same ledger."""
    summary = "s" if "summarize" in pipeline else None
    result, cuts = run(chat(messages), pipeline, summary=summary)
    forwarded = {
        source
        for source, message in zip(result.sources, result.messages, strict=True)
        if source is not None and message is messages[source]
    }
    listed = [c.position for c in cuts]
    assert len(listed) == len(set(listed))
    head_end = result.plan.units[result.plan.head - 1].end if result.plan.head else 0
    expected = [i for i in range(head_end, len(messages)) if i not in forwarded]
    assert listed == expected
    copy = [dict(m) for m in messages]
    assert _signature(run(chat(copy), pipeline, summary=summary)[1]) == _signature(cuts)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(item_lists(), st.sampled_from([("truncate", "prune", "trim"), ("middle-out",)]))
def test_responses_items_are_exactly_the_items_not_forwarded_as_received(
    body: dict[str, Any], pipeline: tuple[StrategyName, ...]
) -> None:
    """`items` maps each cut back to the request's own `input`: the items of a removed view
    message are all gone from what is forwarded, a shrunk one's are rewritten, and every item
    that is not forwarded as received belongs to a cut."""
    wire = ResponsesFormat()
    conversation = wire.conversation(body)
    if conversation.skip is not None:
        return
    result, cuts = run(conversation, pipeline)
    forwarded = wire.render(body, conversation, result.messages, result.sources)["input"]
    kept = {id(item) for item in forwarded}
    items = body["input"]
    covered: set[int] = set()
    for cut in cuts:
        covered.update(cut.items)
        if cut.kind in ("truncated", "pruned"):  # (a reasoning item before a call stays)
            assert any(id(items[k]) not in kept for k in cut.items)
        else:
            assert all(id(items[k]) not in kept for k in cut.items)
    assert {k for k, item in enumerate(items) if id(item) not in kept} <= covered
