"""`POST /v1/responses` (OpenAI's Responses API); its other paths are passed through."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from app.http import openapi
from app.http.state import State, api_client

router = APIRouter()


async def responses_client(request: Request, state: State) -> str | None:
    return await api_client(request, state.responses)


@router.post("/v1/responses", response_model=None, openapi_extra=openapi.RESPONSES)
async def create_response(
    request: Request, state: State, client: Annotated[str | None, Depends(responses_client)]
) -> Response:
    return await state.responses.handle(request, client)
