"""`POST /v1/messages` (Anthropic's Messages API), and its other paths (`count_tokens`,
`batches`) passed through to the Anthropic upstream."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from inflight.apis.anthropic.api import anthropic_error_body
from inflight.http.routes.passthrough import METHODS
from inflight.http.state import State, api_client, app_state, require_client

router = APIRouter()


async def anthropic_client(request: Request) -> str | None:
    """Authenticate a passthrough request to Anthropic's API; errors in its envelope."""
    request.state.error_body = anthropic_error_body
    return await require_client(request)


# Not in the OpenAPI schema: what makes a Messages body compactable (alternation, pairing) is
# not something JSON Schema can state, so the route is fuzzed by its own tests instead
# (tests/asgi/test_anthropic_route.py).
@router.post("/v1/messages", response_model=None, include_in_schema=False)
async def create_message(request: Request) -> Response:
    # no FastAPI dependencies on the hot path: they cost more than the work they do
    service = app_state(request).apis["messages"]
    return await service.handle(request, await api_client(request, service))


@router.api_route(
    "/v1/messages/{path:path}", methods=METHODS, response_model=None, include_in_schema=False
)
async def messages_passthrough(
    path: str,
    request: Request,
    state: State,
    client: Annotated[str | None, Depends(anthropic_client)],
) -> Response:
    return await state.passthrough.handle(request, f"/messages/{path}", client, "anthropic")


@router.api_route(
    "/v1/messages",
    methods=[m for m in METHODS if m != "POST"],
    response_model=None,
    include_in_schema=False,
)
async def messages_other_methods(
    request: Request, state: State, client: Annotated[str | None, Depends(anthropic_client)]
) -> Response:
    """Anthropic's API answers these (a 405): they go to it, not to the OpenAI upstream."""
    return await state.passthrough.handle(request, "/messages", client, "anthropic")
