"""Anthropic Messages (`POST /v1/messages`): the wire-format adapter (DESIGN.md §8)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from inflight.apis.anthropic.context_edits import upstream_sees
from inflight.apis.anthropic.render import render_messages
from inflight.apis.anthropic.rules import problems
from inflight.apis.anthropic.view import MessagesConversation, build_view
from inflight.compaction.wire import ApiName, Conversation
from inflight.errors import BadRequest

FIXED_FIELDS = ("system", "tools", "tool_choice")


class MessagesFormat:
    """`POST /v1/messages` bodies (Anthropic's Messages API).

    The view (`view.py`) maps turns to chat-shaped view messages so the planner keeps a
    `tool_use` and its `tool_result`s together and the turns alternating; rendering
    (`render.py`) puts the kept blocks back, untouched messages byte-identical, and moves the
    `cache_control` breakpoints of cut blocks. A `role: "system"` message inside `messages` is an
    instruction pinned where it stands (§3), as later system messages are on chat. A body Anthropic
    would reject (`rules.py`) is forwarded as sent unless compaction must rewrite it; then it
    is a 400 naming the field. A body still carrying `context_management` goes to an upstream
    that applies the edits itself (§13): the view counts what they leave, the body keeps what was
    sent.
    """

    api: ApiName = "messages"
    history: str = "messages"

    def conversation(self, body: Mapping[str, Any]) -> Conversation:
        """Never raises: a body Anthropic would reject still has a view (its problems matter
        only if compaction must rewrite it, and `render` reports them). With context edits the
        upstream applies, the view is of the messages as they will leave them (block for
        block: rendering puts back the blocks as sent)."""
        fixed = {k: body[k] for k in FIXED_FIELDS if k in body}
        messages = body.get("messages")
        if not isinstance(messages, list):
            return MessagesConversation(messages=[], fixed=fixed)
        messages = upstream_sees(body) or messages
        listed = [m if isinstance(m, Mapping) else {"content": [m]} for m in messages]
        view, pieces = build_view(listed)
        return MessagesConversation(messages=view, fixed=fixed, pieces=pieces)

    def render(
        self,
        body: Mapping[str, Any],
        conversation: Conversation,
        messages: Sequence[Mapping[str, Any]],
        sources: Sequence[int | None],
    ) -> dict[str, Any]:
        """`body` with the compacted view in Anthropic's form; `BadRequest` naming the field
        when Anthropic would reject the body (it cannot be rewritten safely)."""
        found = problems(body)
        if found:
            raise BadRequest(found[0].message, param=found[0].param)
        if not isinstance(conversation, MessagesConversation):
            raise TypeError("MessagesFormat.render needs the conversation it made")
        rendered = render_messages(body["messages"], conversation, messages, sources)
        return {**body, "messages": rendered}
