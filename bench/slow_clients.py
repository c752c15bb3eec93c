"""Slow clients against a real proxy process (`python -m bench --only slow`): slowloris
connections (half a request line; full headers and part of a body) and streams whose client
never reads, with short timeouts; reports the connections still open once the proxy should have
closed them all, and the proxy's RSS before, at most while they are held, and after."""

from __future__ import annotations

import socket
import time
from urllib.parse import urlsplit

import orjson

from bench.load import _rss_kib
from bench.procs import proxy_process

TIMEOUT = 2.0  # each of the three timeouts, seconds
WAIT = 90.0  # how long the connections are watched (a stream fills the sockets' buffers first)
TCP_ESTABLISHED = 1  # `tcpi_state` of Linux's `struct tcp_info`
BODY = orjson.dumps(
    {
        "model": "gpt-4o",
        "stream": True,
        "bench_chunks": 10_000_000,  # for ever, as far as a client that never reads is concerned
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


def _still_open(sock: socket.socket) -> bool:
    """Whether the proxy has neither closed nor reset `sock`, read without draining it (the
    kernel's TCP state: a client that reads would change what it measures)."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)
    return info[0] == TCP_ESTABLISHED


def _held(groups: dict[str, list[socket.socket]], pid: int, wait: float) -> tuple[int, float]:
    """Wait (at most `wait` s) until the proxy closed every connection; the peak RSS (KiB)
    meanwhile and when the last closed (s)."""
    started = time.monotonic()
    peak = 0
    while time.monotonic() - started < wait:
        peak = max(peak, _rss_kib(pid))
        if not any(_still_open(s) for socks in groups.values() for s in socks):
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
        peak, took = _held(groups, pid, WAIT)
        after = _rss_kib(pid)
        lines = [
            f"{n} connections of each kind, every timeout {TIMEOUT:g} s "
            f"(INFLIGHT_HEADER_READ_TIMEOUT, _BODY_READ_TIMEOUT, _CLIENT_STALL_TIMEOUT), "
            f"watched for {took:.1f} s (at most {WAIT:g}):\n",
            "| clients | still open at the end |",
            "|---|---:|",
        ]
        for name, socks in groups.items():
            lines.append(f"| {name} | {sum(_still_open(s) for s in socks)} of {n} |")
            for sock in socks:
                sock.close()
        lines.append(
            f"\nProxy RSS: {before / 1024:.1f} MiB before, {peak / 1024:.1f} MiB at most while "
            f"held, {after / 1024:.1f} MiB after."
        )
        return "\n".join(lines)
