"""A proxy started while its PostgreSQL is down (DESIGN.md §6, nothing lost): it starts and
answers, `/stats` says 503 `store_unavailable` and `/readyz` says the store is not ready, what it
records is spilled; once the database is started, the schema is created, the spill file replayed,
and every answered request has exactly one usage row."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from inflight.factory import create_app
from tests.conftest import make_settings
from tests.e2e.test_store_faults import PHASE, Load, assert_one_row_each, upstream_app, wait_until
from tests.support.pg_server import Cluster, postgres_cluster
from tests.support.servers import serve

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.timeout(90)]


@pytest.fixture
def pg() -> Iterator[Cluster]:
    with postgres_cluster() as cluster:
        yield cluster


@pytest.fixture
def upstream() -> Iterator[str]:
    with serve(upstream_app()) as url:
        yield url + "/v1"


def store_ready(base: str) -> bool | None:
    """What `/readyz` says of the usage store."""
    found: bool | None = httpx.get(base + "/readyz", timeout=10).json()["store"]
    return found


def test_a_proxy_started_with_its_database_down_loses_nothing(
    tmp_path: Path, pg: Cluster, upstream: str
) -> None:
    spill = tmp_path / "spill.jsonl"
    settings = make_settings(
        tmp_path, upstream_url=upstream, anthropic_upstream_url=upstream,
        database_url=pg.url, usage_spill_path=spill, usage_spill_after=0.5, ready_interval=0.2,
    )  # fmt: skip
    pg.stop()
    app = create_app(settings)
    queue = app.state.inflight.queue
    with serve(app) as base, Load(base) as load:
        load.wait(PHASE, until=lambda: queue.spilled > 0)
        stats = httpx.get(base + "/stats", timeout=10)
        assert stats.status_code == 503
        assert stats.json()["error"]["code"] == "store_unavailable"
        assert store_ready(base) is False
        pg.start()
        load.wait(PHASE, until=lambda: queue.replayed >= queue.spilled)
        load.stop()
        wait_until(lambda: store_ready(base) is True, "the store never became ready")
        assert httpx.get(base + "/stats", timeout=10).status_code == 200
    assert (queue.failed, queue.dropped) == (0, 0)
    assert queue.replayed == queue.spilled > 0
    assert not spill.exists()
    assert_one_row_each(pg.url, load.answered)
