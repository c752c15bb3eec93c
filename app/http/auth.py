"""Client authentication against `INFLIGHT_API_KEYS`, in constant time, never logging keys."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping, Sequence

from pydantic import SecretStr

from inflight.credentials import bearer_token, client_identity, key_id
from inflight.errors import Unauthorized


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
