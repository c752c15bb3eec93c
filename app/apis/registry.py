"""The table of compacting APIs, by name: each one's `Api` (wire format, restore dialect, error
envelope, usage), its routes and the endpoint the hot path serves. The factory builds one
service per entry; a new API is one more package under `inflight.apis` and one more row."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from fastapi import APIRouter

from inflight.apis.anthropic import api as anthropic_api
from inflight.apis.anthropic import routes as anthropic_routes
from inflight.apis.chat import api as chat_api
from inflight.apis.chat import routes as chat_routes
from inflight.apis.responses import api as responses_api
from inflight.apis.responses import routes as responses_routes
from inflight.compaction.wire import ApiName
from inflight.http.hot import Endpoint
from inflight.proxy.api import Api


@dataclass(frozen=True, slots=True)
class ServedApi:
    """One compacting API as the app serves it."""

    api: Api
    router: APIRouter  # its routes, the compacting one first
    endpoint: Endpoint  # `POST api.route`, served ahead of the router (app/http/hot.py)


APIS: Mapping[ApiName, ServedApi] = MappingProxyType(
    {
        "chat": ServedApi(chat_api.API, chat_routes.router, chat_routes.chat_completions),
        "responses": ServedApi(
            responses_api.API, responses_routes.router, responses_routes.create_response
        ),
        "messages": ServedApi(
            anthropic_api.API, anthropic_routes.router, anthropic_routes.create_message
        ),
    }
)


def route_names() -> dict[str, str]:
    """Each compacting route's API name (how `/stats` and `/metrics` name a record's route)."""
    return {served.api.route: name for name, served in APIS.items()}
