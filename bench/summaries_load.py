"""Summaries under sustained load (DESIGN.md §12): a one-slot upstream (llama.cpp `-np 1`: its
`/props` says so) that is never idle — one agent sending back to back, or sixteen at once —
with the idle gate as a wall (before: a wait of 600 s) and as a preference (after: the default
bounded wait), side by side. Times are scaled down (answers of 0.1 s, summaries of 0.5 s, a
wait of 1 s) so a run takes a minute; what matters is their ratio.

Reported per mode and scenario: summary calls, what stood for each compacted request's cut
(`summaries.stand_ins` of `/stats`), how background summaries started, and the planted facts
found in each session's last forwarded prompt.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from typing import Any

import httpx
import orjson

from bench.procs import process, proxy_process
from tests.support import free_port
from tests.support.conversations import planted

ANSWER_SECONDS = 0.1
SUMMARY_SECONDS = 0.5
IDLE_WAIT = 1.0
WINDOW = 3000
ROUNDS = 40
MODES = {
    "before: the gate a wall (SUMMARY_IDLE_WAIT=600)": {"INFLIGHT_SUMMARY_IDLE_WAIT": "600"},
    f"after: bounded wait ({IDLE_WAIT:g} s)": {"INFLIGHT_SUMMARY_IDLE_WAIT": str(IDLE_WAIT)},
}


@contextmanager
def one_slot_upstream() -> Iterator[str]:
    port = free_port()
    argv = [
        sys.executable, "-m", "bench.one_slot_upstream", str(port),
        str(ANSWER_SECONDS), str(SUMMARY_SECONDS),
    ]  # fmt: skip
    with process(argv, f"http://127.0.0.1:{port}/props"):
        yield f"http://127.0.0.1:{port}/v1"


def _session(base_url: str, session: int) -> float:
    """One session back to back; the share of its facts in its last forwarded prompt."""
    messages, facts = planted(session, ROUNDS)
    last: list[Any] = []
    with httpx.Client(timeout=300) as client:
        for k in range(3, len(messages) + 1, 2):
            body = {"model": "local", "messages": messages[:k], "max_tokens": 200}
            response = client.post(
                base_url + "/chat/completions",
                content=orjson.dumps(body),
                headers={
                    "X-Compaction-Strategy": "summarize",
                    "X-Compaction-Context-Limit": str(WINDOW),
                },
            )
            response.raise_for_status()
            last = response.json()["bench_messages"]
    text = orjson.dumps(last).decode()
    return sum(f in text for f in facts) / len(facts)


def _run(base_url: str, sessions: int) -> dict[str, Any]:
    with ThreadPoolExecutor(sessions) as pool:
        kept = list(pool.map(lambda s: _session(base_url, s), range(sessions)))
    stats = httpx.get(base_url.removesuffix("/v1") + "/stats", timeout=10).json()["summaries"]
    return {"kept": kept, "stats": stats}


def _row(mode: str, scenario: str, result: dict[str, Any]) -> str:
    stats, kept = result["stats"], result["kept"]
    stood = stats.get("stand_ins", {})
    cut = sum(stood.values())
    share = stood.get("summary", 0) / cut if cut else 0.0
    how = stats["background"].get("started", {})
    started = ", ".join(f"{k} {v}" for k, v in sorted(how.items()))
    every = sum(1 for k in kept if k == 1.0)
    return (
        f"| {mode} | {scenario} | {stats['calls']} | {share:.0%} of {cut} | "
        f"{started or '—'} | {sum(kept) / len(kept):.0%} | {every} of {len(kept)} |"
    )


def report() -> str:
    env = {"INFLIGHT_DATABASE_URL": "none", "INFLIGHT_SUMMARY_TIMEOUT": "60"}
    lines = [
        f"A one-slot fake upstream (`/props`: `total_slots: 1`; answers {ANSWER_SECONDS:g} s, "
        f"summaries {SUMMARY_SECONDS:g} s, one at a time), sessions of {ROUNDS} tool rounds "
        f"with 10 planted facts, strategy `summarize`, a {WINDOW:,}-token window, every "
        "request sent as soon as the previous answer arrived.\n",
        "| mode | scenario | summary calls | compacted requests with a summary | started "
        "| facts in the last prompt (mean) | sessions with every fact |",
        "|---|---|---:|---:|---|---:|---:|",
    ]
    for scenario, sessions in (("1 session, back to back", 1), ("16 sessions at once", 16)):
        for mode, extra in MODES.items():
            with ExitStack() as stack:
                upstream = stack.enter_context(one_slot_upstream())
                url, _ = stack.enter_context(proxy_process(upstream, {**env, **extra}))
                lines.append(_row(mode, scenario, _run(url, sessions)))
    return "\n".join(lines)


if __name__ == "__main__":
    print(report())
