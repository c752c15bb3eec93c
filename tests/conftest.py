"""Shared fixtures: a clean environment, a fake upstream, the app wired to it."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from inflight import factory
from inflight.factory import create_app
from inflight.settings import Settings
from inflight.tokens.encodings import load_encodings
from tests.support.fakes import FakeUpstream


@pytest.fixture(scope="session", autouse=True)
def _shared_encodings() -> Iterator[None]:
    """Every app the tests build counts with one set of encodings, loaded once: loading them
    (tiktoken's tables, rs_bpe's) takes about a second, and the suite builds hundreds of apps.
    The tests of loading itself call `load_encodings` from its module."""
    encodings = load_encodings()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(factory, "load_encodings", lambda: encodings)
        yield


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Tests never depend on the shell's INFLIGHT_* variables or a stray .env."""
    for name in list(os.environ):
        if name.startswith("INFLIGHT_") and not name.startswith("INFLIGHT_TEST_"):
            monkeypatch.delenv(name)
    return


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def make_settings(tmp_path: Path, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "upstream_url": "http://upstream.test/v1",
        "database_url": f"sqlite:///{tmp_path / 'usage.db'}",
        "config_dir": Path(__file__).resolve().parents[1] / "config",
    }
    values.update(overrides)
    return Settings(_env_file=None, **values)  # type: ignore[call-arg]


@pytest.fixture
def fake() -> FakeUpstream:
    return FakeUpstream()


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return make_settings(tmp_path)


@pytest.fixture
async def app(settings: Settings, fake: FakeUpstream) -> AsyncIterator[FastAPI]:
    application = create_app(settings, transport=httpx.ASGITransport(app=fake.app))
    async with application.router.lifespan_context(application):
        yield application


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://proxy.test") as c:
        yield c
