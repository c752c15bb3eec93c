"""Start the benchmark's servers as separate processes on free loopback ports, and stop them."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import httpx

from tests.support import free_port


@contextmanager
def process(
    argv: Sequence[str],
    health_url: str,
    env: dict[str, str] | None = None,
    timeout: float = 60,
    cwd: str | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """Run `argv` (in `cwd`) until `health_url` answers; terminate it on exit (bounded)."""
    proc = subprocess.Popen(
        list(argv),
        cwd=cwd,
        env={**os.environ, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{argv[0]} exited with {proc.returncode}")
            try:
                if httpx.get(health_url, timeout=1).status_code < 500:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{argv} did not become healthy")
            time.sleep(0.05)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@contextmanager
def fake_upstream() -> Iterator[str]:
    port = free_port()
    argv = [sys.executable, "-m", "bench.upstream", str(port)]
    with process(argv, f"http://127.0.0.1:{port}/v1/models"):
        yield f"http://127.0.0.1:{port}/v1"


@contextmanager
def proxy(
    upstream_url: str,
    extra_env: dict[str, str] | None = None,
    *,
    replays: bool = True,
    root: str | None = None,
) -> Iterator[str]:
    with proxy_process(upstream_url, extra_env, replays=replays, root=root) as (url, _):
        yield url


@contextmanager
def proxy_process(
    upstream_url: str,
    extra_env: dict[str, str] | None = None,
    *,
    replays: bool = True,
    root: str | None = None,
) -> Iterator[tuple[str, int]]:
    """A proxy process: (base URL, pid). `replays=False`: the replay cache off (`bench.variant`);
    `root`: the inflight of another checkout (`python -m bench --before DIR`)."""
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "inflight.cli.commands",
        "serve",
        "--port",
        str(port),
        "--upstream",
        upstream_url,
        "--log-level",
        "warning",
    ]
    if not replays:
        argv = [sys.executable, "-m", "bench.variant", str(port), upstream_url]
    env = {"INFLIGHT_DATABASE_URL": "sqlite:///:memory:", **(extra_env or {})}
    if root is not None:  # its `app` first: `-m` puts the working directory first on the path
        env["PYTHONPATH"] = root
    with process(argv, f"http://127.0.0.1:{port}/healthz", env=env, cwd=root) as proc:
        yield f"http://127.0.0.1:{port}/v1", proc.pid


@contextmanager
def bare_relay(upstream_url: str) -> Iterator[str]:
    """`bench.bare_relay`: the latency floor of a FastAPI + httpx relay."""
    with bare_relay_process(upstream_url) as (url, _):
        yield url


@contextmanager
def bare_relay_process(upstream_url: str, pools: int = 1) -> Iterator[tuple[str, int]]:
    """`bare_relay` (with `pools` connection pools): (base URL, pid)."""
    port = free_port()
    argv = [sys.executable, "-m", "bench.bare_relay", str(port), upstream_url, str(pools)]
    with process(argv, f"http://127.0.0.1:{port}/healthz") as proc:
        yield f"http://127.0.0.1:{port}/v1", proc.pid


@asynccontextmanager
async def proxy_in_process(upstream_url: str) -> AsyncIterator[httpx.AsyncClient]:
    """inflight as an ASGI app in this process (usage in a temporary SQLite file), in front of
    `upstream_url`, with a patient summary deadline: the real-model benchmarks run on a CPU.
    Its requests wait for their summaries (wait mode): what a summary keeps is measured."""
    from inflight.factory import create_app
    from inflight.settings import Settings

    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(  # type: ignore[call-arg]
            _env_file=None,
            upstream_url=upstream_url,
            database_url=f"sqlite:///{Path(tmp) / 'usage.db'}",
            summary_timeout=300,
            summary_wait=True,
        )
        app = create_app(settings)
        transport = httpx.ASGITransport(app=app)
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=transport, base_url="http://proxy", timeout=600) as client,
        ):
            yield client
