"""Usage under load through real servers: one record per request, token sums that match the
upstream, client disconnects recorded, and nothing lost on SIGTERM."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from inflight.factory import create_app
from tests.conftest import make_settings
from tests.support import free_port
from tests.support.fakes import FakeUpstream, Pacing
from tests.support.servers import serve

pytestmark = pytest.mark.e2e
MESSAGES = [{"role": "user", "content": "hello"}]


def rows(db: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as conn:
        return conn.execute(
            "SELECT kind, stream, status, outcome, prompt_tokens, completion_tokens "
            "FROM inflight_usage"
        ).fetchall()


@pytest.fixture
def upstream(fake: FakeUpstream) -> Iterator[str]:
    fake.reply_text = "one two three"
    with serve(fake.app) as url:
        yield url + "/v1"


def test_one_record_per_request_under_load(tmp_path: Path, upstream: str) -> None:
    db = tmp_path / "usage.db"
    settings = make_settings(tmp_path, upstream_url=upstream, database_url=f"sqlite:///{db}")
    plan = ["json", "stream", "stream_usage", "disconnect"] * 500  # 2,000 requests
    outcomes: list[str] = []

    async def one(client: httpx.AsyncClient, url: str, kind: str) -> None:
        body: dict[str, Any] = {"model": "m", "messages": MESSAGES, "stream": kind != "json"}
        if kind == "stream_usage":
            body["stream_options"] = {"include_usage": True}
        if kind == "disconnect":
            body["x_test_hold"] = True
            async with client.stream("POST", url, json=body) as r:
                async for _ in r.aiter_raw():
                    break  # hang up after the first chunk, while the upstream holds the rest
            outcomes.append(kind)
            return
        response = await client.post(url, json=body)
        assert response.status_code == 200
        outcomes.append(kind)

    async def run(base: str) -> None:
        limiter = anyio.CapacityLimiter(32)
        limits = httpx.Limits(max_connections=64)
        async with httpx.AsyncClient(timeout=30, limits=limits) as client:

            async def guarded(kind: str) -> None:
                async with limiter:
                    await one(client, base + "/v1/chat/completions", kind)

            with anyio.fail_after(240):
                async with anyio.create_task_group() as tg:
                    for kind in plan:
                        tg.start_soon(guarded, kind)

    with serve(create_app(settings)) as base:
        anyio.run(run, base)
        # wait (bounded) for disconnected streams to finish recording
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            stats = httpx.get(base + "/stats", timeout=10).json()
            if stats["requests"] + stats["usage_queue"]["depth"] >= len(plan):
                break
            time.sleep(0.1)
    assert len(outcomes) == len(plan)
    records = rows(db)
    assert len(records) == len(plan)  # exactly one per request, after the flush at shutdown
    completed = [r for r in records if r[3] == "completed"]
    disconnected = [r for r in records if r[3] == "client_disconnected"]
    assert len(disconnected) == plan.count("disconnect")
    assert len(completed) == len(plan) - plan.count("disconnect")
    # token sums equal what the upstream reported: 11 prompt tokens; 2 completion (JSON) or
    # one per word (streams)
    assert sum(r[4] for r in completed) == 11 * len(completed)
    expected_completion = 2 * plan.count("json") + 3 * (
        plan.count("stream") + plan.count("stream_usage")
    )
    assert sum(r[5] for r in completed) == expected_completion


@contextmanager
def proxy_process(tmp_path: Path, upstream: str) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """`inflight serve` in its own process (SIGTERM, RSS), usage in `tmp_path/usage.db`."""
    port = free_port()
    env = {
        **os.environ,
        "INFLIGHT_DATABASE_URL": f"sqlite:///{tmp_path / 'usage.db'}",
        "INFLIGHT_CONFIG_DIR": str(Path(__file__).resolve().parents[2] / "config"),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "inflight.cli.commands", "serve", "--port", str(port), "--upstream", upstream,
         "--log-level", "warning", "--graceful-timeout", "20"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "proxy did not start"
            assert proc.poll() is None, "proxy exited at startup"
            time.sleep(0.05)
        yield proc, base
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_sigterm_under_load_keeps_every_completed_record(tmp_path: Path, upstream: str) -> None:
    db = tmp_path / "usage.db"
    completed = 0
    with proxy_process(tmp_path, upstream) as (proc, base):

        async def load() -> None:
            nonlocal completed
            sent = 0
            async with httpx.AsyncClient(timeout=10) as client:

                async def one(stream: bool) -> None:
                    nonlocal completed
                    body = {"model": "m", "messages": MESSAGES, "stream": stream}
                    try:
                        response = await client.post(base + "/v1/chat/completions", json=body)
                    except httpx.HTTPError:
                        return
                    if response.status_code == 200 and (
                        not stream or b"[DONE]" in response.content
                    ):
                        completed += 1

                with anyio.fail_after(60):
                    async with anyio.create_task_group() as tg:
                        while sent < 600:
                            tg.start_soon(one, sent % 2 == 0)
                            sent += 1
                            if sent == 300:
                                proc.send_signal(signal.SIGTERM)
                            await anyio.sleep(0.002)

        anyio.run(load)
        # uvicorn drains, runs the lifespan shutdown (flushing usage), then re-raises SIGTERM
        assert proc.wait(30) in (0, -signal.SIGTERM)
    records = [r for r in rows(db) if r[3] == "completed"]
    assert completed > 0
    assert len(records) >= completed


def test_sigterm_lets_an_in_flight_stream_finish(
    tmp_path: Path, fake: FakeUpstream, upstream: str
) -> None:
    """Graceful shutdown: new connections are refused, the stream in flight completes within
    the grace period, and its usage is flushed before the process exits."""
    fake.pacing = pacing = Pacing()
    body = {"model": "m", "messages": MESSAGES, "stream": True}
    with proxy_process(tmp_path, upstream) as (proc, base):
        received: list[bytes] = []
        with (
            httpx.Client(timeout=30) as client,
            client.stream("POST", base + "/v1/chat/completions", json=body) as response,
        ):
            chunks = response.iter_raw()
            received.append(next(chunks))  # the upstream now holds the rest of the stream
            assert pacing.first_sent.wait(10)
            proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 10
            while True:  # the listening socket closes: a new connection is refused
                try:
                    httpx.get(base + "/healthz", timeout=1)
                except httpx.ConnectError:
                    break
                assert time.monotonic() < deadline, "still accepting after SIGTERM"
                time.sleep(0.05)
            assert proc.poll() is None  # still draining the stream in flight
            pacing.release.set()
            received.extend(chunks)
        assert b"data: [DONE]" in b"".join(received)
        assert proc.wait(30) in (0, -signal.SIGTERM)
    assert [(r[1], r[3], r[5]) for r in rows(tmp_path / "usage.db")] == [(1, "completed", 3)]


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_hundreds_of_concurrent_streams_keep_memory_flat(tmp_path: Path, upstream: str) -> None:
    """Waves of 300 concurrent streaming clients: no errors, and the proxy's resident memory
    after the last wave is within a few MiB of where it was after the first."""
    clients, waves = 300, 4
    body = {"model": "m", "messages": MESSAGES, "stream": True}
    with proxy_process(tmp_path, upstream) as (proc, base):
        rss: list[int] = []

        async def wave() -> list[bool]:
            results: list[bool] = []
            limits = httpx.Limits(max_connections=clients, max_keepalive_connections=0)
            async with httpx.AsyncClient(timeout=60, limits=limits) as client:

                async def one() -> None:
                    response = await client.post(base + "/v1/chat/completions", json=body)
                    results.append(
                        response.status_code == 200 and response.text.endswith("data: [DONE]\n\n")
                    )

                with anyio.fail_after(120):
                    async with anyio.create_task_group() as tg:
                        for _ in range(clients):
                            tg.start_soon(one)
            return results

        for _ in range(waves):
            results = anyio.run(wave)
            assert len(results) == clients
            assert all(results)
            rss.append(_rss_kib(proc.pid))
    growth = rss[-1] - rss[0]
    assert growth < 8 * 1024, f"RSS grew {growth} KiB over {waves - 1} waves: {rss}"
