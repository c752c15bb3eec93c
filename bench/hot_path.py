"""The hot path (issue 16): what inflight adds against a bare relay as conversations grow.

- Added latency on loopback for a 60-message request and a 300-message session (each request
  the previous one plus a message), JSON and stream time to first byte, with the ratio of
  inflight's added latency to a bare FastAPI + httpx relay's, both against the same upstream.
- inflight's own work in process (ASGI app, in-memory upstream, minus the same bare relay) for
  a 2,000-message conversation that gains one message a request.
- Cold counting of a 300-message transcript, and plan time at the compaction events of the
  transcripts (a request whose cut moved), p50 and p99.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AsyncExitStack
from functools import partial
from pathlib import Path
from typing import Any
from unittest.mock import patch

import httpx
import orjson

from bench.overhead import _bare_relay
from bench.own_work import HEADERS
from inflight.cli.simulate import request_points
from inflight.compaction.engine import compact
from inflight.compaction.policy import Budget
from inflight.compaction.replays import ReplayCache, Replays
from inflight.proxy.upstream import POOL_SHARDS
from inflight.strategies import StrategyName
from inflight.tokens.counter import ChatTokenCounter, Counted, count_within
from inflight.tokens.encodings import EncodingSet, load_encodings
from inflight.tokens.heuristic import heuristic_tokens, heuristic_tokens_by_regex
from tests.support import load_traces

Messages = list[dict[str, Any]]


def conversation(size: int, words: int) -> Messages:
    """An agent conversation: system, task, then tool rounds of `words`-word outputs."""
    messages: Messages = [
        {"role": "system", "content": "You are a coding agent. " * 20},
        {"role": "user", "content": "Fix the failing test in the repository."},
    ]
    i = 0
    while len(messages) < size:
        arguments = orjson.dumps({"cmd": f"grep -rn 'case {i}' src/"}).decode()
        call = {
            "id": f"c{i}",
            "type": "function",
            "function": {"name": "bash", "arguments": arguments},
        }
        messages.append({"role": "assistant", "content": f"Step {i}.", "tool_calls": [call]})
        text = " ".join(
            f"src/m{i}.py:{j}: case {j} {'ok' if j % 3 else '[x]'}" for j in range(words)
        )
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": text})
        i += 1
    return messages[:size]


def growing(messages: Messages, start: int, count: int) -> Iterator[bytes]:
    """Request bodies of a session: `start` messages, then one more each request."""
    for k in range(start, start + count):
        yield orjson.dumps({"model": "bench", "messages": messages[: min(k, len(messages))]})


# -- added latency over loopback -------------------------------------------------------------


def _time(client: httpx.Client, url: str, body: bytes, stream: bool) -> float:
    """ms: the whole JSON answer, or the first byte of a stream."""
    content = body if not stream else body[:-1] + b',"stream":true}'
    start = time.perf_counter()
    if not stream:
        client.post(url + "/chat/completions", content=content).raise_for_status()
        return (time.perf_counter() - start) * 1000
    with client.stream("POST", url + "/chat/completions", content=content) as response:
        response.raise_for_status()
        first = 0.0
        for _ in response.iter_raw():
            first = first or (time.perf_counter() - start) * 1000
        return first


def added_latency(
    targets: dict[str, str], n: int = 200, earlier: str | None = None, rounds: int = 3
) -> str:
    """Targets: "direct", "bare relay", "inflight" base URLs, and "inflight before" (an earlier
    checkout at `earlier`, else this build with the replay cache off: `bench.variant`).
    Interleaved request by request, each build in a pass of its own with direct and the relay
    (see `_passes`), `rounds` passes per build, before and after in turn."""
    cases = {
        "60 messages (~20k tokens)": (conversation(60, 75), 60, False),
        "300-message session (~45k tokens)": (conversation(360, 30), 300, True),
    }
    lines = [
        "| request | mode | direct p50 ms | bare relay adds | inflight adds, before → after "
        "| inflight / relay, before → after | after, each pass |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    with httpx.Client(timeout=60, headers=HEADERS) as client:
        for label, (messages, start, grows) in cases.items():
            bodies = list(growing(messages, start, n if grows else 1))
            for mode in ("json", "stream TTFB"):
                passes = [
                    _passes(client, targets, bodies, n, mode != "json") for _ in range(rounds)
                ]
                (_, _, before), (d1, r1, after) = (
                    tuple(statistics.median(p[b][k] for p in passes) for k in range(3))
                    for b in (0, 1)
                )
                ratio = [statistics.median(p[b][2] / p[b][1] for p in passes) for b in (0, 1)]
                each = " ".join(f"{p[1][2] / p[1][1]:.2f}" for p in passes)
                lines.append(
                    f"| {label} | {mode} | {d1:.2f} | {r1:.2f} | {before:.2f} → {after:.2f} | "
                    f"{ratio[0]:.2f}× → {ratio[1]:.2f}× | {each} |"
                )
    return (
        f"Added latency on loopback, p50 of {n} requests per target, interleaved request by "
        "request with direct calls and the bare relay, one pass per build (the session adds a "
        f"message each request), {rounds} passes per build in turn; before: "
        f"{_before(earlier)}. Each ratio is against the relay of its own pass, the median "
        "pass's shown (each pass's after it); the milliseconds are the median pass's, the "
        "relay's of the after passes:\n\n" + "\n".join(lines)
    )


def _passes(
    client: httpx.Client, targets: dict[str, str], bodies: list[bytes], n: int, stream: bool
) -> list[tuple[float, float, float]]:
    """(direct p50, relay's added, the build's added) ms, for the build before, then after.
    One build per pass: in a single interleaving of both, what one proxy does after its answer
    (the usage record, the next event's prediction, calibrating) lands on the other's next
    request — on two cores shared by the client, the upstream and the servers, that moved
    both builds' figures by 0.3–0.6 ms."""
    out = []
    for build in ("inflight before", "inflight"):
        names = ("direct", "bare relay", build)
        p50 = _interleaved(client, {name: targets[name] for name in names}, bodies, n, stream)
        direct = p50["direct"]
        out.append((direct, p50["bare relay"] - direct, p50[build] - direct))
    return out


def _before(before: str | None) -> str:
    return f"the checkout at `{before}`" if before else "the same build with the replay cache off"


def _interleaved(
    client: httpx.Client, targets: dict[str, str], bodies: list[bytes], n: int, stream: bool
) -> dict[str, float]:
    """p50 ms per target, request by request in turn (each session's first request warms)."""
    samples: dict[str, list[float]] = {name: [] for name in targets}
    for url in targets.values():
        for _ in range(10):
            _time(client, url, bodies[0], stream)
    for i in range(n):
        for name, url in targets.items():
            samples[name].append(_time(client, url, bodies[i % len(bodies)], stream))
    return {name: statistics.median(s) for name, s in samples.items()}


# -- inflight's own work, in process ---------------------------------------------------------


async def _ms_per_request(app: Any, bodies: Sequence[bytes]) -> float:
    """Median ms per request of `bodies` through `app` in process (the first three warm)."""
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as client:
        samples = []
        for i, body in enumerate(bodies):
            start = time.perf_counter()
            await client.post("/v1/chat/completions", content=body, headers=HEADERS)
            if i >= 3:
                samples.append((time.perf_counter() - start) * 1000)
        return statistics.median(samples)


ROOT = Path(__file__).resolve().parent.parent


def _measured(root: Path, cases: Path) -> dict[str, float]:
    """`bench/own_work.py` on `cases` with the `app` of the checkout at `root`."""
    script = Path(__file__).with_name("own_work.py")
    env = {**os.environ, "PYTHONPATH": str(root)}
    out = subprocess.run(
        [sys.executable, str(script), str(cases)],
        cwd=root, env=env, capture_output=True, check=True, timeout=900,
    )  # fmt: skip
    results: dict[str, float] = json.loads(out.stdout)
    return results


def own_work(before: str | None = None, rounds: int = 3, count: int = 40) -> str:
    """inflight's own work in process (ASGI, in-memory upstream) per request of sessions that
    grow a message a request, minus a bare relay's; with `before` (an earlier checkout), both
    builds measured in alternating rounds, each figure the median round."""
    cases = [
        ("60 messages", conversation(200, 75), 60, 131_072),
        ("300 messages", conversation(400, 30), 300, 131_072),
        ("2,000 messages, under the threshold", conversation(2100, 8), 2000, 1_000_000),
        ("2,000 messages, compacted (32k window)", conversation(2100, 8), 2000, 32_768),
    ]
    builds = {"after": ROOT} | ({"before": Path(before).resolve()} if before else {})
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in builds}
    bare: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "cases.json"
        payload = [
            {
                "label": label,
                "window": window,
                "bodies": [b.decode() for b in growing(messages, start, count + 3)],
            }
            for label, messages, start, window in cases
        ]
        path.write_text(json.dumps(payload))
        for label, messages, start, _ in cases:
            bodies = list(growing(messages, start, count + 3))
            bare[label] = asyncio.run(_ms_per_request(_bare_relay(), bodies))
        for _ in range(rounds):
            for name, root in builds.items():
                runs[name].append(_measured(root, path))
    ms = {
        name: {c[0]: statistics.median(r[c[0]] for r in rs) for c in cases}
        for name, rs in runs.items()
    }
    if before:
        lines = [
            "| conversation | bare relay ms | inflight ms, before → after "
            "| inflight's own work ms, before → after |",
            "|---|---:|---:|---:|",
        ]
        for label, *_ in cases:
            b, a, relay = ms["before"][label], ms["after"][label], bare[label]
            lines.append(
                f"| {label} | {relay:.2f} | {b:.2f} → {a:.2f} | {b - relay:.2f} → {a - relay:.2f} |"
            )
        what = f"before: the checkout at `{before}`, measured in alternating rounds"
    else:
        lines = ["| conversation | bare relay ms | inflight ms | inflight's own work ms |"]
        lines.append("|---|---:|---:|---:|")
        for label, *_ in cases:
            a, relay = ms["after"][label], bare[label]
            lines.append(f"| {label} | {relay:.2f} | {a:.2f} | {a - relay:.2f} |")
        what = "`--before DIR` adds an earlier checkout's figures"
    return (
        "In process (ASGI, in-memory upstream that reports a plausible prompt count), each "
        f"request the previous one plus a message, median of {count} requests after three, "
        f"median of {rounds} rounds; {what}:\n\n" + "\n".join(lines)
    )


def _count_and_plan(
    messages: Messages, window: int, remember: bool, start: int = 2000, count: int = 41
) -> float:
    """Median ms of count + plan (as the service does them, `compact`) per request of a session
    growing a message a request from `start` (its first request not timed)."""
    counter = ChatTokenCounter(load_encodings())
    replays = Replays(ReplayCache(), partial(counter.counting, "gpt-4o"))
    budget = Budget(window, 1024, 0.8, 0.5)
    pipeline: tuple[StrategyName, ...] = ("truncate", "prune", "trim")
    samples = []
    for k in range(start, start + count):
        request = orjson.loads(orjson.dumps(messages[:k]))  # a new request's own objects
        memo = Counted()
        begin = time.perf_counter()
        fixed = counter.count_fixed("gpt-4o", {"messages": request})
        compact(
            request,
            pipeline,
            budget,
            lambda m, r=request, c=memo: count_within(counter, "gpt-4o", r, c, m),
            fixed,
            replays=replays if remember else None,
        )
        samples.append((time.perf_counter() - begin) * 1000)
    return statistics.median(samples[1:])


def plan_work() -> str:
    """Counting and planning alone for a 2,000-message conversation, one new message a
    request: the replay cache off, then on."""
    messages = conversation(2100, 8)
    rows = []
    for label, window in (("under the threshold", 1_000_000), ("compacted (32k window)", 32_768)):
        before, after = (_count_and_plan(messages, window, on) for on in (False, True))
        rows.append(f"| 2,000 messages, {label} | {before:.2f} → {after:.2f} |")
    return (
        "Count + plan of the same 2,000-message session (o200k, `truncate, prune, trim`), "
        "median of 40 requests, before (the replay cache off) → after:\n\n"
        "| conversation | count + plan ms |\n|---|---:|\n" + "\n".join(rows)
    )


# -- counting and compaction events ----------------------------------------------------------


def _median_ms(work: Callable[[], object], runs: int = 5) -> float:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        work()
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


def cold_counting(runs: int = 21) -> str:
    """A 300-message transcript counted by a new counter each time: exact counts as a default
    install makes them (rs_bpe), with the `fast` extra (quicktok for ASCII text, rs_bpe for
    the rest) and with tiktoken alone (before); the heuristic against its former regex passes
    (the same figures: tests/unit/tokens/test_tokens_fast.py)."""
    encodings = load_encodings()
    default = EncodingSet(encodings.encodings, encodings.missing, {}, encodings.text_counters)
    tiktoken_only = EncodingSet(encodings.encodings, encodings.missing)
    traces = load_traces()
    name, messages = min(traces, key=lambda t: abs(len(t[1]) - 300))
    body: Mapping[str, Any] = {"messages": messages}
    cases = [
        ("gpt-4o", "o200k: rs_bpe (default install)", default, heuristic_tokens),
        ("gpt-4o", "o200k: `fast` extra (quicktok for ASCII, rs_bpe else)", encodings,
         heuristic_tokens),
        ("gpt-4o", "o200k: tiktoken alone (before)", tiktoken_only, heuristic_tokens),
        ("llama-3.1-8b", "heuristic, bit counts", encodings, heuristic_tokens),
        ("llama-3.1-8b", "heuristic, regex passes (before)", encodings, heuristic_tokens_by_regex),
    ]  # fmt: skip
    if not encodings.text_counters:
        cases = [c for c in cases if "rs_bpe" not in c[1]]  # no wheel for this platform
    rows = []
    for model, label, loaded, heuristic in cases:
        with patch("inflight.tokens.raw_counts.heuristic_tokens", heuristic):
            tokens = ChatTokenCounter(loaded).count_request(model, body)
            ms = _median_ms(
                lambda m=model, e=loaded: ChatTokenCounter(e).count_request(m, body), runs
            )
        rows.append(f"| {model} | {label} | {tokens} | {ms:.1f} ms |")
    return (
        f"Cold counting of `{name}` ({len(messages)} messages, a new counter each time), "
        f"median of {runs}:\n\n| model | counting | tokens | cold count |\n|---|---|---:|---:|\n"
        + "\n".join(rows)
    )


def event_plan_times(window: int = 16_384) -> str:
    """Per transcript, turn by turn with one warm counter, as the service plans (the replay
    cache off, then on): the count + plan time of each request whose compaction moved (a new
    event) and of the others, p50 and p99 over all transcripts."""
    counter = ChatTokenCounter(load_encodings())
    budget = Budget(window, 1024, 0.8, 0.5)
    pipeline: tuple[StrategyName, ...] = ("truncate", "prune", "trim")
    times: dict[bool, tuple[list[float], list[float]]] = {False: ([], []), True: ([], [])}
    for _, messages in load_traces():
        points = request_points(messages)
        for remember in (False, True):
            replays = Replays(ReplayCache(), partial(counter.counting, "gpt-4o"))
            events, quiet = times[remember]
            last: tuple[int, ...] = ()
            for k in points:
                request = copy.deepcopy(messages[:k])  # a new request's own objects
                memo = Counted()  # as the service counts: the request at once
                start = time.perf_counter()
                fixed = counter.count_fixed("gpt-4o", {"messages": request})
                result = compact(
                    request,
                    pipeline,
                    budget,
                    lambda m, r=request, c=memo: count_within(counter, "gpt-4o", r, c, m),
                    fixed,
                    replays=replays if remember else None,
                )
                took = (time.perf_counter() - start) * 1000
                (events if result.plan.events != last else quiet).append(took)
                last = result.plan.events
    return _event_table(times, window)


def _event_table(times: dict[bool, tuple[list[float], list[float]]], window: int) -> str:
    def p(values: list[float], q: float) -> float:
        ordered = sorted(values)
        return ordered[int(q * (len(ordered) - 1))] if ordered else 0.0

    rows = []
    for i, name in enumerate(("a compaction event (the cut moved)", "no event")):
        before, after = times[False][i], times[True][i]
        rows.append(
            f"| {name} | {len(after)} | {p(before, 0.5):.2f} → {p(after, 0.5):.2f} | "
            f"{p(before, 0.99):.2f} → {p(after, 0.99):.2f} |"
        )
    return (
        "Count + plan per request of the eight transcripts replayed turn by turn "
        f"({window // 1024}k window, warm counter, o200k), before (the replay cache off) → "
        "after:\n\n| request | count | p50 ms | p99 ms |\n|---|---:|---:|---:|\n" + "\n".join(rows)
    )


# -- the outbound HTTP client: httpx against httpx2 ------------------------------------------


async def _client_round(
    module: Any, url: str, body: bytes, n: int, concurrency: int, pools: int = 1
) -> float:
    """Requests per second through `pools` pooled AsyncClients of `module` (httpx or httpx2),
    configured as app/proxy/upstream.py configures its pools (the connections shared out, a
    request taking the least busy), `concurrency` at a time."""
    limits = module.Limits(
        max_connections=1000 // pools, max_keepalive_connections=200 // pools, keepalive_expiry=30
    )
    async with AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(
                module.AsyncClient(limits=limits, timeout=60, trust_env=False)
            )
            for _ in range(pools)
        ]
        loads = [0] * pools
        for client in clients:
            for _ in range(20):  # warm the pool
                (await client.post(url, content=body)).raise_for_status()
        queue = iter(range(n))
        start = time.perf_counter()

        async def worker() -> None:
            for _ in queue:
                pool = loads.index(min(loads))
                loads[pool] += 1
                client = clients[pool]
                request = client.build_request("POST", url, content=body)
                answer = await client.send(request, stream=True)
                async for _chunk in answer.aiter_raw():
                    pass
                await answer.aclose()
                loads[pool] -= 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return n / (time.perf_counter() - start)


def http_clients(upstream: str, n: int = 2000, rounds: int = 3) -> str:
    """httpx in one pool, httpx in inflight's pools (app/proxy/upstream.py `POOL_SHARDS`), and
    httpx2 (the successor the openai SDK depends on) in one pool, as the outbound client,
    interleaved round by round against the fake upstream."""
    import httpx2

    body = orjson.dumps({"model": "bench", "messages": conversation(60, 75)})
    url = upstream + "/chat/completions"
    clients = {"httpx": (httpx, 1), "httpx, pools": (httpx, POOL_SHARDS), "httpx2": (httpx2, 1)}
    rows = []
    for concurrency in (1, 64):
        rates: dict[str, list[float]] = {name: [] for name in clients}
        for _ in range(rounds):
            for name, (module, pools) in clients.items():
                count = n if concurrency > 1 else n // 4
                rates[name].append(
                    asyncio.run(_client_round(module, url, body, count, concurrency, pools))
                )
        one, many, two = (statistics.median(rates[k]) for k in clients)
        rows.append(
            f"| {concurrency} | {one:.0f} | {many:.0f} | {many / one:.2f}× | {two:.0f} | "
            f"{two / one:.2f}× |"
        )
    return (
        f"The outbound client, requests/s against the fake upstream (60-message JSON body, "
        f"limits as app/proxy/upstream.py sets them; median of {rounds} interleaved rounds):\n\n"
        f"| concurrent requests | httpx 0.28, one pool | httpx, {POOL_SHARDS} pools (inflight) "
        "| pools / one | httpx2, one pool | httpx2 / httpx |\n|---:|---:|---:|---:|---:|---:|\n"
        + "\n".join(rows)
    )
