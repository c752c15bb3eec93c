"""`POST /v1/chat/completions`."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from app.http import openapi
from app.http.state import State, api_client

router = APIRouter()


async def chat_client(request: Request, state: State) -> str | None:
    return await api_client(request, state.chat)


@router.post("/v1/chat/completions", response_model=None, openapi_extra=openapi.CHAT_COMPLETIONS)
async def chat_completions(
    request: Request, state: State, client: Annotated[str | None, Depends(chat_client)]
) -> Response:
    return await state.chat.handle(request, client)
