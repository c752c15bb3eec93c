"""Summaries off the request path (DESIGN.md §12), before and after: the transcripts replayed
turn by turn through real proxy processes against a fake upstream whose summary calls are slow,
with wait mode on (`INFLIGHT_SUMMARY_WAIT=true`: each compaction event waits for its summary,
the old way) and off (the default: summaries made in the background), the latter without
partial stand-ins (`INFLIGHT_SUMMARY_PARTIAL=1`) and with them (the default), side by side.

Reported per mode: per-request latency (p50/p99/max), compaction events counted as prompt
changes (requests whose forwarded prompt does not extend the previous one: the events, plus
each summary that lands after its event) and mean prefix reuse (the share of a prompt's tokens
that repeat the previous prompt's prefix: what an upstream prompt cache reuses).
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.ahead import PARTIAL, reachable
from bench.procs import process, proxy_process
from inflight.tokens.counter import ChatTokenCounter
from inflight.tokens.encodings import load_encodings
from tests.support import free_port, load_traces, request_points
from tests.support.conversations import common_prefix

SUMMARY_SECONDS = 2.0
ANSWER_SECONDS = 1.0
WINDOWS = (8192, 16384)  # the first is the figure; the second, room for the turns
MAX_TOKENS = 1024
LEAD = 2  # requests a summary takes: SUMMARY_SECONDS / ANSWER_SECONDS


@dataclass
class Replay:
    """One mode's replay of every transcript."""

    latencies: list[float] = field(default_factory=list)
    changes: int = 0
    shares: list[float] = field(default_factory=list)
    states: dict[str, int] = field(default_factory=dict)
    calls: int = 0  # summary calls the proxy made (`/stats`), in the background or waited for


@contextmanager
def summary_upstream() -> Any:
    port = free_port()
    argv = [
        sys.executable, "-m", "bench.summary_upstream", str(port),
        str(SUMMARY_SECONDS), str(ANSWER_SECONDS),
    ]  # fmt: skip
    with process(argv, f"http://127.0.0.1:{port}/v1/models"):
        yield f"http://127.0.0.1:{port}/v1"


def _conversation(base_url: str, messages: list[dict[str, Any]], window: int) -> Replay:
    """One transcript, request by request, as its client would send them."""
    counter = ChatTokenCounter(load_encodings())

    def tokens(messages: Sequence[Mapping[str, Any]]) -> int:
        return sum(counter.count_message("gpt-4o", m) for m in messages)

    out = Replay()
    previous: list[Any] | None = None
    with httpx.Client(timeout=120) as client:
        for k in request_points(messages):
            body = {"model": "bench", "messages": messages[:k], "max_tokens": MAX_TOKENS}
            started = time.perf_counter()
            response = client.post(
                base_url + "/chat/completions",
                json=body,
                headers={"X-Compaction-Context-Limit": str(window)},
            )
            out.latencies.append(time.perf_counter() - started)
            response.raise_for_status()
            state = response.headers.get("x-compaction-summary")
            if state is not None:
                out.states[state] = out.states.get(state, 0) + 1
            sent = response.json()["bench_messages"]
            if previous is not None:
                same = common_prefix(previous, sent)
                out.changes += same < len(previous)
                out.shares.append(tokens(sent[:same]) / max(1, tokens(sent)))
            previous = sent
    return out


def _replay(
    base_url: str, traces: Sequence[tuple[str, list[dict[str, Any]]]], window: int
) -> Replay:
    """Every transcript at once, each its own client (as concurrent agent sessions)."""
    with ThreadPoolExecutor(len(traces)) as pool:
        parts = list(pool.map(lambda trace: _conversation(base_url, trace[1], window), traces))
    out = Replay()
    for part in parts:
        out.latencies += part.latencies
        out.changes += part.changes
        out.shares += part.shares
        for state, n in part.states.items():
            out.states[state] = out.states.get(state, 0) + n
    return out


def _ms(values: Sequence[float], q: float) -> str:
    ordered = sorted(values)
    return f"{ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000:,.0f} ms"


MODES = {
    "wait": {"INFLIGHT_SUMMARY_WAIT": "true"},
    "background, no partial stand-ins (before: SUMMARY_PARTIAL=1)": {
        "INFLIGHT_SUMMARY_WAIT": "false",
        "INFLIGHT_SUMMARY_PARTIAL": "1",
    },
    "background, partial stand-ins from 0.5 (after: the defaults)": {
        "INFLIGHT_SUMMARY_WAIT": "false",
    },
}


def _window(window: int, traces: Sequence[tuple[str, list[dict[str, Any]]]]) -> str:
    """Every mode side by side at one window: the table and the verdicts."""
    env = {
        "INFLIGHT_DATABASE_URL": "none",
        "INFLIGHT_SUMMARY_TIMEOUT": "60",
        # the fake answers concurrently, like a hosted API or a separate SUMMARY_UPSTREAM_URL
        "INFLIGHT_SUMMARY_WHEN_IDLE": "false",
        "INFLIGHT_SUMMARY_CONCURRENCY": str(len(traces)),  # one per session
    }
    with ExitStack() as stack:
        upstream = stack.enter_context(summary_upstream())
        urls = {
            name: stack.enter_context(proxy_process(upstream, {**env, **extra}))[0]
            for name, extra in MODES.items()
        }
        with ThreadPoolExecutor(len(urls)) as pool:
            futures = {
                name: pool.submit(_replay, url, traces, window) for name, url in urls.items()
            }
            results = {name: future.result() for name, future in futures.items()}
        for name, url in urls.items():
            stats = httpx.get(url.removesuffix("/v1") + "/stats", timeout=10).json()
            results[name].calls = stats["summaries"]["calls"]
    waited = results["wait"].changes
    lines = [
        f"**{window:,}-token window**\n",
        "| mode | requests | p50 | p99 | max | prompt changes | mean prefix reuse | "
        "X-Compaction-Summary | summary calls |",
        "|---|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for name, r in results.items():
        states = ", ".join(f"{k} {v}" for k, v in sorted(r.states.items()))
        lines.append(
            f"| {name} | {len(r.latencies)} | {_ms(r.latencies, 0.5)} | {_ms(r.latencies, 0.99)} "
            f"| {max(r.latencies) * 1000:,.0f} ms | {r.changes} "
            f"| {statistics.mean(r.shares):.1%} | {states} | {r.calls} |"
        )
    verdicts = []
    for name, r in list(results.items())[1:]:
        ratio = r.changes / max(1, waited)
        within = "within" if ratio <= 1.5 else "NOT within"
        verdicts.append(
            f"{name}: {r.changes} against {waited} waiting, {ratio:.2f}× — {within} 1.5×"
        )
    events, sent, prefixed = reachable(window, LEAD)
    best = 2 * events - sent - prefixed
    bound = (
        f"At best (offline, `bench/ahead.py`): of the {events} events, {sent} cut only what the "
        f"client had sent {LEAD} requests before, and {prefixed} more a span of which the "
        f"client had sent a prefix holding at least {PARTIAL:g} of its tokens (that prefix's "
        f"summary may stand in); the others need a summary of a turn sent one request before "
        f"the event, which a {SUMMARY_SECONDS:g} s summary cannot finish in a "
        f"{ANSWER_SECONDS:g} s answer, so no policy gets below {best} prompt changes, "
        f"{best / max(1, events):.2f}× the events."
    )
    summary = "Prompt changes in the background — " + "; ".join(verdicts) + "."
    return "\n".join(lines) + "\n\n" + summary + " " + bound


def report() -> str:
    traces = load_traces()
    legend = (
        f"The {len(traces)} transcripts in `tests/data/traces` replayed at once, each request by "
        f"request as its own session, at a {WINDOWS[0]:,}-token window, then at {WINDOWS[1]:,} "
        f"({MAX_TOKENS}-token output reserve, strategy `auto`), through a proxy process to a "
        f"fake upstream that answers in {ANSWER_SECONDS:g} s (a model answering) and summarises "
        f"in {SUMMARY_SECONDS:g} s, serving requests concurrently (`SUMMARY_WHEN_IDLE=false`, "
        f"`SUMMARY_CONCURRENCY={len(traces)}`); the three proxies run side by side. Summary "
        f"calls: what each proxy asked the summariser in all (`/stats`).\n\n"
    )
    return legend + "\n\n".join(_window(window, traces) for window in WINDOWS)
