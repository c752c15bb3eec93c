"""The summary cache: LRU bounds, single flight in process, and a real Redis shared by two."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from inflight.compaction.summary.cache import MemoryCache, RedisCache, SummaryFlight
from tests.support.redis_server import redis_url

pytestmark = pytest.mark.anyio


async def test_memory_cache_is_bounded_lru() -> None:
    cache = MemoryCache(max_entries=2)
    await cache.set("a", "1")
    await cache.set("b", "2")
    assert await cache.get("a") == "1"  # a is now the most recent
    await cache.set("c", "3")
    assert await cache.get("b") is None
    assert await cache.get("a") == "1"
    assert await cache.get("c") == "3"


async def test_concurrent_identical_requests_share_one_call() -> None:
    flight = SummaryFlight(MemoryCache())
    calls = 0
    gate = anyio.Event()

    async def compute() -> str:
        nonlocal calls
        calls += 1
        await gate.wait()
        return "summary"

    results: list[str] = []

    async def ask() -> None:
        results.append(await flight.get_or_compute("k", compute))

    async with anyio.create_task_group() as tg:
        for _ in range(10):
            tg.start_soon(ask)
        await anyio.wait_all_tasks_blocked()
        gate.set()
    assert results == ["summary"] * 10
    assert calls == 1
    assert await flight.get_or_compute("k", compute) == "summary"
    assert calls == 1


async def test_failure_reaches_every_waiter_and_is_not_cached() -> None:
    flight = SummaryFlight(MemoryCache())
    gate = anyio.Event()

    async def boom() -> str:
        await gate.wait()
        raise RuntimeError("summariser down")

    errors: list[str] = []

    async def ask() -> None:
        try:
            await flight.get_or_compute("k", boom)
        except RuntimeError as exc:
            errors.append(str(exc))

    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(ask)
        await anyio.wait_all_tasks_blocked()
        gate.set()
    assert errors == ["summariser down"] * 3

    async def ok() -> str:
        return "fine"

    assert await flight.get_or_compute("k", ok) == "fine"


@pytest.fixture
async def redis(tmp_path: Path) -> AsyncIterator[str]:
    with redis_url(tmp_path) as url:
        yield url


@pytest.mark.redis
async def test_two_caches_share_summaries_and_one_computes(redis: str) -> None:
    one, two = RedisCache(redis), RedisCache(redis)
    try:
        assert await one.ping()
        calls = 0
        gate, started = anyio.Event(), anyio.Event()

        async def compute() -> str:
            nonlocal calls
            calls += 1
            started.set()
            await gate.wait()
            return "shared summary"

        results: list[str] = []

        async def ask(flight: SummaryFlight) -> None:
            results.append(await flight.get_or_compute("span-1", compute))

        async with anyio.create_task_group() as tg:
            tg.start_soon(ask, SummaryFlight(one, poll=0.01))
            with anyio.fail_after(5):
                await started.wait()  # replica one holds the lock and is computing
            assert await two.lock("span-1", 1.0) is None
            tg.start_soon(ask, SummaryFlight(two, poll=0.01))
            gate.set()
        assert results == ["shared summary", "shared summary"]
        assert calls == 1
        assert await two.get("span-1") == "shared summary"
    finally:
        await one.close()
        await two.close()


@pytest.mark.redis
async def test_a_replica_that_waited_out_the_lock_leaves_the_next_holders_lock(
    redis: str,
) -> None:
    # Replica one takes the lock and dies; replica two waits out its TTL and computes; while
    # it computes, replica three takes the (expired, free) lock. Two must not release it.
    one, two, three = RedisCache(redis), RedisCache(redis), RedisCache(redis)
    try:
        assert await one.lock("span-2", 0.2) is not None
        owner: list[str | None] = []

        async def compute() -> str:
            owner.append(await three.lock("span-2", 30.0))
            return "late summary"

        with anyio.fail_after(5):
            value = await SummaryFlight(two, lock_ttl=0.2, poll=0.01).get_or_compute(
                "span-2", compute
            )
        assert value == "late summary"
        assert owner[0] is not None  # three holds the lock now
        assert await one.lock("span-2", 30.0) is None  # and still does
    finally:
        for cache in (one, two, three):
            await cache.close()


@pytest.mark.redis
async def test_only_the_owner_token_releases_a_redis_lock(redis: str) -> None:
    cache = RedisCache(redis)
    try:
        stale = await cache.lock("span-3", 30.0)
        assert stale is not None
        await cache.unlock("span-3", stale)
        fresh = await cache.lock("span-3", 30.0)  # released by its owner: free again
        assert fresh is not None
        assert fresh != stale
        await cache.unlock("span-3", stale)  # the old owner's token releases nothing
        assert await cache.lock("span-3", 30.0) is None
        await cache.unlock("span-3", fresh)
        assert await cache.lock("span-3", 30.0) is not None
    finally:
        await cache.close()
