"""Context windows: their sources' precedence, and the registry of learned and discovered ones."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from inflight.flight import SingleFlight
from inflight.lru import BoundedLRU, weigh_strings
from inflight.windows.table import ModelTable

logger = logging.getLogger(__name__)
SILENT_QUORUM = 3  # distinct clients whose silent cuts make a window everyone's
MAX_REPORTERS = 16  # clients whose silent cuts are kept per (base URL, model)
MAP_BYTES = 4 * 1024 * 1024  # each of the three maps (discovered, learned, silent cuts)


class LimitSource(StrEnum):
    """Where a window came from (reported as `limit_source` and in usage records)."""

    HEADER = "header"
    SETTING = "setting"
    LEARNED = "learned"
    DISCOVERED = "discovered"
    TABLE = "table"
    FALLBACK = "fallback"


@dataclass(frozen=True, slots=True)
class WindowLearned:
    """A window learned for (base URL, model): from an overflow error (`client` None) or from
    `client`'s silent cut; what `WindowRegistry.apply` takes again on another replica."""

    base_url: str
    model: str
    window: int
    client: str | None = None


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
    """The precedence, as a pure function of every candidate (None = that source is silent).

    Precedence (DESIGN.md §5): request header > `INFLIGHT_CONTEXT_LIMIT` > learned from an upstream
    overflow error > discovered from the upstream > `models.toml` > fallback. A learned window is
    the upstream's own statement, so it replaces what discovery said (a server started with a
    smaller context than it advertises); it is never more than that: an explicit limit, from the
    client or the operator, always wins over it.
    """
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


class DiscoveryAbandoned(Exception):
    """The caller running a shared discovery was cancelled before it answered."""


class WindowRegistry:
    """Learned and discovered windows per (base URL, model), with the precedence above.

    Discovery runs at most once per key per `ttl` seconds (a None answer is remembered too, so
    a server that says nothing is not asked on every request); concurrent callers share the one
    in-flight discovery. Both maps are bounded: model names come from clients. `journal`,
    when set, is told every window learned, and `refresh` runs before a window is resolved
    (replicas share what they learned: app/windows/shared.py).

    A window inferred from a silent cut (one client's answer counted short, app/windows/silent.py)
    is that client's alone until `SILENT_QUORUM` distinct clients saw one (DESIGN.md §7 Isolation);
    then the largest window that many agree on is learned for all.
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
        self._discovered: BoundedLRU[tuple[str, str], tuple[float, int | None]] = BoundedLRU(
            max_keys, MAP_BYTES, weigh_strings
        )
        self._pending: SingleFlight[tuple[str, str], int | None] = SingleFlight(DiscoveryAbandoned)
        self._learned: BoundedLRU[tuple[str, str], int] = BoundedLRU(
            max_keys, MAP_BYTES, weigh_strings
        )
        # per (base URL, model): each client's last silently cut window, oldest first
        self._silent: BoundedLRU[tuple[str, str], tuple[tuple[str, int], ...]] = BoundedLRU(
            max_keys, MAP_BYTES, weigh_strings
        )
        self.journal: Callable[[WindowLearned], None] | None = None
        self.refresh: Callable[[str, str], Awaitable[None]] | None = None

    @property
    def table(self) -> ModelTable:
        return self._table

    def learn(self, base_url: str, model: str, window: int) -> None:
        """Remember the window an upstream's overflow error named (exactly that: a prompt that
        fits it but still failed was miscounted, which is calibration's business)."""
        self.apply(WindowLearned(base_url, model, window))

    def apply(self, learned: WindowLearned, journal: bool = True) -> None:
        """Take a learned window (`learn`, `learn_silent`); `journal`: tell the journal."""
        key = (learned.base_url, learned.model)
        if learned.client is None:
            self._learned.put(key, learned.window)
        else:
            client = learned.client
            others = [(c, w) for c, w in self._silent.get(key) or () if c != client]
            self._silent.put(key, (*others[-(MAX_REPORTERS - 1) :], (client, learned.window)))
        if journal and self.journal is not None:
            self.journal(learned)

    def export(self, base_url: str, model: str) -> dict[str, Any]:
        """What was learned for (`base_url`, `model`), as plain JSON values (`install`)."""
        key = (base_url, model)
        return {"learned": self._learned.get(key), "silent": self._silent.get(key) or ()}

    def install(self, base_url: str, model: str, state: dict[str, Any]) -> None:
        """Replace what was learned for (`base_url`, `model`) with `state` (an `export`)."""
        key = (base_url, model)
        if state["learned"] is None:
            self._learned.pop(key)
        else:
            self._learned.put(key, state["learned"])
        silent = tuple((c, w) for c, w in state["silent"])
        if silent:
            self._silent.put(key, silent)
        else:
            self._silent.pop(key)

    def learn_silent(self, base_url: str, model: str, window: int, client: str) -> None:
        """Remember the window `client` saw the upstream cut a prompt to (silently): its own
        window from now on; every client's once `SILENT_QUORUM` distinct clients saw one."""
        self.apply(WindowLearned(base_url, model, window, client))

    def _silent_window(self, key: tuple[str, str], client: str) -> int | None:
        """The silently learned window for `client`: its own, or the largest one at least
        `SILENT_QUORUM` clients saw a cut at or under, whichever is smaller."""
        reports = dict(self._silent.get(key) or ())
        windows = sorted(reports.values())
        agreed = windows[SILENT_QUORUM - 1] if len(windows) >= SILENT_QUORUM else None
        found = [w for w in (reports.get(client), agreed) if w is not None]
        return min(found) if found else None

    def learned(self) -> dict[str, int]:
        """Windows learned from overflow errors, as `model@base_url` (for /stats)."""
        return {f"{model}@{base}": n for (base, model), n in self._learned.items()}

    async def _discover_once(self, discover: Discover, base_url: str, model: str) -> int | None:
        try:
            value = await discover(base_url, model)
        except Exception:  # best effort by contract: a failed probe means "unknown", logged
            logger.exception("window discovery for %s at %s failed", model, base_url)
            value = None
        self._discovered.put((base_url, model), (time.monotonic(), value))
        return value

    async def _discovered_window(self, base_url: str, model: str) -> int | None:
        discover = self._discover
        if discover is None:
            return None
        key = (base_url, model)
        found = self._discovered.get(key)
        if found is not None and time.monotonic() - found[0] < self._ttl:
            return found[1]
        try:
            return await self._pending.run(
                key, lambda: self._discover_once(discover, base_url, model)
            )
        except DiscoveryAbandoned:  # the caller running it was cancelled: unknown this time
            return None

    def known_window(
        self,
        model: str,
        base_url: str,
        *,
        header_limit: int | None = None,
        setting_limit: int | None = None,
        discovered: int | None = None,
        betas: Collection[str] = (),
        client: str = "",
    ) -> Window:
        """The window from what is known without asking the upstream (all the CLI has).
        `betas`: the request's `anthropic-beta` flags (a table entry may unlock more with one);
        `client`: who asks (`inflight.credentials.client_identity`; its own silent cuts apply)."""
        entry = self._table.lookup(model)
        key = (base_url, model)
        found = (self._learned.get(key), self._silent_window(key, client))
        learned = [w for w in found if w is not None]
        return resolve_window(
            header=header_limit,
            setting=setting_limit,
            learned=min(learned) if learned else None,
            discovered=discovered,
            table=entry.window(betas) if entry is not None else None,
            fallback=self._table.fallback_window,
        )

    async def window_for(
        self,
        model: str,
        base_url: str,
        *,
        header_limit: int | None = None,
        setting_limit: int | None = None,
        betas: Collection[str] = (),
        client: str = "",
    ) -> Window:
        """The window for `model` at `base_url`; discovery runs only when it could matter.
        `betas`, `client`: as in `known_window`."""
        if self.refresh is not None:
            await self.refresh(base_url, model)
        forced = header_limit is not None or setting_limit is not None
        discovered = (
            None
            if forced or (base_url, model) in self._learned
            else await self._discovered_window(base_url, model)
        )
        return self.known_window(
            model,
            base_url,
            header_limit=header_limit,
            setting_limit=setting_limit,
            discovered=discovered,
            betas=betas,
            client=client,
        )
