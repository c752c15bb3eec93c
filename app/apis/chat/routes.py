"""`POST /v1/chat/completions`."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from inflight.apis.chat import openapi as openapi_chat
from inflight.http.state import api_client, app_state

router = APIRouter()


@router.post(
    "/v1/chat/completions", response_model=None, openapi_extra=openapi_chat.CHAT_COMPLETIONS
)
async def chat_completions(request: Request) -> Response:
    # no FastAPI dependencies on the hot path: they cost more than the work they do
    service = app_state(request).apis["chat"]
    return await service.handle(request, await api_client(request, service))
