"""`POST /v1/chat/completions`."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from app.errors import Unauthorized
from app.http import openapi
from app.http.state import State, require_client

router = APIRouter()


async def chat_client(request: Request, state: State) -> str | None:
    """Authenticates like every route; a refused chat request is still recorded (DESIGN.md §6)."""
    try:
        return await require_client(request)
    except Unauthorized as exc:
        await state.chat.reject(exc, None)
        raise


@router.post("/v1/chat/completions", response_model=None, openapi_extra=openapi.CHAT_COMPLETIONS)
async def chat_completions(
    request: Request, state: State, client: Annotated[str | None, Depends(chat_client)]
) -> Response:
    return await state.chat.handle(request, client)
