"""Every cache that remembers across requests holds at most its bound in bytes, whatever the
clients send: many distinct huge conversations, model names and summaries."""

from __future__ import annotations

import anyio
import orjson
import pytest

from inflight.compaction.replays import ReplayCache, Saved
from inflight.compaction.summary.cache import MemoryCache
from inflight.jsontext import HistoryTexts
from inflight.lru import BoundedLRU, weigh_strings
from inflight.proxy.reuse import ParsedBodies
from inflight.tokens.prefixes import PREFIX_BYTES, Prefix, Prefixes
from inflight.windows.registry import MAP_BYTES, WindowRegistry
from inflight.windows.table import LOOKUP_MEMO_BYTES, ModelTable

HUGE = 256 * 1024


def huge(i: int, size: int = HUGE) -> str:
    return f"{i}:" + "x" * size


def test_a_weighed_lru_holds_at_most_its_bytes() -> None:
    lru: BoundedLRU[str, str] = BoundedLRU(10_000, 1024 * 1024, weigh_strings)
    for i in range(200):
        lru.put(f"k{i}", huge(i))
        assert lru.size <= 1024 * 1024
    assert 0 < len(lru) <= 4
    lru.put("too big", huge(0, 2 * 1024 * 1024))  # heavier than the bound alone: not kept
    assert "too big" not in lru
    assert lru.size == sum(weigh_strings(k, lru[k]) for k in list(lru))


def test_the_summary_cache_holds_at_most_its_bytes() -> None:
    cache = MemoryCache(max_bytes=4 * 1024 * 1024)

    async def fill() -> None:
        for i in range(100):
            await cache.set(huge(i, 1024), huge(i))
        assert await cache.get(huge(99, 1024)) == huge(99)

    anyio.run(fill)
    assert cache._data.size <= 4 * 1024 * 1024


def test_model_names_of_any_length_are_bounded_in_bytes() -> None:
    table = ModelTable()
    registry = WindowRegistry(table, None)
    for i in range(64):
        name = huge(i)
        table.lookup(name)
        registry.learn("http://upstream.test/v1", name, 8192)
        registry.learn_silent("http://upstream.test/v1", name, 8192, huge(i, 1024))
    assert table._memo.size <= LOOKUP_MEMO_BYTES
    for held in (registry._learned, registry._silent, registry._discovered):
        assert held.size <= MAP_BYTES


def test_the_counters_prefixes_hold_at_most_their_bytes() -> None:
    prefixes = Prefixes()
    for i in range(200):
        prefixes.replace(None, Prefix("o200k_base|gpt-4o", huge(i, 1024 * 1024).encode()))
        held = prefixes._entries.values()
        assert sum(len(p.text) for p in held) <= PREFIX_BYTES


def test_the_replay_cache_holds_at_most_its_bytes() -> None:
    cache: ReplayCache[None] = ReplayCache(max_bytes=8 * 1024 * 1024, texts=HistoryTexts())
    for i in range(200):
        text = huge(i, 1024 * 1024).encode()
        cache.store(Saved(("inputs", i), text, len(text), None, len(text)))
        assert cache.size <= 8 * 1024 * 1024


@pytest.mark.parametrize("owners", [1, 50])
def test_parsed_bodies_hold_at_most_their_bytes(owners: int) -> None:
    bodies = ParsedBodies("messages", max_bytes=8 * 1024 * 1024)
    for i in range(200):
        body = {
            "messages": [{"role": "user", "content": huge(i)}, {"role": "user", "content": "x"}]
        }
        bodies.remember(orjson.dumps(body), body, owner=b"%d" % (i % owners))
        assert bodies._bytes <= 8 * 1024 * 1024
        assert sum(len(e.raw) * 4 for e in bodies._entries.values()) == bodies._bytes
