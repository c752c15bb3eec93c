"""A throwaway real PostgreSQL cluster on a free loopback port (Debian's `postgresql`).

`INFLIGHT_TEST_POSTGRES_URL` wins when set. Otherwise initdb runs in a temporary directory as
an unprivileged user (`postgres` when it exists, since root may not run the server), with
trust auth on 127.0.0.1 only; the cluster is stopped and deleted afterwards.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tests.support import free_port


def _bin() -> str | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return os.path.dirname(found[-1]) if found else None


class Cluster:
    """A cluster this process started: stopped and started again on the same port by fault
    tests (a database restart)."""

    def __init__(self, prefix: list[str], bindir: str, root: str, port: int) -> None:
        self._prefix = prefix
        self._bindir = bindir
        self._root = root
        self.port = port
        self.url = f"postgresql://postgres@127.0.0.1:{port}/postgres"

    def _ctl(self, *args: str) -> None:
        subprocess.run(
            [*self._prefix, f"{self._bindir}/pg_ctl", "-D", os.path.join(self._root, "data"),
             *args],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip

    def start(self) -> None:
        self._ctl(
            "-w", "-t", "60", "-l", os.path.join(self._root, "log"),
            "-o", f"-p {self.port} -k {self._root} -c listen_addresses=127.0.0.1 -c fsync=off",
            "start",
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def stop(self, mode: str = "fast") -> None:
        """`fast`: clients are disconnected, the server shuts down cleanly (a restart)."""
        self._ctl("-w", "-t", "60", "-m", mode, "stop")


@contextmanager
def postgres_cluster() -> Iterator[Cluster]:
    """A fresh cluster (skip when the binaries are missing)."""
    bindir = _bin()
    if bindir is None:
        pytest.skip("no PostgreSQL binaries (apt-get install postgresql)")
    prefix: list[str] = []
    if os.geteuid() == 0:
        if shutil.which("runuser") is None:
            pytest.skip("running as root without runuser: cannot start PostgreSQL")
        prefix = ["runuser", "-u", "postgres", "--"]
    root = tempfile.mkdtemp(prefix="inflight-pg-")
    data = os.path.join(root, "data")
    if prefix:
        shutil.chown(root, user="postgres")
    cluster = Cluster(prefix, bindir, root, free_port())
    try:
        subprocess.run(
            [*prefix, f"{bindir}/initdb", "-D", data, "-A", "trust", "-U", "postgres", "--no-sync"],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip
        cluster.start()
        yield cluster
    finally:
        subprocess.run(
            [*prefix, f"{bindir}/pg_ctl", "-D", data, "-m", "immediate", "stop"],
            capture_output=True, timeout=60, check=False,
        )  # fmt: skip
        shutil.rmtree(root, ignore_errors=True)


@contextmanager
def postgres_url() -> Iterator[str]:
    configured = os.environ.get("INFLIGHT_TEST_POSTGRES_URL")
    if configured:
        yield configured
        return
    if _bin() is None:
        pytest.skip(
            "no PostgreSQL binaries (apt-get install postgresql) and no INFLIGHT_TEST_POSTGRES_URL"
        )
    with postgres_cluster() as cluster:
        yield cluster.url
