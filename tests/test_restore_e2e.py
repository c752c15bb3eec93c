"""End-to-end: restore's loop through real uvicorn servers with the official `openai` client —
the scripted upstream calls `inflight_restore`; the client gets only the final answer, JSON and
stream, and the usage of every round."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from app.factory import create_app
from app.proxy.restore import TOOL_NAME
from tests.conftest import make_settings
from tests.fake_restore_upstream import FIRST_REF, Call, Reply, ScriptedUpstream
from tests.servers import WatchedStore, serve
from tests.test_restore_route import ANSWER, CHAT, SECRET

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("stream", [False, True])
def test_the_sdk_never_sees_the_restore_tool(tmp_path: Path, stream: bool) -> None:
    upstream = ScriptedUpstream([Reply(calls=(Call(TOOL_NAME, FIRST_REF),)), ANSWER])
    store = WatchedStore()
    with serve(upstream.app) as upstream_url:
        settings = make_settings(
            tmp_path, upstream_url=upstream_url + "/v1", restore=True, context_limit=8192
        )
        app = create_app(settings, store=store)
        with (
            serve(app) as url,
            openai.OpenAI(base_url=url + "/v1", api_key="sk", timeout=20, max_retries=0) as oai,
        ):
            if stream:
                chunks = list(
                    oai.chat.completions.create(
                        model="gpt-4o-mini",
                        messages=CHAT["messages"],
                        stream=True,
                        stream_options={"include_usage": True},
                    )
                )
                text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
                assert not [c for c in chunks if c.choices and c.choices[0].delta.tool_calls]
                usage = next(c.usage for c in chunks if c.usage is not None)
            else:
                result = oai.chat.completions.create(model="gpt-4o-mini", messages=CHAT["messages"])
                text = result.choices[0].message.content or ""
                assert result.choices[0].message.tool_calls is None
                usage = result.usage
            (record,) = store.wait_for(1)
    assert text.strip() == ANSWER.text
    assert usage is not None
    assert usage.prompt_tokens == 1000 + 1001  # both rounds
    assert record.prompt_tokens == 2001
    assert len(upstream.bodies) == 2
    assert SECRET in upstream.bodies[1]["messages"][-1]["content"]
