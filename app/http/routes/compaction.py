"""`POST /v1/compaction/preview` and `POST /v1/compaction/count`: compaction without forwarding."""

from __future__ import annotations

from functools import partial
from typing import Any, NoReturn

from fastapi import APIRouter, Request
from starlette.exceptions import HTTPException

from inflight.apis.detect import detect_api
from inflight.compaction.offload import offload
from inflight.compaction.report import Preview, count_report, preview_report
from inflight.compaction.wire import ApiName
from inflight.http import openapi_compaction
from inflight.http.routes.passthrough import METHODS
from inflight.http.state import ClientKey, State
from inflight.proxy.body import parse_model_body, read_body

router = APIRouter()


async def _plan(request: Request, state: State, *, count: bool) -> tuple[ApiName, Preview]:
    """The body, in whichever API it speaks (DESIGN.md §8), compacted (`count`: only counted)."""
    raw = await read_body(request, state.settings.max_body_bytes)
    name = detect_api(request.headers, parse_model_body(raw))
    api = state.apis[name].api  # every API detect_api names is served
    body = api.parse_body(raw)
    route = state.upstream.route(body["model"], api.provider)
    strategies = () if count else None
    planned = await state.compactor.plan(
        request.headers, body, route.base_url, wire=api.wire, strategies=strategies
    )
    return name, planned


@router.post("/v1/compaction/preview", openapi_extra=openapi_compaction.PREVIEW)
async def preview(request: Request, state: State, client: ClientKey) -> dict[str, Any]:
    name, result = await _plan(request, state, count=False)
    history = state.apis[name].api.history
    # the report reads every cut message's identifiers: a large one is worked out off the loop
    messages = result.conversation.messages
    report = await offload(messages, partial(preview_report, result), state.compactor.texts)
    return {history: result.forwarded.get(history), "report": report}


@router.post("/v1/compaction/count", openapi_extra=openapi_compaction.COUNT)
async def count(request: Request, state: State, client: ClientKey) -> dict[str, Any]:
    _, result = await _plan(request, state, count=True)
    return count_report(result, result.body["model"])


@router.api_route(
    "/v1/compaction/{rest:path}", methods=METHODS, response_model=None, include_in_schema=False
)
async def own_namespace(rest: str) -> NoReturn:
    """`/v1/compaction/*` is the proxy's own, never relayed: 405 on a known path, else 404."""
    if rest in ("preview", "count"):
        raise HTTPException(405, headers={"Allow": "POST"})
    raise HTTPException(404)
