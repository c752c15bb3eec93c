"""Added latency of the proxy over a direct call on loopback, non-streaming and streaming.

Both targets are measured in one run, interleaved request by request, against the same fake
upstream process, so machine noise hits both alike. Reported: p50/p99 and their ratios.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import httpx

BODY = {"model": "bench", "messages": [{"role": "user", "content": "hello " * 50}]}


@dataclass(frozen=True, slots=True)
class Dist:
    p50: float
    p99: float

    @classmethod
    def of(cls, samples: list[float]) -> Dist:
        ordered = sorted(samples)
        return cls(statistics.median(ordered), ordered[int(0.99 * (len(ordered) - 1))])


def _one(client: httpx.Client, url: str, stream: bool) -> float:
    body = {**BODY, "stream": stream}
    start = time.perf_counter()
    if stream:
        with client.stream("POST", url + "/chat/completions", json=body) as r:
            for _ in r.iter_raw():
                pass
    else:
        client.post(url + "/chat/completions", json=body).raise_for_status()
    return (time.perf_counter() - start) * 1000


def measure(direct: str, proxied: dict[str, str], n: int = 300) -> dict[str, dict[str, Dist]]:
    """Per mode (`json`, `stream`), per target name: latency distribution in ms."""
    targets = {"direct": direct, **proxied}
    out: dict[str, dict[str, Dist]] = {}
    headers = {"authorization": "Bearer sk-bench-key"}
    with httpx.Client(timeout=30, headers=headers) as client:
        for mode, stream in (("json", False), ("stream", True)):
            samples: dict[str, list[float]] = {name: [] for name in targets}
            for url in targets.values():  # warm-up
                for _ in range(20):
                    _one(client, url, stream)
            for _ in range(n):
                for name, url in targets.items():
                    samples[name].append(_one(client, url, stream))
            out[mode] = {name: Dist.of(s) for name, s in samples.items()}
    return out


def report(results: dict[str, dict[str, Dist]]) -> str:
    lines = [
        "| mode | target | p50 ms | p99 ms | p50 vs direct | p99 vs direct |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for mode, dists in results.items():
        base = dists["direct"]
        for name, d in dists.items():
            lines.append(
                f"| {mode} | {name} | {d.p50:.2f} | {d.p99:.2f} | "
                f"{d.p50 / base.p50:.2f}× | {d.p99 / base.p99:.2f}× |"
            )
    return "\n".join(lines)
