"""ASGI tier: a restore round after the first fails — an error status, a refused connection, a
timeout, or a body that breaks — on every API, JSON and stream. The client gets that failure;
the usage of the rounds that succeeded is still in the request's usage record."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from inflight.proxy.restore import TOOL_NAME
from tests.asgi.test_restore_route import ANSWER, CHAT, RESTORE, proxy
from tests.support.fake_restore_upstream import FIRST_REF, Call, Fail, Reply, ScriptedUpstream
from tests.unit.apis.anthropic.test_restore_messages import BODY as MESSAGES
from tests.unit.apis.responses.test_restore_responses import BODY as RESPONSES

pytestmark = pytest.mark.anyio

ROUTES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": CHAT,
    "/v1/messages": MESSAGES,
    "/v1/responses": RESPONSES,
}
CALL = Reply(calls=(Call(TOOL_NAME, FIRST_REF),))
STATUS = {"status": 429, "connect": 502, "timeout": 504}


@pytest.mark.parametrize("route", list(ROUTES))
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("fail", ["status", "connect", "timeout", "broken"])
async def test_a_failed_later_round_keeps_the_earlier_rounds_usage(
    tmp_path: Path, route: str, stream: bool, fail: Fail
) -> None:
    # two successful restore rounds, then the third (the last) fails
    upstream = ScriptedUpstream([CALL, CALL, Reply(text=ANSWER.text, fail=fail)])
    async with proxy(tmp_path, upstream) as (client, store):
        response = await client.post(
            route, json={**ROUTES[route], "stream": stream}, headers=RESTORE
        )
        (record,) = await store.written(1)
    assert len(upstream.bodies) == 3
    if fail == "broken" and stream and response.status_code == 200:
        # the text had started (chat, Messages: half the body holds a text delta): the stream
        # ends with an error event (the outcome may read as the client's disconnect: the ASGI
        # test client hangs up as soon as the body ends)
        assert "error" in response.text.splitlines()[-2]
    else:  # nothing had been relayed yet: the error as a response
        assert response.status_code == STATUS.get(fail, 502), response.text
        assert record.outcome == "upstream_error"
    if fail == "status":
        assert "slow down" in response.text  # the upstream's error as it came
    assert TOOL_NAME not in response.text
    # rounds 1 and 2 were spent: 1000 + 1001 prompt tokens, 10 + 11 completion tokens
    assert (record.prompt_tokens, record.completion_tokens) == (2001, 21)
