"""Headers across the proxy: hop-by-hop headers and our own `X-Compaction-*` controls dropped
both ways, the client's credentials replaced by a configured upstream key (every header that
carries one, not just the one the key goes in)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

import httpx

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
# Where clients send credentials (OpenAI, Anthropic, Azure): the proxy reads its own key from
# them (app/credentials.py), and an upstream key that replaces the client's replaces all of them.
CREDENTIAL_HEADERS = frozenset({"authorization", "x-api-key", "api-key"})
_RESPONSE_DROP = HOP_BY_HOP | {"content-length", "date", "server"}


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

    `api_key` replaces the client's credentials when set: every credential header it sent
    (`CREDENTIAL_HEADERS`) is dropped, then the key goes in `Authorization: Bearer` (OpenAI) or
    `x-api-key` (Anthropic); `identity` asks the upstream for an uncompressed body (needed
    where the proxy reads the answer, e.g. usage). A client's proxy key (`INFLIGHT_API_KEYS`)
    is removed from whatever header carries it by `Upstream`, where every request passes.
    """
    pairs = list(headers)
    drop = _REQUEST_DROP | _connection_tokens(pairs)
    out = [
        (k, v)
        for k, v in pairs
        if k.lower() not in drop and not k.lower().startswith("x-compaction-")
    ]
    if api_key is not None:
        out = [(k, v) for k, v in out if k.lower() not in CREDENTIAL_HEADERS]
        value = f"Bearer {api_key}" if key_header == "authorization" else api_key
        out.append((key_header, value))
    if identity:
        out = [(k, v) for k, v in out if k.lower() != "accept-encoding"]
        out.append(("accept-encoding", "identity"))
    return out


def without_beta(headers: list[tuple[str, str]], flag: str) -> list[tuple[str, str]]:
    """`headers` with `flag` taken out of `anthropic-beta` (a comma list: the other flags kept
    in order; a header left empty is dropped)."""
    out: list[tuple[str, str]] = []
    for name, value in headers:
        if name.lower() == "anthropic-beta":
            value = ",".join(f.strip() for f in value.split(",") if f.strip() not in ("", flag))
            if not value:
                continue
        out.append((name, value))
    return out


def filter_response_headers(headers: httpx.Headers) -> list[tuple[str, str]]:
    """Upstream response headers to relay to the client (hop-by-hop removed)."""
    pairs = list(headers.multi_items())
    drop = _RESPONSE_DROP | _connection_tokens(pairs)
    return [(k, v) for k, v in pairs if k.lower() not in drop]
