"""What one compaction cut, message by message: the entries of the ledger (DESIGN.md §11).

A pure function of the planner's view, the plan and the compacted output (`cuts_of`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from inflight.compaction.engine import CompactionResult
from inflight.compaction.prune import is_placeholder, tool_names
from inflight.compaction.refs import content_bytes, content_sha256, ref_for
from inflight.compaction.unit_costs import TOOL_KINDS
from inflight.compaction.wire import Conversation

CutKind = Literal["truncated", "pruned", "trimmed", "summarized", "dropped"]


@dataclass(frozen=True, slots=True)
class CutCall:
    """A tool call of a cut assistant message: its name and its original arguments."""

    name: str
    arguments: Any  # None unless the ledger keeps originals
    sha256: str

    def document(self, full: bool) -> dict[str, Any]:
        doc: dict[str, Any] = {"name": self.name, "sha256": self.sha256}
        if full:
            doc["arguments"] = self.arguments
        return doc


@dataclass(frozen=True, slots=True)
class Cut:
    """One message the compaction removed or shrank, as the ledger reports it.

    Every view message that is not forwarded as it was received is one `Cut` — `trimmed`,
    `summarized` or `dropped` (middle-out) when its unit is gone, `pruned` or `truncated` when it is
    kept with its text shrunk. A message of the pinned head is never a cut (a summary folded into
    the head's user message adds a part after its own, unchanged content). Each cut names its
    position (the view index, the one a marker's ref is made of), the body items it stands for, its
    role, tool name, tokens, the sha256 and the ref of its original content; only when the ledger
    keeps originals does it hold that content too (else nothing of a cut message outlives the
    request).
    """

    position: int  # index in the planner's view (for chat: in `messages`)
    items: tuple[int, ...]  # indices in the body's own history (`messages` / `input`)
    role: str
    tool: str | None  # the tool an output answers; the tools an assistant message calls
    kind: CutKind
    tokens: int  # the original message's tokens (the calibrated estimate)
    content: Any  # the original content (a string, a list of parts), None unless kept
    sha256: str  # of the original content (`content_sha256`)
    ref: str  # the ref a marker of that content carries (`ref_for`)
    calls: tuple[CutCall, ...] = ()
    size: int = 0  # bytes of original content and arguments held (0 unless kept)

    def document(self, full: bool) -> dict[str, Any]:
        """The ledger's JSON entry (hashes already made: cheap on the event loop); `full` adds
        the original content and arguments."""
        doc: dict[str, Any] = {
            "position": self.position,
            "items": list(self.items),
            "role": self.role,
            "tool": self.tool,
            "kind": self.kind,
            "tokens": self.tokens,
            "sha256": self.sha256,
            "ref": self.ref,
        }
        if full:
            doc["content"] = self.content
        if self.calls:
            doc["calls"] = [call.document(full) for call in self.calls]
        return doc


def _calls(message: Mapping[str, Any], keep: bool) -> tuple[CutCall, ...]:
    calls = message.get("tool_calls")
    if calls is None and message.get("function_call") is None:
        return ()  # the common case: an output or a plain message
    functions = (
        [c.get("function") for c in calls if isinstance(c, Mapping)]
        if isinstance(calls, list)
        else []
    )
    functions.append(message.get("function_call"))  # legacy
    return tuple(
        CutCall(
            str(f.get("name")),
            f.get("arguments") if keep else None,
            content_sha256(f.get("arguments")),
        )
        for f in functions
        if isinstance(f, Mapping)
    )


def _size(value: Any) -> int:
    return 0 if value is None else len(content_bytes(value))


def _outputs(messages: Sequence[Mapping[str, Any]], start: int, end: int, kind: str) -> list[Any]:
    """The tool each message of a unit answers: for each output of a tool round, the tool its
    call names; None for the calling message and outside tool rounds."""
    if kind not in TOOL_KINDS:
        return [None] * (end - start)
    return [None, *tool_names(messages[start:end])]


def _changed_kind(original: Mapping[str, Any], shown: Mapping[str, Any]) -> CutKind:
    pruned = is_placeholder(shown.get("content")) and not is_placeholder(original.get("content"))
    return "pruned" if pruned else "truncated"


def cuts_of(
    conversation: Conversation, result: CompactionResult, tokens: Sequence[int], keep: bool
) -> tuple[Cut, ...]:
    """Every view message `result` did not forward as received, in order; `tokens[i]` is the
    size of view message i (the counts planning made). `keep`: hold the original contents."""
    messages = conversation.messages
    plan = result.plan
    shown: dict[int, Mapping[str, Any]] = {
        source: message
        for message, source in zip(result.messages, result.sources, strict=True)
        if source is not None
    }
    gone: CutKind = "summarized" if "summarize" in result.applied else "trimmed"
    out: list[Cut] = []
    for i, unit in enumerate(plan.units):
        if i < plan.head:
            continue
        answers: list[Any] | None = None  # found for the first cut of the unit
        for position in range(unit.start, unit.end):
            original = messages[position]
            if not plan.kept(i):
                kind: CutKind = "dropped" if i in plan.dropped else gone
            elif shown.get(position, original) is original:
                continue
            else:
                kind = _changed_kind(original, shown[position])
            if answers is None:
                answers = _outputs(messages, unit.start, unit.end, unit.kind)
            content = original.get("content")
            calls = _calls(original, keep)
            out.append(
                Cut(
                    position=position,
                    items=conversation.origin(position),
                    role=str(original.get("role")),
                    tool=",".join(c.name for c in calls) or answers[position - unit.start],
                    kind=kind,
                    tokens=tokens[position],
                    content=content if keep else None,
                    sha256=content_sha256(content),
                    ref=ref_for(position, content),
                    calls=calls,
                    size=_size(content) + sum(_size(c.arguments) for c in calls) if keep else 0,
                )
            )
    return tuple(out)
