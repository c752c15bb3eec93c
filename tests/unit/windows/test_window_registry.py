"""The window precedence and the registry of discovered and learned windows
(`windows/registry.py`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from inflight.windows.registry import LimitSource, Window, WindowRegistry, resolve_window
from inflight.windows.table import ModelTable

CONFIG = Path(__file__).resolve().parents[3] / "config" / "models.toml"


@pytest.fixture(scope="module")
def table() -> ModelTable:
    return ModelTable.load(CONFIG)


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        (
            {"header": 1000, "setting": 2000, "learned": 5000, "discovered": 6000, "table": 7000},
            Window(1000, LimitSource.HEADER),
        ),
        ({"setting": 2000, "learned": 5000, "discovered": 6000}, Window(2000, LimitSource.SETTING)),
        # a learned window replaces discovery but never an explicit limit, larger or not
        ({"header": 9000, "learned": 5000}, Window(9000, LimitSource.HEADER)),
        ({"setting": 9000, "learned": 5000}, Window(9000, LimitSource.SETTING)),
        ({"learned": 5000, "discovered": 6000, "table": 7000}, Window(5000, LimitSource.LEARNED)),
        ({"discovered": 6000, "table": 7000}, Window(6000, LimitSource.DISCOVERED)),
        ({"table": 7000}, Window(7000, LimitSource.TABLE)),
        ({}, Window(8192, LimitSource.FALLBACK)),
    ],
)
def test_resolve_window(kwargs: dict[str, int], expected: Window) -> None:
    assert resolve_window(fallback=8192, **kwargs) == expected


def test_precedence_and_single_discovery(table: ModelTable) -> None:
    calls = 0

    async def discover(base: str, model: str) -> int | None:
        nonlocal calls
        calls += 1
        await anyio.lowlevel.checkpoint()
        return 6000 if model == "local" else None

    registry = WindowRegistry(table, discover, ttl=600)

    async def run() -> None:
        results: list[Any] = []

        async def ask() -> None:
            results.append(await registry.window_for("local", "http://h/v1"))

        async with anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(ask)
        assert {(w.tokens, w.source) for w in results} == {(6000, LimitSource.DISCOVERED)}
        assert calls == 1
        w = await registry.window_for("local", "http://h/v1", header_limit=1000, setting_limit=2000)
        assert (w.tokens, w.source) == (1000, LimitSource.HEADER)
        w = await registry.window_for("local", "http://h/v1", setting_limit=2000)
        assert (w.tokens, w.source) == (2000, LimitSource.SETTING)
        registry.learn("http://h/v1", "local", 5000)
        w = await registry.window_for("local", "http://h/v1")
        assert (w.tokens, w.source) == (5000, LimitSource.LEARNED)
        w = await registry.window_for("local", "http://h/v1", header_limit=9000)
        assert (w.tokens, w.source) == (9000, LimitSource.HEADER)
        w = await registry.window_for("gpt-4o", "http://h/v1")
        assert (w.tokens, w.source) == (128000, LimitSource.TABLE)
        w = await registry.window_for("mystery", "http://h/v1")
        assert (w.tokens, w.source) == (8192, LimitSource.FALLBACK)

    anyio.run(run)


def test_forced_window_skips_discovery(table: ModelTable) -> None:
    calls: list[str] = []

    async def discover(base: str, model: str) -> int | None:
        calls.append(model)
        return 6000

    registry = WindowRegistry(table, discover)

    async def run() -> None:
        w = await registry.window_for("m", "http://h/v1", header_limit=3000)
        assert w == Window(3000, LimitSource.HEADER)

    anyio.run(run)
    assert calls == []


def test_discovery_ttl_failures_and_bounds(table: ModelTable) -> None:
    calls: list[str] = []

    async def discover(base: str, model: str) -> int | None:
        calls.append(model)
        if model == "broken":
            raise RuntimeError("bug in a parser")
        return None

    registry = WindowRegistry(table, discover, ttl=0.0, max_keys=2)

    async def run() -> None:
        assert (await registry.window_for("broken", "http://h")).source == LimitSource.FALLBACK
        await registry.window_for("quiet", "http://h")
        await registry.window_for("quiet", "http://h")  # ttl 0: asked again
        for n in range(5):
            registry.learn("http://h", f"m{n}", 1000 + n)
        assert registry.learned() == {"m3@http://h": 1003, "m4@http://h": 1004}

    anyio.run(run)
    assert calls == ["broken", "quiet", "quiet"]

    cached = WindowRegistry(table, discover, ttl=600)

    async def twice() -> None:
        await cached.window_for("quiet", "http://h")
        await cached.window_for("quiet", "http://h")  # a None answer is remembered too

    calls.clear()
    anyio.run(twice)
    assert calls == ["quiet"]


def test_known_window_is_the_precedence_without_discovery(table: ModelTable) -> None:
    # what `inflight count` and `inflight simulate` use: the same lookup as the server's
    async def never(base_url: str, model: str) -> int | None:
        raise AssertionError("known_window must not ask the upstream")

    registry = WindowRegistry(table, never)
    assert registry.known_window("gpt-4o-mini", "") == Window(128000, LimitSource.TABLE)
    assert registry.known_window("no-such-model", "") == Window(
        table.fallback_window, LimitSource.FALLBACK
    )
    assert registry.known_window("gpt-4o-mini", "", setting_limit=3000) == Window(
        3000, LimitSource.SETTING
    )
    registry.learn("http://u", "gpt-4o-mini", 5000)
    assert registry.known_window("gpt-4o-mini", "http://u") == Window(5000, LimitSource.LEARNED)
    assert registry.known_window("gpt-4o-mini", "http://other").source is LimitSource.TABLE
