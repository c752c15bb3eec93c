"""`POST /v1/compaction/preview` and `POST /v1/compaction/count`: compaction without forwarding."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from app.body import parse_chat_body, read_body
from app.compactor import count_report, preview_report
from app.state import ClientKey, State

router = APIRouter()


@router.post("/v1/compaction/preview")
async def preview(request: Request, state: State, client: ClientKey) -> dict[str, Any]:
    body = parse_chat_body(await read_body(request, state.settings.max_body_bytes))
    route = state.upstream.route(body["model"])
    result = await state.compactor.plan(request.headers, body, route.base_url)
    return {"messages": result.result.messages, "report": preview_report(result)}


@router.post("/v1/compaction/count")
async def count(request: Request, state: State, client: ClientKey) -> dict[str, Any]:
    body = parse_chat_body(await read_body(request, state.settings.max_body_bytes))
    route = state.upstream.route(body["model"])
    result = await state.compactor.plan(request.headers, body, route.base_url, strategies=())
    return count_report(result, body["model"])
