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


@contextmanager
def postgres_url() -> Iterator[str]:
    configured = os.environ.get("INFLIGHT_TEST_POSTGRES_URL")
    if configured:
        yield configured
        return
    bindir = _bin()
    if bindir is None:
        pytest.skip(
            "no PostgreSQL binaries (apt-get install postgresql) and no INFLIGHT_TEST_POSTGRES_URL"
        )
    prefix: list[str] = []
    if os.geteuid() == 0:
        if shutil.which("runuser") is None:
            pytest.skip("running as root without runuser: cannot start PostgreSQL")
        prefix = ["runuser", "-u", "postgres", "--"]
    root = tempfile.mkdtemp(prefix="inflight-pg-")
    data = os.path.join(root, "data")
    if prefix:
        shutil.chown(root, user="postgres")
    port = free_port()
    run = lambda *args: subprocess.run(  # noqa: E731
        [*prefix, *args], check=True, capture_output=True, timeout=120
    )
    try:
        run(f"{bindir}/initdb", "-D", data, "-A", "trust", "-U", "postgres", "--no-sync")
        run(
            f"{bindir}/pg_ctl", "-D", data, "-w", "-t", "60", "-l", os.path.join(root, "log"),
            "-o", f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off",
            "start",
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(
            [*prefix, f"{bindir}/pg_ctl", "-D", data, "-m", "immediate", "stop"],
            capture_output=True, timeout=60, check=False,
        )  # fmt: skip
        shutil.rmtree(root, ignore_errors=True)
