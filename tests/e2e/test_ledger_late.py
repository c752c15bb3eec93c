"""The ledger row's late fields: the fates of its cut's references (worked out after the answer,
off the event loop, bounded) and the realised net of its compaction event from the usage that
followed (DESIGN.md §14, §16); the schema's version 7 on an existing version 6 store."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson
import pytest

from inflight.factory import create_app
from inflight.settings import LedgerMode
from inflight.usage.ledger import LATE_FIELDS, Ledger, LedgerRow, LedgerUpdate
from inflight.usage.ledger_facts import FactsWork
from inflight.usage.records import UsageQueue, UsageStore
from inflight.usage.stores import open_store
from inflight.usage.stores.sql import LEDGER_V7, SCHEMA_VERSION
from inflight.usage.stores.sqlite import SQLiteStore
from tests.conftest import make_settings
from tests.e2e.test_ledger_store import NOW, fresh_postgres, row
from tests.support.fakes.chat import completion
from tests.support.pg_server import postgres_url
from tests.unit.compaction.test_cuts import agent

pytestmark = pytest.mark.anyio
CHAT = "/v1/chat/completions"
WINDOW = {"x-compaction-context-limit": "2048", "x-compaction-strategy": "trim"}
INPUT, CACHED = 2.50, 1.25  # gpt-4o, USD per 1M prompt tokens (config/prices.toml)


@dataclass
class ScriptedUsage:
    """A chat upstream whose answers report the usage of `script`, one entry per request:
    (prompt tokens, cached tokens)."""

    script: list[tuple[int, int]]
    seen: list[dict[str, Any]] = field(default_factory=list)

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(json.loads(request.content))
        prompt, cached = self.script[len(self.seen) - 1]
        body = completion("gpt-4o", "ok", prompt)
        body["usage"]["prompt_tokens_details"]["cached_tokens"] = cached
        return httpx.Response(200, json=body)


class NotedStore(SQLiteStore):
    """Sets `facts_written` once an update with facts has been written."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.facts_written = asyncio.Event()

    async def write_ledger(self, rows: Sequence[LedgerRow | LedgerUpdate]) -> None:
        await super().write_ledger(rows)
        if any(isinstance(r, LedgerUpdate) and r.facts_lost is not None for r in rows):
            self.facts_written.set()


@asynccontextmanager
async def proxy(
    tmp_path: Path, upstream: ScriptedUsage, store: UsageStore | None = None
) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(
        make_settings(tmp_path), transport=httpx.MockTransport(upstream.handle), store=store
    )
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://proxy.test") as c:
            c.app_state = app.state.inflight  # type: ignore[attr-defined]
            yield c


async def ask(client: httpx.AsyncClient, messages: list[dict[str, Any]]) -> httpx.Response:
    body = {"model": "gpt-4o", "messages": messages}
    response = await client.post(CHAT, content=orjson.dumps(body), headers=WINDOW)
    assert response.status_code == 200, response.text
    return response


async def settled_row(client: httpx.AsyncClient, ledger_id: str) -> dict[str, Any]:
    """The row once the references of every row are worked out (a bounded wait)."""
    with anyio.fail_after(10):
        await client.app_state.ledger.facts.idle()  # type: ignore[attr-defined]
    found = await client.get(f"/v1/compaction/ledger/{ledger_id}")
    assert found.status_code == 200
    document: dict[str, Any] = found.json()
    return document


def automatic_hit(reusable: int, prompt: int) -> int:
    """OpenAI's cached prefix (config/prices.toml: 1,024 tokens or more, in 128-token steps)."""
    prefix = min(reusable, prompt)
    return 0 if prefix < 1024 else prefix - prefix % 128


# --- the realised net ---------------------------------------------------------------------------


async def test_the_realised_net_of_a_cut_from_the_requests_that_followed(tmp_path: Path) -> None:
    """An uncompacted request, then the one that cuts (it re-writes its prompt: nothing read
    from the cache), then two that carry the cut forward (one read from the cache, one not):
    the cut's row holds the rewrite less the two savings, worked out by hand."""
    history = agent(rounds=12, size=60)
    short = history[:4]  # fits: forwarded as received
    upstream = ScriptedUsage([(4000, 0), (1500, 0), (1600, 1408), (1700, 0)])
    async with proxy(tmp_path, upstream) as client:
        first = await ask(client, short)
        assert first.headers["x-compaction-applied"] == "none"
        cut = await ask(client, history)
        ledger_id = cut.headers["x-compaction-id"]
        grown = [*history, {"role": "user", "content": "and the next test?"}]
        later = [await ask(client, grown)]
        grown = [*grown, {"role": "assistant", "content": "done"},
                 {"role": "user", "content": "thanks"}]  # fmt: skip
        later.append(await ask(client, grown))
        assert all(r.headers["x-compaction-applied"] != "none" for r in later)
        document = await settled_row(client, ledger_id)
        stats = (await client.get("/stats")).json()
        followers = [await settled_row(client, r.headers["x-compaction-id"]) for r in later]
    removed = document["tokens_before"] - document["tokens_after"]
    assert removed > 0
    # the cut request: 1,500 prompt tokens, none read; its baseline would have read the first
    # request's 4,000-token prompt (OpenAI's automatic prefix) of 1,500 + `removed`
    baseline_prompt = 1500 + removed
    baseline_unread = baseline_prompt - automatic_hit(4000, baseline_prompt)
    rewrite = max(0, 1500 - baseline_unread) * (INPUT - CACHED) / 1e6
    savings = removed * CACHED / 1e6 + removed * INPUT / 1e6  # read from the cache, then not
    assert document["realised_turns"] == 2
    assert document["realised_net"] == pytest.approx(savings - rewrite, abs=1e-9)
    # the requests that carried the cut forward made no event: no realised net of their own
    assert [(f["realised_turns"], f["realised_net"]) for f in followers] == [(None, None)] * 2
    assert stats["cost"]["realised_net"] == pytest.approx(savings - rewrite, abs=1e-9)
    assert stats["ledger"]["realised_events"] == 1
    assert stats["ledger"]["realised_turns"] == 2


async def test_a_cut_followed_by_no_request_has_no_realised_turn(tmp_path: Path) -> None:
    upstream = ScriptedUsage([(1500, 0)])
    async with proxy(tmp_path, upstream) as client:
        cut = await ask(client, agent(rounds=12, size=60))
        document = await settled_row(client, cut.headers["x-compaction-id"])
    assert document["realised_turns"] == 0
    # first sight of the conversation: its baseline reads nothing either, so no rewrite
    assert document["realised_net"] == 0.0


# --- the references of the cut ------------------------------------------------------------------


async def test_the_row_counts_the_cut_references_as_the_preview_does(tmp_path: Path) -> None:
    messages = agent(rounds=12, size=60, text="src/app/main.py:42 raised KeyError")
    upstream = ScriptedUsage([(1500, 0)])
    store = NotedStore(f"sqlite:///{tmp_path / 'u.db'}")
    async with proxy(tmp_path, upstream, store) as client:
        # previewed first: the answer's usage then calibrates the counter (another plan)
        preview = await client.post(
            "/v1/compaction/preview",
            content=orjson.dumps({"model": "gpt-4o", "messages": messages}),
            headers=WINDOW,
        )
        cut = await ask(client, messages)
        document = await settled_row(client, cut.headers["x-compaction-id"])
        with anyio.fail_after(10):
            await store.facts_written.wait()
        stats = (await client.get("/stats")).json()
    facts = preview.json()["report"]["facts"]
    assert facts["references"] > 0
    assert (document["facts_retained"], document["facts_restorable"], document["facts_lost"]) == (
        facts["retained"], facts["restorable"], facts["lost"],
    )  # fmt: skip
    ledger = stats["ledger"]
    assert (ledger["rows"], ledger["rows_with_facts"]) == (1, 1)
    assert ledger["facts_lost"] == facts["lost"]
    assert ledger["lost_per_event"] == pytest.approx(facts["lost"])


@dataclass(frozen=True)
class FakeCompacted:
    ledger_id: str
    facts: Any
    strategies: tuple[str, ...] = ("trim",)
    tokens_before: int = 100
    tokens_after: int = 50
    context_limit: int = 2048
    economics: Any = None
    cuts: tuple[Any, ...] = ()


@dataclass(frozen=True)
class FakeExchange:
    compacted: Any
    route: str = CHAT
    model: str = "gpt-4o"
    client_key_id: str | None = "k1"


async def test_working_out_references_never_holds_up_the_request_path() -> None:
    """`record` returns at once while the references are being worked out in a thread; the
    row reads null facts meanwhile, then the counts."""
    queue = UsageQueue(SQLiteStore("sqlite:///:memory:"))
    ledger = Ledger(LedgerMode.META, 60.0, queue, SQLiteStore("sqlite:///:memory:"))
    release, entered = threading.Event(), threading.Event()

    def slow() -> Mapping[str, int]:
        entered.set()
        assert release.wait(10)
        return {"references": 5, "retained": 3, "restorable": 1, "lost": 1}

    ledger.record(FakeExchange(FakeCompacted("row-1", slow)))  # type: ignore[arg-type]
    await asyncio.to_thread(entered.wait, 10)
    pending = orjson.loads(await ledger.read("row-1", "k1"))
    assert {name: pending[name] for name in LATE_FIELDS} == dict.fromkeys(LATE_FIELDS)
    release.set()
    with anyio.fail_after(10):
        await ledger.facts.idle()
    done = orjson.loads(await ledger.read("row-1", "k1"))
    assert (done["facts_retained"], done["facts_restorable"], done["facts_lost"]) == (3, 1, 1)
    await ledger.aclose()


async def test_rows_beyond_the_backlog_keep_null_facts() -> None:
    done: list[str] = []
    work = FactsWork(lambda ledger_id, facts: done.append(ledger_id), backlog=2)
    release = threading.Event()

    def blocked() -> Mapping[str, int]:
        assert release.wait(10)
        return {"references": 0, "retained": 0, "restorable": 0, "lost": 0}

    for n in range(6):
        work.start(f"r{n}", blocked)
    assert work.skipped == 3  # one running, two waiting
    release.set()
    with anyio.fail_after(10):
        await work.idle()
    assert done == ["r0", "r1", "r2"]


# --- version 7 on a version 6 store ---------------------------------------------------------------


async def check_v7(store: UsageStore) -> None:
    """The row written by version 6 reads with null late fields; updates set them (absolute:
    written twice, the same), a NULL keeps a column, and `/stats` sums them."""
    await store.open()
    try:
        old = orjson.loads(await store.read_ledger("v6", "k1", NOW) or b"null")
        assert old["id"] == "v6"
        assert {name: old[name] for name in LATE_FIELDS} == dict.fromkeys(LATE_FIELDS)
        facts = LedgerUpdate("v6", facts_retained=4, facts_restorable=1, facts_lost=2)
        realised = LedgerUpdate("v6", realised_net=-0.25, realised_turns=0)
        later = LedgerUpdate("v6", realised_net=0.5, realised_turns=3)
        await store.write_ledger([row("new"), facts, realised, later, later])
        found = orjson.loads(await store.read_ledger("v6", "k1", NOW) or b"null")
        assert {name: found[name] for name in LATE_FIELDS} == {
            "facts_retained": 4, "facts_restorable": 1, "facts_lost": 2,
            "realised_net": 0.5, "realised_turns": 3,
        }  # fmt: skip
        stats = await store.totals()
        assert stats["ledger"] == {
            "rows": 2, "rows_with_facts": 1, "facts_retained": 4, "facts_restorable": 1,
            "facts_lost": 2, "lost_per_event": 2.0, "realised_events": 1, "realised_turns": 3,
            "realised_net": 0.5,
        }  # fmt: skip
        assert stats["cost"]["realised_net"] == 0.5
    finally:
        await store.close()


async def test_a_version_6_sqlite_store_gains_the_late_fields(tmp_path: Path) -> None:
    path = tmp_path / "u.db"
    store = open_store(f"sqlite:///{path}")
    await store.open()
    await store.close()
    with sqlite3.connect(path) as conn:  # as version 6 left it
        for name in LATE_FIELDS:
            conn.execute(f"ALTER TABLE inflight_ledger DROP COLUMN {name}")
        conn.execute("UPDATE inflight_schema SET version = 6")
        conn.execute(
            "INSERT INTO inflight_ledger VALUES ('v6', 'k1', ?, ?, ?)",
            (NOW, NOW + 60, orjson.dumps({"id": "v6", "cuts": []}).decode()),
        )
    await check_v7(open_store(f"sqlite:///{path}"))
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT version FROM inflight_schema").fetchone()[0] == SCHEMA_VERSION
    assert SCHEMA_VERSION == 7
    assert len(LEDGER_V7) == len(LATE_FIELDS)


@pytest.fixture(scope="module")
def pg() -> Iterator[str]:
    with postgres_url() as url:
        yield url


@pytest.mark.postgres
async def test_a_version_6_postgres_store_gains_the_late_fields(pg: str) -> None:
    import psycopg

    await fresh_postgres(pg)
    async with await psycopg.AsyncConnection.connect(pg, autocommit=True) as conn:
        for name in LATE_FIELDS:
            await conn.execute(f"ALTER TABLE inflight_ledger DROP COLUMN {name}")
        await conn.execute("UPDATE inflight_schema SET version = 6")
        await conn.execute(
            "INSERT INTO inflight_ledger VALUES ('v6', 'k1', %s, %s, %s)",
            (NOW, NOW + 60, orjson.dumps({"id": "v6", "cuts": []}).decode()),
        )
    await check_v7(open_store(pg))
    async with await psycopg.AsyncConnection.connect(pg, autocommit=True) as conn:
        cursor = await conn.execute("SELECT version FROM inflight_schema")
        assert (await cursor.fetchone()) == (SCHEMA_VERSION,)


def test_updates_survive_the_spill_file(tmp_path: Path) -> None:
    from inflight.usage.stores.spill import SpillFile

    spill = SpillFile(tmp_path / "spill.jsonl")
    update = LedgerUpdate("r", facts_lost=3, realised_net=-0.5, realised_turns=0)
    spill.append([update])
    path = spill.take()
    assert path is not None
    assert list(spill.batches(path, 10)) == [[update]]


def test_inflight_stats_prints_the_ledger_lines() -> None:
    from inflight.cli.stats_table import render_stats

    stats = {
        "requests": 3,
        "cost": {"actual": 1.0, "baseline": 2.0, "saved": 1.0, "summaries": 0.0},
        "ledger": {
            "rows": 2, "rows_with_facts": 2, "facts_retained": 5, "facts_restorable": 1,
            "facts_lost": 4, "lost_per_event": 2.0, "realised_events": 1, "realised_turns": 3,
            "realised_net": 0.0123,
        },
    }  # fmt: skip
    text = render_stats(stats)
    assert "realised net of 1 compaction events $0.0123 over 3 requests after them" in text
    assert "5 retained, 1 restorable, 4 lost (2.0 lost per event, 2 events)" in text


async def test_another_client_never_carries_a_clients_event_forward(tmp_path: Path) -> None:
    """Two clients with the same model and pinned head: the second one's requests carrying the
    same cut are not the first one's followers (its row is the first client's alone)."""
    history = agent(rounds=12, size=60)
    grown = [*history, {"role": "user", "content": "and the next test?"}]
    upstream = ScriptedUsage([(1500, 0), (1500, 0), (1600, 1408)])

    async def ask_as(client: httpx.AsyncClient, key: str, messages: Any) -> httpx.Response:
        body = orjson.dumps({"model": "gpt-4o", "messages": messages})
        headers = {**WINDOW, "authorization": f"Bearer {key}"}
        response = await client.post(CHAT, content=body, headers=headers)
        assert response.status_code == 200, response.text
        return response

    async with proxy(tmp_path, upstream) as client:
        cut = await ask_as(client, "sk-a", history)
        await ask_as(client, "sk-b", history)  # B's own event
        await ask_as(client, "sk-b", grown)  # carries B's cut forward, not A's
        with anyio.fail_after(10):
            await client.app_state.ledger.facts.idle()  # type: ignore[attr-defined]
        found = await client.get(
            f"/v1/compaction/ledger/{cut.headers['x-compaction-id']}",
            headers={"authorization": "Bearer sk-a"},
        )
    assert found.status_code == 200
    assert found.json()["realised_turns"] == 0
