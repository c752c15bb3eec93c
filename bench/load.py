"""Throughput, per-chunk streaming delay, memory per in-flight stream, and the cost of
recording usage — each measured against a direct call or a variant in the same run."""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time
from contextlib import AsyncExitStack
from pathlib import Path

import httpx

BODY = {"model": "bench", "messages": [{"role": "user", "content": "hello " * 50}]}


CLIENT_POOLS = 8  # the load client's: httpx's pool costs grow with the square of its requests
# in flight, and a client that spends a core on its own pool measures itself, not the target


async def _throughput(url: str, clients: int, total: int) -> tuple[float, int]:
    """Requests per second with `clients` concurrent clients (JSON answers), and failures."""
    per_pool = -(-clients // CLIENT_POOLS)
    limits = httpx.Limits(max_connections=per_pool, max_keepalive_connections=per_pool)
    headers = {"authorization": "Bearer sk-bench-key"}
    failures = 0
    async with AsyncExitStack() as stack:
        pools = [
            await stack.enter_async_context(
                httpx.AsyncClient(timeout=60, limits=limits, headers=headers)
            )
            for _ in range(CLIENT_POOLS)
        ]
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(total):
            queue.put_nowait(i)

        async def worker(client: httpx.AsyncClient) -> None:
            nonlocal failures
            while not queue.empty():
                queue.get_nowait()
                try:
                    (await client.post(url + "/chat/completions", json=BODY)).raise_for_status()
                except httpx.HTTPError as exc:
                    failures += 1
                    print(f"  {url}: {exc!r}", file=sys.stderr)

        workers = [pools[i % CLIENT_POOLS] for i in range(clients)]
        await asyncio.gather(  # warm-up connections
            *(client.post(url + "/chat/completions", json=BODY) for client in workers)
        )
        await _drained(pools[0], url)
        start = time.perf_counter()
        await asyncio.gather(*(worker(client) for client in workers))
        await _drained(pools[0], url)
        return total / (time.perf_counter() - start), failures


DRAIN_TIMEOUT = 120.0  # seconds


async def _drained(client: httpx.AsyncClient, url: str) -> None:
    """Until an inflight target has written the usage records of its requests (its
    `/metrics` queue depth is 0), so that a target's run counts the writing of its own records
    and none is left to slow the next target's. Other targets have no queue: at once."""
    deadline = time.monotonic() + DRAIN_TIMEOUT
    while time.monotonic() < deadline:
        metrics = await client.get(url.removesuffix("/v1") + "/metrics")
        if metrics.status_code != 200 or "inflight_usage_queue_depth" not in metrics.text:
            return
        for line in metrics.text.splitlines():
            if line.startswith("inflight_usage_queue_depth") and float(line.split()[-1]) == 0:
                return
        await asyncio.sleep(0.01)
    raise RuntimeError(f"{url}: usage records still queued after {DRAIN_TIMEOUT} s")


def _cpu_ms(pid: int) -> float:
    """CPU time (user + system, all threads) the process has used, in ms."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


def throughput_report(
    targets: dict[str, str],
    clients: int = 64,
    total: int = 2000,
    rounds: int = 5,
    pids: dict[str, int] | None = None,
) -> str:
    """Targets measured in turn, `rounds` times over, so drift (CPU boost, page cache) hits
    them alike: each target's median round with the slowest and fastest, and its rate over
    each relay's in the same round (paired, so drift between rounds cancels), the median of
    those with their range. An inflight target's run lasts until its usage records are
    written (`_drained`). With `pids`: the CPU each of those servers spent per request in its
    runs (client, upstream and servers share the machine's cores)."""
    pids = pids or {}
    rates: dict[str, list[float]] = {name: [] for name in targets}
    cpu: dict[str, list[float]] = {name: [] for name in pids}
    failed = dict.fromkeys(targets, 0)
    for _ in range(rounds):
        for name, url in targets.items():
            before = _cpu_ms(pids[name]) if name in pids else 0.0
            rate, failures = asyncio.run(_throughput(url, clients, total))
            if name in pids:
                cpu[name].append((_cpu_ms(pids[name]) - before) / (total + clients))
            rates[name].append(rate)
            failed[name] += failures
    relays = [name for name in targets if name.startswith("bare relay")]
    relay_cpu = statistics.median(cpu[relays[0]]) if relays and relays[0] in cpu else None

    def paired(name: str, relay: str) -> str:
        ratios = [a / b for a, b in zip(rates[name], rates[relay], strict=True)]
        return f"{statistics.median(ratios):.2f}× ({min(ratios):.2f}–{max(ratios):.2f})"

    lines = [
        "| target | requests/s (median) | slowest – fastest round | vs direct | "
        + " | ".join(f"vs {relay}, paired rounds" for relay in relays)
        + " | CPU ms per request | relay's CPU / target's | failed |",
        "|---|---:|---:|---:|" + "---:|" * len(relays) + "---:|---:|---:|",
    ]
    base = statistics.median(rates["direct"])
    for name, values in rates.items():
        rate = statistics.median(values)
        spent = statistics.median(cpu[name]) if name in cpu else None
        cpu_cells = (
            f"{spent:.2f} | {relay_cpu / spent:.2f}×"
            if spent is not None and relay_cpu is not None
            else " | "
        )
        lines.append(
            f"| {name} | {rate:.0f} | {min(values):.0f} – {max(values):.0f} | "
            f"{rate / base:.2f}× | "
            + " | ".join(paired(name, relay) for relay in relays)
            + f" | {cpu_cells} | {failed[name]} |"
        )
    return (
        f"{clients} concurrent clients over {CLIENT_POOLS} client pools, {total} JSON requests "
        f"per target and round, {rounds} interleaved rounds (CPU per request: the server "
        f"process's, all threads; the relay's CPU there is the first relay's, so above 1× the "
        "target is cheaper):\n\n" + "\n".join(lines)
    )


async def _chunk_delays(url: str, streams: int) -> list[float]:
    """Per chunk: client receive time minus upstream send time (ms), same clock."""
    delays: list[float] = []
    body = {**BODY, "stream": True, "bench_stamp": True, "bench_gap": 0.01, "bench_chunks": 20}
    headers = {"authorization": "Bearer sk-bench-key"}
    async with httpx.AsyncClient(timeout=60, headers=headers) as client:
        for _ in range(streams):
            async with client.stream("POST", url + "/chat/completions", json=body) as response:
                async for line in response.aiter_lines():
                    received = time.time_ns()
                    if '"content":"' in line:
                        sent = int(line.split('"content":"', 1)[1].split(" ", 1)[0])
                        delays.append((received - sent) / 1e6)
    return delays


def chunk_delay_report(targets: dict[str, str], streams: int = 30) -> str:
    lines = ["| target | p50 ms | p99 ms |", "|---|---:|---:|"]
    for name, url in targets.items():
        delays = sorted(asyncio.run(_chunk_delays(url, streams)))
        p99 = delays[int(0.99 * (len(delays) - 1))]
        lines.append(f"| {name} | {statistics.median(delays):.2f} | {p99:.2f} |")
    return (
        "Delay from the upstream writing a chunk to the client reading it (20-chunk streams, "
        "10 ms apart):\n\n" + "\n".join(lines)
    )


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


async def _hold_streams(url: str, count: int, pid: int) -> tuple[int, int]:
    """RSS before and while `count` streams are open (each held ~3 s by the upstream)."""
    body = {**BODY, "stream": True, "bench_gap": 0.5, "bench_chunks": 8}
    limits = httpx.Limits(max_connections=count + 10)
    headers = {"authorization": "Bearer sk-bench-key"}
    async with httpx.AsyncClient(timeout=60, limits=limits, headers=headers) as client:
        before = _rss_kib(pid)
        opened = asyncio.Event()
        started = 0

        async def one() -> None:
            nonlocal started
            async with client.stream("POST", url + "/chat/completions", json=body) as r:
                started += 1
                if started == count:
                    opened.set()
                async for _ in r.aiter_raw():
                    pass

        tasks = [asyncio.create_task(one()) for _ in range(count)]
        await asyncio.wait_for(opened.wait(), 60)
        await asyncio.sleep(0.5)
        during = _rss_kib(pid)
        await asyncio.gather(*tasks)
        return before, during


def memory_report(url: str, pid: int, count: int = 200) -> str:
    before, during = asyncio.run(_hold_streams(url, count, pid))
    per = (during - before) / count
    return (
        f"Proxy RSS with {count} streams in flight: {before / 1024:.1f} MiB idle → "
        f"{during / 1024:.1f} MiB ({per:.1f} KiB per in-flight stream)."
    )
