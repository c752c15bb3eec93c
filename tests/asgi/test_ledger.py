"""The ledger through the app (ASGI, fake upstreams): `X-Compaction-Id` on every compacted
response of the three APIs, `GET /v1/compaction/ledger/{id}` readable at once and only by the
same client (all else the same 404), meta/full/off, and nothing of it in any log."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from starlette.types import ASGIApp

from inflight.factory import create_app
from inflight.usage.ledger import LATE_FIELDS, LedgerRow
from inflight.usage.stores.sqlite import SQLiteStore
from tests.conftest import make_settings
from tests.support.fakes import FakeUpstream
from tests.unit.compaction.test_cuts import agent

pytestmark = pytest.mark.anyio

CHAT = "/v1/chat/completions"
SECRET = "hunter2-the-cut-secret"
SMALL_WINDOW = {"x-compaction-context-limit": "2048"}


def agent_messages() -> list[dict[str, Any]]:
    return agent(rounds=12, size=60, text=SECRET)


def chat_body(**extra: Any) -> dict[str, Any]:
    return {"model": "gpt-4o", "messages": agent_messages(), **extra}


class GatedStore(SQLiteStore):
    """A store whose ledger writes wait until `gate` is set: what a GET finds meanwhile can only
    come from the rows the queue has not written yet."""

    def __init__(self) -> None:
        super().__init__("sqlite:///:memory:")
        self.gate = asyncio.Event()
        self.wrote = asyncio.Event()

    async def write_ledger(self, rows: Sequence[LedgerRow]) -> None:
        await self.gate.wait()
        await super().write_ledger(rows)
        self.wrote.set()


@asynccontextmanager
async def proxy(
    tmp_path: Path, upstream: ASGIApp, store: SQLiteStore | None = None, **settings: Any
) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(
        make_settings(tmp_path, **settings),
        transport=httpx.ASGITransport(app=upstream),
        store=store,
    )
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://proxy.test") as c:
                yield c
        finally:  # a held-back write must not hold up the shutdown flush
            if isinstance(store, GatedStore):
                store.gate.set()


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


async def compacted_id(
    client: httpx.AsyncClient, headers: dict[str, str], path: str = CHAT, body: Any = None
) -> str:
    response = await client.post(
        path, content=orjson.dumps(body or chat_body()), headers={**SMALL_WINDOW, **headers}
    )
    assert response.status_code == 200, response.text
    assert response.headers["x-compaction-applied"] != "none"
    return response.headers["x-compaction-id"]


async def test_the_ledger_is_readable_the_moment_the_response_was_sent(tmp_path: Path) -> None:
    """Read-your-writes on this replica: the store's ledger write is held back, yet the GET
    right after the response finds the row; once written, the store serves the same row."""
    store = GatedStore()
    async with proxy(tmp_path, FakeUpstream().app, store) as client:
        ledger_id = await compacted_id(client, bearer("sk-a"))
        assert len(ledger_id) >= 20
        first = await client.get(f"/v1/compaction/ledger/{ledger_id}", headers=bearer("sk-a"))
        assert first.status_code == 200, first.text
        assert not store.wrote.is_set()
        document = first.json()
        assert document["id"] == ledger_id
        assert document["route"] == CHAT
        assert document["model"] == "gpt-4o"
        assert document["mode"] == "meta"
        cuts = document["cuts"]
        assert cuts
        assert {c["kind"] for c in cuts} <= {
            "summarized",
            "trimmed",
            "pruned",
            "truncated",
        }
        messages = agent_messages()
        for cut in cuts:
            assert cut["items"] == [cut["position"]]
            assert cut["role"] == messages[cut["position"]]["role"]
            assert "content" not in cut  # meta keeps no content
        assert SECRET not in first.text
        store.gate.set()
        await asyncio.wait_for(store.wrote.wait(), 5)
        second = await client.get(f"/v1/compaction/ledger/{ledger_id}", headers=bearer("sk-a"))
        assert second.status_code == 200
        # the same row; its late fields (facts, realised net) may have been filled in meanwhile
        assert set(LATE_FIELDS) <= set(document)
        assert drop_late(second.json()) == drop_late(document)


def drop_late(document: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in document.items() if k not in LATE_FIELDS}


async def test_a_stream_has_its_id_and_its_ledger_right_after(tmp_path: Path) -> None:
    store = GatedStore()
    async with proxy(tmp_path, FakeUpstream().app, store) as client:
        async with client.stream(
            "POST",
            CHAT,
            content=orjson.dumps(chat_body(stream=True)),
            headers={**SMALL_WINDOW, **bearer("sk-a")},
        ) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            ledger_id = response.headers["x-compaction-id"]
            body = b"".join([chunk async for chunk in response.aiter_bytes()])
        assert b"[DONE]" in body
        found = await client.get(f"/v1/compaction/ledger/{ledger_id}", headers=bearer("sk-a"))
        assert found.status_code == 200
        assert found.json()["cuts"]
        store.gate.set()


async def test_nothing_cut_no_id(tmp_path: Path) -> None:
    async with proxy(tmp_path, FakeUpstream().app) as client:
        response = await client.post(
            CHAT, json={"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
        )
        assert response.status_code == 200
        assert response.headers["x-compaction-applied"] == "none"
        assert "x-compaction-id" not in response.headers
        assert await compacted_id(client, {})  # the same proxy gives one where it cuts


async def not_found(client: httpx.AsyncClient, ledger_id: str, headers: dict[str, str]) -> Any:
    response = await client.get(f"/v1/compaction/ledger/{ledger_id}", headers=headers)
    assert response.status_code == 404, response.text
    return response.json()


async def test_with_proxy_keys_only_the_same_key_reads_it(tmp_path: Path) -> None:
    async with proxy(tmp_path, FakeUpstream().app, api_keys="k-one,k-two") as client:
        ledger_id = await compacted_id(client, bearer("k-one"))
        url = f"/v1/compaction/ledger/{ledger_id}"
        assert (await client.get(url, headers=bearer("k-one"))).status_code == 200
        assert (await client.get(url, headers={"x-api-key": "k-one"})).status_code == 200
        other = await not_found(client, ledger_id, bearer("k-two"))
        unknown = await not_found(client, "A" * len(ledger_id), bearer("k-one"))
        assert other == unknown  # no oracle: another key's row looks like no row at all
        assert other["error"]["type"] == "invalid_request_error"
        assert other["error"]["code"] == "not_found"
        assert (await client.get(url)).status_code == 401


async def test_without_proxy_keys_the_credential_sent_is_the_owner(tmp_path: Path) -> None:
    async with proxy(tmp_path, FakeUpstream().app) as client:
        ledger_id = await compacted_id(client, bearer("sk-upstream-a"))
        url = f"/v1/compaction/ledger/{ledger_id}"
        assert (await client.get(url, headers=bearer("sk-upstream-a"))).status_code == 200
        await not_found(client, ledger_id, bearer("sk-upstream-b"))
        await not_found(client, ledger_id, {})
        # a client that sent no credential owns its rows with every other such client
        anonymous = await compacted_id(client, {})
        anon_url = f"/v1/compaction/ledger/{anonymous}"
        assert (await client.get(anon_url)).status_code == 200
        await not_found(client, anonymous, bearer("sk-upstream-a"))


@pytest.mark.parametrize(
    ("mine", "theirs"),
    [
        ({"authorization": "Basic dXNlcjphOnNlY3JldA=="}, {"authorization": "Basic dXNlcjpi"}),
        ({"api-key": "azure-key-a"}, {"api-key": "azure-key-b"}),
        ({"x-api-key": "sk-ant-a"}, {"x-api-key": "sk-ant-b"}),
        ({"authorization": "Token abc"}, {"api-key": "abc"}),
    ],
)
async def test_full_rows_are_read_only_by_the_same_credential_of_any_scheme(
    tmp_path: Path, mine: dict[str, str], theirs: dict[str, str]
) -> None:
    """Without proxy keys, any credential is the owner — Basic, Azure's `api-key`, `x-api-key` —
    not only a Bearer token: another client (or one that sent nothing) never reads a `full` row,
    originals included, and neither does the anonymous owner."""
    async with proxy(tmp_path, FakeUpstream().app, ledger="full") as client:
        ledger_id = await compacted_id(client, mine)
        url = f"/v1/compaction/ledger/{ledger_id}"
        found = await client.get(url, headers=mine)
        assert found.status_code == 200, found.text
        assert SECRET in found.text
        for other in (theirs, {}, bearer("")):
            body = await not_found(client, ledger_id, other)
            assert SECRET not in str(body)


async def test_full_keeps_the_originals_and_off_keeps_nothing(tmp_path: Path) -> None:
    (tmp_path / "full").mkdir()
    async with proxy(tmp_path / "full", FakeUpstream().app, ledger="full") as client:
        ledger_id = await compacted_id(client, bearer("sk-a"))
        document = (
            await client.get(f"/v1/compaction/ledger/{ledger_id}", headers=bearer("sk-a"))
        ).json()
        assert document["mode"] == "full"
        messages = agent_messages()
        for cut in document["cuts"]:
            assert cut["content"] == messages[cut["position"]]["content"]
        assert any(SECRET in str(cut["content"]) for cut in document["cuts"])
    (tmp_path / "off").mkdir()
    async with proxy(tmp_path / "off", FakeUpstream().app, ledger="off") as client:
        response = await client.post(
            CHAT, content=orjson.dumps(chat_body()), headers={**SMALL_WINDOW, **bearer("sk-a")}
        )
        assert response.headers["x-compaction-applied"] != "none"
        assert "x-compaction-id" not in response.headers


async def test_no_usage_store_no_ledger(tmp_path: Path) -> None:
    async with proxy(tmp_path, FakeUpstream().app, database_url="none") as client:
        response = await client.post(
            CHAT, content=orjson.dumps(chat_body()), headers={**SMALL_WINDOW, **bearer("sk-a")}
        )
        assert response.headers["x-compaction-applied"] != "none"
        assert "x-compaction-id" not in response.headers


async def test_the_route_is_the_proxys_own_never_relayed(tmp_path: Path) -> None:
    fake = FakeUpstream()
    async with proxy(tmp_path, fake.app) as client:
        await not_found(client, "some-id", bearer("sk-a"))
        await not_found(client, "some/nested/id", bearer("sk-a"))
        refused = await client.post("/v1/compaction/ledger/some-id", headers=bearer("sk-a"))
        assert refused.status_code == 405
        assert refused.headers["allow"] == "GET"
        assert refused.json()["error"]["type"]
    assert fake.requests == []


async def test_nothing_of_the_ledger_is_ever_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with proxy(tmp_path, FakeUpstream().app, ledger="full") as client:
        ledger_id = await compacted_id(client, bearer("sk-a"))
        found = await client.get(f"/v1/compaction/ledger/{ledger_id}", headers=bearer("sk-a"))
        assert SECRET in found.text  # the content went through the ledger
    assert caplog.records, "DEBUG logging captured nothing: the check would be vacuous"
    for record in caplog.records:
        text = record.getMessage() + str(record.args) + (record.exc_text or "")
        assert SECRET not in text, record.name


def responses_body() -> dict[str, Any]:
    items: list[dict[str, Any]] = [{"role": "user", "content": "Fix the failing test."}]
    for i in range(12):
        items += [
            {"type": "function_call", "call_id": f"c{i}", "name": "read_file", "arguments": "{}"},
            {"type": "function_call_output", "call_id": f"c{i}", "output": f"{SECRET} {i} " + "x " * 240},
        ]  # fmt: skip
    return {"model": "gpt-4o", "input": items}


async def test_responses_requests_have_their_ledger(tmp_path: Path) -> None:
    fake = FakeUpstream()
    async with proxy(tmp_path, fake.app) as client:
        body = responses_body()
        ledger_id = await compacted_id(client, bearer("sk-a"), "/v1/responses", body)
        found = await client.get(f"/v1/compaction/ledger/{ledger_id}", headers=bearer("sk-a"))
        document = found.json()
        assert document["route"] == "/v1/responses"
        for cut in document["cuts"]:
            kinds = [body["input"][k]["type"] for k in cut["items"]]
            assert kinds == (
                ["function_call_output"] if cut["role"] == "tool" else ["function_call"]
            )


def messages_body() -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix the failing test."}]
    for i in range(12):
        messages += [
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": f"t{i}", "name": "Bash", "input": {"c": i}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{i}",
                "content": f"{SECRET} {i} " + "x " * 240}]},
        ]  # fmt: skip
    return {"model": "claude-sonnet-4-5", "max_tokens": 64, "messages": messages}


async def test_messages_requests_have_their_ledger(tmp_path: Path) -> None:
    headers = {"x-api-key": "sk-ant-a", "anthropic-version": "2023-06-01"}
    async with proxy(
        tmp_path, FakeUpstream().app, anthropic_upstream_url="http://anthropic.test/v1"
    ) as client:
        body = messages_body()
        ledger_id = await compacted_id(client, headers, "/v1/messages", body)
        found = await client.get(
            f"/v1/compaction/ledger/{ledger_id}", headers={"x-api-key": "sk-ant-a"}
        )
        document = found.json()
        assert document["route"] == "/v1/messages"
        assert {c["tool"] for c in document["cuts"]} == {"Bash"}
        for cut in document["cuts"]:
            (index,) = cut["items"]
            assert body["messages"][index]["role"] == (
                "user" if cut["role"] == "tool" else "assistant"
            )
        await not_found(client, ledger_id, {"x-api-key": "sk-ant-b"})


async def test_after_an_overflow_retry_the_id_is_the_one_of_what_was_sent(tmp_path: Path) -> None:
    """The upstream refuses the first compaction (its window is smaller than it advertises); the
    retry is compacted again, and the ledger returned is the retry's."""
    fake = FakeUpstream()
    fake.context_window = 3000
    fake.advertised_window = 32000
    messages = agent(rounds=40, size=60, text=SECRET)
    body = {"model": "fake-model", "max_tokens": 100, "messages": messages}
    async with proxy(tmp_path, fake.app) as client:
        response = await client.post("/v1/chat/completions", json=body, headers=bearer("sk-a"))
        assert response.status_code == 200, response.text
        assert len(fake.chat_requests) >= 2  # refused, then retried
        ledger_id = response.headers["x-compaction-id"]
        found = await client.get(f"/v1/compaction/ledger/{ledger_id}", headers=bearer("sk-a"))
        document = found.json()
        assert document["context_limit"] == 3000
        assert document["tokens_after"] == int(response.headers["x-compaction-tokens-after"])
