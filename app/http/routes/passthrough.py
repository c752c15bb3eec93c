"""Any other `/v1/*` route, relayed unchanged."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from inflight.http.state import ClientKey, State

router = APIRouter()

METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]


# Not in the schema: it relays whatever API the upstream has, which is not the proxy's own to
# document (and one route with several methods would repeat one operation id).
@router.api_route("/v1/{path:path}", methods=METHODS, response_model=None, include_in_schema=False)
async def passthrough(path: str, request: Request, state: State, client: ClientKey) -> Response:
    return await state.passthrough.handle(request, "/" + path, client)
