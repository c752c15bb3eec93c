"""Readiness: one background probe of the upstream, the usage store and the summary cache on an
interval (`INFLIGHT_READY_INTERVAL`), each check bounded (`INFLIGHT_READY_TIMEOUT`); `/readyz`
answers from the last result, so a flood of probes is never a flood upstream."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

Check = Callable[[], Awaitable[bool]]


@dataclass(frozen=True, slots=True)
class ReadyState:
    """What one probe found: each check's verdict, and when."""

    checks: Mapping[str, bool]
    at: float  # time.monotonic() when the probe ended

    @property
    def ready(self) -> bool:
        return all(self.checks.values())

    def as_json(self, now: float) -> dict[str, Any]:
        return {"ready": self.ready, **self.checks, "age": round(max(0.0, now - self.at), 3)}


async def _bounded(name: str, check: Check, within: float) -> bool:
    """One check's verdict: False when it fails or outlasts `within` seconds (a frozen Redis
    or database says nothing at all)."""
    try:
        async with asyncio.timeout(within):
            return await check()
    except TimeoutError:
        logger.warning("readiness: %s did not answer within %gs", name, within)
        return False
    except Exception:  # any failure of a dependency is "not ready", never an error of /readyz
        logger.warning("readiness: %s failed", name, exc_info=True)
        return False


class Readiness:
    """Runs the checks every `interval` seconds in one background task (`start`, `aclose`,
    from the app's lifespan) and keeps the last result. The first probe runs when `/readyz`
    first asks (or after one interval), not at startup: a process nobody probes sends nothing
    upstream of its own before its first interval."""

    def __init__(self, checks: Mapping[str, Check], *, interval: float, timeout: float) -> None:
        self._checks = dict(checks)
        self._interval = interval
        self._timeout = timeout
        self._state: ReadyState | None = None
        self._probed = asyncio.Event()
        self._wanted = asyncio.Event()  # a caller waits for the first result
        self._task: asyncio.Task[None] | None = None
        self.probes = 0  # probes run since start (each runs every check once)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="inflight-readiness")

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def probe(self) -> ReadyState:
        """Run every check once, concurrently, each within the timeout."""
        self.probes += 1
        names = list(self._checks)
        verdicts = await asyncio.gather(
            *(_bounded(name, self._checks[name], self._timeout) for name in names)
        )
        state = ReadyState(dict(zip(names, verdicts, strict=True)), time.monotonic())
        self._state = state
        self._probed.set()
        return state

    async def _run(self) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._interval):
                await self._wanted.wait()
        while True:
            await self.probe()
            await asyncio.sleep(self._interval)

    async def current(self) -> ReadyState:
        """The last probe's result. Before there is one, the first probe's (started now if it
        has not, and awaited within the timeout: every caller waits on that same probe); with
        no background task at all (an app whose lifespan did not start), not ready."""
        if self._state is None and self._task is not None:
            self._wanted.set()
            with contextlib.suppress(TimeoutError):  # still probing: not ready yet
                async with asyncio.timeout(self._timeout + 1.0):
                    await self._probed.wait()
        if self._state is None:
            return ReadyState(dict.fromkeys(self._checks, False), time.monotonic())
        return self._state
