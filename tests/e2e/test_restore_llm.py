"""Restore end to end against the real llama.cpp server (../shared/local-llm): with restore on
and a cut conversation, the request completes — whether or not the 0.5B model calls
`inflight_restore`, the client gets one well-formed answer that never shows the tool, and every
round's usage is recorded."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from inflight.factory import create_app
from inflight.proxy.restore import MAX_ROUNDS, TOOL_NAME
from tests.conftest import make_settings
from tests.e2e.test_e2e_llm import LLM_URL, MODEL, pytestmark  # noqa: F401 (the llm tier)
from tests.support.servers import WatchedStore, serve


def conversation() -> list[dict[str, str]]:
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Remember: the release codename is HERON-42."},
        {"role": "assistant", "content": "Noted: HERON-42."},
    ]
    for k in range(8):
        messages.append({"role": "user", "content": f"Question {k}: what is a tuple?"})
        messages.append({"role": "assistant", "content": "A tuple is immutable. " * 30})
    messages.append({"role": "user", "content": "What is the release codename?"})
    return messages


@pytest.mark.parametrize("stream", [False, True])
def test_restore_on_with_the_real_model_completes(tmp_path: Path, stream: bool) -> None:
    assert LLM_URL is not None
    store = WatchedStore()
    settings = make_settings(tmp_path, upstream_url=LLM_URL, restore=True, context_limit=900)
    app = create_app(settings, store=store)
    with (
        serve(app) as url,
        openai.OpenAI(base_url=url + "/v1", api_key="none", timeout=300, max_retries=0) as oai,
    ):
        raw = oai.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=conversation(),  # type: ignore[arg-type]
            max_tokens=24,
            temperature=0,
            stream=stream,
            extra_headers={"x-compaction-strategy": "trim"},
        )
        if stream:
            chunks = list(raw.parse())  # type: ignore[arg-type]
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            calls = [c for c in chunks if c.choices and c.choices[0].delta.tool_calls]
            called = [t.function.name for c in calls for t in c.choices[0].delta.tool_calls or ()]
            finish = [c.choices[0].finish_reason for c in chunks if c.choices]
            ended = any(finish)
        else:
            result = raw.parse()
            text = result.choices[0].message.content or ""
            called = [t.function.name for t in result.choices[0].message.tool_calls or ()]
            ended = result.choices[0].finish_reason is not None
        (record,) = store.wait_for(1, timeout=30)
    assert raw.headers["x-compaction-applied"] == "trim"
    assert TOOL_NAME not in called  # the client never sees the tool
    rounds = int(raw.headers.get("x-compaction-restore-rounds", "1"))
    assert 1 <= rounds <= MAX_ROUNDS
    assert int(raw.headers.get("x-compaction-restore-calls", "0")) >= rounds - 1
    assert ended  # one whole answer (a 0.5B model's may be empty: `text` is not asserted)
    assert isinstance(text, str)
    assert record.status == 200
    assert record.outcome == "completed"
    assert record.prompt_tokens is not None
    assert record.prompt_tokens > 0
