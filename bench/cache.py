"""Prompt-cache reuse against a real prefix cache: llama.cpp's, turn by turn.

A chat grows past a small window one turn at a time. Every turn is sent through inflight
(`auto`, and `auto` without summaries) and, for comparison, straight to llama.cpp after
keep-newest re-trimming on the client (what a naive trimmer does every request). The server
reports how many prompt tokens it reused from its cache (`prompt_tokens_details.cached_tokens`;
one slot, so the cache holds the previous prompt); the rest it had to process again. Summary
calls are counted as processed too: their prompts are work the model does.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

import anyio
import httpx

from bench.compaction import keep_newest
from bench.procs import proxy_in_process
from inflight.tokens.counter import ChatTokenCounter
from inflight.tokens.encodings import load_encodings

MODEL = "qwen2.5-coder-0.5b-instruct"
TOPICS = [
    "the nightly ETL job for the orders table failed with a timeout on the join step",
    "we want to partition the events table by day; what are the trade-offs",
    "the dashboard shows revenue per region, but EMEA numbers look doubled",
    "how should we deduplicate customer records coming from two CRMs",
    "the schema registry rejected version 7 of the invoice schema",
    "a data scientist asks for a sample of 1% of sessions, stratified by country",
]


def conversation(turns: int, run: str) -> list[dict[str, Any]]:
    """The chat; `run` opens the system prompt so no run (or earlier benchmark) shares a cached
    prefix with another: llama.cpp also keeps earlier prompts in a host-memory cache."""
    messages: list[dict[str, Any]] = [
        {
            "role": "system",
            "content": f"[{run}] You are a concise assistant for a data platform team.",
        }
    ]
    for i in range(turns):
        topic = TOPICS[i % len(TOPICS)]
        messages.append(
            {"role": "user", "content": f"Turn {i}: {topic}. Context: ticket DATA-{1000 + i}, "
             f"owner team {['core', 'growth', 'finance'][i % 3]}, priority P{i % 4}."}
        )  # fmt: skip
        messages.append(
            {"role": "assistant", "content": f"For turn {i}: check the logs of DATA-{1000 + i} "
             "first, then compare row counts before and after the step, and only then change "
             "the job's configuration; I will summarise what we find."}
        )  # fmt: skip
    return messages


@dataclass(slots=True)
class Tally:
    requests: int = 0
    failed: int = 0
    prompt: int = 0
    cached: int = 0
    summary_prompt: int = 0
    seconds: float = 0.0

    @property
    def processed(self) -> int:
        return self.prompt - self.cached + self.summary_prompt


def _cached(data: dict[str, Any]) -> int:
    usage = data.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    if isinstance(details.get("cached_tokens"), int):
        return int(details["cached_tokens"])
    return int((data.get("timings") or {}).get("cache_n") or 0)


async def _run(llm_url: str, turns: int, window: int) -> dict[str, Tally]:
    points = list(range(2, 2 * turns + 2, 2))  # after each user message
    counter = ChatTokenCounter(load_encodings())
    tallies: dict[str, Tally] = {}
    async with (
        proxy_in_process(llm_url) as proxy,
        httpx.AsyncClient(base_url=llm_url, timeout=600) as direct,
    ):
        runs = {
            "inflight auto (summaries)": (proxy, "auto"),
            "inflight auto, no summaries": (proxy, "truncate,prune,trim"),
            "keep-newest every request": (direct, None),
        }
        for name, (client, strategy) in runs.items():
            tally = tallies[name] = Tally()
            messages = conversation(turns, f"run {uuid.uuid4().hex[:12]}")
            started = time.perf_counter()
            for k in points:
                sent = messages[:k]
                headers = {}
                if strategy is None:
                    budget = window - 1  # max_tokens=1 is the output reserve, as in inflight
                    sent = keep_newest(sent, budget, lambda m: counter.count_message(MODEL, m))
                else:
                    headers = {
                        "X-Compaction-Strategy": strategy,
                        "X-Compaction-Context-Limit": str(window),
                    }
                path = "/chat/completions" if strategy is None else "/v1/chat/completions"
                body = {"model": MODEL, "messages": sent, "max_tokens": 1, "temperature": 0}
                response = await client.post(path, json=body, headers=headers)
                tally.requests += 1
                if response.status_code != 200:
                    tally.failed += 1
                    continue
                data = response.json()
                tally.prompt += int(data["usage"]["prompt_tokens"])
                tally.cached += _cached(data)
                tally.summary_prompt += int(
                    response.headers.get("x-compaction-summary-prompt-tokens", 0)
                )
            tally.seconds = time.perf_counter() - started
    return tallies


def report(llm_url: str, turns: int = 32, window: int = 1024) -> str:
    tallies = anyio.run(_run, llm_url, turns, window)
    lines = [
        f"A {turns}-turn chat replayed turn by turn against the llama.cpp test server "
        f"(Qwen2.5-Coder-0.5B, one slot, CPU) with a {window}-token window; the server's "
        "own count of cached prompt tokens:\n",
        "| run | requests | failed | prompt tokens | served from cache | processed (incl. "
        "summaries) | wall time |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, t in tallies.items():
        share = t.cached / t.prompt if t.prompt else 0.0
        lines.append(
            f"| {name} | {t.requests} | {t.failed} | {t.prompt} | {t.cached} ({share:.0%}) | "
            f"{t.processed} | {t.seconds:.0f} s |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    import os

    print(report(os.environ["INFLIGHT_TEST_LLM_URL"]))
