"""Chat completions: the view is the `messages` list itself (the identity adapter)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from inflight.compaction.wire import ApiName, Conversation


class ChatFormat:
    """`POST /v1/chat/completions` bodies."""

    api: ApiName = "chat"
    history: str = "messages"

    def conversation(self, body: Mapping[str, Any]) -> Conversation:
        return Conversation(messages=body["messages"], fixed=body)

    def render(
        self,
        body: Mapping[str, Any],
        conversation: Conversation,
        messages: Sequence[Mapping[str, Any]],
        sources: Sequence[int | None],
    ) -> dict[str, Any]:
        return {**body, "messages": list(messages)}
