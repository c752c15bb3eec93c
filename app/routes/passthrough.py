"""Any other `/v1/*` route, relayed unchanged."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from app.state import ClientKey, State

router = APIRouter()

METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]


@router.api_route("/v1/{path:path}", methods=METHODS, response_model=None)
async def passthrough(path: str, request: Request, state: State, client: ClientKey) -> Response:
    return await state.passthrough.handle(request, "/" + path)
