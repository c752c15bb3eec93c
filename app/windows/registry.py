"""Context windows: the model table, the output reserve, and the window precedence.

Precedence (DESIGN.md §5): request header > `INFLIGHT_CONTEXT_LIMIT` > learned from an
upstream overflow error > discovered from the upstream > `models.toml` > fallback. A learned
window is the upstream's own statement, so it replaces what discovery said (a server started
with a smaller context than it advertises); it is never more than that: an explicit limit, from
the client or the operator, always wins over it.
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import os
import re
import time
import tomllib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from app.proxy.upstream import Route
from app.tokens.encodings import EncodingName, bare_model

logger = logging.getLogger(__name__)

RESERVE_SHARE = 0.16
RESERVE_MIN, RESERVE_MAX = 1024, 32768

LOOKUP_MEMO_SIZE = 4096  # model names remembered by `ModelTable.lookup`


class LimitSource(StrEnum):
    """Where a window came from (reported as `limit_source` and in usage records)."""

    HEADER = "header"
    SETTING = "setting"
    LEARNED = "learned"
    DISCOVERED = "discovered"
    TABLE = "table"
    FALLBACK = "fallback"


class ModelEntry(BaseModel):
    """One `[[model]]` row of `models.toml`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pattern: str = Field(min_length=1)
    context_window: int = Field(gt=0)
    max_output: int = Field(gt=0)
    encoding: EncodingName | None = None
    upstream: str | None = Field(None, pattern=r"^https?://")
    api_key_env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")


class ModelTable(BaseModel):
    """`config/models.toml`, parsed once at startup; first match wins."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # 8192: see the comment in config/models.toml (the smallest window current chat models are
    # commonly served with; discovery and overflow errors correct it on first contact).
    fallback_window: int = Field(8192, gt=0)
    fallback_max_output: int = Field(4096, gt=0)
    model: tuple[ModelEntry, ...] = ()
    _compiled: tuple[re.Pattern[str], ...] = PrivateAttr(default=())
    _memo: dict[str, ModelEntry | None] = PrivateAttr(default_factory=dict)

    def model_post_init(self, context: Any, /) -> None:
        self._compiled = tuple(
            re.compile(fnmatch.translate(entry.pattern.lower())) for entry in self.model
        )

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
        if model in self._memo:
            return self._memo[model]
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
        if len(self._memo) < LOOKUP_MEMO_SIZE:  # client-chosen names: bounded
            self._memo[model] = found
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
        key = os.environ.get(entry.api_key_env) if entry.api_key_env else None
        return Route(entry.upstream.rstrip("/"), key)


def output_reserve(body: Mapping[str, Any], window: int) -> int:
    """Tokens kept free for the answer: the request's own `max_completion_tokens` /
    `max_tokens` (capped below the window), else 16 % of the window within [1024, 32768] and
    never more than half of it."""
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return min(value, window - 1)
    share = int(window * RESERVE_SHARE)
    return min(max(share, RESERVE_MIN), RESERVE_MAX, window // 2)


@dataclass(frozen=True, slots=True)
class Window:
    """A context window in tokens and where it came from."""

    tokens: int
    source: LimitSource


def resolve_window(
    *,
    header: int | None = None,
    setting: int | None = None,
    learned: int | None = None,
    discovered: int | None = None,
    table: int | None = None,
    fallback: int,
) -> Window:
    """The precedence, as a pure function of every candidate (None = that source is silent)."""
    for value, source in (
        (header, LimitSource.HEADER),
        (setting, LimitSource.SETTING),
        (learned, LimitSource.LEARNED),
        (discovered, LimitSource.DISCOVERED),
        (table, LimitSource.TABLE),
    ):
        if value is not None:
            return Window(value, source)
    return Window(fallback, LimitSource.FALLBACK)


Discover = Callable[[str, str], Awaitable[int | None]]
V = TypeVar("V")


def _bounded_put(store: dict[tuple[str, str], V], key: tuple[str, str], value: V, cap: int) -> None:
    """Insert, dropping the oldest entry first when the map is full."""
    store.pop(key, None)
    if len(store) >= cap:
        store.pop(next(iter(store)))
    store[key] = value


class WindowRegistry:
    """Learned and discovered windows per (base URL, model), with the precedence above.

    Discovery runs at most once per key per `ttl` seconds (a None answer is remembered too, so
    a server that says nothing is not asked on every request); concurrent callers share the one
    in-flight discovery. Both maps are bounded: model names come from clients.
    """

    def __init__(
        self,
        table: ModelTable,
        discover: Discover | None,
        ttl: float = 600.0,
        max_keys: int = 4096,
    ) -> None:
        self._table = table
        self._discover = discover
        self._ttl = ttl
        self._max_keys = max_keys
        self._discovered: dict[tuple[str, str], tuple[float, int | None]] = {}
        self._pending: dict[tuple[str, str], asyncio.Future[int | None]] = {}
        self._learned: dict[tuple[str, str], int] = {}

    @property
    def table(self) -> ModelTable:
        return self._table

    def learn(self, base_url: str, model: str, window: int) -> None:
        """Remember the window an upstream's overflow error named (exactly that: a prompt that
        fits it but still failed was miscounted, which is calibration's business)."""
        _bounded_put(self._learned, (base_url, model), window, self._max_keys)

    def learned(self) -> dict[str, int]:
        """Windows learned from overflow errors, as `model@base_url` (for /stats)."""
        return {f"{model}@{base}": n for (base, model), n in self._learned.items()}

    def _settle(self, key: tuple[str, str], task: asyncio.Future[int | None]) -> None:
        self._pending.pop(key, None)
        if task.cancelled():
            return
        failure = task.exception()
        value = None if failure is not None else task.result()
        _bounded_put(self._discovered, key, (time.monotonic(), value), self._max_keys)

    async def _discovered_window(self, base_url: str, model: str) -> int | None:
        if self._discover is None:
            return None
        key = (base_url, model)
        found = self._discovered.get(key)
        if found is not None and time.monotonic() - found[0] < self._ttl:
            return found[1]
        task = self._pending.get(key)
        if task is None:
            task = asyncio.ensure_future(self._discover(base_url, model))
            self._pending[key] = task
            task.add_done_callback(lambda done: self._settle(key, done))
        try:
            # shield: a caller that is cancelled does not cancel the others' discovery
            return await asyncio.shield(task)
        except Exception:  # best effort by contract: a failed probe means "unknown", logged
            logger.exception("window discovery for %s at %s failed", model, base_url)
            return None

    async def window_for(
        self,
        model: str,
        base_url: str,
        *,
        header_limit: int | None = None,
        setting_limit: int | None = None,
    ) -> Window:
        """The window for `model` at `base_url`; discovery runs only when it could matter."""
        learned = self._learned.get((base_url, model))
        forced = header_limit is not None or setting_limit is not None
        discovered = (
            None
            if forced or learned is not None
            else await self._discovered_window(base_url, model)
        )
        entry = self._table.lookup(model)
        return resolve_window(
            header=header_limit,
            setting=setting_limit,
            learned=learned,
            discovered=discovered,
            table=entry.context_window if entry is not None else None,
            fallback=self._table.fallback_window,
        )
