"""Single flight: concurrent callers asking for the same key share one computation."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class SingleFlight(Generic[K, V]):
    """At most one computation per key at a time; callers that arrive while it runs await its
    outcome (value or exception) instead of starting their own.

    The computation runs in the first caller's task. When that caller is cancelled (its
    deadline passed), the others get `abandoned()` raised instead of waiting on nothing; a
    waiter that is cancelled leaves the computation alone (its wait is shielded).
    """

    __slots__ = ("_abandoned", "_flights")

    def __init__(self, abandoned: Callable[[], BaseException]) -> None:
        self._abandoned = abandoned
        self._flights: dict[K, asyncio.Future[V]] = {}

    def __contains__(self, key: object) -> bool:
        return key in self._flights

    async def run(self, key: K, compute: Callable[[], Awaitable[V]]) -> V:
        pending = self._flights.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[V] = asyncio.get_running_loop().create_future()
        self._flights[key] = future
        try:
            value = await compute()
        except asyncio.CancelledError:
            future.set_exception(self._abandoned())
            future.exception()  # mark retrieved: only waiters re-raise it
            raise
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()
            raise
        else:
            future.set_result(value)
            return value
        finally:
            del self._flights[key]
