"""The price table: `config/prices.toml` parsed once at startup into frozen typed objects."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from inflight.lru import BoundedLRU

MEMO_SIZE = 4096  # model names whose lookup is remembered


class PriceTableError(ValueError):
    """`prices.toml` cannot be read or is malformed (a startup error that names the file)."""


class Caching(StrEnum):
    """How a provider's prompt cache is used, which decides the baseline's cached share.

    `automatic` (OpenAI): every prompt's prefix is cached by the provider, no client markers.
    `explicit` (Anthropic): only what the client marks with `cache_control` is read or written.
    """

    AUTOMATIC = "automatic"
    EXPLICIT = "explicit"


class ModelPrice(BaseModel):
    """One `[[price]]` entry: USD per 1M tokens for the models it lists."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    models: tuple[str, ...] = Field(min_length=1)
    input: float = Field(ge=0)
    output: float = Field(ge=0)
    cached_input: float | None = Field(None, ge=0)
    cache_write: float | None = Field(None, ge=0)
    caching: Caching = Caching.AUTOMATIC

    @model_validator(mode="after")
    def _check_names(self) -> ModelPrice:
        if any(not name.strip() for name in self.models):
            raise ValueError("`models` holds an empty name")
        return self

    @property
    def cache_read_rate(self) -> float:
        """USD per 1M cached prompt tokens (the input price when the model has no discount)."""
        return self.input if self.cached_input is None else self.cached_input

    @property
    def cache_write_rate(self) -> float:
        """USD per 1M prompt tokens written to the cache (the input price when not surcharged)."""
        return self.input if self.cache_write is None else self.cache_write


class BaselineRules(BaseModel):
    """How the uncompacted baseline's prompt-cache hits are estimated (README: "Money")."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    automatic_min_tokens: int = Field(1024, ge=0)
    automatic_increment: int = Field(128, ge=1)
    automatic_ttl_seconds: float = Field(600.0, gt=0)
    explicit_ttl_seconds: float = Field(300.0, gt=0)
    conversations: int = Field(10_000, ge=1)

    def ttl(self, caching: Caching) -> float:
        if caching is Caching.AUTOMATIC:
            return self.automatic_ttl_seconds
        return self.explicit_ttl_seconds


class PriceTable(BaseModel):
    """`config/prices.toml`; `lookup` answers the first entry whose glob matches.

    Each `[[price]]` lists the models it covers (globs on the lower-cased name, also tried with any
    `provider/` prefix removed) and USD per 1M tokens: `input`, `cached_input` (a prompt-cache hit),
    `cache_write` (Anthropic's cache writes) and `output`. The first entry that matches wins; a
    model no entry matches is unpriced (its requests cost nothing and are counted as unpriced).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    currency: str = Field("USD", pattern=r"^USD$")
    as_of: str = Field("", description="the date the figures were read from their sources")
    sources: tuple[str, ...] = ()
    baseline: BaselineRules = BaselineRules()
    price: tuple[ModelPrice, ...] = ()
    _compiled: tuple[tuple[re.Pattern[str], ...], ...] = PrivateAttr(default=())
    _known: BoundedLRU[str, ModelPrice | None] = PrivateAttr(
        default_factory=lambda: BoundedLRU(MEMO_SIZE)  # client-chosen names: bounded
    )

    def model_post_init(self, context: Any, /) -> None:
        self._compiled = tuple(
            tuple(re.compile(fnmatch.translate(glob.lower())) for glob in entry.models)
            for entry in self.price
        )

    @classmethod
    def load(cls, path: Path) -> PriceTable:
        """Parse the file once at startup. A missing file means every model is unpriced; an
        unreadable or malformed one raises `PriceTableError` naming it."""
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return cls()
        except (OSError, UnicodeDecodeError) as exc:
            raise PriceTableError(f"cannot read price table {path}: {exc}") from exc
        return cls.parse(text, str(path))

    @classmethod
    def parse(cls, text: str, name: str) -> PriceTable:
        try:
            return cls.model_validate(tomllib.loads(text))
        except (tomllib.TOMLDecodeError, ValidationError) as exc:
            raise PriceTableError(f"invalid price table {name}: {exc}") from exc

    def lookup(self, model: str) -> ModelPrice | None:
        """The price of `model`, or None (unpriced). Answers are remembered for the
        `MEMO_SIZE` names asked most recently."""
        try:
            return self._known[model]
        except KeyError:
            pass  # not memoised yet (or just evicted)
        name = model.lower()
        bare = name.rsplit("/", 1)[-1]
        found = next(
            (
                entry
                for entry, globs in zip(self.price, self._compiled, strict=True)
                if any(glob.match(name) or glob.match(bare) for glob in globs)
            ),
            None,
        )
        self._known.put(model, found)
        return found
