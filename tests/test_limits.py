"""The model table, output reserve, window precedence, and the registry of discovered and
learned windows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from app.windows.registry import LimitSource, Window, WindowRegistry, resolve_window
from app.windows.table import ModelTable, output_reserve

CONFIG = Path(__file__).resolve().parents[1] / "config" / "models.toml"


@pytest.fixture(scope="module")
def table() -> ModelTable:
    return ModelTable.load(CONFIG)


@pytest.mark.parametrize(
    ("model", "window"),
    [
        ("gpt-4o-mini", 128000),
        ("openai/gpt-4.1-nano", 1047576),
        ("gpt-4", 8192),
        ("gpt-4-turbo", 128000),
        ("claude-sonnet-4-5", 200000),
        ("gemini-2.5-pro", 1048576),
        ("meta-llama/Llama-3.1-8B-Instruct", 131072),
        ("llama3.2:3b", 131072),
        ("Qwen/Qwen2.5-Coder-7B-Instruct", 32768),
        ("mistral-small-latest", 131072),
        ("deepseek-chat", 128000),
        ("gpt-oss-20b", 131072),
        ("anthropic.claude-3-5-sonnet-20240620-v1:0", 200000),
        ("codellama-34b-instruct", 16384),
        ("qwen2.5-coder-0.5b-instruct", 32768),
        ("qwen3-coder-30b-a3b-instruct", 262144),
        ("gemma3:1b", 32768),
        ("GPT-4o", 128000),
    ],
)
def test_table_lookup_first_match_wins(table: ModelTable, model: str, window: int) -> None:
    entry = table.lookup(model)
    assert entry is not None
    assert entry.context_window == window


def test_unknown_model_gets_the_fallback(table: ModelTable) -> None:
    assert table.lookup("my-finetune") is None
    assert table.fallback_window == 8192


def test_table_names_encodings_for_openai_families(table: ModelTable) -> None:
    assert table.encoding_for("gpt-4o-mini") == "o200k_base"
    assert table.encoding_for("gpt-4-0613") == "cl100k_base"
    assert table.encoding_for("llama3.1:8b") is None
    assert table.encoding_for("unknown") is None


def test_missing_table_is_empty(tmp_path: Path) -> None:
    empty = ModelTable.load(tmp_path / "absent.toml")
    assert empty.lookup("gpt-4o") is None
    assert empty.fallback_window == 8192


def test_bad_table_is_a_startup_error(tmp_path: Path) -> None:
    bad = tmp_path / "models.toml"
    bad.write_text('[[model]]\npattern = "x"\ncontext_window = -1\nmax_output = 1\n')
    with pytest.raises(ValueError, match=r"models\.toml"):
        ModelTable.load(bad)
    bad.write_text('[[model]]\npattern = "x"\ncontext_window = 5\nmax_output = 1\ntypo = 1\n')
    with pytest.raises(ValueError, match="typo"):
        ModelTable.load(bad)
    bad.write_text(
        '[[model]]\npattern = "x"\ncontext_window = 5\nmax_output = 1\nencoding = "p50k"\n'
    )
    with pytest.raises(ValueError, match="encoding"):
        ModelTable.load(bad)
    bad.write_text("[[model]\n")
    with pytest.raises(ValueError, match=r"models\.toml"):
        ModelTable.load(bad)


def test_per_model_upstream_and_key_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "models.toml"
    path.write_text(
        '[[model]]\npattern = "local-*"\ncontext_window = 4096\nmax_output = 512\n'
        'upstream = "http://127.0.0.1:8080/v1/"\napi_key_env = "LOCAL_KEY"\n'
    )
    monkeypatch.setenv("LOCAL_KEY", "sk-local")
    route = ModelTable.load(path).route_for("local-qwen")
    assert route is not None
    assert (route.base_url, route.api_key) == ("http://127.0.0.1:8080/v1", "sk-local")
    assert ModelTable.load(path).route_for("gpt-4o") is None


def test_output_reserve() -> None:
    assert output_reserve({"max_tokens": 500}, 8192) == 500
    assert output_reserve({"max_completion_tokens": 700, "max_tokens": 5}, 8192) == 700
    assert output_reserve({}, 8192) == 1310
    assert output_reserve({}, 4096) == 1024
    assert output_reserve({}, 1_000_000) == 32768
    assert output_reserve({}, 1500) == 750
    assert output_reserve({"max_tokens": 99999}, 4096) == 4095


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
