"""Token estimates against exact counts: o200k for an OpenAI model name, the real llama.cpp
server's tokenizer (Qwen2.5) before and after calibration, and the cost of counting.

For llama.cpp the truth is what the server itself counts for a chat request: `/apply-template`
then `/tokenize` of the rendered prompt (neither runs the model, so the window does not limit
them), at a few request points of each transcript. Run:

    INFLIGHT_TEST_LLM_URL=http://127.0.0.1:8090/v1 python -m bench.token_accuracy
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from inflight.tokens.counter import ChatTokenCounter
from inflight.tokens.encodings import load_encodings
from tests.support import load_traces, request_points

CALIBRATION_POINTS = 3  # earlier requests of the same conversation the proxy has seen
# What a client sends besides its agent runs (a ping, one-off questions): mostly chat template.
SHORT_PROMPTS = (
    "Reply with the single word: pong",
    "Is 91 a prime number? Answer yes or no.",
    "Translate to French, reply with the translation only: the meeting moved to Thursday.",
    "Our build log says: compile passed in 41s; lint passed in 9s; test failed after 113s "
    "with 3 errors in parser_test.py (lines 18, 77 and 102). Which step failed? One word.",
    "Write a haiku about a failing unit test.",
    "def add(a, b): return a + b  # called with two strings it concatenates them; a bug?",
)


def exact_o200k(messages: Sequence[Mapping[str, Any]]) -> int:
    """Independent reference: o200k over every text field with OpenAI's documented framing."""
    enc: Any = load_encodings().get("o200k_base")
    total = 3
    for m in messages:
        total += 3 + len(enc.encode_ordinary(str(m["role"])))
        total += len(enc.encode_ordinary(m.get("content") or ""))
        for call in m.get("tool_calls") or []:
            total += 7 + len(enc.encode_ordinary(call["function"]["name"]))
            total += len(enc.encode_ordinary(call["function"]["arguments"]))
        if m.get("tool_call_id"):
            total += len(enc.encode_ordinary(m["tool_call_id"]))
        if m.get("name"):
            total += 1 + len(enc.encode_ordinary(m["name"]))
    return total


def openai_report() -> str:
    """(a) Our count for `gpt-4o` against the independent o200k reference, per transcript."""
    counter = ChatTokenCounter(load_encodings())
    rows = ["| transcript | exact o200k | estimate | error |", "|---|---:|---:|---:|"]
    errors = []
    for name, messages in load_traces():
        exact = exact_o200k(messages)
        ours = counter.count_request("gpt-4o", {"messages": messages})
        errors.append(abs(ours - exact) / exact)
        rows.append(f"| {name[:44]} | {exact} | {ours} | {(ours - exact) / exact:+.2%} |")
    rows.append(f"| **max abs error** | | | **{max(errors):.2%}** |")
    return "\n".join(rows)


def _server_count(client: httpx.Client, root: str, messages: Sequence[Mapping[str, Any]]) -> int:
    """Prompt tokens as the server counts them: its chat template, then its tokenizer."""
    rendered = client.post(root + "/apply-template", json={"messages": messages})
    rendered.raise_for_status()
    tokens = client.post(root + "/tokenize", json={"content": rendered.json()["prompt"]})
    tokens.raise_for_status()
    return len(tokens.json()["tokens"])


def _points(messages: list[dict[str, Any]], n: int = CALIBRATION_POINTS + 1) -> list[int]:
    """`n` request points spread over the conversation (the last one is the test point)."""
    points = request_points(messages)
    if len(points) <= n:
        return points
    return [points[round(i * (len(points) - 1) / (n - 1))] for i in range(n)]


def llama_report(base_url: str, model: str = "qwen2.5-coder-0.5b-instruct") -> str:
    """(b) The heuristic against the llama.cpp server's own count (Qwen2.5 tokenizer and chat
    template, real message lists with tool calls) at the last request point of each transcript:
    uncalibrated; calibrated on short one-off requests only (mostly chat template: a factor
    learned there once inflated long prompts); calibrated on the server's counts for earlier
    requests of the same conversation (what the proxy has seen by then, from
    `usage.prompt_tokens`); and calibrated leave-one-out on the other transcripts only (a new
    kind of conversation)."""
    root = base_url.rstrip("/").removesuffix("/v1")
    encodings = load_encodings()
    fresh = ChatTokenCounter(encodings)
    samples: dict[str, list[tuple[list[dict[str, Any]], int]]] = {}
    shorts = ChatTokenCounter(encodings)
    with httpx.Client(timeout=120) as client:
        for name, messages in load_traces():
            samples[name] = [
                (messages[:k], _server_count(client, root, messages[:k])) for k in _points(messages)
            ]
        for prompt in SHORT_PROMPTS * 2:
            piece = [{"role": "user", "content": prompt}]
            shorts.observe(model, {"messages": piece}, _server_count(client, root, piece))
    rows = [
        "| transcript | llama.cpp tokens | uncalibrated | after short requests "
        "| after earlier turns | leave-one-out |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    errors: dict[str, list[float]] = {"raw": [], "shorts": [], "turns": [], "loo": []}
    for name, pieces in samples.items():
        *earlier, (last, real) = pieces
        same = ChatTokenCounter(encodings)
        for piece, count in earlier:
            same.observe(model, {"messages": piece}, count)
        others = ChatTokenCounter(encodings)
        for other, other_pieces in samples.items():
            for piece, count in other_pieces if other != name else []:
                others.observe(model, {"messages": piece}, count)
        cells = []
        for key, counter in (("raw", fresh), ("shorts", shorts), ("turns", same), ("loo", others)):
            estimate = counter.count_request(model, {"messages": last})
            error = (estimate - real) / real
            errors[key].append(abs(error))
            cells.append(f"{estimate} ({error:+.1%})")
        rows.append(f"| {name[:44]} | {real} | " + " | ".join(cells) + " |")
    means = " | ".join(f"**{statistics.mean(v):.1%}**" for v in errors.values())
    worst = " | ".join(f"{max(v):.1%}" for v in errors.values())
    rows.append(f"| **mean abs error** | | {means} |")
    rows.append(f"| max abs error | | {worst} |")
    return "\n".join(rows)


def cost_report(repeats: int = 5) -> str:
    """(c) Counting the largest transcript with a fresh counter (cold) and again (warm)."""
    name, messages = max(load_traces(), key=lambda t: sum(len(str(m.get("content"))) for m in t[1]))
    encodings = load_encodings()
    rows = ["| model | counting | cold | warm | cold / warm |", "|---|---|---:|---:|---:|"]
    for model in ("gpt-4o", "llama-3.1-8b"):
        colds: list[float] = []
        warms: list[float] = []
        for _ in range(repeats):
            counter = ChatTokenCounter(encodings)
            for target in (colds, warms):
                start = time.perf_counter()
                counter.count_request(model, {"messages": messages})
                target.append((time.perf_counter() - start) * 1000)
        cold, warm = statistics.median(colds), statistics.median(warms)
        kind = "o200k (exact)" if counter.is_exact(model) else "heuristic"
        rows.append(f"| {model} | {kind} | {cold:.1f} ms | {warm:.2f} ms | {cold / warm:.0f}× |")
    chars = sum(len(str(m.get("content") or "")) for m in messages)
    return (
        f"Counting `{name}` ({len(messages)} messages, {chars / 1000:.0f}k characters of "
        f"content), median of {repeats}:\n\n" + "\n".join(rows)
    )


def main(argv: list[str] | None = None) -> int:
    """`python -m bench.token_accuracy [--llm-url URL]`: print the three tables as markdown."""
    parser = argparse.ArgumentParser(prog="python -m bench.token_accuracy")
    parser.add_argument(
        "--llm-url",
        default=os.environ.get("INFLIGHT_TEST_LLM_URL"),
        help="llama.cpp base URL (default: $INFLIGHT_TEST_LLM_URL); section (b) is skipped without",
    )
    args = parser.parse_args(argv)
    print("### Token counts: estimate vs exact o200k (model `gpt-4o`)\n")
    print(openai_report() + "\n")
    if args.llm_url:
        print("### Token counts: heuristic vs the llama.cpp server (Qwen2.5 tokenizer)\n")
        print(llama_report(args.llm_url) + "\n")
    else:
        print("(llama.cpp section skipped: no --llm-url / INFLIGHT_TEST_LLM_URL)\n")
    print("### Counting cost\n")
    print(cost_report() + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
