"""Two proxy processes sharing one real PostgreSQL and one real Redis (no Docker): a
conversation whose requests alternate between them gets the same compaction and the same
summaries (one summary call per event in total), and both replicas' usage lands in one store."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.test_summarize import agent_log
from tests.support import free_port, request_points
from tests.support.conversations import summary_in
from tests.support.fakes import FakeUpstream
from tests.support.pg_server import postgres_url
from tests.support.redis_server import redis_url
from tests.support.servers import serve

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis]
ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def replica(env: dict[str, str]) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "inflight.cli.commands", "serve", "--port", str(port), "--log-level", "warning"],
        env={**os.environ, **env}, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else "exited"
            try:
                if httpx.get(base + "/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "replica did not become ready"
            time.sleep(0.05)
        yield base
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        if proc.stderr:
            proc.stderr.close()


def test_two_replicas_share_postgres_and_redis(tmp_path: Path) -> None:
    import psycopg

    fake = FakeUpstream()
    fake.context_window = 8192
    fake.enforce_pairs = True
    messages = agent_log(60)
    points = request_points(messages)
    forwarded: list[list[Any]] = []
    with ExitStack() as services:
        pg = services.enter_context(postgres_url())
        with psycopg.connect(pg, autocommit=True) as conn:
            conn.execute("DROP TABLE IF EXISTS inflight_usage, inflight_schema")
        redis = services.enter_context(redis_url(tmp_path))
        upstream = services.enter_context(serve(fake.app)) + "/v1"
        env = {
            "INFLIGHT_UPSTREAM_URL": upstream,
            "INFLIGHT_DATABASE_URL": pg,
            "INFLIGHT_CACHE_URL": redis,
            "INFLIGHT_CONFIG_DIR": str(ROOT / "config"),
            "INFLIGHT_SUMMARY_WAIT": "true",  # each event's request makes its summary
        }
        with ExitStack() as proxies:
            replicas = [proxies.enter_context(replica(env)) for _ in range(2)]
            with httpx.Client(timeout=30) as client:
                for n, k in enumerate(points):
                    body = {"model": "fake-model", "messages": messages[:k], "max_tokens": 256}
                    response = client.post(replicas[n % 2] + "/v1/chat/completions", json=body)
                    assert response.status_code == 200, response.text
                    forwarded.append(fake.chat_requests[-1].json()["messages"])
                # the same request on either replica gets the same compaction
                last = {"model": "fake-model", "messages": messages, "max_tokens": 256}
                previews = [
                    client.post(r + "/v1/compaction/preview", json=last).json() for r in replicas
                ]
            assert previews[0]["messages"] == previews[1]["messages"]
        # both replicas have shut down (SIGTERM) and flushed their usage into the one store
        with psycopg.connect(pg) as conn:
            row = conn.execute(
                "SELECT COUNT(*) FILTER (WHERE kind = 'chat'), "
                "COUNT(*) FILTER (WHERE kind = 'summary') FROM inflight_usage"
            ).fetchone()
    assert row is not None
    summaries = {summary_in(f) for f in forwarded} - {None}
    assert fake.summary_calls == len(summaries) >= 2  # one call per event, not one per replica
    assert fake.rejected == []
    assert row[0] == len(points)
    assert row[1] == fake.summary_calls
