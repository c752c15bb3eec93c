"""Wire formats: one adapter per protocol maps a request body to the planner's view and back."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

ApiName = Literal["chat", "responses", "messages"]


@dataclass(frozen=True, slots=True)
class Conversation:
    """A request seen by the planner.

    `messages` is the chat-shaped view; `fixed` the parts of the body every prompt carries
    whatever is cut (tools, `instructions`, `system`), given to the counter as a body mapping.
    `skip` says why the request must be forwarded as received (never compacted), if it must.
    """

    messages: Sequence[Mapping[str, Any]]
    fixed: Mapping[str, Any]
    skip: str | None = None

    def origin(self, position: int) -> tuple[int, ...]:
        """The indices in the body's own history that view message `position` stands for
        (chat: the same index; an adapter that groups items says which)."""
        return (position,)


class WireFormat(Protocol):
    """One protocol's adapter (chat completions, Responses, Messages).

    The planner works on chat-shaped messages (`role`, `content`, `tool_calls`, `tool_call_id`). An
    adapter turns a request of its protocol into such a *view* — one view message per item or block
    group, in order, so that a tool call and its results form one unit (DESIGN.md §3, §8) — and
    renders a compacted view back into its protocol: every view message the plan kept untouched
    becomes its original item again, byte-identical; a changed one (truncated, pruned, the summary)
    is rewritten in the protocol's own shape. The engine never sees wire details.
    """

    api: ApiName
    history: str  # the request field that holds the history (`messages`, `input`)

    def conversation(self, body: Mapping[str, Any]) -> Conversation:
        """The planner's view of `body`; raises `BadRequest` naming the field when malformed."""
        ...

    def render(
        self,
        body: Mapping[str, Any],
        conversation: Conversation,
        messages: Sequence[Mapping[str, Any]],
        sources: Sequence[int | None],
    ) -> dict[str, Any]:
        """`body` with the compacted view `messages` in place of its history.

        `sources[k]` is the index in `conversation.messages` that output message k came from
        (the same object when untouched), or None for a message the proxy inserted.
        """
        ...
