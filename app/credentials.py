"""A client's credentials: the headers that carry them and the identity they hash to (who the
client is, for everything the proxy keeps per client), never the keys themselves."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping


def key_id(key: str) -> str:
    """A short, non-reversible identifier for a key (for usage records and logs)."""
    return hashlib.sha256(key.encode()).hexdigest()[:12]


CREDENTIAL_HEADERS = ("authorization", "x-api-key", "api-key")  # OpenAI, Anthropic, Azure


def client_identity(headers: Mapping[str, str]) -> str:
    """Who the client is, without proxy keys: a hash of every credential it sent (`Authorization`
    of any scheme, `x-api-key`, Azure's `api-key`); "" — one shared anonymous identity — when it
    sent none. A lone Bearer token or key hashes as `key_id` of the key itself, so the same key
    is the same client in either header. `headers` is looked up by lower-case name (Starlette's
    and httpx's `Headers` are case-insensitive)."""
    sent = [_credential(name, headers.get(name)) for name in CREDENTIAL_HEADERS]
    parts = list(dict.fromkeys(part for part in sent if part))  # one key in two headers: once
    return key_id("\n".join(parts)) if parts else ""


def _credential(name: str, value: str | None) -> str:
    value = (value or "").strip()
    if name == "authorization":
        return bearer_token(value) or value  # another scheme: its whole value (scheme included)
    return value


def bearer_token(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()
