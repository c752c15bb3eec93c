"""A throwaway real `redis-server` on a free loopback port (Debian's `redis-server` binary)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support import free_port


class RedisServer:
    """A `redis-server` this process started: stopped and started again on the same port by
    fault tests (a cache restart)."""

    def __init__(self, binary: str, tmp: Path, port: int) -> None:
        self._binary = binary
        self._tmp = tmp
        self.port = port
        self.url = f"redis://127.0.0.1:{port}/0"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self._proc = subprocess.Popen(
            [self._binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self._tmp)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as conn:
                    conn.sendall(b"PING\r\n")
                    if conn.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            if time.monotonic() > deadline or self._proc.poll() is not None:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(10)
            self._proc = None


@contextmanager
def redis_server(tmp: Path) -> Iterator[RedisServer]:
    """A fresh server (skip when the binary is missing)."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("no redis-server binary (apt-get install redis-server)")
    server = RedisServer(binary, tmp, free_port())
    try:
        server.start()
        yield server
    finally:
        server.stop()


@contextmanager
def redis_url(tmp: Path) -> Iterator[str]:
    """`INFLIGHT_TEST_REDIS_URL` if set, else a fresh server; skip when neither is possible."""
    configured = os.environ.get("INFLIGHT_TEST_REDIS_URL")
    if configured:
        yield configured
        return
    if shutil.which("redis-server") is None:
        pytest.skip(
            "no redis-server binary (apt-get install redis-server) and no INFLIGHT_TEST_REDIS_URL"
        )
    with redis_server(tmp) as server:
        yield server.url
