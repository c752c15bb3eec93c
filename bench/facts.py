"""Fact retention of `summarize` against `trim`, with the real llama.cpp model.

Conversations plant facts (names, numbers, file paths) in their early turns, then grow with
filler until compaction must remove those turns. The compacted prompt (from
`POST /v1/compaction/preview`, so only the summary calls run the model) is searched for each
planted fact, verbatim. Needs INFLIGHT_TEST_LLM_URL (../shared/local-llm).
"""

from __future__ import annotations

import random
import statistics
from typing import Any

import anyio

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


def retention(llm_url: str, conversations: int = 3, window: int = 1600) -> str:
    model = "qwen2.5-coder-0.5b-instruct"

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


if __name__ == "__main__":
    import os

    print(retention(os.environ["INFLIGHT_TEST_LLM_URL"]))
