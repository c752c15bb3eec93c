"""Cost mode (DESIGN.md §16): compact a conversation under the threshold when the prompt cache's
bill says so. Ski rental: each request re-reads from the cache what a cut would remove (rent);
a cut re-writes what it keeps once (buy); cut once the rent paid since the last event reaches
the price of buying. Pure: prices come in as plain numbers, the replay brings the history; a
local upstream's prefill speed is learned from its answers (`PrefillRates`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from inflight.lru import BoundedLRU

# A local upstream's cached prompt token still costs each request part of its prefill (every new
# token attends to it): this share, an assumption the README states.
CACHED_PREFILL_SHARE = 0.1
# An early event removes at least this share of what it keeps (else it is not worth a cut).
MIN_REMOVED_SHARE = 0.25
PER_MILLION = 1e-6

Unit = Literal["usd", "s"]
# Why a request's prompt is cut: its history as received is over the trigger, so it would be
# cut to fit the window anyway ("fit"), or it is not, so only cost mode cut it ("cost").
CutFor = Literal["fit", "cost"]


# model -> its dollars per prompt token read from and written to the prompt cache (None: unpriced)
CacheRates = Callable[[str], "tuple[float, float] | None"]
# (upstream, model) -> the prefill tokens a second its answers showed (None: none yet)
PrefillRateOf = Callable[[str, str], "float | None"]
# Each answer's weight in the running prefill rate decays by this much per later answer, so the
# rate follows the last ten or so (a model reloaded, a busier GPU).
PREFILL_DECAY = 0.9
PREFILL_MODELS = 256  # (upstream, model) pairs whose rate is kept


@dataclass(frozen=True, slots=True)
class CostRule:
    """What one prompt token costs, per token (dollars, or seconds on a local upstream):
    `read` once per request while it is in the cached prefix, `rewrite` once when a cut makes
    the cache write it again (over what reading it would have cost). `floor`: prompts of this
    many tokens or fewer are never compacted early, and an event keeps at most this many."""

    read: float
    rewrite: float
    floor: int
    unit: Unit = "usd"

    @classmethod
    def priced(cls, cached_input: float, cache_write: float, floor: int) -> CostRule:
        """From USD per 1M tokens: a cache hit, and a cache write (the input price when the
        provider adds no premium)."""
        read = cached_input * PER_MILLION
        return cls(read, max(0.0, cache_write * PER_MILLION - read), floor)

    @classmethod
    def prefill(cls, rate: float, floor: int) -> CostRule:
        """A local upstream prefilling `rate` tokens a second."""
        read = CACHED_PREFILL_SHARE / rate
        return cls(read, 1.0 / rate - read, floor, "s")

    def kept(self, goal: int) -> int:
        """What an event keeps in cost mode (the planner's goal): the floor, or less."""
        return min(goal, self.floor)

    def least_removed(self, kept: int) -> int:
        """The fewest tokens an early event may remove when it keeps `kept`."""
        return max(1, int(MIN_REMOVED_SHARE * kept))

    def calm(self, goal: int) -> int:
        """The largest prompt no early event can touch (`goal`: the budget's)."""
        kept = self.kept(goal)
        return max(self.floor, kept + self.least_removed(kept))

    def rent(self, total: int, kept: int) -> float:
        """What one request of `total` tokens pays to re-read what a cut to `kept` removes."""
        return max(0, total - kept) * self.read

    def price(self, kept: int, head: int) -> float:
        """What a cut to `kept` costs once: re-writing the kept prompt after the head (which
        stays cached)."""
        return max(0, kept - head) * self.rewrite

    def pays(self, spend: float, total: int, goal: int, head: int) -> bool:
        """Whether a prompt of `total` tokens whose requests paid `spend` in rent since the last
        event is cut now (`goal`: the budget's; `head`: tokens no cut removes)."""
        if spend <= 0 or total <= self.calm(goal):
            return False
        return spend >= self.price(self.kept(goal), head)


@dataclass(frozen=True, slots=True)
class Economics:
    """One cut's economics: the tokens the prompt no longer carries, what each later request
    saves on reading them, what re-writing the kept prompt cost once, and the requests it takes
    to break even."""

    removed: int
    saving_per_request: float
    rewrite_cost: float
    unit: Unit

    @property
    def break_even_requests(self) -> float | None:
        if self.saving_per_request <= 0:
            return None
        return self.rewrite_cost / self.saving_per_request

    def as_dict(self) -> dict[str, object]:
        breaks = self.break_even_requests
        return {
            "unit": self.unit,
            "tokens_removed": self.removed,
            "saving_per_request": round(self.saving_per_request, 8),
            "rewrite_cost": round(self.rewrite_cost, 8),
            "break_even_requests": None if breaks is None else round(breaks, 2),
        }


def economics(rule: CostRule, before: int, after: int, head: int) -> Economics:
    """The economics of forwarding `after` tokens for a prompt of `before` (`head`: the tokens
    before the cut, which stay cached)."""
    removed = max(0, before - after)
    return Economics(removed, removed * rule.read, rule.price(after, head), rule.unit)


@dataclass(frozen=True, slots=True)
class _Running:
    """Decayed sums of the prompt tokens prefilled and the seconds it took."""

    tokens: float
    seconds: float


class PrefillRates:
    """The prefill speed each (upstream, model) showed in its answers (llama.cpp's `timings`):
    a running rate weighted by the tokens each answer prefilled (a mostly cached prompt's few
    tokens say little), its older answers decayed; at most `capacity` pairs, least recent out."""

    def __init__(self, capacity: int = PREFILL_MODELS, decay: float = PREFILL_DECAY) -> None:
        self._rates: BoundedLRU[tuple[str, str], _Running] = BoundedLRU(capacity)
        self._decay = decay

    def observe(self, upstream: str, model: str, tokens: int, per_second: float) -> None:
        """One answer prefilled `tokens` at `per_second` tokens a second."""
        if tokens <= 0 or not per_second > 0:
            return
        key = (upstream, model)
        was = self._rates.get(key) or _Running(0.0, 0.0)
        self._rates.put(
            key,
            _Running(
                was.tokens * self._decay + tokens,
                was.seconds * self._decay + tokens / per_second,
            ),
        )

    def rate(self, upstream: str, model: str) -> float | None:
        """Tokens a second, or None before any answer stated it."""
        running = self._rates.get((upstream, model))
        if running is None or running.seconds <= 0:
            return None
        return running.tokens / running.seconds
