"""Window discovery against each server flavour, with a fake fetcher returning payloads shaped
like the real servers' (llama.cpp's taken from the shared test server)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from inflight.windows.discovery import (
    discover_window,
    server_root,
    window_from_models,
    window_from_ollama_ps,
    window_from_ollama_show,
    window_from_props,
)

Answers = dict[tuple[str, str], Any]


class FakeFetcher:
    """Answers (method, url) from a dict; anything else is a failure (None), like the real one."""

    def __init__(self, answers: Answers) -> None:
        self.answers = answers
        self.calls: list[tuple[str, str, Any]] = []

    async def fetch_json(self, method: str, url: str, json: Any | None = None) -> Any | None:
        self.calls.append((method, url, json))
        return self.answers.get((method, url))


def discover(answers: Answers, model: str = "m", base: str = "http://h/v1") -> int | None:
    return anyio.run(discover_window, FakeFetcher(answers), base, model)


# llama.cpp server (xllamacpp build used by ../shared/local-llm): /v1/models carries both an
# Ollama-style "models" list and the OpenAI "data" list with meta.n_ctx (total context).
LLAMACPP_MODELS = {
    "models": [{"name": "qwen2.5-coder-0.5b-instruct", "model": "qwen2.5-coder-0.5b-instruct"}],
    "object": "list",
    "data": [
        {
            "id": "qwen2.5-coder-0.5b-instruct",
            "aliases": ["qwen2.5-coder-0.5b-instruct"],
            "object": "model",
            "owned_by": "llamacpp",
            "meta": {"vocab_type": 2, "n_vocab": 151936, "n_ctx": 8192, "n_ctx_train": 32768},
        }
    ],
}
LLAMACPP_PROPS = {
    "default_generation_settings": {"n_ctx": 4096, "params": {"n_predict": -1}},
    "total_slots": 2,
    "model_alias": "qwen2.5-coder-0.5b-instruct",
}
VLLM_MODELS = {
    "object": "list",
    "data": [
        {
            "id": "Qwen/Qwen2.5-7B-Instruct",
            "object": "model",
            "owned_by": "vllm",
            "root": "Qwen/Qwen2.5-7B-Instruct",
            "parent": None,
            "max_model_len": 16384,
            "permission": [],
        }
    ],
}
LMSTUDIO_MODELS = {  # LM Studio's REST listing (api/v0) shape
    "object": "list",
    "data": [
        {
            "id": "qwen2.5-7b-instruct",
            "object": "model",
            "type": "llm",
            "state": "loaded",
            "max_context_length": 32768,
            "loaded_context_length": 6000,
        }
    ],
}
OPENROUTER_MODELS = {
    "data": [
        {
            "id": "anthropic/claude-sonnet-4",
            "name": "Anthropic: Claude Sonnet 4",
            "context_length": 200000,
            "top_provider": {"context_length": 200000, "max_completion_tokens": 64000},
        },
        {"id": "openai/gpt-4o", "top_provider": {"context_length": 128000}},
    ]
}
LITELLM_STYLE = {"data": [{"id": "m", "object": "model", "max_input_tokens": 65536}]}
OPENAI_MODELS = {
    "object": "list",
    "data": [{"id": "gpt-4o", "object": "model", "owned_by": "system"}],
}
OLLAMA_V1_MODELS = {
    "object": "list",
    "data": [{"id": "llama3.2:latest", "object": "model", "owned_by": "library"}],
}
OLLAMA_PS = {
    "models": [
        {
            "name": "llama3.2:latest",
            "model": "llama3.2:latest",
            "size": 3338801152,
            "details": {"family": "llama", "parameter_size": "3.2B"},
            "expires_at": "2025-01-01T00:00:00Z",
            "size_vram": 3338801152,
            "context_length": 12288,
        }
    ]
}
OLLAMA_SHOW = {
    "modelfile": "FROM llama3.2",
    "parameters": 'stop                           "<|eot_id|>"\nnum_ctx                        10240',
    "details": {"family": "llama"},
    "model_info": {"general.architecture": "llama", "llama.context_length": 131072},
}


@pytest.mark.parametrize(
    ("answers", "model", "window"),
    [
        pytest.param(
            {("GET", "http://h/v1/models"): VLLM_MODELS},
            "Qwen/Qwen2.5-7B-Instruct",
            16384,
            id="vllm",
        ),
        pytest.param(
            {
                ("GET", "http://h/v1/models"): LLAMACPP_MODELS,
                ("GET", "http://h/props"): LLAMACPP_PROPS,
            },
            "qwen2.5-coder-0.5b-instruct",
            4096,
            id="llamacpp-per-slot",
        ),
        pytest.param(
            {("GET", "http://h/v1/models"): LLAMACPP_MODELS},
            "any-name",
            8192,
            id="llamacpp-no-props",
        ),
        pytest.param(
            {("GET", "http://h/v1/models"): LMSTUDIO_MODELS},
            "qwen2.5-7b-instruct",
            6000,
            id="lmstudio",
        ),
        pytest.param(
            {("GET", "http://h/v1/models"): OPENROUTER_MODELS},
            "anthropic/claude-sonnet-4",
            200000,
            id="openrouter",
        ),
        pytest.param(
            {("GET", "http://h/v1/models"): OPENROUTER_MODELS},
            "openai/gpt-4o",
            128000,
            id="openrouter-top-provider",
        ),
        pytest.param(
            {("GET", "http://h/v1/models"): LITELLM_STYLE}, "m", 65536, id="max-input-tokens"
        ),
        pytest.param(
            {
                ("GET", "http://h/v1/models"): OLLAMA_V1_MODELS,
                ("GET", "http://h/api/ps"): OLLAMA_PS,
            },
            "llama3.2",
            12288,
            id="ollama-loaded",
        ),
        pytest.param(
            {
                ("GET", "http://h/v1/models"): OLLAMA_V1_MODELS,
                ("POST", "http://h/api/show"): OLLAMA_SHOW,
            },
            "llama3.2",
            10240,
            id="ollama-num-ctx",
        ),
        pytest.param(
            {
                ("POST", "http://h/api/show"): {
                    "parameters": "stop <|eot_id|>",
                    "model_info": {"llama.context_length": 131072},
                }
            },
            "llama3.2",
            131072,
            id="ollama-model-info",
        ),
        pytest.param({("GET", "http://h/v1/models"): OPENAI_MODELS}, "gpt-4o", None, id="openai"),
        pytest.param({}, "m", None, id="nothing-answers"),
    ],
)
def test_discovery_per_server(answers: Answers, model: str, window: int | None) -> None:
    assert discover(answers, model) == window


def test_discovery_stops_at_the_first_answer() -> None:
    fetcher = FakeFetcher({("GET", "http://h/v1/models"): VLLM_MODELS})
    anyio.run(discover_window, fetcher, "http://h/v1/", "Qwen/Qwen2.5-7B-Instruct")
    assert [c[1] for c in fetcher.calls] == ["http://h/v1/models"]


def test_ollama_show_is_asked_for_the_model() -> None:
    fetcher = FakeFetcher({})
    anyio.run(discover_window, fetcher, "http://h/v1", "llama3.2")
    assert ("POST", "http://h/api/show", {"model": "llama3.2"}) in fetcher.calls


@pytest.mark.parametrize(
    "payload",
    [
        None,
        [],
        "text",
        {"data": "x"},
        {"data": [1, "x", None]},
        {"data": [{"id": "m", "max_model_len": "many"}]},
    ],
)
def test_garbage_is_ignored(payload: Any) -> None:
    assert window_from_models(payload, "m") == (None, False)
    assert window_from_props(payload) is None
    assert window_from_ollama_ps(payload, "m") is None
    assert window_from_ollama_show(payload) is None


def test_a_listing_of_other_models_is_not_used() -> None:
    listing = {"data": [{"id": "other", "max_model_len": 4096}]}
    assert window_from_models(listing, "m") == (None, False)


def test_negative_and_boolean_windows_are_ignored() -> None:
    assert window_from_models({"data": [{"id": "m", "max_model_len": -1}]}, "m") == (None, False)
    assert window_from_props({"default_generation_settings": {"n_ctx": True}}) is None


def test_server_root() -> None:
    assert server_root("http://h:8080/v1") == "http://h:8080"
    assert server_root("http://h:8080/v1/") == "http://h:8080"
    assert server_root("https://api.x/openai") == "https://api.x/openai"
