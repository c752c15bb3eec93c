"""Client keys: checked against `INFLIGHT_API_KEYS` when set, identified by a hash prefix."""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from app.errors import Unauthorized
from app.http.auth import KeyChecker, bearer_token, key_id


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
