"""What replicas learn from the upstream and plan with, shared: one state, whichever replica."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import orjson
from redis.exceptions import RedisError

from inflight.tokens.calibration import Calibration, Observed
from inflight.windows.registry import WindowLearned, WindowRegistry

logger = logging.getLogger(__name__)
PREFIX = "inflight:learned:"
TTL_SECONDS = 30 * 24 * 3600  # a document nobody wrote for this long is forgotten
RETRIES = 8  # compare-and-set attempts per sync before the journal waits for the next one
PUBLISH_BOUND_SECONDS = 0.2  # an answer waits at most this long for its publish (`publish_within`)
REFRESH_BOUND_SECONDS = 0.5  # a plan waits for the peers' state at most this long
CLOSE_WAIT_SECONDS = 5.0  # at shutdown, for publishes still under way

# KEYS: the documents; ARGV: the version known of each. Returns key, version, document of
# each one whose version differs (a missing document has version 0 and no body).
CHANGED = """
local out = {}
for i, key in ipairs(KEYS) do
    local found = redis.call("hmget", key, "v", "d")
    local version = tonumber(found[1]) or 0
    if version ~= tonumber(ARGV[i]) then
        table.insert(out, key)
        table.insert(out, version)
        table.insert(out, found[2] or "")
    end
end
return out
"""
# KEYS[1]: the document; ARGV: the version it must still have, the new body, the TTL.
PUT_IF_VERSION = """
local version = tonumber(redis.call("hget", KEYS[1], "v")) or 0
if version ~= tonumber(ARGV[1]) then
    return false
end
redis.call("hset", KEYS[1], "v", version + 1, "d", ARGV[2])
redis.call("expire", KEYS[1], ARGV[3])
return version + 1
"""


class LearnedStore(Protocol):
    """Versioned documents shared by the replicas (version 0: no document)."""

    async def changed(self, known: Mapping[str, int]) -> dict[str, tuple[int, bytes | None]]:
        """Each key of `known` whose version is not the one given: its version and body."""

    async def put(self, key: str, version: int, body: bytes) -> int | None:
        """`body` under `key` if its version is still `version`: the new version, else None."""

    async def close(self) -> None: ...


class MemoryLearnedStore:
    """The documents in this process (for several apps in one process: tests, the bench)."""

    def __init__(self) -> None:
        self._data: dict[str, tuple[int, bytes]] = {}
        self.round_trips = 0

    async def changed(self, known: Mapping[str, int]) -> dict[str, tuple[int, bytes | None]]:
        self.round_trips += 1
        found = {k: self._data.get(k, (0, None)) for k in known}
        return {k: v for k, v in found.items() if v[0] != known[k]}

    async def put(self, key: str, version: int, body: bytes) -> int | None:
        self.round_trips += 1
        current = self._data.get(key, (0, b""))[0]
        if current != version:
            return None
        self._data[key] = (current + 1, body)
        return current + 1

    async def close(self) -> None:
        return None


class RedisLearnedStore:
    """The documents in Redis (`INFLIGHT_CACHE_URL`): one hash each, version and body."""

    def __init__(self, url: str, ttl_seconds: int = TTL_SECONDS) -> None:
        import redis.asyncio as redis

        self._redis = redis.Redis.from_url(url)
        self._ttl = ttl_seconds

    async def changed(self, known: Mapping[str, int]) -> dict[str, tuple[int, bytes | None]]:
        if not known:
            return {}
        keys = list(known)
        flat = await self._redis.eval(
            CHANGED, len(keys), *(PREFIX + k for k in keys), *(known[k] for k in keys)
        )
        out: dict[str, tuple[int, bytes | None]] = {}
        for i in range(0, len(flat), 3):
            key = flat[i].decode()[len(PREFIX) :]
            out[key] = (int(flat[i + 1]), flat[i + 2] or None)
        return out

    async def put(self, key: str, version: int, body: bytes) -> int | None:
        found = await self._redis.eval(PUT_IF_VERSION, 1, PREFIX + key, version, body, self._ttl)
        return int(found) if found is not None else None

    async def close(self) -> None:
        await self._redis.aclose()


Kind = Literal["calibration", "windows"]


@dataclass(frozen=True, slots=True)
class Document:
    """What one shared document holds: a model's calibration, or the windows learned for
    (base URL, model)."""

    kind: Kind
    model: str
    base_url: str = ""

    @property
    def key(self) -> str:
        name = [self.model] if self.kind == "calibration" else [self.base_url, self.model]
        return f"{self.kind}:" + orjson.dumps(name).decode()


Step = Observed | WindowLearned


class SharedLearning:
    """The calibration and the learned windows of this replica, kept equal to its peers'
    through `store`: `refresh` before a plan, `flush` after an answer.

    A plan depends on the calibration of the request's model and on the windows learned for its
    (upstream, model) (DESIGN.md §7). Each is one document, versioned, in a `LearnedStore` (Redis
    with `CACHE_URL`): before a request is planned the replica asks whether the two documents it
    needs changed (one round trip) and installs them if so; what it learned itself (an answer's
    observation, a window) is applied locally, journaled, and published before the answer's last
    bytes go (`publish_within`, bounded) with a compare-and-set on the version — on a conflict, the
    peer's document is installed and the journaled steps applied again on top. A model's calibration
    is a function of its observations in order, each carrying its own time, so every replica (and a
    restarted one) holds exactly the state one proxy would have after the same answers.
    """

    def __init__(
        self, store: LearnedStore, calibration: Calibration, windows: WindowRegistry
    ) -> None:
        self._store = store
        self._calibration = calibration
        self._windows = windows
        self._versions: dict[str, int] = {}  # per document: the version installed
        self._journal: dict[Document, list[Step]] = {}  # steps taken, not yet published
        self._journal_lock = threading.Lock()
        self._sync = asyncio.Lock()
        self._publishing: set[asyncio.Task[None]] = set()  # publishes an answer stopped waiting on
        self.late = 0  # publishes that outlasted their bound (the answer went without waiting)
        self.unavailable = 0  # refreshes the store failed or outlasted (planned on local state)
        calibration.journal = self._took
        windows.journal = self._took
        windows.refresh = self.refresh

    def _took(self, step: Step) -> None:
        if isinstance(step, Observed):
            document = Document("calibration", step.model)
        else:
            document = Document("windows", step.model, step.base_url)
        with self._journal_lock:
            self._journal.setdefault(document, []).append(step)

    async def refresh(self, base_url: str, model: str) -> None:
        """Bring the documents a plan for `model` at `base_url` reads up to date (and publish
        what this replica learned meanwhile), within `REFRESH_BOUND_SECONDS`. A store that is
        down, refuses or hangs never fails or stalls the request: it is planned on what this
        replica knows (logged, counted in `unavailable`)."""
        wanted = (Document("calibration", model), Document("windows", model, base_url))
        try:
            await asyncio.wait_for(self.sync(wanted, ask=True), REFRESH_BOUND_SECONDS)
        except (TimeoutError, OSError, RedisError) as exc:
            self.unavailable += 1
            if self.unavailable == 1 or self.unavailable % 100 == 0:
                logger.warning(
                    "shared learned state unavailable (%s; %d times so far): planning on this "
                    "replica's own", type(exc).__name__, self.unavailable,
                )  # fmt: skip

    async def flush(self) -> None:
        """Publish what this replica learned (the peers' documents it conflicts with first)."""
        await self.sync((), ask=False)

    async def publish_within(self, seconds: float = PUBLISH_BOUND_SECONDS) -> bool:
        """`flush`, waited for at most `seconds`: an answer's last bytes wait for it, so the
        client's next request, whichever replica it reaches, is planned on what this answer
        taught; a slow store never stalls an answer (the publish goes on, counted in `late` and
        logged). False when the bound was hit; a failed publish is logged, never raised."""
        task = asyncio.ensure_future(self.flush())
        self._publishing.add(task)
        task.add_done_callback(self._published)
        done, _ = await asyncio.wait({task}, timeout=seconds)
        if done:
            return True
        self.late += 1
        logger.warning(
            "shared learned state: publishing took over %.0f ms; answered without waiting "
            "(%d times so far)",
            seconds * 1000,
            self.late,
        )
        return False

    def _published(self, task: asyncio.Task[None]) -> None:
        self._publishing.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.warning("shared learned state: publishing failed", exc_info=task.exception())

    async def sync(self, wanted: Iterable[Document], ask: bool) -> None:
        """Install the peers' changes to `wanted` (when `ask`) and to the journaled documents
        (on a conflict), then publish the journaled ones, compare-and-set."""
        wanted = tuple(wanted)
        async with self._sync:
            for _ in range(RETRIES):
                with self._journal_lock:
                    pending = {d: len(steps) for d, steps in self._journal.items() if steps}
                if ask:
                    documents = {*wanted, *pending}
                    known = {d.key: self._versions.get(d.key, 0) for d in documents}
                    changed = await self._store.changed(known)
                    for document in documents:
                        if document.key in changed:
                            self._install(document, *changed[document.key])
                if await self._publish(pending):
                    return
                ask = True  # a peer wrote first: take its state, then ours again on top
            logger.warning("shared learned state: publishing lost %d races; retried later", RETRIES)

    async def _publish(self, pending: Mapping[Document, int]) -> bool:
        """Publish each journaled document; False when a peer's version got there first."""
        clean = True
        for document, steps in pending.items():
            body = orjson.dumps(self._export(document))
            version = await self._store.put(document.key, self._versions.get(document.key, 0), body)
            if version is None:
                clean = False
                continue
            self._versions[document.key] = version
            with self._journal_lock:
                del self._journal[document][:steps]
        return clean

    def _export(self, document: Document) -> dict[str, Any]:
        if document.kind == "calibration":
            return self._calibration.export(document.model)
        return self._windows.export(document.base_url, document.model)

    def _install(self, document: Document, version: int, body: bytes | None) -> None:
        """A peer's `body` of `document` in place of ours, then our unpublished steps on it."""
        if document.kind == "calibration":
            state = orjson.loads(body) if body else Calibration().export(document.model)
            self._calibration.install(document.model, state)
        else:
            state = orjson.loads(body) if body else {"learned": None, "silent": []}
            self._windows.install(document.base_url, document.model, state)
        self._versions[document.key] = version
        with self._journal_lock:
            steps = list(self._journal.get(document, ()))
        for step in steps:
            if isinstance(step, Observed):
                self._calibration.apply(step)
            else:
                self._windows.apply(step, journal=False)

    async def aclose(self) -> None:
        """Close the store once the publishes still under way ended (bounded)."""
        if self._publishing:
            await asyncio.wait(set(self._publishing), timeout=CLOSE_WAIT_SECONDS)
        await self._store.close()


def open_learning(
    url: str | None,
    calibration: Calibration,
    windows: WindowRegistry,
    store: LearnedStore | None = None,
) -> SharedLearning | None:
    """Shared learning through Redis at `url` (or `store`); None: this process learns alone."""
    if store is None and not url:
        return None
    return SharedLearning(store or RedisLearnedStore(str(url)), calibration, windows)
