"""Usage and errors of the Responses API as the proxy reads them: the JSON body's `usage`, the
stream's `response.completed`, and its `error` / `response.failed` events."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from inflight.apis.responses.events import EVENTS as RESPONSES_EVENTS
from inflight.proxy.service import usage_from_json
from inflight.proxy.sse_tap import SSETap, Usage

RESPONSES_USAGE = {
    "input_tokens": 1200,
    "input_tokens_details": {"cached_tokens": 1024},
    "output_tokens": 7,
    "output_tokens_details": {"reasoning_tokens": 0},
    "total_tokens": 1207,
}


def event(kind: str, **fields: Any) -> bytes:
    data = orjson.dumps({"type": kind, "sequence_number": 0, **fields})
    return b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"


def stream(completed: dict[str, Any] | None = None) -> bytes:
    response = {"id": "resp_1", "object": "response", "status": "in_progress", "usage": None}
    done = {**response, "status": "completed", "usage": RESPONSES_USAGE, **(completed or {})}
    return b"".join(
        [
            event("response.created", response=response),
            event("response.output_text.delta", item_id="m", delta='say "usage"'),
            event("response.completed", response=done),
        ]
    )


def test_usage_from_a_responses_json_body() -> None:
    body = orjson.dumps({"id": "resp_1", "object": "response", "usage": RESPONSES_USAGE})
    assert usage_from_json(body) == Usage(1200, 7, 1024)


def test_chat_usage_still_wins_when_both_spellings_are_there() -> None:
    usage = {"prompt_tokens": 10, "completion_tokens": 2, "input_tokens": 99}
    assert Usage.from_json(usage) == Usage(10, 2, None)


@given(cuts=st.lists(st.integers(1, 400), max_size=8))
def test_usage_from_response_completed_however_the_stream_is_cut(cuts: list[int]) -> None:
    data = stream()
    for strip in (False, True):  # nothing of a Responses stream is ever cut out
        tap = SSETap(RESPONSES_EVENTS, strip_usage_chunk=strip)
        out = b""
        start = 0
        for cut in sorted(c % (len(data) + 1) for c in cuts):
            out += tap.feed(data[start:cut]) if cut > start else b""
            start = max(start, cut)
        out += tap.feed(data[start:]) + tap.flush()
        assert out == data
        assert tap.usage == Usage(1200, 7, 1024)
        assert tap.done


@pytest.mark.parametrize(
    "frame",
    [
        event("error", code="context_length_exceeded", message="Your input exceeds the context"),
        event(
            "error",
            error={
                "type": "invalid_request_error",
                "code": "context_length_exceeded",
                "message": "Your input exceeds the context window of this model.",
            },
        ),
        event(
            "response.failed",
            response={
                "id": "r",
                "status": "failed",
                "usage": None,
                "error": {"code": "server_error", "message": "boom"},
            },
        ),
    ],
)
def test_error_events_are_seen(frame: bytes) -> None:
    tap = SSETap(RESPONSES_EVENTS)
    assert tap.feed(frame) == frame
    assert tap.error is not None
    assert tap.usage is None


def test_stats_count_each_compacting_api_apart() -> None:
    """`/stats` `apis` (DESIGN.md §2): requests and tokens per API, by the record's route."""
    from inflight.apis.registry import route_names
    from inflight.usage.records import name_apis
    from inflight.usage.stores.sql import summarize

    groups = [
        # model, kind, status, outcome, route, n, prompt, completion, cached, saved, before
        ("gpt-4.1", "chat", 200, "completed", "/v1/chat/completions", 3, 300, 30, 100, 0, 300),
        ("gpt-4.1", "chat", 200, "completed", "/v1/responses", 2, 1200, 14, 1024, 50, 1250),
        ("gpt-4.1", "chat", 400, "rejected", "/v1/responses", 1, 0, 0, 0, 0, 0),
        ("", "chat", 401, "rejected", "", 1, 0, 0, 0, 0, 0),  # before routes were recorded
        ("gpt-4.1", "summary", 200, "completed", "", 1, 500, 60, 0, 0, 0),
        ("", "passthrough", 200, "completed", "/v1/models", 4, 0, 0, 0, 0, 0),
    ]
    stats = summarize(groups, [], [])
    assert stats["apis"] == {  # by route in the store
        "/v1/chat/completions": {"requests": 4, "tokens_in": 300, "tokens_out": 30,
                                 "tokens_cached": 100},
        "/v1/responses": {"requests": 3, "tokens_in": 1200, "tokens_out": 14,
                          "tokens_cached": 1024},
    }  # fmt: skip
    assert name_apis(stats, route_names())["apis"] == {  # by name at the edge, every API there
        "chat": {"requests": 4, "tokens_in": 300, "tokens_out": 30, "tokens_cached": 100},
        "responses": {"requests": 3, "tokens_in": 1200, "tokens_out": 14, "tokens_cached": 1024},
        "messages": {"requests": 0, "tokens_in": 0, "tokens_out": 0, "tokens_cached": 0},
    }
    assert stats["requests"] == 7


def test_metrics_count_each_compacting_api_apart() -> None:
    from inflight.usage.metrics import Metrics
    from inflight.usage.records import UsageRecord

    def record(route: str | None, status: int = 200, kind: Any = "chat") -> UsageRecord:
        return UsageRecord(
            ts=0.0, request_id="r", kind=kind, model="gpt-4.1", client_key_id=None, stream=True,
            status=status, outcome="completed", latency_ms=1.0, ttfb_ms=None, prompt_tokens=10,
            completion_tokens=1, cached_tokens=0, tokens_before=10, tokens_after=10,
            strategies=(), context_limit=None, route=route,
        )  # fmt: skip

    from inflight.apis.registry import route_names

    metrics = Metrics(lambda: 0, dict, api_names=route_names())
    metrics.observe(record("/v1/responses"))
    metrics.observe(record("/v1/responses", status=400))
    metrics.observe(record("/v1/chat/completions"))
    metrics.observe(record(None))
    metrics.observe(record("/v1/responses", kind="passthrough"))
    text = metrics.render().decode()
    for series in (
        'inflight_api_requests_total{api="responses",status="200"} 1.0',
        'inflight_api_requests_total{api="responses",status="400"} 1.0',
        'inflight_api_requests_total{api="chat",status="200"} 2.0',
    ):
        assert series in text, series
