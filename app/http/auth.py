"""Client authentication against `INFLIGHT_API_KEYS`, in constant time, never logging keys."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping, Sequence

from pydantic import SecretStr

from app.errors import Unauthorized


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


class KeyChecker:
    """Holds the digests of the configured keys; `check` returns the caller's key id."""

    def __init__(self, keys: Sequence[SecretStr]) -> None:
        self._digests = [hashlib.sha256(k.get_secret_value().encode()).digest() for k in keys]

    def identify(self, headers: Mapping[str, str]) -> str | None:
        """The caller's id: with proxy keys, the id of the key it sent (else 401); without,
        `client_identity` of every credential it sent (None when it sent none)."""
        if not self._digests:
            return client_identity(headers) or None
        return self.check(headers.get("authorization"), headers.get("x-api-key"))

    def check(self, authorization: str | None, x_api_key: str | None = None) -> str | None:
        """Raise 401 unless the caller sends a configured key (when keys are configured), as
        `Authorization: Bearer <key>` (OpenAI's clients) or `x-api-key` (Anthropic's)."""
        if not self._digests:
            sent = {"authorization": authorization or "", "x-api-key": x_api_key or ""}
            return client_identity(sent) or None
        sent_keys = [t for t in (bearer_token(authorization), (x_api_key or "").strip()) if t]
        if not sent_keys:
            raise Unauthorized("missing API key: send 'Authorization: Bearer <key>' or 'x-api-key'")
        for token in sent_keys:
            digest = hashlib.sha256(token.encode()).digest()
            matched = False
            for expected in self._digests:  # no early exit: time does not depend on which
                matched |= hmac.compare_digest(digest, expected)
            if matched:
                return key_id(token)
        raise Unauthorized("invalid API key")
