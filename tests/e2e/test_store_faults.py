"""The fault tier of the usage store (DESIGN.md §6, nothing lost): a real uvicorn proxy under
concurrent load over the three APIs, a real PostgreSQL and a real Redis started here, each
stopped mid-load and started again. Every answered request has exactly one usage row afterwards
(matched by the model name each request carries alone), `/stats` says 503 while the store is
down, and rows spilled to the file survive a SIGKILL of the proxy."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
import psycopg
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from inflight.factory import create_app
from tests.conftest import make_settings
from tests.support import free_port
from tests.support.pg_server import Cluster, postgres_cluster
from tests.support.redis_server import redis_server
from tests.support.servers import serve

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis, pytest.mark.timeout(90)]
ROOT = Path(__file__).resolve().parents[2]
CONCURRENCY = 16
PHASE = 100  # requests answered before, during and after an outage (at least)


async def chat(request: Request) -> Response:
    body = orjson.loads(await request.body())
    return JSONResponse({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": body["model"],
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10},
    })  # fmt: skip


async def responses(request: Request) -> Response:
    body = orjson.loads(await request.body())
    text = {"type": "output_text", "text": "ok", "annotations": []}
    return JSONResponse({
        "id": "resp_1", "object": "response", "created_at": 1, "status": "completed",
        "model": body["model"], "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
        "output": [{"type": "message", "id": "msg_1", "status": "completed",
                    "role": "assistant", "content": [text]}],
        "usage": {"input_tokens": 9, "input_tokens_details": {"cached_tokens": 0},
                  "output_tokens": 1, "output_tokens_details": {"reasoning_tokens": 0},
                  "total_tokens": 10},
    })  # fmt: skip


async def messages(request: Request) -> Response:
    body = orjson.loads(await request.body())
    return JSONResponse({
        "id": "msg_1", "type": "message", "role": "assistant", "model": body["model"],
        "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn",
        "stop_sequence": None, "usage": {"input_tokens": 9, "output_tokens": 1},
    })  # fmt: skip


def upstream_app() -> Starlette:
    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/responses", responses, methods=["POST"]),
            Route("/v1/messages", messages, methods=["POST"]),
        ]
    )


def request_for(tag: str, n: int) -> tuple[str, dict[str, Any], dict[str, str]]:
    """Request `n` of the load, over the three APIs in turn; its model is its own `tag`."""
    text = f"request {tag}"
    if n % 3 == 0:
        return (
            "/v1/chat/completions",
            {"model": tag, "messages": [{"role": "user", "content": text}]},
            {},
        )
    if n % 3 == 1:
        return "/v1/responses", {"model": tag, "input": text}, {}
    headers = {"x-api-key": "k", "anthropic-version": "2023-06-01"}
    body = {"model": tag, "max_tokens": 16, "messages": [{"role": "user", "content": text}]}
    return "/v1/messages", body, headers


class Load:
    """`CONCURRENCY` clients sending requests in a thread of their own until `stop`; records
    which tags were answered, and with which status."""

    def __init__(self, base: str) -> None:
        self._base = base
        self.answered: dict[str, int] = {}
        self._changed = threading.Condition()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(30)
        assert not self._thread.is_alive(), "the load did not stop"

    async def _main(self) -> None:
        limits = httpx.Limits(max_connections=CONCURRENCY)
        async with httpx.AsyncClient(base_url=self._base, timeout=30, limits=limits) as client:
            await asyncio.gather(*(self._client(client, w) for w in range(CONCURRENCY)))

    async def _client(self, client: httpx.AsyncClient, worker: int) -> None:
        n = worker
        while not self._stopping.is_set():
            tag = f"t{worker}-{n}"
            path, body, headers = request_for(tag, n)
            response = await client.post(path, json=body, headers=headers)
            with self._changed:
                self.answered[tag] = response.status_code
                self._changed.notify_all()
            n += CONCURRENCY

    def wait(
        self, more: int, until: Callable[[], bool] = lambda: True, timeout: float = 45
    ) -> None:
        """Until `more` further requests were answered and `until()` holds (bounded)."""
        with self._changed:
            target = len(self.answered) + more
            done = lambda: len(self.answered) >= target and until()  # noqa: E731
            assert self._changed.wait_for(done, timeout), f"{len(self.answered)} answered"


def fresh_tables(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS inflight_usage, inflight_schema, inflight_ledger")


def chat_rows(url: str) -> tuple[dict[str, int], int, int]:
    """Per model (tag), its usage rows; all rows; distinct request ids."""
    with psycopg.connect(url) as conn:
        by_model = conn.execute(
            "SELECT model, COUNT(*) FROM inflight_usage WHERE kind = 'chat' GROUP BY model"
        ).fetchall()
        total, distinct = conn.execute(
            "SELECT COUNT(*), COUNT(DISTINCT request_id) FROM inflight_usage"
        ).fetchone() or (0, 0)
    return {str(model): int(n) for model, n in by_model}, int(total), int(distinct)


def assert_one_row_each(url: str, answered: dict[str, int]) -> None:
    assert set(answered.values()) == {200}, answered
    rows, total, distinct = chat_rows(url)
    assert rows == dict.fromkeys(answered, 1)  # every answered request, once; nothing else
    assert total == distinct == len(answered)


@pytest.fixture(scope="module")
def pg() -> Iterator[Cluster]:
    with postgres_cluster() as cluster:
        yield cluster


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    with serve(upstream_app()) as url:
        yield url + "/v1"


def test_postgres_restart_mid_load_loses_and_doubles_nothing(
    tmp_path: Path, pg: Cluster, upstream: str
) -> None:
    fresh_tables(pg.url)
    spill = tmp_path / "spill.jsonl"
    settings = make_settings(
        tmp_path, upstream_url=upstream, anthropic_upstream_url=upstream,
        database_url=pg.url, usage_spill_path=spill, usage_spill_after=1.0,
    )  # fmt: skip
    app = create_app(settings)
    queue = app.state.inflight.queue
    with serve(app) as base, Load(base) as load:
        load.wait(PHASE)
        pg.stop()
        # down long enough that batches are spilled (past `usage_spill_after`)
        load.wait(PHASE, until=lambda: queue.spilled > 0)
        stats = httpx.get(base + "/stats", timeout=10)
        assert stats.status_code == 503
        assert stats.json()["error"]["code"] == "store_unavailable"
        pg.start()
        load.wait(PHASE, until=lambda: queue.replayed >= queue.spilled)
        load.stop()
        assert httpx.get(base + "/stats", timeout=10).status_code == 200
    assert (queue.failed, queue.dropped) == (0, 0)
    assert queue.replayed == queue.spilled > 0
    assert not spill.exists()
    assert not spill.with_name(spill.name + ".replay").exists()
    assert_one_row_each(pg.url, load.answered)


def test_redis_restart_mid_load_loses_nothing(tmp_path: Path, pg: Cluster, upstream: str) -> None:
    fresh_tables(pg.url)
    with redis_server(tmp_path) as redis:
        settings = make_settings(
            tmp_path, upstream_url=upstream, anthropic_upstream_url=upstream,
            database_url=pg.url, cache_url=redis.url,
        )  # fmt: skip
        app = create_app(settings)
        with serve(app) as base, Load(base) as load:
            load.wait(PHASE)
            redis.stop()
            load.wait(PHASE)
            redis.start()
            load.wait(PHASE)
            load.stop()
        queue = app.state.inflight.queue
        assert (queue.failed, queue.dropped, queue.spilled) == (0, 0, 0)
    assert_one_row_each(pg.url, load.answered)


@contextmanager
def proxy_process(env: dict[str, str]) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "inflight.cli.commands", "serve", "--port", str(port), "--log-level", "warning"],
        env={**os.environ, **env}, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, "the proxy exited"
            try:
                if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the proxy did not start"
            time.sleep(0.05)
        yield base, proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def wait_until(check: Callable[[], bool], what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def spilled_lines(path: Path) -> int:
    return len(path.read_bytes().splitlines()) if path.exists() else 0


def test_spilled_rows_survive_a_sigkill_and_are_written_at_the_next_start(
    tmp_path: Path, pg: Cluster, upstream: str
) -> None:
    fresh_tables(pg.url)
    spill = tmp_path / "spill.jsonl"
    env = {
        "INFLIGHT_UPSTREAM_URL": upstream,
        "INFLIGHT_ANTHROPIC_UPSTREAM_URL": upstream,
        "INFLIGHT_DATABASE_URL": pg.url,
        "INFLIGHT_CONFIG_DIR": str(ROOT / "config"),
        "INFLIGHT_USAGE_SPILL_PATH": str(spill),
        "INFLIGHT_USAGE_SPILL_AFTER": "0.5",
    }
    answered: dict[str, int] = {}
    with proxy_process(env) as (base, proc):
        pg.stop()
        with httpx.Client(base_url=base, timeout=10) as client:
            for n in range(30):
                path, body, headers = request_for(f"k{n}", n)
                answered[f"k{n}"] = client.post(path, json=body, headers=headers).status_code
        wait_until(lambda: spilled_lines(spill) >= len(answered), "rows spilled")
        proc.kill()  # SIGKILL: no shutdown, no flush
        proc.wait(10)
    pg.start()
    with proxy_process(env):  # replays the spill file at startup
        wait_until(lambda: sum(chat_rows(pg.url)[0].values()) >= len(answered), "rows replayed")
    assert_one_row_each(pg.url, answered)
    assert not spill.exists()
