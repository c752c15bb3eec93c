"""How many requests an upstream server serves at once, for the background summaries' gate.

Only a server with one slot makes a summary wait for an idle moment (DESIGN.md §12): the
operator's `UPSTREAM_SLOTS`, else llama.cpp's `GET /props` `total_slots`; a server that does
not say (a hosted API, vLLM) is not gated. Asked once per server and remembered for a while.
"""

from __future__ import annotations

import time

from inflight.lru import BoundedLRU
from inflight.windows.discovery import JsonFetcher, server_root

SERVERS = 256  # servers remembered
RECHECK = 600.0  # seconds before a server is asked again


class UpstreamSlots:
    """`gated(url)`: whether summaries to the server of `url` should wait for it to be idle."""

    def __init__(self, fetcher: JsonFetcher, configured: int | None = None) -> None:
        self._fetcher = fetcher
        self._configured = configured
        self._known: BoundedLRU[str, tuple[float, int | None]] = BoundedLRU(SERVERS)

    async def slots(self, url: str) -> int | None:
        """The server's slots: configured, or reported by llama.cpp's `/props`; None: unknown."""
        if self._configured is not None:
            return self._configured
        root = server_root(url)
        known = self._known.get(root)
        now = time.monotonic()
        if known is not None and now - known[0] < RECHECK:
            return known[1]
        props = await self._fetcher.fetch_json("GET", f"{root}/props")
        total = props.get("total_slots") if isinstance(props, dict) else None
        slots = total if type(total) is int and total > 0 else None
        self._known.put(root, (now, slots))
        return slots

    async def gated(self, url: str) -> bool:
        return await self.slots(url) == 1
