"""Throughput, per-chunk streaming delay, memory per in-flight stream, and the cost of
recording usage — each measured against a direct call or a variant in the same run."""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

import httpx

BODY = {"model": "bench", "messages": [{"role": "user", "content": "hello " * 50}]}


async def _throughput(url: str, clients: int, total: int) -> tuple[float, int]:
    """Requests per second with `clients` concurrent clients (JSON answers), and failures."""
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    headers = {"authorization": "Bearer sk-bench-key"}
    failures = 0
    async with httpx.AsyncClient(timeout=60, limits=limits, headers=headers) as client:
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(total):
            queue.put_nowait(i)

        async def worker() -> None:
            nonlocal failures
            while not queue.empty():
                queue.get_nowait()
                try:
                    (await client.post(url + "/chat/completions", json=BODY)).raise_for_status()
                except httpx.HTTPError as exc:
                    failures += 1
                    print(f"  {url}: {exc!r}", file=sys.stderr)

        for _ in range(clients):  # warm-up connections
            await client.post(url + "/chat/completions", json=BODY)
        await _drained(client, url)
        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        await _drained(client, url)
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
    them alike; each figure is the median round, with the slowest and fastest, and each
    target's rate over the relay's in the same round (paired: drift between rounds cancels),
    the median of those with their range. An inflight
    target's run lasts until its usage records are written (`_drained`). With `pids`: the CPU
    each of those servers spent per request in its runs (client, upstream and servers share
    the two cores, so requests/s swing between runs; CPU per request holds still)."""
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
    medians = {name: statistics.median(values) for name, values in rates.items()}
    base = medians["direct"]
    relay_name = next((name for name in medians if name.startswith("bare relay")), "direct")
    relay = medians[relay_name]
    relay_cpu = statistics.median(cpu[relay_name]) if relay_name in cpu else None
    lines = [
        "| target | requests/s (median) | slowest – fastest round | vs direct | vs bare relay "
        "| vs bare relay, paired rounds | CPU ms per request | vs bare relay | failed |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, rate in medians.items():
        spent = statistics.median(cpu[name]) if name in cpu else None
        cpu_cells = (
            f"{spent:.2f} | {relay_cpu / spent:.2f}×"
            if spent is not None and relay_cpu is not None
            else " | "
        )
        paired = [
            mine / theirs for mine, theirs in zip(rates[name], rates[relay_name], strict=True)
        ]
        lines.append(
            f"| {name} | {rate:.0f} | {min(rates[name]):.0f} – {max(rates[name]):.0f} | "
            f"{rate / base:.2f}× | {rate / relay:.2f}× | {statistics.median(paired):.2f}× "
            f"({min(paired):.2f}–{max(paired):.2f}) | {cpu_cells} | {failed[name]} |"
        )
    return (
        f"{clients} concurrent clients, {total} JSON requests per target and round, "
        f"{rounds} interleaved rounds (CPU per request: the server process's, all threads; "
        "\"vs bare relay\" there is the relay's CPU over the target's, so above 1× is "
        "cheaper):\n\n" + "\n".join(lines)
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
