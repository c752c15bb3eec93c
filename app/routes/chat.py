"""`POST /v1/chat/completions`."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from app import openapi
from app.state import ClientKey, State

router = APIRouter()


@router.post("/v1/chat/completions", response_model=None, openapi_extra=openapi.CHAT_COMPLETIONS)
async def chat_completions(request: Request, state: State, client: ClientKey) -> Response:
    return await state.chat.handle(request, client)
