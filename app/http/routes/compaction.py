"""`POST /v1/compaction/preview` and `POST /v1/compaction/count`: compaction without forwarding."""

from __future__ import annotations

from typing import Any, NoReturn

from fastapi import APIRouter, Request
from starlette.exceptions import HTTPException

from app.compaction.service import count_report, preview_report
from app.http import openapi
from app.http.body import parse_chat_body, read_body
from app.http.routes.passthrough import METHODS
from app.http.state import ClientKey, State

router = APIRouter()


@router.post("/v1/compaction/preview", openapi_extra=openapi.PREVIEW)
async def preview(request: Request, state: State, client: ClientKey) -> dict[str, Any]:
    body = parse_chat_body(await read_body(request, state.settings.max_body_bytes))
    route = state.upstream.route(body["model"])
    result = await state.compactor.plan(request.headers, body, route.base_url)
    return {"messages": result.result.messages, "report": preview_report(result)}


@router.post("/v1/compaction/count", openapi_extra=openapi.COUNT)
async def count(request: Request, state: State, client: ClientKey) -> dict[str, Any]:
    body = parse_chat_body(await read_body(request, state.settings.max_body_bytes))
    route = state.upstream.route(body["model"])
    result = await state.compactor.plan(request.headers, body, route.base_url, strategies=())
    return count_report(result, body["model"])


@router.api_route(
    "/v1/compaction/{rest:path}", methods=METHODS, response_model=None, include_in_schema=False
)
async def own_namespace(rest: str) -> NoReturn:
    """`/v1/compaction/*` is the proxy's own, never relayed: 405 on a known path, else 404."""
    if rest in ("preview", "count"):
        raise HTTPException(405, headers={"Allow": "POST"})
    raise HTTPException(404)
