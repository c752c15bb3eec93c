"""The summary cache: content-hash keys, in-process by default, Redis when `CACHE_URL` is set.

Summaries are the only thing inflight remembers (DESIGN.md §4.7). The cache also makes
concurrent identical summary requests share one upstream call: in-process with one future per
key, across replicas with a short Redis lock that the others wait on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Protocol

from app.compaction.summary.prompt import SummaryFailed

logger = logging.getLogger(__name__)

PREFIX = "inflight:summary:"


class SummaryCache(Protocol):
    """Where finished summaries live, keyed by a hash of what they summarise."""

    async def get(self, key: str) -> str | None: ...

    async def set(self, key: str, value: str) -> None: ...

    async def lock(self, key: str, ttl: float) -> bool:
        """Try to become the one replica computing `key` (True when acquired)."""

    async def unlock(self, key: str) -> None: ...

    async def close(self) -> None: ...


class MemoryCache:
    """A bounded LRU, private to this process."""

    def __init__(self, max_entries: int = 10_000) -> None:
        self._data: OrderedDict[str, str] = OrderedDict()
        self._max = max_entries

    async def get(self, key: str) -> str | None:
        value = self._data.get(key)
        if value is not None:
            self._data.move_to_end(key)
        return value

    async def set(self, key: str, value: str) -> None:
        self._data[key] = value
        self._data.move_to_end(key)
        while len(self._data) > self._max:
            self._data.popitem(last=False)

    async def lock(self, key: str, ttl: float) -> bool:
        return True  # the in-process single flight already serialises this process

    async def unlock(self, key: str) -> None:
        return None

    async def close(self) -> None:
        return None


class RedisCache:
    """Summaries shared by every replica through Redis (`INFLIGHT_CACHE_URL=redis://…`)."""

    def __init__(self, url: str, ttl_seconds: int = 7 * 24 * 3600) -> None:
        import redis.asyncio as redis

        self._redis = redis.Redis.from_url(url, decode_responses=True)
        self._ttl = ttl_seconds

    async def get(self, key: str) -> str | None:
        value = await self._redis.get(PREFIX + key)
        return value if isinstance(value, str) else None

    async def set(self, key: str, value: str) -> None:
        await self._redis.set(PREFIX + key, value, ex=self._ttl)

    async def lock(self, key: str, ttl: float) -> bool:
        acquired = await self._redis.set(PREFIX + key + ":lock", "1", nx=True, px=int(ttl * 1000))
        return bool(acquired)

    async def unlock(self, key: str) -> None:
        await self._redis.delete(PREFIX + key + ":lock")

    async def ping(self) -> bool:
        return bool(await self._redis.ping())

    async def close(self) -> None:
        await self._redis.aclose()


def open_cache(url: str | None) -> SummaryCache:
    return RedisCache(url) if url else MemoryCache()


class SingleFlight:
    """Runs one computation per key at a time; concurrent callers share its result."""

    def __init__(self, cache: SummaryCache, lock_ttl: float = 120.0, poll: float = 0.05) -> None:
        self._cache = cache
        self._inflight: dict[str, asyncio.Future[str]] = {}
        self._lock_ttl = lock_ttl
        self._poll = poll

    async def cached(self, key: str) -> str | None:
        """The finished value of `key`, without computing it."""
        return await self._cache.get(key)

    async def get_or_compute(self, key: str, compute: Callable[[], Awaitable[str]]) -> str:
        cached = await self._cache.get(key)
        if cached is not None:
            return cached
        pending = self._inflight.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        try:
            value = await self._compute_once(key, compute)
        except asyncio.CancelledError:
            # This caller's deadline ended the computation; callers sharing it fall back too.
            future.set_exception(SummaryFailed("the shared summary call was abandoned"))
            future.exception()
            raise
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # mark retrieved: waiters re-raise it, nobody else must
            raise
        else:
            future.set_result(value)
            return value
        finally:
            del self._inflight[key]

    async def _compute_once(self, key: str, compute: Callable[[], Awaitable[str]]) -> str:
        if not await self._cache.lock(key, self._lock_ttl):
            # Another replica is computing it: wait for its result, bounded by the lock's TTL.
            deadline = time.monotonic() + self._lock_ttl
            while time.monotonic() < deadline:
                await asyncio.sleep(self._poll)
                found = await self._cache.get(key)
                if found is not None:
                    return found
        try:
            # Another replica may have finished between our first look and taking the lock.
            found = await self._cache.get(key)
            if found is not None:
                return found
            value = await compute()
            await self._cache.set(key, value)
            return value
        finally:
            await self._cache.unlock(key)
