"""Client keys: checked against `INFLIGHT_API_KEYS` when set, identified by a hash prefix."""

from __future__ import annotations

import httpx
import pytest
from pydantic import SecretStr

from inflight.credentials import bearer_token, client_identity, key_id
from inflight.errors import Unauthorized
from inflight.http.auth import KeyChecker


@pytest.mark.parametrize(
    ("header", "token"),
    [
        (None, None),
        ("", None),
        ("Bearer", None),
        ("Bearer   ", None),
        ("Basic abc", None),
        ("bearer sk-1", "sk-1"),
        ("Bearer  sk-2 ", "sk-2"),
    ],
)
def test_bearer_token(header: str | None, token: str | None) -> None:
    assert bearer_token(header) == token


def test_without_keys_anyone_passes_and_is_still_told_apart() -> None:
    open_door = KeyChecker([])
    assert open_door.check(None) is None
    assert open_door.check("Bearer sk-a") == key_id("sk-a")
    assert open_door.check("Bearer sk-a") != open_door.check("Bearer sk-b")


def test_the_client_identity_is_a_hash_of_any_credential_sent() -> None:
    """Every scheme tells clients apart (Basic, Azure's `api-key`, `x-api-key`, any other
    `Authorization`); one key is one client in either header; no credential: the one "" owner."""
    basic_a = client_identity({"authorization": "Basic YTpzZWNyZXQ="})
    basic_b = client_identity({"authorization": "Basic YjpzZWNyZXQ="})
    azure_a = client_identity({"api-key": "az-a"})
    azure_b = client_identity({"api-key": "az-b"})
    ids = {basic_a, basic_b, azure_a, azure_b, client_identity({"x-api-key": "ant-a"})}
    assert len(ids) == 5
    assert "" not in ids
    assert client_identity({}) == ""
    assert client_identity({"authorization": "  ", "api-key": ""}) == ""
    assert client_identity({"authorization": "Bearer sk-a"}) == key_id("sk-a")
    assert client_identity({"x-api-key": "sk-a"}) == key_id("sk-a")
    assert client_identity({"authorization": "Bearer sk-a", "x-api-key": "sk-a"}) == key_id("sk-a")
    both = client_identity({"authorization": "Bearer sk-a", "x-api-key": "sk-b"})
    assert both not in {key_id("sk-a"), key_id("sk-b")}
    assert client_identity(httpx.Headers({"API-Key": "az-a"})) == azure_a
    assert "az-a" not in azure_a


def test_identify_uses_every_credential_without_keys_and_the_key_with_them() -> None:
    open_door = KeyChecker([])
    assert open_door.identify(httpx.Headers({})) is None
    assert open_door.identify(httpx.Headers({"api-key": "az-a"})) == client_identity(
        {"api-key": "az-a"}
    )
    checker = KeyChecker([SecretStr("k1")])
    assert checker.identify(httpx.Headers({"x-api-key": "k1", "api-key": "az"})) == key_id("k1")
    with pytest.raises(Unauthorized, match="missing"):
        checker.identify(httpx.Headers({"api-key": "k1"}))


def test_with_keys_only_a_configured_key_passes() -> None:
    checker = KeyChecker([SecretStr("k1"), SecretStr("k2")])
    assert checker.check("Bearer k2") == key_id("k2")
    with pytest.raises(Unauthorized, match="missing"):
        checker.check(None)
    with pytest.raises(Unauthorized, match="invalid"):
        checker.check("Bearer k3")
    with pytest.raises(Unauthorized):
        checker.check("Basic k1")


def test_a_key_id_does_not_reveal_the_key() -> None:
    ident = key_id("sk-secret-value")
    assert len(ident) == 12
    assert "secret" not in ident
    assert ident == key_id("sk-secret-value")
