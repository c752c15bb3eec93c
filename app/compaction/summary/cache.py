"""The summary cache: content-hash keys, in-process by default, Redis when `CACHE_URL` is set.

Summaries are the only thing inflight remembers (DESIGN.md §4.7).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from inflight.compaction.summary.prompt import SummaryFailed
from inflight.flight import SingleFlight
from inflight.lru import BoundedLRU, weigh_strings

PREFIX = "inflight:summary:"
MEMORY_CACHE_BYTES = 32 * 1024 * 1024  # summaries kept in process: keys and texts, in all
RELEASE_IF_OWNER = """
if redis.call("get", KEYS[1]) == ARGV[1] then
    return redis.call("del", KEYS[1])
end
return 0
"""
SET_IF_ABSENT = """
local found = redis.call("get", KEYS[1])
if found then
    return found
end
redis.call("set", KEYS[1], ARGV[1], "EX", ARGV[2])
return false
"""


class SummaryCache(Protocol):
    """Where finished summaries live, keyed by a hash of what they summarise.

    It also holds what a compaction event chose to stand for its span (`add`: the first writer wins,
    on every replica); `SummaryFlight` makes concurrent identical summary requests share one
    upstream call.
    """

    async def get(self, key: str) -> str | None: ...

    async def get_many(self, keys: Sequence[str]) -> list[str | None]:
        """The values of `keys`, in order (one round trip where the cache is remote)."""

    async def set(self, key: str, value: str) -> None: ...

    async def add(self, key: str, value: str) -> str | None:
        """Set `key` to `value` unless it holds a value already: None when it was set, else
        the value it holds (the first writer's: replicas that race agree on one)."""

    async def lock(self, key: str, ttl: float) -> str | None:
        """Try to become the one replica computing `key`: the owner's token when acquired."""

    async def unlock(self, key: str, token: str) -> None:
        """Release the lock on `key` if `token` still owns it (it may have expired and been
        taken by another replica, whose lock must survive)."""

    async def close(self) -> None: ...


class MemoryCache:
    """A bounded LRU, private to this process: at most `max_entries` summaries and
    `max_bytes` of their keys and texts."""

    def __init__(self, max_entries: int = 10_000, max_bytes: int = MEMORY_CACHE_BYTES) -> None:
        self._data: BoundedLRU[str, str] = BoundedLRU(max_entries, max_bytes, weigh_strings)

    async def get(self, key: str) -> str | None:
        return self._data.get(key)

    async def get_many(self, keys: Sequence[str]) -> list[str | None]:
        return [await self.get(key) for key in keys]

    async def set(self, key: str, value: str) -> None:
        self._data.put(key, value)

    async def add(self, key: str, value: str) -> str | None:
        found = await self.get(key)
        if found is None:
            self._data.put(key, value)
        return found

    async def lock(self, key: str, ttl: float) -> str | None:
        return "local"  # the in-process single flight already serialises this process

    async def unlock(self, key: str, token: str) -> None:
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

    async def get_many(self, keys: Sequence[str]) -> list[str | None]:
        if not keys:
            return []
        values = await self._redis.mget([PREFIX + key for key in keys])
        return [value if isinstance(value, str) else None for value in values]

    async def set(self, key: str, value: str) -> None:
        await self._redis.set(PREFIX + key, value, ex=self._ttl)

    async def add(self, key: str, value: str) -> str | None:
        # read and write in one step: of two replicas adding at once, one sets, one finds it
        found = await self._redis.eval(SET_IF_ABSENT, 1, PREFIX + key, value, self._ttl)
        return found if isinstance(found, str) else None

    async def lock(self, key: str, ttl: float) -> str | None:
        token = secrets.token_hex(16)
        acquired = await self._redis.set(
            PREFIX + key + ":lock", token, nx=True, px=max(1, int(ttl * 1000))
        )
        return token if acquired else None

    async def unlock(self, key: str, token: str) -> None:
        # compare-and-delete in one step: between a GET and a DEL the lock could expire and
        # be taken by another replica
        await self._redis.eval(RELEASE_IF_OWNER, 1, PREFIX + key + ":lock", token)

    async def ping(self) -> bool:
        return bool(await self._redis.ping())

    async def close(self) -> None:
        await self._redis.aclose()


def open_cache(url: str | None) -> SummaryCache:
    return RedisCache(url) if url else MemoryCache()


class SummaryBusy(Exception):
    """Another replica holds the lock on this summary: it is being made there."""


class SummaryFlight:
    """Finds or computes a summary once: the cache first, then one computation per key in
    this process (concurrent callers share it) and, across replicas, the holder of the
    cache's lock; the others wait for its result, bounded by the lock's TTL — or, when they
    would rather not wait (a background summary), give up at once with `SummaryBusy`."""

    def __init__(self, cache: SummaryCache, lock_ttl: float = 120.0, poll: float = 0.05) -> None:
        self._cache = cache
        self._inflight: SingleFlight[str, str] = SingleFlight(
            lambda: SummaryFailed("the shared summary call was abandoned")
        )
        self._lock_ttl = lock_ttl
        self._poll = poll

    async def cached(self, key: str) -> str | None:
        """The finished value of `key`, without computing it."""
        return await self._cache.get(key)

    async def cached_many(self, keys: Sequence[str]) -> list[str | None]:
        """The finished values of `keys`, in order (None where there is none)."""
        return await self._cache.get_many(keys)

    async def add(self, key: str, value: str) -> str | None:
        """`value` under `key` unless it holds one already: None when set, else the value."""
        return await self._cache.add(key, value)

    def computing(self, key: str) -> bool:
        """Whether this process is computing `key` right now."""
        return key in self._inflight

    async def get_or_compute(
        self, key: str, compute: Callable[[], Awaitable[str]], *, wait: bool = True
    ) -> str:
        """The value of `key`: cached, shared, or computed. With `wait=False`, a key another
        replica holds the lock on raises `SummaryBusy` instead of waiting for its result."""
        cached = await self._cache.get(key)
        if cached is not None:
            return cached
        return await self._inflight.run(key, lambda: self._compute_once(key, compute, wait))

    async def _compute_once(
        self, key: str, compute: Callable[[], Awaitable[str]], wait: bool
    ) -> str:
        token = await self._cache.lock(key, self._lock_ttl)
        if token is None and not wait:
            raise SummaryBusy(f"summary {key[:12]} is being made by another replica")
        if token is None:
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
            if token is not None:  # a replica that waited the holder out owns no lock
                await self._cache.unlock(key, token)
