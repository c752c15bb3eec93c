"""The model table (`config/models.toml`): per-model windows, output limits, encodings and
upstream routes, parsed once at startup; and the output reserve kept free for the answer."""

from __future__ import annotations

import fnmatch
import os
import re
import tomllib
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, PrivateAttr, ValidationError

from inflight.lru import BoundedLRU, weigh_strings
from inflight.tokens.encodings import EncodingName, bare_model

RESERVE_SHARE = 0.16
RESERVE_MIN, RESERVE_MAX = 1024, 32768

LOOKUP_MEMO_SIZE = 4096  # model names remembered by `ModelTable.lookup`
LOOKUP_MEMO_BYTES = 2 * 1024 * 1024  # ... and their bytes (client-chosen names: any length)


@dataclass(frozen=True, slots=True)
class Route:
    """Where one request goes: base URL (ending before the path after `/v1`) and key."""

    base_url: str
    api_key: str | None


class ModelEntry(BaseModel):
    """One `[[model]]` row of `models.toml`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pattern: str = Field(min_length=1)
    context_window: int = Field(gt=0)
    max_output: int = Field(gt=0)
    encoding: EncodingName | None = None
    upstream: str | None = Field(None, pattern=r"^https?://")
    api_key_env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    # Larger windows a request unlocks with an `anthropic-beta` flag (Claude's 1M context).
    beta_context_windows: dict[str, PositiveInt] = Field(default_factory=dict)

    def window(self, betas: Collection[str] = ()) -> int:
        """The window for a request that sends these `anthropic-beta` flags."""
        unlocked = [size for flag, size in self.beta_context_windows.items() if flag in betas]
        return max([self.context_window, *unlocked])


def anthropic_betas(headers: Mapping[str, str]) -> frozenset[str]:
    """The flags of a request's `anthropic-beta` header (comma-separated)."""
    value = next((v for k, v in headers.items() if k.lower() == "anthropic-beta"), "")
    return frozenset(flag.strip() for flag in value.split(",") if flag.strip())


class ModelTable(BaseModel):
    """`config/models.toml`, parsed once at startup; first match wins."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # 8192: see the comment in config/models.toml (the smallest window current chat models are
    # commonly served with; discovery and overflow errors correct it on first contact).
    fallback_window: int = Field(8192, gt=0)
    fallback_max_output: int = Field(4096, gt=0)
    model: tuple[ModelEntry, ...] = ()
    _compiled: tuple[re.Pattern[str], ...] = PrivateAttr(default=())
    _memo: BoundedLRU[str, ModelEntry | None] = PrivateAttr(
        default_factory=lambda: BoundedLRU[str, ModelEntry | None](
            LOOKUP_MEMO_SIZE, LOOKUP_MEMO_BYTES, weigh_strings
        )
    )

    _keys: dict[str, str | None] = PrivateAttr(default_factory=dict)

    def model_post_init(self, context: Any, /) -> None:
        self._compiled = tuple(
            re.compile(fnmatch.translate(entry.pattern.lower())) for entry in self.model
        )
        # Upstream keys are read from the environment once, at startup, never per request.
        self._keys = {
            entry.api_key_env: os.environ.get(entry.api_key_env)
            for entry in self.model
            if entry.api_key_env
        }

    @classmethod
    def load(cls, path: Path) -> ModelTable:
        """Parse the file once at startup; a bad file is a startup error that names it.

        A missing file is not an error: every model then gets the fallback window.
        """
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return cls()
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ValueError(f"invalid model table {path}: {exc}") from exc
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise ValueError(f"invalid model table {path}: {exc}") from exc

    def lookup(self, model: str) -> ModelEntry | None:
        """The first entry whose pattern matches the lower-cased name, or the name without its
        `provider/` prefix."""
        try:
            return self._memo[model]
        except KeyError:
            pass  # not memoised yet (or just evicted)
        name = model.lower()
        bare = bare_model(model)
        found = next(
            (
                entry
                for entry, pattern in zip(self.model, self._compiled, strict=True)
                if pattern.match(name) or pattern.match(bare)
            ),
            None,
        )
        self._memo.put(model, found)
        return found

    def encoding_for(self, model: str) -> str | None:
        """The tiktoken encoding the table names for `model` (the counter's seam)."""
        entry = self.lookup(model)
        return entry.encoding if entry is not None else None

    def route_for(self, model: str) -> Route | None:
        """The per-model upstream, when the table names one (the `RouteTable` seam)."""
        entry = self.lookup(model)
        if entry is None or entry.upstream is None:
            return None
        key = self._keys.get(entry.api_key_env) if entry.api_key_env else None
        return Route(entry.upstream.rstrip("/"), key)


def output_reserve(body: Mapping[str, Any], window: int) -> int:
    """Tokens kept free for the answer: the request's own `max_completion_tokens` /
    `max_tokens` / `max_output_tokens` (Responses) (capped below the window), else 16 % of
    the window within [1024, 32768] and never more than half of it."""
    for name in ("max_completion_tokens", "max_tokens", "max_output_tokens"):
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return min(value, window - 1)
    share = int(window * RESERVE_SHARE)
    return min(max(share, RESERVE_MIN), RESERVE_MAX, window // 2)
