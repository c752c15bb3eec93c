"""Slow clients against a real proxy process (`python -m bench --only slow`): slowloris
connections (half a request line; full headers and part of a body) and streams whose client
never reads, with short timeouts; reports the connections the proxy still holds once it should
have closed them all, and the proxy's RSS before, at most while they are held, and after."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from urllib.parse import urlsplit

import orjson

from bench.load import _rss_kib
from bench.procs import proxy_process

TIMEOUT = 2.0  # each of the three timeouts, seconds
WAIT = 90.0  # how long the connections are watched (a stream fills the sockets' buffers first)
ESTABLISHED = "01"  # the `st` column of /proc/net/tcp
BODY = orjson.dumps(
    {
        "model": "gpt-4o",
        "stream": True,
        "bench_chunks": 10_000_000,  # for ever, as far as a client that never reads is concerned
        # a pause between chunks, as a model's tokens have: without it the one-process fake
        # upstream spins on its first streams and starves the others (they never start)
        "bench_gap": 0.002,
        "messages": [{"role": "user", "content": "Hi"}],
    }
)


def _head(length: int) -> bytes:
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % length
    )


def _open(address: tuple[str, int], sent: bytes) -> socket.socket:
    sock = socket.create_connection(address)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.sendall(sent)
    return sock


def _held_by_proxy(port: int) -> set[int]:
    """The client ports of the connections the proxy (listening on `port`) still has open, from
    the kernel's table (/proc/net/tcp). Not the clients' own TCP state: the proxy drops a
    stalled client with a reset, which a client whose receive window is full (it reads nothing)
    may ignore, staying ESTABLISHED against a connection that no longer exists."""
    held = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, remote, state = line.split()[1:4]
        if state == ESTABLISHED and int(local.split(":")[1], 16) == port:
            held.add(int(remote.split(":")[1], 16))
    return held


def _still_open(socks: list[socket.socket], held: set[int]) -> int:
    return sum(s.getsockname()[1] in held for s in socks)


def _held(
    groups: dict[str, list[socket.socket]], pid: int, port: int, wait: float
) -> tuple[int, float]:
    """Wait (at most `wait` s) until the proxy closed every connection; the peak RSS (KiB)
    meanwhile and when the last closed (s)."""
    started = time.monotonic()
    peak = 0
    clients = {s.getsockname()[1] for socks in groups.values() for s in socks}
    while time.monotonic() - started < wait:
        peak = max(peak, _rss_kib(pid))
        if not clients & _held_by_proxy(port):
            break
        time.sleep(0.25)
    return peak, time.monotonic() - started


def slow_clients_report(upstream_url: str, n: int = 100) -> str:
    env = {
        "INFLIGHT_HEADER_READ_TIMEOUT": str(TIMEOUT),
        "INFLIGHT_BODY_READ_TIMEOUT": str(TIMEOUT),
        "INFLIGHT_CLIENT_STALL_TIMEOUT": str(TIMEOUT),
        "INFLIGHT_DATABASE_URL": "none",
    }
    with proxy_process(upstream_url, env) as (url, pid):
        parts = urlsplit(url)
        address = (parts.hostname or "127.0.0.1", parts.port or 80)
        before = _rss_kib(pid)
        groups = {
            "slowloris headers": [
                _open(address, b"POST /v1/chat/completions HTTP/1.1\r\nHo") for _ in range(n)
            ],
            "slowloris bodies": [_open(address, _head(len(BODY)) + BODY[:20]) for _ in range(n)],
            "streams never read": [_open(address, _head(len(BODY)) + BODY) for _ in range(n)],
        }
        peak, took = _held(groups, pid, address[1], WAIT)
        held = _held_by_proxy(address[1])
        after = _rss_kib(pid)
        lines = [
            f"{n} connections of each kind, every timeout {TIMEOUT:g} s "
            f"(INFLIGHT_HEADER_READ_TIMEOUT, _BODY_READ_TIMEOUT, _CLIENT_STALL_TIMEOUT), "
            f"watched for {took:.1f} s (at most {WAIT:g}):\n",
            "| clients | still held by the proxy at the end |",
            "|---|---:|",
        ]
        for name, socks in groups.items():
            lines.append(f"| {name} | {_still_open(socks, held)} of {n} |")
            for sock in socks:
                sock.close()
        lines.append(
            f"\nProxy RSS: {before / 1024:.1f} MiB before, {peak / 1024:.1f} MiB at most while "
            f"held, {after / 1024:.1f} MiB after."
        )
        return "\n".join(lines)
