"""A soak run (`python -m bench --only soak`): a real proxy process in front of the fast fake
upstream, N requests over ~220 growing conversations cut from the shipped transcripts (a finished
conversation starts again as a new one), 20 client keys, a small context limit so nearly every
request compacts; the proxy's RSS and the latency percentiles per thousand requests, and whether
the RSS levels off (memory bounded by construction: docs/reliability.md)."""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from bench.load import _rss_kib
from bench.procs import proxy_process
from tests.support import load_traces, request_points

CONVERSATIONS = 220
KEYS = 20
CONCURRENCY = 16
STEP = 1000  # requests per printed row
CONTEXT_LIMIT = 8000  # X-Compaction-Context-Limit: the transcripts pass it within a few turns
PLATEAU = 0.25  # MiB of RSS per 1,000 requests over the run's last quarter that count as level
STREAM_EVERY = 4  # one request in four streams


@dataclass
class _Conversation:
    """One slot: a transcript walked request point by request point; at its end it starts
    over as a new conversation (a new first message), so distinct content never stops coming."""

    slot: int
    messages: Sequence[Mapping[str, Any]]
    points: Sequence[int]
    generation: int = 0
    at: int = 0

    def next_body(self) -> dict[str, Any]:
        if self.at == len(self.points):
            self.at, self.generation = 0, self.generation + 1
        k = self.points[self.at]
        self.at += 1
        opening = {"role": "system", "content": f"soak conversation {self.slot}.{self.generation}"}
        return {"model": "gpt-4o", "messages": [opening, *self.messages[:k]]}


@dataclass
class _Run:
    latencies: list[float] = field(default_factory=list)
    failures: int = 0
    rows: list[tuple[int, float, float, float]] = field(default_factory=list)  # n, MiB, p50, p99


def _conversations() -> Iterator[_Conversation]:
    traces = [(messages, request_points(messages)) for _, messages in load_traces()]
    for slot in range(CONVERSATIONS):
        messages, points = traces[slot % len(traces)]
        yield _Conversation(slot, messages, points, at=(slot // len(traces)) % len(points))


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _drive(url: str, pid: int, total: int) -> _Run:
    run = _Run()
    ready: deque[_Conversation] = deque(_conversations())
    sent = 0
    window: list[float] = []
    run.rows.append((0, _rss_kib(pid) / 1024, 0.0, 0.0))
    limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:

        async def one(conversation: _Conversation, n: int) -> None:
            body = conversation.next_body()
            stream = n % STREAM_EVERY == 0
            if stream:
                body["stream"] = True
            headers = {
                "authorization": f"Bearer sk-soak-key-{conversation.slot % KEYS}",
                "content-type": "application/json",
                "x-compaction-context-limit": str(CONTEXT_LIMIT),
            }
            started = time.perf_counter()
            try:
                request = client.build_request(
                    "POST", url + "/chat/completions", content=orjson.dumps(body), headers=headers
                )
                response = await client.send(request, stream=True)
                try:
                    await response.aread()
                finally:
                    await response.aclose()
                response.raise_for_status()
            except httpx.HTTPError as exc:
                run.failures += 1
                print(f"  soak request {n}: {exc!r}", file=sys.stderr)
            window.append((time.perf_counter() - started) * 1000)

        async def worker() -> None:
            nonlocal sent
            while sent < total:
                n, sent = sent, sent + 1
                conversation = ready.popleft()  # one request of a conversation at a time
                await one(conversation, n)
                ready.append(conversation)
                if len(window) >= STEP:
                    done = window[:STEP]
                    del window[:STEP]
                    run.latencies.extend(done)
                    count = len(run.rows) * STEP
                    rss = _rss_kib(pid) / 1024
                    p50, p99 = statistics.median(done), _percentile(done, 0.99)
                    run.rows.append((count, rss, p50, p99))
                    print(f"  {count:>6} requests: RSS {rss:.0f} MiB, p50 {p50:.0f} ms, "
                          f"p99 {p99:.0f} ms", file=sys.stderr, flush=True)  # fmt: skip

        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return run


def _verdict(rows: Sequence[tuple[int, float, float, float]]) -> str:
    """Level or not, from the last quarter of the run: a plateau is a slope, not a share of
    the second half (a ramp in the middle of a long run passes that; a slow climb does too)."""
    if len(rows) < 5:
        return "Too few rows for a verdict (run at least 4,000 requests)."
    (first, start, _, _), (last, end, _, _) = rows[len(rows) * 3 // 4], rows[-1]
    slope = (end - start) / (last - first) * 1000
    level = "levels off" if slope < PLATEAU else "is still growing"
    return (
        f"RSS over the last quarter ({first:,} → {last:,} requests): {start:.0f} → {end:.0f} "
        f"MiB, {slope:+.2f} MiB per 1,000 requests (level below {PLATEAU:g}): memory "
        f"**{level}**."
    )


def report(upstream_url: str, total: int = 40_000) -> str:
    """The soak table: RSS, p50 and p99 per `STEP` requests, and the plateau verdict."""
    env = {"INFLIGHT_DATABASE_URL": "none"}
    with proxy_process(upstream_url, env) as (url, pid):
        started = time.monotonic()
        run = asyncio.run(_drive(url, pid, total))
        took = time.monotonic() - started
    lines = [
        f"{total:,} requests ({1 / STREAM_EVERY:.0%} streamed) over {CONVERSATIONS} growing "
        f"conversations from the shipped transcripts (a finished one starts again as a new one), "
        f"{KEYS} client keys, {CONCURRENCY} concurrent, X-Compaction-Context-Limit "
        f"{CONTEXT_LIMIT}; {took:.0f} s, {run.failures} failed:\n",
        "| requests | proxy RSS MiB | p50 ms | p99 ms |",
        "|---:|---:|---:|---:|",
    ]
    for n, rss, p50, p99 in run.rows:
        cells = f"{p50:.0f} | {p99:.0f}" if n else "– | –"
        lines.append(f"| {n:,} | {rss:.0f} | {cells} |")
    return "\n".join(lines) + "\n\n" + _verdict(run.rows)


if __name__ == "__main__":
    from bench.procs import fake_upstream

    with fake_upstream() as upstream:
        print(report(upstream, int(sys.argv[1]) if len(sys.argv) > 1 else 40_000))
