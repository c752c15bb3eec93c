"""Replicas behind a round-robin balancer against one proxy: the transcripts replayed turn by
turn through N in-process apps (each its own `create_app`, so its own calibration, windows and
replay caches), request n served by replica n mod N, against an upstream that bills what it
receives like a real tokenizer does (o200k with a chat template's framing, which the heuristic
counting a Qwen model's prompts does not know: calibration moves). With `CACHE_URL` the apps
share one Redis; without, each learns alone (the measured problem). Reported: prompt-cache
breaks (a forwarded prompt that does not start with the previous one) and prefix reuse.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AsyncExitStack, contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson

from inflight.cli.simulate import common_prefix
from inflight.factory import create_app
from inflight.settings import Settings
from inflight.tokens.encodings import EncodingSet, load_encodings
from inflight.windows.shared import LearnedStore, MemoryLearnedStore
from tests.support import free_port, load_traces, request_points
from tests.support.redis_server import RedisServer

MODEL = "qwen2.5-7b-instruct"  # heuristic counting: calibration is active
CONFIG = Path(__file__).resolve().parents[1] / "config"
STRATEGIES = ("truncate,prune,trim", "auto")


@dataclass
class BillingUpstream:
    """Bills a prompt like a real server: o200k over its texts, a template's framing per
    message and per request, and `drift` more per request served (a usage that keeps moving
    calibration). Records every forwarded chat body; answers summaries with a fixed text."""

    per_message: int = 5
    per_request: int = 24
    drift: float = 0.0
    usage: bool = True  # False: answers carry no usage, so calibration is held still
    bodies: list[dict[str, Any]] = field(default_factory=list)
    served: int = 0

    def billed(self, messages: Sequence[Mapping[str, Any]]) -> int:
        from tests.support.fakes.chat import reference_tokens

        base = reference_tokens([dict(m) for m in messages])
        rate = 1.0 + self.drift * self.served
        return round(rate * base) + self.per_message * len(messages) + self.per_request

    def handle(self, request: httpx.Request) -> httpx.Response:
        if not request.url.path.endswith("/chat/completions"):  # discovery: nothing to say
            return httpx.Response(404, json={"error": {"message": "not found"}})
        body = orjson.loads(request.content)
        messages = body.get("messages") or []
        summary = bool(messages) and "<transcript>" in str(messages[-1].get("content", ""))
        if not summary:
            self.bodies.append(body)
            self.served += 1
        prompt = self.billed(messages)
        text = "summary: the facts so far" if summary else "ok"
        usage = {"prompt_tokens": prompt, "completion_tokens": 1, "total_tokens": prompt + 1}
        return httpx.Response(
            200,
            json={
                "id": "chatcmpl-bench",
                "object": "chat.completion",
                "created": 1,
                "model": body.get("model", MODEL),
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text},
                        "finish_reason": "stop",
                    }
                ],
                **({"usage": usage} if self.usage else {}),
            },
        )


def settings(tmp: str, cache_url: str | None, **extra: Any) -> Settings:
    values: dict[str, Any] = {
        "upstream_url": "http://upstream.test/v1",
        "database_url": "none",
        "config_dir": CONFIG,
        "cache_url": cache_url,
        "summary_wait": True,
        **extra,
    }
    return Settings(_env_file=None, **values)


@dataclass(frozen=True, slots=True)
class Reuse:
    """A replay's prompt changes: breaks (the previous prompt is not a prefix of the next) and
    the mean share of each prompt's messages repeated from the previous one (by characters)."""

    breaks: int
    reuse: float
    requests: int


def prompt_changes(bodies: Sequence[Mapping[str, Any]]) -> Reuse:
    breaks, shares = 0, []
    previous: list[bytes] | None = None
    for body in bodies:
        now = [orjson.dumps(m) for m in body["messages"]]
        if previous is not None:
            same = common_prefix(previous, now)
            breaks += same < len(previous)
            shares.append(sum(map(len, now[:same])) / max(1, sum(map(len, now))))
        previous = now
    return Reuse(breaks, statistics.mean(shares) if shares else 1.0, len(bodies))


async def replay(
    conversations: Sequence[Sequence[Mapping[str, Any]]],
    replicas: int,
    strategy: str,
    *,
    limit: int = 8192,
    cache_url: str | None = None,
    assign: Callable[[int], int] | None = None,
    upstream: BillingUpstream | None = None,
    learned: LearnedStore | None = None,
    skip: int = 0,
    encodings: EncodingSet | None = None,
) -> list[list[dict[str, Any]]]:
    """Each conversation replayed turn by turn through `replicas` in-process apps (request n
    of all to replica `assign(n)`, round robin by default), from its request `skip` on; the
    bodies the upstream received, per conversation. `learned`: what the apps share their
    learned state through (else Redis at `cache_url`, else nothing)."""
    upstream = upstream if upstream is not None else BillingUpstream()
    transport = httpx.MockTransport(upstream.handle)
    headers = {
        "authorization": "Bearer bench",
        "x-compaction-strategy": strategy,
        "x-compaction-context-limit": str(limit),
    }
    pick = assign if assign is not None else (lambda n: n % replicas)
    out: list[list[dict[str, Any]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        async with AsyncExitStack() as stack:
            clients = []
            for _ in range(replicas):
                app = create_app(
                    settings(tmp, cache_url), transport=transport, encodings=encodings,
                    learned=learned,
                )  # fmt: skip
                await stack.enter_async_context(app.router.lifespan_context(app))
                client = httpx.AsyncClient(
                    transport=httpx.ASGITransport(app=app), base_url="http://proxy", timeout=60
                )
                clients.append(await stack.enter_async_context(client))
            n = 0
            for messages in conversations:
                start = len(upstream.bodies)
                for k in request_points(messages)[skip:]:
                    body = {"model": MODEL, "messages": list(messages[:k]), "max_tokens": 512}
                    client = clients[pick(n)]
                    response = await client.post("/v1/chat/completions", json=body, headers=headers)
                    response.raise_for_status()
                    n += 1
                out.append(upstream.bodies[start:])
    return out


def changes(runs: Sequence[Sequence[Mapping[str, Any]]]) -> Reuse:
    each = [prompt_changes(r) for r in runs]
    shares = [e.reuse for e in each]
    return Reuse(
        sum(e.breaks for e in each), statistics.mean(shares), sum(e.requests for e in each)
    )


@contextmanager
def _redis() -> Iterator[str | None]:
    """A throwaway redis-server when the binary is installed, else None (no shared state)."""
    binary = shutil.which("redis-server")
    if binary is None:
        yield None
        return
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(binary, Path(tmp), free_port())
        server.start()
        try:
            yield server.url
        finally:
            server.stop()


def _run(
    traces: Sequence[Sequence[Mapping[str, Any]]],
    replicas: int,
    strategy: str,
    limit: int,
    encodings: EncodingSet,
) -> tuple[list[list[dict[str, Any]]], int]:
    """One replay on a fresh shared state (its own redis-server when installed, else the
    in-process store), and the round trips to it where counted."""
    with _redis() as url:
        store = None if url else MemoryLearnedStore()
        runs = anyio.run(
            partial(
                replay, traces, replicas, strategy, limit=limit, cache_url=url, learned=store,
                encodings=encodings,
            )
        )  # fmt: skip
    return runs, store.round_trips if store is not None else -1


def calibration_cost(limits: Sequence[int] = (4096, 8192, 16384)) -> str:
    """One replica: prompt-cache breaks with calibration learning against held still (answers
    without usage), per window and strategy."""
    traces = [messages for _, messages in load_traces()]
    encodings = load_encodings()
    lines = [
        "| window | strategy | learning: breaks | reuse | held still: breaks | reuse |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for limit in limits:
        for strategy in STRATEGIES:
            a, b = (
                changes(anyio.run(partial(replay, traces, 1, strategy, **options)))
                for options in (
                    {"limit": limit, "encodings": encodings, "upstream": BillingUpstream(usage=u)}
                    for u in (True, False)
                )
            )
            lines.append(
                f"| {limit} | {strategy} | {a.breaks} | {a.reuse:.1%} "
                f"| {b.breaks} | {b.reuse:.1%} |"
            )
    return "\n".join(lines)


def report(replicas: int = 3, limit: int = 8192) -> str:
    """One replica against `replicas` round-robin sharing one Redis, per strategy."""
    traces = [messages for _, messages in load_traces()]
    encodings = load_encodings()
    lines = [
        f"| strategy | 1 replica: breaks | reuse | {replicas} round-robin: breaks | reuse "
        "| bodies equal to 1 replica's |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for strategy in STRATEGIES:
        one, _ = _run(traces, 1, strategy, limit, encodings)
        many, _ = _run(traces, replicas, strategy, limit, encodings)
        a, b = changes(one), changes(many)
        pairs = zip(one, many, strict=True)
        same = sum(x == y for r1, r2 in pairs for x, y in zip(r1, r2, strict=True))
        lines.append(
            f"| {strategy} | {a.breaks} | {a.reuse:.1%} | {b.breaks} | {b.reuse:.1%} "
            f"| {same}/{a.requests} |"
        )
    shared = "one redis-server" if shutil.which("redis-server") else "an in-process store"
    requests = sum(len(request_points(t)) for t in traces)
    lines.append(
        f"\n{len(traces)} transcripts, {requests} requests per run, model `{MODEL}` (heuristic "
        f"counting, calibrated on usage billed like o200k plus a template's framing), window "
        f"{limit}; the replicas share {shared} (`CACHE_URL`): summaries and learned state."
    )
    lines.append("\nOne replica, calibration learning against held still:\n")
    lines.append(calibration_cost())
    return "\n".join(lines)


if __name__ == "__main__":
    print(report())
