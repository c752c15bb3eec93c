"""Replicas plan like one (DESIGN.md §7): in-process apps sharing their learned state (an
in-memory `LearnedStore`) forward, for any assignment of a growing conversation's requests to
them, the bodies one app forwards — while the upstream's usage drifts, so calibration moves; a
replica whose memory is lost (a restart) forwards the same bytes as before."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.replicas import BillingUpstream, replay
from inflight.windows.shared import MemoryLearnedStore
from tests.support import load_traces

WORDS = "the build failed on step three because the cache key changed after the lockfile moved "


def conversation(sizes: list[int]) -> list[dict[str, Any]]:
    """A tool loop: one user message, then calls answered by outputs of `sizes` words."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the failing build."},
    ]
    for i, size in enumerate(sizes):
        call = {"id": f"call_{i}", "type": "function",
                "function": {"name": "shell", "arguments": f'{{"cmd": "step {i}"}}'}}  # fmt: skip
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": WORDS * size})
    return messages


def run(
    messages: list[dict[str, Any]], assign: list[int], replicas: int, strategy: str, drift: float
) -> list[dict[str, Any]]:
    store = MemoryLearnedStore() if replicas > 1 else None
    upstream = BillingUpstream(drift=drift)
    bodies = anyio.run(
        lambda: replay(
            [messages],
            replicas,
            strategy,
            limit=2048,
            upstream=upstream,
            learned=store,
            assign=lambda n: assign[n % len(assign)],
        )
    )
    return bodies[0]


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.integers(1, 40), min_size=4, max_size=22),
    replicas=st.integers(1, 3),
    assign=st.lists(st.integers(0, 2), min_size=1, max_size=12),
    drift=st.sampled_from([0.0, 0.01, -0.006]),
    strategy=st.sampled_from(["truncate,prune,trim", "middle-out"]),
)
def test_any_assignment_forwards_what_one_replica_forwards(
    sizes: list[int], replicas: int, assign: list[int], drift: float, strategy: str
) -> None:
    messages = conversation(sizes)
    one = run(messages, [0], 1, strategy, drift)
    many = run(messages, [a % replicas for a in assign], replicas, strategy, drift)
    assert many == one


def test_transcripts_round_robin_match_one_replica() -> None:
    """Two real transcripts, three replicas in turn: every forwarded body is the single
    replica's (without the shared state, calibration learned apart made them differ)."""
    traces = [m for name, m in load_traces() if name.startswith(("tau2", "openhands"))][:2]
    one = anyio.run(lambda: replay(traces, 1, "truncate,prune,trim", limit=8192))
    store = MemoryLearnedStore()
    three = anyio.run(lambda: replay(traces, 3, "truncate,prune,trim", limit=8192, learned=store))
    assert three == one
    requests = sum(len(r) for r in one)
    assert store.round_trips <= 2 * requests  # a version check and a publish per request


def test_a_replica_that_lost_its_memory_forwards_the_same(tmp_path: Path) -> None:
    """Replica 1 restarted (a fresh app: no calibration, no replays) after half the requests:
    with the shared state its next requests are what they would have been."""
    messages = conversation([30, 25, 35, 20, 40, 30, 25, 35, 20, 40, 30, 25])
    one = run(messages, [0], 1, "truncate,prune,trim", 0.003)
    store = MemoryLearnedStore()
    half = len(one) // 2
    upstream = BillingUpstream(drift=0.003)
    first = anyio.run(
        lambda: replay(
            [messages[: _points(messages)[half - 1]]],
            2,
            "truncate,prune,trim",
            limit=2048,
            upstream=upstream,
            learned=store,
        )
    )[0]
    # every app built again: their memories are gone, the shared store is not
    rest = anyio.run(
        lambda: replay(
            [messages],
            2,
            "truncate,prune,trim",
            limit=2048,
            upstream=upstream,
            learned=store,
            skip=half,
        )
    )[0]
    assert first + rest == one


def _points(messages: list[dict[str, Any]]) -> list[int]:
    from tests.support import request_points

    return request_points(messages)


MODELS = Path(__file__).resolve().parents[3] / "config" / "models.toml"


class _DownStore:
    """A learned-state store whose every call fails (`refused`) or never answers (`hung`)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.calls = 0

    async def changed(self, known: Any) -> dict[str, tuple[int, bytes | None]]:
        self.calls += 1
        if self.mode == "refused":
            raise ConnectionRefusedError(111, "Connection refused")
        await anyio.sleep(3600)
        return {}

    async def put(self, key: str, version: int, body: bytes) -> int | None:
        return await self.changed({}) and None

    async def close(self) -> None:
        return None


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["refused", "hung"])
async def test_a_store_that_is_down_or_hangs_never_fails_or_stalls_a_plan(mode: str) -> None:
    """Redis stopped or frozen mid-load: the request is planned on this replica's own state
    within the bound (it was a 500 on every compacting request while Redis was down)."""
    from inflight.tokens.calibration import Calibration
    from inflight.windows.registry import WindowRegistry
    from inflight.windows.shared import REFRESH_BOUND_SECONDS, SharedLearning
    from inflight.windows.table import ModelTable

    store = _DownStore(mode)
    table = ModelTable.load(MODELS)
    learning = SharedLearning(store, Calibration(), WindowRegistry(table, None))
    with anyio.fail_after(REFRESH_BOUND_SECONDS + 2):
        for _ in range(3):
            await learning.refresh("http://u/v1", "qwen2.5-7b-instruct")
    assert store.calls >= 1
    assert learning.unavailable == 3
