"""The only outbound HTTP: one pooled client, routing by model, auth, and error translation."""

from __future__ import annotations

import logging
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
)
from contextlib import contextmanager
from functools import lru_cache
from http.cookiejar import Cookie, CookieJar
from typing import Any, Literal, Protocol

import anyio
import httpx
import orjson

from app.errors import UpstreamTimeout, UpstreamUnavailable
from app.proxy.sse_tap import Usage
from app.settings import Settings
from app.windows.table import Route

logger = logging.getLogger(__name__)

KeyHeader = Literal["authorization", "x-api-key"]  # where an upstream reads its API key

# RFC 9110 §7.6.1 hop-by-hop headers, plus the ones httpx or the ASGI server sets itself.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
_REQUEST_DROP = HOP_BY_HOP | {"host", "content-length"}
_RESPONSE_DROP = HOP_BY_HOP | {"content-length", "date", "server"}

# Idle pooled connections are dropped before the upstream would drop them: uvicorn (vLLM,
# LiteLLM) and llama.cpp close idle keep-alive connections after 5 s, and reusing one at that
# instant fails the request (a 502 to the client) though nothing was wrong with it.
UPSTREAM_KEEPALIVE_EXPIRY = 2.0


def public_url(url: str | httpx.URL) -> str:
    """A URL fit for error messages and logs: scheme, host, port and path; never credentials
    (`user:pass@`) or the query string."""
    parsed = httpx.URL(url) if isinstance(url, str) else url
    host = f"[{parsed.host}]" if ":" in parsed.host else parsed.host  # IPv6 literal
    port = f":{parsed.port}" if parsed.port is not None else ""
    return f"{parsed.scheme}://{host}{port}{parsed.path}"


UpstreamError = UpstreamTimeout | UpstreamUnavailable
# How httpx's exceptions become the proxy's (as httpx maps httpcore's): the first match wins.
ERROR_MAP: tuple[tuple[type[httpx.HTTPError], type[UpstreamError]], ...] = (
    (httpx.TimeoutException, UpstreamTimeout),
    (httpx.HTTPError, UpstreamUnavailable),  # refused, reset, protocol or decoding errors
)
Stage = Literal["connect", "answer", "stream"]
# What happened, by stage of the exchange and the error it became.
_WORDING: dict[Stage, dict[type[UpstreamError], str]] = {
    "connect": {UpstreamTimeout: "timed out", UpstreamUnavailable: "unreachable"},
    "answer": {
        UpstreamTimeout: "timed out while sending its answer",
        UpstreamUnavailable: "broke while answering",
    },
    "stream": {UpstreamTimeout: "timed out during the stream", UpstreamUnavailable: "stream broke"},
}


def translate(exc: httpx.HTTPError, url: str | httpx.URL, stage: Stage) -> UpstreamError:
    """The proxy error an httpx failure at `stage` of a request to `url` becomes."""
    kind = next(target for source, target in ERROR_MAP if isinstance(exc, source))
    what = f"upstream {public_url(url)} {_WORDING[stage][kind]}"
    logger.warning("%s: %s: %s", what, type(exc).__name__, exc)
    return kind(f"{what} ({type(exc).__name__})")


@contextmanager
def upstream_errors(url: str | httpx.URL, stage: Stage) -> Iterator[None]:
    """Raise httpx failures inside the block as `UpstreamTimeout` / `UpstreamUnavailable`."""
    try:
        yield
    except httpx.HTTPError as exc:
        raise translate(exc, url, stage) from exc


def _same_origin(a: str, b: str) -> bool:
    first, second = httpx.URL(a), httpx.URL(b)
    return (first.scheme, first.host, first.port) == (second.scheme, second.host, second.port)


class _NoCookieJar(CookieJar):
    """One pooled client serves every client of the proxy: an upstream's `Set-Cookie` is
    relayed to the client that got it and never stored, or it would be replayed upstream on
    everyone else's requests."""

    def extract_cookies(self, response: Any, request: Any) -> None:
        return None

    def set_cookie(self, cookie: Cookie) -> None:
        return None


class RouteTable(Protocol):
    """Chooses the upstream for a model (implemented by the model table)."""

    def route_for(self, model: str) -> Route | None: ...


def _connection_tokens(headers: Iterable[tuple[str, str]]) -> set[str]:
    tokens: set[str] = set()
    for name, value in headers:
        if name.lower() == "connection":
            tokens.update(t.strip().lower() for t in value.split(",") if t.strip())
    return tokens


def filter_request_headers(
    headers: Iterable[tuple[str, str]],
    *,
    api_key: str | None,
    identity: bool,
    key_header: KeyHeader = "authorization",
) -> list[tuple[str, str]]:
    """Client headers to send upstream: hop-by-hop and our own controls removed.

    `api_key` replaces the client's credentials when set: `Authorization: Bearer` (OpenAI), or
    `x-api-key` with the client's Authorization dropped (Anthropic); `identity` asks the
    upstream for an uncompressed body (needed where the proxy reads the answer, e.g. usage).
    """
    pairs = list(headers)
    drop = _REQUEST_DROP | _connection_tokens(pairs)
    out = [
        (k, v)
        for k, v in pairs
        if k.lower() not in drop and not k.lower().startswith("x-compaction-")
    ]
    if api_key is not None:
        out = [(k, v) for k, v in out if k.lower() not in ("authorization", key_header)]
        value = f"Bearer {api_key}" if key_header == "authorization" else api_key
        out.append((key_header, value))
    if identity:
        out = [(k, v) for k, v in out if k.lower() != "accept-encoding"]
        out.append(("accept-encoding", "identity"))
    return out


def filter_response_headers(headers: httpx.Headers) -> list[tuple[str, str]]:
    """Upstream response headers to relay to the client (hop-by-hop removed)."""
    pairs = list(headers.multi_items())
    drop = _RESPONSE_DROP | _connection_tokens(pairs)
    return [(k, v) for k, v in pairs if k.lower() not in drop]


def origin(url: str | httpx.URL) -> str:
    """scheme://host:port of `url`: one upstream server, whatever the path."""
    parsed = httpx.URL(url) if isinstance(url, str) else url
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    return f"{parsed.scheme}://{parsed.host}:{port}"


class _Tracked(httpx.AsyncByteStream):
    """A response body that calls `done` once when it is closed (read to the end, or not)."""

    def __init__(self, stream: httpx.AsyncByteStream, done: Callable[[], None]) -> None:
        self._stream = stream
        self._done: Callable[[], None] | None = done

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._stream:
            yield chunk

    async def aclose(self) -> None:
        try:
            await self._stream.aclose()
        finally:
            done, self._done = self._done, None
            if done is not None:
                done()


@lru_cache(maxsize=256)
def _parsed_url(url: str) -> httpx.URL:
    """`url` parsed once: httpx parses a URL string in Python on every request, and a
    proxy sends to the same few (routes times the clients' query strings: bounded)."""
    return httpx.URL(url)


class Upstream:
    """Owns the pooled `httpx.AsyncClient`; every outbound request goes through here. It counts
    the client requests in flight per upstream server (from `send` until the response is
    closed, streams included), so that background summaries can wait for an idle one."""

    def __init__(
        self,
        settings: Settings,
        routes: RouteTable | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._default = Route(
            settings.upstream_url,
            settings.upstream_api_key.get_secret_value() if settings.upstream_api_key else None,
        )
        anthropic_key = settings.anthropic_api_key
        self._anthropic = Route(
            settings.anthropic_upstream_url,
            anthropic_key.get_secret_value() if anthropic_key else None,
        )
        self._routes = routes
        self._probe_timeout = settings.discovery_timeout
        self._active: dict[str, int] = {}  # origin -> client requests in flight
        self.client = httpx.AsyncClient(
            transport=transport,
            timeout=httpx.Timeout(
                connect=settings.upstream_connect_timeout,
                read=settings.upstream_read_timeout,
                write=settings.upstream_read_timeout,
                pool=settings.upstream_connect_timeout,
            ),
            limits=httpx.Limits(
                max_connections=1000,
                max_keepalive_connections=200,
                keepalive_expiry=UPSTREAM_KEEPALIVE_EXPIRY,
            ),
            follow_redirects=False,
            trust_env=False,
            cookies=_NoCookieJar(),
        )

    @property
    def default_route(self) -> Route:
        return self._default

    @property
    def anthropic_route(self) -> Route:
        """`INFLIGHT_ANTHROPIC_UPSTREAM_URL` and `INFLIGHT_ANTHROPIC_API_KEY`."""
        return self._anthropic

    def route(self, model: str | None, *, anthropic: bool = False) -> Route:
        """The upstream for `model`: its `models.toml` entry, else `INFLIGHT_UPSTREAM_URL`
        (`INFLIGHT_ANTHROPIC_UPSTREAM_URL` for Anthropic's API), whose key it falls back to."""
        default = self._anthropic if anthropic else self._default
        if model and self._routes is not None:
            found = self._routes.route_for(model)
            if found is not None:
                return Route(found.base_url, found.api_key or default.api_key)
        return default

    @staticmethod
    def url(route: Route, v1_path: str, query: bytes = b"") -> str:
        """Join the route's base with the part of the client's path after `/v1`."""
        url = route.base_url + v1_path
        return f"{url}?{query.decode('latin-1')}" if query else url

    async def send(
        self,
        method: str,
        url: str,
        headers: list[tuple[str, str]],
        content: bytes | AsyncIterable[bytes] | None,
        *,
        deadline: float | None = None,
        client: bool = True,
    ) -> httpx.Response:
        """Send and return the response with its body unread (the caller must close it).

        `deadline` (seconds) replaces the pooled client's timeouts for this request; `client`
        is False for the proxy's own requests (summaries), which do not make an upstream busy.
        """
        request = self.client.build_request(
            method, _parsed_url(url), headers=headers, content=content
        )
        if deadline is not None:
            request.extensions["timeout"] = httpx.Timeout(deadline).as_dict()
        if not client:
            with upstream_errors(request.url, "connect"):
                return await self.client.send(request, stream=True)
        server = origin(request.url)
        self._active[server] = self._active.get(server, 0) + 1
        try:
            with upstream_errors(request.url, "connect"):
                response = await self.client.send(request, stream=True)
        except BaseException:
            self._leave(server)
            raise
        body = response.stream
        assert isinstance(body, httpx.AsyncByteStream)  # an AsyncClient's response
        response.stream = _Tracked(body, lambda: self._leave(server))
        return response

    def _leave(self, server: str) -> None:
        left = self._active.get(server, 0) - 1
        if left > 0:
            self._active[server] = left
        else:
            self._active.pop(server, None)

    def idle(self, url: str) -> bool:
        """Whether the upstream server of `url` has no client request in flight."""
        return origin(url) not in self._active

    async def fetch_json(self, method: str, url: str, json: Any | None = None) -> Any | None:
        """A short, never-fatal JSON probe (window discovery, readiness); None on any failure.

        The default upstream's key goes only to that upstream's own origin: discovery also
        probes Anthropic's upstream and per-model ones, which must never receive it."""
        headers = {"accept": "application/json"}
        if self._default.api_key and _same_origin(url, self._default.base_url):
            headers["authorization"] = f"Bearer {self._default.api_key}"
        try:
            response = await self.client.request(
                method, url, json=json, headers=headers, timeout=self._probe_timeout
            )
        except httpx.HTTPError as exc:
            logger.debug("probe %s %s failed: %s", method, url, type(exc).__name__)
            return None
        if response.status_code >= 400:
            return None
        try:
            return orjson.loads(response.content)
        except orjson.JSONDecodeError:
            return None

    async def reachable(self) -> bool:
        """True when the default upstream answers HTTP at all (any status)."""
        try:
            await self.client.get(self._default.base_url + "/models", timeout=self._probe_timeout)
        except httpx.HTTPError:
            return False
        return True

    async def aclose(self) -> None:
        await self.client.aclose()


async def read_all(response: httpx.Response) -> bytes:
    """Read an upstream body fully, translating transport errors; always closes it."""
    try:
        with upstream_errors(response.request.url, "answer"):
            return await response.aread()
    finally:
        await response.aclose()


_SUMMARY_HEADERS = frozenset(
    {"authorization", "api-key", "x-api-key", "openai-organization", "openai-project"}
)


def summary_completer(
    upstream: Upstream,
    model: str,
    client_headers: Mapping[str, str],
    deadline: float,
    route: Route | None = None,
) -> Callable[[dict[str, Any]], Awaitable[tuple[int, bytes]]]:
    """A `Completer` for summary requests: the model's route (or `route`: the summary upstream),
    the client's credentials (or the configured upstream key), a bounded deadline; transport
    failures become `SummaryFailed`."""
    route = route or upstream.route(model)
    headers = filter_request_headers(
        [(k, v) for k, v in client_headers.items() if k.lower() in _SUMMARY_HEADERS],
        api_key=route.api_key,
        identity=True,
    )
    url = upstream.url(route, "/chat/completions")
    return _completer(upstream, url, headers, deadline, lambda status, content: content)


_ANTHROPIC_HEADERS = frozenset(
    {"authorization", "x-api-key", "anthropic-version", "anthropic-beta"}
)
ANTHROPIC_VERSION = "2023-06-01"  # sent when the client named none (the API requires one)


def anthropic_summary_completer(
    upstream: Upstream, model: str, client_headers: Mapping[str, str], deadline: float
) -> Callable[[dict[str, Any]], Awaitable[tuple[int, bytes]]]:
    """A `Completer` for a Messages client's summaries: the summary request (a valid Messages
    body as it is) goes to the model's Anthropic route with the client's `x-api-key` (or
    `INFLIGHT_ANTHROPIC_API_KEY`) and `anthropic-version`; the answer is read back as the chat
    completion the summariser parses (text, and usage with cache reads and writes)."""
    route = upstream.route(model, anthropic=True)
    headers = filter_request_headers(
        [(k, v) for k, v in client_headers.items() if k.lower() in _ANTHROPIC_HEADERS],
        api_key=route.api_key,
        identity=True,
        key_header="x-api-key",
    )
    if not any(k.lower() == "anthropic-version" for k, _ in headers):
        headers.append(("anthropic-version", ANTHROPIC_VERSION))
    url = upstream.url(route, "/messages")
    return _completer(upstream, url, headers, deadline, _as_chat_completion)


def _as_chat_completion(status: int, content: bytes) -> bytes:
    """An Anthropic message as a chat completion (its text, its usage); errors as they are."""
    if status >= 400:
        return content
    try:
        message = orjson.loads(content)
    except orjson.JSONDecodeError:
        return content
    blocks = message.get("content") if isinstance(message, dict) else None
    if not isinstance(blocks, list):
        return content
    text = "".join(
        b["text"] for b in blocks if isinstance(b, dict) and isinstance(b.get("text"), str)
    )
    usage = Usage.from_anthropic(message.get("usage")) or Usage()
    return orjson.dumps(
        {
            "choices": [{"message": {"role": "assistant", "content": text}}],
            "usage": {
                "prompt_tokens": usage.prompt_tokens or 0,
                "completion_tokens": usage.completion_tokens or 0,
            },
        }
    )


def _completer(
    upstream: Upstream,
    url: str,
    headers: list[tuple[str, str]],
    deadline: float,
    convert: Callable[[int, bytes], bytes],
) -> Callable[[dict[str, Any]], Awaitable[tuple[int, bytes]]]:
    from app.compaction.summary.prompt import SummaryFailed

    headers = [*headers, ("content-type", "application/json")]

    async def complete(body: dict[str, Any]) -> tuple[int, bytes]:
        try:
            with anyio.fail_after(deadline):  # a total deadline, not per read
                response = await upstream.send(
                    "POST", url, headers, orjson.dumps(body), deadline=deadline, client=False
                )
                status = response.status_code
                return status, convert(status, await read_all(response))
        except TimeoutError as exc:
            raise SummaryFailed(f"summariser took longer than {deadline:g}s") from exc
        except (UpstreamTimeout, UpstreamUnavailable) as exc:
            raise SummaryFailed(exc.message) from exc

    return complete
