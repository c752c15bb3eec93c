"""Security and truth of `/readyz`: it needs no key, so it answers from one background probe
(never a probe per hit: a flood of `/readyz` is no flood upstream with the operator's key), and
it says not ready when the usage store or the summary cache hangs."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from fastapi import FastAPI

from inflight.factory import create_app
from inflight.http.readiness import Readiness
from tests.conftest import make_settings
from tests.support.servers import WatchedStore

pytestmark = pytest.mark.anyio

KEY = "sk-operator-0001"


class Probed:
    """A fake upstream counting the readiness probes (`GET …/models`)."""

    def __init__(self) -> None:
        self.models = 0
        self.up = True
        self.probed = anyio.Event()  # set at each probe

    async def next_probes(self, n: int) -> None:
        for _ in range(n):
            self.probed = anyio.Event()
            with anyio.fail_after(5):
                await self.probed.wait()

    def transport(self) -> httpx.MockTransport:
        def handle(request: httpx.Request) -> httpx.Response:
            if request.url.path.endswith("/models"):
                self.models += 1
                self.probed.set()
            if not self.up:
                raise httpx.ConnectError("refused", request=request)
            return httpx.Response(200, json={"object": "list", "data": []})

        return httpx.MockTransport(handle)


class FrozenStore(WatchedStore):
    """A store whose ping never answers (a database that stopped answering)."""

    def __init__(self) -> None:
        super().__init__()
        self.frozen = anyio.Event()

    async def ping(self) -> bool:
        await self.frozen.wait()  # never set
        return True


def _app(tmp_path: Path, probed: Probed, **settings: Any) -> FastAPI:
    return create_app(
        make_settings(tmp_path, upstream_api_key=KEY, **settings), transport=probed.transport()
    )


def _client(app: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy")


async def test_a_hundred_readyz_hits_make_at_most_one_upstream_probe(tmp_path: Path) -> None:
    probed = Probed()
    app = _app(tmp_path, probed)
    async with app.router.lifespan_context(app), _client(app) as client:
        answers = [await client.get("/readyz") for _ in range(50)]
        async with anyio.create_task_group() as group:  # and 50 at once
            for _ in range(50):
                group.start_soon(client.get, "/readyz")
    assert all(a.status_code == 200 for a in answers)
    assert answers[-1].json()["ready"] is True
    assert 1 <= probed.models <= 2


async def test_readyz_without_the_lifespan_probes_nothing(tmp_path: Path) -> None:
    probed = Probed()
    app = _app(tmp_path, probed)
    async with _client(app) as client:
        for _ in range(20):
            assert (await client.get("/readyz")).status_code == 503
    assert probed.models == 0


async def test_the_probe_runs_on_its_interval_and_readyz_follows_it(tmp_path: Path) -> None:
    probed = Probed()
    app = _app(tmp_path, probed, ready_interval=0.05)
    async with app.router.lifespan_context(app), _client(app) as client:
        assert (await client.get("/readyz")).status_code == 200
        probed.up = False
        await probed.next_probes(2)  # the second began after the first, all down, ended
        response = await client.get("/readyz")
        assert response.status_code == 503
        assert response.json()["upstream"] is False
        assert response.json()["store"] is True
        probed.up = True
        await probed.next_probes(2)
        assert (await client.get("/readyz")).status_code == 200


async def test_a_store_that_hangs_is_not_ready_within_the_timeout(tmp_path: Path) -> None:
    probed = Probed()
    app = create_app(
        make_settings(tmp_path, ready_timeout=0.2),
        transport=probed.transport(),
        store=FrozenStore(),
    )
    async with app.router.lifespan_context(app), _client(app) as client:
        with anyio.fail_after(5):
            response = await client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["store"] is False
    assert response.json()["upstream"] is True


async def test_a_frozen_cache_is_not_ready() -> None:
    async def fine() -> bool:
        return True

    async def frozen() -> bool:
        await asyncio.Event().wait()
        return True

    async def broken() -> bool:
        raise ConnectionError("redis went away")

    readiness = Readiness(
        {"store": fine, "upstream": fine, "cache": frozen}, interval=60, timeout=0.1
    )
    with anyio.fail_after(5):
        state = await readiness.probe()
    assert state.checks == {"store": True, "upstream": True, "cache": False}
    assert not state.ready
    readiness = Readiness({"cache": broken}, interval=60, timeout=0.1)
    assert (await readiness.probe()).checks == {"cache": False}


async def test_the_probe_task_ends_with_the_lifespan(tmp_path: Path) -> None:
    probed = Probed()
    app = _app(tmp_path, probed, ready_interval=0.01)
    async with app.router.lifespan_context(app), _client(app) as client:
        await client.get("/readyz")
    names = {task.get_name() for task in asyncio.all_tasks()}
    assert "inflight-readiness" not in names


async def test_an_unreachable_redis_cache_is_not_ready(tmp_path: Path) -> None:
    probed = Probed()
    app = _app(tmp_path, probed, cache_url="redis://127.0.0.1:1/0", ready_timeout=1.0)
    async with app.router.lifespan_context(app), _client(app) as client:
        with anyio.fail_after(5):
            response = await client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["cache"] is False
    assert response.json()["store"] is True


async def test_without_any_readyz_hit_the_probe_still_runs_each_interval(tmp_path: Path) -> None:
    probed = Probed()
    app = _app(tmp_path, probed, ready_interval=0.05)
    async with app.router.lifespan_context(app):
        await probed.next_probes(2)
    assert app.state.inflight.readiness.probes >= 2
