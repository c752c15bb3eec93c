"""The compacting APIs' routes, dispatched ahead of FastAPI's router."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from types import MappingProxyType

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from inflight.errors import ProxyError
from inflight.http.errors import proxy_error_handler, unexpected_error_handler

Endpoint = Callable[[Request], Awaitable[Response]]


class InflightApp(FastAPI):
    """FastAPI, with `hot` routes (exact path, POST) served before its middleware stack.

    Every request to `POST /v1/chat/completions`, `/v1/responses` or `/v1/messages` would go through
    FastAPI's middleware stack and router (its exception middleware, an exit stack, the included
    routers matched in turn) before the route ran, a large share of what the proxy adds to a request
    on loopback (`python -m bench --only hot`). This app serves those three exact paths itself, with
    what the stack gave them: the route's Starlette `Request`, the app's error handlers (a
    `ProxyError` in the API's envelope; anything else a 500 in OpenAI's, logged, then raised to the
    server as Starlette's `ServerErrorMiddleware` does), and nothing else (the routes use no
    dependencies). Every other request, and these paths under another method or a `root_path`, go to
    FastAPI as before; the routes stay registered with it, so the OpenAPI schema and `app.routes`
    are unchanged.
    """

    hot: Mapping[str, Endpoint] = MappingProxyType({})  # the factory names them

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path"):
            endpoint = self.hot.get(scope["path"])
            if endpoint is not None:
                scope["app"] = self
                await _serve(endpoint, Request(scope, receive), send)
                return
        await super().__call__(scope, receive, send)


async def _serve(endpoint: Endpoint, request: Request, send: Send) -> None:
    started = False

    async def sending(message: Message) -> None:
        nonlocal started
        started = started or message["type"] == "http.response.start"
        await send(message)

    scope, receive = request.scope, request.receive
    try:
        try:
            await (await endpoint(request))(scope, receive, sending)
        except ProxyError as exc:  # refused, or the upstream failed: the API's own envelope
            if started:
                raise
            await (await proxy_error_handler(request, exc))(scope, receive, sending)
    except Exception as exc:
        answer = await unexpected_error_handler(request, exc)  # logged
        if not started:  # a 500, then the error to the server, as ServerErrorMiddleware does
            await answer(scope, receive, send)
        raise
