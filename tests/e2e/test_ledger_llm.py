"""The ledger against a real llama.cpp server (../shared/local-llm, a 4,096-token window),
through a real proxy: a conversation over the window is trimmed, the answer carries its id, and
the ledger names exactly the messages that did not go upstream. The server counts the prompt it
was sent, so nothing is taken for a silent cut."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import httpx
import openai
import pytest

from inflight.factory import create_app
from tests.conftest import make_settings
from tests.e2e.test_e2e_llm import LLM_URL, MODEL, _long_conversation
from tests.support.servers import serve

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.llm,
    pytest.mark.skipif(
        not LLM_URL,
        reason="INFLIGHT_TEST_LLM_URL is unset (start ../shared/local-llm/start.sh and export it)",
    ),
]


@pytest.fixture
def proxy_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    assert LLM_URL is not None
    settings = make_settings(tmp_path_factory.mktemp("ledger-llm"), upstream_url=LLM_URL)
    with serve(create_app(settings)) as url:
        yield url


def test_the_ledger_of_a_trimmed_conversation(proxy_url: str) -> None:
    messages = _long_conversation(40)
    with openai.OpenAI(
        base_url=proxy_url + "/v1", api_key="sk-llm", timeout=110, max_retries=0
    ) as oai:
        raw = oai.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=messages,  # type: ignore[arg-type]
            max_tokens=8,
            temperature=0,
            extra_headers={"X-Compaction-Strategy": "trim"},
        )
    assert raw.parse().choices[0].message.content is not None
    assert raw.headers["x-compaction-context-limit"] == "4096"
    assert "x-compaction-upstream-truncated" not in raw.headers
    found = httpx.get(
        f"{proxy_url}/v1/compaction/ledger/{raw.headers['x-compaction-id']}",
        headers={"authorization": "Bearer sk-llm"},
        timeout=10,
    )
    assert found.status_code == 200, found.text
    cuts = found.json()["cuts"]
    assert {c["kind"] for c in cuts} == {"trimmed"}
    kept = len(messages) - len(cuts)
    assert kept == int(raw.headers["x-compaction-messages-after"])
    for cut in cuts:
        content = messages[cut["position"]]["content"]
        assert cut["sha256"] == hashlib.sha256(content.encode()).hexdigest()
