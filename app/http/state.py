"""The typed container of the app's collaborators, and the dependency functions that read it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from inflight.compaction.service import CompactionService
from inflight.compaction.wire import ApiName
from inflight.errors import Unauthorized
from inflight.http.auth import KeyChecker
from inflight.http.readiness import Readiness
from inflight.proxy.passthrough import PassthroughService
from inflight.proxy.service import ApiService
from inflight.proxy.upstream import Upstream
from inflight.settings import Settings
from inflight.tokens.counter import ChatTokenCounter
from inflight.usage.ledger import Ledger
from inflight.usage.metrics import Metrics
from inflight.usage.records import UsageQueue, UsageStore


@dataclass(slots=True)
class AppState:
    """Everything built once in `create_app` and shared by every request."""

    settings: Settings
    upstream: Upstream
    keys: KeyChecker
    apis: Mapping[ApiName, ApiService]  # one per compacting API (app/apis/registry.py)
    passthrough: PassthroughService
    counter: ChatTokenCounter
    compactor: CompactionService
    store: UsageStore
    queue: UsageQueue
    ledger: Ledger
    metrics: Metrics
    encodings_missing: tuple[str, ...]
    counters: Mapping[str, tuple[str, ...]]  # per loaded encoding: what counts its text
    readiness: Readiness


def app_state(request: Request) -> AppState:
    state: AppState = request.app.state.inflight
    return state


async def get_state(request: Request) -> AppState:
    return app_state(request)


async def require_client(request: Request) -> str | None:
    """Authenticate the caller; returns its key id (a hash prefix) or None.

    Dependencies are `async def` so FastAPI runs them inline, not in its thread pool.
    """
    state: AppState = request.app.state.inflight
    key = state.keys.identify(request.headers)
    request.state.client_key_id = key
    return key


async def api_client(request: Request, service: ApiService) -> str | None:
    """Authenticate a request to a compacting API: its errors render in the API's envelope
    from here on, and a refused request is still recorded (DESIGN.md §6)."""
    request.state.error_body = service.api.error_body
    try:
        return await require_client(request)
    except Unauthorized as exc:
        await service.reject(exc, None)
        raise


State = Annotated[AppState, Depends(get_state)]
ClientKey = Annotated[str | None, Depends(require_client)]
