"""`compact`: plan, render, and report — the synchronous entry point of the pure core."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from inflight.compaction.inserted import OMITTED_NOTE, SPAN_MARKER, SUMMARY_PREFIX
from inflight.compaction.pins import Pin, pin_tokens, pinned_text
from inflight.compaction.planner import plan
from inflight.compaction.policy import Budget
from inflight.compaction.refs import REF_LENGTH, ref_suffix
from inflight.compaction.rendering import Plan, kept_sources, render
from inflight.compaction.replays import Replays
from inflight.compaction.restorable import removed_positions, restorable, span_ref
from inflight.compaction.unit_costs import MessageCounter
from inflight.strategies import StrategyName

MARKER_SLACK = 8  # tokens over the marker's own count: folding it into the head may cost more


@dataclass(frozen=True, slots=True)
class CompactionResult:
    """The compacted messages and what it took (for headers, usage and the preview)."""

    messages: Sequence[Mapping[str, Any]]  # a plan that changes nothing: the input itself
    applied: tuple[StrategyName, ...]
    tokens_before: int
    tokens_after: int
    messages_before: int
    messages_after: int
    over_budget: bool
    plan: Plan
    # per output message, the index of the input message it came from (the same object when
    # untouched, else a transformed copy); None for a summary inserted as a message of its own
    sources: Sequence[int | None]
    # restoring: every ref the markers carry -> the original text (app/compaction/restorable.py)
    refs: Mapping[str, str] = field(default_factory=dict)


def _parts(content: Any) -> list[Any]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return list(content) if isinstance(content, list) else []


def span_marker(plan: Plan, messages: Sequence[Mapping[str, Any]]) -> str | None:
    """The marker that stands for what the plan cut or dropped (restore on)."""
    ref = span_ref(plan, messages)
    if ref is None:
        return None
    return SPAN_MARKER.format(count=len(removed_positions(plan)), ref=ref_suffix(ref))


def marker_tokens(count: MessageCounter) -> int:
    """The tokens to reserve for a span marker (the longest one, with slack for a fold)."""
    longest = SPAN_MARKER.format(count=10**9, ref=ref_suffix("0" * REF_LENGTH))
    return count({"role": "assistant", "content": longest}) + MARKER_SLACK


def summary_message(
    plan: Plan, messages: Sequence[Mapping[str, Any]], text: str, prefix: str = SUMMARY_PREFIX
) -> dict[str, Any]:
    """The message that carries the summary, placed as the plan says (DESIGN.md §4.6): a new
    message of the plan's summary role, to stand right after the head; or, folded, the head's
    user message with the summary as an extra text part after its own, unchanged content."""
    content = prefix + text
    if plan.summary_role != "fold":
        return {"role": plan.summary_role, "content": content}
    host = messages[plan.units[plan.head - 1].end - 1]
    return {**host, "content": [*_parts(host.get("content")), {"type": "text", "text": content}]}


def with_summary(
    out: list[Mapping[str, Any]],
    plan: Plan,
    messages: Sequence[Mapping[str, Any]],
    text: str,
    count: MessageCounter,
    sources: list[int | None] | None = None,
    prefix: str = SUMMARY_PREFIX,
) -> int:
    """Put the summary in `out` (rendered from `plan`, with its `sources` kept in step);
    returns the tokens it adds."""
    head_end = plan.units[plan.head - 1].end if plan.head else 0
    message = summary_message(plan, messages, text, prefix)
    if plan.summary_role == "fold":
        host = out[head_end - 1]
        out[head_end - 1] = message
        return count(message) - count(host)
    out.insert(head_end, message)
    if sources is not None:
        sources.insert(head_end, None)
    return count(message)


def _applied(plan: Plan, pipeline: tuple[StrategyName, ...]) -> tuple[StrategyName, ...]:
    did: dict[StrategyName, bool] = {
        "truncate": bool(plan.truncated),
        "prune": plan.pruned_before > plan.head,
        "trim": plan.cut > plan.head and not plan.summarize,
        "summarize": plan.cut > plan.head and plan.summarize,
        "middle-out": bool(plan.dropped),
    }
    return tuple(name for name in pipeline if did[name])


def _unchanged(
    messages: Sequence[Mapping[str, Any]], the_plan: Plan, budget: Budget
) -> CompactionResult:
    """The result of a plan that changes nothing: the messages as they are (the very list: a
    copy, and a tuple of every index, would touch each of a long history's objects on every
    request, and most requests change nothing)."""
    return CompactionResult(
        messages,
        (),
        the_plan.tokens_before,
        the_plan.tokens_before,
        len(messages),
        len(messages),
        the_plan.tokens_before > budget.budget,
        the_plan,
        range(len(messages)),
    )


def untouched(
    messages: Sequence[Mapping[str, Any]], tokens: int, budget: Budget | None = None
) -> CompactionResult:
    """The result that forwards `messages` as they are, at `tokens`, with no plan built (its
    `plan` groups no unit): a request under the trigger as a whole, whose plan would find
    nothing to do (the quiet path, app/compaction/service.py), or one that could not be
    counted (0 tokens, no `budget`)."""
    nothing = Plan(
        units=(),
        head=0,
        cut=0,
        dropped=frozenset(),
        truncated=frozenset(),
        pruned_before=0,
        cap=0,
        events=(),
        summarize=False,
        tokens_before=tokens,
        tokens_after=tokens,
        strict=False,
    )
    over = budget is not None and tokens > budget.budget
    n = len(messages)
    return CompactionResult(messages, (), tokens, tokens, n, n, over, nothing, range(n))


@dataclass(frozen=True, slots=True)
class Pinning:
    """What a request pins (DESIGN.md §14) and the tokens its pinned text may take."""

    pins: tuple[Pin, ...]
    tokens: int

    def text(
        self, the_plan: Plan, messages: Sequence[Mapping[str, Any]], count: MessageCounter
    ) -> str:
        """The pinned block for what `the_plan` cut or dropped (empty: nothing matched)."""
        if not self.pins:
            return ""
        empty = count({"role": "assistant", "content": ""})

        def text_tokens(text: str) -> int:
            return count({"role": "assistant", "content": text}) - empty

        positions = removed_positions(the_plan)
        return pinned_text(messages, positions, self.pins, self.tokens, text_tokens)


def _stand_in(
    the_plan: Plan,
    messages: Sequence[Mapping[str, Any]],
    summary: str | None,
    restore: bool,
    pinned: str = "",
) -> tuple[str, str] | None:
    """(prefix, text) of what stands for the cut: the summary, then the `pinned` block, then
    the span marker when restoring — whichever of them there are; or None."""
    marker = span_marker(the_plan, messages) if restore else None
    parts = [pinned, marker or ""]
    if the_plan.summarize and summary is not None:
        return SUMMARY_PREFIX, "\n\n".join(p for p in (summary, *parts) if p)
    if (the_plan.summarize or the_plan.marker) and (marker is not None or pinned):
        return "", "\n\n".join(p for p in parts if p)
    return None


def compact(
    messages: Sequence[Mapping[str, Any]],
    pipeline: tuple[StrategyName, ...],
    budget: Budget,
    count: MessageCounter,
    fixed_tokens: int,
    *,
    summary: str | None = None,
    summary_tokens: int = 0,
    planned: Plan | None = None,
    replays: Replays | None = None,
    protect: frozenset[str] = frozenset(),
    restore: bool = False,
    pins: tuple[Pin, ...] = (),
) -> CompactionResult:
    """Compact `messages` for `budget`. Unchanged messages are the same objects.

    Without a `summary` text, `summarize` in the pipeline acts as `trim` (the pure fallback).
    `planned` reuses a plan already computed for exactly these arguments; `replays` remembers
    replays by history prefix (the plan is the same with or without). `protect`: tools whose
    outputs only the last unit may cut. `restore`: a span marker stands for what is cut or
    dropped (with a summary: ends it; `summary_tokens` must then include `marker_tokens`).
    `pins`: what they match in the cut stands there too (`summary_tokens` must then include
    `pin_tokens`); a stand-in is placed whenever the plan cuts, as with restore.

    `summarize` needs the upstream, so here it plans the cut a summary would replace; the async
    summary layer swaps in the summary text when one is cached or made. Without it the same cut is
    rendered with nothing (or a stand-in note, or restore's marker) in its place — never re-planned,
    so the summary landing later is one prompt change (DESIGN.md §12).

    With restore on (DESIGN.md §11) what was cut or dropped is never silent: one marker naming the
    span's ref stands where a summary would (§4.6 placement, its tokens reserved like a summary's),
    and a summary, when there is one, ends with that marker. With pins (DESIGN.md §14) what they
    match in the cut messages stands there too, verbatim and bounded (its tokens reserved like the
    marker's), after the summary and before the marker.
    """
    if summary is None:
        pipeline = tuple("trim" if s == "summarize" else s for s in pipeline)
    if not summary_tokens:
        summary_tokens = marker_tokens(count) if restore else 0
        summary_tokens += pin_tokens(budget.goal) if pins else 0
    pinning = Pinning(pins, pin_tokens(budget.goal))
    the_plan = planned or plan(
        messages,
        pipeline,
        budget,
        count,
        fixed_tokens,
        summary_tokens,
        protect=protect,
        marked=restore or bool(pins),
        replays=replays,
    )
    if not the_plan.changed:
        return _unchanged(messages, the_plan, budget)
    out = render(messages, the_plan)
    sources = kept_sources(the_plan)
    after = the_plan.tokens_after
    pinned = pinning.text(the_plan, messages, count)
    stand_in = _stand_in(the_plan, messages, summary, restore, pinned)
    if stand_in is None and pins and (the_plan.summarize or the_plan.marker):
        stand_in = "", OMITTED_NOTE  # pins asked for, nothing matched: the note holds its place
    if stand_in is not None:
        prefix, text = stand_in
        added = with_summary(out, the_plan, messages, text, count, sources, prefix)
        after = after - summary_tokens + added
    return CompactionResult(
        out,
        _applied(the_plan, pipeline),
        the_plan.tokens_before,
        after,
        len(messages),
        len(out),
        after > budget.budget,
        the_plan,
        tuple(sources),
        restorable(messages, the_plan) if restore else {},
    )
