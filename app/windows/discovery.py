"""Window discovery: ask the upstream server how large the model's context really is.

A local server's window is what it was started with, not the model card's, so inflight asks, once
per (base URL, model), and never fails a request over it.
"""

from __future__ import annotations

import re
from typing import Any, Protocol

_MODEL_KEYS = (
    "max_model_len",
    "loaded_context_length",
    "context_length",
    "max_context_length",
    "max_input_tokens",
    "context_window",
)


class JsonFetcher(Protocol):
    """A short, never-raising JSON request (the upstream module implements it)."""

    async def fetch_json(self, method: str, url: str, json: Any | None = None) -> Any | None: ...


def server_root(base_url: str) -> str:
    """`http://host:8080/v1` → `http://host:8080` (where /props and /api/* live)."""
    return re.sub(r"/v1/?$", "", base_url.rstrip("/"))


def _positive(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and value > 0:
        return value
    if isinstance(value, str) and value.isdigit() and int(value) > 0:
        return int(value)
    return None


def _aliases(entry: dict[str, Any]) -> list[Any]:
    aliases = entry.get("aliases")
    return aliases if isinstance(aliases, list) else []


def window_from_models(payload: Any, model: str) -> tuple[int | None, bool]:
    """(window, is_llamacpp) from an OpenAI-style `/models` listing."""
    if not isinstance(payload, dict) or not isinstance(payload.get("data"), list):
        return None, False
    entries = [e for e in payload["data"] if isinstance(e, dict)]
    chosen = next((e for e in entries if model in (e.get("id"), *_aliases(e))), None)
    if chosen is None and len(entries) == 1 and isinstance(entries[0].get("meta"), dict):
        chosen = entries[0]  # a single-model llama.cpp server answers to any model name
    if chosen is None:
        return None, False
    meta = chosen.get("meta")
    if isinstance(meta, dict) and _positive(meta.get("n_ctx")):
        return _positive(meta.get("n_ctx")), True
    for key in _MODEL_KEYS:
        found = _positive(chosen.get(key))
        if found:
            return found, False
    top = chosen.get("top_provider")
    if isinstance(top, dict) and _positive(top.get("context_length")):
        return _positive(top.get("context_length")), False
    return None, False


def window_from_props(payload: Any) -> int | None:
    """llama.cpp `/props`: the per-slot `n_ctx`, the real limit of one request."""
    if not isinstance(payload, dict):
        return None
    settings = payload.get("default_generation_settings")
    if isinstance(settings, dict):
        return _positive(settings.get("n_ctx"))
    return None


def window_from_ollama_ps(payload: Any, model: str) -> int | None:
    """Ollama `/api/ps`: the `context_length` a loaded model actually runs with."""
    if not isinstance(payload, dict) or not isinstance(payload.get("models"), list):
        return None
    names = {model, model if ":" in model else f"{model}:latest"}
    for entry in payload["models"]:
        if isinstance(entry, dict) and names & {entry.get("name"), entry.get("model")}:
            return _positive(entry.get("context_length"))
    return None


def window_from_ollama_show(payload: Any) -> int | None:
    """Ollama `/api/show`: `num_ctx` in `parameters` when set, else the model's trained
    `*.context_length`."""
    if not isinstance(payload, dict):
        return None
    parameters = payload.get("parameters")
    if isinstance(parameters, str):
        match = re.search(r"^\s*num_ctx\s+(\d+)", parameters, re.MULTILINE)
        if match:
            return int(match.group(1))
    info = payload.get("model_info")
    if isinstance(info, dict):
        for key, value in info.items():
            if key.endswith(".context_length") and _positive(value):
                return _positive(value)
    return None


async def discover_window(fetcher: JsonFetcher, base_url: str, model: str) -> int | None:
    """The upstream's window for `model`, or None when nothing says.

    Sources, in order:

    - `GET {base}/models`: vLLM `max_model_len`, llama.cpp `meta.n_ctx`, LM Studio
      `loaded_context_length` / `max_context_length`, OpenRouter `context_length`, others
      `max_input_tokens`;
    - llama.cpp `GET {root}/props`: `default_generation_settings.n_ctx` is the per-slot window
      (total / parallel slots), the real limit of one request, so it wins over `meta.n_ctx`;
    - Ollama `GET {root}/api/ps` (a loaded model's `context_length`), then `POST {root}/api/show`
      (`parameters` num_ctx, else `model_info.*.context_length`).
    """
    base = base_url.rstrip("/")
    root = server_root(base)
    window, llamacpp = window_from_models(await fetcher.fetch_json("GET", base + "/models"), model)
    if window is not None and not llamacpp:
        return window
    if llamacpp or window is None:
        per_slot = window_from_props(await fetcher.fetch_json("GET", root + "/props"))
        if per_slot is not None:
            return per_slot
    if window is not None:
        return window
    loaded = window_from_ollama_ps(await fetcher.fetch_json("GET", root + "/api/ps"), model)
    if loaded is not None:
        return loaded
    return window_from_ollama_show(
        await fetcher.fetch_json("POST", root + "/api/show", {"model": model})
    )
