"""Provider compaction items are pinned stand-ins, not a reason to skip (DESIGN.md §13): a
Codex-shaped Responses session after `/v1/responses/compact` (user messages, one `compaction`
item, then new rounds) is compacted after the item on a strict fake, the item and what precedes
it forwarded as sent; an Anthropic `compaction` block is pinned the same way in Messages."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest

from inflight.apis.anthropic.format import MessagesFormat
from tests.asgi.test_responses_route import agent_items
from tests.support.fakes import FakeUpstream
from tests.support.responses_items import compaction_item, pair_problems

pytestmark = pytest.mark.anyio


@pytest.fixture
def fake() -> FakeUpstream:
    return FakeUpstream()


def codex_session(rounds: int) -> list[dict[str, Any]]:
    """What Codex sends after a remote compaction: the user's messages, the compaction item,
    then the rounds since."""
    head = [
        {"role": "user", "content": "Fix the failing test."},
        {"role": "user", "content": "Also keep the API stable."},
        compaction_item(1),
    ]
    return head + agent_items(rounds, 400)[1:]


async def test_a_session_after_a_compaction_item_is_compacted_after_it(
    client: httpx.AsyncClient, fake: FakeUpstream
) -> None:
    items = codex_session(40)
    body = {"model": "gpt-4.1", "input": items}
    response = await client.post(
        "/v1/responses", content=orjson.dumps(body), headers={"X-Compaction-Context-Limit": "8000"}
    )
    assert response.status_code == 200, response.text
    assert "x-compaction-skipped" not in response.headers
    assert response.headers["x-compaction-applied"] != "none"
    sent = fake.responses_requests[-1].json()["input"]
    assert sent[:3] == items[:3]  # the stand-in and what precedes it, as sent
    assert len(sent) < len(items)
    assert pair_problems(sent) == []
    assert fake.rejected == []


def test_an_anthropic_compaction_block_pins_the_history_before_it() -> None:
    wire = MessagesFormat()
    compaction = {"type": "compaction", "content": "Summary of the work so far."}
    messages: list[Any] = [
        {"role": "user", "content": "old task"},
        {"role": "assistant", "content": "old answer"},
        {"role": "user", "content": "go on"},
        {"role": "assistant", "content": [compaction, {"type": "text", "text": "resuming"}]},
        {"role": "user", "content": "next"},
        {"role": "assistant", "content": "done"},
        {"role": "user", "content": "more"},
    ]
    conversation = wire.conversation({"model": "m", "max_tokens": 5, "messages": messages})
    # one pinned user view message through the block's turn and the user turn after it
    assert [m["role"] for m in conversation.messages] == ["user", "assistant", "user"]
    assert conversation.origin(0) == (0, 1, 2, 3, 4)
    kept = [conversation.messages[0], conversation.messages[2]]
    body = {"model": "m", "max_tokens": 5, "messages": messages}
    rendered = wire.render(body, conversation, kept, [0, 2])
    assert rendered["messages"][:5] == messages[:5]
    assert rendered["messages"][5:] == [messages[6]]
