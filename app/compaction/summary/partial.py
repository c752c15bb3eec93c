"""The partial stand-in: a cached summary of a prefix of a compaction event's span stands for the
span while the span's own summary is made, and stays until the cut moves (issue 15).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from inflight.compaction.rendering import Plan
from inflight.compaction.unit_costs import MessageCounter

RECORD = ":stand-in"  # the suffix of the key the choice for a span is recorded under


@dataclass(frozen=True, slots=True)
class Chosen:
    """What stands for a span: its own summary (`summary` None), or the summary of a prefix
    of it, covering `covers` of the span's tokens.

    At an event whose span S has no summary cached, the newest summary cached of a prefix S' of it
    (the previous event's, or one made ahead) stands in when S' holds at least `SUMMARY_PARTIAL` of
    S's tokens; the rest of S is left out, as `trim` leaves it (restoring, the span marker still
    stands for all of S). Which one stands for S is chosen once, at the first request that sees S's
    own summary missing, and recorded in the summary cache under S's key (`record_key`) —
    set-if-absent, so replicas that race agree on the first — and that record is read before S's own
    summary: when S's own summary lands it is cached as ever (the next event's rolling update starts
    from it), but S keeps its stand-in, and the prompt does not change again until the cut moves. An
    event with no prefix that large records that its own summary stands for it (nothing until it
    lands, as before), so a prefix summary landing meanwhile does not take its place either.
    """

    summary: str | None = None
    covers: float = 1.0

    @property
    def partial(self) -> bool:
        return self.summary is not None

    def encode(self) -> str:
        return orjson.dumps({"summary": self.summary, "covers": self.covers}).decode()

    @classmethod
    def decode(cls, value: str) -> Chosen | None:
        """The choice recorded in `value`; None for anything that is not one (read as no
        record: the span's own summary stands for it when there is one)."""
        try:
            found = orjson.loads(value)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(found, dict):
            return None
        summary, covers = found.get("summary"), found.get("covers")
        if not isinstance(summary, str | None) or not isinstance(covers, int | float):
            return None
        return cls(summary, float(covers))


OWN = Chosen()


def record_key(key: str) -> str:
    """Where the choice for the span of cache key `key` is recorded."""
    return key + RECORD


def covered(
    messages: Sequence[Mapping[str, Any]], plan: Plan, end: int, count: MessageCounter
) -> float:
    """The share of the tokens of `plan`'s cut span (units `[head, cut)`, pinned instructions
    aside: they stay in the prompt and are not summarised) that units `[head, end)` hold."""
    held = total = 0
    for i in range(plan.head, plan.cut):
        if i in plan.pinned:
            continue
        unit = plan.units[i]
        tokens = sum(count(m) for m in messages[unit.start : unit.end])
        total += tokens
        if i < end:
            held += tokens
    return held / total if total else 0.0
