"""Replicas plan like one, with real processes: three `inflight serve` processes sharing one
real Redis behind a round-robin loop (request i to replica i % 3, no stickiness) forward the
prompts one process forwards, request for request — JSON and streamed answers alike, while the
upstream's usage moves calibration; a replica killed (SIGKILL) mid-conversation and started
again changes nothing; with summaries, prompt changes stay those of one process."""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from bench.replicas import BillingUpstream, prompt_changes
from tests.support import free_port, load_traces, request_points
from tests.support.redis_server import redis_url
from tests.support.servers import serve

pytestmark = [pytest.mark.e2e, pytest.mark.redis]
ROOT = Path(__file__).resolve().parents[2]
MODEL = "qwen2.5-7b-instruct"  # heuristic counting: calibration moves on every answer
TRACES = ("tau2_gpt-4.1_retail_task71", "tau2_gpt-4.1_airline_task18")


@dataclass
class Upstream:
    """A chat upstream billing like a real tokenizer (o200k, a template's framing, a drift per
    request, so calibration keeps moving); streams when asked, usage in its last chunk.
    Summaries are answered with a text of their transcript. Keeps each forwarded body's
    bytes (summaries apart)."""

    billing: BillingUpstream = field(default_factory=lambda: BillingUpstream(drift=0.002))
    bodies: list[bytes] = field(default_factory=list)
    summaries: int = 0

    def reset(self) -> None:
        self.billing, self.bodies, self.summaries = BillingUpstream(drift=0.002), [], 0

    async def chat(self, request: Request) -> Response:
        raw = await request.body()
        body = orjson.loads(raw)
        messages = body.get("messages") or []
        last = str(messages[-1].get("content", "")) if messages else ""
        if "<transcript>" in last:
            self.summaries += 1
            digest = hashlib.sha256(last.encode()).hexdigest()[:12]
            return _answer(f"summary {digest}: the facts so far", 50)
        self.bodies.append(raw)
        prompt = self.billing.billed(messages)
        self.billing.served += 1
        if body.get("stream") is True:
            return StreamingResponse(_chunks(prompt), media_type="text/event-stream")
        return _answer("ok", prompt)

    def app(self) -> Starlette:
        async def missing(request: Request) -> Response:
            return JSONResponse({"error": {"message": "not found"}}, status_code=404)

        return Starlette(
            routes=[
                Route("/v1/chat/completions", self.chat, methods=["POST"]),
                Route("/v1/models", missing, methods=["GET"]),
            ]
        )


def _answer(text: str, prompt: int) -> Response:
    message = {"role": "assistant", "content": text}
    return JSONResponse(
        {
            "id": "chatcmpl-e2e", "object": "chat.completion", "created": 1, "model": MODEL,
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": 1,
                      "total_tokens": prompt + 1},
        }
    )  # fmt: skip


async def _chunks(prompt: int) -> AsyncIterator[bytes]:
    head = {"id": "chatcmpl-e2e", "object": "chat.completion.chunk", "created": 1, "model": MODEL}
    delta = {"index": 0, "delta": {"role": "assistant", "content": "ok"}, "finish_reason": None}
    usage = {"prompt_tokens": prompt, "completion_tokens": 1, "total_tokens": prompt + 1}
    for event in (
        {**head, "choices": [delta]},
        {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        {**head, "choices": [], "usage": usage},
    ):
        yield b"data: " + orjson.dumps(event) + b"\n\n"
    yield b"data: [DONE]\n\n"


class Replica:
    """One `inflight serve` process on its own port."""

    def __init__(self, env: dict[str, str]) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        command = [sys.executable, "-m", "inflight.cli.commands", "serve",
                   "--port", str(self.port), "--log-level", "warning"]  # fmt: skip
        self.proc = subprocess.Popen(
            command, env={**os.environ, **env}, cwd=ROOT,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip

    def ready(self) -> bool:
        assert self.proc.poll() is None, (
            self.proc.stderr.read().decode() if self.proc.stderr else ""
        )
        try:
            return httpx.get(self.base + "/readyz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        if self.proc.stderr:
            self.proc.stderr.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.proc.stderr:
            self.proc.stderr.close()


def wait_ready(processes: Sequence[Replica], timeout: float = 40) -> None:
    deadline = time.monotonic() + timeout
    waiting = list(processes)
    while waiting:
        waiting = [p for p in waiting if not p.ready()]
        assert time.monotonic() < deadline, "replicas did not become ready"
        if waiting:
            time.sleep(0.05)


def env(upstream: str, cache_url: str) -> dict[str, str]:
    return {
        "INFLIGHT_UPSTREAM_URL": upstream,
        "INFLIGHT_CACHE_URL": cache_url,
        "INFLIGHT_DATABASE_URL": "none",
        "INFLIGHT_CONFIG_DIR": str(ROOT / "config"),
        "INFLIGHT_SUMMARY_WAIT": "true",  # a compaction's request makes its summary
    }


def conversations() -> list[list[dict[str, Any]]]:
    found = dict(load_traces())
    return [found[name] for name in TRACES]


async def balance(
    bases: list[str],
    strategy: str,
    limit: int = 4096,
    between: Any = None,
) -> None:
    """Every conversation turn by turn, request i to `bases[i % len(bases)]`, each sent once
    the previous answer was read to its end; odd requests stream. `between(i, bases)` runs
    before request i (a restart)."""
    headers = {
        "authorization": "Bearer e2e",
        "x-compaction-strategy": strategy,
        "x-compaction-context-limit": str(limit),
    }
    i = 0
    async with httpx.AsyncClient(timeout=30) as client:
        for messages in conversations():
            for k in request_points(messages):
                if between is not None:
                    await between(i, bases)
                body = {"model": MODEL, "messages": messages[:k], "max_tokens": 256,
                        "stream": i % 2 == 1}  # fmt: skip
                url = bases[i % len(bases)] + "/v1/chat/completions"
                async with client.stream("POST", url, json=body, headers=headers) as answer:
                    text = await answer.aread()
                    assert answer.status_code == 200, text
                    if i % 2 == 1:
                        assert text.rstrip().endswith(b"data: [DONE]"), text[-200:]
                i += 1


class SlowWrites:
    """A TCP relay in front of Redis that holds each chunk carrying a shared-state write (the
    compare-and-set script, `hset`) for `delay` seconds: a Redis across a network or under
    load, so a publish lands well after the replica sent it (everything else passes at once,
    each connection's bytes in order)."""

    def __init__(self, target: int, delay: float) -> None:
        self.target, self.delay, self.port = target, delay, free_port()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._writers: set[asyncio.StreamWriter] = set()

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, writes: bool
    ) -> None:
        self._writers.add(writer)
        try:
            while data := await reader.read(1 << 16):
                if writes and b"hset" in data:
                    await asyncio.sleep(self.delay)
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass  # a replica killed: its connection is simply gone
        finally:
            writer.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        await asyncio.gather(
            self._pipe(reader, up_writer, True), self._pipe(up_reader, writer, False)
        )

    def __enter__(self) -> SlowWrites:
        self._thread.start()
        start = asyncio.start_server(self._accept, "127.0.0.1", self.port)
        self._server = asyncio.run_coroutine_threadsafe(start, self._loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        async def close() -> None:
            self._server.close()
            for writer in list(self._writers):
                writer.close()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


GROUPS = {"one": 1, "three": 3, "restart": 3, "auto_one": 1, "auto_three": 3}


@dataclass
class Fleet:
    upstream: Upstream
    upstream_url: str
    redis: str  # the slow relay's redis://host:port/ (each group its own database)
    groups: dict[str, list[Replica]]

    def env(self, group: str) -> dict[str, str]:
        return env(self.upstream_url, self.redis + str(list(GROUPS).index(group) + 1))

    def run(self, group: str, strategy: str, between: Any = None) -> list[bytes]:
        """The bodies the upstream received through `group`, round robin."""
        self.upstream.reset()
        bases = [r.base for r in self.groups[group]]
        anyio.run(balance, bases, strategy, 4096, between)
        return list(self.upstream.bodies)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """Every group's processes started at once (starting is most of the time), ready."""
    fake = Upstream()
    with ExitStack() as stack:
        redis = stack.enter_context(redis_url(tmp_path_factory.mktemp("redis")))
        port = int(redis.rsplit(":", 1)[1].split("/")[0])
        slow = stack.enter_context(SlowWrites(port, delay=0.08))
        url = stack.enter_context(serve(fake.app())) + "/v1"
        fleet = Fleet(fake, url, f"redis://127.0.0.1:{slow.port}/", {})

        def stop_all() -> None:  # every replica in the fleet at the end (restarted ones too)
            for group in fleet.groups.values():
                for replica in group:
                    replica.stop()

        stack.callback(stop_all)
        for group, count in GROUPS.items():
            fleet.groups[group] = [Replica(fleet.env(group)) for _ in range(count)]
        wait_ready([r for group in fleet.groups.values() for r in group], timeout=80)
        yield fleet


@pytest.fixture(scope="module")
def one_replica(fleet: Fleet) -> list[bytes]:
    return fleet.run("one", "truncate,prune,trim")


def test_three_replicas_round_robin_forward_one_replicas_prompts(
    fleet: Fleet, one_replica: list[bytes]
) -> None:
    """Byte for byte, every request: each answer's usage is published before its last bytes
    (its `[DONE]`), so the next request, on another replica, is planned on it."""
    three = fleet.run("three", "truncate,prune,trim")
    assert len(three) == len(one_replica) > 20
    unequal = [i for i, (a, b) in enumerate(zip(one_replica, three, strict=True)) if a != b]
    assert unequal == []


def test_a_replica_killed_and_started_again_forwards_the_same(
    fleet: Fleet, one_replica: list[bytes]
) -> None:
    """Replica 1 SIGKILLed right after it answered, a new process in its place: the bodies
    from then on (and before) are one replica's."""
    total = len(one_replica)
    group = fleet.groups["restart"]

    async def restart(i: int, bases: list[str]) -> None:
        if i != total // 2:
            return
        victim = (i - 1) % len(bases)  # the replica that answered the previous request
        group[victim].kill()
        fresh = Replica(fleet.env("restart"))
        group[victim] = fresh  # stopped with the fleet
        await anyio.to_thread.run_sync(wait_ready, [fresh])
        bases[victim] = fresh.base

    three = fleet.run("restart", "truncate,prune,trim", restart)
    assert len(three) == total
    unequal = [i for i, (a, b) in enumerate(zip(one_replica, three, strict=True)) if a != b]
    assert unequal == []


def test_with_summaries_prompt_changes_stay_one_replicas(fleet: Fleet) -> None:
    """`auto` with summaries shared through Redis: at most one more prompt change per
    compaction event than one replica makes."""
    one = fleet.run("auto_one", "auto")
    events = fleet.upstream.summaries
    three = fleet.run("auto_three", "auto")
    a = prompt_changes([orjson.loads(b) for b in one])
    b = prompt_changes([orjson.loads(b) for b in three])
    assert events >= 1
    assert abs(b.breaks - a.breaks) <= events, (a, b, events)
