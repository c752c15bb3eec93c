"""The only outbound HTTP: the connection pools, routing by model, auth, and error translation.

Which headers cross is app/proxy/headers.py; summary requests are app/proxy/completers.py.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from http.cookiejar import Cookie, CookieJar
from typing import Any, Literal, Protocol
from urllib.parse import quote, unquote

import httpx
import orjson

from inflight.errors import BadRequest, UpstreamTimeout, UpstreamUnavailable
from inflight.proxy.headers import KeyHeader
from inflight.settings import Settings
from inflight.windows.table import Route

# Whose API a request speaks, so which upstream setting it goes to by default and in which
# header the key goes: OpenAI's (`INFLIGHT_UPSTREAM_URL`, `Authorization`) or Anthropic's
# (`INFLIGHT_ANTHROPIC_UPSTREAM_URL`, `x-api-key`).
Provider = Literal["openai", "anthropic"]
KEY_HEADERS: dict[Provider, KeyHeader] = {"openai": "authorization", "anthropic": "x-api-key"}

logger = logging.getLogger(__name__)

# Idle pooled connections are dropped before the upstream would drop them: uvicorn (vLLM,
# LiteLLM) and llama.cpp close idle keep-alive connections after 5 s, and reusing one at that
# instant fails the request (a 502 to the client) though nothing was wrong with it.
UPSTREAM_KEEPALIVE_EXPIRY = 2.0
# Connection pools per process, a request taking the least busy (the first while traffic is
# sequential, so its connections are reused as with one). httpcore's pool scans its waiting
# requests against its connections whenever a request starts or ends, a cost that grows with
# the square of the requests in flight through it, so several pools carry concurrent requests
# faster than one (the outbound client table of `python -m bench --only hot`).
POOL_SHARDS = 8
MAX_CONNECTIONS = 1000  # in all, shared out between the pools
MAX_KEEPALIVE = 200


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


class PathOutsideUpstream(BadRequest):
    """A client path that would leave the upstream's base path (`..` once decoded)."""

    code = "invalid_path"


# A path made only of these needs neither decoding nor quoting (the compacting routes' own).
_PLAIN_PATH = re.compile(r"[A-Za-z0-9/_\-]*")
_DECODINGS = 4  # percent-decodings looked through for a `..` before a path is refused outright
# What stays as it is when a decoded path is put back into a URL (RFC 3986 pchar and `/`).
_PATH_SAFE = "/:@!$&'()*+,;=-._~"


def upstream_path(v1_path: str) -> str:
    """The client's path after `/v1` (percent-decoded once, as the ASGI server hands it over),
    as it is joined to the upstream's base: quoted again, so a `?`, `#` or `%` in it stays
    part of the path. Raises `PathOutsideUpstream` when any decoding of it (double-encoded
    tricks too: `%252e`) has a `..` segment, `\\` counting as `/`: the proxy never sends the
    upstream's key to a path outside the base it was configured with."""
    if _PLAIN_PATH.fullmatch(v1_path):
        return v1_path
    seen = v1_path
    for _ in range(_DECODINGS):
        if ".." in re.split(r"[/\\]", seen):
            raise PathOutsideUpstream(f"path segment '..' not allowed: {v1_path!r}")
        decoded = unquote(seen)
        if decoded == seen:
            return quote(v1_path, safe=_PATH_SAFE)
        seen = decoded
    raise PathOutsideUpstream(f"path encoded too many times: {v1_path!r}")


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


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode()).digest()


@lru_cache(maxsize=256)
def _parsed_url(url: str) -> httpx.URL:
    """`url` parsed once: httpx parses a URL string in Python on every request, and a
    proxy sends to the same few (routes times the clients' query strings: bounded)."""
    return httpx.URL(url)


class Upstream:
    """Owns the connection pools; every outbound request goes through here. It counts the
    client requests in flight per upstream server (from `send` until the response is closed,
    streams included), so that background summaries can wait for an idle one, and the requests
    in flight per pool, so that each goes to the least busy. A `transport` given (tests' fake
    upstreams) is the one pool."""

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
        self._proxy_keys = frozenset(_digest(k.get_secret_value()) for k in settings.api_keys)
        self._probe_timeout = settings.discovery_timeout
        self._active: dict[str, int] = {}  # origin -> client requests in flight
        limits = httpx.Limits(
            max_connections=MAX_CONNECTIONS // POOL_SHARDS,
            max_keepalive_connections=MAX_KEEPALIVE // POOL_SHARDS,
            keepalive_expiry=UPSTREAM_KEEPALIVE_EXPIRY,
        )
        if transport is not None:
            self.pools: list[httpx.AsyncBaseTransport] = [transport]
        else:  # one TLS context for all (each loads the CA bundle)
            tls = httpx.create_ssl_context(trust_env=False)
            self.pools = [
                httpx.AsyncHTTPTransport(verify=tls, limits=limits, trust_env=False)
                for _ in range(POOL_SHARDS)
            ]
        self._loads = [0] * len(self.pools)  # requests in flight per pool
        self.client = httpx.AsyncClient(  # probes (discovery, readiness): the first pool
            transport=self.pools[0],
            timeout=httpx.Timeout(
                connect=settings.upstream_connect_timeout,
                read=settings.upstream_read_timeout,
                write=settings.upstream_read_timeout,
                pool=settings.upstream_connect_timeout,
            ),
            follow_redirects=False,
            trust_env=False,
            cookies=_NoCookieJar(),
        )
        self._timeout = self.client.timeout.as_dict()
        # httpx's own (user-agent, accept, accept-encoding, connection), as it spells them
        self._defaults = [(k.decode(), v.decode()) for k, v in self.client.headers.raw]

    @property
    def default_route(self) -> Route:
        return self._default

    def provider_route(self, provider: Provider) -> Route:
        """The default upstream of `provider`'s API (Anthropic's: `INFLIGHT_ANTHROPIC_UPSTREAM_URL`
        and `INFLIGHT_ANTHROPIC_API_KEY`)."""
        return self._anthropic if provider == "anthropic" else self._default

    def route(self, model: str | None, provider: Provider = "openai") -> Route:
        """The upstream for `model`: its `models.toml` entry, else `INFLIGHT_UPSTREAM_URL`
        (`INFLIGHT_ANTHROPIC_UPSTREAM_URL` for Anthropic's API).

        An entry's key is its `api_key_env`; without one the client's own credentials go
        through, never the default upstream's key, which is the operator's for that upstream
        alone (an entry naming that very base URL is that upstream, and keeps it)."""
        default = self.provider_route(provider)
        if model and self._routes is not None:
            found = self._routes.route_for(model)
            if found is not None:
                same = found.base_url == default.base_url
                return Route(found.base_url, found.api_key or (default.api_key if same else None))
        return default

    @staticmethod
    def url(route: Route, v1_path: str, query: bytes = b"") -> str:
        """Join the route's base with the part of the client's path after `/v1` (see
        `upstream_path`: never a path outside the base)."""
        url = route.base_url + upstream_path(v1_path)
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
        request = self._request(method, url, headers, content, deadline)
        loads = self._loads
        pool = loads.index(min(loads))
        loads[pool] += 1
        server = origin(request.url) if client else None
        if server is not None:
            self._active[server] = self._active.get(server, 0) + 1
        try:
            with upstream_errors(request.url, "connect"):
                response = await self._send(request, pool)
        except BaseException:
            self._leave(pool, server)
            raise
        body = response.stream
        assert isinstance(body, httpx.AsyncByteStream)  # an async transport's response
        response.stream = _Tracked(body, lambda: self._leave(pool, server))
        return response

    def _request(
        self,
        method: str,
        url: str,
        headers: list[tuple[str, str]],
        content: bytes | AsyncIterable[bytes] | None,
        deadline: float | None,
    ) -> httpx.Request:
        """The request `AsyncClient.build_request` builds: the client's default headers
        (user-agent, accept, accept-encoding, connection) unless `headers` set them, then
        `headers`; the pooled client's timeouts unless a `deadline` replaces them."""
        names = {name.lower() for name, _ in headers}
        merged = [(k, v) for k, v in self._defaults if k.lower() not in names]
        if self._proxy_keys:
            headers = [(k, v) for k, v in headers if not self._carries_proxy_key(v)]
        merged.extend(headers)
        timeout = self._timeout if deadline is None else httpx.Timeout(deadline).as_dict()
        return httpx.Request(
            method,
            _parsed_url(url),
            headers=merged,
            content=content,
            extensions={"timeout": timeout},
        )

    def _carries_proxy_key(self, value: str) -> bool:
        """Whether a header's value is one of `INFLIGHT_API_KEYS`, alone or after a scheme
        (`Bearer <key>`): the key a client proves itself to the proxy with is never sent on,
        whatever header carries it."""
        value = value.strip()
        token = value.rpartition(" ")[2]
        return _digest(value) in self._proxy_keys or _digest(token) in self._proxy_keys

    async def _send(self, request: httpx.Request, pool: int = 0) -> httpx.Response:
        """`request` straight to a pool's transport, its body unread. `AsyncClient.send` does
        no more for it (no auth, redirects, cookies or hooks here) but costs CPU on every
        request (`python -m bench --only hot`)."""
        response = await self.pools[pool].handle_async_request(request)
        response.request = request
        return response

    def _leave(self, pool: int, server: str | None) -> None:
        self._loads[pool] -= 1
        if server is None:
            return
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
        await self.client.aclose()  # and the first pool
        for pool in self.pools[1:]:
            await pool.aclose()


async def read_all(response: httpx.Response) -> bytes:
    """Read an upstream body fully, translating transport errors; always closes it."""
    try:
        with upstream_errors(response.request.url, "answer"):
            return await response.aread()
    finally:
        await response.aclose()
