"""`GET /v1/compaction/ledger/{id}`: what one compacted request cut, for its own client only."""

from __future__ import annotations

from typing import NoReturn

from fastapi import APIRouter
from starlette.exceptions import HTTPException
from starlette.responses import Response

from inflight.http import openapi_compaction
from inflight.http.routes.passthrough import METHODS
from inflight.http.state import ClientKey, State

router = APIRouter()
PATH = "/v1/compaction/ledger/{ledger_id:path}"


@router.get(PATH, response_model=None, openapi_extra=openapi_compaction.LEDGER)
async def ledger(ledger_id: str, state: State, client: ClientKey) -> Response:
    found = await state.ledger.read(ledger_id, client)
    return Response(found, media_type="application/json")


@router.api_route(
    PATH,
    methods=[m for m in METHODS if m != "GET"],
    response_model=None,
    include_in_schema=False,
)
async def other_methods(ledger_id: str) -> NoReturn:
    """The ledger is read-only: 405 naming GET, never relayed upstream."""
    raise HTTPException(405, headers={"Allow": "GET"})
