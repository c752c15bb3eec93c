"""The startup banner: one log line per fact a person starting the proxy needs, never a secret."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from inflight import __version__
from inflight.settings import Settings, packaged_config_dir, redact_url

logger = logging.getLogger("app.startup")

CONFIG_FILES = ("models.toml", "summary_prompt.md", "prices.toml")


def _config_lines(settings: Settings) -> list[str]:
    packaged = packaged_config_dir()
    if settings.config_dir is None:
        lines = [f"config: the packaged defaults in {packaged}"]
    else:
        lines = [
            f"config: {settings.config_dir.absolute()} "
            f"(files it lacks come from the packaged defaults in {packaged})"
        ]
    for name in CONFIG_FILES:
        path = settings.config_file(name)
        if path.is_file():
            lines.append(f"config file {name}: {path.absolute()}")
    return lines


def _counting_line(
    encodings_missing: Sequence[str], counters: Mapping[str, Sequence[str]] | None
) -> str:
    if not encodings_missing:
        by = "; ".join(f"{name} by {', '.join(c)}" for name, c in (counters or {}).items())
        return (
            f"token counting: exact for OpenAI models ({by or 'tiktoken encodings loaded'}); "
            "others estimated and calibrated from the upstream's usage"
        )
    return (
        f"token counting: heuristic where {', '.join(encodings_missing)} is needed (not "
        "available offline: set TIKTOKEN_CACHE_DIR); others estimated and calibrated"
    )


def startup_facts(
    settings: Settings,
    encodings_missing: Sequence[str],
    counters: Mapping[str, Sequence[str]] | None = None,
) -> list[str]:
    """What this proxy will do, one fact per line (URLs without passwords or query strings)."""
    key = (
        "INFLIGHT_UPSTREAM_API_KEY replaces the client's"
        if settings.upstream_api_key is not None
        else "the client's own is forwarded"
    )
    limit = (
        f"{settings.context_limit} tokens for every model"
        if settings.context_limit
        else "per model: discovered from the upstream, else models.toml"
    )
    return [
        f"inflight {__version__}",
        f"upstream: {redact_url(settings.upstream_url)} (Authorization: {key})",
        *_config_lines(settings),
        f"database: {redact_url(settings.database_url)}",
        f"summary cache: {redact_url(settings.cache_url) if settings.cache_url else 'in-process'}",
        _counting_line(encodings_missing, counters),
        f"default strategy: {settings.strategy} (compact at {settings.threshold:g} of the "
        f"budget, down to {settings.target:g}; over budget: {settings.on_overflow.value})",
        f"context window: {limit}",
        f"client keys: {len(settings.api_keys)} configured"
        if settings.api_keys
        else "client keys: none (every client that reaches the port is served)",
    ]


def log_banner(
    settings: Settings,
    encodings_missing: Sequence[str],
    counters: Mapping[str, Sequence[str]] | None = None,
) -> None:
    for fact in startup_facts(settings, encodings_missing, counters):
        logger.info("%s", fact)
