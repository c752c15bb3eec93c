"""`GET /dashboard` (the page and its two static files) and `GET /stats/timeseries` (its data).

The page itself holds no data: it is served to anyone and reads `/stats` and
`/stats/timeseries`, which are keyed like every other route when `INFLIGHT_API_KEYS` is set.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from starlette.exceptions import HTTPException
from starlette.responses import Response

from inflight.dashboard.assets import DashboardAssets
from inflight.errors import BadRequest
from inflight.http import openapi
from inflight.http.state import ClientKey, State

# The page runs only its own script and talks only to this origin.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}

# name: (default, minimum, maximum)
TIMESERIES_PARAMS = {
    "bucket": (60, 1, 86_400),
    "window": (3_600, 1, 31 * 86_400),
    "recent": (20, 0, 500),
}

_INT_PARAMS = [
    {
        "name": name,
        "in": "query",
        "required": False,
        "schema": {"type": "integer", "minimum": low, "maximum": high, "default": default},
    }
    for name, (default, low, high) in TIMESERIES_PARAMS.items()
]
TIMESERIES_DOC: dict[str, Any] = {
    "description": (
        "Usage in time buckets of `bucket` seconds over the last `window` seconds (only buckets "
        "with traffic are listed), and the `recent` most recent requests."
    ),
    "parameters": _INT_PARAMS,
    "responses": openapi.errors(400, 401),
}
PAGE_DOC: dict[str, Any] = {
    "responses": {"200": {"description": "The dashboard page", "content": {"text/html": {}}}}
}


def _int_param(request: Request, name: str) -> int:
    default, low, high = TIMESERIES_PARAMS[name]
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        raise BadRequest(f"{name} must be an integer from {low} to {high}", param=name)
    return value


def build_router(assets: DashboardAssets) -> APIRouter:
    """The dashboard's routes, serving `assets` (loaded once by `create_app`)."""
    router = APIRouter()

    def serve(name: str) -> Response:
        asset = assets.get(name)
        if asset is None:
            raise HTTPException(status_code=404)
        return Response(asset.content, media_type=asset.media_type, headers=SECURITY_HEADERS)

    @router.get("/dashboard", response_class=Response, openapi_extra=PAGE_DOC)
    async def page() -> Response:
        return serve("index.html")

    @router.get("/dashboard/{name}", response_class=Response, include_in_schema=False)
    async def static(name: str) -> Response:
        return serve(name if name != "index.html" else "")

    @router.get("/stats/timeseries", openapi_extra=TIMESERIES_DOC)
    async def timeseries(request: Request, state: State, client: ClientKey) -> dict[str, Any]:
        bucket = _int_param(request, "bucket")
        window = _int_param(request, "window")
        recent = _int_param(request, "recent")
        until = int(time.time()) // bucket * bucket
        since = until - (window // bucket) * bucket
        activity = await state.store.activity(since, bucket, recent)
        return {"bucket": bucket, "since": since, "until": until, "currency": "USD", **activity}

    return router
