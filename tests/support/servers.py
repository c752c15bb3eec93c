"""Run an ASGI app on a real uvicorn server on 127.0.0.1:0 in a thread, with bounded waits; a
usage store a test thread can wait on."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import anyio
import uvicorn

from inflight.usage.records import UsageRecord
from inflight.usage.stores.sqlite import SQLiteStore


@contextmanager
def serve(app: Any, *, timeout: float = 10.0) -> Iterator[str]:
    """Yield the server's base URL (`http://127.0.0.1:PORT`); stop it on exit."""
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout)
        if thread.is_alive():
            server.force_exit = True
            thread.join(timeout)


class WatchedStore(SQLiteStore):
    """An in-memory SQLite usage store that also keeps the records it was given, so a test (in
    another thread than the server) can wait until the proxy has recorded what it expects."""

    def __init__(self) -> None:
        super().__init__("sqlite:///:memory:")
        self.records: list[UsageRecord] = []
        self._written = threading.Condition()

    async def write_many(self, records: Sequence[UsageRecord]) -> None:
        await super().write_many(records)
        with self._written:
            self.records.extend(records)
            self._written.notify_all()

    def wait_for(self, count: int, timeout: float = 10.0) -> list[UsageRecord]:
        """The records once at least `count` were written (bounded wait)."""
        with self._written:
            if not self._written.wait_for(lambda: len(self.records) >= count, timeout):
                raise AssertionError(f"{len(self.records)} usage records, expected {count}")
            return list(self.records)

    async def written(self, count: int) -> list[UsageRecord]:
        """`wait_for` from async code: waits in a worker thread, so the writer can run."""
        return await anyio.to_thread.run_sync(self.wait_for, count)
