"""The previous uncompacted prompt of each conversation, for the baseline's cached share only.

It is never used for planning.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from inflight.lru import BoundedLRU

_HEAD_ROLES = frozenset({"system", "developer"})


def _serialize(value: Any) -> bytes:
    try:
        return orjson.dumps(value)
    except TypeError:  # not JSON (a parsed body always is): fall back to its repr
        return repr(value).encode()


def _hash(data: bytes | memoryview) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


def conversation_items(body: Mapping[str, Any]) -> Sequence[Any] | None:
    """The history list of a chat (`messages`), Messages (`messages`) or Responses (`input`)
    body, or None when it has none."""
    for name in ("messages", "input"):
        items = body.get(name)
        if isinstance(items, list) and items:
            return items
    return None


def conversation_key(model: str, body: Mapping[str, Any], items: Sequence[Any]) -> bytes:
    """Hash of the model and the pinned head: leading system/developer items and the first
    user item (plus a top-level `system` or `instructions`)."""
    head: list[Any] = []
    for item in items:
        head.append(item)
        role = item.get("role") if isinstance(item, dict) else None
        if role not in _HEAD_ROLES:
            break
    return _hash(_serialize([model, body.get("system"), body.get("instructions"), head]))


@dataclass(frozen=True, slots=True)
class PriorPrompt:
    """What is kept of a conversation's previous uncompacted prompt."""

    size: int  # bytes of its serialized history, without the closing bracket
    checksum: int  # CRC-32 of those bytes
    tokens: int  # its prompt tokens, uncompacted
    at: float  # when it was sent (seconds since the epoch)


class PromptHistory:
    """Bounded map: conversation key → its previous uncompacted prompt.

    The previous prompt prefixes this one when its serialized history (without the closing
    bracket) is a byte prefix of this one's: one serialization and one CRC-32 pass per request,
    and any edit anywhere in the earlier history is seen
    (but for a 1 in 2^32 checksum collision, which would only misprice one baseline).

    A conversation is known by a hash of its model and pinned head (`conversation_key`). The map is
    bounded (least recently used entries go first) and lives in memory: after a restart, or once
    evicted, a conversation's next request counts as uncached in the baseline.
    """

    def __init__(self, capacity: int) -> None:
        self._prompts: BoundedLRU[bytes, PriorPrompt] = BoundedLRU(capacity)

    def __len__(self) -> int:
        return len(self._prompts)

    def observe(self, key: bytes, items: Sequence[Any], tokens: int, now: float, ttl: float) -> int:
        """Remember this prompt; return the tokens of the previous one when it prefixes this
        one and is at most `ttl` seconds old (else 0: none, expired or edited)."""
        data = memoryview(_serialize(items))
        size = len(data) - 1
        prior = self._prompts.get(key)
        reusable = 0
        if prior is not None and prior.size <= size:
            # one pass: the checksum of the prior's length, then carried on over the rest
            shared = zlib.crc32(data[: prior.size])
            checksum = zlib.crc32(data[prior.size : size], shared)
            if shared == prior.checksum and now - prior.at <= ttl:
                reusable = prior.tokens
        else:
            checksum = zlib.crc32(data[:size])
        self._prompts.put(key, PriorPrompt(size, checksum, tokens, now))
        return reusable
