"""Refs in markers (DESIGN.md §11): their format, stability and idempotence; what each ref
resolves to; restore's span marker; and the tool's answers (known, unknown, cut to fit)."""

from __future__ import annotations

from typing import Any

import orjson

from inflight.apis.chat.restore import ChatDialect
from inflight.compaction.cuts import cuts_of
from inflight.compaction.engine import compact, marker_tokens
from inflight.compaction.inserted import SPAN_MARKER, SUMMARY_PREFIX
from inflight.compaction.policy import Budget
from inflight.compaction.prune import PLACEHOLDER
from inflight.compaction.refs import REF_SUFFIX_RE, ref_for, ref_suffix
from inflight.compaction.restorable import removed_positions, restorable, span_ref
from inflight.compaction.truncate import MARKER, kept_length, truncate_unit
from inflight.compaction.wire import Conversation
from inflight.proxy.restore import TOOL_NAME, RestoreLoop
from inflight.strategies import StrategyName
from tests.support.conversations import simple_count

AUTO: tuple[StrategyName, ...] = ("truncate", "prune", "trim")
BUDGET = Budget(window=8192, reserve=1024, threshold=0.8, target=0.5)


def call(call_id: str, name: str = "read") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": "{}"}}


def tool_round(k: int, output: str, name: str = "read") -> list[dict[str, Any]]:
    return [
        {"role": "assistant", "content": None, "tool_calls": [call(f"c{k}", name)]},
        {"role": "tool", "tool_call_id": f"c{k}", "content": output},
    ]


def conversation(rounds: int, size: int = 3_000, name: str = "read") -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "go"},
    ]
    for k in range(rounds):
        out += tool_round(k, f"output {k} " + "z" * size, name)
    return out


def strict_chat() -> list[dict[str, Any]]:
    chat: list[dict[str, Any]] = [{"role": "user", "content": "start"}]
    for k in range(40):
        chat += [{"role": "assistant", "content": f"a{k} " * 400}, {"role": "user", "content": "u"}]
    return chat


def refs_in(messages: Any) -> list[str]:
    return REF_SUFFIX_RE.findall(orjson.dumps(messages).decode())


def test_a_truncation_marker_ends_with_the_ref_of_the_text_it_cut() -> None:
    original = "head " + "x" * 30_000 + " tail"
    unit = tool_round(0, original)
    out = truncate_unit(unit, 2_000, start=7)
    text = out[1]["content"]
    ref = ref_for(8, original)  # the tool message's position: the unit's start + 1
    cut = len(original) - kept_length(text)  # type: ignore[operator]
    assert MARKER.format(cut=cut, ref=ref_suffix(ref)) in text
    assert text.startswith("head ")
    assert text.endswith(" tail")
    assert truncate_unit(out, 2_000, start=7) == out  # idempotent: a cut text is never re-cut
    assert truncate_unit(unit, 2_000, start=7) == out  # byte-stable: the same every request
    assert refs_in(truncate_unit(unit, 2_000, start=9)) != [ref]  # the position is in the ref


def test_several_texts_of_one_message_have_distinct_refs() -> None:
    parts = [{"type": "text", "text": f"part {k} " + "y" * 20_000} for k in range(3)]
    unit = [
        {"role": "assistant", "content": None, "tool_calls": [call("c0")]},
        {"role": "tool", "tool_call_id": "c0", "content": parts},
    ]
    found = refs_in(truncate_unit(unit, 3_000, start=2))
    assert found == [ref_for(3, p["text"], f"text{k}") for k, p in enumerate(parts)]


def test_a_placeholder_ends_with_the_ref_of_the_output_it_replaced() -> None:
    messages = conversation(40)
    result = compact(messages, ("prune",), BUDGET, simple_count, 0)
    pruned = [
        (k, m) for k, m in enumerate(result.messages) if "inflight pruned" in str(m["content"])
    ]
    assert pruned
    for k, message in pruned:
        source = result.sources[k]
        assert source is not None
        original = messages[source]["content"]
        ref = ref_suffix(ref_for(source, original))
        assert message["content"] == PLACEHOLDER.format(name="read", size=len(original), ref=ref)


def test_markers_are_byte_identical_as_the_conversation_grows() -> None:
    """Between compaction events each request's output extends the previous one, markers and
    their refs included (a ref is a pure function of position and content, invariant 7)."""
    messages = conversation(60)
    compared = 0
    for k in range(40, len(messages), 2):
        earlier = compact(messages[:k], AUTO, BUDGET, simple_count, 0)
        later = compact(messages[: k + 2], AUTO, BUDGET, simple_count, 0)
        if (earlier.plan.cut, earlier.plan.pruned_before) == (
            later.plan.cut,
            later.plan.pruned_before,
        ):
            assert refs_in(earlier.messages)
            assert later.messages[: len(earlier.messages)] == earlier.messages
            compared += 1
    assert compared > 10


def test_every_ref_resolves_to_the_original_it_stands_for() -> None:
    giant = "start " + "g" * 80_000 + " end"
    messages = [*conversation(40), *tool_round(99, giant), {"role": "user", "content": "and?"}]
    result = compact(messages, AUTO, BUDGET, simple_count, 0, restore=True)
    originals = restorable(messages, result.plan)
    found = refs_in(result.messages)
    assert len(found) >= 3  # truncated, pruned, and the span marker
    assert set(found) <= set(originals)
    assert giant in originals.values()  # a truncated text: the whole original
    pruned = {m["content"] for m in messages if m.get("role") == "tool"}
    assert pruned & set(originals.values())  # a pruned output: its original content
    span = span_ref(result.plan, messages)
    assert span in found
    assert "#2 assistant" in originals[span]  # the span: the removed messages, by position


def test_a_pruned_output_that_was_truncated_restores_the_original() -> None:
    giant = "q" * 90_000
    messages = [*conversation(1), *tool_round(5, giant), *conversation(45)[2:]]
    messages.append({"role": "user", "content": "next"})
    result = compact(messages, ("truncate", "prune"), BUDGET, simple_count, 0, restore=True)
    shown = result.messages[result.sources.index(5)]["content"]
    assert shown.startswith("[inflight pruned")
    (ref,) = refs_in(shown)
    assert restorable(messages, result.plan)[ref] == giant


def test_restore_puts_one_marker_where_trim_left_nothing() -> None:
    """Placed like a summary (§4.6): folded into the head's user message before an assistant
    turn, an assistant message of its own before a user turn."""
    agent = [*conversation(60), {"role": "user", "content": "next"}]
    chat = strict_chat()
    for messages in (agent, chat):
        plain = compact(messages, ("trim",), BUDGET, simple_count, 0)
        marked = compact(messages, ("trim",), BUDGET, simple_count, 0, restore=True)
        assert not refs_in(plain.messages)
        ref = ref_suffix(span_ref(marked.plan, messages) or "")
        inserted = 0 if marked.plan.summary_role == "fold" else 1
        removed = len(messages) - len(marked.messages) + inserted
        assert removed == len(removed_positions(marked.plan)) > 0
        text = SPAN_MARKER.format(count=removed, ref=ref)
        head = marked.plan.units[marked.plan.head - 1].end
        if marked.plan.summary_role == "fold":
            assert messages is agent
            assert marked.messages[head - 1]["content"][-1] == {"type": "text", "text": text}
        else:
            assert messages is chat
            assert marked.sources[head] is None
            assert marked.messages[head] == {"role": "assistant", "content": text}
        assert marked.tokens_after <= BUDGET.budget
        again = compact(marked.messages, ("trim",), BUDGET, simple_count, 0, restore=True)
        assert again.applied == ()


def test_a_summary_ends_with_the_span_marker_when_restoring() -> None:
    messages = strict_chat()
    reserve = 500 + marker_tokens(simple_count)
    result = compact(
        messages, ("summarize",), BUDGET, simple_count, 0,
        summary="the facts", summary_tokens=reserve, restore=True,
    )  # fmt: skip
    summary = result.messages[1]["content"]
    assert summary.startswith(SUMMARY_PREFIX + "the facts\n\n[inflight removed ")
    assert refs_in(summary) == [span_ref(result.plan, messages)]


def loop(refs: dict[str, str], room_tokens: int = 10_000) -> RestoreLoop:
    body = {"model": "m", "messages": [{"role": "user", "content": "x (ref: abcdef123456)"}]}
    found = RestoreLoop.start(ChatDialect(), body, refs, room_tokens)
    assert found is not None
    return found


def test_the_tool_answers_a_known_ref_with_the_original() -> None:
    restore = loop({"abcdef123456": "the original text"})
    assert restore.resolve('{"ref": "abcdef123456"}') == "the original text"
    assert restore.resolve('{"ref": "(ref: abcdef123456)"}') == "the original text"


def test_the_tool_answers_an_unknown_ref_or_bad_arguments_with_a_clear_text() -> None:
    restore = loop({"abcdef123456": "the original text"})
    assert "no cut text has the ref 'zzzzzz'" in restore.resolve('{"ref": "zzzzzz"}')
    assert 'must be {"ref": "ID"}' in restore.resolve("not json")
    assert 'must be {"ref": "ID"}' in restore.resolve('{"id": 3}')


def test_the_tool_cuts_an_answer_to_the_room_left_and_says_so() -> None:
    original = "A" * 5_000 + "B" * 50_000 + "C" * 5_000
    restore = loop({"abcdef123456": original}, room_tokens=2_120)  # 2,000 tokens of room
    answer = restore.resolve('{"ref": "abcdef123456"}')
    assert answer.startswith("A")
    assert answer.endswith("C")
    assert f"[{TOOL_NAME}: {len(original) - 6_000} of {len(original)} chars not shown]" in answer
    assert "no room is left" in restore.resolve('{"ref": "abcdef123456"}')  # all of it used


def test_no_loop_without_a_resolvable_marker() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "x (ref: abcdef123456)"}]}
    assert RestoreLoop.start(ChatDialect(), body, {"other0000000": "t"}, 1_000) is None
    assert RestoreLoop.start(ChatDialect(), body, {}, 1_000) is None
    assert (
        RestoreLoop.start(ChatDialect(), {**body, "tool_choice": "none"}, {"abcdef123456": "t"}, 1)
        is None
    )


def test_every_ref_the_ledger_records_resolves_too() -> None:
    """The ledger names each cut message by the ref of its whole content (app/compaction/
    cuts.py): restore resolves those as well, truncated, pruned or trimmed."""
    giant = "start " + "g" * 80_000 + " end"
    parts = [{"type": "text", "text": "p" * 30_000}, {"type": "text", "text": "q" * 30_000}]
    messages = [
        *conversation(40),
        *tool_round(98, giant),
        {"role": "assistant", "content": None, "tool_calls": [call("c99")]},
        {"role": "tool", "tool_call_id": "c99", "content": parts},
        {"role": "user", "content": "and?"},
    ]
    result = compact(messages, AUTO, BUDGET, simple_count, 0, restore=True)
    cuts = cuts_of(Conversation(messages=messages, fixed={}), result, [1] * len(messages), False)
    kinds = {cut.kind for cut in cuts}
    assert {"truncated", "pruned", "trimmed"} <= kinds
    originals = restorable(messages, result.plan)
    for cut in cuts:
        assert cut.ref in originals
    assert giant in originals.values()
