"""The model table (`windows/table.py`): lookup, encodings, per-model upstreams, the output
reserve."""

from __future__ import annotations

from pathlib import Path

import pytest

from inflight.windows.table import ModelTable, output_reserve

CONFIG = Path(__file__).resolve().parents[3] / "config" / "models.toml"


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
