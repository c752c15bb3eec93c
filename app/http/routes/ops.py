"""Operations: liveness, readiness, usage totals and Prometheus metrics."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter
from starlette.responses import JSONResponse, PlainTextResponse, Response

from inflight.http import openapi
from inflight.http.state import ClientKey, State
from inflight.usage.records import name_apis

router = APIRouter()


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", response_model=None, openapi_extra=openapi.READYZ)
async def readyz(state: State) -> JSONResponse:
    """The background probe's last verdict (app/http/readiness.py): no key needed, so it
    never reaches the upstream, the store or the cache itself."""
    found = await state.readiness.current()
    body = found.as_json(time.monotonic())
    return JSONResponse(body, status_code=200 if found.ready else 503)


@router.get("/stats", openapi_extra=openapi.STATS)
async def stats(state: State, client: ClientKey) -> dict[str, Any]:
    names = {service.api.route: name for name, service in state.apis.items()}
    totals = name_apis(await state.store.totals(), names)
    labels = state.metrics.labels  # per-model tables bounded as /metrics' labels are
    return {
        **totals,
        "models": labels.fold(totals.get("models", {})),
        "summaries": state.metrics.summary_stats.snapshot(),
        "calibration": labels.named_only(state.counter.calibration_factors()),
        "calibration_detail": labels.named_only(state.counter.calibration()),
        "token_counting": {
            "heuristic_for": list(state.encodings_missing),
            "exact_encodings_loaded": not state.encodings_missing,
            "counters": {name: list(found) for name, found in state.counters.items()},
        },
        "usage_queue": {
            "depth": state.queue.depth,
            "written": state.queue.written,
            "failed": state.queue.failed,
            "dropped": state.queue.dropped,
        },
    }


@router.get(
    "/metrics",
    response_model=None,
    response_class=PlainTextResponse,
    openapi_extra=openapi.METRICS,
)
async def metrics(state: State, client: ClientKey) -> Response:
    return Response(state.metrics.render(), media_type=state.metrics.content_type)
