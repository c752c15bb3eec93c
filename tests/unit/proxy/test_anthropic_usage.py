"""Anthropic usage: the prompt is input + cache reads + cache writes, from a JSON answer and
from a stream's `message_start` and `message_delta`, however the stream is chunked."""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from inflight.apis.anthropic.events import EVENTS as ANTHROPIC_EVENTS
from inflight.cli.stats_table import render_stats
from inflight.proxy.sse_tap import SSETap, Usage
from inflight.usage.metrics import Metrics
from inflight.usage.records import UsageRecord
from inflight.usage.stores import open_store


def event(name: str, data: dict[str, object]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


START_USAGE = {
    "input_tokens": 12,
    "cache_creation_input_tokens": 3000,
    "cache_read_input_tokens": 40_000,
    "output_tokens": 1,
}
STREAM = b"".join(
    [
        event(
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg_1",
                    "type": "message",
                    "role": "assistant",
                    "content": [],
                    "model": "claude-sonnet-4-5",
                    "stop_reason": None,
                    "usage": START_USAGE,
                },
            },
        ),
        event("ping", {"type": "ping"}),
        event(
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        ),
        event(
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": "usage"},
            },
        ),
        event("content_block_stop", {"type": "content_block_stop", "index": 0}),
        event(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn"},
                "usage": {"output_tokens": 57},
            },
        ),
        event("message_stop", {"type": "message_stop"}),
    ]
)


def test_json_usage_counts_cache_reads_and_writes_in_the_prompt() -> None:
    usage = Usage.from_anthropic(START_USAGE | {"output_tokens": 57})
    assert usage == Usage(
        prompt_tokens=43_012, completion_tokens=57, cached_tokens=40_000, cache_write_tokens=3000
    )
    assert Usage.from_anthropic({"input_tokens": 5, "output_tokens": 2}) == Usage(5, 2, None, None)
    assert Usage.from_anthropic("nope") is None


@given(cuts=st.lists(st.integers(1, len(STREAM) - 1), max_size=12, unique=True))
def test_stream_usage_from_message_start_and_message_delta(cuts: list[int]) -> None:
    tap = SSETap(ANTHROPIC_EVENTS)
    relayed = b""
    edges = [0, *sorted(cuts), len(STREAM)]
    for a, b in itertools.pairwise(edges):
        relayed += tap.feed(STREAM[a:b])
    relayed += tap.flush()
    assert relayed == STREAM  # relayed as it arrives, nothing cut
    assert tap.done
    assert tap.usage == Usage(43_012, 57, 40_000, 3000)


def test_a_newer_message_delta_restating_the_prompt_wins() -> None:
    restated = {"output_tokens": 80, "input_tokens": 20, "cache_read_input_tokens": 40_000}
    stream = STREAM.replace(b'"usage":{"output_tokens":57}', b'"usage":' + orjson.dumps(restated))
    tap = SSETap(ANTHROPIC_EVENTS)
    tap.feed(stream)
    assert tap.usage == Usage(40_020, 80, 40_000, 3000)


def test_an_error_event_is_seen() -> None:
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    tap = SSETap(ANTHROPIC_EVENTS)
    tap.feed(STREAM.split(b"event: content_block_start")[0] + event("error", error))
    assert tap.error == error["error"]
    assert not tap.done


def _record(request_id: str, **kw: Any) -> UsageRecord:
    values: dict[str, Any] = {
        "ts": time.time(), "request_id": request_id, "kind": "chat",
        "model": "claude-sonnet-4-5", "client_key_id": None, "stream": True, "status": 200,
        "outcome": "completed", "latency_ms": 10.0, "ttfb_ms": 2.0, "prompt_tokens": 43_012,
        "completion_tokens": 57, "cached_tokens": 40_000, "cache_write_tokens": 3000,
        "tokens_before": 43_000, "tokens_after": 43_000, "strategies": (),
        "context_limit": 200_000, "route": "/v1/messages",
    }  # fmt: skip
    values.update(kw)
    return UsageRecord(**values)


@pytest.mark.anyio
async def test_stats_total_cache_writes_and_reads(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'usage.db'}")
    await store.open()
    try:
        await store.write_many([_record("a"), _record("b", cache_write_tokens=None)])
        stats = await store.totals()
    finally:
        await store.close()
    assert stats["tokens_cached"] == 80_000
    assert stats["tokens_cache_write"] == 3000
    assert stats["apis"]["/v1/messages"]["tokens_in"] == 86_024
    assert "cached 80.0k   cache writes 3.0k" in render_stats(stats)


def test_metrics_count_cache_writes() -> None:
    metrics = Metrics(lambda: 0, dict)
    metrics.observe(_record("a"))
    text = metrics.render().decode()
    assert 'inflight_tokens_total{kind="cache_write",model="claude-sonnet-4-5"} 3000.0' in text
    assert 'inflight_tokens_total{kind="cached",model="claude-sonnet-4-5"} 40000.0' in text
