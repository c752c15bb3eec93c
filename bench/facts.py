"""Fact retention of `summarize` against `trim`, with and without restore, with the real model.

Conversations plant facts (names, numbers, file paths) in their early turns, then grow with
filler until compaction must remove those turns. `retention`: the compacted prompt (from
`POST /v1/compaction/preview`, so only the summary calls run the model) is searched for each
planted fact, verbatim. `answers`: the model is asked for the facts through the proxy, with
trim, trim + restore, summarize and summarize + restore, and its answer is searched for them;
with restore on it may call `inflight_restore` (the proxy answers it: the calls and rounds
come from the `X-Compaction-Restore-*` headers). Needs INFLIGHT_TEST_LLM_URL
(../shared/local-llm).
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx

from bench.procs import proxy_in_process

FILLER = [
    "Can you explain what a context manager is in Python?",
    "What is the difference between a list and a tuple?",
    "How do I read a file line by line?",
    "What does the walrus operator do?",
    "How can I format a float with two decimals?",
    "What is a generator expression?",
]


def conversation(seed: int) -> tuple[list[dict[str, str]], list[str]]:
    rng = random.Random(seed)
    colour = rng.choice(["BLUE", "RED", "AMBER", "JADE"])
    animal = rng.choice(["HERON", "OTTER", "LYNX"])
    codename = f"{colour}-{animal}-{rng.randint(10, 99)}"
    port = str(rng.randint(20000, 65000))
    path = f"/srv/{rng.choice(['billing', 'search', 'auth'])}/config_{rng.randint(100, 999)}.yaml"
    person = rng.choice(["Priya Raman", "Tomasz Nowak", "Amara Okafor", "Lucía Ortega"])
    version = f"{rng.randint(2, 9)}.{rng.randint(0, 20)}.{rng.randint(0, 9)}"
    facts = [codename, port, path, person, version]
    messages = [
        {"role": "system", "content": "You are a helpful coding assistant."},
        {"role": "user", "content": "Hi, I need help with a deployment."},
        {"role": "assistant", "content": "Sure, tell me about the project."},
        {
            "role": "user",
            "content": f"The project codename is {codename} and its owner is {person}.",
        },
        {"role": "assistant", "content": "Noted the codename and the owner."},
        {"role": "user", "content": f"The service listens on port {port} and reads {path}."},
        {"role": "assistant", "content": "Got it: the port and the config path."},
        {"role": "user", "content": f"We must stay on library version {version}."},
        {"role": "assistant", "content": "Understood, I will keep that version."},
    ]
    for i in range(14):
        messages.append({"role": "user", "content": FILLER[i % len(FILLER)] + f" (question {i})"})
        messages.append(
            {
                "role": "assistant",
                "content": f"Answer {i}: " + "Here is a detailed explanation. " * 12,
            }
        )
    messages.append({"role": "user", "content": "Remind me of the project's key facts."})
    return messages, facts


MODEL = "qwen2.5-coder-0.5b-instruct"


def retention(llm_url: str, conversations: int = 3, window: int = 1600) -> str:
    model = MODEL

    async def run() -> dict[str, list[float]]:
        shares: dict[str, list[float]] = {"summarize": [], "trim": []}
        async with proxy_in_process(llm_url) as client:
            for seed in range(conversations):
                messages, facts = conversation(seed)
                for strategy in shares:
                    response = await client.post(
                        "/v1/compaction/preview",
                        json={"model": model, "messages": messages, "max_tokens": 64},
                        headers={
                            "X-Compaction-Strategy": strategy,
                            "X-Compaction-Context-Limit": str(window),
                        },
                    )
                    body: dict[str, Any] = response.json()
                    applied = body["report"]["applied"]
                    if strategy not in applied:
                        raise RuntimeError(f"{strategy} not applied: {body['report']}")
                    text = " ".join(str(m.get("content")) for m in body["messages"])
                    shares[strategy].append(sum(f in text for f in facts) / len(facts))
        return shares

    shares = anyio.run(run)
    lines = [
        f"{conversations} conversations, 5 planted facts each (codename, port, path, person, "
        f"version) in turns 2–4, compacted for a {window}-token window by the real "
        "Qwen2.5-Coder-0.5B (llama.cpp):\n",
        "| strategy | facts kept in the compacted prompt (mean) | per conversation |",
        "|---|---:|---|",
    ]
    for strategy, values in shares.items():
        per = ", ".join(f"{v:.0%}" for v in values)
        lines.append(f"| {strategy} | {statistics.mean(values):.0%} | {per} |")
    return "\n".join(lines)


QUESTION = (
    "What are the project's codename, its owner, the port, the config path and the library "
    "version? Answer with the exact values."
)
VARIANTS: dict[str, tuple[str, str]] = {  # name -> (strategy, restore)
    "trim": ("trim", "off"),
    "trim + restore": ("trim", "on"),
    "summarize": ("summarize", "off"),
    "summarize + restore": ("summarize", "on"),
}


@dataclass
class Outcome:
    """One variant's results over the conversations."""

    correct: list[float] = field(default_factory=list)  # share of facts in each answer
    calls: int = 0  # inflight_restore calls the model made
    rounds: list[int] = field(default_factory=list)  # upstream requests per answer
    seconds: list[float] = field(default_factory=list)
    errors: int = 0


async def _ask(
    client: httpx.AsyncClient, messages: list[dict[str, str]], variant: str, window: int
) -> tuple[str, int, int, float]:
    """The model's answer through the proxy, restore calls, rounds, and the wall time."""
    strategy, restore = VARIANTS[variant]
    asked = [*messages[:-1], {"role": "user", "content": QUESTION}]
    started = time.perf_counter()
    response = await client.post(
        "/v1/chat/completions",
        json={"model": MODEL, "messages": asked, "max_tokens": 96, "temperature": 0},
        headers={
            "X-Compaction-Strategy": strategy,
            "X-Compaction-Context-Limit": str(window),
            "X-Compaction-Restore": restore,
        },
    )
    seconds = time.perf_counter() - started
    response.raise_for_status()
    text = str(response.json()["choices"][0]["message"].get("content") or "")
    calls = int(response.headers.get("x-compaction-restore-calls", "0"))
    rounds = int(response.headers.get("x-compaction-restore-rounds", "1"))
    return text, calls, rounds, seconds


def answers(llm_url: str, conversations: int = 3, window: int = 1600) -> str:
    """Facts the model states correctly per variant, with the restore calls it made."""

    async def run() -> dict[str, Outcome]:
        outcomes = {variant: Outcome() for variant in VARIANTS}
        async with proxy_in_process(llm_url) as client:
            for seed in range(conversations):
                messages, facts = conversation(seed)
                for variant, outcome in outcomes.items():
                    try:
                        text, calls, rounds, seconds = await _ask(client, messages, variant, window)
                    except httpx.HTTPError:
                        outcome.errors += 1
                        continue
                    outcome.correct.append(sum(f in text for f in facts) / len(facts))
                    outcome.calls += calls
                    outcome.rounds.append(rounds)
                    outcome.seconds.append(seconds)
        return outcomes

    outcomes = anyio.run(run)
    lines = [
        f"{conversations} conversations, the same 5 planted facts, compacted for a {window}-token "
        "window; the real Qwen2.5-Coder-0.5B (llama.cpp, temperature 0) is asked for them through "
        "the proxy, and its answer is searched for each fact verbatim:\n",
        "| variant | facts answered (mean) | per conversation | restore calls | rounds "
        "(mean) | wall time (mean) | errors |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    for variant, o in outcomes.items():
        per = ", ".join(f"{v:.0%}" for v in o.correct)
        mean = statistics.mean(o.correct) if o.correct else 0.0
        rounds = statistics.mean(o.rounds) if o.rounds else 0.0
        seconds = statistics.mean(o.seconds) if o.seconds else 0.0
        lines.append(
            f"| {variant} | {mean:.0%} | {per} | {o.calls} | {rounds:.1f} | {seconds:.1f} s "
            f"| {o.errors} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    import os

    url = os.environ["INFLIGHT_TEST_LLM_URL"]
    print(retention(url))
    print()
    print(answers(url))
