"""Run an ASGI app on a real uvicorn server on 127.0.0.1:0 in a thread, with bounded waits."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn


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
