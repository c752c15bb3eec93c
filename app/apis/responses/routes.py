"""`POST /v1/responses` (OpenAI's Responses API); its other paths are passed through."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from inflight.apis.responses import openapi as openapi_responses
from inflight.http.state import api_client, app_state

router = APIRouter()


@router.post("/v1/responses", response_model=None, openapi_extra=openapi_responses.RESPONSES)
async def create_response(request: Request) -> Response:
    # no FastAPI dependencies on the hot path: they cost more than the work they do
    service = app_state(request).apis["responses"]
    return await service.handle(request, await api_client(request, service))
