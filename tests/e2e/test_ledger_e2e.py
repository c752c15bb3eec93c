"""End-to-end: the ledger through a real uvicorn server and the official `openai` client — the
id on a JSON answer and on a stream, and the ledger read right after the last byte."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from inflight.factory import create_app
from tests.asgi.test_ledger import SECRET, agent_messages
from tests.conftest import make_settings
from tests.support.fakes import FakeUpstream
from tests.support.servers import serve

pytestmark = pytest.mark.e2e

KEY = "sk-e2e"
SMALL_WINDOW = {"X-Compaction-Context-Limit": "2048"}


@pytest.fixture
def proxy_url(tmp_path: Path, fake: FakeUpstream) -> Iterator[str]:
    with serve(fake.app) as upstream:
        settings = make_settings(tmp_path, upstream_url=upstream + "/v1", ledger="full")
        with serve(create_app(settings)) as url:
            yield url


def read_ledger(proxy_url: str, ledger_id: str, key: str = KEY) -> httpx.Response:
    url = f"{proxy_url}/v1/compaction/ledger/{ledger_id}"
    return httpx.get(url, headers={"authorization": f"Bearer {key}"}, timeout=10)


def test_json_and_stream_ids_read_back_at_once(proxy_url: str) -> None:
    with openai.OpenAI(base_url=proxy_url + "/v1", api_key=KEY, timeout=20, max_retries=0) as oai:
        raw = oai.chat.completions.with_raw_response.create(
            model="gpt-4o",
            messages=agent_messages(),  # type: ignore[arg-type]
            extra_headers=SMALL_WINDOW,
        )
        assert raw.parse().choices[0].message.content == "Hello there"
        json_id = raw.headers["x-compaction-id"]
        with oai.chat.completions.with_streaming_response.create(
            model="gpt-4o",
            messages=agent_messages(),  # type: ignore[arg-type]
            stream=True,
            extra_headers=SMALL_WINDOW,
        ) as response:
            stream_id = response.headers["x-compaction-id"]
            chunks = list(response.parse())
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert json_id != stream_id
    for ledger_id in (json_id, stream_id):
        found = read_ledger(proxy_url, ledger_id)
        assert found.status_code == 200, found.text
        assert any(SECRET in str(cut.get("content")) for cut in found.json()["cuts"])
        assert read_ledger(proxy_url, ledger_id, "sk-someone-else").status_code == 404
