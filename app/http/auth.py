"""Client authentication against `INFLIGHT_API_KEYS`, in constant time, never logging keys."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence

from pydantic import SecretStr

from app.errors import Unauthorized


def key_id(key: str) -> str:
    """A short, non-reversible identifier for a key (for usage records and logs)."""
    return hashlib.sha256(key.encode()).hexdigest()[:12]


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

    def check(self, authorization: str | None, x_api_key: str | None = None) -> str | None:
        """Raise 401 unless the caller sends a configured key (when keys are configured), as
        `Authorization: Bearer <key>` (OpenAI's clients) or `x-api-key` (Anthropic's)."""
        sent = [t for t in (bearer_token(authorization), (x_api_key or "").strip()) if t]
        if not self._digests:
            return key_id(sent[0]) if sent else None
        if not sent:
            raise Unauthorized("missing API key: send 'Authorization: Bearer <key>' or 'x-api-key'")
        for token in sent:
            digest = hashlib.sha256(token.encode()).digest()
            matched = False
            for expected in self._digests:  # no early exit: time does not depend on which
                matched |= hmac.compare_digest(digest, expected)
            if matched:
                return key_id(token)
        raise Unauthorized("invalid API key")
